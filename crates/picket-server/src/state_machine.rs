//! The replicated lock state: picket-core's state machine behind openraft's storage trait, with
//! snapshots on disk.
//!
//! The state machine lives in memory. It is durable through the log plus the last snapshot: on
//! start it is restored from the snapshot file and reports the snapshot's last log id as
//! applied, so openraft re-applies every entry after it from the log. A snapshot is written to a
//! temporary file, synced, and renamed over the old one, so a crash leaves either the old
//! snapshot or the new one, never half of one.

use crate::framing;
use crate::hub::Hub;
use crate::metrics::Metrics;
use crate::raft_types::{
    Entry, EntryReply, LogId, Snapshot, SnapshotMeta, StoredMembership, TypeConfig,
};
use crate::snapshot_cadence::{SnapshotCadence, next_index};
use futures_util::{Stream, StreamExt};
use openraft::storage::{EntryResponder, RaftStateMachine};
use openraft::{EntryPayload, OptionalSend, RaftSnapshotBuilder};
use picket_core::{Command, Limits, StateMachine};
use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard};

pub(crate) const SNAPSHOT_FILE: &str = "snapshot.bin";
const SNAPSHOT_TMP: &str = "snapshot.tmp";

/// The applied state of this node.
#[derive(Debug)]
pub struct AppliedState {
    /// The lock state.
    pub machine: StateMachine,
    /// The last log entry applied.
    pub last_applied: Option<LogId>,
    /// The last membership applied.
    pub membership: StoredMembership,
}

/// A snapshot: its metadata and the encoded state machine.
#[derive(Clone, Debug)]
struct StoredSnapshot {
    meta: SnapshotMeta,
    data: Vec<u8>,
}

/// openraft's handle to the state machine. Cloning gives another handle to the same state.
#[derive(Clone, Debug)]
pub struct StateStore {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    state: RwLock<AppliedState>,
    cluster_id: ClusterIdCell,
    dir: PathBuf,
    current: Mutex<Option<StoredSnapshot>>,
    cadence: Arc<SnapshotCadence>,
    hub: Arc<Hub>,
    metrics: Arc<Metrics>,
}

/// The cluster's id ([`picket_core::Command::NameCluster`]) and restore epoch as the applied
/// state holds them, shared with the Raft network: every Raft message carries both and is
/// checked against them, so they are kept apart from the state's lock, which the apply holds.
#[derive(Clone, Debug, Default)]
pub struct ClusterIdCell(Arc<CellInner>);

#[derive(Debug, Default)]
struct CellInner {
    id: std::sync::RwLock<Option<Arc<str>>>,
    restore_epoch: std::sync::atomic::AtomicU64,
}

impl ClusterIdCell {
    /// The id, once the cluster is named.
    #[must_use]
    pub fn get(&self) -> Option<Arc<str>> {
        self.0.id.read().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    /// The applied state's restore epoch ([`StateMachine::restore_epoch`]).
    #[must_use]
    pub fn restore_epoch(&self) -> u64 {
        self.0.restore_epoch.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Takes the id and restore epoch `machine` holds: on opening, after a naming, and after a
    /// snapshot's install (a node that joined gets its cluster's id and epoch so), and when
    /// the apply counted past an epoch's last revision.
    fn follow(&self, machine: &StateMachine) {
        let restore_epoch = machine.restore_epoch();
        self.0.restore_epoch.store(restore_epoch, std::sync::atomic::Ordering::Relaxed);
        let mut held = self.0.id.write().unwrap_or_else(std::sync::PoisonError::into_inner);
        if held.as_deref() != machine.cluster_id() {
            *held = machine.cluster_id().map(Arc::from);
        }
    }
}

/// Says of entries whether they only queue waiters on locks, so that nobody is answered when
/// they commit ([`StateStore::only_queue_waiters`]). The log's writer asks it to defer a sync,
/// and each replication stream to wait for the request behind. The state may change before the
/// entries apply; that only makes them wait when somebody would have heard sooner, never a
/// wrong answer.
#[derive(Clone)]
pub struct OnlyQueueWaiters(Arc<Judge>);

/// What [`OnlyQueueWaiters`] asks.
type Judge = dyn Fn(&[Entry]) -> bool + Send + Sync;

impl OnlyQueueWaiters {
    /// Entries are judged by `only_queue_waiters`.
    pub fn new(only_queue_waiters: impl Fn(&[Entry]) -> bool + Send + Sync + 'static) -> Self {
        Self(Arc::new(only_queue_waiters))
    }

    /// Whether `entries` only queue waiters.
    pub fn judge(&self, entries: &[Entry]) -> bool {
        (self.0)(entries)
    }
}

impl std::fmt::Debug for OnlyQueueWaiters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("OnlyQueueWaiters")
    }
}

