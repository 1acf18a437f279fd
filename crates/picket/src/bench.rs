//! `picket bench`: drives a running Picket with concurrent clients and prints one `RESULT` line
//! in the format of `../shared/peerbench`, so Picket lines up with etcd, ZooKeeper and Redis.
//!
//! Each client has its own connection and session. While it runs, the benchmark checks mutual
//! exclusion (no two of its clients hold one lock at once) and that tokens of each lock only
//! grow; both counts must be 0.

use crate::connect::Connect;
use crate::http_fence::HttpFence;
use anyhow::{Context, bail};
use clap::{Args, ValueEnum};
use hdrhistogram::Histogram;
use picket_client::{Client, Guard};
use std::collections::HashMap;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What each client does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Mode {
    /// Client i acquires and releases its own lock: acquire+release cycles per second.
    Uncontended,
    /// All clients take turns on one lock: handoffs per second.
    Contended,
    /// Open `--sessions` sessions and keep them alive at TTL/3; report any that expired.
    Sessions,
    /// Acquire once, then write to `picket kv` at `--kv` with the grant's sequencer from every
    /// client; with `--kv-unfenced` also to a store running `--no-fence`, and report the fence's
    /// overhead. The lock name is `--lock` and keys go under `--prefix`.
    Fenced,
}

/// Options of `picket bench`.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// What to measure.
    #[arg(long, value_enum, default_value_t = Mode::Uncontended)]
    mode: Mode,
    /// Concurrent clients, each with its own connection and session.
    #[arg(long, default_value_t = 64)]
    clients: usize,
    /// Measured seconds (after the warm-up).
    #[arg(long, default_value_t = 10.0)]
    secs: f64,
    /// Warm-up seconds, not measured.
    #[arg(long, default_value_t = 1.0)]
    warmup_secs: f64,
    /// The server's process id, to report its CPU use.
    #[arg(long)]
    server_pid: Option<u32>,
    /// Session TTL in milliseconds.
    #[arg(long, default_value_t = 10_000)]
    ttl_ms: u64,
    /// Sessions to open in `sessions` mode.
    #[arg(long, default_value_t = 10_000)]
    sessions: usize,
    /// Stop after this many operations, whatever the time.
    #[arg(long, default_value_t = 5_000_000)]
    max_ops: u64,
    /// A label copied into the RESULT line.
    #[arg(long, default_value = "")]
    tag: String,
    /// `fenced` mode: the fenced store's URL.
    #[arg(long, default_value = "http://127.0.0.1:7690")]
    kv: String,
    /// `fenced` mode: a store started with `--no-fence`, for comparison.
    #[arg(long)]
    kv_unfenced: Option<String>,
    /// `fenced` mode: the lock the stores guard the prefix with.
    #[arg(long, default_value = "bench")]
    lock: String,
    /// `fenced` mode: the guarded key prefix.
    #[arg(long, default_value = "bench/")]
    prefix: String,
    /// Start a 3-node cluster on loopback (this binary, temporary data directories) and run
    /// against it instead of --endpoints; its leader's CPU is reported. In `fenced` mode it also
    /// starts the two `picket kv` stores (fenced and `--no-fence`) against the cluster.
    #[arg(long)]
    cluster: bool,
}

/// CPU time (user + system) of a process, in seconds, from /proc.
fn cpu_seconds(pid: &str) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may contain spaces; fields after the closing parenthesis are fixed.
    let after = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks: f64 = fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
    // Linux reports CPU time in clock ticks of 1/100 s on every platform Picket targets.
    Some(ticks / 100.0)
}

#[derive(Debug)]
struct Recorder {
    acquire: Histogram<u64>,
    release: Histogram<u64>,
    cycle: Histogram<u64>,
    ops: u64,
    errors: u64,
}

