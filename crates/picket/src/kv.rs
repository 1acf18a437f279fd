//! `picket kv`: runs the reference fenced resource (the `picket-kv` crate: its routes are in
//! that crate's documentation), and writes to and reads from it. Each key prefix given with
//! `--guard PREFIX=LOCK` is one guarded resource bound to one lock; writes to keys outside every
//! guard are refused. Verify on advance asks Picket through the Rust client.

use anyhow::Context;
use clap::{Args, Subcommand};
use futures_util::future::BoxFuture;
use percent_encoding::utf8_percent_encode;
use picket_client::Client;
use picket_core::{CheckOutcome, NAME_ESCAPES, Sequencer, SequencerKeys};
use picket_fence::Policy;
use picket_fence::http::{
    CheckError, GrantChecker, IDEMPOTENCY_HEADER, SEQ_HEADER, SEQUENCER_HEADER,
};
use picket_kv::KvConfig;
use picket_proto::http1;
use serde_json::Value;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

/// `picket kv`.
#[derive(Debug, Args)]
pub struct KvArgs {
    #[command(subcommand)]
    command: KvCommand,
}

#[derive(Debug, Subcommand)]
enum KvCommand {
    /// Run the fenced key-value store.
    Serve(ServeArgs),
    /// Write a value with the current grant's sequencer (from PICKET_SEQUENCER, as `picket
    /// lock` sets it).
    Put(WriteArgs),
    /// Delete a key with the current grant's sequencer.
    Delete(WriteArgs),
    /// Read a key; with a sequencer, refused if that grant is stale.
    Get(ReadArgs),
}

// `--remembered-keys` and `--remember-keys-for-ms` are bounded by the fence's own bounds.
const _: () = assert!(picket_fence::rule::MAX_REMEMBERED_KEYS == 1_024);
const _: () = assert!(picket_fence::rule::MAX_REMEMBER_KEYS_FOR_MS == 2_592_000_000);

#[derive(Debug, Args)]
struct ServeArgs {
    /// Where the store keeps its data.
    #[arg(long, default_value = "./picket-kv")]
    data_dir: PathBuf,
    /// Address to serve HTTP on.
    #[arg(long, default_value = "127.0.0.1:7690")]
    listen: SocketAddr,
    /// A guarded key prefix and the lock whose tokens it accepts, PREFIX=LOCK (repeatable).
    #[arg(long = "guard", value_parser = parse_guard)]
    guards: Vec<(String, String)>,
    #[command(flatten)]
    logging: crate::logging::LogArgs,
    /// Like --guard, in strict mode: each grant gets exactly one write or unit.
    #[arg(long = "strict-guard", value_parser = parse_guard)]
    strict_guards: Vec<(String, String)>,
    /// Do not ask the lock service about tokens newer than any seen (verify on advance). Without
    /// it, a forged huge token can wedge a resource, and a superseded grant can still write
    /// until the new holder's first write arrives.
    #[arg(long)]
    no_verify: bool,
    /// How long verify on advance waits for the lock service, in milliseconds. Past it, the
    /// write is refused with 503 `unverified_token`; writes that need no verification go on
    /// being served meanwhile.
    #[arg(long, default_value_t = 1_000, value_parser = clap::value_parser!(u64).range(1..=60_000))]
    verify_timeout_ms: u64,
    /// UNSAFE, for measuring the fence's cost only: apply writes without any fence check (the
    /// sequencer header is still required and parsed).
    #[arg(long)]
    no_fence: bool,
    /// How many idempotency keys each guarded resource remembers (its last keyed writes). A
    /// retry within them gets the original outcome; after them it is refused, never applied
    /// twice (see README, "Idempotent retries").
    #[arg(long, default_value_t = picket_fence::rule::DEFAULT_REMEMBERED_KEYS,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=1_024))]
    remembered_keys: usize,
    /// How long each guarded resource remembers an idempotency key, in milliseconds (a day
    /// unless told; at most 30 days). A key is forgotten at whichever of this and
    /// --remembered-keys comes first; a retry after it is refused, never applied twice.
    #[arg(long, default_value_t = picket_fence::rule::DEFAULT_REMEMBER_KEYS_FOR_MS,
          value_parser = clap::value_parser!(u64).range(1..=2_592_000_000))]
    remember_keys_for_ms: u64,
    /// Take only sequencers signed by the lock service with one of the public keys in this PEM
    /// file (one or more `PUBLIC KEY` blocks, e.g. `openssl pkey -in signing-key.pem -pubout`):
    /// a forged, altered or unsigned sequencer is refused with 403 `bad_signature` before any
    /// other rule, without asking the lock service.
    #[arg(long, env = "PICKET_SEQUENCER_KEYS")]
    sequencer_keys: Option<PathBuf>,
    /// The cluster whose signed sequencers are taken (the lock service's --cluster-id).
    #[arg(long, env = "PICKET_CLUSTER_ID", default_value = picket_server::DEFAULT_CLUSTER_ID)]
    cluster_id: String,
}

