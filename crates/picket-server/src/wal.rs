//! A write-ahead log of preallocated segment files, with group commit.
//!
//! ```text
//!  writer (under the log store's lock) ── frames ──► queue ──► flusher thread:
//!                                                             pwrite into the segment's
//!                                                             preallocated space, ONE
//!                                                             fdatasync, then the completions
//! ```
//!
//! One record at a time (a lone Raft entry on a quiet log: the last sync served at most one
//! awaited, not deferred, record and no other arrived during it), the writer writes and syncs it itself, with whatever
//! rides along, instead of waking the flusher and being woken back: two thread hand-offs fewer
//! on the path of every write (one client's acquire p50 0.24 → 0.20 ms, BENCHMARKS.md). A batch
//! of entries ends the quiet, and the flusher's group commit takes over until a sync of its own
//! finds the load one record at a time again. Deferred records (a queued acquire, which nobody
//! waits on) neither end the quiet nor keep the writer from syncing: it takes them along, which
//! under contention saves each handoff's release the trip to the flusher and back (8 clients'
//! handoffs ×1.06 and ×1.09 in two interleaved runs, BENCHMARKS.md). Only one batch is ever
//! being written, by either.
//! A leader with followers turns this off ([`Wal::allow_inline_sync`]): its core must send each
//! entry to them while its own sync runs, not after it.
//!
//! Why not an append-only file: `fdatasync` after appending to a file that grows must also
//! write the new size and extents (the inode, or a journal commit). Writing inside space that was
//! allocated beforehand (`posix_fallocate`) changes neither, and the same sync takes about 1.5×
//! less time on this machine's ext4 (130 µs against 85 µs; `scripts/fsync-prealloc.py`,
//! BENCHMARKS.md). That is paid once per batch on the path of every write.
//!
//! Layout. The directory holds segments named by a growing generation number. Every segment
//! starts with a checkpoint (the whole state the caller needs to rebuild itself), followed by
//! change records. A checkpoint is as many records as the caller needs, so it never meets the
//! record size limit however large the state: a header record (a magic string and the number of
//! checkpoint records) and then those records; a segment missing any of them has no intact
//! checkpoint. (A segment written before checkpoints had a header starts with a single
//! checkpoint record, and is read as such.) A frame is `len: u32 LE | crc32: u32 LE | payload`; the preallocated space
//! reads as zeros, so a zero length marks the end.
//!
//! Recovery. The newest segment whose checkpoint is intact wins. Its records are read up to the
//! first frame that is incomplete or fails its checksum: that is the tail of the last batch,
//! which was never acknowledged, because a batch is written only after the previous one's sync
//! returned. Opening then always starts a new segment with a checkpoint of the recovered state
//! and deletes the older segments once that is durable, so a torn tail is never written after,
//! and a crash in the middle of starting a segment leaves the previous one in place.
//!
//! When a segment is full the caller starts the next one with a fresh checkpoint; the old one is
//! deleted once the new checkpoint is durable. Segments stay bounded because the checkpoint holds
//! only the live state (the Raft log is purged after every snapshot).

mod test_faults;

use test_faults::TestFaults;
pub use test_faults::erase_unsynced;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use std::collections::VecDeque;
use std::fs::File;
use std::io::{self, Read};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// The size of a segment's preallocated space, unless a checkpoint needs more.
pub const SEGMENT_BYTES: u64 = 64 * 1024 * 1024;
/// The largest record accepted, a bound on what recovery reads into memory at once.
pub const MAX_RECORD_BYTES: usize = 512 * 1024 * 1024;
const FRAME_HEADER_BYTES: usize = 8;
/// The longest a record appended with [`Urgency::Soon`] waits for a sync it can share.
pub const MAX_SYNC_DEFER: Duration = Duration::from_millis(1);
const SEGMENT_SUFFIX: &str = ".wal";
/// How a checkpoint's header record starts; the record count follows, 8 bytes little-endian.
const CHECKPOINT_MAGIC: &[u8] = b"picket-wal-checkpoint\0";

