//! One Picket node: the operations the APIs offer, on top of Raft and the applied state.
//!
//! Writes become log entries stamped with the leader's clock and applied by every node. Reads
//! are linearizable: the leader confirms its leadership with a quorum (`ReadIndex`) and waits
//! until its state has applied everything committed before it answers. Keepalives do not become
//! log entries: the leader remembers them and folds them into the next tick (see
//! [`crate::driver`]).

mod acquire;
mod cluster;
mod in_flight;
mod leader_link;
mod reads;
mod sessions;
mod watch;

pub use crate::hub::Watched;
pub use acquire::{AcquireRequest, Grant};
pub use cluster::{ClusterView, MAX_MEMBER_ADDR_BYTES, MAX_MEMBERS, MemberView};
pub use picket_proto::{MAX_KEEPALIVE_BATCH, MAX_WATCHED_SESSIONS};
pub use sessions::Ownership;
pub(crate) use watch::Recheck;
pub use watch::{WatchItem, WatchStream};

use crate::auth::AuthFile;
use crate::clock::{Clock, GapWatch};
use crate::error::ServiceError;
use crate::hub::Hub;
use crate::limits::{Budget, ServerLimit, ServerLimits};
use crate::log_store::WriterStats;
use crate::raft_types::{EntryReply, NodeId, Raft};
use crate::renewals::Renewals;
use crate::state_machine::{AppliedState, StateStore};
use openraft::async_runtime::WatchReceiver;
use openraft::error::{ClientWriteError, ForwardToLeader, LinearizableReadError, RaftError};
use openraft::{ReadPolicy, ServerState};
use picket_core::SequencerSigner;
use picket_core::{Command, Input, Response, Sequencer, SessionId};
use picket_proto::tls::ClientTls;
use std::collections::BTreeMap;
use std::sync::Arc;

/// One running node. Shared by the API front ends and the leader's background duties.
#[derive(Debug)]
pub struct Node {
    id: NodeId,
    raft: Raft,
    store: StateStore,
    clock: Arc<Clock>,
    /// Written by the leader's rate check, read by `cluster()`.
    peer_clock_rates: std::sync::Mutex<BTreeMap<NodeId, f64>>,
    /// The newest apply rules each voter said it knows, in its answers to the leader's clock
    /// readings (see [`crate::apply_rules`]).
    peer_apply_rules: std::sync::Mutex<BTreeMap<NodeId, u32>>,
    gaps: GapWatch,
    /// The restore this node's data directory holds, if any
    /// ([`crate::backup::restore_identity`]), and how many Raft messages it refused from
    /// peers restored otherwise.
    restore: Option<Arc<str>>,
    other_restores_refused: std::sync::atomic::AtomicU64,
    /// Raft messages refused from peers whose state is of an older restore epoch.
    older_epochs_refused: std::sync::atomic::AtomicU64,
    /// The cluster id the applied state holds, for the Raft messages' check.
    cluster_id: crate::state_machine::ClusterIdCell,
    /// Raft messages refused from nodes of another cluster.
    other_clusters_refused: std::sync::atomic::AtomicU64,
    renewals: Renewals,
    /// Places for watch streams and for acquire requests in flight ([`ServerLimits`]).
    watch_streams: Budget,
    pending_acquires: Budget,
    log_stats: Arc<WriterStats>,
    /// The term in which this node, as leader, last had its `Refresh` applied: from then on it
    /// has committed and applied an entry of its own term.
    refreshed_term: std::sync::atomic::AtomicU64,
    /// The term in which this node last became leader, and when (see [`Node::led_for`]).
    leading_since: std::sync::Mutex<Option<(u64, std::time::Instant)>>,
    /// Woken when `refreshed_term` changes.
    settled: tokio::sync::Notify,
    /// Acquire requests handed to Raft and not yet seen applied.
    in_flight: in_flight::InFlight,
    /// How long a leader may go without hearing from a quorum before it is not ready.
    leader_lease: std::time::Duration,
    /// TLS for this node's calls to its peers, when the cluster runs TLS.
    to_peers: Option<ClientTls>,
    /// The connection this node hands abandons to its leader on.
    leader_link: leader_link::LeaderLink,
    /// Held while a backup is taken: one at a time.
    backups: Arc<tokio::sync::Mutex<()>>,
    /// Signs every grant's sequencer, when the cluster has a signing key.
    signer: Option<Arc<SequencerSigner>>,
    /// The principals that may use this node; `None` lets anyone do anything.
    auth: Option<Arc<AuthFile>>,
    /// Why this node stopped serving for good, once it has (see [`Node::halt`]).
    halted: tokio::sync::watch::Sender<Option<String>>,
    /// Held through a membership change, so that its checks and the change are one step.
    membership_changes: Arc<tokio::sync::Mutex<()>>,
    /// The limits this node sets in the state while it leads ([`ServerLimits::replicated`]).
    limit_overrides: crate::limits::LimitOverrides,
    /// Why the state last refused this node's limits, while it does (shown in `cluster()`).
    limits_refused: std::sync::Mutex<Option<String>>,
    /// The peers this node waits to hear from before it forms a new cluster (see
    /// [`crate::server::formation`]); shown in `cluster()`.
    waiting_for_peers: std::sync::Mutex<Vec<NodeId>>,
}

