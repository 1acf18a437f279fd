//! The leader's duties: bring time into the log.
//!
//! The state machine never reads a clock; time reaches it only in commands the leader proposes.
//! When a node becomes leader it first proposes `Refresh`, which gives every session a full TTL
//! on the new leader's clock (or the longer lease its last renewal gave it, apply rules 6): the new leader cannot know how long ago the old one last heard from
//! each client, and must never expire a session early. After that it sleeps until the state's
//! next deadline (a session, a bounded wait or a lock-delay running out), or until the oldest
//! keepalive received has waited half a second, and then proposes a `Tick` carrying every
//! keepalive received since the last tick, so kept-alive sessions are renewed in the same entry
//! that expires the others. An idle cluster writes nothing.
//!
//! A leader that lost time (its process stalled, or its clock jumped or raced ahead, see
//! [`crate::clock`]) cannot tell which clients tried to reach it meanwhile: keepalives may still
//! sit unread in its sockets. Its next tick is then a `Refresh` again instead of an expiry.
//!
//! A leader also writes its configured limits into the state (`SetLimits`) when they differ
//! from the state's, once every member knows the apply rules that carry them; refused (the
//! state holds more than they allow), it says why and asks again every [`LIMITS_RETRY`]. And
//! it names a cluster whose state has no id yet (`NameCluster`, apply rules 7) with 128 random
//! bits, which every node then sends with its Raft messages (see `network.rs`). And it ends a
//! membership change that an earlier leader left joint (see `Node::finish_a_joint_membership`).

use crate::node::Node;
use crate::raft_types::{TypeConfig, Vote};
use crate::renewals::Batch;
use openraft::ServerState;
use openraft::async_runtime::WatchReceiver;
use picket_core::{Command, CommandError, SessionId};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

type ServerMetrics =
    openraft::alias::WatchReceiverOf<TypeConfig, openraft::metrics::RaftServerMetrics<TypeConfig>>;

/// Longest sleep between checks, so a missed wake-up costs at most this much.
const MAX_SLEEP: Duration = Duration::from_millis(500);
/// Shortest gap between two ticks, so a flood of deadlines cannot turn into a flood of entries.
const MIN_TICK_GAP: Duration = Duration::from_millis(10);
/// Pause before retrying a failed proposal.
const RETRY_PAUSE: Duration = Duration::from_millis(50);
/// How long a leader waits before asking again for limits the state refused.
const LIMITS_RETRY: Duration = Duration::from_secs(5);

/// Runs until `shutdown` turns true.
pub async fn run(node: Arc<Node>, mut shutdown: watch::Receiver<bool>) {
    // Server metrics change only with leadership, votes and membership, not with every applied
    // entry, so watching them costs nothing under load.
    let mut metrics = node.raft().server_metrics();
    loop {
        let term = loop {
            let (state, vote) = {
                let current = metrics.borrow_and_update();
                (current.state, current.vote)
            };
            if state == ServerState::Leader {
                node.note_leading(vote.leader_id().term);
                break vote;
            }
            tokio::select! {
                changed = metrics.changed() => if changed.is_err() { return },
                _ = shutdown.changed() => return,
            }
        };
        let batch = take(&node);
        // The tick is written under the rules it was made for.
        let rules = node.writing_rules();
        let command = if expires_without_refresh() { batch.tick(rules) } else { Command::Refresh };
        if let Err(error) = write(&node, batch, (rules, command)).await {
            tracing::debug!(%error, "refresh after election failed; retrying");
            tokio::time::sleep(RETRY_PAUSE).await;
            continue;
        }
        node.mark_refreshed(term.leader_id().term);
        tracing::info!(node = node.id(), %term, "leader: sessions refreshed, ticking");
        if !tick_while_leader(&node, term, &mut metrics, &mut shutdown).await {
            return;
        }
    }
}

/// Whether the deliberate bug `leader_expires_without_refresh` is on: a new leader writes a
/// plain tick instead of its `Refresh`, so it expires sessions by its own clock against
/// deadlines another leader's clock set (tests only, see [`crate::mutation`]).
fn expires_without_refresh() -> bool {
    #[cfg(feature = "mutations")]
    {
        static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *ON.get_or_init(|| crate::mutation::is_on("leader_expires_without_refresh"))
    }
    #[cfg(not(feature = "mutations"))]
    false
}

