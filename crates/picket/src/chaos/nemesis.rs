//! The nemesis: faults dealt from a shuffled deck of the chosen kinds (seeded), each bounded
//! in time and logged, on the processes of a run.

use super::disk::Disks;
use super::history::{Event, Op, Phase};
use super::holder::{Clients, holder_fault};
use super::network::Cut;
use super::plan::{FaultKind, RunPlan};
use super::processes::{Cluster, Node, Store, client_member, node_member, signal};
use anyhow::Context;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Draws faults until the run's time is up. Each fault is over (nodes back, clients woken)
/// before the next begins, except client pauses, which run beside the others.
pub(super) async fn run_nemesis(
    plan: &RunPlan,
    (cluster, store): (&mut Cluster, &mut Store),
    clients: &[u32],
    history: &Arc<Mutex<Vec<Event>>>,
) -> anyhow::Result<()> {
    let record = |description: String| {
        tracing::info!(fault = %description, "nemesis");
        history
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(Event::fault(description));
    };
    let mut rng = picket_sim::Rng::new(plan.seed);
    let started = Instant::now();
    let election_ms = u64::try_from(plan.election_timeout.as_millis()).unwrap_or(1_000).max(1);
    let ttl_ms = u64::try_from(plan.ttl.as_millis()).unwrap_or(1_000).max(2);
    let gap_ms = u64::try_from(plan.max_fault_gap.as_millis()).unwrap_or(1_000).max(2);
    let mut pauses: Vec<tokio::task::JoinHandle<()>> = Vec::new();
    let mut deck: Vec<FaultKind> = Vec::new();
    // Clients frozen by a client pause, until when: no second fault picks them meanwhile.
    let mut paused: BTreeMap<usize, Instant> = BTreeMap::new();
    // Decks dealt so far. The first is dealt whole even past the run's time, so every kind the
    // run asked for fires at least once, however long the faults before it took.
    let mut decks = 0_u32;
    let first_deck_dealt = |decks: u32, deck: &[FaultKind]| {
        plan.faults.is_empty() || decks >= 2 || (decks == 1 && deck.is_empty())
    };
    while started.elapsed() < plan.duration || !first_deck_dealt(decks, &deck) {
        tokio::time::sleep(Duration::from_millis(rng.range(gap_ms / 2, gap_ms))).await;
        cluster.reap_unexpected_exits(&record)?;
        paused.retain(|_, until| *until > Instant::now());
        if plan.faults.is_empty() {
            continue;
        }
        // Faults are dealt from a shuffled deck of the kinds, so every kind fires once in each
        // round of as many faults as there are kinds, whatever the seed.
        if deck.is_empty() {
            decks += 1;
            deck = plan.faults.clone();
            for index in (1..deck.len()).rev() {
                let other = usize::try_from(rng.range(0, index as u64 + 1)).unwrap_or(0);
                deck.swap(index, other);
            }
        }
        let Some(kind) = deck.pop() else { continue };
        match kind {
            FaultKind::ClientPause => {
                // The classic race wants the holder frozen after its read and before its write;
                // freeze that client when there is one, any client otherwise.
                let Some(pick) = pick_client(history, &paused, clients.len(), &mut rng) else {
                    record("no_unpaused_client".into());
                    continue;
                };
                let pid = clients[pick];
                let pause_ms = rng.range(ttl_ms / 2, 2 * ttl_ms);
                paused.insert(pick, Instant::now() + Duration::from_millis(pause_ms));
                record(format!("client_pause process={} pause_ms={pause_ms}", pick + 1));
                signal(pid, nix::sys::signal::Signal::SIGSTOP);
                pauses.push(tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_millis(pause_ms)).await;
                    signal(pid, nix::sys::signal::Signal::SIGCONT);
                }));
            }
            FaultKind::HolderPause | FaultKind::HolderPauseFailover => {
                let holders = Clients { pids: clients, history, paused: &paused };
                let timing = (election_ms, ttl_ms);
                holder_fault(kind, &holders, cluster, &mut rng, &record, timing).await?;
            }
            FaultKind::StoreRestart => {
                record("store_restart".to_owned());
                store.child = None;
                store.start()?;
            }
            FaultKind::ClusterRestart | FaultKind::ClusterPowerLoss => {
                let down_ms = rng.range(0, 2 * election_ms);
                for node in &mut cluster.nodes {
                    node.kill();
                }
                if kind == FaultKind::ClusterPowerLoss {
                    let mut erased = Vec::new();
                    for node in &cluster.nodes {
                        erased.push(lose_unsynced(node, &mut rng)?);
                    }
                    let erased: Option<Vec<(u64, u16)>> = erased.into_iter().collect();
                    record(match erased {
                        Some(erased) => {
                            let list = |pick: &dyn Fn(&(u64, u16)) -> String| {
                                erased.iter().map(pick).collect::<Vec<_>>().join(",")
                            };
                            format!(
                                "cluster_power_loss down_ms={down_ms} erased_bytes={} kept_permille={}",
                                list(&|(bytes, _)| bytes.to_string()),
                                list(&|(_, kept)| kept.to_string())
                            )
                        }
                        None => POWER_LOSS_UNAVAILABLE.to_owned(),
                    });
                } else {
                    record(format!("cluster_restart down_ms={down_ms}"));
                }
                tokio::time::sleep(Duration::from_millis(down_ms)).await;
                for index in 0..cluster.nodes.len() {
                    cluster.restart(index);
                }
            }
            FaultKind::ClientIsolate => {
                let Some(pick) = pick_client(history, &paused, clients.len(), &mut rng) else {
                    record("no_unpaused_client".into());
                    continue;
                };
                isolate_client((pick + 1, clients[pick]), cluster, &mut rng, &record, ttl_ms)
                    .await?;
            }
            kind => {
                // Every other fault is aimed at the leader, or placed relative to it.
                let Some(leader) = cluster.wait_for_leader(Duration::from_secs(20)).await else {
                    record("no_leader_for_20s".into());
                    continue;
                };
                let timing = (election_ms, ttl_ms);
                if kind.is_partition() {
                    let partition =
                        partition_fault(kind, leader, cluster, clients.len(), &mut rng, timing);
                    hold_cuts(cluster, partition, &record).await?;
                } else {
                    node_fault(kind, leader, cluster, &mut rng, &record, timing).await?;
                }
            }
        }
    }
    for pause in pauses {
        let _ = pause.await;
    }
    Ok(())
}

