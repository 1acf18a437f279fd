//! When a node snapshots its state: after a number of log entries that grows with the state.
//!
//! A snapshot costs what the state holds (at a million sessions, a copy of tenths of a second
//! under the apply's lock, an encoding of 87 MB and its write and sync); replaying the log on a
//! restart costs what was written since the last one. With a fixed count of entries between
//! snapshots (openraft's `LogsSinceLast`) the first cost per entry grows with the state: a
//! million sessions opened one at a time wrote their whole state every 20,000 entries, about
//! twenty times the bytes of the entries themselves. So a snapshot is due after
//! `max(snapshot_every, records / RECORDS_PER_ENTRY)` entries, where `records` counts the
//! state's sessions and locks: each entry then pays for at most [`RECORDS_PER_ENTRY`] records of
//! snapshot, and the log kept between snapshots (in memory, and in each WAL segment's
//! checkpoint) stays about an eighth of the state's record count.
//!
//! The state machine notes what it applied ([`SnapshotCadence::applied`]); the shell
//! ([`run`]) asks openraft for a snapshot when one is due, and openraft builds it and purges the
//! log behind it as it does under its own policy (which is `Never` here).

use crate::raft_types::{LogId, Raft};
use openraft::async_runtime::WatchReceiver as _;

type DataMetrics = openraft::alias::WatchReceiverOf<
    crate::raft_types::TypeConfig,
    openraft::metrics::RaftDataMetrics<crate::raft_types::TypeConfig>,
>;
use std::sync::Arc;
use std::sync::atomic::Ordering::SeqCst;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::time::Duration;
use tokio::sync::{Notify, watch};

/// Records of state (sessions and locks) a snapshot may cost each entry since the last one.
pub const RECORDS_PER_ENTRY: u64 = 8;
/// How long the shell waits for a snapshot it asked for, or for openraft to take one in,
/// before it looks again whether one is due: openraft drops a request while another build
/// runs, and an installed snapshot may wake it instead of the one it asked for.
const ASK_AGAIN_AFTER: Duration = Duration::from_secs(10);

/// Entries between two snapshots of a state of `records` sessions and locks.
#[must_use]
pub fn entries_between(snapshot_every: u64, records: u64) -> u64 {
    snapshot_every.max(records / RECORDS_PER_ENTRY).max(1)
}

/// Shared between the state machine, which applies, and [`run`], which asks for snapshots.
#[derive(Debug)]
pub struct SnapshotCadence {
    snapshot_every: u64,
    /// The log index of the last snapshot's last entry, plus one; 0 for none.
    snapshot_next_index: AtomicU64,
    /// How far the state is applied (the last index plus one) and its sessions and locks, as
    /// of the last [`SnapshotCadence::applied`].
    applied_next_index: AtomicU64,
    records: AtomicU64,
    /// A snapshot is due and [`run`] was told; cleared by [`run`] once none is due.
    asked: AtomicBool,
    due: Notify,
    built: Notify,
}

impl Default for SnapshotCadence {
    fn default() -> Self {
        Self::new(crate::server::RaftTuning::default().snapshot_every_entries)
    }
}

impl SnapshotCadence {
    /// A snapshot at least every `snapshot_every` entries (more apart for a large state).
    #[must_use]
    pub fn new(snapshot_every: u64) -> Self {
        Self {
            snapshot_every,
            snapshot_next_index: AtomicU64::new(0),
            applied_next_index: AtomicU64::new(0),
            records: AtomicU64::new(0),
            asked: AtomicBool::new(false),
            due: Notify::new(),
            built: Notify::new(),
        }
    }

    /// Whether a snapshot is due with the log applied up to `applied_next_index` (the last
    /// applied index plus one) on a state of `records` sessions and locks.
    #[must_use]
    pub fn is_due(&self, applied_next_index: u64, records: u64) -> bool {
        let since = applied_next_index.saturating_sub(self.snapshot_next_index.load(SeqCst));
        since >= entries_between(self.snapshot_every, records)
    }

    /// Whether a snapshot is due as of the last [`SnapshotCadence::applied`].
    fn is_due_now(&self) -> bool {
        self.is_due(self.applied_next_index.load(SeqCst), self.records.load(SeqCst))
    }

    /// Called after a run of entries is applied, with the log applied up to
    /// `applied_next_index` on a state of `records` sessions and locks.
    pub fn applied(&self, applied_next_index: u64, records: u64) {
        self.applied_next_index.store(applied_next_index, SeqCst);
        self.records.store(records, SeqCst);
        self.ask_if_due();
    }

    /// Called when a snapshot covering the log up to `next_index` (its last index plus one)
    /// is built or installed.
    pub fn snapshotted(&self, next_index: u64) {
        self.snapshot_next_index.fetch_max(next_index, SeqCst);
        self.built.notify_waiters();
        // A snapshot installed on an idle node may leave the log due for the next one.
        self.ask_if_due();
    }