/// Counters of the log, exported as metrics (`picket_wal_*`). Each is a handle: clones count
/// into the same value.
#[derive(Clone, Debug)]
pub struct WriterStats {
    /// Batches synced (each is one fdatasync).
    pub syncs: Counter,
    /// Entries appended (counted by the log store).
    pub entries: Counter,
    /// Bytes written to segments, checkpoints included.
    pub bytes: Counter,
    /// How long each write and sync of a batch took.
    pub sync_seconds: Histogram,
}

impl Default for WriterStats {
    fn default() -> Self {
        Self {
            syncs: Counter::default(),
            entries: Counter::default(),
            bytes: Counter::default(),
            // 25 µs to about 0.8 s: an NVMe sync is tens of µs, a cloud volume's a few ms.
            sync_seconds: Histogram::new(exponential_buckets(0.000_025, 2.0, 16)),
        }
    }
}

/// When a record that somebody waits on must be synced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Urgency {
    /// As soon as the flusher is free.
    Now,
    /// As [`Urgency::Now`], for a record that is all its writer has to write (one Raft entry,
    /// not a batch of them): on a quiet log (the last sync served at most one awaited record,
    /// that is one not deferred, and no other arrived during it) the writer syncs it itself, with whatever rides
    /// along, instead of waking the flusher thread and being woken back, two thread hand-offs
    /// on the path of every write. A record with [`Urgency::Now`] and a completion means
    /// writes come in batches, and ends the quiet until the flusher finds it again.
    Alone,
    /// Nothing is acknowledged on this record alone (a later record's sync covers it and is what
    /// gets acknowledged): sync it with the next urgent record, or after [`MAX_SYNC_DEFER`] at
    /// the latest. Its completion still fires only after the sync, so deferring never lets an
    /// acknowledgement precede durability; it only lets two records share one sync.
    Soon,
}

/// Called once the record it was submitted with is durable, or with the error that stopped it.
pub type Completion = Box<dyn FnOnce(io::Result<()>) + Send>;

/// The writing end of the log. Writes are queued in the order of the calls.
pub struct Wal {
    dir: PathBuf,
    segment_bytes: u64,
    generation: u64,
    segment: Arc<Segment>,
    /// Where the next frame goes in the current segment.
    offset: u64,
    shared: Arc<Shared>,
    /// Joined on drop, so that a log closed and opened again in one process never lists a
    /// segment the old flusher is still deleting.
    flusher: Option<std::thread::JoinHandle<()>>,
}

struct Segment {
    file: File,
    path: PathBuf,
    /// The preallocated size; frames are never written past it.
    capacity: u64,
}

/// A run of frames for one segment and what to do once they are durable.
struct Batch {
    segment: Arc<Segment>,
    offset: u64,
    bytes: Vec<u8>,
    completions: Vec<Completion>,
    /// How many of `completions` somebody waits on: those of records not deferred
    /// ([`Urgency::Soon`]). Only they say whether the load is one record at a time.
    awaited: usize,
    /// Set on a segment's first batch: sync the directory (the segment's name must survive a
    /// crash) and then delete these older segments.
    replaces: Option<Vec<PathBuf>>,
}

#[derive(Default)]
struct Queue {
    batches: VecDeque<Batch>,
    /// A queued batch has a completion, so somebody waits for a sync. Frames without one (the
    /// committed index) ride along with the next sync instead of costing their own.
    urgent: bool,
    /// When the oldest queued [`Urgency::Soon`] record arrived, if no urgent one is queued.
    deferred_since: Option<Instant>,
    /// How long a deferred record may wait; `None` is [`MAX_SYNC_DEFER`] (tests lengthen it).
    max_defer: Option<Duration>,
    /// A deferred record was appended since the flusher last found none queued (see
    /// `wait_for_work`).
    deferred_seen: bool,
    /// When the flusher's timed wait ends, while it waits with one: no later than a deferred
    /// record's bound from when the wait began, so it looks at the queue again in time for any
    /// deferred record appended meanwhile, and appending one need not wake it.
    flusher_until: Option<Instant>,
    /// How many times an append woke the flusher (tests only).
    #[cfg(test)]
    wakes: u64,
    closed: bool,
    failed: Option<String>,
    /// A batch is being written and synced (by the flusher, or inline by a writer): nothing
    /// else may start one until it is done, so batches reach the disk in order.
    flushing: bool,
    /// The last sync served at most one awaited record and no other awaited record arrived
    /// while it ran: the load is one record at a time, and a writer finding the log idle syncs
    /// its record itself instead of waking the flusher and being woken back (two thread
    /// hand-offs per write). Deferred records do not count: nobody waits on them, and under
    /// contention one rides along with nearly every handoff's release.
    quiet: bool,
}

