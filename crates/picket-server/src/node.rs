//! One Picket node: the operations the APIs offer, on top of Raft and the applied state.
//!
//! Writes become log entries stamped with the leader's clock and applied by every node. Reads
//! are linearizable: the leader confirms its leadership with a quorum (`ReadIndex`) and waits
//! until its state has applied everything committed before it answers. Keepalives do not become
//! log entries: the leader remembers them and folds them into the next tick (see
//! [`crate::driver`]).

use crate::auth::AuthFile;
use crate::clock::{Clock, GapWatch};
use crate::error::ServiceError;
use crate::hub::{Delivery, Hub, Subscription, Target, WaitOutcome, WaiterRegistration};
use crate::limits::{Budget, ServerLimit, ServerLimits};
use crate::log_store::WriterStats;
use crate::raft_types::{NodeId, Raft, Reply};
use crate::renewals::{Noted, Renewals};
use crate::state_machine::{Applied, StateStore};
use openraft::async_runtime::WatchReceiver;
use openraft::error::{ClientWriteError, ForwardToLeader, LinearizableReadError, RaftError};
use openraft::{BasicNode, ReadPolicy, ServerState};
use picket_core::SequencerSigner;
use picket_core::{
    CancelCause, CheckOutcome, Command, CommandError, Event, Input, LockInfo, RequestId, Response,
    Sequencer, SessionId, SessionInfo, Wait,
};
use picket_proto::tls::ClientTls;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

/// Most sessions one batched keepalive may name.
pub const MAX_KEEPALIVE_BATCH: usize = 10_000;
/// How an acquire asks: how long to wait, and which request (and attempt at it) this is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AcquireRequest {
    /// Whether, and how long, to wait.
    pub wait: Wait,
    /// The request's id within the session; `None` for a fresh one. 0 is refused: it is what
    /// acquires logged before request ids existed read as.
    pub request: Option<RequestId>,
    /// 0 for the first attempt at the request, one more for each retry.
    pub attempt: u32,
    /// The principal sending it, when it must own the session (see
    /// [`picket_core::Input::principal`]).
    pub principal: Option<String>,
}

impl AcquireRequest {
    /// A new request (a fresh id, first attempt) that waits as `wait` says.
    #[must_use]
    pub fn new(wait: Wait) -> Self {
        Self { wait, request: None, attempt: 0, principal: None }
    }
}

/// How long the server keeps trying to abandon a request whose caller went away, across
/// leader changes, before it leaves the wait or grant to the session's end.
const ABANDON_RETRY_FOR: std::time::Duration = std::time::Duration::from_secs(30);

/// Whose a session is, for one principal ([`Node::ownership`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ownership {
    /// The principal opened it.
    Owned,
    /// Another principal opened it, or it was opened without authentication.
    Foreign,
    /// No such session any more (or there never was one with this id).
    Ended,
    /// No session has this id yet; a later one may.
    NotYet,
}

/// A lock grant as the APIs return it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Grant {
    /// The lock.
    pub name: String,
    /// Its token.
    pub token: u64,
    /// True when the session already held the lock.
    pub already_held: bool,
    /// Its sequencer, signed when the node has a signing key.
    pub sequencer: String,
}

/// What a watch follows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WatchTarget {
    /// One lock.
    Lock(String),
    /// Every lock whose name starts with this.
    Prefix(String),
    /// Everything that happens to one session.
    Session(SessionId),
    /// Everything that happens to any of these sessions.
    Sessions(Vec<SessionId>),
    /// Only the losses of these sessions: grants ended by anything but their holder's release,
    /// and the sessions' ends.
    SessionLosses(Vec<SessionId>),
}

/// Most sessions one watch may follow.
pub const MAX_WATCHED_SESSIONS: usize = 10_000;

impl WatchTarget {
    fn into_hub_target(self) -> Target {
        match self {
            Self::Lock(name) => Target::Lock(name),
            Self::Prefix(prefix) => Target::Prefix(prefix),
            Self::Session(session) => Target::Session(session),
            Self::Sessions(sessions) => Target::Sessions(sessions),
            Self::SessionLosses(sessions) => Target::SessionLosses(sessions),
        }
    }
}

/// A watch: events for its target from when it started.
#[derive(Debug)]
pub struct WatchStream {
    subscription: Subscription,
    ended: bool,
    /// Whether the caller may still see this watch, asked again when the auth file changed.
    recheck: Option<Recheck>,
    /// This stream's place under `--max-watch-streams`, given back when it is dropped.
    _place: tokio::sync::OwnedSemaphorePermit,
}