/// Proposes ticks while this node leads under the vote `term`. Returns false when the node
/// shuts down.
async fn tick_while_leader(
    node: &Arc<Node>,
    term: Vote,
    metrics: &mut ServerMetrics,
    shutdown: &mut watch::Receiver<bool>,
) -> bool {
    let mut limits_tried_at = None;
    let mut naming_tried_at = None;
    loop {
        set_limits_if_needed(node, &mut limits_tried_at).await;
        name_cluster_if_needed(node, &mut naming_tried_at).await;
        node.finish_a_joint_membership();
        let next_deadline_ms = next_due_ms(node);
        let now_ms = node.clock().now_ms();
        let sleep = next_deadline_ms
            .map_or(MAX_SLEEP, |due_ms| Duration::from_millis(due_ms.saturating_sub(now_ms)))
            .clamp(MIN_TICK_GAP, MAX_SLEEP);
        tokio::select! {
            () = tokio::time::sleep(sleep) => {}
            () = node.renewals().wake().notified() => {}
            changed = metrics.changed() => if changed.is_err() { return false },
            _ = shutdown.changed() => return false,
        }
        // The same leadership: the vote's leader and term. The metrics' vote is the last one
        // flushed, so its `committed` flag may turn on after the leader's first entries (once
        // its blank entry is flushed); that is no new leadership, and was answered with a
        // second `Refresh`.
        let still_leader = {
            let current = metrics.borrow_watched();
            current.state == ServerState::Leader && current.vote.leader_id() == term.leader_id()
        };
        if !still_leader {
            return true;
        }
        let now_ms = node.clock().now_ms();
        let due = next_due_ms(node).is_some_and(|due_ms| due_ms <= now_ms);
        if due || node.gaps().gap_pending() {
            let batch = take(node);
            let rules = node.writing_rules();
            let command = if batch.refresh {
                if batch.after_gap {
                    tracing::warn!(
                        node = node.id(),
                        "the leader lost time: refreshing every session instead of expiring any"
                    );
                }
                Command::Refresh
            } else {
                node.metrics().tick_renewed(batch.renewals());
                batch.tick(rules)
            };
            if let Err(error) = write(node, batch, (rules, command)).await {
                tracing::debug!(%error, "tick failed");
                tokio::time::sleep(RETRY_PAUSE).await;
            }
        }
    }
}

/// Writes the limits the node's flags set into the state when the state's differ and every
/// member can read the entry. A refusal (the state holds more than they allow) is decided on
/// the applied state before the log, so it costs no entry; it is logged when its reason changes, shown
/// in `cluster()`, and asked again after [`LIMITS_RETRY`], as is a failed write.
async fn set_limits_if_needed(node: &Node, tried_at: &mut Option<tokio::time::Instant>) {
    if tried_at.is_some_and(|at| at.elapsed() < LIMITS_RETRY) {
        return;
    }
    let (current, wanted) = node.read_local(|state| {
        let current = state.machine.limits();
        (current.clone(), node.limit_overrides().applied_to(current))
    });
    if current == wanted {
        node.note_limits_refused(None);
        return;
    }
    let command = Command::SetLimits { limits: wanted.clone() };
    let rules = node.writing_rules();
    if rules < command.oldest_rules() {
        // A member runs an older build, or has not said which rules it knows yet.
        return;
    }
    *tried_at = Some(tokio::time::Instant::now());
    // `propose` decides a refusal on the applied state, after its lease check, before the log:
    // a refusal costs no entry.
    let result = match node.propose(command).await {
        Ok(applied) => Ok(applied.result),
        Err(crate::error::ServiceError::Command(refusal)) => Ok(Err(refusal)),
        Err(error) => Err(error),
    };
    match result {
        Ok(Ok(_)) => {
            node.note_limits_refused(None);
            *tried_at = None;
            tracing::info!(node = node.id(), limits = ?wanted, "the state enforces this node's limits now");
        }
        Ok(Err(refusal)) => {
            node.metrics().limits_refused();
            if node.note_limits_refused(Some(refusal.to_string())) {
                tracing::warn!(node = node.id(), %refusal, "the state keeps its limits for now");
            }
        }
        Err(error) => {
            tracing::debug!(%error, "setting the limits failed; trying again later");
        }
    }
}

