//! The log store against a plain model: after any sequence of changes and a restart, the
//! log reads back as the model says, across many segment rotations.

use super::*;
use openraft::testing::blank_ent;
use openraft::type_config::TypeConfigExt;
use proptest::prelude::*;

#[derive(Clone, Debug)]
enum Op {
    Append { count: u8, term_step: u8 },
    TruncateAfter { back: u8 },
    Purge { back: u8 },
    Vote { term_step: u8 },
    Committed { back: u8 },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (1_u8..20, 0_u8..2).prop_map(|(count, term_step)| Op::Append { count, term_step }),
        1 => (0_u8..10).prop_map(|back| Op::TruncateAfter { back }),
        1 => (0_u8..30).prop_map(|back| Op::Purge { back }),
        1 => (0_u8..2).prop_map(|term_step| Op::Vote { term_step }),
        1 => (0_u8..10).prop_map(|back| Op::Committed { back }),
    ]
}

#[derive(Debug, Default, PartialEq)]
struct Model {
    entries: BTreeMap<u64, LogId>,
    vote: Option<Vote>,
    committed: Option<LogId>,
    last_purged: Option<LogId>,
}

async fn read_back(store: &mut LogStore) -> Model {
    let entries = store.try_get_log_entries(..).await.expect("reads");
    let state = store.get_log_state().await.expect("reads");
    Model {
        entries: entries.iter().map(|entry| (entry.log_id.index(), entry.log_id)).collect(),
        vote: store.read_vote().await.expect("reads"),
        committed: store.read_committed().await.expect("reads"),
        last_purged: state.last_purged_log_id,
    }
}

