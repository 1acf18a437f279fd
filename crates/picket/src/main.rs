//! The `picket` command: the server, and (as they land) the client commands.

mod bench;
mod serve;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

/// Picket: a distributed lock service whose locks are enforced at the resource by fencing
/// tokens.
#[derive(Debug, Parser)]
#[command(name = "picket", version, about, long_about = None)]
struct Cli {
    /// Picket servers to talk to (any member of the cluster), comma-separated HOST:PORT.
    #[arg(long, global = true, env = "PICKET_ENDPOINTS", value_delimiter = ',', default_value = "127.0.0.1:7687")]
    endpoints: Vec<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run a Picket node (a one-node cluster by default).
    Serve(serve::ServeArgs),
    /// Measure a running Picket: acquire/release throughput and latency, or many sessions.
    Bench(bench::BenchArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Serve(args) => serve::run(args),
        Command::Bench(args) => bench::run(args, cli.endpoints),
    };
    match result {
        Ok(code) => code,
        Err(error) => {
            eprintln!("picket: {error:#}");
            ExitCode::FAILURE
        }
    }
}
