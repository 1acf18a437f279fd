//! The Raft log and vote, kept in memory and made durable in Picket's write-ahead log
//! ([`crate::wal`]), with group commit.
//!
//! ```text
//!  openraft ── append / save_vote / truncate / purge ──► in-memory view (updated at once)
//!                                 │ under one lock, in order
//!                                 ▼
//!                      a record per change, queued to the WAL; its flusher
//!                      writes everything queued and syncs ONCE, then fires
//!                      the callbacks
//! ```
//!
//! Every change is visible to readers as soon as openraft makes it (Raft allows a leader to
//! replicate entries it has not flushed yet), but an append is reported flushed only after the
//! sync that covers it. Changes are recorded under one lock in the order openraft issues them,
//! so the disk sees them in that order. Under load, appends queued while a sync runs share the
//! next one. Each WAL segment starts with a checkpoint of the whole view (the live entries, the
//! vote, the committed and purged ids), which bounds recovery to one segment. Entries are
//! written in records of at most about 8 MiB (a checkpoint or a large append takes several), so
//! no record nears the WAL's limit however long the live log grows.

use crate::raft_types::{Entry, LogId, TypeConfig, Vote};
use crate::state_machine::OnlyQueueWaiters;
use crate::wal::{Completion, Urgency, Wal};
use openraft::storage::{IOFlushed, LogState, RaftLogStorage};
use openraft::{OptionalSend, RaftLogReader};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt::Debug;
use std::io;
use std::ops::RangeBounds;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use tokio::sync::oneshot;

pub use crate::wal::WriterStats;

/// The directory, inside the data directory, that holds the log's segments.
pub const LOG_DIR: &str = "wal";
/// Where earlier Picket versions kept the log; a data directory holding one is refused.
const OLD_LOG_PATHS: [&str; 2] = ["raft.redb", "raft-log"];

fn encode_json<T: Serialize>(value: &T) -> Vec<u8> {
    serde_json::to_vec(value).expect("raft types always serialize")
}

fn decode_json<T: serde::de::DeserializeOwned>(bytes: &[u8], what: &str) -> io::Result<T> {
    serde_json::from_slice(bytes).map_err(|error| {
        io::Error::new(io::ErrorKind::InvalidData, format!("{what} is damaged: {error}"))
    })
}

/// A change to the log as it is written: borrowed, so nothing is cloned to write it.
#[derive(Serialize)]
enum RecordOut<'a> {
    Checkpoint {
        vote: Option<&'a Vote>,
        committed: Option<&'a LogId>,
        last_purged: Option<&'a LogId>,
        entries: Vec<&'a Entry>,
    },
    Append(&'a [Entry]),
    /// The same record as `Append`, from references.
    #[serde(rename = "Append")]
    AppendRefs(&'a [&'a Entry]),
    Vote(&'a Vote),
    Committed(&'a LogId),
    TruncateFrom(u64),
    Purge(&'a LogId),
}

/// A change to the log as it is read back; the same encoding as [`RecordOut`].
#[derive(Deserialize)]
enum Record {
    Checkpoint {
        vote: Option<Vote>,
        committed: Option<LogId>,
        last_purged: Option<LogId>,
        entries: Vec<Entry>,
    },
    Append(Vec<Entry>),
    Vote(Vote),
    Committed(LogId),
    TruncateFrom(u64),
    Purge(LogId),
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

/// Lock order: `wal`, then `view`. Readers take only `view`.
struct Inner {
    view: Mutex<View>,
    wal: Mutex<Wal>,
    stats: Arc<WriterStats>,
    defer_sync: Option<OnlyQueueWaiters>,
    /// Whether `defer_sync` is asked at all: only on a leader (see [`LogStore::follow_role`]).
    deferred_sync_allowed: AtomicBool,
}

/// What the log looks like to openraft, including changes not yet on disk.
#[derive(Default)]
struct View {
    entries: BTreeMap<u64, Entry>,
    vote: Option<Vote>,
    committed: Option<LogId>,
    last_purged: Option<LogId>,
}

/// The size a record of entries is cut at: a checkpoint of the whole live log or a large append
/// becomes several records of about this size, so no record nears the WAL's limit however
/// large the log grows (one entry alone is far smaller: see [`MAX_ENTRY_BYTES`]).
const RECORD_CHUNK_BYTES: usize = 8 << 20;
/// The largest encoded log entry. Commands are bounded far below it by the state machine's
/// limits, whose own caps (`MAX_NAME_BYTES_CAP`, `MAX_RENEWALS_PER_TICK_CAP`) keep the largest
/// command, a tick renewing a million sessions, near 22 MiB (tested below); names are checked
/// before a command is proposed, and a tick never carries more than the limit.
pub const MAX_ENTRY_BYTES: usize = 64 << 20;
const _: () = assert!(MAX_ENTRY_BYTES + RECORD_CHUNK_BYTES < crate::wal::MAX_RECORD_BYTES);

/// `entries` cut into runs whose encoding is about [`RECORD_CHUNK_BYTES`] at most (a run is never
/// empty, and holds one entry if that entry alone is larger).
fn chunks<'a>(entries: &[&'a Entry]) -> Vec<Vec<&'a Entry>> {
    let mut runs: Vec<Vec<&Entry>> = Vec::new();
    let mut run_bytes = 0;
    for entry in entries {
        let entry_bytes = encode_json(entry).len();
        // Commands are bounded by the limits and membership entries by the node's member
        // bounds; an entry above the bound is a bug, and it is still written (as a record of
        // its own, below the WAL's limit) rather than crash the node.
        if entry_bytes > MAX_ENTRY_BYTES {
            tracing::error!(entry_bytes, "a log entry over the bound of {MAX_ENTRY_BYTES} bytes");
        }
        match runs.last_mut() {
            Some(run) if run_bytes + entry_bytes <= RECORD_CHUNK_BYTES => {
                run.push(*entry);
                run_bytes += entry_bytes;
            }
            _ => {
                runs.push(vec![*entry]);
                run_bytes = entry_bytes;
            }
        }
    }
    runs
}

