//! The Raft log and vote, stored in redb, with group commit.
//!
//! ```text
//!  openraft ── append / save_vote / truncate / purge ──► in-memory view (updated at once)
//!                                 │
//!                                 ▼ one FIFO queue
//!                        writer thread: drain everything queued,
//!                        apply it in order in ONE redb transaction,
//!                        commit (fsync), then fire every callback
//! ```
//!
//! Every change is visible to readers as soon as openraft makes it (Raft allows a leader to
//! replicate entries it has not flushed yet), but it is acknowledged to openraft as flushed only
//! after the transaction holding it committed with fsync. Votes, appends, truncations and purges
//! share the one queue, so they reach the disk in the order openraft issued them. Under load many
//! appends share one fsync: the writer takes everything that queued up while the previous commit
//! was syncing.

use crate::raft_types::{Entry, LogId, TypeConfig, Vote};
use openraft::storage::{IOFlushed, LogState, RaftLogStorage};
use openraft::{OptionalSend, RaftLogReader};
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use std::collections::BTreeMap;
use std::fmt::Debug;
use std::io;
use std::ops::RangeBounds;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard, mpsc};
use tokio::sync::oneshot;

const LOG: TableDefinition<u64, &[u8]> = TableDefinition::new("raft_log");
const META: TableDefinition<&str, &[u8]> = TableDefinition::new("raft_meta");
const VOTE_KEY: &str = "vote";
const COMMITTED_KEY: &str = "committed";
const PURGED_KEY: &str = "last_purged";

/// Most operations one transaction takes, so one commit's work stays bounded.
const MAX_BATCH_OPS: usize = 4_096;

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
    writer: mpsc::SyncSender<WriteOp>,
    /// The newest committed log id not yet written; it rides along with the next batch.
    committed: Arc<Mutex<Option<Vec<u8>>>>,
    stats: Arc<WriterStats>,
}

/// What the log looks like to openraft, including changes not yet on disk.
#[derive(Default)]
struct View {
    entries: BTreeMap<u64, Entry>,
    vote: Option<Vote>,
    committed: Option<LogId>,
    last_purged: Option<LogId>,
}

/// How the writer has batched, for benchmarks and tests.
#[derive(Debug, Default)]
pub struct WriterStats {
    /// Transactions committed with fsync.
    pub commits: std::sync::atomic::AtomicU64,
    /// Entries appended.
    pub entries: std::sync::atomic::AtomicU64,
}

enum WriteOp {
    Append { entries: Vec<(u64, Vec<u8>)>, done: IOFlushed<TypeConfig> },
    Vote { bytes: Vec<u8>, done: oneshot::Sender<io::Result<()>> },
    TruncateAfter { index: Option<u64>, done: oneshot::Sender<io::Result<()>> },
    Purge { upto: u64, bytes: Vec<u8>, done: oneshot::Sender<io::Result<()>> },
}

fn to_io(error: impl std::fmt::Display) -> io::Error {
    io::Error::other(error.to_string())
}

fn encode<T: serde::Serialize>(value: &T) -> Vec<u8> {
    serde_json::to_vec(value).expect("raft types always serialize")
}

fn decode<T: serde::de::DeserializeOwned>(bytes: &[u8], what: &str) -> io::Result<T> {
    serde_json::from_slice(bytes).map_err(|error| {
        io::Error::new(io::ErrorKind::InvalidData, format!("{what} is damaged: {error}"))
    })
}

impl LogStore {
    /// Opens the log in `path` (creating it), loads it into memory and starts the writer thread.
    ///
    /// # Errors
    /// When the file cannot be opened or holds damaged records.
    pub fn open(path: &Path) -> io::Result<Self> {
        let db = Database::create(path).map_err(to_io)?;
        let view = load(&db)?;
        // The queue is bounded so a stalled disk pushes back on openraft instead of growing
        // memory without limit.
        let (writer, queue) = mpsc::sync_channel(MAX_BATCH_OPS);
        let stats = Arc::new(WriterStats::default());
        let committed = Arc::new(Mutex::new(None));
        let (thread_stats, thread_committed) = (stats.clone(), committed.clone());
        std::thread::Builder::new()
            .name("picket-log-writer".into())
            .spawn(move || run_writer(&db, &queue, &thread_committed, &thread_stats))
            .map_err(to_io)?;
        Ok(Self { inner: Arc::new(Inner { view: Mutex::new(view), writer, committed, stats }) })
    }

    /// Batching counters of the writer thread.
    #[must_use]
    pub fn stats(&self) -> Arc<WriterStats> {
        self.inner.stats.clone()
    }

    fn view(&self) -> MutexGuard<'_, View> {
        self.inner.view.lock().expect("log view lock poisoned")
    }

    fn send(&self, op: WriteOp) -> io::Result<()> {
        self.inner.writer.send(op).map_err(|_| io::Error::other("the log writer thread stopped"))
    }

    async fn send_and_wait(
        &self,
        op: impl FnOnce(oneshot::Sender<io::Result<()>>) -> WriteOp,
    ) -> io::Result<()> {
        let (done, flushed) = oneshot::channel();
        self.send(op(done))?;
        flushed.await.map_err(|_| io::Error::other("the log writer thread stopped"))?
    }
}

