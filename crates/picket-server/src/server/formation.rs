//! Forming a new cluster from `--peers`.
//!
//! Every node of a new cluster writes the same first membership (openraft's `initialize`), and
//! any majority of them can then elect a leader among themselves. A node whose data directory
//! is empty does so only once every peer has answered it and none holds a log. A peer that
//! holds one (it was restored from a backup, or the cluster formed before and this node lost
//! its data directory) has a state this node must be sent by that cluster's leader, not a
//! cluster formed beside it. Without the check, the nodes of a restored cluster started without
//! `--restore` formed a cluster of their own from nothing, at restore epoch 0, once they were a
//! majority, and the restored state was left on a minority that could not elect a leader.
//!
//! A node that waits serves its peers meanwhile (they ask it the same), says whom it waits for
//! in `GET /v1/cluster` (`waiting_for_peers`), and logs it. Consul's `bootstrap_expect` waits
//! alike; a cluster that must form while one of its machines is down is formed from a peer
//! list without it, and the machine added later with `--join`.

use crate::network::{ClockProbe, PeerState};
use crate::node::Node;
use crate::raft_types::{Member, NodeId, Raft};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// How long one peer has to answer a probe.
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// How long between two rounds of probes while a peer has not answered.
const PROBE_EVERY: Duration = Duration::from_millis(200);

/// How often the log says again which peers have not answered.
const REPORT_EVERY: Duration = Duration::from_secs(10);

/// What the log says while a node waits for peers to answer.
const WAITING: &str = "this node's data directory is empty: it forms the cluster once every peer \
     in --peers has answered and none holds a log, and waits for the peers named. Start them, \
     or form the cluster from a peer list without them and add them later with --join";

/// What the log says while a node waits to be sent the state of a cluster a peer holds.
const JOINING: &str = "this node forms no cluster of its own beside a peer that holds a log, and \
     waits to be sent the cluster's state by its leader. If nothing comes, check that the \
     cluster's membership names this node at the address it serves peers on (`picket members` \
     on a node of it), and that its leader reaches this node";

/// What a node about to form a cluster does after a round of probes.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Step {
    /// Every peer answered and none holds a log: write the first membership.
    Form,
    /// A peer holds a log: form nothing, and wait to be sent its cluster's state.
    Join { holder: NodeId, restore_epoch: u64 },
    /// These peers did not answer (in the order of their ids): ask again.
    Wait(Vec<NodeId>),
}

/// The step after a round in which each peer gave `answers` (`None`: it did not answer).
fn step(answers: &[(NodeId, Option<PeerState>)]) -> Step {
    let holder = answers.iter().find_map(|(id, state)| {
        state.filter(|state| state.holds_log || state.restore_epoch > 0).map(|state| (*id, state))
    });
    if let Some((holder, state)) = holder {
        return Step::Join { holder, restore_epoch: state.restore_epoch };
    }
    let silent: Vec<NodeId> =
        answers.iter().filter(|(_, state)| state.is_none()).map(|(id, _)| *id).collect();
    if silent.is_empty() { Step::Form } else { Step::Wait(silent) }
}