/// A one-node cluster started in this process in `dir`, returned once it is ready: for the
/// tests of a node's own operations.
#[cfg(test)]
pub(crate) async fn ready_single_node(dir: &std::path::Path) -> crate::ServerHandle {
    let listen = "127.0.0.1:0".parse().expect("a loopback address");
    let handle = crate::start(crate::ServerConfig::single(dir.join("node"), listen)).await;
    let handle = handle.expect("the node starts");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while handle.node().readiness().is_err() {
        assert!(std::time::Instant::now() < deadline, "the node did not become ready");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    handle
}

/// Longest a refusal on a leader elected a moment ago waits for the leader's `Refresh` before
/// it goes to the log instead (one commit round, normally).
const SETTLE_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// Most committed entries a node may have left to apply and still count as caught up.
const MAX_READY_APPLY_LAG: u64 = 1_000;

/// Why a node cannot serve yet (see [`Node::readiness`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NotReady {
    /// No leader is known: an election is under way, or this node is cut off from a quorum.
    NoLeader,
    /// This node was just elected and has not yet applied an entry of its own term.
    LeaderNotSettled,
    /// This node leads but has not heard from a quorum within a leader lease: it may have been
    /// deposed on the other side of a partition.
    NoQuorum,
    /// This node has not yet applied every entry it knows to be committed.
    CatchingUp,
    /// This node led, and was removed from the cluster's membership. Nobody replicates to it
    /// any more, and it keeps naming itself leader (its last vote stays), so it would look
    /// ready for ever. (A removed follower knows no leader: [`NotReady::NoLeader`].)
    Removed,
}

impl NotReady {
    /// A stable code for the wire.
    #[must_use]
    pub fn code(self) -> &'static str {
        match self {
            Self::NoLeader => "no_leader",
            Self::LeaderNotSettled => "leader_not_settled",
            Self::NoQuorum => "no_quorum",
            Self::CatchingUp => "catching_up",
            Self::Removed => "removed",
        }
    }

    /// What it means, for a person.
    #[must_use]
    pub fn message(self) -> &'static str {
        match self {
            Self::NoLeader => {
                "no leader is known: an election is under way or this node is cut off from a quorum"
            }
            Self::LeaderNotSettled => {
                "this node was just elected leader and has not yet committed an entry of its own term"
            }
            Self::NoQuorum => {
                "this node leads but has not heard from a quorum within its lease: it may be cut off"
            }
            Self::CatchingUp => {
                "this node is more than 1,000 committed entries behind in applying them"
            }
            Self::Removed => {
                "this node was removed from the cluster: stop it, or add it again \
                 (`picket members add`)"
            }
        }
    }
}

fn not_leader(forward: &ForwardToLeader<crate::raft_types::TypeConfig>) -> ServiceError {
    ServiceError::NotLeader {
        leader_id: forward.leader_id,
        leader_addr: forward.leader_node.as_ref().map(|node| node.addr.clone()),
    }
}