struct Shared {
    queue: Mutex<Queue>,
    wake: Condvar,
    stats: Arc<WriterStats>,
    faults: TestFaults,
    /// Whether a writer may sync its own lone record on a quiet log. Off on a leader with
    /// followers: its core, syncing, would send them the entry only after its own sync instead
    /// of during it (one client on a 3-node cluster: acquire p50 0.51 → 0.69 ms).
    inline_allowed: AtomicBool,
}

impl Shared {
    fn queue(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Writes and syncs `batches` (taken while `flushing` was set), then clears `flushing` and
    /// notes whether the load is quiet. A failed write or sync leaves the disk in an unknown
    /// state, and carrying on could acknowledge entries that are not durable: everything from
    /// then on is refused. Returns false then.
    fn flush_taken(&self, batches: VecDeque<Batch>) -> bool {
        let awaited = batches.iter().map(|batch| batch.awaited).sum::<usize>();
        self.stats.syncs.inc();
        let result = flush(batches, self);
        let mut queue = self.queue();
        queue.flushing = false;
        queue.quiet = awaited <= 1 && !queue.urgent;
        let Err(error) = result else {
            let wake = queue.urgent || queue.deferred_since.is_some() || queue.closed;
            drop(queue);
            if wake {
                self.wake.notify_one();
            }
            return true;
        };
        tracing::error!(%error, "the raft log could not be written; refusing further writes");
        let message = error.to_string();
        queue.failed = Some(message.clone());
        let rest = std::mem::take(&mut queue.batches);
        drop(queue);
        for completion in rest.into_iter().flat_map(|batch| batch.completions) {
            completion(Err(io::Error::other(message.clone())));
        }
        false
    }
}

fn frame(payload: &[u8]) -> Vec<u8> {
    assert!(payload.len() <= MAX_RECORD_BYTES, "a WAL record is at most {MAX_RECORD_BYTES} bytes");
    let mut bytes = Vec::with_capacity(FRAME_HEADER_BYTES + payload.len());
    let len = u32::try_from(payload.len()).expect("bounded by MAX_RECORD_BYTES");
    bytes.extend_from_slice(&len.to_le_bytes());
    bytes.extend_from_slice(&crc32fast::hash(payload).to_le_bytes());
    bytes.extend_from_slice(payload);
    bytes
}

fn segment_path(dir: &Path, generation: u64) -> PathBuf {
    dir.join(format!("{generation:016x}{SEGMENT_SUFFIX}"))
}

/// The generations of the segments in `dir`, oldest first.
fn list_segments(dir: &Path) -> io::Result<Vec<u64>> {
    let mut generations = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let name = entry?.file_name();
        let Some(stem) = name.to_str().and_then(|name| name.strip_suffix(SEGMENT_SUFFIX)) else {
            continue;
        };
        if let Ok(generation) = u64::from_str_radix(stem, 16) {
            generations.push(generation);
        }
    }
    generations.sort_unstable();
    Ok(generations)
}

