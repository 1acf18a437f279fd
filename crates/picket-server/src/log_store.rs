//! The Raft log and vote, in an append-only write-ahead log (`raft-log`), with group commit.
//!
//! ```text
//!  openraft ── append / save_vote / truncate / purge ──► in-memory view (updated at once)
//!                                 │
//!                                 ▼ in order, under one lock
//!                      raft-log: records appended to the open chunk file;
//!                      its flush worker writes everything queued with one
//!                      vectored write and ONE fdatasync, then fires the callbacks
//! ```
//!
//! Every change is visible to readers as soon as openraft makes it (Raft allows a leader to
//! replicate entries it has not flushed yet), but an append is reported flushed only after the
//! fdatasync that covers it. Votes, appends, truncations and purges go through one lock into one
//! file, so they reach the disk in the order openraft issued them. Under load, appends queued
//! while a sync runs share the next one.
//!
//! An append-only file with `fdatasync` costs about half of a B-tree commit here (≈110 µs against
//! ≈240 µs for redb on this machine; BENCHMARKS.md), and it is paid once per batch on the path of
//! every write.

use crate::raft_types::{Entry, LogId, TypeConfig, Vote};
use openraft::storage::{IOFlushed, LogState, RaftLogStorage};
use openraft::{OptionalSend, RaftLogReader};
use raft_log::api::raft_log_writer::RaftLogWriter;
use raft_log::codeq::{Decode, Encode};
use raft_log::{Callback, RaftLog};
use std::collections::BTreeMap;
use std::fmt::Debug;
use std::io;
use std::ops::RangeBounds;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use tokio::sync::oneshot;

/// The directory, inside the data directory, that holds the log's chunk files.
pub const LOG_DIR: &str = "raft-log";
/// The file of the log format before this one; a data directory holding it is refused.
const OLD_LOG_FILE: &str = "raft.redb";

fn encode_json<T: serde::Serialize>(value: &T) -> Vec<u8> {
    serde_json::to_vec(value).expect("raft types always serialize")
}

fn decode_json<T: serde::de::DeserializeOwned>(bytes: &[u8], what: &str) -> io::Result<T> {
    serde_json::from_slice(bytes).map_err(|error| {
        io::Error::new(io::ErrorKind::InvalidData, format!("{what} is damaged: {error}"))
    })
}

/// An openraft log id as the WAL stores it: ordered as openraft orders it, encoded as JSON.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct WalLogId(LogId);

impl Encode for WalLogId {
    fn encode<W: io::Write>(&self, w: W) -> io::Result<usize> {
        encode_json(&self.0).encode(w)
    }
}

impl Decode for WalLogId {
    fn decode<R: io::Read>(r: R) -> io::Result<Self> {
        decode_json(&Vec::<u8>::decode(r)?, "a log id").map(Self)
    }
}

/// An openraft vote as the WAL stores it. The WAL refuses a vote that goes backwards, so the
/// order must be openraft's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct WalVote(Vote);

impl PartialOrd for WalVote {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        self.0.partial_cmp(&other.0)
    }
}

impl Encode for WalVote {
    fn encode<W: io::Write>(&self, w: W) -> io::Result<usize> {
        encode_json(&self.0).encode(w)
    }
}

impl Decode for WalVote {
    fn decode<R: io::Read>(r: R) -> io::Result<Self> {
        decode_json(&Vec::<u8>::decode(r)?, "the vote").map(Self)
    }
}

/// What to do once a flush is durable.
pub(crate) enum Completion {
    /// Tell openraft its append is flushed.
    Appended(IOFlushed<TypeConfig>),
    /// Wake a caller waiting for a vote, truncation or purge.
    Done(oneshot::Sender<io::Result<()>>),
}

impl Completion {
    fn complete(self, result: Result<(), &str>) {
        let result = result.map_err(io::Error::other);
        match self {
            Self::Appended(flushed) => flushed.io_completed(result),
            // The waiting side may have given up; nothing to tell then.
            Self::Done(done) => {
                let _ = done.send(result);
            }
        }
    }
}