/// What the history says of a power loss this build cannot emulate; it does not count as the
/// fault having fired.
const POWER_LOSS_UNAVAILABLE: &str = "no_power_loss: this build notes no synced end (it lacks the test storage faults), so the \
     nodes were only killed";

/// Erases from a killed node's log what a power cut would have lost; `None` when its build
/// cannot say what that is. The disk wrote some prefix of what was not synced: none of it a
/// third of the time, all of it a third, and a cut anywhere in it (tearing a frame, most
/// likely) the rest. Returns the bytes erased and the thousandths kept.
fn lose_unsynced(node: &Node, rng: &mut picket_sim::Rng) -> anyhow::Result<Option<(u64, u16)>> {
    let keep_permille = match rng.range(0, 3) {
        0 => 0,
        1 => 1000,
        _ => u16::try_from(rng.range(1, 1000)).unwrap_or(500),
    };
    let erased = picket_server::erase_unsynced_log_writes(&node.dir, keep_permille)
        .with_context(|| format!("erasing node {}'s unsynced writes", node.id))?;
    Ok(erased.map(|erased| (erased, keep_permille)))
}

/// Injects one fault on a node, `leader` being the index of the current leader.
pub(super) async fn node_fault(
    kind: FaultKind,
    leader: usize,
    cluster: &mut Cluster,
    rng: &mut picket_sim::Rng,
    record: &impl Fn(String),
    (election_ms, ttl_ms): (u64, u64),
) -> anyhow::Result<()> {
    match kind {
        FaultKind::DiskFull => {
            let step = usize::try_from(rng.range(0, 4)).unwrap_or(0);
            // The leader half the time, else one of the followers.
            let index = if step < 2 { leader } else { (leader + step - 1) % cluster.nodes.len() };
            fill_disk(cluster, index, record).await?;
        }
        FaultKind::SyncFailure => {
            let step = usize::try_from(rng.range(0, 4)).unwrap_or(0);
            // The leader half the time, else one of the followers.
            let index = if step < 2 { leader } else { (leader + step - 1) % cluster.nodes.len() };
            fail_syncs(cluster, index, record).await?;
        }
        FaultKind::LeaderKillQuick | FaultKind::LeaderKillLong | FaultKind::FollowerKill => {
            let (index, down_ms) = match kind {
                FaultKind::LeaderKillQuick => (leader, 0),
                FaultKind::LeaderKillLong => (leader, rng.range(2 * election_ms, 6 * election_ms)),
                _ => {
                    let step = usize::try_from(rng.range(1, 3)).unwrap_or(1);
                    ((leader + step) % cluster.nodes.len(), rng.range(0, 3 * election_ms))
                }
            };
            record(format!("{} node={} down_ms={down_ms}", kind.name(), cluster.nodes[index].id));
            cluster.nodes[index].kill();
            tokio::time::sleep(Duration::from_millis(down_ms)).await;
            cluster.restart(index);
        }
        FaultKind::LinkDelay => delay_links(cluster, leader, rng, record, election_ms).await,
        FaultKind::MemberReplace => {
            super::membership::replace_member(cluster, leader, rng, record).await?;
        }
        FaultKind::ClientLinkDelay => {
            delay_client_links(&cluster.nodes[leader], rng, record, (election_ms, ttl_ms)).await;
        }
        FaultKind::PowerLoss => {
            let step = usize::try_from(rng.range(0, 4)).unwrap_or(0);
            // The leader half the time, else one of the followers.
            let index = if step < 2 { leader } else { (leader + step - 1) % cluster.nodes.len() };
            let down_ms = rng.range(0, 3 * election_ms);
            cluster.nodes[index].kill();
            record(match lose_unsynced(&cluster.nodes[index], rng)? {
                Some((erased, kept)) => format!(
                    "power_loss node={} down_ms={down_ms} erased_bytes={erased} kept_permille={kept}",
                    cluster.nodes[index].id
                ),
                None => POWER_LOSS_UNAVAILABLE.to_owned(),
            });
            tokio::time::sleep(Duration::from_millis(down_ms)).await;
            cluster.restart(index);
        }
        kind if matches!(
            kind,
            FaultKind::ClientPause
                | FaultKind::HolderPause
                | FaultKind::HolderPauseFailover
                | FaultKind::StoreRestart
                | FaultKind::ClusterRestart
                | FaultKind::ClusterPowerLoss
        ) || kind.is_partition() =>
        {
            unreachable!("{} is not a fault of one node", kind.name())
        }
        _ => {
            let node = &mut cluster.nodes[leader];
            match kind {
                FaultKind::LeaderPause => {
                    let Some(pid) = node.pid() else { return Ok(()) };
                    let pause_ms = rng.range(election_ms, 4 * election_ms);
                    record(format!("leader_pause node={} pause_ms={pause_ms}", node.id));
                    signal(pid, nix::sys::signal::Signal::SIGSTOP);
                    tokio::time::sleep(Duration::from_millis(pause_ms)).await;
                    signal(pid, nix::sys::signal::Signal::SIGCONT);
                }
                FaultKind::LeaderClockJump => {
                    let size_ms = i64::try_from(rng.range(ttl_ms, 3 * ttl_ms)).unwrap_or(0);
                    let jump_ms = if rng.range(0, 2) == 0 { size_ms } else { -size_ms };
                    record(format!("leader_clock_jump node={} jump_ms={jump_ms}", node.id));
                    node.set_clock(1.0, node.jump_ms + jump_ms)?;
                }
                _ => {
                    let rate = [0.5, 1.5, 2.0][usize::try_from(rng.range(0, 3)).unwrap_or(0)];
                    let for_ms = rng.range(ttl_ms, 3 * ttl_ms);
                    record(format!(
                        "leader_clock_rate node={} rate={rate} for_ms={for_ms}",
                        node.id
                    ));
                    node.set_clock(rate, node.jump_ms)?;
                    tokio::time::sleep(Duration::from_millis(for_ms)).await;
                    let node = &mut cluster.nodes[leader];
                    node.set_clock(1.0, node.jump_ms)?;
                }
            }
        }
    }
    Ok(())
}