async fn apply(store: &mut LogStore, model: &mut Model, term: &mut u64, op: Op) {
    let last = model.entries.keys().next_back().copied();
    let next = last.or(model.last_purged.map(|id| id.index())).map_or(1, |index| index + 1);
    match op {
        Op::Append { count, term_step } => {
            *term += u64::from(term_step);
            let entries: Vec<Entry> = (next..next + u64::from(count))
                .map(|index| blank_ent::<TypeConfig>(*term, 1, index))
                .collect();
            for entry in &entries {
                model.entries.insert(entry.log_id.index(), entry.log_id);
            }
            let (done, flushed) = TypeConfig::oneshot();
            store.append(entries, IOFlushed::signal(done)).await.expect("appends");
            flushed.await.expect("completes").expect("durable");
        }
        Op::TruncateAfter { back } => {
            let Some(last) = last else { return };
            let keep = last.saturating_sub(u64::from(back));
            let Some(kept) = model.entries.get(&keep).copied() else { return };
            model.entries.retain(|index, _| *index <= keep);
            store.truncate_after(Some(kept)).await.expect("truncates");
        }
        Op::Purge { back } => {
            let Some(last) = last else { return };
            let upto = last.saturating_sub(u64::from(back));
            let Some(purged) = model.entries.get(&upto).copied() else { return };
            model.entries.retain(|index, _| *index > upto);
            model.last_purged = Some(purged);
            store.purge(purged).await.expect("purges");
        }
        Op::Vote { term_step } => {
            *term += u64::from(term_step);
            let vote = Vote::new(*term, 1);
            model.vote = Some(vote);
            store.save_vote(&vote).await.expect("saves");
        }
        Op::Committed { back } => {
            let Some(last) = last else { return };
            let Some(committed) = model.entries.get(&last.saturating_sub(u64::from(back))).copied()
            else {
                return;
            };
            model.committed = Some(committed);
            store.save_committed(Some(committed)).await.expect("saves");
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn the_log_reads_back_as_the_model_after_a_restart(ops in proptest::collection::vec(op(), 1..60)) {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
        runtime.block_on(async {
            let dir = tempfile::tempdir().expect("a temporary directory");
            // Small segments, so that sequences rotate through many of them.
            let mut store = LogStore::open(dir.path(), 2048, None).expect("opens");
            let (mut model, mut term) = (Model::default(), 1);
            for op in ops {
                apply(&mut store, &mut model, &mut term, op).await;
                prop_assert_eq!(&read_back(&mut store).await, &model);
            }
            // The committed id rides along with the next sync; this vote is one.
            term += 1;
            apply(&mut store, &mut model, &mut term, Op::Vote { term_step: 0 }).await;
            drop(store);
            let mut reopened = LogStore::open(dir.path(), 2048, None).expect("reopens");
            prop_assert_eq!(&read_back(&mut reopened).await, &model);
            let segments = std::fs::read_dir(dir.path().join(LOG_DIR)).expect("lists").count();
            prop_assert_eq!(segments, 1, "older segments are deleted");
            Ok(())
        })?;
    }
}

/// An entry whose command carries `bytes` of name (far beyond what the leader lets through,
/// to make large records without many entries).
fn large_entry(term: u64, index: u64, bytes: usize) -> Entry {
    let mut entry = blank_ent::<TypeConfig>(term, 1, index);
    let command = picket_core::Command::Acquire {
        session: picket_core::SessionId(1),
        name: "x".repeat(bytes),
        wait: picket_core::Wait::Try,
        request: picket_core::RequestId::default(),
        attempt: 0,
    };
    entry.payload = openraft::EntryPayload::Normal(picket_core::Input::new(0, command));
    entry
}

/// Issue 13: the checkpoint of the whole live log was one WAL record, and past the WAL's
/// record limit every rotation and every restart hit an assertion. Appends and checkpoints
/// are now cut into records of at most about `RECORD_CHUNK_BYTES`.
#[test]
fn a_live_log_larger_than_a_record_is_written_and_read_back_in_chunks() {
    let runtime =
        tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
    runtime.block_on(async {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let mut store = LogStore::open(dir.path(), 1 << 20, None).expect("opens");
        let chunk = RECORD_CHUNK_BYTES / 3;
        let entries: Vec<Entry> = (1..=7).map(|index| large_entry(1, index, chunk)).collect();
        let records = append_records(&entries);
        assert!(records.len() >= 3, "7 entries of a third of a chunk: {} records", records.len());
        assert!(records.iter().all(|record| record.len() <= RECORD_CHUNK_BYTES + 1024));
        let (done, flushed) = TypeConfig::oneshot();
        store.append(entries.clone(), IOFlushed::signal(done)).await.expect("appends");
        flushed.await.expect("completes").expect("durable");
        let checkpoint = store.view().checkpoint();
        assert!(checkpoint.len() >= 3, "the checkpoint is cut too");
        drop(store);
        let mut reopened = LogStore::open(dir.path(), 1 << 20, None).expect("reopens");
        let read = reopened.try_get_log_entries(..).await.expect("reads");
        assert_eq!(read, entries);
    });
}

/// The bound the chunking asserts holds for every command the limits let through: the
/// largest tick and the largest name (of NUL bytes, which JSON writes six times over).
#[test]
fn the_largest_commands_the_limits_allow_encode_below_the_entry_bound() {
    let renew = vec![picket_core::SessionId(u64::MAX); picket_core::MAX_RENEWALS_PER_TICK_CAP];
    let tick = picket_core::Command::Tick { renew, renew_for: Vec::new() };
    let mut entry = blank_ent::<TypeConfig>(u64::MAX, u64::MAX, u64::MAX);
    entry.payload = openraft::EntryPayload::Normal(picket_core::Input::new(u64::MAX, tick));
    let tick_bytes = encode_json(&entry).len();
    assert!(tick_bytes < MAX_ENTRY_BYTES, "{tick_bytes}");
    let mut entry = large_entry(u64::MAX, u64::MAX, 0);
    if let openraft::EntryPayload::Normal(input) = &mut entry.payload
        && let picket_core::Command::Acquire { name, .. } = &mut input.command
    {
        *name = "\0".repeat(picket_core::MAX_NAME_BYTES_CAP);
    }
    let name_bytes = encode_json(&entry).len();
    assert!(name_bytes > 6 * picket_core::MAX_NAME_BYTES_CAP && name_bytes < MAX_ENTRY_BYTES);
}

#[test]
fn a_data_directory_of_an_earlier_format_is_refused() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    std::fs::create_dir(dir.path().join("raft-log")).expect("creates");
    let error = LogStore::open(dir.path(), crate::wal::SEGMENT_BYTES, None).expect_err("refused");
    assert!(error.to_string().contains("earlier Picket"), "{error}");
}

/// Fuzz target (issue 13): a log whose WAL frames are intact but whose records say anything
/// (entries out of order or with holes, purges going back, records that are not JSON) is
/// refused with an error or recovered into a contiguous log; opening never panics.
mod fuzz {
    use super::*;
    use crate::wal::Wal;

    fn log_id_json(term: u64, index: u64) -> serde_json::Value {
        serde_json::to_value(openraft::testing::log_id::<TypeConfig>(term, 1, index)).expect("json")
    }

    fn record() -> impl Strategy<Value = Vec<u8>> {
        let index = prop_oneof![3 => 0_u64..12, 1 => Just(u64::MAX), 1 => any::<u64>()];
        let entries = proptest::collection::vec((0_u64..3, index.clone()), 0..5).prop_map(|ids| {
            let entries: Vec<Entry> = ids
                .into_iter()
                .map(|(term, index)| blank_ent::<TypeConfig>(term, 1, index))
                .collect();
            serde_json::to_value(entries).expect("json")
        });
        prop_oneof![
                entries.clone().prop_map(|entries| serde_json::json!({ "Checkpoint": { "vote": null, "committed": null, "last_purged": null, "entries": entries } })),
                entries.prop_map(|entries| serde_json::json!({ "Append": entries })),
                (0_u64..3, index.clone()).prop_map(|(term, index)| serde_json::json!({ "Purge": log_id_json(term, index) })),
                (0_u64..3, index.clone()).prop_map(|(term, index)| serde_json::json!({ "Committed": log_id_json(term, index) })),
                index.prop_map(|start| serde_json::json!({ "TruncateFrom": start })),
                "\\PC{0,20}".prop_map(serde_json::Value::String),
            ]
            .prop_map(|value| serde_json::to_vec(&value).expect("json"))
    }

    /// Writes `records` (the first as the checkpoint) as intact WAL frames and opens the log.
    fn open_records(records: &[serde_json::Value]) -> io::Result<LogStore> {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let payloads: Vec<Vec<u8>> =
            records.iter().map(|record| serde_json::to_vec(record).expect("json")).collect();
        let (recovered, _) = Wal::open(&dir.path().join(LOG_DIR), 1 << 16).expect("opens");
        let wal = recovered.start(&payloads, Arc::default()).expect("starts");
        drop(wal);
        LogStore::open(dir.path(), 1 << 16, None)
    }

    fn checkpoint(entries: &[(u64, u64)]) -> serde_json::Value {
        let entries: Vec<Entry> =
            entries.iter().map(|(term, index)| blank_ent::<TypeConfig>(*term, 1, *index)).collect();
        serde_json::json!({ "Checkpoint": { "vote": null, "committed": null, "last_purged": null, "entries": entries } })
    }

    /// Found by the target below: entries that do not continue the log hit the view's
    /// assertion while the node started.
    #[test]
    fn fuzz_appended_entries_with_a_hole_are_refused_not_a_panic() {
        let hole = serde_json::json!({ "Append": [blank_ent::<TypeConfig>(1, 1, 7)] });
        let error = open_records(&[checkpoint(&[(1, 1)]), hole]).expect_err("refused");
        assert!(error.to_string().contains("hole"), "{error}");
        let error = open_records(&[checkpoint(&[(1, 3), (1, 2)])]).expect_err("refused");
        assert!(error.to_string().contains("hole"), "{error}");
    }

    /// Found by the target below: a purge of the largest index overflowed the contiguity
    /// check.
    #[test]
    fn fuzz_a_purge_of_the_largest_index_is_refused_not_an_overflow() {
        let purge = serde_json::json!({ "Purge": log_id_json(1, u64::MAX) });
        let error = open_records(&[checkpoint(&[]), purge]).expect_err("refused");
        assert!(error.to_string().contains("largest"), "{error}");
    }

    proptest! {
        #![proptest_config(ProptestConfig {
            cases: picket_testkit::fuzz_cases(1_000),
            ..ProptestConfig::default()
        })]

        #[test]
        fn fuzz_a_log_of_any_records_is_refused_or_recovered_contiguous(
            checkpoint in record(),
            records in proptest::collection::vec(record(), 0..6),
        ) {
            let dir = tempfile::tempdir().expect("a temporary directory");
            let (recovered, _) = Wal::open(&dir.path().join(LOG_DIR), 1 << 16).expect("opens");
            let mut wal = recovered.start(&[checkpoint], Arc::default()).expect("starts");
            for record in &records {
                let (done, durable) = std::sync::mpsc::channel();
                let completion: Completion = Box::new(move |result| {
                    let _ = done.send(result);
                });
                wal.append(record, Some(completion), Urgency::Now).expect("queued");
                durable.recv().expect("completed").expect("durable");
            }
            drop(wal);
            if let Ok(store) = LogStore::open(dir.path(), 1 << 16, None) {
                prop_assert!(check_contiguous(&store.view()).is_ok());
            }
        }
    }
}