impl StateStore {
    /// Restores the state from the snapshot in `dir`, or starts empty with `limits`.
    ///
    /// # Errors
    /// When the snapshot file exists but cannot be read or is damaged.
    pub fn open(
        dir: &Path,
        limits: Limits,
        cadence: Arc<SnapshotCadence>,
        hub: Arc<Hub>,
        metrics: Arc<Metrics>,
    ) -> io::Result<Self> {
        // A snapshot being written when the node stopped is incomplete; the previous one stands.
        match fs::remove_file(dir.join(SNAPSHOT_TMP)) {
            Ok(()) => tracing::info!("removed an incomplete snapshot left by a crash"),
            Err(error) if error.kind() == io::ErrorKind::NotFound => {}
            Err(error) => return Err(error),
        }
        let stored = read_snapshot_file(&dir.join(SNAPSHOT_FILE))?;
        #[cfg(feature = "mutations")]
        let limits_for_mutation = limits.clone();
        #[cfg_attr(not(feature = "mutations"), expect(unused_mut))]
        let mut state = match &stored {
            Some(snapshot) => AppliedState {
                machine: restore_machine(&snapshot.data)?,
                last_applied: snapshot.meta.last_log_id,
                membership: snapshot.meta.last_membership.clone(),
            },
            None => AppliedState {
                machine: StateMachine::new(limits),
                last_applied: None,
                membership: StoredMembership::default(),
            },
        };
        // The mutation: the lock state restarts empty while the log position is kept, so the
        // revision (every token's source) starts again near zero.
        #[cfg(feature = "mutations")]
        if stored.is_some() && crate::mutation::is_on("token_counter_resets_on_restart") {
            state.machine = emptied_for_mutation(&state.machine, limits_for_mutation);
        }
        hub.resync(&state.machine);
        if let Some(snapshot) = &stored {
            cadence.snapshotted(next_index(snapshot.meta.last_log_id.as_ref()));
        }
        let cluster_id = ClusterIdCell::default();
        cluster_id.follow(&state.machine);
        Ok(Self {
            inner: Arc::new(Inner {
                state: RwLock::new(state),
                cluster_id,
                dir: dir.to_owned(),
                current: Mutex::new(stored),
                cadence,
                hub,
                metrics,
            }),
        })
    }

    /// The cluster's id as the applied state holds it, kept up to date by the apply.
    #[must_use]
    pub fn cluster_id(&self) -> ClusterIdCell {
        self.inner.cluster_id.clone()
    }

    /// Reads the applied state. Hold the guard briefly: applying waits for it.
    pub fn read(&self) -> RwLockReadGuard<'_, AppliedState> {
        self.inner.state.read().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// [`StateStore::only_queue_waiters`] as a judgement to hand to the log's writer and the
    /// replication streams.
    pub fn queue_judge(&self) -> OnlyQueueWaiters {
        let applied = self.clone();
        OnlyQueueWaiters::new(move |entries: &[Entry]| applied.only_queue_waiters(entries))
    }