#[derive(Debug, Args)]
struct WriteArgs {
    /// The store's URL, e.g. http://127.0.0.1:7690.
    #[arg(long, env = "PICKET_KV", default_value = "http://127.0.0.1:7690")]
    kv: String,
    /// The sequencer of the grant writing.
    #[arg(long, env = "PICKET_SEQUENCER")]
    sequencer: String,
    /// Sequence number of this write within the grant.
    #[arg(long)]
    seq: Option<u64>,
    /// Idempotency key: a retry with the same key and stamp gets the original outcome.
    #[arg(long)]
    idempotency_key: Option<String>,
    /// The key.
    key: String,
    /// The value (for put).
    value: Option<String>,
}

#[derive(Debug, Args)]
struct ReadArgs {
    /// The store's URL.
    #[arg(long, env = "PICKET_KV", default_value = "http://127.0.0.1:7690")]
    kv: String,
    /// Check this grant is not stale before reading.
    #[arg(long)]
    sequencer: Option<String>,
    /// The key.
    key: String,
}

fn parse_guard(text: &str) -> Result<(String, String), String> {
    let (prefix, lock) =
        text.split_once('=').ok_or_else(|| format!("{text:?} is not PREFIX=LOCK"))?;
    if prefix.is_empty() || lock.is_empty() {
        return Err(format!("{text:?}: both the prefix and the lock must be non-empty"));
    }
    Ok((prefix.to_owned(), lock.to_owned()))
}

/// Runs `picket kv`.
pub fn run(args: KvArgs, connect: crate::connect::Connect) -> anyhow::Result<ExitCode> {
    let runtime = tokio::runtime::Runtime::new().context("cannot start the async runtime")?;
    runtime.block_on(async move {
        match args.command {
            KvCommand::Serve(serve_args) => serve(serve_args, connect).await,
            KvCommand::Put(write) => write_command(write, true).await,
            KvCommand::Delete(write) => write_command(write, false).await,
            KvCommand::Get(read) => read_command(read).await,
        }
    })
}

/// Asks Picket over gRPC; connects on first use so the store starts without the service.
struct PicketChecker {
    connect: crate::connect::Connect,
    client: tokio::sync::OnceCell<Client>,
}

impl GrantChecker for PicketChecker {
    fn check<'a>(
        &'a self,
        sequencer: &'a Sequencer,
    ) -> BoxFuture<'a, Result<CheckOutcome, CheckError>> {
        Box::pin(async move {
            let client = self
                .client
                .get_or_try_init(|| self.connect.connect())
                .await
                .map_err(|error| CheckError::Unreachable(error.into()))?;
            client
                .check(&sequencer.to_string())
                .await
                .map_err(|error| CheckError::Unreachable(error.into()))
        })
    }
}