/// The completions of one flush, fired together once it is durable, and the flusher's signal
/// that the next flush may start.
pub(crate) struct WalCallback {
    completions: Vec<Completion>,
    flushed: std::sync::mpsc::Sender<Result<(), String>>,
}

impl Callback for WalCallback {
    fn send(self, result: Result<(), io::Error>) {
        let result = result.map_err(|error| error.to_string());
        for completion in self.completions {
            completion.complete(result.as_ref().copied().map_err(String::as_str));
        }
        let _ = self.flushed.send(result);
    }
}

/// The WAL's types for Picket's log: payloads are serialized entries.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct WalTypes;

impl raft_log::Types for WalTypes {
    type LogId = WalLogId;
    type LogPayload = Vec<u8>;
    type Vote = WalVote;
    type Callback = WalCallback;
    type UserData = Vec<u8>;

    fn log_index(log_id: &Self::LogId) -> u64 {
        log_id.0.index()
    }

    fn payload_size(payload: &Self::LogPayload) -> u64 {
        payload.len() as u64
    }
}

/// The log store. Cloning it gives another handle to the same log (that is how openraft gets a
/// reader).
#[derive(Clone)]
pub struct LogStore {
    inner: Arc<Inner>,
}

impl Debug for LogStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LogStore")
    }
}

struct Inner {
    view: Mutex<View>,
    wal: Mutex<Wal>,
    stats: Arc<WriterStats>,
}

/// The WAL and the one flush allowed in flight at a time.
///
/// With no flush in flight, a write is flushed at once: a lone write pays one fdatasync and no
/// extra hand-off. While a flush is in flight, writes go into the file but their completions
/// wait; when the flush finishes, the flusher thread flushes everything that waited with one
/// fdatasync (group commit).
struct Wal {
    log: RaftLog<WalTypes>,
    in_flight: bool,
    waiting: Vec<Completion>,
    flushed: std::sync::mpsc::Sender<Result<(), String>>,
    /// Set once a write or flush failed; every later write is refused.
    failed: Option<String>,
}

impl Wal {
    /// Records `completion` to fire once what was just written is durable.
    fn flush_or_wait(&mut self, completion: Completion, stats: &WriterStats) -> io::Result<()> {
        if self.in_flight {
            self.waiting.push(completion);
            return Ok(());
        }
        self.start_flush(vec![completion], stats)
    }

    fn start_flush(&mut self, completions: Vec<Completion>, stats: &WriterStats) -> io::Result<()> {
        self.in_flight = true;
        stats.commits.fetch_add(1, Ordering::Relaxed);
        let callback = WalCallback { completions, flushed: self.flushed.clone() };
        self.log.flush(true, Some(callback))
    }
}

/// Starts the next flush when one finishes, for the writes that waited during it.
fn run_flusher(
    inner: std::sync::Weak<Inner>,
    finished: &std::sync::mpsc::Receiver<Result<(), String>>,
) {
    while let Ok(result) = finished.recv() {
        let Some(inner) = inner.upgrade() else { return };
        let mut wal = inner.wal.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Err(message) = result {
            // A failed fdatasync leaves the disk in an unknown state; carrying on could
            // acknowledge entries that are not durable. Refuse everything from now on.
            tracing::error!(%message, "the raft log could not be flushed; refusing further writes");
            wal.failed = Some(message.clone());
            for completion in std::mem::take(&mut wal.waiting) {
                completion.complete(Err(&message));
            }
            return;
        }
        if wal.waiting.is_empty() {
            wal.in_flight = false;
            continue;
        }
        let waiting = std::mem::take(&mut wal.waiting);
        if let Err(error) = wal.start_flush(waiting, &inner.stats) {
            tracing::error!(%error, "the raft log could not be flushed; refusing further writes");
            wal.failed = Some(error.to_string());
            return;
        }
    }
}