/// Slows peers' connections to the leader's followers (three times in four) or to one of
/// them, holds the delay, and clears it; recorded as fired only if bytes were held back.
async fn delay_links(
    cluster: &Cluster,
    leader: usize,
    rng: &mut picket_sim::Rng,
    record: &impl Fn(String),
    election_ms: u64,
) {
    let count = cluster.nodes.len();
    let followers: Vec<usize> = (0..count).filter(|index| *index != leader).collect();
    let targets: Vec<usize> = if rng.range(0, 4) < 3 {
        followers
    } else {
        vec![followers[usize::try_from(rng.range(0, 2)).unwrap_or(0) % followers.len()]]
    };
    let delay_ms = rng.range(election_ms / 4, 2 * election_ms);
    let hold_ms = rng.range(2 * election_ms, 6 * election_ms);
    let ids: Vec<u64> = targets.iter().map(|index| cluster.nodes[*index].id).collect();
    let description = format!(
        "link_delay to={ids:?} leader={} delay_ms={delay_ms} hold_ms={hold_ms}",
        cluster.nodes[leader].id
    );
    record(format!("delay {description}"));
    let held_before: u64 =
        targets.iter().map(|index| cluster.nodes[*index].delay.delayed_bytes()).sum();
    for index in &targets {
        cluster.nodes[*index].delay.set(Duration::from_millis(delay_ms));
    }
    tokio::time::sleep(Duration::from_millis(hold_ms)).await;
    for index in &targets {
        cluster.nodes[*index].delay.set(Duration::ZERO);
    }
    let held: u64 = targets.iter().map(|index| cluster.nodes[*index].delay.delayed_bytes()).sum();
    let delayed_bytes = held.saturating_sub(held_before);
    let fired = if delayed_bytes > 0 { "" } else { "ineffective_" };
    record(format!("{fired}{description} delayed_bytes={delayed_bytes}"));
}

