use super::*;
use std::sync::mpsc;

fn done() -> (Completion, mpsc::Receiver<io::Result<()>>) {
    let (sender, receiver) = mpsc::channel();
    (Box::new(move |result| sender.send(result).expect("the test waits")), receiver)
}

fn open(dir: &Path, segment_bytes: u64) -> (Wal, Vec<Vec<u8>>) {
    let (recovered, records) = Wal::open(dir, segment_bytes).expect("opens");
    let wal = recovered.start(&[b"checkpoint".to_vec()], Arc::default()).expect("starts");
    (wal, records)
}

fn append_and_wait(wal: &mut Wal, payload: &[u8]) {
    let (completion, receiver) = done();
    wal.append(payload, Some(completion), Urgency::Now).expect("queued");
    receiver.recv().expect("completed").expect("durable");
}

fn syncs(wal: &Wal) -> u64 {
    wal.shared.stats.syncs.get()
}

/// Without anything else to share a sync with, a deferred record is still synced: the
/// bound ends its wait.
#[test]
fn a_deferred_record_is_synced_when_its_wait_runs_out() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let (mut wal, _) = open(dir.path(), SEGMENT_BYTES);
    let before = syncs(&wal);
    let (completion, receiver) = done();
    wal.append(b"queued waiter", Some(completion), Urgency::Soon).expect("queued");
    let result = receiver.recv_timeout(Duration::from_secs(10)).expect("synced in time");
    result.expect("durable");
    assert_eq!(syncs(&wal), before + 1);
    drop(wal);
    let (_, records) = Wal::open(dir.path(), SEGMENT_BYTES).expect("reopens");
    assert_eq!(records.last().map(Vec::as_slice), Some(&b"queued waiter"[..]));
}

/// Waits until the flusher of `wal` is in a timed wait; returns when that wait ends.
fn flusher_waits_timed(wal: &Wal) -> Instant {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(until) = wal.shared.queue().flusher_until {
            return until;
        }
        assert!(Instant::now() < deadline, "the flusher never waited with a timeout");
        std::thread::yield_now();
    }
}

/// Once deferred records come, the flusher looks at the queue once per bound instead of being
/// woken for each: a deferred record appended while it waits so wakes nobody, and the
/// flusher's wait ends within that record's bound. (This used to catch a 300 ms timed wait
/// and accept any sync within ten seconds, which passes a flusher woken for every record.)
#[test]
fn a_deferred_record_appended_while_the_flusher_waits_timed_is_synced_without_a_wake() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let (mut wal, before, first_done) = with_a_deferred_record(dir.path());
    let first_until = flusher_waits_timed(&wal);
    // A release's writer takes the queued acquire into its own sync, as under contention.
    let (release, release_done) = done();
    wal.append(b"release", Some(release), Urgency::Alone).expect("written");
    release_done.try_recv().expect("synced by its writer").expect("durable");
    first_done.try_recv().expect("synced with it").expect("durable");
    let wakes = wal.shared.queue().wakes;
    let (second, second_done) = done();
    wal.append(b"second waiter", Some(second), Urgency::Soon).expect("queued");
    {
        let queue = wal.shared.queue();
        assert_eq!(queue.wakes, wakes, "appending a deferred record woke the timed flusher");
        let since = queue.deferred_since.expect("the second record waits");
        let until = queue.flusher_until.expect("the flusher still waits timed");
        assert!(until <= since + Duration::from_secs(600), "the flusher looks too late");
        assert!(until <= first_until, "the flusher's wait was not restarted");
    }
    assert!(second_done.try_recv().is_err(), "synced before any sync");
    // An urgent record ends the wait; both share its sync.
    append_and_wait(&mut wal, b"next release");
    second_done.recv().expect("completed").expect("durable");
    assert_eq!(syncs(&wal), before + 2, "the release's sync and the urgent record's");
    // Deferred records came: after that sync the flusher waits one more bound, timed, with
    // nothing queued (review: nothing checked this wait).
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let queue = wal.shared.queue();
        if queue.flusher_until.is_some_and(|until| until > first_until) {
            assert!(queue.deferred_since.is_none() && queue.batches.is_empty());
            break;
        }
        drop(queue);
        assert!(Instant::now() < deadline, "the flusher did not wait timed after the sync");
        std::thread::yield_now();
    }
}