/// The records appending `entries` writes: one, unless it is large.
fn append_records(entries: &[Entry]) -> Vec<Vec<u8>> {
    let whole = encode_json(&RecordOut::Append(entries));
    if whole.len() <= RECORD_CHUNK_BYTES {
        return vec![whole];
    }
    let entries: Vec<&Entry> = entries.iter().collect();
    chunks(&entries).iter().map(|run| encode_json(&RecordOut::AppendRefs(run))).collect()
}

impl View {
    /// The committed entry, for a message of `vote` when that is at least the vote held (an
    /// older vote's message is openraft's to refuse); `None` otherwise or when none is.
    fn committed_under(&self, vote: &Vote) -> Option<LogId> {
        let older = self.vote.as_ref().is_some_and(|held| vote < held);
        if older { None } else { self.committed }
    }

    /// The whole view as WAL records: a checkpoint record with the first run of entries, then
    /// the rest of them as appends.
    fn checkpoint(&self) -> Vec<Vec<u8>> {
        let entries: Vec<&Entry> = self.entries.values().collect();
        let mut runs = chunks(&entries).into_iter();
        let mut records = vec![encode_json(&RecordOut::Checkpoint {
            vote: self.vote.as_ref(),
            committed: self.committed.as_ref(),
            last_purged: self.last_purged.as_ref(),
            entries: runs.next().unwrap_or_default(),
        })];
        records.extend(runs.map(|run| encode_json(&RecordOut::AppendRefs(&run))));
        records
    }

    fn append(&mut self, entries: Vec<Entry>) {
        for entry in entries {
            let index = entry.log_id.index();
            if let Some((last, _)) = self.entries.last_key_value() {
                assert_eq!(index, last + 1, "appended entries continue the log without a hole");
            }
            self.entries.insert(index, entry);
        }
    }

    /// Removes the entries from `start` on; whether there were any.
    fn truncate_from(&mut self, start: u64) -> bool {
        let removes_any = self.entries.range(start..).next().is_some();
        self.entries.retain(|index, _| *index < start);
        removes_any
    }

    fn purge(&mut self, log_id: LogId) {
        assert!(self.last_purged.is_none_or(|purged| purged <= log_id), "purge never goes back");
        self.last_purged = Some(log_id);
        self.entries.retain(|index, _| *index > log_id.index());
    }