/// Slows every client connection to the leader (see [`FaultKind::ClientLinkDelay`]); fired
/// only if bytes were held back.
async fn delay_client_links(
    leader: &Node,
    rng: &mut picket_sim::Rng,
    record: &impl Fn(String),
    (election_ms, ttl_ms): (u64, u64),
) {
    let Some((_, delay)) = &leader.client_proxy else {
        record("ineffective_client_link_delay (the run has no client proxies)".into());
        return;
    };
    let delay_ms = rng.range(election_ms / 4, (ttl_ms / 3).max(election_ms / 4 + 1));
    let hold_ms = rng.range(ttl_ms, 2 * ttl_ms);
    let description =
        format!("client_link_delay node={} delay_ms={delay_ms} hold_ms={hold_ms}", leader.id);
    record(format!("delay {description}"));
    let held_before = delay.delayed_bytes();
    delay.set(Duration::from_millis(delay_ms));
    tokio::time::sleep(Duration::from_millis(hold_ms)).await;
    delay.set(Duration::ZERO);
    let delayed_bytes = delay.delayed_bytes().saturating_sub(held_before);
    let fired = if delayed_bytes > 0 { "" } else { "ineffective_" };
    record(format!("{fired}{description} delayed_bytes={delayed_bytes}"));
}

/// A partition drawn by the nemesis, not yet in place.
pub(super) struct Partition {
    pub(super) kind: FaultKind,
    /// Who is cut from what, for the record.
    pub(super) description: String,
    pub(super) cuts: Vec<Cut>,
    pub(super) hold: Duration,
    /// The nodes expected to elect a leader among themselves while the cut holds.
    pub(super) majority: Option<Vec<usize>>,
}

