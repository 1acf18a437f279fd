//! `picket bench --mode chain`: the write path of a node without the network (issue 19).
//!
//! A contended handoff costs one durable log entry and one round trip, and a target set against
//! that floor needs to know what the node adds in between. This mode starts a node in this
//! process on a temporary directory (`TMPDIR`, or `/tmp`) and, in interleaved rounds, measures
//! four things on the same file system:
//!
//! - `fdatasync` of 64 bytes written into preallocated space, the floor of any durable write;
//! - one writer's acquire and release through the node's own API (`Node::acquire`,
//!   `Node::release`): each is one log entry, proposed to openraft, written and synced by the
//!   WAL, applied by the state machine and answered, with no socket on the way;
//! - handoffs among `--clients` tasks taking turns on one lock through the same API;
//! - acquire-release cycles of `--clients` tasks, each on a lock of its own.
//!
//! What a write costs above its sync here is what the node's pipeline costs (openraft's core,
//! the WAL, the state machine's task and the hand-offs between them). Over the wire a handoff
//! also pays the network, the connection tasks and the client, and the client is a second
//! process on the same cores: the difference bounds what those cost together, it does not
//! split them. The callers here are tasks on the node's own runtime, and the CPU reported is
//! the whole process's. Each timed run lasts `--secs` / 3 (no warm-up; the first round's syncs
//! and writes warm the node). The safety checks of the other modes hold here too: tokens of
//! each lock only grow, and the shared lock is granted only once its last holder has released
//! it.

use super::locks::micros;
use super::{BenchArgs, Outcome, cpu_seconds, percent};
use anyhow::{Context, bail};
use hdrhistogram::Histogram;
use picket_core::{SessionId, Wait};
use picket_server::{AcquireRequest, Node, ServerConfig};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Rounds of the three measurements, interleaved; the figures are medians of the rounds.
const ROUNDS: usize = 3;
/// Syncs timed in a round.
const SYNCS_PER_ROUND: u64 = 1_000;
/// One writer's acquire-release cycles timed in a round.
const CYCLES_PER_ROUND: u64 = 500;
/// What each synced write puts down, as the WAL's small entries do.
const SYNC_WRITE_BYTES: usize = 64;
/// How long the node may take to lead after it starts.
const READY_WITHIN: Duration = Duration::from_secs(30);

/// One round's figures.
struct Round {
    sync_p50_us: u64,
    acquire_p50_us: u64,
    release_p50_us: u64,
    handoffs_per_s: f64,
    handoff_cpu_us: Option<f64>,
    own_cycles_per_s: f64,
    own_cycle_cpu_us: Option<f64>,
}

/// Which lock each task of a timed run takes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Locks {
    /// One lock for all: each release hands it to the next task.
    OneShared,
    /// A lock of its own for each task.
    OnePerTask,
}

/// Runs the chain mode; see the module documentation.
pub(super) async fn measure_chain(args: &BenchArgs) -> anyhow::Result<Outcome> {
    if args.clients < 2 {
        bail!("--mode chain needs --clients 2 or more to hand a lock between them");
    }
    let dir = tempfile::tempdir().context("cannot create a temporary directory for the node")?;
    let listen = "127.0.0.1:0".parse().context("a loopback address")?;
    let handle = picket_server::start(ServerConfig::single(dir.path().join("node"), listen))
        .await
        .context("cannot start the node in this process")?;
    let node = handle.node().clone();
    let mut keeper = None;
    let measured = measure_on(args, &node, dir.path(), &mut keeper).await;
    // Stopped before the directory goes, on every path: the node still writes into it.
    if let Some(keeper) = keeper {
        keeper.abort();
    }
    handle.shutdown().await;
    measured
}