/// A deferred record synced within its bound with nothing to share a sync with: after that
/// sync the flusher waits one more bound for further deferred records, then untimed again, so
/// an idle log stops waking it.
#[test]
fn after_a_bound_without_deferred_records_the_flusher_waits_untimed() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let (mut wal, _) = open(dir.path(), SEGMENT_BYTES);
    wal.shared.queue().max_defer = Some(Duration::from_millis(20));
    let (first, first_done) = done();
    wal.append(b"queued waiter", Some(first), Urgency::Soon).expect("queued");
    first_done.recv_timeout(Duration::from_secs(10)).expect("synced in time").expect("durable");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let queue = wal.shared.queue();
        if queue.flusher_until.is_none() && !queue.deferred_seen && !queue.flushing {
            break;
        }
        drop(queue);
        assert!(Instant::now() < deadline, "the flusher kept waiting timed");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Found in review: a flusher whose timer fired while a writer synced its own record waited
/// untimed until the writer was done, so the next deferred record had to wake it. While
/// deferred records come it waits timed there too, and appends during a sync do not signal it
/// (the sync's end wakes the flusher for what is queued). The test stands in for the writer by
/// setting `flushing` itself; a real writer holds the log store's lock on the `Wal` throughout,
/// so appends during its sync come only in this test, and during the flusher's own sync the
/// signal saved is a system call with nobody waiting.
#[test]
fn the_flusher_waits_timed_while_a_writer_syncs_once_deferred_records_come() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let (mut wal, before, first_done) = with_a_deferred_record(dir.path());
    let first_until = flusher_waits_timed(&wal);
    // A writer's own sync begins, and the flusher's timer fires during it.
    wal.shared.queue().flushing = true;
    wal.shared.wake.notify_one();
    let deadline = Instant::now() + Duration::from_secs(10);
    let until_during_sync = loop {
        let until = wal.shared.queue().flusher_until;
        if until != Some(first_until) || Instant::now() > deadline {
            break until;
        }
        std::thread::yield_now();
    };
    let wakes = wal.shared.queue().wakes;
    let (second, second_done) = done();
    wal.append(b"second waiter", Some(second), Urgency::Soon).expect("queued");
    let (urgent, urgent_done) = done();
    wal.append(b"a batch", Some(urgent), Urgency::Now).expect("queued");
    let wakes_after = wal.shared.queue().wakes;
    // The writer's sync ends and wakes the flusher, which takes what is queued.
    wal.shared.queue().flushing = false;
    wal.shared.wake.notify_one();
    urgent_done.recv().expect("completed").expect("durable");
    first_done.recv().expect("completed").expect("durable");
    second_done.recv().expect("completed").expect("durable");
    assert_eq!(syncs(&wal), before + 1, "one sync for the three");
    assert_ne!(until_during_sync, Some(first_until), "the flusher never woke");
    assert!(until_during_sync.is_some(), "the flusher waited untimed during the writer's sync");
    assert_eq!(wakes_after, wakes, "appending during a sync woke the flusher");
}

/// A log in `dir` holding one deferred record, which waits up to ten minutes for a sync to
/// share; its sync count before that record, and the record's completion.
fn with_a_deferred_record(dir: &Path) -> (Wal, u64, mpsc::Receiver<io::Result<()>>) {
    let (mut wal, _) = open(dir, SEGMENT_BYTES);
    wal.shared.queue().max_defer = Some(Duration::from_secs(600));
    let before = syncs(&wal);
    let (deferred, deferred_done) = done();
    wal.append(b"queued waiter", Some(deferred), Urgency::Soon).expect("queued");
    (wal, before, deferred_done)
}