/// The intact records of one segment, in order, stopping at the first torn or zero frame.
fn read_segment(path: &Path) -> io::Result<Vec<Vec<u8>>> {
    let file = File::open(path)?;
    let mut remaining = file.metadata()?.len();
    let mut reader = io::BufReader::with_capacity(1 << 20, file);
    let mut records = Vec::new();
    loop {
        let mut header = [0_u8; FRAME_HEADER_BYTES];
        if read_full(&mut reader, &mut header)? < FRAME_HEADER_BYTES {
            return Ok(records);
        }
        remaining -= FRAME_HEADER_BYTES as u64;
        let len = u32::from_le_bytes(header[..4].try_into().expect("4 bytes")) as usize;
        let crc = u32::from_le_bytes(header[4..].try_into().expect("4 bytes"));
        // A torn length can say anything; one longer than the rest of the file is not read.
        if len == 0 || len > MAX_RECORD_BYTES || len as u64 > remaining {
            return Ok(records);
        }
        let mut payload = vec![0_u8; len];
        if read_full(&mut reader, &mut payload)? < len || crc32fast::hash(&payload) != crc {
            return Ok(records);
        }
        remaining -= len as u64;
        records.push(payload);
    }
}

/// Reads until `buf` is full or the file ends; returns how much was read.
fn read_full(reader: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match reader.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(read) => filled += read,
            Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
            Err(error) => return Err(error),
        }
    }
    Ok(filled)
}

/// Creates a segment file with `bytes` of space allocated (reading as zeros).
fn create_segment(path: &Path, bytes: u64) -> io::Result<Segment> {
    let file = std::fs::OpenOptions::new().read(true).write(true).create_new(true).open(path)?;
    // Space allocated up front, so that a sync after writing into it has no size or extent
    // change to commit.
    match rustix::fs::fallocate(&file, rustix::fs::FallocateFlags::empty(), 0, bytes) {
        Ok(()) => {}
        // A file system without fallocate still works, only with slower syncs.
        Err(rustix::io::Errno::OPNOTSUPP | rustix::io::Errno::NOSYS) => {
            tracing::debug!(
                "the file system cannot allocate space up front; the segment is sparse"
            );
            file.set_len(bytes)?;
        }
        // Out of space, above all: fail now rather than on a later write.
        Err(error) => {
            drop(file);
            let _ = std::fs::remove_file(path);
            return Err(io::Error::from(error));
        }
    }
    Ok(Segment { file, path: path.to_owned(), capacity: bytes })
}

/// Creates segment `generation` in `dir` for a log whose segments get `segment_bytes`, sized to
/// hold at least twice `checkpoint`; returns it with the checkpoint's frames (header first), not
/// yet written.
fn create_checkpointed_segment(
    dir: &Path,
    generation: u64,
    segment_bytes: u64,
    checkpoint: &[Vec<u8>],
) -> io::Result<(Segment, Vec<u8>)> {
    let mut header = CHECKPOINT_MAGIC.to_vec();
    header.extend_from_slice(&(checkpoint.len() as u64).to_le_bytes());
    let mut bytes = frame(&header);
    for record in checkpoint {
        bytes.extend_from_slice(&frame(record));
    }
    let capacity = segment_bytes.max(2 * bytes.len() as u64);
    let segment = create_segment(&segment_path(dir, generation), capacity)?;
    Ok((segment, bytes))
}

/// A segment's records without the checkpoint header, if its checkpoint is intact: every record
/// the header counts is there (or the segment predates headers and starts with any record).
fn intact_records(mut records: Vec<Vec<u8>>) -> Option<Vec<Vec<u8>>> {
    let first = records.first()?;
    let Some(count) = first.strip_prefix(CHECKPOINT_MAGIC) else { return Some(records) };
    let count = u64::from_le_bytes(count.try_into().ok()?);
    let count = usize::try_from(count).ok()?;
    if count == 0 || records.len() - 1 < count {
        return None;
    }
    records.remove(0);
    Some(records)
}

fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Syncs the directory holding `path`, so that a newly created `path` survives a power cut.
pub(crate) fn sync_parent_dir(path: &Path) -> io::Result<()> {
    match path.parent().filter(|parent| !parent.as_os_str().is_empty()) {
        Some(parent) => sync_dir(parent),
        None => Ok(()),
    }
}

