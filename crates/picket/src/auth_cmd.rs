//! `picket auth token`: a new bearer token, and its digest for the server's auth file.

use clap::{Args, Subcommand};
use std::process::ExitCode;

/// Options of `picket auth`.
#[derive(Debug, Args)]
pub struct AuthArgs {
    #[command(subcommand)]
    command: AuthCommand,
}

#[derive(Debug, Subcommand)]
enum AuthCommand {
    /// Print a new random bearer token (give it to the client, e.g. in a file for
    /// --auth-token-file) and the `token_sha256` line for its principal in the auth file.
    /// With --digest-of-stdin, print the digest of an existing token read from standard input.
    Token {
        /// Read a token from standard input and print only its digest.
        #[arg(long)]
        digest_of_stdin: bool,
    },
}

/// Runs `picket auth`.
///
/// # Errors
/// When the system's random source fails or standard input cannot be read.
pub fn run(args: &AuthArgs) -> anyhow::Result<ExitCode> {
    match args.command {
        AuthCommand::Token { digest_of_stdin: true } => {
            let mut token = String::new();
            std::io::stdin().read_line(&mut token)?;
            let token = token.trim();
            anyhow::ensure!(!token.is_empty(), "standard input holds no token");
            println!("token_sha256 = [\"{}\"]", digest(token));
        }
        AuthCommand::Token { digest_of_stdin: false } => {
            let token = new_token()?;
            println!("token: {token}");
            println!("token_sha256 = [\"{}\"]", digest(&token));
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn digest(token: &str) -> String {
    picket_server::auth::hex(&picket_server::auth::token_digest(token))
}

fn new_token() -> anyhow::Result<String> {
    Ok(picket_server::auth::new_token()?)
}