/// Forms the cluster from `peers` once every peer has answered and none holds a log. Beside a
/// peer that holds one it forms nothing, and says so until it holds the log it is sent. Returns
/// once this node holds a log, after it tried to form the cluster, or on `stop`.
pub(super) async fn form(
    node: Arc<Node>,
    raft: Raft,
    peers: BTreeMap<NodeId, Member>,
    mut stop: watch::Receiver<bool>,
) {
    let own = node.id();
    let mut probes: Vec<(NodeId, ClockProbe)> = peers
        .iter()
        .filter(|(id, _)| **id != own)
        .map(|(id, member)| {
            let addr = member.peer_addr().to_owned();
            let probe =
                ClockProbe::new(*id, addr, node.to_peers().cloned(), node.cluster_id_cell());
            (*id, probe)
        })
        .collect();
    let mut reported: Option<tokio::time::Instant> = None;
    let mut joining: Option<NodeId> = None;
    while !holds_log(&raft) {
        if raft_stopped(&raft) {
            break;
        }
        // Peers not up yet, or a leader that has not reached this node yet, are expected on a
        // first start: said once at info, and as a warning only while it lasts.
        let first = reported.is_none();
        let due = reported.is_none_or(|at| at.elapsed() >= REPORT_EVERY);
        if let Some(holder) = joining {
            if due {
                if first {
                    tracing::info!(holder, "{JOINING}");
                } else {
                    tracing::warn!(holder, "{JOINING}");
                }
                reported = Some(tokio::time::Instant::now());
            }
        } else {
            let round = futures_util::future::join_all(
                probes.iter_mut().map(|(_, probe)| probe.peer_state(PROBE_TIMEOUT)),
            )
            .await;
            let answers: Vec<(NodeId, Option<PeerState>)> = probes
                .iter()
                .zip(&round)
                .map(|((id, _), answer)| (*id, answer.clone().ok()))
                .collect();
            match step(&answers) {
                Step::Form => {
                    if let Err(error) = initialize(&raft, &peers).await {
                        tracing::error!("{error}");
                    }
                    break;
                }
                Step::Join { holder, restore_epoch } => {
                    tracing::info!(holder, restore_epoch, "a peer holds a log: {JOINING}");
                    node.set_waiting_for_peers(Vec::new());
                    joining = Some(holder);
                    reported = Some(tokio::time::Instant::now());
                }
                Step::Wait(silent) => {
                    if due {
                        let failures: Vec<&str> = round
                            .iter()
                            .filter_map(|answer| answer.as_ref().err())
                            .map(String::as_str)
                            .collect();
                        let failures = failures.join("; ");
                        if first {
                            tracing::info!(waiting_for = ?silent, %failures, "{WAITING}");
                        } else {
                            tracing::warn!(waiting_for = ?silent, %failures, "{WAITING}");
                        }
                        reported = Some(tokio::time::Instant::now());
                    }
                    node.set_waiting_for_peers(silent);
                }
            }
        }
        tokio::select! {
            () = tokio::time::sleep(PROBE_EVERY) => {}
            _ = stop.wait_for(|stop| *stop) => break,
        }
    }
    node.set_waiting_for_peers(Vec::new());
}

/// Whether this node holds a log: an entry, or a snapshot and a purge (a vote alone is not one:
/// such a node holds no state, and may still form the cluster with its peers).
pub(crate) fn holds_log(raft: &Raft) -> bool {
    use openraft::async_runtime::WatchReceiver;
    raft.metrics().borrow_watched().last_log_index.is_some()
}

/// Whether this node's Raft has stopped (a fatal error, or the node halted): nothing it forms
/// or is sent would be taken any more.
fn raft_stopped(raft: &Raft) -> bool {
    use openraft::async_runtime::WatchReceiver;
    raft.metrics().borrow_watched().running_state.is_err()
}

/// Writes the first membership, `peers`. Every initial voter does this with the same list,
/// which openraft allows; one that holds a log or a vote by now (a leader or a candidate reached
/// it) is refused, which is expected.
///
/// # Errors
/// What openraft refuses otherwise, said for the log.
pub(super) async fn initialize(
    raft: &Raft,
    peers: &BTreeMap<NodeId, Member>,
) -> Result<(), String> {
    match raft.initialize(peers.clone()).await {
        Ok(())
        | Err(openraft::error::RaftError::APIError(
            openraft::error::InitializeError::NotAllowed(_),
        )) => Ok(()),
        Err(error) => Err(format!("cannot form the cluster: {error}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FRESH: PeerState = PeerState { holds_log: false, restore_epoch: 0 };

    /// A node forms the cluster only when every peer answered and none holds a log; one peer
    /// with a log (a restored node, or a cluster that formed before) is joined, whoever else is
    /// silent; otherwise the silent peers are waited for.
    #[test]
    fn a_cluster_forms_only_when_every_peer_answered_and_none_holds_a_log() {
        assert_eq!(step(&[]), Step::Form, "a single node");
        assert_eq!(step(&[(2, Some(FRESH)), (3, Some(FRESH))]), Step::Form);
        assert_eq!(step(&[(2, Some(FRESH)), (3, None)]), Step::Wait(vec![3]));
        assert_eq!(step(&[(2, None), (3, None)]), Step::Wait(vec![2, 3]));
        let restored = PeerState { holds_log: true, restore_epoch: 1 };
        assert_eq!(
            step(&[(2, None), (3, Some(restored))]),
            Step::Join { holder: 3, restore_epoch: 1 },
            "a restored peer is joined while another is silent"
        );
        let formed = PeerState { holds_log: true, restore_epoch: 0 };
        assert_eq!(
            step(&[(2, Some(formed)), (3, Some(FRESH))]),
            Step::Join { holder: 2, restore_epoch: 0 }
        );
        let epoch_only = PeerState { holds_log: false, restore_epoch: 2 };
        assert_eq!(step(&[(2, Some(epoch_only))]), Step::Join { holder: 2, restore_epoch: 2 });
    }
}