/// Names the cluster with a random id when its state has none and every member can read the
/// entry. Two leaders in turn may both find it unnamed; the first naming applied stands, and
/// the state refuses the second (logged at `debug`). A failed write is tried again after
/// [`LIMITS_RETRY`].
async fn name_cluster_if_needed(node: &Node, tried_at: &mut Option<tokio::time::Instant>) {
    if tried_at.is_some_and(|at| at.elapsed() < LIMITS_RETRY) {
        return;
    }
    if node.read_local(|state| state.machine.cluster_id().is_some()) {
        return;
    }
    // The rules that carry the naming, from the command itself (an empty id allocates nothing).
    let naming_rules = Command::NameCluster { cluster_id: String::new() }.oldest_rules();
    if node.writing_rules() < naming_rules {
        // A member runs an older build, or has not said which rules it knows yet.
        return;
    }
    *tried_at = Some(tokio::time::Instant::now());
    let Some(cluster_id) = new_cluster_id() else {
        tracing::warn!("the system's random source failed; the cluster stays unnamed for now");
        return;
    };
    let result = match node.propose(Command::NameCluster { cluster_id }).await {
        Ok(applied) => applied.result.map_err(crate::error::ServiceError::from),
        Err(error) => Err(error),
    };
    match result {
        Ok(_) => {
            *tried_at = None;
            let cluster_id = node.cluster_id().map(|id| id.to_string()).unwrap_or_default();
            tracing::info!(node = node.id(), %cluster_id, "the cluster is named");
        }
        // Another leader's naming reached the log first: the state holds it now.
        Err(crate::error::ServiceError::Command(CommandError::ClusterNameRefused { .. }))
            if node.cluster_id().is_some() => {}
        Err(error) => tracing::debug!(%error, "naming the cluster failed; trying again later"),
    }
}

/// A new cluster id: 128 bits from the system's random source, as lowercase hexadecimal.
fn new_cluster_id() -> Option<String> {
    use ring::rand::SecureRandom as _;
    let mut bytes = [0_u8; picket_core::CLUSTER_ID_HEX_DIGITS / 2];
    ring::rand::SystemRandom::new().fill(&mut bytes).ok()?;
    Some(crate::auth::hex(&bytes))
}

/// When the next tick is due: at the state's next deadline, or when pending keepalives should
/// be written, whichever comes first.
fn next_due_ms(node: &Node) -> Option<u64> {
    let deadline_ms = node.read_local(|state| state.machine.next_deadline_ms());
    let renewals_ms = node.renewals().tick_due_ms();
    deadline_ms.into_iter().chain(renewals_ms).min()
}

/// Takes the pending keepalives for one tick, at most as many as the state lets one tick renew.
fn take(node: &Node) -> Batch {
    let max = node.read_local(|state| state.machine.limits().max_renewals_per_tick);
    node.renewals().take(node.clock(), node.gaps(), max)
}

/// Proposes a tick or refresh stamped with its batch's reading. Once it is applied, the
/// keepalives that waited for the batch are answered; if it fails or is refused, they are kept
/// for the next tick (a refused tick would otherwise drop keepalives the leader acknowledged).
async fn write(
    node: &Node,
    batch: Batch,
    command: (u32, Command),
) -> Result<(), crate::error::ServiceError> {
    let (rules, refresh) = (command.0, command.1 == Command::Refresh);
    let result = match node.propose_at(batch.stamp_ms, command).await {
        Ok(applied) => applied.result.map(|_| ()).map_err(crate::error::ServiceError::from),
        Err(error) => Err(error),
    };
    match result {
        Ok(()) => {
            node.renewals().written(batch.number);
            // Under rules older than 5 a tick cannot renew for a lease of its own either.
            if refresh && rules >= 5 {
                node.renewals().after_refresh(&batch, |owed| {
                    node.read_local(|state| {
                        let live = |session: &SessionId| state.machine.session_lease(*session);
                        owed.into_iter().filter(|session| live(session).is_some()).collect()
                    })
                });
            }
        }
        Err(_) => node.renewals().give_back(batch),
    }
    result
}
