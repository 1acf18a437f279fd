//! Faults aimed at the lock's holder between its read and its write: the moment the classic
//! race needs. A client pause only hopes to land there; these wait for it, so the race happens
//! in every run that draws them (see [`FaultKind::HolderPause`] and
//! [`FaultKind::HolderPauseFailover`]).

use super::history::Event;
use super::nemesis::thinking_client;
use super::plan::FaultKind;
use super::processes::{Cluster, signal};
use nix::sys::signal::Signal;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Longest wait for a holder between its read and its write.
const HOLDER_WAIT: Duration = Duration::from_secs(10);
/// How often the history is looked at meanwhile.
const LOOK_EVERY: Duration = Duration::from_millis(5);
/// How long a client's events may take to reach the history once it is stopped: it may have
/// written (and said so) just before the signal.
const EVENTS_SETTLE: Duration = Duration::from_millis(30);
/// Longest wait for a leader after the old one is back.
const LEADER_WAIT: Duration = Duration::from_secs(20);

/// The history and the client processes a holder fault picks from.
pub(super) struct Clients<'a> {
    pub(super) pids: &'a [u32],
    pub(super) history: &'a Arc<Mutex<Vec<Event>>>,
    /// Clients frozen by a client pause, which this fault leaves alone.
    pub(super) paused: &'a BTreeMap<usize, Instant>,
}

/// Runs a [`FaultKind::HolderPause`] or [`FaultKind::HolderPauseFailover`]; the holder is
/// running again when it returns.
pub(super) async fn holder_fault(
    kind: FaultKind,
    clients: &Clients<'_>,
    cluster: &mut Cluster,
    rng: &mut picket_sim::Rng,
    record: &impl Fn(String),
    (election_ms, ttl_ms): (u64, u64),
) -> anyhow::Result<()> {
    let Some(holder) = stop_a_holder(clients).await else {
        record(format!(
            "ineffective_{} (no client held the lock between its read and its write within {} s)",
            kind.name(),
            HOLDER_WAIT.as_secs()
        ));
        return Ok(());
    };
    let (process, pid) = (holder + 1, clients.pids[holder]);
    if kind == FaultKind::HolderPause {
        // Past the session's TTL, its grace and the tick that expires it: the lock moves on.
        let pause_ms = rng.range(ttl_ms + ttl_ms / 2, 3 * ttl_ms);
        record(format!("holder_pause process={process} pause_ms={pause_ms}"));
        tokio::time::sleep(Duration::from_millis(pause_ms)).await;
    } else {
        pause_over_failover(process, cluster, rng, record, election_ms).await;
    }
    signal(pid, Signal::SIGCONT);
    Ok(())
}

/// Stops a client that holds the lock between its read and its write, and returns its index;
/// `None` if none did within [`HOLDER_WAIT`].
async fn stop_a_holder(clients: &Clients<'_>) -> Option<usize> {
    let deadline = Instant::now() + HOLDER_WAIT;
    while Instant::now() < deadline {
        if let Some(holder) = thinking_client(clients.history, clients.paused) {
            signal(clients.pids[holder], Signal::SIGSTOP);
            // It may have written between the look and the signal: look again once what it
            // said before it stopped has reached the history.
            tokio::time::sleep(EVENTS_SETTLE).await;
            if thinking_client(clients.history, clients.paused) == Some(holder) {
                return Some(holder);
            }
            signal(clients.pids[holder], Signal::SIGCONT);
        }
        tokio::time::sleep(LOOK_EVERY).await;
    }
    None
}

/// With the holder stopped: kills the leader for two to six election timeouts, restarts it,
/// and returns two election timeouts after a leader is known again.
async fn pause_over_failover(
    process: usize,
    cluster: &mut Cluster,
    rng: &mut picket_sim::Rng,
    record: &impl Fn(String),
    election_ms: u64,
) {
    let started = Instant::now();
    let Some(leader) = cluster.wait_for_leader(LEADER_WAIT).await else {
        record(format!("ineffective_holder_pause_failover process={process} (no leader)"));
        return;
    };
    let down_ms = rng.range(2 * election_ms, 6 * election_ms);
    let node = cluster.nodes[leader].id;
    record(format!("holder_pause_failover process={process} node={node} down_ms={down_ms}"));
    cluster.nodes[leader].kill();
    tokio::time::sleep(Duration::from_millis(down_ms)).await;
    cluster.restart(leader);
    let elected = cluster.wait_for_leader(LEADER_WAIT).await;
    tokio::time::sleep(Duration::from_millis(2 * election_ms)).await;
    record(format!(
        "holder_resumed process={process} paused_ms={} leader_found={}",
        started.elapsed().as_millis(),
        elected.is_some()
    ));
}
