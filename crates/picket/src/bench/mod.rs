//! `picket bench`: drives a running Picket with concurrent clients and prints one `RESULT` line
//! in the format of `../shared/peerbench`, so Picket lines up with etcd, ZooKeeper and Redis.
//!
//! Each client has its own connection and session. While it runs, the benchmark checks mutual
//! exclusion (no two of its clients hold one lock at once) and that tokens of each lock only
//! grow; both counts must be 0.

mod chain;
mod cluster;
mod fenced;
mod locks;
mod sessions;

use crate::connect::Connect;
use anyhow::{Context, bail};
use chain::measure_chain;
use clap::{Args, ValueEnum};
use cluster::start_local_cluster;
use fenced::run_fenced;
use locks::measure_locks;
use picket_client::Client;
use sessions::measure_sessions;
use std::process::ExitCode;

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
    /// No network: start a node in this process on a temporary directory and measure, in
    /// interleaved rounds, `fdatasync` into preallocated space there, one writer's acquire and
    /// release through the node's own API, handoffs among `--clients` tasks, and cycles of as
    /// many tasks each on a lock of its own (`--secs` for each of the last two, split over the
    /// rounds; no warm-up; `--endpoints`, `--server-pid` and `--max-ops` are not used). What a
    /// write costs above its sync is the node's pipeline.
    Chain,
}

/// Options of `picket bench`.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// What to measure.
    #[arg(long, value_enum, default_value_t = Mode::Uncontended)]
    mode: Mode,
    /// Concurrent clients, each with its own connection and session (in `chain` mode, tasks
    /// in this process, each with its own session).
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
    if args.mode == Mode::Chain && args.cluster {
        bail!("--mode chain starts its own node in this process; leave out --cluster");
    }
    let runtime = tokio::runtime::Runtime::new().context("cannot start the async runtime")?;
    let (cluster, connect) = if args.cluster {
        let cluster = start_local_cluster(&runtime, &mut args)?;
        let connect =
            Connect { protocol: connect.protocol, ..Connect::plaintext(cluster.endpoints.clone()) };
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

/// Runs the chosen mode against the target.
async fn measure(args: &BenchArgs, connect: &Connect) -> anyhow::Result<Outcome> {
    let server_pid = args.server_pid.map(|pid| pid.to_string());
    match args.mode {
        Mode::Fenced => Ok(Outcome { line: run_fenced(args, connect).await?, safe: true }),
        Mode::Chain => measure_chain(args).await,
        Mode::Sessions => measure_sessions(args, connect, server_pid.as_deref()).await,
        Mode::Uncontended | Mode::Contended => {
            measure_locks(args, connect, server_pid.as_deref()).await
        }
    }
}

fn percent(value: Option<f64>) -> String {
    value.map_or_else(|| "NA".to_owned(), |value| format!("{value:.1}"))
}