    /// Whether `entries` (about to be appended to the log, or sent to a follower) are all
    /// acquires that will only queue behind another session's grant, going by the state applied
    /// so far. Nothing is acknowledged on such an entry: its caller hears back when a later
    /// entry grants it, and that entry's sync (or request to a follower) covers this one. A
    /// wrong guess (the holder's release is already in the log but not applied) only delays the
    /// grant's reply by at most the deferral bound of the caller (the WAL's, or the replication
    /// stream's).
    ///
    /// Answers false, the safe side, without waiting when the applied state is locked for
    /// writing or waited for: the log's writer and the replication streams ask this on their
    /// way, and a long reader (a backup, a snapshot's copy) must not stall them.
    pub fn only_queue_waiters(&self, entries: &[Entry]) -> bool {
        let all_acquires = !entries.is_empty()
            && entries.iter().all(|entry| {
                matches!(&entry.payload, EntryPayload::Normal(input) if matches!(input.command, Command::Acquire { .. }))
            });
        if !all_acquires {
            return false;
        }
        let Ok(state) = self.inner.state.try_read() else {
            return false;
        };
        entries.iter().all(|entry| match &entry.payload {
            EntryPayload::Normal(input) => state.machine.only_queues(&input.command),
            _ => false,
        })
    }

    /// Where applied events go.
    #[must_use]
    pub fn hub(&self) -> &Arc<Hub> {
        &self.inner.hub
    }

    /// This node's metrics.
    #[must_use]
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.inner.metrics
    }

    /// Applies one committed entry.
    ///
    /// # Errors
    /// An entry written under apply rules this build does not know: the node stops (openraft
    /// treats a failed apply as fatal) rather than apply it differently from the nodes that
    /// wrote it.
    fn apply_entry(&self, entry: Entry) -> io::Result<(EntryReply, AppliedPosition)> {
        let log_id = entry.log_id;
        let known = crate::apply_rules::known_apply_rules();
        if let EntryPayload::Normal(input) = &entry.payload
            && input.rules > known
        {
            let message = format!(
                "log entry {log_id} was written under apply rules {}, and this build knows up to {known}: run a Picket build as new as the leader's on this node",
                input.rules
            );
            tracing::error!("{message}");
            return Err(io::Error::new(io::ErrorKind::InvalidData, message));
        }
        let mut state = self.inner.state.write().unwrap_or_else(std::sync::PoisonError::into_inner);
        assert!(state.last_applied < Some(log_id), "entries are applied once, in log order");
        state.last_applied = Some(log_id);
        let applied = match entry.payload {
            EntryPayload::Blank => None,
            EntryPayload::Membership(membership) => {
                state.membership = StoredMembership::new(Some(log_id), membership);
                None
            }
            EntryPayload::Normal(input) => {
                let applied = state.machine.apply(&input);
                self.inner.metrics.applied(&applied, &state.machine);
                // The epoch moves on within the log only after 2^48 commands in one epoch.
                let epoch_moved =
                    state.machine.restore_epoch() != self.inner.cluster_id.restore_epoch();
                if matches!(input.command, Command::NameCluster { .. }) || epoch_moved {
                    self.inner.cluster_id.follow(&state.machine);
                }
                Some(applied)
            }
        };
        let position = AppliedPosition::of(&state);
        drop(state);
        let Some(mut applied) = applied else {
            return Ok((EntryReply::None, position));
        };
        // Waiters and watchers get the events through the hub; the proposer needs only the
        // response, so the events are not copied into the reply.
        let events = std::mem::take(&mut applied.events);
        self.inner.hub.publish(applied.revision, &events);
        Ok((EntryReply::Applied(applied), position))
    }

    /// A copy of the applied state, taken under the read lock, which the apply waits for: a
    /// copy costs a fraction of encoding the state (at a million sessions, tenths of a second
    /// against over a second), so the apply and every write behind it stall only that long.
    pub(crate) fn copy(&self) -> (SnapshotMeta, StateMachine) {
        let state = self.read();
        let meta = SnapshotMeta {
            last_log_id: state.last_applied,
            last_membership: state.membership.clone(),
        };
        (meta, state.machine.clone())
    }

    /// A snapshot of the applied state, copied and encoded away from the async runtime's
    /// threads (a worker busy copying a million sessions held up every task queued behind it,
    /// the clock's pulse among them, which then read the stall as a gap), and encoded away
    /// from the lock.
    async fn build(&self) -> io::Result<StoredSnapshot> {
        let store = self.clone();
        tokio::task::spawn_blocking(move || {
            let (meta, machine) = store.copy();
            StoredSnapshot { meta, data: machine.snapshot() }
        })
        .await
        .map_err(io::Error::other)
    }

    async fn persist(&self, snapshot: StoredSnapshot) -> io::Result<()> {
        let dir = self.inner.dir.clone();
        // Moved to the writer and back rather than copied: a snapshot may be tens of megabytes.
        let snapshot = tokio::task::spawn_blocking(move || {
            write_snapshot_file(&dir, &snapshot).map(|()| snapshot)
        })
        .await
        .map_err(io::Error::other)??;
        *self.inner.current.lock().unwrap_or_else(std::sync::PoisonError::into_inner) =
            Some(snapshot);
        Ok(())
    }
}