    /// Tells [`run`] when a snapshot is due, unless it was told and has not settled yet.
    fn ask_if_due(&self) {
        if self.is_due_now() && !self.asked.swap(true, SeqCst) {
            self.due.notify_one();
        }
    }

    /// Called by [`run`] once no snapshot is due: clears `asked`, then looks again, since an
    /// apply in between saw `asked` still set and told nobody. True when one is due again and
    /// [`run`] holds `asked` once more.
    fn settle(&self) -> bool {
        self.asked.store(false, SeqCst);
        self.is_due_now() && !self.asked.swap(true, SeqCst)
    }
}

/// Asks `raft` for a snapshot whenever `cadence` says one is due, until `shutdown` turns true.
/// After each request it waits for a snapshot to be built (or [`ASK_AGAIN_AFTER`]) and for
/// openraft to have taken in every snapshot built so far, then looks whether one is still due:
/// openraft drops a request while it counts a build as running (and it still does for a moment
/// after the state machine reports the build done), so a request is never assumed to be taken.
pub async fn run(raft: Raft, cadence: Arc<SnapshotCadence>, mut shutdown: watch::Receiver<bool>) {
    let mut recorded = raft.data_metrics();
    loop {
        tokio::select! {
            () = cadence.due.notified() => {}
            _ = shutdown.changed() => return,
        }
        loop {
            if cadence.is_due_now() {
                if !ask_once(&raft, &cadence, &mut recorded, &mut shutdown).await {
                    return;
                }
            } else if !cadence.settle() {
                break;
            }
        }
    }
}

/// Asks for one snapshot and waits as [`run`] says; false when the node is stopping.
async fn ask_once(
    raft: &Raft,
    cadence: &SnapshotCadence,
    recorded: &mut DataMetrics,
    shutdown: &mut watch::Receiver<bool>,
) -> bool {
    let built = cadence.built.notified();
    tokio::pin!(built);
    built.as_mut().enable();
    if let Err(error) = raft.trigger().snapshot().await {
        tracing::debug!(%error, "asking for a snapshot failed; the node is stopping");
        return false;
    }
    tokio::select! {
        () = &mut built => {}
        () = tokio::time::sleep(ASK_AGAIN_AFTER) => {}
        _ = shutdown.changed() => return false,
    }
    let covered = cadence.snapshot_next_index.load(SeqCst);
    let taken_in = async {
        while next_index(recorded.borrow_watched().snapshot.as_ref()) < covered {
            if recorded.changed().await.is_err() {
                return;
            }
        }
    };
    tokio::select! {
        _ = tokio::time::timeout(ASK_AGAIN_AFTER, taken_in) => true,
        _ = shutdown.changed() => false,
    }
}

/// The index after `log_id`'s, 0 for none: how far a state or a snapshot covers the log.
#[must_use]
pub fn next_index(log_id: Option<&LogId>) -> u64 {
    log_id.map_or(0, |log_id| log_id.index + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_small_state_snapshots_every_configured_count_and_a_large_one_after_an_eighth_of_its_records()
     {
        assert_eq!(entries_between(20_000, 0), 20_000);
        assert_eq!(entries_between(20_000, 160_000), 20_000);
        assert_eq!(entries_between(20_000, 1_000_000), 125_000);
        assert_eq!(entries_between(0, 0), 1, "never a snapshot per zero entries");
    }

    #[test]
    fn a_due_snapshot_is_asked_for_once_until_run_settles() {
        let cadence = SnapshotCadence::new(100);
        cadence.applied(99, 10);
        assert!(!cadence.asked.load(SeqCst));
        cadence.applied(100, 10);
        assert!(cadence.asked.load(SeqCst));
        // A snapshot at index 99 (next index 100) makes the next one due 100 entries later.
        cadence.snapshotted(100);
        assert!(!cadence.settle(), "nothing is due after the snapshot");
        assert!(!cadence.asked.load(SeqCst));
        assert!(!cadence.is_due(199, 10));
        assert!(cadence.is_due(200, 10));
        // Eight hundred thousand records make it due 100,000 entries after, not 100.
        assert!(!cadence.is_due(200, 800_000));
        assert!(cadence.is_due(100_100, 800_000));
        // An older snapshot installed late never moves the mark back.
        cadence.snapshotted(50);
        assert!(!cadence.is_due(199, 10));
    }

    /// Review: a snapshot that fell due while the last one was built was lost when the request
    /// for it came before openraft took the last one in (it drops such a request) and the node
    /// then went idle. `run` now looks again after every build, however it was woken.
    #[test]
    fn entries_applied_while_a_snapshot_was_built_keep_the_next_one_asked_for() {
        let cadence = SnapshotCadence::new(100);
        cadence.applied(100, 10);
        assert!(cadence.asked.load(SeqCst));
        // The build covers up to 100; meanwhile the log reached 250, and the node goes idle.
        cadence.applied(250, 10);
        cadence.snapshotted(100);
        assert!(cadence.is_due_now());
        assert!(cadence.settle(), "run asks for the next snapshot itself");
        assert!(cadence.asked.load(SeqCst));
    }
}
