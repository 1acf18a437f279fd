//! `picket chaos`: the fault harness. `picket chaos run` starts a real 3-node cluster, the
//! reference fenced store and client processes, injects faults drawn from a seed, and checks the
//! whole history (see [`check`]); `picket chaos client` is one of its client processes.

mod check;
mod client;
mod delay;
mod disk;
mod harness;
mod history;
mod holder;
mod linearizable;
mod membership;
mod nemesis;
mod network;
mod plan;
mod processes;

use crate::duration::parse_duration;
use anyhow::Context;
use clap::{Args, Subcommand};
use plan::{FaultKind, Mutation, RunPlan};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

/// `picket chaos`.
#[derive(Debug, Args)]
pub struct ChaosArgs {
    #[command(subcommand)]
    command: ChaosCommand,
}

#[derive(Debug, Subcommand)]
enum ChaosCommand {
    /// Run a cluster, the fenced store and clients under faults, then check the history.
    ///
    /// Prints a verdict line (valid, invalid or unknown) and writes the history, the summary
    /// and every process's log to --out. Exit code 0 only for `valid`.
    Run(RunArgs),
    /// One client process of a run (started by `picket chaos run`).
    #[command(hide = true)]
    Client(ClientArgs),
    /// Joins a cgroup, then runs this binary with the given arguments (used by
    /// `picket chaos run` so that its partitions can tell the processes apart).
    #[command(hide = true)]
    Enter(EnterArgs),
}

#[derive(Debug, Args)]
struct EnterArgs {
    /// The `cgroup.procs` file of the cgroup to join.
    #[arg(long)]
    procs: PathBuf,
    /// The arguments to run this binary with.
    #[arg(last = true, required = true)]
    args: Vec<String>,
}

#[derive(Debug, Args)]
struct RunArgs {
    /// How long the clients work under faults, e.g. 60s or 10m.
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    duration: Duration,
    /// Seed of the fault schedule; the same seed draws the same schedule.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Client processes.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=32))]
    clients: u32,
    /// Where to put the nodes' data, the logs, history.jsonl and summary.json (created; a
    /// fresh directory under the system's temporary directory by default).
    #[arg(long)]
    out: Option<PathBuf>,
    /// The nodes' shortest election timeout.
    #[arg(long, default_value = "500ms", value_parser = parse_duration)]
    election_timeout: Duration,
    /// The clients' session TTL.
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    ttl: Duration,
    /// The clients' longest think time between reading and writing.
    #[arg(long, default_value = "100ms", value_parser = parse_duration)]
    think: Duration,
    /// Longest gap between two faults.
    #[arg(long, default_value = "3s", value_parser = parse_duration)]
    fault_gap: Duration,
    /// The faults to draw from, comma-separated: leader_kill_quick, leader_kill_long,
    /// follower_kill, client_pause, holder_pause, holder_pause_failover, leader_pause,
    /// leader_clock_jump, leader_clock_rate, partition_leader, partition_split,
    /// partition_one_way, partition_bridge, client_isolate, cluster_restart, store_restart, power_loss, cluster_power_loss,
    /// disk_full, fsync_failure, link_delay, client_link_delay, member_replace. The partitions need root, nftables and cgroup v2; disk_full
    /// needs root (each node's data is a tmpfs of its own); the power losses and fsync_failure
    /// need a test build (below).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "leader_kill_quick,leader_kill_long,follower_kill,client_pause",
        value_parser = FaultKind::parse
    )]
    faults: Vec<FaultKind>,
    /// A deliberate bug, to show the checker catches it: fence_admits_everything (the store
    /// runs with --no-fence), token_counter_resets_on_restart, wal_acknowledges_before_sync or
    /// leader_expires_without_refresh (these three only in test builds, which compile
    /// picket-server's `mutations` feature, as the power losses do). The verdict should then
    /// be `invalid`.
    #[arg(long, value_parser = Mutation::parse)]
    mutation: Option<Mutation>,
}