async fn measure_on(
    args: &BenchArgs,
    node: &Arc<Node>,
    dir: &Path,
    keeper: &mut Option<tokio::task::JoinHandle<()>>,
) -> anyhow::Result<Outcome> {
    wait_until_ready(node).await?;
    let mut sessions = Vec::with_capacity(args.clients);
    for _ in 0..args.clients {
        let (session, _) =
            node.open_session(args.ttl_ms, 0, None).await.context("cannot open a session")?;
        sessions.push(session);
    }
    *keeper = Some(tokio::spawn(keep_alive(node.clone(), sessions.clone(), args.ttl_ms)));
    let violations = Arc::new(AtomicU64::new(0));
    let mut rounds = Vec::with_capacity(ROUNDS);
    #[allow(clippy::cast_precision_loss)]
    let handoff_secs = args.secs / ROUNDS as f64;
    for _ in 0..ROUNDS {
        let sync_dir = dir.to_owned();
        let sync_p50_us = tokio::task::spawn_blocking(move || time_syncs(&sync_dir))
            .await
            .context("the sync measurement panicked")??;
        let (acquire_p50_us, release_p50_us) = time_one_writer(node, sessions[0]).await?;
        let (handoffs_per_s, handoff_cpu_us) =
            time_cycles(node, &sessions, handoff_secs, &violations, Locks::OneShared).await?;
        let (own_cycles_per_s, own_cycle_cpu_us) =
            time_cycles(node, &sessions, handoff_secs, &violations, Locks::OnePerTask).await?;
        rounds.push(Round {
            sync_p50_us,
            acquire_p50_us,
            release_p50_us,
            handoffs_per_s,
            handoff_cpu_us,
            own_cycles_per_s,
            own_cycle_cpu_us,
        });
    }
    let violations = violations.load(Ordering::Relaxed);
    let median_of = |figure: fn(&Round) -> f64| median(rounds.iter().map(figure).collect());
    #[allow(clippy::cast_precision_loss)]
    let (sync_us, acquire_us, release_us) = (
        median_of(|round| round.sync_p50_us as f64),
        median_of(|round| round.acquire_p50_us as f64),
        median_of(|round| round.release_p50_us as f64),
    );
    let handoffs_per_s = median_of(|round| round.handoffs_per_s);
    let own_cycles_per_s = median_of(|round| round.own_cycles_per_s);
    let median_cpu = |figure: fn(&Round) -> Option<f64>| {
        let cpu: Vec<f64> = rounds.iter().filter_map(figure).collect();
        (!cpu.is_empty()).then(|| median(cpu))
    };
    let line = format!(
        "RESULT system=picket mode=chain clients={} rounds={ROUNDS} sync_p50_us={sync_us:.0} \
         acq_p50_us={acquire_us:.0} rel_p50_us={release_us:.0} write_over_sync_us={:.0} \
         ops_per_s={handoffs_per_s:.0} handoff_us={:.1} handoff_cpu_us={} \
         own_cycles_per_s={own_cycles_per_s:.0} own_cycle_cpu_us={} violations={violations} \
         tag={}",
        args.clients,
        acquire_us.min(release_us) - sync_us,
        1e6 / handoffs_per_s,
        percent(median_cpu(|round| round.handoff_cpu_us)),
        percent(median_cpu(|round| round.own_cycle_cpu_us)),
        args.tag,
    );
    Ok(Outcome { line, safe: violations == 0 })
}