fn load(db: &Database) -> io::Result<View> {
    let txn = db.begin_write().map_err(to_io)?;
    txn.open_table(LOG).map_err(to_io)?;
    txn.open_table(META).map_err(to_io)?;
    txn.commit().map_err(to_io)?;
    let txn = db.begin_read().map_err(to_io)?;
    let meta = txn.open_table(META).map_err(to_io)?;
    let read_meta = |key: &str| -> io::Result<Option<Vec<u8>>> {
        Ok(meta.get(key).map_err(to_io)?.map(|value| value.value().to_vec()))
    };
    let mut view = View {
        vote: read_meta(VOTE_KEY)?.map(|bytes| decode(&bytes, "the stored vote")).transpose()?,
        committed: read_meta(COMMITTED_KEY)?
            .map(|bytes| decode(&bytes, "the committed log id"))
            .transpose()?,
        last_purged: read_meta(PURGED_KEY)?
            .map(|bytes| decode(&bytes, "the purged log id"))
            .transpose()?,
        entries: BTreeMap::new(),
    };
    let log = txn.open_table(LOG).map_err(to_io)?;
    for row in log.iter().map_err(to_io)? {
        let (index, bytes) = row.map_err(to_io)?;
        let entry: Entry = decode(bytes.value(), "a log entry")?;
        assert_eq!(
            entry.log_id.index(),
            index.value(),
            "a log entry is stored under its own index"
        );
        view.entries.insert(index.value(), entry);
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

fn run_writer(
    db: &Database,
    queue: &mpsc::Receiver<WriteOp>,
    committed: &Mutex<Option<Vec<u8>>>,
    stats: &WriterStats,
) {
    while let Ok(first) = queue.recv() {
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH_OPS {
            match queue.try_recv() {
                Ok(op) => batch.push(op),
                Err(_) => break,
            }
        }
        let committed = committed.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take();
        let result = write_batch(db, &batch, committed.as_deref());
        if result.is_ok() {
            stats.commits.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        for op in batch {
            let outcome =
                result.as_ref().map(|_| ()).map_err(|message| io::Error::other(message.clone()));
            match op {
                WriteOp::Append { entries, done } => {
                    stats
                        .entries
                        .fetch_add(entries.len() as u64, std::sync::atomic::Ordering::Relaxed);
                    done.io_completed(outcome);
                }
                WriteOp::Vote { done, .. }
                | WriteOp::TruncateAfter { done, .. }
                | WriteOp::Purge { done, .. } => {
                    // The waiting side may have given up; nothing to tell then.
                    let _ = done.send(outcome);
                }
            }
        }
        if let Err(message) = result {
            // A failed fsync leaves the disk in an unknown state; carrying on could acknowledge
            // entries that are not durable. Stop the node loudly instead.
            tracing::error!(%message, "the raft log could not be written; stopping the writer");
            return;
        }
    }
}

fn write_batch(db: &Database, batch: &[WriteOp], committed: Option<&[u8]>) -> Result<(), String> {
    let txn = db.begin_write().map_err(|error| error.to_string())?;
    {
        let mut log = txn.open_table(LOG).map_err(|error| error.to_string())?;
        let mut meta = txn.open_table(META).map_err(|error| error.to_string())?;
        if let Some(committed) = committed {
            meta.insert(COMMITTED_KEY, committed).map_err(|error| error.to_string())?;
        }
        for op in batch {
            match op {
                WriteOp::Append { entries, .. } => {
                    for (index, bytes) in entries {
                        log.insert(*index, bytes.as_slice()).map_err(|error| error.to_string())?;
                    }
                }
                WriteOp::Vote { bytes, .. } => {
                    meta.insert(VOTE_KEY, bytes.as_slice()).map_err(|error| error.to_string())?;
                }
                WriteOp::TruncateAfter { index, .. } => {
                    let start = index.map_or(0, |index| index + 1);
                    log.retain_in(start.., |_, _| false).map_err(|error| error.to_string())?;
                }
                WriteOp::Purge { upto, bytes, .. } => {
                    meta.insert(PURGED_KEY, bytes.as_slice()).map_err(|error| error.to_string())?;
                    log.retain_in(..=*upto, |_, _| false).map_err(|error| error.to_string())?;
                }
            }
        }
    }
    txn.commit().map_err(|error| error.to_string())
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
        let bytes = encode(vote);
        self.send_and_wait(|done| WriteOp::Vote { bytes, done }).await
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> io::Result<()> {
        // Persisting the committed id only lets a restarted node apply up to it before it hears
        // from a leader; losing the latest value in a crash is safe, so it rides along with the
        // next batch the writer commits instead of paying for a commit and an fsync of its own.
        self.view().committed = committed;
        if let Some(committed) = committed {
            *self.inner.committed.lock().unwrap_or_else(std::sync::PoisonError::into_inner) =
                Some(encode(&committed));
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
        let mut encoded = Vec::new();
        {
            let mut view = self.view();
            for entry in entries {
                let index = entry.log_id.index();
                if let Some((last, _)) = view.entries.last_key_value() {
                    assert_eq!(index, last + 1, "appended entries continue the log without a hole");
                }
                encoded.push((index, encode(&entry)));
                view.entries.insert(index, entry);
            }
        }
        self.send(WriteOp::Append { entries: encoded, done: callback })
    }

    async fn truncate_after(&mut self, last_log_id: Option<LogId>) -> io::Result<()> {
        let index = last_log_id.map(|log_id| log_id.index());
        {
            let mut view = self.view();
            let start = index.map_or(0, |index| index + 1);
            view.entries.retain(|entry_index, _| *entry_index < start);
        }
        self.send_and_wait(|done| WriteOp::TruncateAfter { index, done }).await
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
        let bytes = encode(&log_id);
        self.send_and_wait(|done| WriteOp::Purge { upto, bytes, done }).await
    }
}