impl Node {
    pub(crate) fn new(
        id: NodeId,
        raft: Raft,
        store: StateStore,
        log_stats: Arc<WriterStats>,
        leader_lease: std::time::Duration,
        clock: Arc<Clock>,
        limits: &ServerLimits,
    ) -> Self {
        let cluster_id = store.cluster_id();
        Self {
            id,
            raft,
            store,
            clock,
            peer_clock_rates: std::sync::Mutex::default(),
            peer_apply_rules: std::sync::Mutex::default(),
            gaps: GapWatch::default(),
            restore: None,
            other_restores_refused: std::sync::atomic::AtomicU64::new(0),
            older_epochs_refused: std::sync::atomic::AtomicU64::new(0),
            cluster_id,
            other_clusters_refused: std::sync::atomic::AtomicU64::new(0),
            waiting_for_peers: std::sync::Mutex::default(),
            renewals: Renewals::default(),
            watch_streams: Budget::new(ServerLimit::WatchStreams, limits.max_watch_streams),
            pending_acquires: Budget::new(
                ServerLimit::PendingAcquires,
                limits.max_pending_acquires,
            ),
            limit_overrides: limits.replicated.clone(),
            limits_refused: std::sync::Mutex::default(),
            log_stats,
            refreshed_term: std::sync::atomic::AtomicU64::new(0),
            leading_since: std::sync::Mutex::new(None),
            settled: tokio::sync::Notify::new(),
            in_flight: in_flight::InFlight::default(),
            leader_lease,
            to_peers: None,
            leader_link: leader_link::LeaderLink::default(),
            backups: Arc::default(),
            signer: None,
            auth: None,
            halted: tokio::sync::watch::Sender::new(None),
            membership_changes: Arc::default(),
        }
    }

    /// Stops this node for good, for `reason`: its Raft stops, so it neither votes nor
    /// replicates, and [`crate::ServerHandle::raft_stopped`] resolves with the reason. For a
    /// state the node must not go on from (its committed log contradicted by the leader). The
    /// first reason stays.
    pub fn halt(&self, reason: String) {
        let first = self.halted.send_if_modified(|halted| {
            let first = halted.is_none();
            if first {
                *halted = Some(reason);
            }
            first
        });
        if first {
            let raft = self.raft.clone();
            tokio::spawn(async move {
                let _ = raft.shutdown().await;
            });
        }
    }

    /// Why this node halted, once it has: the receiver sees the reason when [`Node::halt`] sets
    /// it.
    #[must_use]
    pub fn halted(&self) -> tokio::sync::watch::Receiver<Option<String>> {
        self.halted.subscribe()
    }

    /// Signs every grant's sequencer with `signer`.
    pub(crate) fn with_signer(mut self, signer: Option<Arc<SequencerSigner>>) -> Self {
        self.signer = signer;
        self
    }

    /// The sequencer string of the grant of `name` under `token` to `session`: signed when the
    /// node has a signing key (`p2.`), else `p1.`.
    #[must_use]
    pub fn sequencer(&self, name: &str, token: u64, session: SessionId) -> String {
        match &self.signer {
            Some(signer) => signer.seal(name, token, session.0).to_string(),
            None => Sequencer::new(name, token).to_string(),
        }
    }

    /// Authenticates callers against `auth` (see [`crate::auth`]).
    pub(crate) fn with_auth(mut self, auth: Option<Arc<AuthFile>>) -> Self {
        self.auth = auth;
        self
    }

    /// The principals that may use this node, when it authenticates its callers.
    #[must_use]
    pub fn auth(&self) -> Option<&AuthFile> {
        self.auth.as_deref()
    }

    /// The auth file, shared, for requests that outlive one look at it.
    pub(crate) fn auth_file(&self) -> Option<&Arc<AuthFile>> {
        self.auth.as_ref()
    }

    /// Calls this node's peers over TLS with `to_peers`.
    pub(crate) fn with_peer_tls(mut self, to_peers: Option<ClientTls>) -> Self {
        self.to_peers = to_peers;
        self
    }

    /// Records the restore this node's data directory holds.
    pub(crate) fn with_restore(mut self, identity: Option<String>) -> Self {
        self.restore = identity.map(Arc::from);
        self
    }