async fn wait_until_ready(node: &Arc<Node>) -> anyhow::Result<()> {
    let started = Instant::now();
    while let Err(why) = node.readiness() {
        if started.elapsed() > READY_WITHIN {
            bail!("the node in this process did not lead within {READY_WITHIN:?}: {why:?}");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok(())
}

/// Keeps `sessions` alive every third of their TTL, as a client would.
async fn keep_alive(node: Arc<Node>, sessions: Vec<SessionId>, ttl_ms: u64) {
    let mut every = tokio::time::interval(Duration::from_millis(ttl_ms / 3));
    loop {
        every.tick().await;
        for chunk in sessions.chunks(picket_server::node::MAX_KEEPALIVE_BATCH) {
            match node.keep_alive_many(chunk, None, None).await {
                Ok(ttls) if ttls.iter().any(Option::is_none) => {
                    eprintln!("picket bench: a session ended; its task's next call fails");
                }
                Ok(_) => {}
                Err(error) => eprintln!("picket bench: a keepalive failed: {error}"),
            }
        }
    }
}

/// The median `fdatasync` of a small write into preallocated space in `dir`, in µs.
fn time_syncs(dir: &Path) -> anyhow::Result<u64> {
    let path = dir.join("sync-floor");
    let file = File::create(&path).with_context(|| format!("cannot create {}", path.display()))?;
    let named = |what: &str| format!("cannot {what} {}", path.display());
    let bytes = SYNCS_PER_ROUND * SYNC_WRITE_BYTES as u64;
    rustix::fs::fallocate(&file, rustix::fs::FallocateFlags::empty(), 0, bytes)
        .with_context(|| named("preallocate"))?;
    file.sync_all().with_context(|| named("sync"))?;
    let mut latencies = histogram();
    let payload = [0x5a_u8; SYNC_WRITE_BYTES];
    for write in 0..SYNCS_PER_ROUND {
        let started = Instant::now();
        file.write_at(&payload, write * SYNC_WRITE_BYTES as u64).with_context(|| named("write"))?;
        file.sync_data().with_context(|| named("sync"))?;
        record(&mut latencies, started);
    }
    drop(file);
    std::fs::remove_file(&path).ok();
    Ok(latencies.value_at_quantile(0.5))
}

/// One writer's acquire and release, each timed; their medians in µs.
async fn time_one_writer(node: &Arc<Node>, session: SessionId) -> anyhow::Result<(u64, u64)> {
    let (mut acquires, mut releases) = (histogram(), histogram());
    for _ in 0..CYCLES_PER_ROUND {
        let started = Instant::now();
        let asked = AcquireRequest::new(Wait::Try);
        let grant = node.acquire(session, "chain/one", asked).await.context("acquire failed")?;
        record(&mut acquires, started);
        let started = Instant::now();
        node.release(session, "chain/one", grant.token, None).await.context("release failed")?;
        record(&mut releases, started);
    }
    Ok((acquires.value_at_quantile(0.5), releases.value_at_quantile(0.5)))
}

/// How long the tasks of a timed run may take to stop once asked: each finishes its cycle,
/// and on the shared lock each waiter is granted in turn.
const STOP_WITHIN: Duration = Duration::from_secs(30);

/// Tasks, one per session, acquire and release for `secs`, all on one lock or each on its
/// own; cycles per second (on one lock, each is a handoff), and the process's CPU per cycle in
/// µs (node and tasks together).
async fn time_cycles(
    node: &Arc<Node>,
    sessions: &[SessionId],
    secs: f64,
    violations: &Arc<AtomicU64>,
    locks: Locks,
) -> anyhow::Result<(f64, Option<f64>)> {
    let stop = Arc::new(AtomicBool::new(false));
    let cycles = Arc::new(AtomicU64::new(0));
    let shared = Arc::new(SharedLockCheck::default());
    let pid = std::process::id().to_string();
    let cpu_before = cpu_seconds(&pid);
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for (index, &session) in sessions.iter().enumerate() {
        let (node, stop, cycles) = (node.clone(), stop.clone(), cycles.clone());
        let (shared, violations) = (shared.clone(), violations.clone());
        let name = match locks {
            Locks::OneShared => "chain/shared".to_owned(),
            Locks::OnePerTask => format!("chain/own/{index}"),
        };
        tasks.spawn(async move {
            let check = (locks == Locks::OneShared).then_some((&*shared, &*violations));
            let cycled = cycle_until_stopped(&node, session, &name, (&stop, &cycles), check).await;
            if cycled.is_err() {
                // The others must not wait for a lock this task may still hold.
                stop.store(true, Ordering::Relaxed);
                let _ = node.close_session(session, None).await;
            }
            cycled
        });
    }
    tokio::time::sleep(Duration::from_secs_f64(secs)).await;
    let counted = cycles.load(Ordering::Relaxed);
    let elapsed = started.elapsed().as_secs_f64();
    let cpu_after = cpu_seconds(&pid);
    stop.store(true, Ordering::Relaxed);
    let joined = tokio::time::timeout(STOP_WITHIN, async {
        while let Some(ended) = tasks.join_next().await {
            ended.context("a timed task panicked")??;
        }
        anyhow::Ok(())
    });
    joined
        .await
        .map_err(|_| anyhow::anyhow!("the timed tasks did not stop within {STOP_WITHIN:?}"))??;
    if counted == 0 {
        bail!("no acquire-release cycle in {secs} s");
    }
    #[allow(clippy::cast_precision_loss)]
    let counted = counted as f64;
    let cpu_us = cpu_before.zip(cpu_after).map(|(before, after)| (after - before) * 1e6 / counted);
    Ok((counted / elapsed, cpu_us))
}

/// One task's acquire-release cycles on `name` until `stop`, counted in `cycles`. Its own
/// grants' tokens only grow (an error otherwise); on the shared lock, `check` counts a grant
/// that came before the previous holder sent its release.
async fn cycle_until_stopped(
    node: &Arc<Node>,
    session: SessionId,
    name: &str,
    (stop, cycles): (&AtomicBool, &AtomicU64),
    check: Option<(&SharedLockCheck, &AtomicU64)>,
) -> anyhow::Result<()> {
    let mut newest_token = 0;
    while !stop.load(Ordering::Relaxed) {
        let asked = AcquireRequest::new(Wait::Forever);
        let grant = node.acquire(session, name, asked).await.context("acquire failed")?;
        if grant.token <= newest_token {
            bail!("{name}: token {} after {newest_token}", grant.token);
        }
        newest_token = grant.token;
        if let Some((shared, violations)) = check {
            if !shared.granted(grant.token) {
                violations.fetch_add(1, Ordering::Relaxed);
            }
            // Held across a turn of the runtime, so that a grant to another task before this
            // one's release would be seen, not only one in the same instant.
            tokio::task::yield_now().await;
            shared.releasing(grant.token);
        }
        node.release(session, name, grant.token, None).await.context("release failed")?;
        cycles.fetch_add(1, Ordering::Relaxed);
    }
    Ok(())
}

/// The shared lock's grants as its tasks see them.
#[derive(Default)]
struct SharedLockCheck {
    /// The newest grant's token, and the token whose release was last sent.
    tokens: std::sync::Mutex<(u64, u64)>,
}

impl SharedLockCheck {
    /// Notes a grant of `token`: false if it came before the previous grant's release was sent,
    /// or with a token not above it.
    fn granted(&self, token: u64) -> bool {
        let mut tokens = self.tokens.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let (newest, released) = *tokens;
        tokens.0 = token;
        token > newest && released == newest
    }

    /// Notes that the holder of `token` sends its release now.
    fn releasing(&self, token: u64) {
        self.tokens.lock().unwrap_or_else(std::sync::PoisonError::into_inner).1 = token;
    }
}

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000, 3).expect("valid histogram bounds")
}

fn record(histogram: &mut Histogram<u64>, started: Instant) {
    histogram.saturating_record(micros(started.elapsed()));
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}