/// Where the applied state stands after an entry, read under the apply's own write lock: what
/// the snapshot cadence needs, without taking the lock again after each applied run.
#[derive(Debug, Clone, Copy)]
struct AppliedPosition {
    /// The log index after the last applied entry.
    next_index: u64,
    /// Sessions and locks held in the state.
    records: u64,
}

impl AppliedPosition {
    fn of(state: &AppliedState) -> Self {
        let machine = &state.machine;
        let records = machine.session_count().saturating_add(machine.lock_count());
        Self {
            next_index: next_index(state.last_applied.as_ref()),
            records: u64::try_from(records).unwrap_or(u64::MAX),
        }
    }
}

pub(crate) fn restore_machine(data: &[u8]) -> io::Result<StateMachine> {
    StateMachine::restore(data)
        .map_err(|error| io::Error::new(io::ErrorKind::InvalidData, error.to_string()))
}

/// File layout: a [`crate::framing`] frame with the metadata's JSON as its header and the state
/// machine's snapshot bytes as its body.
fn write_snapshot_file(dir: &Path, snapshot: &StoredSnapshot) -> io::Result<()> {
    let meta = serde_json::to_vec(&snapshot.meta).map_err(io::Error::other)?;
    let tmp = dir.join(SNAPSHOT_TMP);
    {
        let mut file = fs::File::create(&tmp)?;
        file.write_all(&framing::length_prefix(&meta))?;
        file.write_all(&meta)?;
        file.write_all(&snapshot.data)?;
        file.sync_all()?;
    }
    fs::rename(&tmp, dir.join(SNAPSHOT_FILE))?;
    // The rename is durable only once the directory is synced.
    fs::File::open(dir)?.sync_all()
}

fn read_snapshot_file(path: &Path) -> io::Result<Option<StoredSnapshot>> {
    let bytes = match fs::read(path) {
        Ok(bytes) => bytes,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(error) => return Err(error),
    };
    let damaged = |what: &str| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("the snapshot file {} is damaged: {what}", path.display()),
        )
    };
    let (meta, data) = framing::unframe(&bytes).map_err(|error| damaged(&error.to_string()))?;
    let meta: SnapshotMeta =
        serde_json::from_slice(meta).map_err(|error| damaged(&error.to_string()))?;
    Ok(Some(StoredSnapshot { meta, data: data.to_vec() }))
}

impl RaftSnapshotBuilder<TypeConfig> for StateStore {
    type SnapshotData = Vec<u8>;

    async fn build_snapshot(&mut self) -> io::Result<Snapshot> {
        let started = std::time::Instant::now();
        let snapshot = self.build().await?;
        self.persist(snapshot.clone()).await?;
        self.inner.cadence.snapshotted(next_index(snapshot.meta.last_log_id.as_ref()));
        self.inner.metrics.snapshot_built(snapshot.data.len(), started.elapsed());
        Ok(Snapshot { meta: snapshot.meta, snapshot: snapshot.data })
    }
}

impl RaftStateMachine<TypeConfig> for StateStore {
    type SnapshotData = Vec<u8>;
    type SnapshotBuilder = Self;

    async fn applied_state(&mut self) -> io::Result<(Option<LogId>, StoredMembership)> {
        let state = self.read();
        Ok((state.last_applied, state.membership.clone()))
    }