    /// Appends entries read back from the WAL, if they continue the log.
    fn replay_append(&mut self, entries: Vec<Entry>) -> Result<(), &'static str> {
        let mut next = self.entries.last_key_value().map(|(last, _)| last + 1);
        for entry in &entries {
            let index = entry.log_id.index();
            if next.is_some_and(|next| index != next) {
                return Err("appended entries leave a hole");
            }
            next = Some(index.checked_add(1).ok_or("an entry's index is the largest there is")?);
        }
        self.append(entries);
        Ok(())
    }

    /// Replays one record read back from the WAL. A record that would break the view's
    /// invariants (entries that do not continue the log, a purge going back) means the log on
    /// disk is damaged: an error, never a panic.
    fn replay(&mut self, record: Record) -> io::Result<()> {
        let damaged = |what: &str| {
            io::Error::new(io::ErrorKind::InvalidData, format!("the raft log is damaged: {what}"))
        };
        match record {
            Record::Checkpoint { vote, committed, last_purged, entries } => {
                *self = View { vote, committed, last_purged, entries: BTreeMap::new() };
                self.replay_append(entries).map_err(damaged)?;
            }
            Record::Append(entries) => self.replay_append(entries).map_err(damaged)?,
            Record::Vote(vote) => self.vote = Some(vote),
            Record::Committed(committed) => self.committed = Some(committed),
            Record::TruncateFrom(start) => {
                self.truncate_from(start);
            }
            Record::Purge(log_id) => {
                if self.last_purged.is_some_and(|purged| purged > log_id) {
                    return Err(damaged("a purge goes back"));
                }
                self.purge(log_id);
            }
        }
        Ok(())
    }
}

impl LogStore {
    /// Opens the log in the data directory `data_dir` (creating it) and loads it into memory;
    /// new WAL segments get `segment_bytes` of space. Appends whose entries `defer_sync` picks
    /// share the next sync instead of starting their own, once [`Self::follow_role`] says this
    /// node leads.
    ///
    /// # Errors
    /// When the directory cannot be used, holds damaged records, or holds a log in the format of
    /// an earlier Picket.
    #[cfg(test)]
    pub fn open(
        data_dir: &Path,
        segment_bytes: u64,
        defer_sync: Option<OnlyQueueWaiters>,
    ) -> io::Result<Self> {
        Self::open_counted(data_dir, segment_bytes, defer_sync, Arc::default())
    }