    /// The restore this node's data directory holds, if any.
    pub(crate) fn restore(&self) -> Option<&str> {
        self.restore.as_deref()
    }

    /// The cluster id this node's applied state holds, once a leader has named the cluster.
    pub(crate) fn cluster_id(&self) -> Option<Arc<str>> {
        self.cluster_id.get()
    }

    /// The same, kept up to date, for clients of this node's peers.
    pub(crate) fn cluster_id_cell(&self) -> crate::state_machine::ClusterIdCell {
        self.cluster_id.clone()
    }

    /// Records the peers this node waits to hear from before it forms a new cluster.
    pub(crate) fn set_waiting_for_peers(&self, peers: Vec<NodeId>) {
        *self.waiting_for_peers.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = peers;
    }

    /// The peers this node waits to hear from before it forms a new cluster; empty once it
    /// formed one or heard of one to join.
    pub(crate) fn waiting_for_peers(&self) -> Vec<NodeId> {
        self.waiting_for_peers.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    /// Counts a Raft message refused from a node of another cluster; true for the first, and
    /// then for every 1,000th, so that the log says it again while it goes on.
    pub(crate) fn other_cluster_refused(&self) -> bool {
        let before = self.other_clusters_refused.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        before.is_multiple_of(1_000)
    }

    /// Counts a Raft message refused from a peer restored otherwise; true for the first.
    pub(crate) fn other_restore_refused(&self) -> bool {
        self.other_restores_refused.fetch_add(1, std::sync::atomic::Ordering::Relaxed) == 0
    }

    /// Counts a Raft message refused from a peer whose state is of an older restore epoch; true
    /// for the first, and then for every 1,000th, so that the log says it again while it goes
    /// on.
    pub(crate) fn older_epoch_refused(&self) -> bool {
        let before = self.older_epochs_refused.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        before.is_multiple_of(1_000)
    }

    /// Raft messages refused from peers restored otherwise or of an older restore epoch.
    pub(crate) fn restore_refusals(&self) -> u64 {
        let relaxed = std::sync::atomic::Ordering::Relaxed;
        self.other_restores_refused.load(relaxed) + self.older_epochs_refused.load(relaxed)
    }

    /// TLS for this node's calls to its peers, when the cluster runs TLS.
    #[must_use]
    pub fn to_peers(&self) -> Option<&ClientTls> {
        self.to_peers.as_ref()
    }

    /// This node's id.
    #[must_use]
    pub fn id(&self) -> NodeId {
        self.id
    }

    /// The Raft handle.
    #[must_use]
    pub(crate) fn raft(&self) -> &Raft {
        &self.raft
    }

    /// The node's clock.
    #[must_use]
    pub fn clock(&self) -> &Clock {
        &self.clock
    }

    /// Records the voters' clock rates the leader's rate check found.
    pub(crate) fn set_peer_clock_rates(&self, rates: BTreeMap<NodeId, f64>) {
        if let Ok(mut known) = self.peer_clock_rates.lock() {
            *known = rates;
        }
    }

    /// Records the apply rules the voters said they know (the leader's rate check asks).
    pub(crate) fn set_peer_apply_rules(&self, reported: BTreeMap<NodeId, u32>) {
        if let Ok(mut known) = self.peer_apply_rules.lock() {
            *known = reported;
        }
    }

    /// The apply rules this node writes entries under as leader: the newest every member knows
    /// (see [`crate::apply_rules::writing_rules`]).
    #[must_use]
    pub fn writing_rules(&self) -> u32 {
        let known = crate::apply_rules::known_apply_rules();
        let newest_accepted = self.read_local(|state| state.machine.newest_apply_rules());
        if newest_accepted >= known {
            // Once the log holds an entry under the newest rules this build knows, every node
            // that applies the log knows them: what the members said no longer matters. This
            // is the answer below, without reading the members on every proposal.
            return known;
        }
        // Read the members under the metrics' lock, without copying the rest. Learners count
        // too: they apply every entry.
        let members: std::collections::BTreeSet<NodeId> = {
            let metrics = self.raft.metrics();
            let metrics = metrics.borrow_watched();
            metrics.membership_config.membership().nodes().map(|(id, _)| *id).collect()
        };
        let reported =
            self.peer_apply_rules.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        crate::apply_rules::writing_rules(known, newest_accepted, self.id, &members, &reported)
    }

    /// The watch for stalls and clock jumps.
    pub(crate) fn gaps(&self) -> &GapWatch {
        &self.gaps
    }

    /// The limits this node sets in the state while it leads.
    pub(crate) fn limit_overrides(&self) -> &crate::limits::LimitOverrides {
        &self.limit_overrides
    }

    /// Records why the state refused this node's limits (`None` once it took them, or there
    /// was nothing to set); returns whether the reason changed.
    pub(crate) fn note_limits_refused(&self, reason: Option<String>) -> bool {
        let mut refused =
            self.limits_refused.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let changed = *refused != reason;
        *refused = reason;
        changed
    }

    /// Why the state refuses this node's limits now, if it does.
    pub(crate) fn limits_refused(&self) -> Option<String> {
        self.limits_refused.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    /// The keepalives waiting for the next tick.
    pub(crate) fn renewals(&self) -> &Renewals {
        &self.renewals
    }

    /// Where applied events go.
    #[must_use]
    pub fn hub(&self) -> &Arc<Hub> {
        self.store.hub()
    }

    /// Group-commit counters of the log writer.
    #[must_use]
    pub fn log_stats(&self) -> &Arc<WriterStats> {
        &self.log_stats
    }

    /// Records that this node leads in `term`, from now if it did not lead in that term before.
    pub(crate) fn note_leading(&self, term: u64) {
        let mut since =
            self.leading_since.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if since.is_none_or(|(known, _)| known != term) {
            *since = Some((term, std::time::Instant::now()));
        }
    }

    /// How long this node has led, when it leads in the term it last noted.
    pub(crate) fn led_for(&self) -> Option<std::time::Duration> {
        let term = {
            let metrics = self.raft.metrics();
            let metrics = metrics.borrow_watched();
            (metrics.state == openraft::ServerState::Leader).then_some(metrics.current_term)?
        };
        let since = *self.leading_since.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        since.filter(|(known, _)| *known == term).map(|(_, at)| at.elapsed())
    }

    /// Records that this node, leading in `term`, had its `Refresh` applied.
    pub(crate) fn mark_refreshed(&self, term: u64) {
        self.refreshed_term.store(term, std::sync::atomic::Ordering::Release);
        self.settled.notify_waiters();
    }

    /// Whether this node can serve now: a leader is known, and this node has applied what it
    /// knows to be committed (within [`MAX_READY_APPLY_LAG`] entries); a leader, moreover, has
    /// applied an entry of its own term (before that it cannot know what its predecessor
    /// committed) and heard from a quorum within its lease. A ready follower answers writes
    /// and reads with the leader's address (421), as every follower does; it names a leader
    /// that was just lost until the next election settles. Liveness is another question: a
    /// node that is not ready is still alive.
    ///
    /// # Errors
    /// Why it cannot serve yet.
    pub fn readiness(&self) -> Result<(), NotReady> {
        let metrics = self.raft.metrics();
        let metrics = metrics.borrow_watched();
        if metrics.current_leader.is_none() {
            return Err(NotReady::NoLeader);
        }
        // Only a removed leader names itself while outside the membership: a node joining
        // names the leader that adds it before it sees its own entry, and a removed follower
        // knows no leader (it campaigns, and nobody answers).
        if metrics.current_leader == Some(self.id)
            && metrics.membership_config.membership().get_node(&self.id).is_none()
        {
            return Err(NotReady::Removed);
        }
        if metrics.state == ServerState::Leader {
            if self.refreshed_term.load(std::sync::atomic::Ordering::Acquire)
                != metrics.current_term
            {
                return Err(NotReady::LeaderNotSettled);
            }
            // A leader alone in its cluster is its own quorum; openraft reports no time then.
            let quorum_age = metrics
                .last_quorum_acked
                .as_ref()
                .map(|acked| openraft::Instant::elapsed(&**acked));
            let alone = metrics.membership_config.membership().voter_ids().count() == 1;
            if !alone && quorum_age.is_none_or(|age| age > self.leader_lease) {
                return Err(NotReady::NoQuorum);
            }
        }
        // Under load the state trails the commit index by the entries in flight to it; a node
        // is catching up only when it trails by more than that.
        let applied = metrics.last_applied.map_or(0, |log_id| log_id.index());
        let committed = metrics.local_committed.map_or(0, |log_id| log_id.index());
        if committed.saturating_sub(applied) > MAX_READY_APPLY_LAG {
            return Err(NotReady::CatchingUp);
        }
        Ok(())
    }

    /// Reads the applied state of this node, without any consistency check.
    pub fn read_local<T>(&self, read: impl FnOnce(&AppliedState) -> T) -> T {
        read(&self.store.read())
    }

    /// Proposes a command stamped with this node's clock and returns what applying it did.
    ///
    /// A command that would be refused is refused here without reaching the log, when the
    /// refusal is sure (see `Node::refusal_before_log`).
    ///
    /// # Errors
    /// That refusal as [`ServiceError::Command`]; [`ServiceError::NotLeader`] on a follower, and
    /// the other cluster-level failures. A command the state machine refused at apply is *not*
    /// an error here (see [`Node::command`]).
    pub async fn propose(&self, command: Command) -> Result<picket_core::Applied, ServiceError> {
        self.propose_as(None, command).await
    }

    /// [`Node::propose`] on behalf of `principal`, which must own the session the command uses.
    ///
    /// # Errors
    /// As [`Node::propose`].
    pub async fn propose_as(
        &self,
        principal: Option<String>,
        command: Command,
    ) -> Result<picket_core::Applied, ServiceError> {
        let input = Input::new(self.clock.now_ms(), command).sent_by(principal);
        self.submit(input.under_rules(self.writing_rules())).await
    }

    /// Proposes a command stamped with a clock reading taken earlier (a tick's, taken with the
    /// keepalives it carries), under the apply rules it was made for.
    pub(crate) async fn propose_at(
        &self,
        now_ms: u64,
        (rules, command): (u32, Command),
    ) -> Result<picket_core::Applied, ServiceError> {
        self.submit(Input::new(now_ms, command).under_rules(rules)).await
    }

    async fn submit(&self, input: Input) -> Result<picket_core::Applied, ServiceError> {
        if input.rules < input.command.oldest_rules() {
            // The members' rules dropped since the caller looked: an entry an older build may
            // not even read never goes to the log.
            let refusal = self.read_local(|state| {
                state.machine.validate_under(&input.command, input.rules).err()
            });
            if let Some(refusal) = refusal {
                return Err(ServiceError::Command(refusal));
            }
        }
        let (request, retry) = match &input.command {
            Command::Acquire { session, request, attempt, .. } => {
                (Some((*session, *request)), *attempt > 0)
            }
            _ => (None, false),
        };
        let (mut earlier_in_flight, mut proposal) = self.in_flight.begin(request);
        let refused_now = || {
            self.read_local(|state| state.machine.validate_under(&input.command, input.rules))
                .is_err()
        };
        if earlier_in_flight && retry && refused_now() {
            // Its answer depends on the earlier attempt: once that is applied, the state has it.
            // (A retry the state accepts goes to the log at once.)
            earlier_in_flight = !proposal.wait_for_earlier(SETTLE_WAIT).await;
        }
        if let Some(refusal) = self.refusal_before_log(&input, earlier_in_flight).await {
            self.metrics().refused(refusal.code(), "before_log");
            return Err(refusal);
        }
        proposal.handed_over();
        // Boxed: openraft's write is a future of nearly 3 KB, which inline would make every
        // caller up to the connection's call that much larger, copied at each level as a
        // request starts; a box is one allocation instead.
        let written = Box::pin(self.raft.client_write(input)).await;
        match &written {
            Ok(_) => proposal.applied(),
            // Refused before it was appended: not in the log, so not unsure.
            Err(RaftError::APIError(ClientWriteError::ForwardToLeader(_))) => {
                proposal.not_appended();
            }
            Err(_) => {}
        }
        match written {
            Ok(response) => match response.data {
                EntryReply::Applied(applied) => Ok(applied),
                EntryReply::None => {
                    Err(ServiceError::Stopped("a command was applied as a blank entry".into()))
                }
            },
            Err(RaftError::APIError(ClientWriteError::ForwardToLeader(forward))) => {
                Err(not_leader(&forward))
            }
            Err(RaftError::APIError(ClientWriteError::LogEntryDiscarded(forward))) => {
                Err(ServiceError::OutcomeUnknown(format!(
                    "leadership moved to {:?}",
                    forward.leader_id
                )))
            }
            Err(RaftError::APIError(other)) => Err(ServiceError::Unavailable(other.to_string())),
            Err(RaftError::Fatal(fatal)) => Err(ServiceError::Stopped(fatal.to_string())),
        }
    }

    /// The answer to give instead of writing `command` to the log, if any: a refusal, or, when
    /// a leader not yet settled cannot decide, a request to retry shortly.
    ///
    /// Any node refuses what no later entry could overturn (bad input, a session that ended for
    /// good). A settled leader (it applied its own term's `Refresh`) refuses anything else its
    /// state refuses once its lease check has also waited until it applied everything committed
    /// so far: every outcome any node told a client (a proposal's reply, a waiting acquire's
    /// grant, a watch event) was committed before, so the refusal is a linearizable answer.
    /// Not decided early, so written undecided: `Abandon`, which must follow the acquire it
    /// undoes even while that acquire is in flight (and which the state accepts even when it
    /// finds nothing), unless it names a session the state does not know, which is decided
    /// like any other refusal; the leader's `Tick` and `Refresh`; and a retried acquire (attempt above
    /// 0) while an earlier proposal of its request may still be on its way to the log
    /// (`earlier_in_flight`, see [`in_flight`]; `submit` first waits up to a second for it),
    /// which could grant it. That retry must be written: it is what settles the order (on a
    /// quiet leader no other write may come), and answering it `unavailable` instead left a
    /// retrying client without the earlier attempt's grant. A leader elected a moment ago
    /// first waits (up to a second) for its `Refresh`, which applies everything its
    /// predecessors committed, and answers `unavailable` if it has not settled by then; as
    /// does a leader whose lease check finds no quorum, or whose term changed while deciding.
    /// A node that does not lead passes the command on to Raft, which names the leader.
    async fn refusal_before_log(
        &self,
        input: &Input,
        earlier_in_flight: bool,
    ) -> Option<ServiceError> {
        let (command, rules) = (&input.command, input.rules);
        let (refusal, lasts) = self.read_local(|state| {
            let refusal = state.machine.validate_under(command, rules).err()?;
            let lasts = state.machine.refusal_lasts(&refusal);
            Some((refusal, lasts))
        })?;
        if lasts {
            return Some(ServiceError::Command(refusal));
        }
        // An abandon is written even when it finds nothing (it refuses a later attempt), so
        // its other refusals are the apply's to decide; but one of a session this node has not
        // seen is decided on the settled state, like any other: a session no settled leader
        // has applied was never told to a client, so nothing was asked in it, and the entry
        // would only be refused at apply (found in review: `session_id` 2^64 − 1 wrote one
        // entry per request).
        let ordered = match command {
            Command::Abandon { .. } => {
                !matches!(refusal, picket_core::CommandError::UnknownSession { .. })
            }
            Command::Tick { .. } | Command::Refresh => true,
            Command::Acquire { attempt, .. } => *attempt > 0 && earlier_in_flight,
            _ => false,
        };
        if ordered {
            return None;
        }
        // Boxed: the waits below (to settle, the lease check) come only with a refusal, and
        // inline their future of several KB would make every proposal's that much larger.
        Box::pin(self.refusal_on_settled_state(command, rules)).await
    }

    /// The second half of [`Node::refusal_before_log`], for a refusal the state may yet
    /// overturn: decided again once this node settled as leader and applied everything
    /// committed before the call.
    async fn refusal_on_settled_state(
        &self,
        command: &Command,
        rules: u32,
    ) -> Option<ServiceError> {
        let term = match self.settled_term() {
            Some(term) => term,
            None => match self.settle().await {
                Some(term) => term,
                // Not leading: the write goes on to Raft, which names the leader.
                None if !self.is_leader() => return None,
                None => {
                    return Some(ServiceError::Unavailable(
                        "this node was elected leader a moment ago and has not yet applied \
                         what its predecessors committed"
                            .into(),
                    ));
                }
            },
        };
        // LeaseRead confirms leadership and waits until this node applied every entry committed
        // before the call; decide again on that state, in the same term.
        match self.ensure_leader(ReadPolicy::LeaseRead).await {
            Ok(()) => {}
            Err(ServiceError::NotLeader { .. }) => return None,
            Err(error) => return Some(error),
        }
        let refusal =
            self.read_local(|state| state.machine.validate_under(command, rules).err())?;
        if self.settled_term() == Some(term) {
            Some(ServiceError::Command(refusal))
        } else if self.is_leader() {
            Some(ServiceError::Unavailable("leadership changed while deciding".into()))
        } else {
            None
        }
    }

    /// Whether this node leads now (by its Raft metrics).
    fn is_leader(&self) -> bool {
        self.raft.metrics().borrow_watched().state == ServerState::Leader
    }

    /// Waits, at most [`SETTLE_WAIT`], for this node to settle as leader (have its own term's
    /// `Refresh` applied); returns the term it settled in, or `None` if it is no leader or did
    /// not settle in time.
    async fn settle(&self) -> Option<u64> {
        let deadline = tokio::time::Instant::now() + SETTLE_WAIT;
        loop {
            let settled = self.settled.notified();
            tokio::pin!(settled);
            // Registered before the look, so a `Refresh` applied between the two still wakes it.
            settled.as_mut().enable();
            if let Some(term) = self.settled_term() {
                return Some(term);
            }
            if self.raft.metrics().borrow_watched().state != ServerState::Leader {
                return None;
            }
            tokio::time::timeout_at(deadline, settled).await.ok()?;
        }
    }

    /// The term in which this node leads and has applied its own `Refresh`, if it does.
    pub(crate) fn settled_term(&self) -> Option<u64> {
        let metrics = self.raft.metrics();
        let metrics = metrics.borrow_watched();
        let refreshed = self.refreshed_term.load(std::sync::atomic::Ordering::Acquire);
        (metrics.state == ServerState::Leader && refreshed == metrics.current_term)
            .then_some(metrics.current_term)
    }

    /// Proposes a command and returns the state machine's response, or its refusal as an error.
    ///
    /// # Errors
    /// [`ServiceError::Command`] when refused, and everything [`Node::propose`] returns.
    pub async fn command(&self, command: Command) -> Result<Response, ServiceError> {
        Ok(self.propose(command).await?.result?)
    }

    /// [`Node::command`] on behalf of `principal` (see [`Node::propose_as`]).
    ///
    /// # Errors
    /// As [`Node::command`].
    pub async fn command_as(
        &self,
        principal: Option<&str>,
        command: Command,
    ) -> Result<Response, ServiceError> {
        Ok(self.propose_as(principal.map(str::to_owned), command).await?.result?)
    }

    /// Confirms leadership with a quorum and waits until the local state has applied everything
    /// committed before this call, then reads it. The read is linearizable.
    ///
    /// # Errors
    /// [`ServiceError::NotLeader`] on a follower, [`ServiceError::Unavailable`] without quorum.
    pub async fn read_linearizable<T>(
        &self,
        read: impl FnOnce(&AppliedState) -> T,
    ) -> Result<T, ServiceError> {
        self.ensure_leader(ReadPolicy::ReadIndex).await?;
        Ok(self.read_local(read))
    }

    async fn ensure_leader(&self, policy: ReadPolicy) -> Result<(), ServiceError> {
        match self.raft.ensure_linearizable(policy).await {
            Ok(_) => Ok(()),
            Err(RaftError::APIError(LinearizableReadError::ForwardToLeader(forward))) => {
                Err(not_leader(&forward))
            }
            Err(RaftError::APIError(other)) => Err(ServiceError::Unavailable(other.to_string())),
            Err(RaftError::Fatal(fatal)) => Err(ServiceError::Stopped(fatal.to_string())),
        }
    }
}

fn unexpected(response: &Response) -> ServiceError {
    ServiceError::Stopped(format!("unexpected response from the state machine: {response:?}"))
}