    async fn apply<Strm>(&mut self, mut entries: Strm) -> io::Result<()>
    where
        Strm: Stream<Item = io::Result<EntryResponder<TypeConfig>>> + Unpin + OptionalSend,
    {
        let mut last_position = None;
        while let Some(item) = entries.next().await {
            let (entry, responder) = item?;
            let (reply, position) = self.apply_entry(entry)?;
            last_position = Some(position);
            if let Some(responder) = responder {
                responder.send(reply);
            }
        }
        if let Some(position) = last_position {
            self.inner.cadence.applied(position.next_index, position.records);
        }
        Ok(())
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn install_snapshot(&mut self, meta: &SnapshotMeta, snapshot: Vec<u8>) -> io::Result<()> {
        let machine = restore_machine(&snapshot)?;
        self.persist(StoredSnapshot { meta: meta.clone(), data: snapshot }).await?;
        let mut state = self.inner.state.write().unwrap_or_else(std::sync::PoisonError::into_inner);
        state.machine = machine;
        state.last_applied = meta.last_log_id;
        state.membership = meta.last_membership.clone();
        self.inner.hub.resync(&state.machine);
        self.inner.cluster_id.follow(&state.machine);
        drop(state);
        self.inner.cadence.snapshotted(next_index(meta.last_log_id.as_ref()));
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> io::Result<Option<Snapshot>> {
        let current =
            self.inner.current.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
        Ok(current.map(|stored| Snapshot { meta: stored.meta, snapshot: stored.data }))
    }
}

/// The mutation `token_counter_resets_on_restart`: an empty state (revision 0) that keeps the
/// cluster's id, so the bug is a reset token counter alone. A state that lost its id too is
/// another cluster to Picket's clients, which pass over its nodes instead of being granted the
/// reset tokens, and the fault harness could no longer see the bug.
#[cfg(feature = "mutations")]
fn emptied_for_mutation(machine: &StateMachine, limits: Limits) -> StateMachine {
    let empty = StateMachine::new(limits);
    let Some(cluster_id) = machine.cluster_id() else { return empty };
    let mut json: serde_json::Value =
        serde_json::from_slice(&empty.snapshot()).expect("a state's snapshot is JSON");
    json["cluster_id"] = serde_json::json!(cluster_id);
    json["newest_apply_rules"] = serde_json::json!(machine.newest_apply_rules());
    let bytes = serde_json::to_vec(&json).expect("JSON encodes");
    StateMachine::restore(&bytes).expect("an empty state with the id restores")
}

#[cfg(test)]
mod tests {
    use super::*;
    use openraft::testing::{blank_ent, log_id};
    use picket_core::{APPLY_RULES, Command, Input, RequestId, SessionId, Wait};

    fn acquire(session: u64, name: &str, wait: Wait) -> Entry {
        let input = Input::new(
            1,
            Command::Acquire {
                session: SessionId(session),
                name: name.into(),
                wait,
                request: RequestId(0),
                attempt: 0,
            },
        );
        Entry { log_id: log_id::<TypeConfig>(1, 1, 9), payload: EntryPayload::Normal(input) }
    }

    /// A node of an older build must stop at an entry a newer leader wrote under rules it
    /// does not know, not apply it under its own: it would part from the other replicas.
    #[test]
    fn an_entry_under_unknown_apply_rules_stops_the_apply_and_changes_nothing() {
        let (_dir, store) = store();
        let mut entry = acquire(2, "free", Wait::Try);
        let EntryPayload::Normal(input) = &mut entry.payload else { unreachable!() };
        input.rules = APPLY_RULES + 1;
        let before = store.read().machine.snapshot();
        let error = store.apply_entry(entry).expect_err("an unknown version stops the apply");
        assert!(error.to_string().contains("apply rules"), "{error}");
        assert_eq!(store.read().machine.snapshot(), before);
        assert_eq!(store.read().last_applied, None);
    }

    /// Entries in the log from before apply rules were versioned carry no version, and are
    /// applied under rules 0.
    #[test]
    fn an_entry_without_a_version_reads_as_apply_rules_zero() {
        let json = r#"{"now_ms":5,"command":{"type":"refresh"}}"#;
        let input: Input = serde_json::from_str(json).expect("an old entry decodes");
        assert_eq!((input.now_ms, input.rules), (5, 0));
        let written = serde_json::to_string(&Input::new(5, Command::Refresh)).expect("encodes");
        assert!(written.contains(&format!("\"rules\":{APPLY_RULES}")), "{written}");
    }

    /// Sessions 1 and 2; session 1 holds "held", nobody holds "free".
    fn store() -> (tempfile::TempDir, StateStore) {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let store = StateStore::open(
            dir.path(),
            Limits::default(),
            Arc::default(),
            Arc::default(),
            Arc::default(),
        )
        .expect("opens");
        {
            let mut state = store.inner.state.write().expect("not poisoned");
            for command in [
                Command::OpenSession { ttl_ms: 10_000, lock_delay_ms: 0, owner: None },
                Command::OpenSession { ttl_ms: 10_000, lock_delay_ms: 0, owner: None },
                Command::Acquire {
                    session: SessionId(1),
                    name: "held".into(),
                    wait: Wait::Try,
                    request: RequestId(0),
                    attempt: 0,
                },
            ] {
                let applied = state.machine.apply(&Input::new(1, command));
                assert!(applied.result.is_ok(), "{:?}", applied.result);
            }
        }
        (dir, store)
    }

    #[test]
    fn only_acquires_that_queue_behind_another_holder_defer_their_sync() {
        let (_dir, store) = store();
        let queues = acquire(2, "held", Wait::Forever);
        assert!(store.only_queue_waiters(std::slice::from_ref(&queues)));
        assert!(
            store.only_queue_waiters(&[
                queues.clone(),
                acquire(2, "held", Wait::For { wait_ms: 50 })
            ])
        );
        // Each of these may be answered on its own entry, so its sync must not wait.
        for urgent in [
            acquire(1, "held", Wait::Forever),
            acquire(2, "held", Wait::Try),
            acquire(2, "held", Wait::For { wait_ms: 0 }),
            acquire(2, "free", Wait::Forever),
            blank_ent::<TypeConfig>(1, 1, 9),
        ] {
            assert!(!store.only_queue_waiters(std::slice::from_ref(&urgent)), "{urgent:?}");
            assert!(!store.only_queue_waiters(&[queues.clone(), urgent]), "a mixed batch");
        }
        assert!(!store.only_queue_waiters(&[]));
    }

    /// Fuzz target (issue 13): a snapshot file of any bytes, or a real one damaged, is refused
    /// with an error or restored into a consistent state; opening never panics.
    mod fuzz {
        use super::*;
        use proptest::prelude::*;

        fn real_snapshot_file() -> Vec<u8> {
            let (dir, store) = store();
            let runtime = tokio::runtime::Builder::new_current_thread().build().expect("a runtime");
            let snapshot = runtime.block_on(store.build()).expect("built");
            write_snapshot_file(dir.path(), &snapshot).expect("written");
            fs::read(dir.path().join(SNAPSHOT_FILE)).expect("read")
        }

        fn open_with(bytes: &[u8]) -> io::Result<StateStore> {
            let dir = tempfile::tempdir().expect("a temporary directory");
            fs::write(dir.path().join(SNAPSHOT_FILE), bytes).expect("written");
            StateStore::open(
                dir.path(),
                Limits::default(),
                Arc::default(),
                Arc::default(),
                Arc::default(),
            )
        }

        proptest! {
            #![proptest_config(ProptestConfig {
                cases: picket_testkit::fuzz_cases(1_000),
                ..ProptestConfig::default()
            })]

            #[test]
            fn fuzz_a_snapshot_file_of_any_bytes_is_refused(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
                let _ = open_with(&bytes);
            }

            #[test]
            fn fuzz_a_damaged_snapshot_file_is_refused_or_restored_whole(
                flips in proptest::collection::vec((any::<prop::sample::Index>(), 0_u8..8), 1..4),
                cut in proptest::option::of(any::<prop::sample::Index>()),
            ) {
                let mut bytes = real_snapshot_file();
                for (at, bit) in flips {
                    let at = at.index(bytes.len());
                    bytes[at] ^= 1 << bit;
                }
                if let Some(cut) = cut {
                    bytes.truncate(cut.index(bytes.len()));
                }
                if let Ok(store) = open_with(&bytes) {
                    prop_assert!(store.read().machine.check_invariants().is_ok());
                }
            }
        }
    }
}