    /// [`LogStore::open`], counting the log's writes into `stats` (a node's metrics).
    ///
    /// # Errors
    /// As [`LogStore::open`].
    pub fn open_counted(
        data_dir: &Path,
        segment_bytes: u64,
        defer_sync: Option<OnlyQueueWaiters>,
        stats: Arc<WriterStats>,
    ) -> io::Result<Self> {
        if let Some(old) = OLD_LOG_PATHS.iter().find(|old| data_dir.join(old).exists()) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "{} holds a Raft log in the format of an earlier Picket ({old}); start this version on a new data directory",
                    data_dir.display()
                ),
            ));
        }
        let (recovered, records) = Wal::open(&data_dir.join(LOG_DIR), segment_bytes)?;
        let mut view = View::default();
        for (position, payload) in records.iter().enumerate() {
            let record: Record = decode_json(payload, "a raft log record")?;
            if position == 0 && !matches!(record, Record::Checkpoint { .. }) {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "the raft log's segment does not start with a checkpoint",
                ));
            }
            view.replay(record)?;
        }
        check_contiguous(&view)?;
        let wal = recovered.start(&view.checkpoint(), stats.clone())?;
        let inner = Inner {
            view: Mutex::new(view),
            wal: Mutex::new(wal),
            stats,
            defer_sync,
            // Off until the node learns it leads: a follower must not defer even briefly.
            deferred_sync_allowed: AtomicBool::new(false),
        };
        Ok(Self { inner: Arc::new(inner) })
    }

    /// The first entry this log holds as committed that a message from a leader contradicts:
    /// `(held, sent)`, where the leader of `vote` sends `sent` at the index of `held`, an entry
    /// this log holds committed. Raft never does that (a leader whose vote is at least the one
    /// this log holds has every committed entry), so it means the cluster lost committed entries:
    /// a majority's disks dropped writes they had acknowledged, or data was restored behind
    /// Picket's back. Messages of an older vote are left alone (openraft refuses them anyway,
    /// and an entry a deposed leader never committed may well differ).
    #[must_use]
    pub fn contradicted_commit<'a>(
        &self,
        vote: &Vote,
        sent: impl IntoIterator<Item = &'a LogId>,
    ) -> Option<(LogId, LogId)> {
        let view = self.view();
        let committed = view.committed_under(vote)?;
        sent.into_iter().filter(|sent| sent.index() <= committed.index()).find_map(|sent| {
            let held = view.entries.get(&sent.index())?.log_id;
            (held != *sent).then_some((held, *sent))
        })
    }

    /// `(held, last)` when a snapshot the leader of `vote` sends, ending at `last`, contradicts
    /// the entry this log holds committed: it is after it in log id order but not at a greater
    /// index (two committed entries in one slot, or a committed suffix undone). As
    /// [`LogStore::contradicted_commit`], only for a vote at least the one held.
    #[must_use]
    pub fn snapshot_contradicting_commit(
        &self,
        vote: &Vote,
        last: Option<&LogId>,
    ) -> Option<(LogId, LogId)> {
        let (committed, last) = (self.view().committed_under(vote)?, *last?);
        (last > committed && last.index() <= committed.index()).then_some((committed, last))
    }

    /// The last entry this log holds as committed, as openraft last saved it.
    #[must_use]
    pub fn committed(&self) -> Option<LogId> {
        self.view().committed
    }

    /// Sets how appends are synced from this node's role: whether it `leading`, and of how many
    /// `members` its cluster is made (itself included). Two rules follow from it:
    ///
    /// - An append of one entry on a quiet log may be synced by openraft's core itself
    ///   ([`crate::wal::Urgency::Alone`]), except on a leader of followers, whose core must send
    ///   each entry to its followers during its own sync, not after it.
    /// - Appends may defer their sync when `defer_sync` says nothing is acknowledged on them
    ///   only on a leader. A follower acknowledges every append to its leader once synced, and
    ///   its leader sends the next entries only after that answer: a follower deferring the sync
    ///   of a queued acquire held up the release behind it (and the grant it makes) for the whole
    ///   deferral.
    pub fn follow_role(&self, leading: bool, members: usize) {
        self.inner
            .wal
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .allow_inline_sync(!leading || members <= 1);
        self.inner.deferred_sync_allowed.store(leading, Ordering::Relaxed);
    }

    fn view(&self) -> MutexGuard<'_, View> {
        self.inner.view.lock().expect("log view lock poisoned")
    }

    /// Applies `change` to the view and writes the record it returns, in one step under the
    /// WAL's lock, so records reach the WAL in the order of the changes. `completion` fires once
    /// the record is durable (at once if `change` records nothing). A record that does not fit
    /// in the current segment starts the next one, whose checkpoint already includes it.
    fn record(
        &self,
        change: impl FnOnce(&mut View) -> Option<Vec<Vec<u8>>>,
        completion: Option<Completion>,
        urgency: Urgency,
    ) -> io::Result<()> {
        let mut wal = self.inner.wal.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut view = self.view();
        let Some(payloads) = change(&mut view) else {
            drop(view);
            if let Some(completion) = completion {
                completion(Ok(()));
            }
            return Ok(());
        };
        if wal.fits_all(&payloads) {
            drop(view);
            let (last, before) = payloads.split_last().expect("a change records something");
            for payload in before {
                wal.append(payload, None, urgency)?;
            }
            return wal.append(last, completion, urgency);
        }
        let checkpoint = view.checkpoint();
        drop(view);
        wal.rotate(&checkpoint, completion)
    }

    async fn record_and_wait(
        &self,
        change: impl FnOnce(&mut View) -> Option<Vec<Vec<u8>>>,
    ) -> io::Result<()> {
        let (done, durable) = oneshot::channel();
        let completion: Completion = Box::new(move |result| {
            // The waiting side may have given up; nothing to tell then.
            let _ = done.send(result);
        });
        self.record(change, Some(completion), Urgency::Now)?;
        durable.await.map_err(|_| io::Error::other("the log's flusher stopped"))?
    }
}

/// One entry of a node's Raft log as it is on disk, for inspection and for tests that compare
/// the logs of several nodes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredEntry {
    /// The leader that proposed it (its term and node), as JSON.
    pub leader: String,
    /// Its index in the log.
    pub index: u64,
    /// What it carries, as JSON.
    pub payload: String,
}