/// A deferred record and the urgent one after it share one sync, and neither completion
/// fires before that sync.
#[test]
fn a_deferred_record_shares_the_next_urgent_sync() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let (mut wal, before, deferred_done) = with_a_deferred_record(dir.path());
    // The flusher takes a deferred record only once it is due (in ten minutes) or an urgent
    // one joins it: still queued, it cannot have been synced or completed. (This looked for
    // 50 ms whether anything happened, which passes whatever a slower flusher would do.)
    {
        let queue = wal.shared.queue();
        assert_eq!(queue.batches.len(), 1, "the deferred record waits in the queue");
        assert!(!queue.urgent && queue.deferred_since.is_some());
    }
    assert!(deferred_done.try_recv().is_err(), "a deferred record completed before any sync");
    assert_eq!(syncs(&wal), before);
    let (urgent, urgent_done) = done();
    wal.append(b"release", Some(urgent), Urgency::Now).expect("queued");
    urgent_done.recv().expect("completed").expect("durable");
    deferred_done.recv().expect("completed").expect("durable");
    assert_eq!(syncs(&wal), before + 1, "one sync for both");
}

/// On a quiet log a lone record is written and synced by its writer: its completion has
/// fired when `append` returns (no hand-off to the flusher thread and back), what rode along
/// is synced with it, and both are there after a reopen.
#[test]
fn a_lone_record_on_a_quiet_log_is_synced_by_its_writer() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let (mut wal, _) = open(dir.path(), SEGMENT_BYTES);
    let before = syncs(&wal);
    wal.append(b"committed index", None, Urgency::Now).expect("queued");
    let (completion, receiver) = done();
    wal.append(b"lone entry", Some(completion), Urgency::Alone).expect("written");
    receiver.try_recv().expect("completed before append returned").expect("durable");
    assert_eq!(syncs(&wal), before + 1, "one sync for both records");
    assert!(wal.shared.queue().batches.is_empty());
    drop(wal);
    let (_, records) = Wal::open(dir.path(), SEGMENT_BYTES).expect("reopens");
    assert_eq!(records[1..], [b"committed index".to_vec(), b"lone entry".to_vec()]);
}

/// A leader with followers turns the writer's own sync off: its lone record goes to the
/// flusher, and the core is free at once to send the entry on.
#[test]
fn with_inline_sync_off_a_lone_record_goes_to_the_flusher() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let (mut wal, _) = open(dir.path(), SEGMENT_BYTES);
    wal.allow_inline_sync(false);
    // Hold the flusher back as a sync in progress does.
    wal.shared.queue().flushing = true;
    let (completion, receiver) = done();
    wal.append(b"lone entry", Some(completion), Urgency::Alone).expect("queued");
    assert!(receiver.try_recv().is_err(), "not synced by its writer");
    assert_eq!(wal.shared.queue().batches.len(), 1, "queued for the flusher");
    wal.shared.queue().flushing = false;
    wal.shared.wake.notify_one();
    receiver.recv().expect("completed").expect("durable");
}

/// Under contention each handoff's release (a lone record) finds the next waiter's acquire
/// (a deferred record) queued. On a quiet log the release's writer syncs both itself: both
/// completions have fired when `append` returns, with one sync, and the log stays quiet, since
/// nobody waited on the deferred record.
#[test]
fn a_lone_record_on_a_quiet_log_takes_deferred_records_into_its_own_sync() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let (mut wal, before, deferred_done) = with_a_deferred_record(dir.path());
    let (lone, lone_done) = done();
    wal.append(b"release", Some(lone), Urgency::Alone).expect("written");
    lone_done.try_recv().expect("completed before append returned").expect("durable");
    deferred_done.try_recv().expect("completed before append returned").expect("durable");
    assert_eq!(syncs(&wal), before + 1, "one sync for both");
    {
        let queue = wal.shared.queue();
        assert!(queue.batches.is_empty() && queue.deferred_since.is_none());
        assert!(queue.quiet, "a deferred record does not end the quiet");
    }
    let (next, next_done) = done();
    wal.append(b"next release", Some(next), Urgency::Alone).expect("written");
    next_done
        .try_recv()
        .expect("the next lone record is synced by its writer too")
        .expect("durable");
    drop(wal);
    let (_, records) = Wal::open(dir.path(), SEGMENT_BYTES).expect("reopens");
    let expected = [b"queued waiter".to_vec(), b"release".to_vec(), b"next release".to_vec()];
    assert_eq!(records[1..], expected);
}