impl Recorder {
    fn new() -> Self {
        let histogram =
            || Histogram::new_with_bounds(1, 120_000_000, 3).expect("valid histogram bounds");
        Self { acquire: histogram(), release: histogram(), cycle: histogram(), ops: 0, errors: 0 }
    }

    fn add(&mut self, other: &Self) {
        self.acquire.add(&other.acquire).expect("same bounds");
        self.release.add(&other.release).expect("same bounds");
        self.cycle.add(&other.cycle).expect("same bounds");
        self.ops += other.ops;
        self.errors += other.errors;
    }
}

fn micros(duration: Duration) -> u64 {
    u64::try_from(duration.as_micros()).unwrap_or(u64::MAX).max(1)
}

/// Safety checks shared by all clients.
#[derive(Debug, Default)]
struct Checks {
    /// Lock name to the client that holds it, as the clients themselves believe.
    holders: Mutex<HashMap<String, usize>>,
    /// Lock name to the last token seen.
    tokens: Mutex<HashMap<String, u64>>,
    violations: AtomicU64,
    token_regressions: AtomicU64,
}

impl Checks {
    fn acquired(&self, client: usize, guard: &Guard) {
        let name = guard.name().to_owned();
        if let Some(other) = self.holders.lock().expect("not poisoned").insert(name.clone(), client)
            && other != client
        {
            self.violations.fetch_add(1, Ordering::Relaxed);
        }
        let mut tokens = self.tokens.lock().expect("not poisoned");
        let last = tokens.entry(name).or_insert(0);
        if guard.token() <= *last {
            self.token_regressions.fetch_add(1, Ordering::Relaxed);
        }
        *last = guard.token();
    }

    fn releasing(&self, name: &str) {
        self.holders.lock().expect("not poisoned").remove(name);
    }
}

struct Window {
    measure_from: Instant,
    end: Instant,
}

/// A progress bar on standard error while a run is measured, when that is a terminal.
async fn show_progress(window: Arc<Window>, ops: Arc<AtomicU64>) {
    if !std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        return;
    }
    let total = (window.end - window.measure_from).as_secs_f64();
    loop {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let now = Instant::now();
        let done = if now < window.measure_from {
            0.0
        } else {
            (now.min(window.end) - window.measure_from).as_secs_f64()
        };
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let filled = ((done / total) * 30.0) as usize;
        eprint!(
            "\r[{}{}] {done:5.1}/{total:.1} s  {} ops",
            "#".repeat(filled.min(30)),
            " ".repeat(30 - filled.min(30)),
            ops.load(Ordering::Relaxed)
        );
    }
}

/// A 3-node loopback cluster of this binary, stopped when dropped.
struct LocalCluster {
    /// The three nodes first (index = node id - 1), then any `picket kv` stores.
    children: Vec<std::process::Child>,
    endpoints: Vec<String>,
    dir: std::path::PathBuf,
}

/// A loopback port that was free a moment ago.
fn free_port() -> std::io::Result<u16> {
    std::net::TcpListener::bind("127.0.0.1:0")?.local_addr().map(|addr| addr.port())
}

impl LocalCluster {
    fn start() -> anyhow::Result<Self> {
        let dir = std::env::temp_dir().join(format!("picket-bench-cluster-{}", std::process::id()));
        let ports: Vec<u16> = (0..3).map(|_| free_port()).collect::<Result<_, _>>()?;
        let endpoints: Vec<String> = ports.iter().map(|port| format!("127.0.0.1:{port}")).collect();
        let peers = endpoints
            .iter()
            .enumerate()
            .map(|(index, addr)| format!("{}={addr}", index + 1))
            .collect::<Vec<_>>()
            .join(",");
        let binary = std::env::current_exe()?;
        // Built before the first spawn so that a failed spawn still stops the nodes started.
        let mut cluster = Self { children: Vec::new(), endpoints, dir };
        for (index, addr) in cluster.endpoints.iter().enumerate() {
            let node = std::process::Command::new(&binary)
                .args([
                    "serve",
                    "--node-id",
                    &(index + 1).to_string(),
                    "--listen",
                    addr,
                    "--peers",
                    &peers,
                ])
                .arg("--data-dir")
                .arg(cluster.dir.join(format!("node{}", index + 1)))
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()?;
            cluster.children.push(node);
        }
        Ok(cluster)
    }