/// Reads the Raft log of the data directory `data_dir` as the node would recover it, without
/// writing anything. Entries purged after a snapshot are gone. Read it while the node is
/// stopped: a running node may rotate its segments under the reader.
///
/// # Errors
/// When the log cannot be read or holds damaged records.
pub fn read_entries(data_dir: &Path) -> io::Result<Vec<StoredEntry>> {
    let dir = data_dir.join(LOG_DIR);
    if !dir.exists() {
        return Ok(Vec::new());
    }
    let (_, records) = Wal::open(&dir, crate::wal::SEGMENT_BYTES)?;
    let mut view = View::default();
    for payload in &records {
        view.replay(decode_json(payload, "a raft log record")?)?;
    }
    Ok(view
        .entries
        .values()
        .map(|entry| StoredEntry {
            leader: serde_json::to_string(entry.log_id.committed_leader_id())
                .expect("a leader id serializes"),
            index: entry.log_id.index(),
            payload: serde_json::to_string(&entry.payload).expect("an entry serializes"),
        })
        .collect())
}

/// Raft only ever looks at the last log id, so a hole in the log would go unnoticed and lose
/// entries. Refuse to start on one.
fn check_contiguous(view: &View) -> io::Result<()> {
    let damaged = |what: String| io::Error::new(io::ErrorKind::InvalidData, what);
    let after = |index: u64| {
        index.checked_add(1).ok_or_else(|| {
            damaged(format!("the raft log is damaged: index {index} is the largest there is"))
        })
    };
    let mut expected = view.last_purged.map(|log_id| after(log_id.index())).transpose()?;
    for index in view.entries.keys() {
        if let Some(expected) = expected
            && *index != expected
        {
            return Err(damaged(format!(
                "the raft log has a hole: expected index {expected}, found {index}"
            )));
        }
        expected = Some(after(*index)?);
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
        let vote = *vote;
        self.record_and_wait(|view| {
            view.vote = Some(vote);
            Some(vec![encode_json(&RecordOut::Vote(&vote))])
        })
        .await
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> io::Result<()> {
        // Persisting the committed id only lets a restarted node apply up to it before it hears
        // from a leader; losing the latest value in a crash is safe, so it is written without a
        // sync of its own and reaches the disk with the next one.
        self.record(
            |view| {
                view.committed = committed;
                committed.map(|committed| vec![encode_json(&RecordOut::Committed(&committed))])
            },
            None,
            Urgency::Now,
        )
    }

    async fn read_committed(&mut self) -> io::Result<Option<LogId>> {
        Ok(self.view().committed)
    }

    async fn append<I>(&mut self, entries: I, callback: IOFlushed<TypeConfig>) -> io::Result<()>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let entries: Vec<Entry> = entries.into_iter().collect();
        self.inner.stats.entries.inc_by(entries.len() as u64);
        let completion: Completion = Box::new(move |result| callback.io_completed(result));
        // Encoded before the locks are taken, so readers of the view do not wait for it.
        let payloads = append_records(&entries);
        let defer = self.inner.deferred_sync_allowed.load(Ordering::Relaxed)
            && self.inner.defer_sync.as_ref().is_some_and(|defer| defer.judge(&entries));
        let urgency = match (defer, entries.len()) {
            (true, _) => Urgency::Soon,
            (false, 1) => Urgency::Alone,
            (false, _) => Urgency::Now,
        };
        self.record(
            |view| {
                view.append(entries);
                Some(payloads)
            },
            Some(completion),
            urgency,
        )
    }

    async fn truncate_after(&mut self, last_log_id: Option<LogId>) -> io::Result<()> {
        let start = last_log_id.map_or(0, |log_id| log_id.index() + 1);
        // Truncating after the last entry removes nothing and records nothing.
        self.record_and_wait(|view| {
            view.truncate_from(start).then(|| vec![encode_json(&RecordOut::TruncateFrom(start))])
        })
        .await
    }

    async fn purge(&mut self, log_id: LogId) -> io::Result<()> {
        self.record_and_wait(|view| {
            view.purge(log_id);
            Some(vec![encode_json(&RecordOut::Purge(&log_id))])
        })
        .await
    }
}

#[cfg(test)]
mod tests;