/// What the log looks like to openraft, including changes not yet on disk.
#[derive(Default)]
struct View {
    entries: BTreeMap<u64, Entry>,
    vote: Option<Vote>,
    committed: Option<LogId>,
    last_purged: Option<LogId>,
}

/// Counters of the log, for benchmarks and tests.
#[derive(Debug, Default)]
pub struct WriterStats {
    /// Batches flushed (each is one fdatasync).
    pub commits: AtomicU64,
    /// Entries appended.
    pub entries: AtomicU64,
}

fn to_io(error: impl std::fmt::Display) -> io::Error {
    io::Error::other(error.to_string())
}

impl LogStore {
    /// Opens the log in the data directory `data_dir` (creating it) and loads it into memory.
    ///
    /// # Errors
    /// When the directory cannot be used, holds damaged records, or holds a log in the format of
    /// an earlier Picket.
    pub fn open(data_dir: &Path) -> io::Result<Self> {
        if data_dir.join(OLD_LOG_FILE).exists() && !data_dir.join(LOG_DIR).exists() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "{} holds a Raft log in the format of an earlier Picket ({OLD_LOG_FILE}); start this version on a new data directory",
                    data_dir.display()
                ),
            ));
        }
        let dir = data_dir.join(LOG_DIR);
        std::fs::create_dir_all(&dir)?;
        let mut config = raft_log::Config::new(dir.display().to_string());
        // Batching comes from the queue itself (appends that arrive while a sync runs share the
        // next one); waiting for more would only add latency to a lone write.
        config.wal.flush_batch_wait = Some(std::time::Duration::ZERO);
        let wal = RaftLog::<WalTypes>::open(Arc::new(config))?;
        let view = load(&wal)?;
        let (flushed, finished) = std::sync::mpsc::channel();
        let wal = Wal { log: wal, in_flight: false, waiting: Vec::new(), flushed, failed: None };
        let inner = Arc::new(Inner {
            view: Mutex::new(view),
            wal: Mutex::new(wal),
            stats: Arc::new(WriterStats::default()),
        });
        let weak = Arc::downgrade(&inner);
        std::thread::Builder::new()
            .name("picket-log-flusher".into())
            .spawn(move || run_flusher(weak, &finished))
            .map_err(to_io)?;
        Ok(Self { inner })
    }

    /// Counters of the log.
    #[must_use]
    pub fn stats(&self) -> Arc<WriterStats> {
        self.inner.stats.clone()
    }

    fn view(&self) -> MutexGuard<'_, View> {
        self.inner.view.lock().expect("log view lock poisoned")
    }

    fn wal(&self) -> MutexGuard<'_, Wal> {
        self.inner.wal.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Writes with `write` and arranges for `completion` once it is durable. Writes reach the
    /// file in the order they take the lock, which is the order openraft issues them.
    fn write(
        &self,
        write: impl FnOnce(&mut RaftLog<WalTypes>) -> io::Result<raft_log::Segment>,
        completion: Completion,
    ) -> io::Result<()> {
        let mut wal = self.wal();
        if let Some(failed) = &wal.failed {
            return Err(io::Error::other(format!("the raft log failed earlier: {failed}")));
        }
        write(&mut wal.log)?;
        wal.flush_or_wait(completion, &self.inner.stats)
    }

    async fn write_and_wait(
        &self,
        write: impl FnOnce(&mut RaftLog<WalTypes>) -> io::Result<raft_log::Segment>,
    ) -> io::Result<()> {
        let (done, flushed) = oneshot::channel();
        self.write(write, Completion::Done(done))?;
        flushed.await.map_err(|_| io::Error::other("the log's flusher stopped"))?
    }
}