impl Wal {
    /// Opens the log in `dir` (creating it) and returns it with the intact records of its
    /// newest segment, the checkpoint first; none for a new log.
    ///
    /// Nothing is written until [`Wal::start`] is given a checkpoint of the recovered state.
    ///
    /// # Errors
    /// When the directory cannot be read, or holds segments of which none is intact.
    pub fn open(dir: &Path, segment_bytes: u64) -> io::Result<(Recovered, Vec<Vec<u8>>)> {
        std::fs::create_dir_all(dir)?;
        // A new directory is durable only once its parent is synced: a power cut must not take
        // away a log (its vote, its acknowledged entries) whose files were all synced.
        sync_parent_dir(dir)?;
        let generations = list_segments(dir)?;
        let recovered = |generations| Recovered { dir: dir.to_owned(), segment_bytes, generations };
        for &generation in generations.iter().rev() {
            let records = match read_segment(&segment_path(dir, generation)) {
                Ok(records) => records,
                // Deleted since it was listed: only a replaced segment is ever deleted.
                Err(error) if error.kind() == io::ErrorKind::NotFound => continue,
                Err(error) => return Err(error),
            };
            if let Some(records) = intact_records(records) {
                return Ok((recovered(generations), records));
            }
            tracing::warn!(generation, "skipping a WAL segment whose checkpoint is not intact");
        }
        // Only the segment a first start was creating can lack its checkpoint: anything later
        // is created while an intact one is kept.
        if generations.iter().any(|&generation| generation > 1) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("no intact segment in the raft log at {}", dir.display()),
            ));
        }
        Ok((recovered(generations), Vec::new()))
    }

    /// Whether a writer may sync its own lone record on a quiet log (on by default): off while
    /// this node leads followers, whom its core must be free to send entries to during its
    /// sync.
    pub fn allow_inline_sync(&self, allowed: bool) {
        self.shared.inline_allowed.store(allowed, Ordering::Relaxed);
    }

    /// Whether a record of `payload_len` bytes fits in the current segment.
    #[must_use]
    pub fn fits(&self, payload_len: usize) -> bool {
        self.offset + (FRAME_HEADER_BYTES + payload_len) as u64 <= self.segment.capacity
    }

    /// Whether records of these sizes all fit in the current segment.
    #[must_use]
    pub fn fits_all(&self, payloads: &[Vec<u8>]) -> bool {
        let bytes: usize = payloads.iter().map(|payload| FRAME_HEADER_BYTES + payload.len()).sum();
        self.offset + bytes as u64 <= self.segment.capacity
    }

    /// Queues `payload`; with a `completion`, a sync is due (when, `urgency` says) and the
    /// completion fires after it.
    ///
    /// # Errors
    /// When an earlier write or sync failed; then nothing is written any more.
    pub fn append(
        &mut self,
        payload: &[u8],
        completion: Option<Completion>,
        urgency: Urgency,
    ) -> io::Result<()> {
        assert!(self.fits(payload.len()), "the caller starts a new segment when one is full");
        let bytes = frame(payload);
        let offset = self.offset;
        self.offset += bytes.len() as u64;
        let urgency = if completion.is_some() { Some(urgency) } else { None };
        self.enqueue(offset, bytes, completion, None, urgency)
    }

    /// Starts the next segment with the `checkpoint` records first; the older segment is
    /// deleted once the checkpoint is durable, and `completion` fires then.
    ///
    /// # Errors
    /// When the segment cannot be created, or an earlier write failed.
    pub fn rotate(
        &mut self,
        checkpoint: &[Vec<u8>],
        completion: Option<Completion>,
    ) -> io::Result<()> {
        let old = self.segment.path.clone();
        self.generation += 1;
        let (segment, bytes) = create_checkpointed_segment(
            &self.dir,
            self.generation,
            self.segment_bytes,
            checkpoint,
        )?;
        self.segment = Arc::new(segment);
        self.offset = bytes.len() as u64;
        self.enqueue(0, bytes, completion, Some(vec![old]), Some(Urgency::Now))
    }

    /// Queues a batch; `sync` is when it must be synced (`None`: whenever the next sync is).
    fn enqueue(
        &self,
        offset: u64,
        bytes: Vec<u8>,
        completion: Option<Completion>,
        replaces: Option<Vec<PathBuf>>,
        sync: Option<Urgency>,
    ) -> io::Result<()> {
        let mut queue = self.shared.queue();
        if let Some(failed) = &queue.failed {
            return Err(io::Error::other(format!("the raft log failed earlier: {failed}")));
        }
        let urgent = matches!(sync, Some(Urgency::Now | Urgency::Alone));
        if sync == Some(Urgency::Now) && completion.is_some() {
            queue.quiet = false;
        }
        // The first deferred record queued wakes the flusher too, so it starts its bounded wait,
        // unless the flusher already waits with a timeout (it then looks again within the
        // bound) or a sync is being written (its end wakes the flusher for what is queued).
        let first_deferred =
            sync == Some(Urgency::Soon) && !queue.urgent && queue.deferred_since.is_none();
        if first_deferred {
            queue.deferred_since = Some(Instant::now());
        }
        queue.deferred_seen |= sync == Some(Urgency::Soon);
        let replaces_none = replaces.is_none();
        let awaited = usize::from(completion.is_some() && sync != Some(Urgency::Soon));
        let continues = queue.batches.back().is_some_and(|last| {
            Arc::ptr_eq(&last.segment, &self.segment)
                && last.offset + last.bytes.len() as u64 == offset
                && replaces.is_none()
        });
        if continues {
            let last = queue.batches.back_mut().expect("checked above");
            last.bytes.extend_from_slice(&bytes);
            last.completions.extend(completion);
            last.awaited += awaited;
        } else {
            queue.batches.push_back(Batch {
                segment: self.segment.clone(),
                offset,
                bytes,
                completions: completion.into_iter().collect(),
                awaited,
                replaces,
            });
        }
        // Nobody else waits for a sync (what is queued rides along with the next one, deferred
        // records included): on a quiet log this writer syncs it all now, itself. Under
        // contention each handoff's release finds the next waiter's deferred acquire queued;
        // taking it along saves the release two thread hand-offs (writer to flusher and back).
        let inline = sync == Some(Urgency::Alone)
            && self.shared.inline_allowed.load(Ordering::Relaxed)
            && replaces_none
            && queue.quiet
            && !queue.flushing
            && !queue.closed
            && !queue.urgent;
        if inline {
            queue.flushing = true;
            // The deferred records are taken too: the flusher, if it waits for their bound,
            // finds nothing due when it wakes.
            queue.deferred_since = None;
            let batches = std::mem::take(&mut queue.batches);
            drop(queue);
            self.shared.flush_taken(batches);
            return Ok(());
        }
        let wake = !queue.flushing
            && ((urgent && !queue.urgent) || (first_deferred && queue.flusher_until.is_none()));
        queue.urgent |= urgent;
        #[cfg(test)]
        {
            queue.wakes += u64::from(wake);
        }
        drop(queue);
        // Woken after the lock is released, so the flusher does not wake only to wait for it.
        if wake {
            self.shared.wake.notify_one();
        }
        Ok(())
    }
}