/// A batch of entries (`Now` with a completion) ends the quiet, and a lone record behind it
/// goes to the flusher and shares the batch's sync.
#[test]
fn a_batch_ends_the_quiet_and_a_lone_record_behind_it_shares_its_sync() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let (mut wal, _) = open(dir.path(), SEGMENT_BYTES);
    let before = syncs(&wal);
    // Hold the flusher back as a sync in progress does, so the queue can be looked at.
    wal.shared.queue().flushing = true;
    wal.shared.queue().quiet = true;
    let (batch, batch_done) = done();
    wal.append(b"a batch of entries", Some(batch), Urgency::Now).expect("queued");
    assert!(!wal.shared.queue().quiet, "a batch ends the quiet");
    let (lone, lone_done) = done();
    wal.append(b"lone entry after it", Some(lone), Urgency::Alone).expect("queued");
    assert_eq!(wal.shared.queue().batches.len(), 1, "the lone record waits behind the batch");
    wal.shared.queue().flushing = false;
    wal.shared.wake.notify_one();
    batch_done.recv().expect("completed").expect("durable");
    lone_done.recv().expect("completed").expect("durable");
    assert_eq!(syncs(&wal), before + 1, "the batch and the lone record share a sync");
}

#[test]
fn records_come_back_in_order_after_a_reopen() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let (mut wal, records) = open(dir.path(), SEGMENT_BYTES);
    assert!(records.is_empty());
    wal.append(b"one", None, Urgency::Now).expect("queued");
    append_and_wait(&mut wal, b"two");
    drop(wal);
    let (_, records) = Wal::open(dir.path(), SEGMENT_BYTES).expect("reopens");
    assert_eq!(records, vec![b"checkpoint".to_vec(), b"one".to_vec(), b"two".to_vec()]);
    assert_eq!(list_segments(dir.path()).expect("lists").len(), 1);
}

#[test]
fn a_torn_tail_is_dropped_and_never_written_after() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let (mut wal, _) = open(dir.path(), 4096);
    append_and_wait(&mut wal, b"kept");
    append_and_wait(&mut wal, b"torn record");
    let path = wal.segment.path.clone();
    drop(wal);
    // Damage the last record's payload as a crash in the middle of its write would.
    let file = std::fs::OpenOptions::new().write(true).open(&path).expect("opens");
    let header = FRAME_HEADER_BYTES + CHECKPOINT_MAGIC.len() + 8;
    let torn_at =
        (header + FRAME_HEADER_BYTES * 2 + b"checkpoint".len() + b"kept".len() + 3) as u64;
    file.write_all_at(b"\xff", torn_at).expect("writes");
    let (recovered, records) = Wal::open(dir.path(), 4096).expect("reopens");
    assert_eq!(records, vec![b"checkpoint".to_vec(), b"kept".to_vec()]);
    let mut wal = recovered.start(&[b"checkpoint 2".to_vec()], Arc::default()).expect("starts");
    assert!(!path.exists(), "the damaged segment is replaced, not appended to");
    append_and_wait(&mut wal, b"after");
    drop(wal);
    let (_, records) = Wal::open(dir.path(), 4096).expect("reopens");
    assert_eq!(records, vec![b"checkpoint 2".to_vec(), b"after".to_vec()]);
}

#[test]
fn a_torn_length_longer_than_the_file_ends_the_records() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let (mut wal, _) = open(dir.path(), 4096);
    append_and_wait(&mut wal, b"kept");
    let path = wal.segment.path.clone();
    let end = wal.offset;
    drop(wal);
    let file = std::fs::OpenOptions::new().write(true).open(&path).expect("opens");
    // A length within the record limit but past the end of the file, with no payload.
    file.write_all_at(&(256_u32 << 20).to_le_bytes(), end).expect("writes");
    let (_, records) = Wal::open(dir.path(), 4096).expect("reopens");
    assert_eq!(records, vec![b"checkpoint".to_vec(), b"kept".to_vec()]);
}