fn load(wal: &RaftLog<WalTypes>) -> io::Result<View> {
    let state = wal.log_state();
    let mut view = View {
        vote: state.vote().map(|vote| vote.0),
        committed: state.committed().map(|log_id| log_id.0),
        last_purged: state.purged().map(|log_id| log_id.0),
        entries: BTreeMap::new(),
    };
    let from = view.last_purged.map_or(0, |log_id| log_id.index() + 1);
    let to = state.last().map_or(0, |log_id| log_id.0.index() + 1);
    for record in wal.read(from, to) {
        let (log_id, payload) = record?;
        let entry: Entry = decode_json(&payload, "a log entry")?;
        assert_eq!(entry.log_id, log_id.0, "a log entry is stored under its own log id");
        view.entries.insert(entry.log_id.index(), entry);
    }
    check_contiguous(&view)?;
    Ok(view)
}

/// Raft only ever looks at the last log id, so a hole in the log would go unnoticed and lose
/// entries. Refuse to start on one.
fn check_contiguous(view: &View) -> io::Result<()> {
    let mut expected = view.last_purged.map(|log_id| log_id.index() + 1);
    for index in view.entries.keys() {
        if let Some(expected) = expected
            && *index != expected
        {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("the raft log has a hole: expected index {expected}, found {index}"),
            ));
        }
        expected = Some(index + 1);
    }
    Ok(())
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> io::Result<Vec<Entry>> {
        Ok(self.view().entries.range(range).map(|(_, entry)| entry.clone()).collect())
    }

    async fn read_vote(&mut self) -> io::Result<Option<Vote>> {
        Ok(self.view().vote)
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> io::Result<LogState<TypeConfig>> {
        let view = self.view();
        let last = view.entries.values().next_back().map(|entry| entry.log_id);
        Ok(LogState {
            last_purged_log_id: view.last_purged,
            last_log_id: last.or(view.last_purged),
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote) -> io::Result<()> {
        self.view().vote = Some(*vote);
        let vote = WalVote(*vote);
        self.write_and_wait(|log| log.save_vote(vote)).await
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> io::Result<()> {
        // Persisting the committed id only lets a restarted node apply up to it before it hears
        // from a leader; losing the latest value in a crash is safe, so it is written without a
        // flush of its own and reaches the disk with the next one.
        self.view().committed = committed;
        if let Some(committed) = committed {
            self.wal().log.commit(WalLogId(committed))?;
        }
        Ok(())
    }

    async fn read_committed(&mut self) -> io::Result<Option<LogId>> {
        Ok(self.view().committed)
    }

    async fn append<I>(&mut self, entries: I, callback: IOFlushed<TypeConfig>) -> io::Result<()>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut records = Vec::new();
        {
            let mut view = self.view();
            for entry in entries {
                let index = entry.log_id.index();
                if let Some((last, _)) = view.entries.last_key_value() {
                    assert_eq!(index, last + 1, "appended entries continue the log without a hole");
                }
                records.push((WalLogId(entry.log_id), encode_json(&entry)));
                view.entries.insert(index, entry);
            }
        }
        self.inner.stats.entries.fetch_add(records.len() as u64, Ordering::Relaxed);
        self.write(|log| log.append(records), Completion::Appended(callback))
    }

    async fn truncate_after(&mut self, last_log_id: Option<LogId>) -> io::Result<()> {
        let start = last_log_id.map_or(0, |log_id| log_id.index() + 1);
        let removes_any = {
            let mut view = self.view();
            let removes_any = view.entries.range(start..).next().is_some();
            view.entries.retain(|index, _| *index < start);
            removes_any
        };
        // Truncating after the last entry removes nothing; the WAL requires the kept entry to
        // exist, which it need not here.
        if !removes_any {
            return Ok(());
        }
        self.write_and_wait(|log| log.truncate(start)).await
    }

    async fn purge(&mut self, log_id: LogId) -> io::Result<()> {
        let upto = log_id.index();
        {
            let mut view = self.view();
            assert!(
                view.last_purged.is_none_or(|purged| purged <= log_id),
                "purge never goes back"
            );
            view.last_purged = Some(log_id);
            view.entries.retain(|index, _| *index > upto);
        }
        self.write_and_wait(|log| log.purge(WalLogId(log_id))).await
    }
}