    /// Starts two `picket kv` stores against the cluster, one fenced and one with `--no-fence`,
    /// guarding `prefix` with `lock`, and returns their URLs once both listen.
    fn start_kv_stores(&mut self, prefix: &str, lock: &str) -> anyhow::Result<(String, String)> {
        let binary = std::env::current_exe()?;
        let mut urls = Vec::new();
        for (name, no_fence) in [("kv-fenced", false), ("kv-unfenced", true)] {
            let addr = format!("127.0.0.1:{}", free_port()?);
            let mut command = std::process::Command::new(&binary);
            command
                .args(["--endpoints", &self.endpoints.join(","), "kv", "serve", "--listen", &addr])
                .arg("--data-dir")
                .arg(self.dir.join(name))
                .args(["--guard", &format!("{prefix}={lock}")])
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null());
            if no_fence {
                command.arg("--no-fence");
            }
            self.children.push(command.spawn()?);
            urls.push(addr);
        }
        for addr in &urls {
            let deadline = Instant::now() + Duration::from_secs(10);
            while std::net::TcpStream::connect(addr).is_err() {
                if Instant::now() > deadline {
                    bail!("the benchmark's kv store on {addr} did not start listening in 10 s");
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        Ok((format!("http://{}", urls[0]), format!("http://{}", urls[1])))
    }

    /// The pid of the leader, once the same node has been reported leader five times in a row
    /// (a first election can be followed by a second one while the nodes start).
    async fn leader_pid(&self, client: &Client) -> anyhow::Result<u32> {
        let (mut last, mut seen) = (0, 0);
        for _ in 0..300 {
            match client.cluster().await {
                Ok(info) if info.leader_id > 0 && info.leader_id == last => seen += 1,
                Ok(info) => (last, seen) = (info.leader_id, 1),
                Err(_) => (last, seen) = (0, 0),
            }
            if last > 0 && seen >= 5 {
                let index = usize::try_from(last - 1)?;
                return Ok(self.children[index].id());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        bail!("the local cluster elected no stable leader in 30 s")
    }
}

impl Drop for LocalCluster {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[allow(clippy::too_many_arguments)]
async fn run_client(
    client: Client,
    index: usize,
    mode: Mode,
    ttl: Duration,
    window: Arc<Window>,
    checks: Arc<Checks>,
    ops: Arc<AtomicU64>,
    max_ops: u64,
) -> anyhow::Result<Recorder> {
    let session = client.session(ttl).await?;
    let name = match mode {
        Mode::Contended => "bench/contended".to_owned(),
        _ => format!("bench/uncontended/{index}"),
    };
    let mut recorder = Recorder::new();
    while Instant::now() < window.end && ops.load(Ordering::Relaxed) < max_ops {
        let started = Instant::now();
        let guard = match session.lock(&name).await {
            Ok(guard) => guard,
            Err(error) => {
                tracing::warn!(%error, "acquire failed");
                recorder.errors += 1;
                continue;
            }
        };
        let acquired = Instant::now();
        checks.acquired(index, &guard);
        checks.releasing(&name);
        let released = guard.release().await;
        let done = Instant::now();
        if released.is_err() {
            recorder.errors += 1;
        }
        if started >= window.measure_from && done <= window.end {
            recorder.acquire.record(micros(acquired - started)).ok();
            recorder.release.record(micros(done - acquired)).ok();
            recorder.cycle.record(micros(done - started)).ok();
            recorder.ops += 1;
            ops.fetch_add(1, Ordering::Relaxed);
        }
    }
    session.close().await.ok();
    Ok(recorder)
}

async fn run_locks(
    args: &BenchArgs,
    connect: &Connect,
) -> anyhow::Result<(Recorder, Arc<Checks>, f64)> {
    let checks = Arc::new(Checks::default());
    let ops = Arc::new(AtomicU64::new(0));
    let mut clients = Vec::with_capacity(args.clients);
    for _ in 0..args.clients {
        clients.push(connect.connect().await.context("connecting a benchmark client")?);
    }
    let start = Instant::now();
    let measure_from = start + Duration::from_secs_f64(args.warmup_secs);
    let window =
        Arc::new(Window { measure_from, end: measure_from + Duration::from_secs_f64(args.secs) });
    let ttl = Duration::from_millis(args.ttl_ms);
    let tasks: Vec<_> = clients
        .into_iter()
        .enumerate()
        .map(|(index, client)| {
            tokio::spawn(run_client(
                client,
                index,
                args.mode,
                ttl,
                window.clone(),
                checks.clone(),
                ops.clone(),
                args.max_ops,
            ))
        })
        .collect();
    let progress = tokio::spawn(show_progress(window.clone(), ops.clone()));
    let mut total = Recorder::new();
    for task in tasks {
        total.add(&task.await??);
    }
    progress.abort();
    if std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        eprint!("\r{:60}\r", "");
    }
    let measured = (window.end.min(Instant::now()) - window.measure_from).as_secs_f64();
    Ok((total, checks, measured))
}

/// Opens many sessions and keeps them alive; counts sessions that were lost.
async fn run_sessions(
    args: &BenchArgs,
    connect: &Connect,
    server_pid: Option<&str>,
) -> anyhow::Result<(u64, u64, Option<f64>, Option<f64>)> {
    // Sessions share a few connections, as many processes on one machine must: one connection
    // per session would exhaust file descriptors long before the server. Each connection's
    // sessions send their keepalives together (KeepAliveMany).
    let connections = args.clients.max(1);
    let ttl = Duration::from_millis(args.ttl_ms);
    let mut openers = Vec::with_capacity(connections);
    for index in 0..connections {
        let client = connect.connect().await?;
        let count = args.sessions / connections + usize::from(index < args.sessions % connections);
        openers.push(tokio::spawn(async move {
            let mut sessions = Vec::with_capacity(count);
            for _ in 0..count {
                sessions.push(client.session(ttl).await?);
            }
            anyhow::Ok(sessions)
        }));
    }
    let mut sessions = Vec::with_capacity(args.sessions);
    for opener in openers {
        sessions.extend(opener.await??);
    }
    eprintln!("picket bench: {} sessions open; keeping them alive", sessions.len());
    // CPU is measured over the steady keepalive window only, after the warm-up.
    tokio::time::sleep(Duration::from_secs_f64(args.warmup_secs)).await;
    let (server_start, client_start, started) =
        (server_pid.and_then(cpu_seconds), cpu_seconds("self"), Instant::now());
    tokio::time::sleep(Duration::from_secs_f64(args.secs)).await;
    let wall = started.elapsed().as_secs_f64();
    let share = |end: Option<f64>, start: Option<f64>| {
        end.zip(start).map(|(end, start)| (end - start) / wall * 100.0)
    };
    let server_cpu = share(server_pid.and_then(cpu_seconds), server_start);
    let client_cpu = share(cpu_seconds("self"), client_start);
    let lost = sessions.iter().filter(|session| session.lost_reason().is_some()).count() as u64;
    Ok((sessions.len() as u64, lost, server_cpu, client_cpu))
}

/// Writes from every client with one grant's sequencer for the window; returns (writes/s,
/// latency histogram, errors).
/// Writes measured against one store: writes, their latencies and the failures.
struct WriteTotals {
    ops: u64,
    measured_secs: f64,
    histogram: Histogram<u64>,
    errors: u64,
}

impl WriteTotals {
    fn new() -> Self {
        let histogram = Histogram::new_with_bounds(1, 120_000_000, 3).expect("valid bounds");
        Self { ops: 0, measured_secs: 0.0, histogram, errors: 0 }
    }

    #[allow(clippy::cast_precision_loss)]
    fn ops_per_s(&self) -> f64 {
        self.ops as f64 / self.measured_secs
    }
}

/// One slice of writes to `url` by every client: `warmup_secs` unmeasured, then `secs` measured,
/// added to `totals`.
async fn run_writes(
    args: &BenchArgs,
    url: &str,
    sequencer: &str,
    (warmup_secs, secs): (f64, f64),
    totals: &mut WriteTotals,
) -> anyhow::Result<()> {
    let measure_from = Instant::now() + Duration::from_secs_f64(warmup_secs);
    let end = measure_from + Duration::from_secs_f64(secs);
    let mut tasks = Vec::new();
    for index in 0..args.clients {
        let mut connection = crate::http_client::Http1Connection::open(url).await?;
        let path = format!("/kv/{}{index}", args.prefix);
        let headers = vec![(picket_fence::http::SEQUENCER_HEADER, sequencer.to_owned())];
        tasks.push(tokio::spawn(async move {
            let mut histogram =
                Histogram::<u64>::new_with_bounds(1, 120_000_000, 3).expect("valid bounds");
            let (mut ops, mut errors) = (0_u64, 0_u64);
            while Instant::now() < end {
                let started = Instant::now();
                let reply =
                    connection.send(hyper::Method::PUT, &path, &headers, b"value".to_vec()).await;
                let done = Instant::now();
                match reply {
                    Ok(reply) if reply.status == 200 => {
                        if started >= measure_from && done <= end {
                            histogram.record(micros(done - started)).ok();
                            ops += 1;
                        }
                    }
                    _ => errors += 1,
                }
            }
            (histogram, ops, errors)
        }));
    }
    for task in tasks {
        let (part, part_ops, part_errors) = task.await?;
        totals.histogram.add(&part).expect("same bounds");
        totals.ops += part_ops;
        totals.errors += part_errors;
    }
    totals.measured_secs += secs;
    Ok(())
}

/// Unmeasured time at the start of every slice after the first, while connections open.
const SLICE_WARMUP_SECS: f64 = 0.1;

async fn run_fenced(args: &BenchArgs, connect: &Connect) -> anyhow::Result<String> {
    let client = connect.connect().await?;
    let session = client.session(Duration::from_millis(args.ttl_ms)).await?;
    let store = HttpFence::new(format!("{}/fence/{}", args.kv.trim_end_matches('/'), args.prefix));
    let guard = session.lock_fenced(&args.lock, &[&store]).await?;
    let sequencer = guard.sequencer().to_string();
    let (mut fenced, mut unfenced) = (WriteTotals::new(), WriteTotals::new());
    match &args.kv_unfenced {
        None => {
            run_writes(args, &args.kv, &sequencer, (args.warmup_secs, args.secs), &mut fenced)
                .await?;
        }
        Some(unfenced_url) => {
            // The two stores are measured in alternating one-second slices, in the order
            // fenced-unfenced then unfenced-fenced, so that drift in a shared, noisy machine
            // falls on both sides alike instead of on whichever ran second.
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            let slices = (args.secs.round() as u32).max(1);
            let slice_secs = args.secs / f64::from(slices);
            for slice in 0..slices {
                let warmup = if slice == 0 { args.warmup_secs } else { SLICE_WARMUP_SECS };
                let mut order = [(&args.kv, &mut fenced), (unfenced_url, &mut unfenced)];
                if slice % 2 == 1 {
                    order.reverse();
                }
                for (url, totals) in order {
                    run_writes(args, url, &sequencer, (warmup, slice_secs), totals).await?;
                }
            }
        }
    }
    let mut line = format!(
        "RESULT system=picket-kv mode=fenced clients={} secs={:.1} ops_per_s={:.0} write_p50_us={} write_p99_us={} errors={}",
        args.clients,
        args.secs,
        fenced.ops_per_s(),
        fenced.histogram.value_at_quantile(0.5),
        fenced.histogram.value_at_quantile(0.99),
        fenced.errors
    );
    if args.kv_unfenced.is_some() {
        use std::fmt::Write;
        let overhead = (unfenced.ops_per_s() / fenced.ops_per_s() - 1.0) * 100.0;
        write!(
            line,
            " unfenced_ops_per_s={:.0} unfenced_p50_us={} unfenced_p99_us={} unfenced_errors={} fence_overhead_pct={overhead:.1}",
            unfenced.ops_per_s(),
            unfenced.histogram.value_at_quantile(0.5),
            unfenced.histogram.value_at_quantile(0.99),
            unfenced.errors
        )
        .expect("writing to a string");
    }
    guard.release().await.ok();
    Ok(format!("{line} tag={}", args.tag))
}

/// What one run found: its RESULT line, and whether the safety checks held (no two holders at
/// once, no token going back); modes that check nothing are safe.
struct Outcome {
    line: String,
    safe: bool,
}

/// Runs the benchmark and prints the RESULT line; exits 3 when a safety check failed.
pub fn run(mut args: BenchArgs, connect: &Connect) -> anyhow::Result<ExitCode> {
    if args.clients == 0 || args.secs <= 0.0 {
        bail!("--clients and --secs must be positive");
    }
    let runtime = tokio::runtime::Runtime::new().context("cannot start the async runtime")?;
    let (cluster, connect) = if args.cluster {
        let cluster = start_local_cluster(&runtime, &mut args)?;
        let connect = Connect::plaintext(cluster.endpoints.clone());
        (Some(cluster), connect)
    } else {
        (None, connect.clone())
    };
    let outcome = runtime.block_on(measure(&args, &connect))?;
    if let Some(cluster) = &cluster {
        // The server's CPU is that of the node that led at the start; say so if it changed.
        let leader_now = runtime.block_on(async {
            let client = Client::connect(cluster.endpoints.clone()).await?;
            cluster.leader_pid(&client).await
        });
        if leader_now.ok() != args.server_pid {
            eprintln!(
                "picket bench: the cluster's leader changed during the run; server_cpu_pct is the first leader's"
            );
        }
    }
    drop(cluster);
    println!("{}", outcome.line);
    Ok(if outcome.safe { ExitCode::SUCCESS } else { ExitCode::from(3) })
}

/// Starts a local 3-node cluster (and, for the fenced mode, its stores) and points `args` at
/// it: the leader's pid for the CPU figures, the stores' URLs.
fn start_local_cluster(
    runtime: &tokio::runtime::Runtime,
    args: &mut BenchArgs,
) -> anyhow::Result<LocalCluster> {
    let mut cluster = LocalCluster::start()?;
    let endpoints = cluster.endpoints.clone();
    let leader = runtime.block_on(async {
        // The nodes need a moment to start listening.
        let mut attempts = 0;
        let client = loop {
            match Client::connect(endpoints.clone()).await {
                Ok(client) => break client,
                Err(error) if attempts >= 50 => {
                    return Err(
                        anyhow::Error::new(error).context("the local cluster did not start")
                    );
                }
                Err(_) => {
                    attempts += 1;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        };
        cluster.leader_pid(&client).await
    })?;
    args.server_pid = Some(leader);
    // The stores connect to the cluster when they start, so they start once it has a leader.
    if args.mode == Mode::Fenced {
        let (fenced, unfenced) = cluster.start_kv_stores(&args.prefix, &args.lock)?;
        args.kv = fenced;
        args.kv_unfenced = Some(unfenced);
    }
    Ok(cluster)
}

/// Runs the chosen mode against the target.
async fn measure(args: &BenchArgs, connect: &Connect) -> anyhow::Result<Outcome> {
    let server_pid = args.server_pid.map(|pid| pid.to_string());
    match args.mode {
        Mode::Fenced => Ok(Outcome { line: run_fenced(args, connect).await?, safe: true }),
        Mode::Sessions => measure_sessions(args, connect, server_pid.as_deref()).await,
        Mode::Uncontended | Mode::Contended => {
            measure_locks(args, connect, server_pid.as_deref()).await
        }
    }
}

fn percent(value: Option<f64>) -> String {
    value.map_or_else(|| "NA".to_owned(), |value| format!("{value:.1}"))
}

async fn measure_sessions(
    args: &BenchArgs,
    connect: &Connect,
    server_pid: Option<&str>,
) -> anyhow::Result<Outcome> {
    let (opened, lost, server_cpu, client_cpu) = run_sessions(args, connect, server_pid).await?;
    let rss = server_pid
        .and_then(|pid| std::fs::read_to_string(format!("/proc/{pid}/status")).ok())
        .and_then(|status| {
            status
                .lines()
                .find(|line| line.starts_with("VmRSS:"))
                .map(|line| line.split_whitespace().nth(1).unwrap_or("0").to_owned())
        });
    let line = format!(
        "RESULT system=picket mode=sessions sessions={opened} connections={} ttl_ms={} secs={:.1} expired={lost} server_cpu_pct={} client_cpu_pct={} server_rss_kb={} tag={}",
        args.clients,
        args.ttl_ms,
        args.secs,
        percent(server_cpu),
        percent(client_cpu),
        rss.unwrap_or_else(|| "NA".to_owned()),
        args.tag
    );
    Ok(Outcome { line, safe: true })
}

async fn measure_locks(
    args: &BenchArgs,
    connect: &Connect,
    server_pid: Option<&str>,
) -> anyhow::Result<Outcome> {
    let server_cpu_start = server_pid.and_then(cpu_seconds);
    let client_cpu_start = cpu_seconds("self");
    let wall = Instant::now();
    let (recorder, checks, measured) = run_locks(args, connect).await?;
    let wall = wall.elapsed().as_secs_f64();
    let share = |end: Option<f64>, start: Option<f64>| {
        end.zip(start).map(|(end, start)| (end - start) / wall * 100.0)
    };
    let server_cpu = share(server_pid.and_then(cpu_seconds), server_cpu_start);
    let client_cpu = share(cpu_seconds("self"), client_cpu_start);
    #[allow(clippy::cast_precision_loss)]
    let ops_per_s = recorder.ops as f64 / measured;
    let mode = if args.mode == Mode::Contended { "contended" } else { "uncontended" };
    let violations = checks.violations.load(Ordering::Relaxed);
    let token_regressions = checks.token_regressions.load(Ordering::Relaxed);
    let line = format!(
        "RESULT system=picket mode={mode} clients={} secs={measured:.1} ops={} ops_per_s={ops_per_s:.0} acq_p50_us={} acq_p99_us={} acq_max_us={} rel_p50_us={} rel_p99_us={} cycle_p50_us={} cycle_p99_us={} errors={} violations={violations} token_regressions={token_regressions} server_cpu_pct={} client_cpu_pct={} tag={}",
        args.clients,
        recorder.ops,
        recorder.acquire.value_at_quantile(0.5),
        recorder.acquire.value_at_quantile(0.99),
        recorder.acquire.max(),
        recorder.release.value_at_quantile(0.5),
        recorder.release.value_at_quantile(0.99),
        recorder.cycle.value_at_quantile(0.5),
        recorder.cycle.value_at_quantile(0.99),
        recorder.errors,
        percent(server_cpu),
        percent(client_cpu),
        args.tag
    );
    Ok(Outcome { line, safe: violations == 0 && token_regressions == 0 })
}