async fn serve(args: ServeArgs, connect: crate::connect::Connect) -> anyhow::Result<ExitCode> {
    args.logging.init("info")?;
    if args.guards.is_empty() && args.strict_guards.is_empty() {
        anyhow::bail!("give at least one --guard PREFIX=LOCK: the store only takes fenced writes");
    }
    let guards: Vec<(String, Policy)> = args
        .guards
        .iter()
        .map(|(prefix, lock)| (prefix.clone(), Policy::new(lock.clone())))
        .chain(
            args.strict_guards
                .iter()
                .map(|(prefix, lock)| (prefix.clone(), Policy::new(lock.clone()).strict())),
        )
        .map(|(prefix, policy)| {
            let policy = policy
                .remembering_keys(args.remembered_keys)
                .remembering_keys_for_ms(args.remember_keys_for_ms);
            (prefix, policy)
        })
        .collect();
    let checker: Option<Arc<dyn GrantChecker>> = if args.no_verify {
        None
    } else {
        Some(Arc::new(PicketChecker { connect, client: tokio::sync::OnceCell::new() }))
    };
    let sequencer_keys = match &args.sequencer_keys {
        Some(path) => {
            let keys = read_sequencer_keys(path, &args.cluster_id)?;
            tracing::info!(keys = ?keys.key_ids().collect::<Vec<_>>(), "taking only signed sequencers");
            Some(keys)
        }
        None => None,
    };
    if args.no_fence {
        tracing::warn!(
            "--no-fence: writes are applied without any fence check; for benchmarks only"
        );
    }
    let app = picket_kv::router(KvConfig {
        data_dir: args.data_dir.clone(),
        guards,
        checker,
        verify_timeout: std::time::Duration::from_millis(args.verify_timeout_ms),
        sequencer_keys,
        fenced: !args.no_fence,
    })?;
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    let addr = listener.local_addr()?;
    println!("picket kv: listening on {addr} (data in {})", args.data_dir.display());
    use std::io::Write;
    std::io::stdout().flush().ok();
    let listener = axum::serve::ListenerExt::tap_io(listener, |stream| {
        stream.set_nodelay(true).ok();
    });
    axum::serve(listener, app)
        .with_graceful_shutdown(async {
            tokio::signal::ctrl_c().await.ok();
        })
        .await?;
    Ok(ExitCode::SUCCESS)
}

/// The public keys of a cluster's sequencer signing keys, from a PEM file.
fn read_sequencer_keys(path: &std::path::Path, cluster_id: &str) -> anyhow::Result<SequencerKeys> {
    let spkis = picket_proto::tls::read_public_keys(path)?;
    SequencerKeys::from_spki(cluster_id, spkis.iter().map(Vec::as_slice))
        .with_context(|| format!("cannot use the public keys in {}", path.display()))
}

fn stamp_headers(
    sequencer: &str,
    seq: Option<u64>,
    idempotency_key: Option<&String>,
) -> Vec<(&'static str, String)> {
    let mut headers = vec![(SEQUENCER_HEADER, sequencer.to_owned())];
    if let Some(seq) = seq {
        headers.push((SEQ_HEADER, seq.to_string()));
    }
    if let Some(key) = idempotency_key {
        headers.push((IDEMPOTENCY_HEADER, key.clone()));
    }
    headers
}

/// Prints the store's answer; refusals go to stderr with the structured fields.
fn report(reply: &http1::Http1Reply) -> ExitCode {
    let body: Value = serde_json::from_slice(&reply.body).unwrap_or(Value::Null);
    if (200..300).contains(&reply.status) {
        println!("{}", reply.text());
        return ExitCode::SUCCESS;
    }
    let message = body["message"].as_str().map_or_else(|| reply.text(), str::to_owned);
    eprintln!("picket kv: refused ({}): {message}", reply.status);
    eprintln!("{}", reply.text());
    ExitCode::FAILURE
}

/// A key's URL: escaped like a sequencer's name, so a key may hold any UTF-8 (`?`, `#`, `%`
/// and spaces included) and still name itself.
fn key_url(kv: &str, key: &str) -> String {
    format!("{}/kv/{}", kv.trim_end_matches('/'), utf8_percent_encode(key, NAME_ESCAPES))
}

async fn write_command(args: WriteArgs, is_put: bool) -> anyhow::Result<ExitCode> {
    let url = key_url(&args.kv, &args.key);
    let headers = stamp_headers(&args.sequencer, args.seq, args.idempotency_key.as_ref());
    let headers: Vec<(&str, String)> = headers.into_iter().collect();
    let reply = if is_put {
        let value = args.value.context("give the value to write")?;
        http1::send(hyper::Method::PUT, &url, &headers, value.into_bytes()).await?
    } else {
        http1::send(hyper::Method::DELETE, &url, &headers, Vec::new()).await?
    };
    Ok(report(&reply))
}

async fn read_command(args: ReadArgs) -> anyhow::Result<ExitCode> {
    let url = key_url(&args.kv, &args.key);
    let headers =
        args.sequencer.map(|sequencer| stamp_headers(&sequencer, None, None)).unwrap_or_default();
    let reply = http1::send(hyper::Method::GET, &url, &headers, Vec::new()).await?;
    if reply.status == 200 {
        use std::io::Write;
        std::io::stdout().write_all(&reply.body)?;
        println!();
        return Ok(ExitCode::SUCCESS);
    }
    Ok(report(&reply))
}