impl WatchStream {
    /// The next item; `None` when the node stops. A watch that fell too far behind ends with an
    /// error: re-read the state and watch again.
    pub async fn next(&mut self) -> Option<Result<WatchItem, ServiceError>> {
        if self.ended {
            return None;
        }
        let delivery = self.subscription.receiver.recv().await;
        // Checked before anything more is delivered: a caller whose credentials were revoked or
        // whose roles no longer cover the target sees nothing after the change.
        if delivery.is_some()
            && let Some(recheck) = &mut self.recheck
            && let Err(error) = recheck.still_allowed()
        {
            self.ended = true;
            return Some(Err(error));
        }
        match delivery {
            Some(Delivery::Event { revision, event }) => {
                Some(Ok(WatchItem::Event { revision, event }))
            }
            Some(Delivery::Resync { revision }) => Some(Ok(WatchItem::Resync { revision })),
            None => {
                self.ended = true;
                self.subscription.fell_behind().then(|| {
                    Err(ServiceError::Unavailable(
                        "the watch fell too far behind and was stopped; re-read the state and watch again".into(),
                    ))
                })
            }
        }
    }
}

impl WatchStream {
    /// Asks `recheck` whether the caller may still see this watch whenever the auth file
    /// changed.
    pub(crate) fn with_recheck(mut self, recheck: Recheck) -> Self {
        self.recheck = Some(recheck);
        self
    }
}

/// Whether a caller may still see a watch, under the auth file as it is now.
pub(crate) type StillAllowed = Box<dyn Fn(&AuthFile) -> Result<(), ServiceError> + Send + Sync>;

/// Whether a watch's caller may still see it, under the auth file as it is now.
pub(crate) struct Recheck {
    auth: Arc<AuthFile>,
    seen: u64,
    allowed: StillAllowed,
}

impl Recheck {
    /// Checks with `allowed` every time the file's generation moved, and once now: a reload
    /// between the caller's authentication and this moment would otherwise go unseen.
    ///
    /// # Errors
    /// What `allowed` refuses now.
    pub(crate) fn new(auth: Arc<AuthFile>, allowed: StillAllowed) -> Result<Self, ServiceError> {
        let seen = auth.generation();
        allowed(&auth)?;
        Ok(Self { auth, seen, allowed })
    }

    fn still_allowed(&mut self) -> Result<(), ServiceError> {
        let now = self.auth.generation();
        if now != self.seen {
            (self.allowed)(&self.auth)?;
            self.seen = now;
        }
        Ok(())
    }
}

impl std::fmt::Debug for Recheck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Recheck").field("seen", &self.seen).finish_non_exhaustive()
    }
}

/// An item of a watch stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WatchItem {
    /// Something happened, at `revision`.
    Event {
        /// The revision of the command that caused it.
        revision: u64,
        /// What happened.
        event: Event,
    },
    /// The state jumped (a snapshot was installed): re-read what you watch.
    Resync {
        /// The revision of the new state.
        revision: u64,
    },
}

/// Membership and leadership as one node sees them.
#[derive(Clone, Debug, PartialEq)]
pub struct ClusterView {
    /// (id, address, voter) of every member.
    pub members: Vec<(NodeId, String, bool)>,
    /// The leader, if known.
    pub leader_id: Option<NodeId>,
    /// The leader's address, if known.
    pub leader_addr: Option<String>,
    /// This node.
    pub node_id: NodeId,
    /// This node's role: leader, follower, candidate, learner or shutdown.
    pub role: &'static str,
    /// The current Raft term.
    pub term: u64,
    /// The last log index this node knows committed.
    pub commit_index: u64,
    /// The lock state's revision on this node.
    pub applied_revision: u64,
    /// The last log index applied on this node.
    pub applied_log_index: u64,
    /// The last log index covered by this node's snapshot, 0 if none.
    pub snapshot_log_index: u64,
    /// The last log index this node has purged from its log, 0 if none.
    pub purged_log_index: u64,
    /// How many times this node saw its clock or its process lose time (a stall or a jump)
    /// since it started; see [`crate::clock`].
    pub clock_gaps_total: u64,
    /// The factor this node's clock runs at against its source: 1 unless, as leader, its peers
    /// found its clock fast or slow against theirs (see [`crate::rate`]).
    pub clock_rate_factor: f64,
    /// As leader, each voter's clock rate against this node's clock, once known (see
    /// [`crate::rate`]); empty on a follower.
    pub peer_clock_rates: BTreeMap<NodeId, f64>,
}

/// Most members (voters and learners) a cluster may have.
pub const MAX_MEMBERS: usize = 32;
/// Longest member address.
pub const MAX_MEMBER_ADDR_BYTES: usize = 256;

/// One running node. Shared by the API front ends and the leader's background duties.
#[derive(Debug)]
pub struct Node {
    id: NodeId,
    raft: Raft,
    store: StateStore,
    clock: Arc<Clock>,
    /// Written by the leader's rate check, read by `cluster()`.
    peer_clock_rates: std::sync::Mutex<BTreeMap<NodeId, f64>>,
    gaps: GapWatch,
    renewals: Renewals,
    /// Places for watch streams and for acquire requests in flight ([`ServerLimits`]).
    watch_streams: Budget,
    pending_acquires: Budget,
    log_stats: Arc<WriterStats>,
    /// The term in which this node, as leader, last had its `Refresh` applied: from then on it
    /// has committed and applied an entry of its own term.
    refreshed_term: std::sync::atomic::AtomicU64,
    /// How long a leader may go without hearing from a quorum before it is not ready.
    leader_lease: std::time::Duration,
    /// TLS for this node's calls to its peers, when the cluster runs TLS.
    to_peers: Option<ClientTls>,
    /// Signs every grant's sequencer, when the cluster has a signing key.
    signer: Option<Arc<SequencerSigner>>,
    /// The principals that may use this node; `None` lets anyone do anything.
    auth: Option<Arc<AuthFile>>,
}