/// Both directions between nodes `a` and `b`, given each node's peer port (the port of the
/// proxy in front of it: nodes reach each other only there).
pub(super) fn cut_both_ways(peer_ports: &[u16], a: usize, b: usize) -> [Cut; 2] {
    [
        Cut { from: node_member(a), to_port: peer_ports[b] },
        Cut { from: node_member(b), to_port: peer_ports[a] },
    ]
}

/// Draws the partition of `kind` (a node-level partition) around `leader`.
pub(super) fn partition_fault(
    kind: FaultKind,
    leader: usize,
    cluster: &Cluster,
    clients: usize,
    rng: &mut picket_sim::Rng,
    (election_ms, ttl_ms): (u64, u64),
) -> Partition {
    let ports: Vec<u16> = cluster.nodes.iter().map(Node::client_port).collect();
    let peer_ports: Vec<u16> = cluster.nodes.iter().map(|node| node.peer_proxy_port).collect();
    let count = ports.len();
    let pick = |rng: &mut picket_sim::Rng, below: usize| {
        usize::try_from(rng.range(0, below as u64)).unwrap_or(0)
    };
    let alone = pick(rng, count);
    // A follower: the one a one-way cut aims at, or that bridges the leader and the other
    // follower. Only the leader sends between nodes in a quiet cluster, so a cut that does not
    // start at the leader drops nothing (and is recorded as ineffective).
    let follower = (leader + 1 + pick(rng, count - 1)) % count;
    let sides: Vec<bool> = (0..clients).map(|_| rng.range(0, 2) == 0).collect();
    let hold_ms = match kind {
        FaultKind::PartitionLeader => rng.range(3 * election_ms, 8 * election_ms),
        FaultKind::PartitionSplit => rng.range(ttl_ms, 3 * ttl_ms),
        _ => rng.range(2 * election_ms, 6 * election_ms),
    };
    let id = |index: usize| cluster.nodes[index].id;
    let others = |index: usize| (0..count).filter(move |other| *other != index);
    let mut cuts = Vec::new();
    let mut majority = None;
    let description = match kind {
        FaultKind::PartitionLeader => {
            for other in others(leader) {
                cuts.extend(cut_both_ways(&peer_ports, leader, other));
            }
            majority = Some(others(leader).collect());
            format!("partition_leader node={}", id(leader))
        }
        FaultKind::PartitionSplit => {
            for other in others(alone) {
                cuts.extend(cut_both_ways(&peer_ports, alone, other));
            }
            let mut with_alone = Vec::new();
            for (client, beside_alone) in sides.iter().enumerate() {
                let process = client + 1;
                let unreachable: Vec<usize> =
                    if *beside_alone { others(alone).collect() } else { vec![alone] };
                if *beside_alone {
                    with_alone.push(process);
                }
                for node in unreachable {
                    cuts.push(Cut { from: client_member(process), to_port: ports[node] });
                }
            }
            if alone == leader {
                majority = Some(others(alone).collect());
            }
            format!(
                "partition_split alone={} leader={} clients_beside_it={with_alone:?}",
                id(alone),
                id(leader)
            )
        }
        FaultKind::PartitionOneWay => {
            cuts.push(Cut { from: node_member(leader), to_port: peer_ports[follower] });
            format!("partition_one_way from={} to={}", id(leader), id(follower))
        }
        _ => {
            let end = others(leader).find(|other| *other != follower).unwrap_or(follower);
            cuts.extend(cut_both_ways(&peer_ports, leader, end));
            format!(
                "partition_bridge middle={} leader={} other_end={}",
                id(follower),
                id(leader),
                id(end)
            )
        }
    };
    Partition { kind, description, cuts, hold: Duration::from_millis(hold_ms), majority }
}