/// A log in `dir` holding entries 1 to 6 of term 2 (leader 1) under that leader's vote, and
/// their ids.
async fn six_entries_of_term_2(dir: &std::path::Path) -> (LogStore, Vec<LogId>) {
    let mut store = LogStore::open(dir, 1 << 20, None).expect("opens");
    let entries: Vec<Entry> = (1..=6).map(|index| blank_ent::<TypeConfig>(2, 1, index)).collect();
    let held: Vec<LogId> = entries.iter().map(|entry| entry.log_id).collect();
    let (done, flushed) = TypeConfig::oneshot();
    store.append(entries, IOFlushed::signal(done)).await.expect("appends");
    flushed.await.expect("completes").expect("durable");
    store.save_vote(&Vote::new_committed(2, 1)).await.expect("saves");
    (store, held)
}

/// Regression (issue 16): after a power cut lost a majority's unsynced tail, a new leader
/// sent a follower entries at indexes it had committed, with other terms. openraft's debug
/// assertion stopped that follower with a panic (a release build would take them as agreeing
/// and diverge). The log store names such a contradiction, and only such a one.
#[test]
fn a_leader_contradicting_a_committed_entry_is_found_and_nothing_else_is() {
    let runtime =
        tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
    runtime.block_on(async {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let (mut store, held) = six_entries_of_term_2(dir.path()).await;
        let other_term = |index| blank_ent::<TypeConfig>(3, 2, index).log_id;
        let newer = Vote::new_committed(3, 2);

        // Nothing is committed yet: any leader may replace any entry.
        assert_eq!(store.contradicted_commit(&newer, &[other_term(2)]), None);

        store.save_committed(Some(held[3])).await.expect("saves");
        // The same entries agree; entries past the committed one may be replaced.
        assert_eq!(store.contradicted_commit(&newer, &held), None);
        assert_eq!(store.contradicted_commit(&newer, &[other_term(5), other_term(6)]), None);
        // An entry at a committed index with another term is the contradiction.
        assert_eq!(
            store.contradicted_commit(&newer, &[held[2], other_term(4), other_term(5)]),
            Some((held[3], other_term(4)))
        );
        // A message of an older vote than the one held is openraft's to refuse.
        store.save_vote(&Vote::new_committed(4, 3)).await.expect("saves");
        assert_eq!(store.contradicted_commit(&newer, &[other_term(4)]), None);
    });
}

