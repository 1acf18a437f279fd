//! The `picket` command: the server, and (as they land) the client commands.

mod serve;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

/// Picket: a distributed lock service whose locks are enforced at the resource by fencing
/// tokens.
#[derive(Debug, Parser)]
#[command(name = "picket", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run a Picket node (a one-node cluster by default).
    Serve(serve::ServeArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Serve(args) => serve::run(args),
    };
    match result {
        Ok(code) => code,
        Err(error) => {
            eprintln!("picket: {error:#}");
            ExitCode::FAILURE
        }
    }
}