/// Puts a drawn partition in place, holds it, heals it, and records it as fired only if its
/// rules dropped packets (otherwise as `ineffective_<kind>`, which does not count).
pub(super) async fn hold_cuts(
    cluster: &Cluster,
    partition: Partition,
    record: &impl Fn(String),
) -> anyhow::Result<()> {
    let hold_ms = partition.hold.as_millis();
    record(format!("cut {} hold_ms={hold_ms}", partition.description));
    cluster.set_cuts(&partition.cuts)?;
    let started = Instant::now();
    let mut new_leader = None;
    if let Some(majority) = &partition.majority {
        while new_leader.is_none() && started.elapsed() < partition.hold {
            new_leader = cluster
                .leader_among(majority)
                .await
                .filter(|leader| majority.iter().any(|index| cluster.nodes[*index].id == *leader));
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    tokio::time::sleep(partition.hold.saturating_sub(started.elapsed())).await;
    let dropped = cluster.set_cuts(&[])?;
    let failover = match (&partition.majority, new_leader) {
        (None, _) => String::new(),
        (Some(_), Some(leader)) => format!(" majority_elected={leader}"),
        (Some(_), None) => " majority_elected=none".to_owned(),
    };
    let fired = if dropped > 0 { "" } else { "ineffective_" };
    record(format!(
        "{fired}{} hold_ms={hold_ms} dropped_packets={dropped}{failover}",
        partition.description
    ));
    debug_assert!(partition.kind.is_partition());
    Ok(())
}

/// Cuts client `process` (from 1, process id `pid`) off from every node, not from the store,
/// and stalls it (SIGUSR1: its think lasts two TTLs), so that it is still working when its
/// session expires.
pub(super) async fn isolate_client(
    (process, pid): (usize, u32),
    cluster: &Cluster,
    rng: &mut picket_sim::Rng,
    record: &impl Fn(String),
    ttl_ms: u64,
) -> anyhow::Result<()> {
    let hold_ms = rng.range(ttl_ms + ttl_ms / 2, 2 * ttl_ms);
    signal(pid, nix::sys::signal::Signal::SIGUSR1);
    let partition = Partition {
        kind: FaultKind::ClientIsolate,
        description: format!("client_isolate process={process}"),
        cuts: cluster
            .nodes
            .iter()
            .map(|node| Cut { from: client_member(process), to_port: node.client_port() })
            .collect(),
        hold: Duration::from_millis(hold_ms),
        majority: None,
    };
    hold_cuts(cluster, partition, record).await
}

/// Fills the data disk of the node at `index`, waits (at most 15 s) for the node to stop, frees
/// the space and starts the node again. Recorded as fired only if the node stopped.
pub(super) async fn fill_disk(
    cluster: &mut Cluster,
    index: usize,
    record: &impl Fn(String),
) -> anyhow::Result<()> {
    const LONGEST_WAIT: Duration = Duration::from_secs(15);
    cluster.disks.as_ref().context("this run did not give the nodes disks of their own")?;
    let node = &mut cluster.nodes[index];
    let id = node.id;
    record(format!("fill node={id}"));
    let filled = Disks::fill(&node.dir)?;
    let stopped_after = node.wait_for_exit(LONGEST_WAIT).await;
    Disks::free(&node.dir)?;
    match stopped_after {
        // `picket serve` exits with 1 when its Raft core stops; anything else (a panic's 101,
        // a signal) is a crash.
        Some((_, status)) if status.code() != Some(1) => {
            record(format!("node_exited node={id} status={status} (its disk was full)"));
            cluster.unexpected_exits.push(format!(
                "node {id} crashed when its disk filled ({status}) instead of stopping cleanly"
            ));
            cluster.nodes[index].kill();
            cluster.restart(index);
        }
        Some((after, _)) => {
            record(format!(
                "disk_full node={id} filled_bytes={filled} stopped_after_ms={}",
                after.as_millis()
            ));
            node.kill();
            cluster.restart(index);
        }
        None => record(format!(
            "ineffective_disk_full node={id} filled_bytes={filled} (no write needed space within {} s)",
            LONGEST_WAIT.as_secs()
        )),
    }
    Ok(())
}

/// Makes node `index`'s log syncs fail until it stops (it must exit cleanly, acknowledging
/// nothing it could not sync), then erases what its last good sync did not cover, as the
/// kernel may have dropped those pages, and starts it again. A node with the test storage
/// faults that is still running after the bound kept accepting writes its log could not make
/// durable: a violation. A build without them never fails a sync: the fault is ineffective,
/// not fired.
async fn fail_syncs(
    cluster: &mut Cluster,
    index: usize,
    record: &impl Fn(String),
) -> anyhow::Result<()> {
    const LONGEST_WAIT: Duration = Duration::from_secs(15);
    let node = &mut cluster.nodes[index];
    let id = node.id;
    std::fs::write(&node.fail_sync, b"")
        .with_context(|| format!("cannot write {}", node.fail_sync.display()))?;
    let stopped_after = node.wait_for_exit(LONGEST_WAIT).await;
    node.kill();
    std::fs::remove_file(&node.fail_sync)
        .with_context(|| format!("cannot remove {}", node.fail_sync.display()))?;
    // All of it: the pages a failed sync did not write may be gone.
    let erased = picket_server::erase_unsynced_log_writes(&node.dir, 0)
        .with_context(|| format!("erasing node {id}'s unsynced writes"))?;
    match (stopped_after, erased) {
        // `picket serve` exits with 1 when its Raft core stops; anything else is a crash.
        (Some((_, status)), _) if status.code() != Some(1) => {
            record(format!("node_exited node={id} status={status} (its log sync failed)"));
            cluster.unexpected_exits.push(format!(
                "node {id} crashed when its log sync failed ({status}) instead of stopping cleanly"
            ));
        }
        (Some((after, _)), Some(erased)) => record(format!(
            "fsync_failure node={id} stopped_after_ms={} erased_bytes={erased}",
            after.as_millis()
        )),
        (Some(_), None) => record(format!(
            "ineffective_fsync_failure node={id} (it stopped, but its build notes no synced end)"
        )),
        (None, Some(_)) => {
            record(format!("node_kept_running node={id} (its log syncs failed)"));
            cluster.unexpected_exits.push(format!(
                "node {id} kept running for {} s after its log syncs began to fail",
                LONGEST_WAIT.as_secs()
            ));
        }
        (None, None) => record(format!(
            "ineffective_fsync_failure node={id} (a build without the test storage faults \
             never fails a sync)"
        )),
    }
    cluster.restart(index);
    Ok(())
}

/// The index (process - 1) of a client whose last event is a successful read: it holds the lock
/// and is thinking before its write.
pub(super) fn thinking_client(
    history: &Arc<Mutex<Vec<Event>>>,
    paused: &BTreeMap<usize, Instant>,
) -> Option<usize> {
    let history = history.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut last: BTreeMap<u32, &Event> = BTreeMap::new();
    for event in history.iter().rev().take(256) {
        last.entry(event.process).or_insert(event);
    }
    last.values()
        .filter(|event| {
            matches!(event.op, Some(Op::Read { .. }))
                && matches!(event.phase, Some(Phase::Ok { .. }))
        })
        .filter_map(|event| usize::try_from(event.process).ok()?.checked_sub(1))
        .find(|index| !paused.contains_key(index))
}

/// A client for a client fault: a thinking holder if there is one, else any client; never one
/// that is frozen by a client pause. None when every client is frozen.
pub(super) fn pick_client(
    history: &Arc<Mutex<Vec<Event>>>,
    paused: &BTreeMap<usize, Instant>,
    clients: usize,
    rng: &mut picket_sim::Rng,
) -> Option<usize> {
    if let Some(thinking) = thinking_client(history, paused) {
        return Some(thinking);
    }
    let free: Vec<usize> = (0..clients).filter(|index| !paused.contains_key(index)).collect();
    let at = usize::try_from(rng.range(0, free.len() as u64)).ok()?;
    free.get(at).copied()
}