#[test]
fn a_segment_whose_checkpoint_is_torn_falls_back_to_the_previous_one() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let (mut wal, _) = open(dir.path(), 4096);
    append_and_wait(&mut wal, b"durable");
    let generation = wal.generation;
    drop(wal);
    // A crash after creating the next segment and before its checkpoint reached the disk.
    create_segment(&segment_path(dir.path(), generation + 1), 4096).expect("created");
    let (_, records) = Wal::open(dir.path(), 4096).expect("reopens");
    assert_eq!(records, vec![b"checkpoint".to_vec(), b"durable".to_vec()]);
}

#[test]
fn no_intact_segment_after_the_first_is_an_error() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    create_segment(&segment_path(dir.path(), 5), 4096).expect("created");
    let error = Wal::open(dir.path(), 4096).err().expect("refused");
    assert!(error.to_string().contains("no intact segment"), "{error}");
}

#[test]
fn rotation_keeps_one_segment_and_its_records() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let (mut wal, _) = open(dir.path(), 300);
    let payload = [7_u8; 100];
    for round in 0..10_u8 {
        if !wal.fits(payload.len()) {
            let (completion, receiver) = done();
            wal.rotate(&[vec![round]], Some(completion)).expect("rotates");
            receiver.recv().expect("completed").expect("durable");
        }
        append_and_wait(&mut wal, &payload);
    }
    drop(wal);
    let (_, records) = Wal::open(dir.path(), 300).expect("reopens");
    assert_eq!(list_segments(dir.path()).expect("lists").len(), 1, "old segments deleted");
    assert_eq!(records.len(), 3, "the last checkpoint and the records after it");
    assert_eq!(records[1], payload);
}

/// Regression (CI, 2026-12-02): a rotation's completion fired before its flusher deleted the
/// replaced segment, so a log dropped and opened again at once could list that segment and
/// then fail to open it (`NotFound`). Replaced segments are now deleted before the rotation
/// completes, dropping the log waits for its flusher, and opening skips a segment deleted
/// since it was listed.
#[test]
fn a_log_reopened_at_once_after_a_rotation_never_meets_a_segment_being_deleted() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    for round in 0..200_u8 {
        let (mut wal, _) = open(dir.path(), 300);
        let (completion, receiver) = done();
        wal.rotate(&[vec![round]], Some(completion)).expect("rotates");
        receiver.recv().expect("completed").expect("durable");
        let left = list_segments(dir.path()).expect("lists").len();
        assert_eq!(left, 1, "a completed rotation left {left} segments (round {round})");
        drop(wal);
    }
}

#[test]
fn a_checkpoint_larger_than_a_segment_gets_a_larger_segment() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let (mut wal, _) = open(dir.path(), 64);
    let checkpoint = vec![vec![1_u8; 1000], vec![2_u8; 10], vec![3_u8; 1000]];
    let (completion, receiver) = done();
    wal.rotate(&checkpoint, Some(completion)).expect("rotates");
    receiver.recv().expect("completed").expect("durable");
    drop(wal);
    let (_, records) = Wal::open(dir.path(), 64).expect("reopens");
    assert_eq!(records, checkpoint);
}

/// Issue 13: the whole live log went into one checkpoint record, which `frame` asserts is at
/// most 512 MiB, so a large enough log crashed every rotation and every restart. A checkpoint
/// is now many records, and one cut short by a crash is not taken for a whole one.
#[test]
fn a_checkpoint_of_many_records_is_whole_or_not_at_all() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let (mut wal, _) = open(dir.path(), 4096);
    append_and_wait(&mut wal, b"durable");
    let generation = wal.generation;
    drop(wal);
    // A crash while writing the next segment's checkpoint: the header and one record of two.
    let (segment, bytes) = create_checkpointed_segment(
        dir.path(),
        generation + 1,
        4096,
        &[b"part one".to_vec(), b"part two".to_vec()],
    )
    .expect("created");
    let cut = FRAME_HEADER_BYTES * 2 + CHECKPOINT_MAGIC.len() + 8 + b"part one".len();
    segment.file.write_all_at(&bytes[..cut], 0).expect("writes");
    let (_, records) = Wal::open(dir.path(), 4096).expect("reopens");
    assert_eq!(records, vec![b"checkpoint".to_vec(), b"durable".to_vec()]);
    segment.file.write_all_at(&bytes, 0).expect("writes");
    let (_, records) = Wal::open(dir.path(), 4096).expect("reopens");
    assert_eq!(records, vec![b"part one".to_vec(), b"part two".to_vec()]);
}

