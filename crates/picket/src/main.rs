//! The `picket` command: the server, and (as they land) the client commands.

mod auth_cmd;
mod bench;
mod chaos;
mod commands;
mod config;
mod connect;
mod demo;
mod duration;
mod http_fence;
mod kv;
mod lock_cmd;
mod logging;
mod serve;
mod sim;
mod terminal;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

// The server and the client spend a tenth of their CPU in the allocator under load; mimalloc
// is measurably cheaper there than the system allocator (see BENCHMARKS.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;
use std::process::ExitCode;

/// Picket: a distributed lock service whose locks are enforced at the resource by fencing
/// tokens.
#[derive(Debug, Parser)]
#[command(name = "picket", version, about, long_about = None)]
struct Cli {
    #[command(flatten)]
    connect: connect::Connect,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// See why fencing matters, in one command: a one-node Picket and two stores (fenced and
    /// not) in a temporary directory, and the canonical race run live against each.
    Demo,
    /// Run a Picket node (a one-node cluster by default).
    Serve(Box<serve::ServeArgs>),
    /// Run a command while holding a lock; stop it if the lock is lost.
    ///
    /// The command sees PICKET_LOCK, PICKET_TOKEN, PICKET_SEQUENCER and PICKET_SESSION. Exit
    /// code: the command's own; 75 if the lock was not acquired; 76 if the lock was lost while
    /// the command ran (the command's whole process group got SIGTERM, then SIGKILL after
    /// --kill-grace).
    Lock(lock_cmd::LockArgs),
    /// Acquire a lock and hold it until interrupted, or, with --session, acquire in an existing
    /// session and exit.
    Acquire(commands::AcquireArgs),
    /// Release a grant by session and token.
    Release(commands::ReleaseArgs),
    /// Show one lock: holder, token, waiters.
    Status(commands::StatusArgs),
    /// List locks, optionally by prefix.
    Locks(commands::LocksArgs),
    /// List sessions, or revoke one (`picket sessions revoke ID`).
    Sessions(commands::SessionsArgs),
    /// Stream events of a lock, a prefix or a session.
    Watch(commands::WatchArgs),
    /// Show the cluster's members and leader, or add or remove a member.
    Members(commands::MembersArgs),
    /// Check whether a sequencer is its lock's current grant (exit 0 if it is, 1 if not).
    Check(commands::CheckArgs),
    /// Back up a running cluster's lock state (`save FILE`), or inspect a backup.
    Snapshot(commands::SnapshotArgs),
    /// The reference fenced key-value store (`picket kv serve`), and writes to it.
    Kv(kv::KvArgs),
    /// The race lab: simulate what each locking strategy lets through (deterministic, seeded).
    Sim(sim::SimArgs),
    /// Measure a running Picket: acquire/release throughput and latency, or many sessions.
    Bench(bench::BenchArgs),
    /// The fault harness: a real cluster, the fenced store and clients under kills and pauses,
    /// with the whole history checked.
    Chaos(chaos::ChaosArgs),
    /// Make a bearer token for the auth file: prints the secret for the client and the line
    /// for the server's auth file.
    Auth(auth_cmd::AuthArgs),
    /// Internal: `picket lock`'s watchdog, which stops the command if `picket lock` dies.
    #[command(name = "__lock-watchdog", hide = true)]
    LockWatchdog(lock_cmd::WatchdogArgs),
    /// Internal: holds `picket lock`'s command's process group open until `picket lock` ends.
    #[command(name = "__lock-group", hide = true)]
    LockGroup,
}

fn run_client_command(command: Command, connect: connect::Connect) -> anyhow::Result<ExitCode> {
    logging::init_plain("error");
    let runtime = tokio::runtime::Runtime::new()?;
    runtime.block_on(async move {
        if let Command::Lock(args) = command {
            return lock_cmd::run(args, &connect).await;
        }
        // A backup travels over gRPC whatever the protocol: its flow control waits for a file
        // written slower than the network brings it, where the wire protocol ends a call left
        // 64 MiB unread.
        let connect = match command {
            Command::Snapshot(_) => {
                connect::Connect { protocol: picket_client::Protocol::Grpc, ..connect }
            }
            _ => connect,
        };
        let client = connect.connect().await?;
        match command {
            Command::Acquire(args) => commands::acquire(args, &client).await,
            Command::Release(args) => commands::release(args, &client).await,
            Command::Status(args) => commands::status(args, &client).await,
            Command::Locks(args) => commands::locks(args, &client).await,
            Command::Sessions(args) => commands::sessions(args, &client).await,
            Command::Watch(args) => commands::watch(args, &client).await,
            Command::Members(args) => commands::members(args, &client).await,
            Command::Check(args) => commands::check(args, &client).await,
            Command::Snapshot(args) => commands::snapshot(args, &client).await,
            Command::Serve(_)
            | Command::Demo
            | Command::Bench(_)
            | Command::Lock(_)
            | Command::Kv(_)
            | Command::Sim(_)
            | Command::Chaos(_)
            | Command::Auth(_)
            | Command::LockWatchdog(_)
            | Command::LockGroup => {
                unreachable!("handled by main")
            }
        }
    })
}

fn main() -> ExitCode {
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let (command, from_file) = match config::apply(Cli::command(), &args) {
        Ok(applied) => applied,
        Err(error) => {
            eprintln!("picket: {error:#}");
            return ExitCode::FAILURE;
        }
    };
    let matches = command.clone().get_matches_from(&args);
    if let Some(("serve", serve)) = matches.subcommand()
        && serve.get_flag("print_config")
    {
        // The flags in their declared order (the config file's defaults moved some to the end).
        let declared = Cli::command();
        let serve_command = declared.find_subcommand("serve").expect("picket has a serve command");
        print!("{}", config::render(serve_command, serve, &from_file));
        return ExitCode::SUCCESS;
    }
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|error| error.exit());
    let result = match cli.command {
        Command::Serve(args) => serve::run(*args),
        Command::Demo => demo::run(),
        Command::Snapshot(args) if args.offline().is_some() => {
            commands::inspect_snapshot(args.offline().expect("checked"))
        }
        Command::Bench(args) => bench::run(args, &cli.connect),
        Command::Kv(args) => kv::run(args, cli.connect),
        Command::Sim(args) => sim::run(&args),
        Command::Chaos(args) => chaos::run(args, cli.connect.endpoints),
        Command::LockWatchdog(args) => Ok(lock_cmd::watchdog(&args)),
        Command::LockGroup => Ok(lock_cmd::group_placeholder()),
        Command::Auth(args) => auth_cmd::run(&args),
        client_command => run_client_command(client_command, cli.connect),
    };
    match result {
        Ok(code) => code,
        Err(error) => {
            eprintln!("picket: {error:#}");
            ExitCode::FAILURE
        }
    }
}