impl Drop for Wal {
    fn drop(&mut self) {
        self.shared.queue().closed = true;
        self.shared.wake.notify_one();
        if let Some(flusher) = self.flusher.take() {
            // The flusher writes what is queued (at most one sync) and returns; a panic in it
            // was already reported by the panic hook.
            let _ = flusher.join();
        }
    }
}

/// A log read back by [`Wal::open`], not yet writable.
pub struct Recovered {
    dir: PathBuf,
    segment_bytes: u64,
    /// Every segment found, oldest first: all replaced by the one [`Recovered::start`] writes.
    generations: Vec<u64>,
}

impl Recovered {
    /// Writes `checkpoint` (the state rebuilt from the records, in as many records as it takes)
    /// at the start of a new segment, makes it durable, deletes the older segments and starts
    /// the flusher thread.
    ///
    /// # Errors
    /// When the segment cannot be written or synced.
    pub fn start(self, checkpoint: &[Vec<u8>], stats: Arc<WriterStats>) -> io::Result<Wal> {
        let faults = TestFaults::from_env(&self.dir)?;
        self.start_with(checkpoint, stats, faults)
    }

    /// [`Recovered::start`] with the storage faults `faults`.
    fn start_with(
        self,
        checkpoint: &[Vec<u8>],
        stats: Arc<WriterStats>,
        faults: TestFaults,
    ) -> io::Result<Wal> {
        let generation = self.generations.last().map_or(1, |last| last + 1);
        let (segment, bytes) =
            create_checkpointed_segment(&self.dir, generation, self.segment_bytes, checkpoint)?;
        segment.file.write_all_at(&bytes, 0)?;
        segment.file.sync_data()?;
        sync_dir(&self.dir)?;
        faults.note_synced(&segment.path, bytes.len() as u64)?;
        for old in self.generations {
            match std::fs::remove_file(segment_path(&self.dir, old)) {
                Ok(()) => {}
                Err(error) if error.kind() == io::ErrorKind::NotFound => {}
                Err(error) => return Err(error),
            }
        }
        let queue = Mutex::new(Queue { quiet: true, ..Queue::default() });
        let inline_allowed = AtomicBool::new(true);
        let shared =
            Arc::new(Shared { queue, wake: Condvar::new(), stats, faults, inline_allowed });
        let flusher_shared = shared.clone();
        let flusher = std::thread::Builder::new()
            .name("picket-log-flusher".into())
            .spawn(move || run_flusher(&flusher_shared))?;
        Ok(Wal {
            dir: self.dir,
            segment_bytes: self.segment_bytes,
            generation,
            segment: Arc::new(segment),
            offset: bytes.len() as u64,
            shared,
            flusher: Some(flusher),
        })
    }
}