/// The same for a snapshot (review of issue 16's halt): one that ends after the committed entry
/// in log id order but not at a greater index contradicts it; one ending further on, or at or
/// before it, does not (openraft skips the latter).
#[test]
fn a_snapshot_contradicting_a_committed_entry_is_found_and_nothing_else_is() {
    let runtime =
        tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
    runtime.block_on(async {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let (mut store, held) = six_entries_of_term_2(dir.path()).await;
        let newer = Vote::new_committed(3, 2);
        let at = |index| blank_ent::<TypeConfig>(3, 2, index).log_id;
        assert_eq!(store.snapshot_contradicting_commit(&newer, Some(&at(2))), None, "none yet");
        store.save_committed(Some(held[3])).await.expect("saves");
        assert_eq!(
            store.snapshot_contradicting_commit(&newer, Some(&at(4))),
            Some((held[3], at(4)))
        );
        assert_eq!(
            store.snapshot_contradicting_commit(&newer, Some(&at(3))),
            Some((held[3], at(3)))
        );
        assert_eq!(store.snapshot_contradicting_commit(&newer, Some(&at(5))), None);
        assert_eq!(store.snapshot_contradicting_commit(&newer, Some(&held[2])), None);
        assert_eq!(store.snapshot_contradicting_commit(&newer, None), None);
    });
}

/// Regression: a follower deferred the sync of entries that only queue an acquire, as a leader
/// does, but a follower's answer to its leader waits for that sync and its leader sends nothing
/// more until it has the answer: the release behind the acquire (and the grant it makes) waited
/// out the whole deferral (3-node cluster, 8 clients on one lock: 1,398 -> 1,664 handoffs/s once
/// followers stopped deferring). With deferral not allowed, such an entry is synced at once.
#[tokio::test]
async fn an_entry_that_only_queues_is_synced_at_once_where_deferral_is_not_allowed() {
    use futures_util::FutureExt as _;
    let dir = tempfile::tempdir().expect("a temporary directory");
    let always = OnlyQueueWaiters::new(|_: &[Entry]| true);
    let mut store = LogStore::open(dir.path(), 1 << 20, Some(always)).expect("opens");
    // A follower of a three-node cluster.
    store.follow_role(false, 3);
    let (done, flushed) = TypeConfig::oneshot();
    let entry = blank_ent::<TypeConfig>(1, 1, 1);
    store.append(vec![entry], IOFlushed::signal(done)).await.expect("appends");
    let synced = flushed.now_or_never().expect("synced before append returned");
    synced.expect("completes").expect("durable");
    // Allowed again (its leader now), the same kind of entry still becomes durable, in its own
    // time.
    store.follow_role(true, 3);
    let (done, flushed) = TypeConfig::oneshot();
    let entry = blank_ent::<TypeConfig>(1, 1, 2);
    store.append(vec![entry], IOFlushed::signal(done)).await.expect("appends");
    flushed.await.expect("completes").expect("durable");
}