#[test]
fn a_segment_from_before_checkpoint_headers_still_opens() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let segment = create_segment(&segment_path(dir.path(), 1), 4096).expect("created");
    let mut bytes = frame(b"old checkpoint");
    bytes.extend_from_slice(&frame(b"old record"));
    segment.file.write_all_at(&bytes, 0).expect("writes");
    let (_, records) = Wal::open(dir.path(), 4096).expect("reopens");
    assert_eq!(records, vec![b"old checkpoint".to_vec(), b"old record".to_vec()]);
}

/// Fuzz target (issue 13): whatever happens to a segment's bytes (bits flipped, cut short,
/// overwritten, or nothing but arbitrary bytes), recovery never panics, and what it reads
/// back is a prefix of what was written.
mod fuzz {
    use super::*;
    use proptest::prelude::*;

    #[derive(Clone, Debug)]
    enum Damage {
        Flip { at: prop::sample::Index, bit: u8 },
        Cut { at: prop::sample::Index },
        Overwrite { at: prop::sample::Index, bytes: Vec<u8> },
    }

    fn damage() -> impl Strategy<Value = Damage> {
        prop_oneof![
            (any::<prop::sample::Index>(), 0_u8..8).prop_map(|(at, bit)| Damage::Flip { at, bit }),
            any::<prop::sample::Index>().prop_map(|at| Damage::Cut { at }),
            (any::<prop::sample::Index>(), proptest::collection::vec(any::<u8>(), 1..16))
                .prop_map(|(at, bytes)| Damage::Overwrite { at, bytes }),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig {
            cases: picket_testkit::fuzz_cases(1_000),
            ..ProptestConfig::default()
        })]

        #[test]
        fn fuzz_recovery_reads_back_a_prefix_of_what_was_written(
            records in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 1..40), 0..8),
            damages in proptest::collection::vec(damage(), 1..4),
        ) {
            let dir = tempfile::tempdir().expect("a temporary directory");
            let (mut wal, _) = open(dir.path(), 1024);
            for record in &records {
                if wal.fits(record.len()) {
                    append_and_wait(&mut wal, record);
                }
            }
            let path = wal.segment.path.clone();
            drop(wal);
            let mut bytes = std::fs::read(&path).expect("read");
            let used = bytes.iter().rposition(|byte| *byte != 0).map_or(0, |last| last + 1);
            for damage in damages {
                // Damage lands where records are (or just past them), within what is left.
                let within = used.min(bytes.len()).max(1);
                if bytes.is_empty() {
                    break;
                }
                match damage {
                    Damage::Flip { at, bit } => bytes[at.index(within)] ^= 1 << bit,
                    Damage::Cut { at } => bytes.truncate(at.index(bytes.len())),
                    Damage::Overwrite { at, bytes: junk } => {
                        let at = at.index(within);
                        let end = (at + junk.len()).min(bytes.len());
                        bytes[at..end].copy_from_slice(&junk[..end - at]);
                    }
                }
            }
            std::fs::write(&path, &bytes).expect("written");
            let mut written = vec![b"checkpoint".to_vec()];
            written.extend(records);
            if let Ok((_, read)) = Wal::open(dir.path(), 1024) {
                prop_assert!(read.len() <= written.len());
                prop_assert_eq!(&read[..], &written[..read.len()]);
            }
        }

        #[test]
        fn fuzz_recovery_takes_a_segment_of_arbitrary_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let dir = tempfile::tempdir().expect("a temporary directory");
            std::fs::write(segment_path(dir.path(), 3), &bytes).expect("written");
            let _ = Wal::open(dir.path(), 1024);
        }
    }
}

/// A log that wrote "one", noted it synced (as the flusher notes under the test storage
/// faults), then wrote "two" and "three" past the mark.
fn one_synced_then_two_unsynced() -> (tempfile::TempDir, Wal) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let (mut wal, _) = open(dir.path(), 1 << 20);
    append_and_wait(&mut wal, b"one");
    let mark = test_faults::format_mark(
        &wal.segment.path.file_name().expect("named").to_string_lossy(),
        wal.offset,
    );
    std::fs::write(dir.path().join(test_faults::SYNCED_MARK_FILE), mark).expect("written");
    append_and_wait(&mut wal, b"two");
    append_and_wait(&mut wal, b"three");
    (dir, wal)
}