/// How long a keepalive that reached the leader after its session's deadline waits for the
/// tick that decides whether the session survived.
const KEEPALIVE_CONFIRM_TIMEOUT: Duration = Duration::from_secs(2);

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
        Self {
            id,
            raft,
            store,
            clock,
            peer_clock_rates: std::sync::Mutex::default(),
            gaps: GapWatch::default(),
            renewals: Renewals::default(),
            watch_streams: Budget::new(ServerLimit::WatchStreams, limits.max_watch_streams),
            pending_acquires: Budget::new(
                ServerLimit::PendingAcquires,
                limits.max_pending_acquires,
            ),
            log_stats,
            refreshed_term: std::sync::atomic::AtomicU64::new(0),
            leader_lease,
            to_peers: None,
            signer: None,
            auth: None,
        }
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
    pub fn raft(&self) -> &Raft {
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

    /// The watch for stalls and clock jumps.
    pub(crate) fn gaps(&self) -> &GapWatch {
        &self.gaps
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

    /// Records that this node, leading in `term`, had its `Refresh` applied.
    pub(crate) fn mark_refreshed(&self, term: u64) {
        self.refreshed_term.store(term, std::sync::atomic::Ordering::Release);
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
    pub fn read_local<T>(&self, read: impl FnOnce(&Applied) -> T) -> T {
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
        self.submit(Input { now_ms: self.clock.now_ms(), command, principal }).await
    }

    /// Proposes a command stamped with a clock reading taken earlier (a tick's, taken with the
    /// keepalives it carries).
    pub(crate) async fn propose_at(
        &self,
        now_ms: u64,
        command: Command,
    ) -> Result<picket_core::Applied, ServiceError> {
        self.submit(Input::new(now_ms, command)).await
    }

    async fn submit(&self, input: Input) -> Result<picket_core::Applied, ServiceError> {
        if let Some(refusal) = self.refusal_before_log(&input.command).await {
            self.metrics().refused(refusal.code(), "before_log");
            return Err(ServiceError::Command(refusal));
        }
        match self.raft.client_write(input).await {
            Ok(response) => match response.data {
                Reply::Applied(applied) => Ok(applied),
                Reply::None => {
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

    /// The refusal of `command` to answer without writing it to the log, if any.
    ///
    /// Any node refuses what no later entry could overturn (bad input, a session that ended for
    /// good). A settled leader (it applied its own term's `Refresh`) refuses anything else its
    /// state refuses once its lease check has also waited until it applied everything committed
    /// so far: every outcome any node told a client (a proposal's reply, a waiting acquire's
    /// grant, a watch event) was committed before, so the refusal is a linearizable answer.
    /// Never refused early: `Abandon`, which must follow the acquire it undoes even while that
    /// acquire is in flight; a retried acquire (attempt above 0), whose first attempt may be in
    /// flight and grant it; and the leader's own ticks.
    async fn refusal_before_log(&self, command: &Command) -> Option<CommandError> {
        let (refusal, lasts) = self.read_local(|state| {
            let refusal = state.machine.validate(command).err()?;
            let lasts = state.machine.refusal_lasts(&refusal);
            Some((refusal, lasts))
        })?;
        if lasts {
            return Some(refusal);
        }
        let ordered =
            matches!(command, Command::Abandon { .. } | Command::Tick { .. } | Command::Refresh)
                || matches!(command, Command::Acquire { attempt, .. } if *attempt > 0);
        let term = self.settled_term();
        if ordered || term.is_none() {
            return None;
        }
        // LeaseRead confirms leadership and waits until this node applied every entry committed
        // before the call; decide again on that state, in the same term.
        self.ensure_leader(ReadPolicy::LeaseRead).await.ok()?;
        let refusal = self.read_local(|state| state.machine.validate(command).err())?;
        (self.settled_term() == term).then_some(refusal)
    }

    /// The term in which this node leads and has applied its own `Refresh`, if it does.
    fn settled_term(&self) -> Option<u64> {
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
        read: impl FnOnce(&Applied) -> T,
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

    /// Opens a session; returns its id and TTL.
    ///
    /// # Errors
    /// A refusal (TTL out of range, too many sessions) or a cluster failure.
    pub async fn open_session(
        &self,
        ttl_ms: u64,
        lock_delay_ms: u64,
        owner: Option<String>,
    ) -> Result<(SessionId, u64), ServiceError> {
        match self.command(Command::OpenSession { ttl_ms, lock_delay_ms, owner }).await? {
            Response::SessionOpened { session, ttl_ms, .. } => Ok((session, ttl_ms)),
            other => Err(unexpected(&other)),
        }
    }

    /// Keeps a session alive: it gets a full TTL from the next tick. No log entry is written
    /// for it; the leader batches keepalives into the tick that would otherwise expire them.
    /// Once answered, the session is not expired before a TTL from now by the leader's clock
    /// (see [`crate::renewals`]).
    ///
    /// The leader first confirms it still holds its leader lease, so a deposed leader never
    /// confirms a keepalive the new leader will not honour.
    ///
    /// # Errors
    /// [`CommandError::UnknownSession`] when the session is gone; cluster failures.
    pub async fn keep_alive(
        &self,
        session: SessionId,
        principal: Option<&str>,
    ) -> Result<u64, ServiceError> {
        let ttls = self.keep_alive_many(&[session], principal).await?;
        ttls.first().copied().flatten().ok_or(CommandError::UnknownSession { session }.into())
    }

    /// Keeps many sessions alive at once: one leadership check for all of them. Returns each
    /// session's TTL, or `None` for a session that does not exist.
    ///
    /// # Errors
    /// Cluster failures, or more sessions than [`MAX_KEEPALIVE_BATCH`].
    pub async fn keep_alive_many(
        &self,
        sessions: &[SessionId],
        principal: Option<&str>,
    ) -> Result<Vec<Option<u64>>, ServiceError> {
        if sessions.len() > MAX_KEEPALIVE_BATCH {
            return Err(ServiceError::BadRequest(format!(
                "{} sessions in one keepalive; send at most {MAX_KEEPALIVE_BATCH}",
                sessions.len()
            )));
        }
        // A session `principal` did not open is, to it, a session that does not exist: never
        // renewed, answered as unknown, decided on the same reading as the lease.
        let leases = |sessions: &[SessionId]| {
            self.read_local(|state| {
                let machine = &state.machine;
                let visible = |session: SessionId| {
                    principal.is_none_or(|principal| {
                        machine.session_owner(session) == Some(Some(principal))
                    })
                };
                sessions
                    .iter()
                    .map(|session| machine.session_lease(*session).filter(|_| visible(*session)))
                    .collect()
            })
        };
        // Noted on arrival, so a tick taken while the lease check below waits carries it.
        self.renewals.note_arrival(&self.clock, sessions, leases);
        self.ensure_leader(ReadPolicy::LeaseRead).await?;
        let noted = self.renewals.note(&self.clock, sessions, leases);
        let wait_for = noted.iter().filter_map(|answer| match answer {
            Noted::AfterBatch(batch) => Some(*batch),
            Noted::Alive { .. } | Noted::Unknown => None,
        });
        if let Some(batch) = wait_for.max() {
            // A session past its deadline on the applied state is answered only once a tick that
            // carries its keepalive has been applied: the tick renews it if it was still alive by
            // the tick's reading, and expires it otherwise.
            tokio::time::timeout(KEEPALIVE_CONFIRM_TIMEOUT, self.renewals.wait_written(batch))
                .await
                .map_err(|_| {
                    ServiceError::Unavailable(format!(
                        "the keepalive reached the leader after its session's deadline and no \
                         tick confirmed it within {} ms: retry",
                        KEEPALIVE_CONFIRM_TIMEOUT.as_millis()
                    ))
                })?;
        }
        let now_leases = leases(sessions);
        Ok(noted
            .iter()
            .zip(now_leases)
            .map(|(answer, lease)| match answer {
                Noted::Alive { ttl_ms } => Some(*ttl_ms),
                Noted::AfterBatch(_) => lease.map(|lease| lease.ttl_ms),
                Noted::Unknown => None,
            })
            .collect())
    }

    /// Closes a session at its client's request.
    ///
    /// # Errors
    /// [`CommandError::UnknownSession`]; cluster failures.
    pub async fn close_session(
        &self,
        session: SessionId,
        principal: Option<&str>,
    ) -> Result<(), ServiceError> {
        self.command_as(principal, Command::CloseSession { session }).await.map(|_| ())
    }

    /// Ends a session as an expiry would, at an operator's request.
    ///
    /// # Errors
    /// [`CommandError::UnknownSession`]; cluster failures.
    pub async fn revoke_session(&self, session: SessionId) -> Result<(), ServiceError> {
        self.command(Command::RevokeSession { session }).await.map(|_| ())
    }

    /// Acquires a lock, waiting as `wait` says, as `request` of the session (a fresh request id
    /// when the caller gives none; a retry must give the id of the request it retries).
    ///
    /// If the caller goes away before it has the answer (the returned future is dropped), or
    /// the answer is lost with the leadership, the request is abandoned: one `Abandon` command
    /// cancels its wait or releases the grant it produced, and nothing of any other request.
    /// A request this node refused before proposing it (not the leader) leaves nothing behind.
    ///
    /// # Errors
    /// [`CommandError::LockBusy`] for a try on a taken lock, [`ServiceError::WaitTimedOut`],
    /// [`ServiceError::WaitEnded`], refusals and cluster failures.
    pub async fn acquire(
        self: &Arc<Self>,
        session: SessionId,
        name: &str,
        asked: AcquireRequest,
    ) -> Result<Grant, ServiceError> {
        if asked.request == Some(RequestId(0)) {
            return Err(ServiceError::BadRequest(
                "request_id 0 is reserved: give a positive request id, or none for a fresh one"
                    .into(),
            ));
        }
        let AcquireRequest { wait, attempt, principal, .. } = asked;
        let request = asked.request.unwrap_or_else(fresh_request_id);
        let place = self.pending_acquires.take()?;
        let registration = self.hub().register_waiter(session, name, request);
        let mut guard = AcquireGuard {
            _place: place,
            node: self.clone(),
            session,
            name: name.to_owned(),
            request,
            attempt,
            registration: registration.id,
            settled: false,
        };
        let result = self
            .acquire_registered(session, name, wait, (request, attempt), registration, principal)
            .await;
        // Only an answer whose outcome is unknown leaves something to undo; a refusal, a
        // timeout and a grant are all known to the caller.
        guard.settled = !matches!(
            result,
            Err(ServiceError::Unavailable(_)
                | ServiceError::OutcomeUnknown(_)
                | ServiceError::Stopped(_)
                | ServiceError::WaitUntracked { .. })
        );
        result
    }

    async fn acquire_registered(
        &self,
        session: SessionId,
        name: &str,
        wait: Wait,
        (request, attempt): (RequestId, u32),
        registration: WaiterRegistration,
        principal: Option<String>,
    ) -> Result<Grant, ServiceError> {
        let arrived = std::time::Instant::now();
        let command = Command::Acquire { session, name: name.to_owned(), wait, request, attempt };
        let applied = self.propose_as(principal, command).await?;
        match applied.result? {
            Response::Granted { name, token, already_held } => {
                let sequencer = self.sequencer(&name, token, session);
                return Ok(Grant { name, token, already_held, sequencer });
            }
            Response::Queued { .. } => {}
            other => return Err(unexpected(&other)),
        }
        // Only what happens after this acquire was queued ends its wait.
        self.hub().queued(session, name, registration.id, applied.revision);
        match registration.outcome.await {
            Ok(WaitOutcome::Granted { token }) => {
                self.metrics().acquire_waited(arrived.elapsed());
                let sequencer = self.sequencer(name, token, session);
                Ok(Grant { name: name.to_owned(), token, already_held: false, sequencer })
            }
            Ok(WaitOutcome::Cancelled { cause: CancelCause::TimedOut }) => {
                Err(ServiceError::WaitTimedOut {
                    name: name.to_owned(),
                    holder_token: self.read_local(|state| {
                        state
                            .machine
                            .lock(name)
                            .and_then(|lock| lock.holder)
                            .map(|holder| holder.token)
                    }),
                })
            }
            Ok(WaitOutcome::Cancelled { cause }) => {
                Err(ServiceError::WaitEnded { name: name.to_owned(), cause })
            }
            Err(_) => Err(ServiceError::WaitUntracked { name: name.to_owned() }),
        }
    }

    /// Undoes attempt `attempt` of acquire `request` on this node (it must lead): cancels its
    /// wait or releases the grant it produced; returns the released grant's token, `None` when
    /// a wait was cancelled.
    ///
    /// # Errors
    /// [`CommandError::NothingToAbandon`] when the request has no wait or grant (or a later
    /// attempt reached it since); cluster failures.
    pub async fn abandon(
        &self,
        session: SessionId,
        name: &str,
        request: RequestId,
        attempt: u32,
        principal: Option<&str>,
    ) -> Result<Option<u64>, ServiceError> {
        let command = Command::Abandon { session, name: name.to_owned(), request, attempt };
        match self.command_as(principal, command).await? {
            Response::Abandoned { released_token, .. } => Ok(released_token),
            other => Err(unexpected(&other)),
        }
    }

    /// Abandons a request wherever the leader is: here, or forwarded to the leader this node
    /// names, retried across leader changes for [`ABANDON_RETRY_FOR`]. Returns what the
    /// abandon did, or the last failure.
    async fn abandon_on_leader(
        &self,
        session: SessionId,
        name: &str,
        (request, attempt): (RequestId, u32),
    ) -> Result<Option<u64>, ServiceError> {
        let deadline = tokio::time::Instant::now() + ABANDON_RETRY_FOR;
        let mut pause = std::time::Duration::from_millis(50);
        loop {
            let result = match self.abandon(session, name, request, attempt, None).await {
                Err(ServiceError::NotLeader { leader_addr: Some(addr), .. }) => {
                    forward_abandon(&addr, self.to_peers(), session, name, (request, attempt)).await
                }
                other => other,
            };
            let retry = matches!(
                result,
                Err(ServiceError::NotLeader { .. }
                    | ServiceError::Unavailable(_)
                    | ServiceError::OutcomeUnknown(_))
            );
            if !retry || tokio::time::Instant::now() + pause > deadline {
                return result;
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(std::time::Duration::from_secs(1));
        }
    }

    /// Releases a grant.
    ///
    /// # Errors
    /// [`CommandError::NotHeld`] or [`CommandError::TokenMismatch`]; cluster failures.
    pub async fn release(
        &self,
        session: SessionId,
        name: &str,
        token: u64,
        principal: Option<&str>,
    ) -> Result<(), ServiceError> {
        let command = Command::Release { session, name: name.to_owned(), token };
        self.command_as(principal, command).await.map(|_| ())
    }

    /// Leaves a lock's queue.
    ///
    /// # Errors
    /// [`CommandError::NotWaiting`]; cluster failures.
    pub async fn cancel(
        &self,
        session: SessionId,
        name: &str,
        principal: Option<&str>,
    ) -> Result<(), ServiceError> {
        self.command_as(principal, Command::Cancel { session, name: name.to_owned() })
            .await
            .map(|_| ())
    }

    /// The state of one lock (linearizable). A lock nobody holds or waits for is reported free.
    ///
    /// # Errors
    /// An invalid name; cluster failures.
    pub async fn lock(&self, name: &str) -> Result<LockInfo, ServiceError> {
        self.lock_at(name).await.map(|(info, _)| info)
    }

    /// [`Node::lock`] with the revision it was read at. A lock nobody holds, awaits or is
    /// delayed on keeps no record (the state stays bounded), so its last token is not known;
    /// every token it ever had is at most this revision, and any later grant's is above it.
    ///
    /// # Errors
    /// As [`Node::lock`].
    pub async fn lock_at(&self, name: &str) -> Result<(LockInfo, u64), ServiceError> {
        let limits = self.read_local(|state| state.machine.limits().clone());
        picket_core::validate_name(name, &limits).map_err(CommandError::InvalidName)?;
        let (info, revision) = self
            .read_linearizable(|state| (state.machine.lock(name), state.machine.revision()))
            .await?;
        let info = info.unwrap_or(LockInfo {
            name: name.to_owned(),
            holder: None,
            waiters: Vec::new(),
            delayed_until_ms: None,
        });
        Ok((info, revision))
    }

    /// Locks by prefix (linearizable).
    ///
    /// # Errors
    /// Cluster failures.
    pub async fn locks(
        &self,
        prefix: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<LockInfo>, ServiceError> {
        self.read_linearizable(|state| state.machine.locks(prefix, after, limit)).await
    }

    /// Sessions (linearizable), only those `owner` opened when given.
    ///
    /// # Errors
    /// Cluster failures.
    pub async fn sessions(
        &self,
        owner: Option<&str>,
        after: Option<SessionId>,
        limit: usize,
    ) -> Result<Vec<SessionInfo>, ServiceError> {
        self.read_linearizable(|state| state.machine.sessions_of(owner, after, limit)).await
    }

    /// Whose `session` is, for `principal`, as this node's applied state has it. A session's
    /// owner never changes, so any replica that knows the session knows its owner; and session
    /// ids are revisions, never reused, so an unknown id at or below the applied revision is
    /// no session any more, while one above it may yet become anyone's.
    #[must_use]
    pub fn ownership(&self, session: SessionId, principal: &str) -> Ownership {
        self.read_local(|state| match state.machine.session_owner(session) {
            Some(owner) if owner == Some(principal) => Ownership::Owned,
            Some(_) => Ownership::Foreign,
            None if session.0 <= state.machine.revision() => Ownership::Ended,
            None => Ownership::NotYet,
        })
    }

    /// Whether a sequencer names its lock's current grant (linearizable), and the sequencer's
    /// token.
    ///
    /// # Errors
    /// A malformed sequencer; cluster failures.
    pub async fn check(&self, sequencer: &str) -> Result<(CheckOutcome, u64), ServiceError> {
        let sequencer = Sequencer::parse(sequencer)
            .map_err(|error| ServiceError::BadRequest(error.to_string()))?;
        // A signed sequencer is checked against its signature too, where this node holds the key
        // that made it: one with an altered session (or anything else) is no grant at all.
        if let Some(Err(error)) =
            self.signer.as_ref().and_then(|signer| signer.verify_own(&sequencer))
        {
            return Err(ServiceError::BadRequest(error.to_string()));
        }
        let outcome = self.read_linearizable(|state| state.machine.check(&sequencer)).await?;
        Ok((outcome, sequencer.token))
    }

    /// Streams events for `target` from now on. The stream ends with an error if the reader falls
    /// too far behind; it then has to re-read the state and watch again.
    ///
    /// # Errors
    /// [`ServiceError::Exhausted`] when this node has as many watch streams as it allows.
    pub fn watch(&self, target: WatchTarget) -> Result<WatchStream, ServiceError> {
        let place = self.watch_streams.take()?;
        let subscription = self.hub().watch(target.into_hub_target());
        Ok(WatchStream { subscription, ended: false, recheck: None, _place: place })
    }

    /// A backup of the lock state (see [`crate::backup`]): linearizable, so it holds every
    /// grant any client was told of before the call.
    ///
    /// # Errors
    /// On a follower ([`ServiceError::NotLeader`]), and when no quorum answers.
    pub async fn backup(&self) -> Result<Vec<u8>, ServiceError> {
        let taken_unix_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |since| u64::try_from(since.as_millis()).unwrap_or(u64::MAX));
        let node_id = self.id;
        self.read_linearizable(|state| {
            let meta = crate::backup::BackupMeta {
                revision: state.machine.revision(),
                log_index: state.last_applied.map_or(0, |log_id| log_id.index()),
                node_id,
                taken_unix_ms,
                sessions: state.machine.session_count(),
                locks: state.machine.lock_count(),
            };
            crate::backup::encode(&meta, &state.machine.snapshot())
        })
        .await
    }

    /// This node's metrics.
    #[must_use]
    pub fn metrics(&self) -> &Arc<crate::metrics::Metrics> {
        self.store.metrics()
    }

    /// Every metric in the Prometheus text format, with the gauges read now.
    #[must_use]
    pub fn render_metrics(&self) -> String {
        let raft = self.raft.metrics().borrow_watched().clone();
        let queues = self.metrics().queue_summary(|| {
            self.read_local(|state| state.machine.queue_summary(crate::metrics::QUEUE_DEPTH_TOP))
        });
        let sessions = self.read_local(|state| state.machine.session_count());
        let scrape = crate::metrics::Scrape {
            sessions,
            queues,
            role: role_name(raft.state),
            term: raft.current_term,
            commit_index: raft.local_committed.map_or(0, |log_id| log_id.index()),
            applied_index: raft.last_applied.map_or(0, |log_id| log_id.index()),
            last_log_index: raft.last_log_index.unwrap_or(0),
            members: raft.membership_config.membership().nodes().count(),
            clock_gaps: self.gaps.gaps_total(),
        };
        self.metrics().render(&scrape)
    }

    /// Membership and leadership as this node sees them.
    #[must_use]
    pub fn cluster(&self) -> ClusterView {
        let metrics = self.raft.metrics().borrow_watched().clone();
        let membership = metrics.membership_config.membership();
        let voters: BTreeSet<NodeId> = membership.voter_ids().collect();
        let members: Vec<(NodeId, String, bool)> = membership
            .nodes()
            .map(|(id, node)| (*id, node.addr.clone(), voters.contains(id)))
            .collect();
        let leader_addr = metrics
            .current_leader
            .and_then(|leader| membership.get_node(&leader).map(|node| node.addr.clone()));
        let role = role_name(metrics.state);
        let (applied_revision, applied_log_index) = self.read_local(|state| {
            (state.machine.revision(), state.last_applied.map_or(0, |log_id| log_id.index()))
        });
        ClusterView {
            members,
            leader_id: metrics.current_leader,
            leader_addr,
            node_id: self.id,
            role,
            term: metrics.current_term,
            commit_index: metrics.local_committed.map_or(0, |log_id| log_id.index()),
            applied_revision,
            applied_log_index,
            snapshot_log_index: metrics.snapshot.map_or(0, |log_id| log_id.index()),
            purged_log_index: metrics.purged.map_or(0, |log_id| log_id.index()),
            clock_gaps_total: self.gaps.gaps_total(),
            clock_rate_factor: self.clock.rate_factor(),
            peer_clock_rates: self
                .peer_clock_rates
                .lock()
                .map(|rates| rates.clone())
                .unwrap_or_default(),
        }
    }

    /// Adds a node as a voter: first as a learner until it has caught up, then as a voter.
    ///
    /// # Errors
    /// On a follower, or when the membership change fails.
    pub async fn add_member(
        &self,
        node_id: NodeId,
        addr: String,
    ) -> Result<ClusterView, ServiceError> {
        // Every membership entry lists every member: bounded, so no request can grow one past
        // what the log takes.
        if addr.is_empty()
            || addr.len() > MAX_MEMBER_ADDR_BYTES
            || addr.chars().any(char::is_control)
        {
            return Err(ServiceError::BadRequest(format!(
                "a member's address is 1 to {MAX_MEMBER_ADDR_BYTES} printable bytes, as host:port"
            )));
        }
        let members = self.cluster().members;
        if members.len() >= MAX_MEMBERS && !members.iter().any(|(id, _, _)| *id == node_id) {
            return Err(ServiceError::BadRequest(format!(
                "the cluster already has {MAX_MEMBERS} members, its limit; remove one first"
            )));
        }
        self.raft.add_learner(node_id, BasicNode { addr }, true).await.map_err(membership_error)?;
        let voters: BTreeSet<NodeId> = [node_id].into();
        self.raft
            .change_membership(openraft::ChangeMembers::AddVoterIds(voters), false)
            .await
            .map_err(membership_error)?;
        Ok(self.cluster())
    }

    /// Removes a node from the cluster.
    ///
    /// # Errors
    /// On a follower, or when the membership change fails.
    pub async fn remove_member(&self, node_id: NodeId) -> Result<ClusterView, ServiceError> {
        let voters: BTreeSet<NodeId> = [node_id].into();
        self.raft
            .change_membership(openraft::ChangeMembers::RemoveVoters(voters), false)
            .await
            .map_err(membership_error)?;
        Ok(self.cluster())
    }
}

fn membership_error(
    error: RaftError<
        crate::raft_types::TypeConfig,
        ClientWriteError<crate::raft_types::TypeConfig>,
    >,
) -> ServiceError {
    match error {
        RaftError::APIError(ClientWriteError::ForwardToLeader(forward)) => not_leader(&forward),
        RaftError::APIError(ClientWriteError::ChangeMembershipError(change)) => {
            ServiceError::BadRequest(change.to_string())
        }
        RaftError::APIError(other) => ServiceError::Unavailable(other.to_string()),
        RaftError::Fatal(fatal) => ServiceError::Stopped(fatal.to_string()),
    }
}

fn unexpected(response: &Response) -> ServiceError {
    ServiceError::Stopped(format!("unexpected response from the state machine: {response:?}"))
}

/// A fresh request id for a caller that gave none: random, so it collides with no other
/// request of the session in practice. Randomness is fine here, in the shell: the id enters
/// the log inside the command, and replicas only ever read it from there.
fn fresh_request_id() -> RequestId {
    use std::hash::{BuildHasher, Hasher};
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u64(COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
    RequestId(hasher.finish())
}

/// Sends an abandon to the node at `addr` (the leader, as this node believes).
async fn forward_abandon(
    addr: &str,
    tls: Option<&ClientTls>,
    session: SessionId,
    name: &str,
    (request, attempt): (RequestId, u32),
) -> Result<Option<u64>, ServiceError> {
    use picket_proto::connection::Connection;
    use picket_proto::v1::raft_client::RaftClient;
    const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);
    const MAX_MESSAGE_BYTES: usize = 1 << 20;
    let connection =
        Connection::open(addr, CONNECT_TIMEOUT, MAX_MESSAGE_BYTES, tls).await.map_err(
            |status| ServiceError::Unavailable(format!("leader at {addr}: {}", status.message())),
        )?;
    let origin = connection.origin();
    let mut client = RaftClient::with_origin(connection, origin);
    let message = picket_proto::v1::AbandonRequest {
        name: name.to_owned(),
        session_id: session.0,
        request_id: request.0,
        attempt,
    };
    match client.abandon(message).await {
        Ok(response) => Ok(response.into_inner().released_token),
        Err(status) => {
            let code = status
                .metadata()
                .get(picket_proto::ERROR_CODE_KEY)
                .and_then(|value| value.to_str().ok())
                .unwrap_or_default();
            Err(match code {
                "nothing_to_abandon" => ServiceError::Command(CommandError::NothingToAbandon {
                    name: name.to_owned(),
                    session,
                    request,
                }),
                "unknown_session" => {
                    ServiceError::Command(CommandError::UnknownSession { session })
                }
                "not_leader" => ServiceError::NotLeader { leader_id: None, leader_addr: None },
                _ => ServiceError::Unavailable(format!("leader at {addr}: {}", status.message())),
            })
        }
    }
}

/// Undoes an acquire whose caller went away, or whose answer was lost, before it was settled.
struct AcquireGuard {
    /// The request's place under `--max-pending-acquires`, given back when it is answered.
    _place: tokio::sync::OwnedSemaphorePermit,
    node: Arc<Node>,
    session: SessionId,
    name: String,
    request: RequestId,
    attempt: u32,
    registration: u64,
    settled: bool,
}

impl Drop for AcquireGuard {
    fn drop(&mut self) {
        let retried = self.node.hub().forget_waiter(
            self.session,
            &self.name,
            self.request,
            self.registration,
        );
        // A retry of the same request, waiting on this node, now speaks for it.
        if self.settled || retried {
            return;
        }
        let (node, session) = (self.node.clone(), self.session);
        let name = std::mem::take(&mut self.name);
        let (request, attempt) = (self.request, self.attempt);
        // Drop cannot wait; the abandon runs on its own, on whichever node leads.
        tokio::spawn(async move {
            match node.abandon_on_leader(session, &name, (request, attempt)).await {
                Ok(Some(token)) => {
                    tracing::info!(%session, name, token, %request, attempt, "released a grant whose caller went away");
                }
                Ok(None)
                | Err(ServiceError::Command(
                    CommandError::NothingToAbandon { .. } | CommandError::UnknownSession { .. },
                )) => {}
                Err(error) => {
                    tracing::warn!(%session, name, %request, attempt, %error, "could not abandon an acquire whose caller went away; its wait or grant stays until the session ends");
                }
            }
        });
    }
}

fn role_name(state: ServerState) -> &'static str {
    match state {
        ServerState::Leader => "leader",
        ServerState::Follower => "follower",
        ServerState::Candidate => "candidate",
        ServerState::Learner => "learner",
        ServerState::Shutdown => "shutdown",
    }
}