#[derive(Debug, Args)]
struct ClientArgs {
    #[arg(long)]
    process: u32,
    #[arg(long)]
    kv: String,
    #[arg(long)]
    ttl_ms: u64,
    #[arg(long)]
    think_ms: u64,
    #[arg(long)]
    seed: u64,
}

/// Runs `picket chaos`.
///
/// # Errors
/// When the run cannot be set up.
pub fn run(args: ChaosArgs, endpoints: Vec<String>) -> anyhow::Result<ExitCode> {
    crate::logging::init_plain("warn");
    match args.command {
        ChaosCommand::Enter(enter) => match network::enter(&enter.procs, &enter.args)? {},
        ChaosCommand::Client(args) => {
            let runtime = tokio::runtime::Runtime::new()?;
            let plan = client::ClientPlan {
                process: args.process,
                kv: args.kv,
                lock: "chaos".into(),
                key: "chaos/list".into(),
                prefix: "chaos/".into(),
                ttl: Duration::from_millis(args.ttl_ms),
                think: Duration::from_millis(args.think_ms),
                seed: args.seed,
            };
            runtime.block_on(client::run(plan, endpoints))?;
            Ok(ExitCode::SUCCESS)
        }
        ChaosCommand::Run(args) => tokio::runtime::Runtime::new()?.block_on(run_harness(args)),
    }
}

async fn run_harness(args: RunArgs) -> anyhow::Result<ExitCode> {
    refuse_what_this_build_cannot_do(&args.faults, args.mutation)?;
    let out = match args.out {
        Some(out) => out,
        None => {
            std::env::temp_dir().join(format!("picket-chaos-{}-{}", args.seed, std::process::id()))
        }
    };
    let plan = RunPlan {
        duration: args.duration,
        seed: args.seed,
        clients: args.clients,
        out: out.clone(),
        election_timeout: args.election_timeout,
        ttl: args.ttl,
        think: args.think,
        faults: args.faults,
        max_fault_gap: args.fault_gap,
        mutation: args.mutation,
    };
    eprintln!(
        "picket chaos: {} s, seed {}, {} clients, faults {:?}; output in {}",
        plan.duration.as_secs(),
        plan.seed,
        plan.clients,
        plan.faults.iter().map(|kind| kind.name()).collect::<Vec<_>>(),
        out.display()
    );
    let summary = harness::run(&plan).await?;
    let json = serde_json::to_string_pretty(&summary)?;
    std::fs::write(out.join("summary.json"), &json)
        .with_context(|| format!("cannot write {}", out.join("summary.json").display()))?;
    println!("{json}");
    let verdict = match summary.verdict {
        check::Verdict::Valid => "valid",
        check::Verdict::Invalid => "invalid",
        check::Verdict::Unknown => "unknown",
    };
    println!(
        "chaos: {verdict} ({} grants, {} elements, {} violations, faults {:?})",
        summary.grants,
        summary.final_elements,
        summary.violations.len(),
        summary.faults
    );
    Ok(if summary.verdict == check::Verdict::Valid { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

/// Refuses faults and mutations that need the test storage faults when this build lacks them:
/// such a run would only kill the nodes, or run without the bug, and say little.
fn refuse_what_this_build_cannot_do(
    faults: &[FaultKind],
    mutation: Option<Mutation>,
) -> anyhow::Result<()> {
    if picket_server::TEST_FAULTS_COMPILED {
        return Ok(());
    }
    let needs_test_build =
        [FaultKind::PowerLoss, FaultKind::ClusterPowerLoss, FaultKind::SyncFailure];
    let mut asked: Vec<&str> = faults
        .iter()
        .filter(|kind| needs_test_build.contains(kind))
        .map(|kind| kind.name())
        .collect();
    asked.extend(
        mutation
            .filter(|mutation| *mutation != Mutation::FenceAdmitsEverything)
            .map(Mutation::name),
    );
    if asked.is_empty() {
        return Ok(());
    }
    anyhow::bail!(
        "{} needs the test storage faults, which this build lacks: build with `cargo build \
         --release -p picket --features picket-server/mutations` (never for production)",
        asked.join(", ")
    )
}