/// The power-loss emulation of the fault harness: what the synced mark does not cover is
/// erased, a newer segment (whose name was never synced) included, and the log reopens with
/// exactly the records the mark covered.
#[test]
fn erasing_what_the_synced_mark_does_not_cover_leaves_the_covered_records() {
    let (dir, wal) = one_synced_then_two_unsynced();
    let newer = segment_path(dir.path(), wal.generation + 1);
    std::fs::write(&newer, b"a segment created but never synced").expect("written");
    drop(wal);
    let erased = erase_unsynced(dir.path(), 0).expect("erases").expect("a mark");
    let frames = (8 + 3) + (8 + 5);
    assert_eq!(erased, frames + "a segment created but never synced".len() as u64);
    assert!(!newer.exists());
    let (_, records) = Wal::open(dir.path(), 1 << 20).expect("reopens");
    assert_eq!(records, vec![b"checkpoint".to_vec(), b"one".to_vec()]);
    assert_eq!(erase_unsynced(dir.path(), 0).expect("erases again"), Some(0), "nothing left");
}

/// A harsher power cut (issue 16): the disk wrote a prefix of what was not synced, which
/// may end inside a frame. The log reopens with the synced records and the whole frames of that
/// prefix, never a torn one, and a cut that keeps everything loses nothing.
#[test]
fn a_power_cut_that_keeps_a_prefix_of_the_unsynced_bytes_reopens_with_whole_records() {
    let frame = |payload: &[u8]| 8 + payload.len() as u64;
    let unsynced = frame(b"two") + frame(b"three");
    for keep_permille in [0_u16, 100, 300, 500, 600, 999, 1000] {
        let (dir, wal) = one_synced_then_two_unsynced();
        drop(wal);
        let erased = erase_unsynced(dir.path(), keep_permille).expect("erases").expect("a mark");
        let kept = unsynced * u64::from(keep_permille) / 1000;
        assert_eq!(erased, unsynced - kept, "keeping {keep_permille}‰");
        let (_, records) = Wal::open(dir.path(), 1 << 20).expect("reopens");
        let mut expected = vec![b"checkpoint".to_vec(), b"one".to_vec()];
        if kept >= frame(b"two") {
            expected.push(b"two".to_vec());
        }
        if kept == unsynced {
            expected.push(b"three".to_vec());
        }
        assert_eq!(records, expected, "keeping {keep_permille}‰ ({kept} of {unsynced} bytes)");
    }
}

/// A sync that fails stops the log for good: its batch is not acknowledged, and nothing
/// after it is, even once syncs would succeed again (after a failed `fsync` the kernel may have
/// dropped the dirty pages, so a later one that succeeds proves nothing).
#[test]
fn a_failed_sync_acknowledges_nothing_and_stops_the_log_for_good() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let (mut wal, trigger, synced_mark) = one_synced_then_failing_syncs(dir.path());
    assert_eq!(
        synced_mark,
        test_faults::format_mark(
            &wal.segment.path.file_name().expect("named").to_string_lossy(),
            wal.offset
        )
    );
    std::fs::write(&trigger, b"").expect("written");
    let (completion, receiver) = done();
    wal.append(b"two", Some(completion), Urgency::Now).expect("queued before the failure");
    let error = receiver.recv().expect("completed").expect_err("a failed sync is not durable");
    assert!(error.to_string().contains("os error 5"), "{error}");
    std::fs::remove_file(&trigger).expect("removed");
    assert_stopped_holding_one(wal, dir.path(), &synced_mark, Urgency::Now);
}