/// Writes and syncs queued batches until the log is closed or a write fails.
fn run_flusher(shared: &Shared) {
    loop {
        let batches = {
            let mut queue = wait_for_work(shared);
            if queue.closed && queue.batches.is_empty() {
                return;
            }
            queue.urgent = false;
            queue.deferred_since = None;
            queue.flushing = true;
            std::mem::take(&mut queue.batches)
        };
        if !shared.flush_taken(batches) {
            return;
        }
    }
}

/// Waits until a sync is due: an urgent record, a deferred one that has waited
/// [`MAX_SYNC_DEFER`], or the log closing.
///
/// While deferred records keep coming (a contended lock queues one acquire per handoff, and the
/// release's writer usually syncs it itself), the flusher looks at the queue once per bound
/// instead of being woken for each of them and then again by its timer (about one thread
/// wake-up per handoff, two when handoffs are more than a bound apart). That holds while a
/// writer syncs its own record too. It waits without a timeout once a whole bound passed with
/// no deferred record.
fn wait_for_work(shared: &Shared) -> MutexGuard<'_, Queue> {
    let mut queue = shared.queue();
    loop {
        queue.flusher_until = None;
        let now = Instant::now();
        let max_defer = queue.max_defer.unwrap_or(MAX_SYNC_DEFER);
        if queue.flushing {
            // A writer syncs its own batch; its end wakes the flusher if a sync is due or a
            // deferred record waits (`Shared::flush_taken`).
            // While deferred records come, the flusher still waits timed here, so that the
            // first one appended after the writer is done need not wake it either (found in
            // review: a timer that fired during a writer's sync left the flusher waiting
            // untimed, to be woken by the next queued acquire).
            // Not consumed here: a sync longer than a bound keeps the flusher timed throughout;
            // the idle branch below clears it once a whole bound passed without one.
            if queue.deferred_seen {
                queue = wait_until(shared, queue, now + max_defer);
            } else {
                queue = shared.wake.wait(queue).unwrap_or_else(std::sync::PoisonError::into_inner);
            }
            continue;
        }
        if queue.urgent || queue.closed {
            return queue;
        }
        let until = match queue.deferred_since {
            Some(since) if now >= since + max_defer => return queue,
            Some(since) => since + max_defer,
            // Deferred records came since the last look: more are likely, so look again within
            // a bound rather than be woken for the next one.
            None if queue.deferred_seen => {
                queue.deferred_seen = false;
                now + max_defer
            }
            None => {
                queue = shared.wake.wait(queue).unwrap_or_else(std::sync::PoisonError::into_inner);
                continue;
            }
        };
        queue = wait_until(shared, queue, until);
    }
}

