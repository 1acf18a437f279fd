//! The leader's duties: bring time into the log.
//!
//! The state machine never reads a clock; time reaches it only in commands the leader proposes.
//! When a node becomes leader it first proposes `Refresh`, which gives every session a full TTL
//! on the new leader's clock: the new leader cannot know how long ago the old one last heard from
//! each client, and must never expire a session early. After that it sleeps until the state's
//! next deadline (a session, a bounded wait or a lock-delay running out) and then proposes a
//! `Tick` carrying every keepalive received since the last tick, so kept-alive sessions are
//! renewed in the same entry that expires the others. An idle cluster writes nothing.

use crate::node::{Node, RENEWAL_FLUSH_THRESHOLD};
use crate::raft_types::{TypeConfig, Vote};
use openraft::ServerState;
use openraft::async_runtime::WatchReceiver;
use picket_core::Command;
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
                break vote;
            }
            tokio::select! {
                changed = metrics.changed() => if changed.is_err() { return },
                _ = shutdown.changed() => return,
            }
        };
        if let Err(error) = node.propose(Command::Refresh).await {
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

/// Proposes ticks while this node leads under the vote `term`. Returns false when the node
/// shuts down.
async fn tick_while_leader(
    node: &Arc<Node>,
    term: Vote,
    metrics: &mut ServerMetrics,
    shutdown: &mut watch::Receiver<bool>,
) -> bool {
    loop {
        let next_deadline_ms = node.read_local(|state| state.machine.next_deadline_ms());
        let now_ms = node.clock().now_ms();
        let sleep = next_deadline_ms
            .map_or(MAX_SLEEP, |due_ms| Duration::from_millis(due_ms.saturating_sub(now_ms)))
            .clamp(MIN_TICK_GAP, MAX_SLEEP);
        tokio::select! {
            () = tokio::time::sleep(sleep) => {}
            () = node.renewals_waiting().notified() => {}
            changed = metrics.changed() => if changed.is_err() { return false },
            _ = shutdown.changed() => return false,
        }
        let still_leader = {
            let current = metrics.borrow_watched();
            current.state == ServerState::Leader && current.vote == term
        };
        if !still_leader {
            return true;
        }
        let now_ms = node.clock().now_ms();
        let due = node
            .read_local(|state| state.machine.next_deadline_ms())
            .is_some_and(|due_ms| due_ms <= now_ms);
        if due || node.pending_renewals() >= RENEWAL_FLUSH_THRESHOLD {
            let renew = node.take_renewals();
            if let Err(error) = node.propose(Command::Tick { renew }).await {
                // The renewals are lost with this leadership; the next leader's refresh gives
                // every session a full TTL anyway.
                tracing::debug!(%error, "tick failed");
                tokio::time::sleep(RETRY_PAUSE).await;
            }
        }
    }
}