/// A log in `dir` whose syncs fail while the returned trigger file exists, holding "one"
/// acknowledged, and its synced mark after "one".
fn one_synced_then_failing_syncs(dir: &std::path::Path) -> (Wal, std::path::PathBuf, String) {
    let trigger = dir.join("fail-sync");
    let (recovered, _) = Wal::open(dir, 1 << 20).expect("opens");
    let faults = TestFaults::failing_syncs_while(dir, trigger.clone()).expect("a mark");
    let mut wal =
        recovered.start_with(&[b"checkpoint".to_vec()], Arc::default(), faults).expect("starts");
    append_and_wait(&mut wal, b"one");
    let mark_path = dir.join(test_faults::SYNCED_MARK_FILE);
    let synced_mark = std::fs::read_to_string(&mark_path).expect("a mark");
    (wal, trigger, synced_mark)
}

/// After a failed sync, syncs that would succeed again: `wal` refuses a record appended with
/// `urgency`, and once closed and cut off as by a power loss, the log in `dir` holds exactly
/// what was acknowledged ("one"), its synced mark still `synced_mark`.
fn assert_stopped_holding_one(
    mut wal: Wal,
    dir: &std::path::Path,
    synced_mark: &str,
    urgency: Urgency,
) {
    let (completion, receiver) = done();
    // Refused at once, or (queued in the instant before the flusher marks the log failed)
    // answered with the failure.
    let refused = match wal.append(b"three", Some(completion), urgency) {
        Err(refused) => refused,
        Ok(()) => receiver.recv().expect("completed").expect_err("the log stopped"),
    };
    assert!(refused.to_string().contains("os error 5"), "{refused}");
    drop(wal);
    // The mark still ends after "one": a failed sync proves nothing durable, so a power cut
    // erases what it wrote, and the log holds exactly what was acknowledged.
    let mark_path = dir.join(test_faults::SYNCED_MARK_FILE);
    assert_eq!(std::fs::read_to_string(&mark_path).expect("a mark"), synced_mark);
    assert!(erase_unsynced(dir, 0).expect("erases").is_some_and(|bytes| bytes > 0));
    let (_, records) = Wal::open(dir, 1 << 20).expect("reopens");
    assert_eq!(records, [b"checkpoint".to_vec(), b"one".to_vec()]);
}

/// Without a mark (a node that never ran with one) nothing is erased.
#[test]
fn erasing_without_a_mark_changes_nothing() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let (mut wal, _) = open(dir.path(), 1 << 20);
    append_and_wait(&mut wal, b"one");
    drop(wal);
    assert_eq!(erase_unsynced(dir.path(), 0).expect("erases"), None);
    let (_, records) = Wal::open(dir.path(), 1 << 20).expect("reopens");
    assert_eq!(records, vec![b"checkpoint".to_vec(), b"one".to_vec()]);
}

/// The writer's own sync (a lone record on a quiet log) fails as the flusher's does: the
/// record's completion, and that of the deferred record it took along, get the error before
/// `append` returns, nothing after it is accepted, and
/// after a power cut the log holds exactly what was acknowledged.
#[test]
fn a_failed_sync_by_the_writer_itself_acknowledges_nothing_and_stops_the_log() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let (mut wal, trigger, synced_mark) = one_synced_then_failing_syncs(dir.path());
    // The flusher fires completions before it clears its flag: wait for it to be idle and to
    // have found the log quiet, so that the next lone record is synced by its writer.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let queue = wal.shared.queue();
        if !queue.flushing && queue.quiet {
            break;
        }
        drop(queue);
        assert!(std::time::Instant::now() < deadline, "the flusher never became idle");
        std::thread::yield_now();
    }
    // A queued acquire rides in the writer's sync: it fails with it.
    wal.shared.queue().max_defer = Some(Duration::from_secs(600));
    let (deferred, deferred_done) = done();
    wal.append(b"queued waiter", Some(deferred), Urgency::Soon).expect("queued");
    std::fs::write(&trigger, b"").expect("written");
    let (completion, receiver) = done();
    wal.append(b"two", Some(completion), Urgency::Alone).expect("written by its writer");
    for receiver in [receiver, deferred_done] {
        let error = receiver
            .try_recv()
            .expect("completed before append returned")
            .expect_err("a failed sync is not durable");
        assert!(error.to_string().contains("os error 5"), "{error}");
    }
    std::fs::remove_file(&trigger).expect("removed");
    assert_stopped_holding_one(wal, dir.path(), &synced_mark, Urgency::Alone);
}