/// The flusher's timed wait: until `until` or a wake, whichever comes first.
fn wait_until<'a>(
    shared: &'a Shared,
    mut queue: MutexGuard<'a, Queue>,
    until: Instant,
) -> MutexGuard<'a, Queue> {
    queue.flusher_until = Some(until);
    let timeout = until.saturating_duration_since(Instant::now());
    shared.wake.wait_timeout(queue, timeout).unwrap_or_else(std::sync::PoisonError::into_inner).0
}

/// Writes `batches` in order, syncing each segment once after its last batch, and fires each
/// batch's completions once its segment is synced. On an error, every completion not yet fired
/// gets it.
fn flush(batches: VecDeque<Batch>, shared: &Shared) -> io::Result<()> {
    let (stats, faults) = (&shared.stats, &shared.faults);
    let mut batches: Vec<Batch> = batches.into();
    let mut start = 0;
    while start < batches.len() {
        let segment = batches[start].segment.clone();
        let end = batches[start..]
            .iter()
            .position(|batch| !Arc::ptr_eq(&batch.segment, &segment))
            .map_or(batches.len(), |position| start + position);
        let started = Instant::now();
        let result = if faults.acknowledge_before_sync {
            acknowledge_then_sync(&segment, &mut batches[start..end], faults)
        } else {
            write_and_sync(&segment, &batches[start..end], faults).map(|()| true)
        }
        .and_then(|synced| {
            let last = &batches[end - 1];
            let end = last.offset + last.bytes.len() as u64;
            if synced { faults.note_synced(&segment.path, end) } else { Ok(()) }
        });
        stats.sync_seconds.observe(started.elapsed().as_secs_f64());
        stats.bytes.inc_by(batches[start..end].iter().map(|batch| batch.bytes.len() as u64).sum());
        if let Err(error) = result {
            let message = error.to_string();
            for completion in batches.drain(start..).flat_map(|batch| batch.completions) {
                completion(Err(io::Error::other(message.clone())));
            }
            return Err(error);
        }
        for batch in &mut batches[start..end] {
            // Replaced segments go before the completions fire, so that a completed rotation has
            // left one segment behind. One that outlives its replacement (a failed delete) is
            // skipped on recovery as an older generation; deleting it only frees the space.
            for old in batch.replaces.take().into_iter().flatten() {
                if let Err(error) = std::fs::remove_file(&old) {
                    tracing::warn!(%error, path = %old.display(), "cannot delete an old WAL segment");
                }
            }
            for completion in batch.completions.drain(..) {
                completion(Ok(()));
            }
        }
        start = end;
    }
    Ok(())
}

fn write_and_sync(segment: &Segment, batches: &[Batch], faults: &TestFaults) -> io::Result<()> {
    for batch in batches {
        segment.file.write_all_at(&batch.bytes, batch.offset)?;
    }
    faults.before_sync()?;
    segment.file.sync_data()?;
    if batches.iter().any(|batch| batch.replaces.is_some()) {
        sync_dir(segment.path.parent().expect("a segment lives in a directory"))?;
    }
    Ok(())
}

/// The `wal_acknowledges_before_sync` mutation (tests only, see `test_faults`): what a log
/// that acknowledges on write and syncs once a second (Redis's `appendfsync everysec`) does.
/// A new segment is still synced at once, before its predecessor goes. Returns whether it
/// synced.
fn acknowledge_then_sync(
    segment: &Segment,
    batches: &mut [Batch],
    faults: &TestFaults,
) -> io::Result<bool> {
    for batch in batches.iter() {
        segment.file.write_all_at(&batch.bytes, batch.offset)?;
    }
    for completion in batches.iter_mut().flat_map(|batch| batch.completions.drain(..)) {
        completion(Ok(()));
    }
    let rotates = batches.iter().any(|batch| batch.replaces.is_some());
    if !rotates && !faults.sync_is_due() {
        return Ok(false);
    }
    write_and_sync(segment, batches, faults).map(|()| true)
}

#[cfg(test)]
mod tests;
