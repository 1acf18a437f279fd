//! `picket serve`.

use anyhow::{Context, bail};
use clap::Args;
use picket_server::clock::ClockSource;
use picket_server::limits::LimitOverrides;
use picket_server::tls::TlsFiles;
use picket_server::{DEFAULT_PORT, Member, NodeId, RaftTuning, ServerConfig, ServerLimits};
use std::collections::BTreeMap;
use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

/// Options of `picket serve`. Each may also be set by its `PICKET_*` environment variable or
/// in the `--config` file (see `config.rs`): a flag beats the environment, which beats the file,
/// which beats the default.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Read settings from this TOML file: `key = value` per flag, named as the flag without its
    /// dashes (`data-dir = "/var/lib/picket"`, `metrics-prefix = ["jobs/", "tenants/"]`).
    #[arg(long, env = crate::config::CONFIG_ENV)]
    config: Option<PathBuf>,
    /// Print the settings this node would run with, each with where it came from (flag,
    /// environment, file or default), as TOML, and exit.
    #[arg(long)]
    print_config: bool,
    /// Where this node keeps its log, vote and snapshots. The log's write-ahead segments are
    /// allocated up front, 64 MiB each unless --wal-segment-bytes says otherwise (under `wal/`).
    #[arg(long, env = "PICKET_DATA_DIR", default_value = "./picket-data")]
    data_dir: PathBuf,
    /// Address to listen on for clients (gRPC and HTTP on one port), and for peers unless
    /// --peer-listen gives them their own. Port 0 picks a free port; the chosen address is
    /// printed on standard output.
    #[arg(long, env = "PICKET_LISTEN", default_value_t = SocketAddr::from(([127, 0, 0, 1], DEFAULT_PORT)))]
    listen: SocketAddr,
    /// Address clients (and peers, without --peer-listen) use to reach this node, if not the
    /// listen address.
    #[arg(long, env = "PICKET_ADVERTISE")]
    advertise: Option<String>,
    /// Serve peers' Raft traffic on this address only, with its own connection bound
    /// (--max-peer-connections), so that clients can neither send Raft messages nor crowd
    /// peers out. Every node's --peers entry then gives both addresses, ID=CLIENT/PEER.
    #[arg(long, env = "PICKET_PEER_LISTEN")]
    peer_listen: Option<SocketAddr>,
    /// Address peers use to reach --peer-listen, if not that address.
    #[arg(long, env = "PICKET_PEER_ADVERTISE", requires = "peer_listen")]
    peer_advertise: Option<String>,
    /// This node's id, a positive number unique in the cluster and never reused.
    #[arg(long, env = "PICKET_NODE_ID", default_value_t = 1)]
    node_id: NodeId,
    /// The initial voters, this node included, as ID=HOST:PORT pairs separated by commas, e.g.
    /// 1=127.0.0.1:7687,2=127.0.0.1:7688,3=127.0.0.1:7689; a node with --peer-listen as
    /// ID=CLIENT_HOST:PORT/PEER_HOST:PORT. Every initial voter gets the same list. Omit for a
    /// one-node cluster.
    #[arg(long, env = "PICKET_PEERS", value_parser = parse_peers)]
    peers: Option<BTreeMap<NodeId, Member>>,
    /// Start without forming a cluster, to be added later with `AddMember` on the leader.
    #[arg(long, env = "PICKET_JOIN")]
    join: bool,
    /// Leader heartbeat period, in milliseconds.
    #[arg(long, env = "PICKET_HEARTBEAT_MS", default_value_t = RaftTuning::default().heartbeat_ms)]
    heartbeat_ms: u64,
    /// Shortest election timeout, in milliseconds (the longest is twice this).
    #[arg(long, env = "PICKET_ELECTION_TIMEOUT_MS", default_value_t = RaftTuning::default().election_timeout_min_ms)]
    election_timeout_ms: u64,
    /// Build a snapshot and compact the log after this many entries, or after an eighth of
    /// the state's sessions and locks when that is more (a large state's snapshots are further
    /// apart, so their cost per entry stays bounded).
    #[arg(long, env = "PICKET_SNAPSHOT_EVERY", default_value_t = RaftTuning::default().snapshot_every_entries)]
    snapshot_every: u64,
    /// Entries kept in the log behind a snapshot.
    #[arg(long, env = "PICKET_KEEP_ENTRIES", default_value_t = RaftTuning::default().keep_entries_after_snapshot)]
    keep_entries: u64,
    /// Space allocated up front for each segment of the write-ahead log, in bytes (64 KiB to
    /// 1 GiB). A sync into allocated space is cheaper than one that grows the file.
    #[arg(long, env = "PICKET_WAL_SEGMENT_BYTES", default_value_t = RaftTuning::default().wal_segment_bytes)]
    wal_segment_bytes: u64,
    /// For fault tests only: take the lock state's time from a script file holding
    /// `rate=R jump_ms=J` (the clock runs R times real time, plus a total jump of J ms), reread
    /// every 10 ms. Raft's own timers keep the real clock.
    #[arg(long, hide = true)]
    test_clock_file: Option<PathBuf>,
    /// For rolling-upgrade tests only (builds with the test faults): act as an older build that
    /// knows apply rules up to this version.
    #[arg(long, hide = true)]
    test_apply_rules: Option<u32>,
    /// Most watch streams open on this node at once; more get 429 `too_many_watch_streams`.
    #[arg(long, env = "PICKET_MAX_WATCH_STREAMS", default_value_t = ServerLimits::default().max_watch_streams)]
    max_watch_streams: usize,
    /// Most sessions this node's watches follow in all (a watch counts each session it names
    /// once, and of a set none that had ended, but one if all had); a watch past it gets 429
    /// `too_many_watched_sessions`.
    #[arg(long, env = "PICKET_MAX_WATCHED_SESSIONS", default_value_t = ServerLimits::default().max_watched_sessions, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=ServerLimits::MOST_WATCHED_SESSIONS))]
    max_watched_sessions: usize,
    /// Most acquire requests in flight on this node at once (waiting ones included); more get
    /// 429 `too_many_pending_acquires`.
    #[arg(long, env = "PICKET_MAX_PENDING_ACQUIRES", default_value_t = ServerLimits::default().max_pending_acquires)]
    max_pending_acquires: usize,
    /// Most connections open on this node's client port at once (peers' too, without
    /// --peer-listen); past it the node stops accepting there until one closes. The open-files
    /// limit is raised to fit it where it can be.
    #[arg(long, env = "PICKET_MAX_CONNECTIONS", default_value_t = ServerLimits::default().max_connections, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=ServerLimits::MOST_CONNECTIONS_BOUND))]
    max_connections: usize,
    /// Most connections open on the client port at once from one IP address; a further one
    /// from it is closed at once. Raise it when many clients share an address (a NAT, a proxy).
    #[arg(long, env = "PICKET_MAX_CONNECTIONS_PER_IP", default_value_t = ServerLimits::default().max_connections_per_ip, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=ServerLimits::MOST_CONNECTIONS_BOUND))]
    max_connections_per_ip: usize,
    /// Most connections open on the peer port (--peer-listen) at once.
    #[arg(long, env = "PICKET_MAX_PEER_CONNECTIONS", default_value_t = ServerLimits::default().max_peer_connections, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=ServerLimits::MOST_CONNECTIONS_BOUND))]
    max_peer_connections: usize,
    /// How long a connection may stay open with no request or stream open before the node
    /// closes it (gracefully: an HTTP/2 client connects again on its next call), in ms.
    #[arg(long, env = "PICKET_IDLE_CONNECTION_TIMEOUT_MS", default_value_t = idle_connection_timeout_ms_default(), value_parser = clap::builder::RangedU64ValueParser::<u64>::new().range(100..=86_400_000))]
    idle_connection_timeout_ms: u64,
    /// Largest HTTP request body this node reads, in bytes; a larger one gets 413
    /// `body_too_large`.
    #[arg(long, env = "PICKET_MAX_HTTP_BODY_BYTES", default_value_t = ServerLimits::default().max_http_body_bytes, value_parser = request_bytes())]
    max_http_body_bytes: usize,
    /// Largest gRPC request message this node decodes, in bytes; a larger one gets
    /// `RESOURCE_EXHAUSTED`.
    #[arg(long, env = "PICKET_MAX_GRPC_MESSAGE_BYTES", default_value_t = ServerLimits::default().max_grpc_message_bytes, value_parser = request_bytes())]
    max_grpc_message_bytes: usize,
    /// Most bytes of request bodies this node reads at once over all its connections: a body
    /// still on its way holds its bound (an HTTP body its declared length, a gRPC message
    /// --max-grpc-message-bytes) until it is read, and one client host may hold a quarter of
    /// it; past that a request gets 429 `too_many_request_bodies`. At least four times the
    /// larger of --max-grpc-message-bytes (plus 5) and --max-http-body-bytes.
    #[arg(long, env = "PICKET_MAX_BODY_BYTES_IN_FLIGHT", default_value_t = ServerLimits::default().max_body_bytes_in_flight, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(ServerLimits::LEAST_BODY_BYTES_IN_FLIGHT..=ServerLimits::MOST_BODY_BYTES_IN_FLIGHT))]
    max_body_bytes_in_flight: usize,
    /// Most streams (requests and watch streams) open at once on one HTTP/2 connection; a
    /// client past it waits for one to end.
    #[arg(long, env = "PICKET_MAX_STREAMS_PER_CONNECTION", default_value_t = ServerLimits::default().max_streams_per_connection, value_parser = clap::builder::RangedU64ValueParser::<u32>::new().range(1..=ServerLimits::MOST_STREAMS_PER_CONNECTION))]
    max_streams_per_connection: u32,
    /// Most sessions open at once in the cluster; more get 429 `too_many_sessions` (200,000 in
    /// a new cluster). This and the ten limits below are the lock state's: while it leads, a
    /// node writes the ones it is given into the state, and every node enforces what the state
    /// holds; a node given none leaves them as they are. Give every node the same. Lowered
    /// below what is in use, a limit waits until enough has ended.
    #[arg(long, env = "PICKET_MAX_SESSIONS", value_parser = at_least_one())]
    max_sessions: Option<usize>,
    /// Most locks held, awaited or in lock-delay at once in the cluster; more get 429
    /// `too_many_locks` (1,000,000 in a new cluster).
    #[arg(long, env = "PICKET_MAX_LOCKS", value_parser = at_least_one())]
    max_locks: Option<usize>,
    /// Most locks one session may hold or wait for at once; more get 429
    /// `too_many_locks_for_session` (1,000 in a new cluster).
    #[arg(long, env = "PICKET_MAX_LOCKS_PER_SESSION", value_parser = at_least_one())]
    max_locks_per_session: Option<usize>,
    /// Most sessions waiting for one lock; more get 429 `too_many_waiters` (10,000 in a new
    /// cluster).
    #[arg(long, env = "PICKET_MAX_WAITERS_PER_LOCK", value_parser = at_least_one())]
    max_waiters_per_lock: Option<usize>,
    /// Most sessions one tick of the leader renews: at least the sessions limit, so every
    /// session can be renewed at once, and at most 1,000,000 (200,000 in a new cluster).
    #[arg(long, env = "PICKET_MAX_RENEWALS_PER_TICK", value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=picket_core::MAX_RENEWALS_PER_TICK_CAP as u64))]
    max_renewals_per_tick: Option<usize>,
    /// Longest lock name, in bytes, at most 65,536 (256 in a new cluster). Raising it far may
    /// call for a larger --max-http-body-bytes and --max-grpc-message-bytes too.
    #[arg(long, env = "PICKET_MAX_NAME_BYTES", value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=picket_core::MAX_NAME_BYTES_CAP as u64))]
    max_name_bytes: Option<usize>,
    /// Shortest session TTL a client may ask for, in ms (1,000 in a new cluster; at least the
    /// 500 ms expiry grace).
    #[arg(long, env = "PICKET_MIN_TTL_MS", value_parser = clap::builder::RangedU64ValueParser::<u64>::new().range(1..))]
    min_ttl_ms: Option<u64>,
    /// Longest session TTL a client may ask for, in ms (one hour in a new cluster).
    #[arg(long, env = "PICKET_MAX_TTL_MS", value_parser = clap::builder::RangedU64ValueParser::<u64>::new().range(1..))]
    max_ttl_ms: Option<u64>,
    /// Longest lock-delay a session may ask for, in ms (60 s in a new cluster).
    #[arg(long, env = "PICKET_MAX_LOCK_DELAY_MS")]
    max_lock_delay_ms: Option<u64>,
    /// Longest bounded wait of an acquire, in ms (one hour in a new cluster).
    #[arg(long, env = "PICKET_MAX_WAIT_MS")]
    max_wait_ms: Option<u64>,
    /// Most entries one listing returns (1,000 in a new cluster).
    #[arg(long, env = "PICKET_MAX_LIST", value_parser = at_least_one())]
    max_list: Option<usize>,
    /// Serve TLS with this certificate chain (PEM), signed by --peer-ca. It must name the host
    /// clients and peers use to reach this node and allow both server and client use: the node
    /// presents it to its peers too. Reloaded without a restart when the file changes.
    #[arg(long, env = "PICKET_TLS_CERT", requires_all = ["tls_key", "peer_ca"])]
    tls_cert: Option<PathBuf>,
    /// The private key (PEM) of --tls-cert.
    #[arg(long, env = "PICKET_TLS_KEY", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// The CA (PEM) that signs every node's certificate directly. Only a connection whose
    /// client certificate it signed may send Raft messages.
    #[arg(long, env = "PICKET_PEER_CA", requires = "tls_cert")]
    peer_ca: Option<PathBuf>,
    /// The CA (PEM) that signs clients' certificates, for clients that authenticate with one.
    /// It must not be the peer CA.
    #[arg(long, env = "PICKET_TLS_CLIENT_CA", requires = "tls_cert")]
    tls_client_ca: Option<PathBuf>,
    /// The principals that may use this node and their roles (TOML; see "Security" in the
    /// README). Without it, anyone who reaches the port may do anything. Reread when it changes.
    #[arg(long, env = "PICKET_AUTH_FILE")]
    auth_file: Option<PathBuf>,
    /// Sign every grant's sequencer with this Ed25519 private key (PEM; `openssl genpkey
    /// -algorithm ed25519 -out signing-key.pem`), so a resource verifies sequencers with the
    /// public key alone. Give every node of a cluster the same key.
    #[arg(long, env = "PICKET_SIGNING_KEY")]
    signing_key: Option<PathBuf>,
    /// The cluster's id, carried in every signed sequencer (letters, digits, '-', '_').
    #[arg(long, env = "PICKET_CLUSTER_ID", default_value = picket_server::DEFAULT_CLUSTER_ID)]
    cluster_id: String,
    /// Restore the lock state from a backup (`picket snapshot save`) into an empty data
    /// directory; give every node of the new cluster the same backup and --peers. Tokens of the
    /// restored cluster start above any the old cluster could have issued (a new restore
    /// epoch). Starting again with the same backup keeps what the node did since.
    #[arg(long, env = "PICKET_RESTORE")]
    restore: Option<PathBuf>,
    /// With --restore: `end` starts the restored cluster with every lock free and no session
    /// (clients open new sessions and acquire again; no grant a client no longer knows of comes
    /// back); `keep` keeps the backup's sessions, grants and waits, for clients that changed
    /// nothing since the backup.
    #[arg(long, env = "PICKET_RESTORE_SESSIONS", value_enum, default_value_t = RestoreSessions::End, requires = "restore")]
    restore_sessions: RestoreSessions,
    /// With --restore: also start above this token, the highest any fence has admitted; needed
    /// when this backup was restored before and that cluster went on granting.
    #[arg(long, env = "PICKET_RESTORE_ABOVE", requires = "restore")]
    restore_above: Option<u64>,
    #[command(flatten)]
    logging: crate::logging::LogArgs,
    /// Lock name prefixes that label the lock-level metrics at /metrics (repeat the flag, or
    /// separate with commas); a name counts under the longest one it starts with, else under
    /// `other`. Without any, each name's first path segment, at most 64 of them.
    #[arg(long = "metrics-prefix", env = "PICKET_METRICS_PREFIXES", value_delimiter = ',')]
    metrics_prefixes: Vec<String>,
    /// Serve plaintext on an address other than loopback. Anyone who can reach it can then act
    /// as any client or as a cluster member: only for a network that only you can reach.
    #[arg(long, env = "PICKET_INSECURE_PLAINTEXT")]
    insecure_plaintext: bool,
    /// Serve clients without credentials (TLS and no --auth-file) on an address other than
    /// loopback. Anyone whose client trusts the CA can then end, keep alive or release any
    /// session and its locks: only for a network that only you can reach.
    #[arg(long, env = "PICKET_INSECURE_ANONYMOUS_CLIENTS")]
    insecure_anonymous_clients: bool,
}

/// What a restore does with the backup's sessions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum RestoreSessions {
    /// Every session ends: every lock starts free.
    End,
    /// Sessions, grants and waits come back.
    Keep,
}

/// A request bound's parser: from 4 KiB to 16 MiB.
fn request_bytes() -> clap::builder::RangedU64ValueParser<usize> {
    clap::builder::RangedU64ValueParser::<usize>::new()
        .range(ServerLimits::LEAST_REQUEST_BYTES..=ServerLimits::MOST_REQUEST_BYTES)
}

/// A count limit's parser: at least one, and within what a `usize` holds.
fn at_least_one() -> clap::builder::RangedU64ValueParser<usize> {
    clap::builder::RangedU64ValueParser::<usize>::new().range(1..)
}

fn idle_connection_timeout_ms_default() -> u64 {
    let timeout = ServerLimits::default().idle_connection_timeout;
    u64::try_from(timeout.as_millis()).expect("the default is minutes")
}

fn parse_peers(text: &str) -> Result<BTreeMap<NodeId, Member>, String> {
    let mut peers = BTreeMap::new();
    for pair in text.split(',').filter(|pair| !pair.trim().is_empty()) {
        let (id, addrs) =
            pair.split_once('=').ok_or_else(|| format!("{pair:?} is not ID=HOST:PORT"))?;
        let id: NodeId = id.trim().parse().map_err(|_| format!("{id:?} is not a node id"))?;
        if id == 0 {
            return Err("node ids start at 1".to_owned());
        }
        let member = match addrs.split_once('/') {
            Some((addr, peer_addr)) => {
                Member::with_peer_addr(addr.trim(), Some(peer_addr.trim().to_owned()))
            }
            None => Member::new(addrs.trim()),
        };
        if member.addr.is_empty() || member.peer_addr.as_deref().is_some_and(str::is_empty) {
            return Err(format!("{pair:?} is not ID=HOST:PORT or ID=HOST:PORT/PEER_HOST:PORT"));
        }
        // The bounds a member added later is held to: every membership entry lists them all.
        let longest = picket_server::node::MAX_MEMBER_ADDR_BYTES;
        if member.addr.len() > longest
            || member.peer_addr.as_ref().is_some_and(|a| a.len() > longest)
        {
            return Err(format!("{pair:?}: an address is at most {longest} bytes"));
        }
        if peers.insert(id, member).is_some() {
            return Err(format!("node {id} is listed twice"));
        }
    }
    if peers.is_empty() {
        return Err("the peer list is empty".to_owned());
    }
    let most = picket_server::node::MAX_MEMBERS;
    if peers.len() > most {
        return Err(format!("{} peers listed; a cluster has at most {most} members", peers.len()));
    }
    Ok(peers)
}

/// Runs the node until interrupted.
pub fn run(args: ServeArgs) -> anyhow::Result<ExitCode> {
    args.logging.init("info,openraft=error")?;
    if args.node_id == 0 {
        bail!("--node-id must be a positive number");
    }
    if let Some(rules) = args.test_apply_rules
        && !picket_server::apply_rules::act_as_a_build_that_knows_apply_rules_up_to(rules)
    {
        bail!("--test-apply-rules needs a build with the test faults (the tests build one)");
    }
    let tuning = RaftTuning {
        heartbeat_ms: args.heartbeat_ms,
        election_timeout_min_ms: args.election_timeout_ms,
        election_timeout_max_ms: args.election_timeout_ms * 2,
        snapshot_every_entries: args.snapshot_every,
        keep_entries_after_snapshot: args.keep_entries,
        wal_segment_bytes: args.wal_segment_bytes,
    };
    let config = ServerConfig {
        node_id: args.node_id,
        listen: args.listen,
        advertise: args.advertise,
        peer_listen: args.peer_listen,
        peer_advertise: args.peer_advertise,
        data_dir: args.data_dir,
        peers: args.peers.unwrap_or_default(),
        join: args.join,
        clock: args.test_clock_file.map_or(ClockSource::Monotonic, ClockSource::Scripted),
        limits: ServerLimits {
            max_watch_streams: args.max_watch_streams,
            max_watched_sessions: args.max_watched_sessions,
            max_pending_acquires: args.max_pending_acquires,
            max_connections: args.max_connections,
            max_connections_per_ip: args.max_connections_per_ip,
            max_peer_connections: args.max_peer_connections,
            idle_connection_timeout: Duration::from_millis(args.idle_connection_timeout_ms),
            max_http_body_bytes: args.max_http_body_bytes,
            max_grpc_message_bytes: args.max_grpc_message_bytes,
            max_body_bytes_in_flight: args.max_body_bytes_in_flight,
            max_streams_per_connection: args.max_streams_per_connection,
            replicated: LimitOverrides {
                max_sessions: args.max_sessions,
                max_locks: args.max_locks,
                max_locks_per_session: args.max_locks_per_session,
                max_waiters_per_lock: args.max_waiters_per_lock,
                max_renewals_per_tick: args.max_renewals_per_tick,
                max_name_bytes: args.max_name_bytes,
                min_ttl_ms: args.min_ttl_ms,
                max_ttl_ms: args.max_ttl_ms,
                max_lock_delay_ms: args.max_lock_delay_ms,
                max_wait_ms: args.max_wait_ms,
                max_list: args.max_list,
            },
        },
        tuning,
        tls: args.tls_cert.zip(args.tls_key).zip(args.peer_ca).map(|((cert, key), peer_ca)| {
            TlsFiles { cert, key, peer_ca, client_ca: args.tls_client_ca }
        }),
        auth_file: args.auth_file,
        signing_key: args.signing_key,
        cluster_id: args.cluster_id,
        restore: args.restore,
        restore_options: picket_server::backup::RestoreOptions {
            keep_sessions: args.restore_sessions == RestoreSessions::Keep,
            above_token: args.restore_above,
        },
        metrics_prefixes: args.metrics_prefixes,
        insecure_plaintext: args.insecure_plaintext,
        insecure_anonymous_clients: args.insecure_anonymous_clients,
    };
    raise_open_files_limit(
        config.limits.max_connections
            + config.peer_listen.map_or(0, |_| config.limits.max_peer_connections),
    );
    let runtime = tokio::runtime::Runtime::new().context("cannot start the async runtime")?;
    runtime.block_on(async move {
        let data_dir = config.data_dir.clone();
        let handle = picket_server::start(config).await?;
        let peers_on =
            handle.peer_addr().map(|addr| format!(" (peers on {addr})")).unwrap_or_default();
        println!(
            "picket: node {} listening on {}{peers_on} (data in {})",
            handle.node().id(),
            handle.addr(),
            data_dir.display()
        );
        std::io::stdout().flush().ok();
        let stopped = handle.raft_stopped();
        tokio::select! {
            () = wait_for_signal() => {
                tracing::info!("stopping");
                handle.shutdown().await;
                Ok(ExitCode::SUCCESS)
            }
            reason = stopped => {
                // A node whose Raft core stopped (its log could not be written or synced) can
                // neither vote nor replicate; serving "stopped" to every request would hide it.
                // Exit, so that a supervisor restarts it once the cause (a full disk, say) is
                // fixed: recovery rereads only what was durable.
                tracing::error!(%reason, "the Raft core stopped; exiting");
                if reason.starts_with(picket_server::COMMITTED_ENTRY_LOST) {
                    // Restarting does not help: the node's own log is what disagrees.
                    eprintln!("picket: this node stopped: {reason}.");
                    return Ok(ExitCode::from(EXIT_COMMITTED_ENTRY_LOST));
                }
                eprintln!(
                    "picket: this node stopped: {reason}. Fix the cause (free disk space, check \
                     the disk) and start it again; it recovers from what was durable."
                );
                Ok(ExitCode::FAILURE)
            }
        }
    })
}

/// The exit status of a node that stopped because the leader contradicted entries it had
/// committed ([`picket_server::COMMITTED_ENTRY_LOST`]): the cluster lost acknowledged writes.
pub const EXIT_COMMITTED_ENTRY_LOST: u8 = 65;

async fn wait_for_signal() {
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("installing a SIGTERM handler works");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = terminate.recv() => {}
    }
}

/// Files a node keeps open besides its connections: the log, the snapshot, the runtime's own.
const FILES_BESIDES_CONNECTIONS: u64 = 256;

/// Raises this process's open-files limit to its hard limit (as Go programs and most servers
/// do), so `--max-connections` is not cut short by the default of 1,024; warns if even the
/// hard limit is too low for it.
fn raise_open_files_limit(max_connections: usize) {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let mut limit = getrlimit(Resource::Nofile);
    if limit.current < limit.maximum {
        limit.current = limit.maximum;
        if let Err(error) = setrlimit(Resource::Nofile, limit) {
            tracing::debug!(%error, "cannot raise the open-files limit");
        }
    }
    let allowed = getrlimit(Resource::Nofile).current;
    let needed = u64::try_from(max_connections)
        .unwrap_or(u64::MAX)
        .saturating_add(FILES_BESIDES_CONNECTIONS);
    if allowed.is_some_and(|allowed| allowed < needed) {
        tracing::warn!(
            open_files = allowed,
            max_connections,
            "the open-files limit is below --max-connections plus {FILES_BESIDES_CONNECTIONS}: \
             past it, connections are refused at accept; raise the limit (ulimit -n) or lower \
             --max-connections"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peers_parse_and_refuse_nonsense() {
        let peers = parse_peers("1=127.0.0.1:1,2=127.0.0.1:2").unwrap();
        assert_eq!(peers.len(), 2);
        assert!(parse_peers("1=a,1=b").is_err());
        assert!(parse_peers("x=a").is_err());
        assert!(parse_peers("0=a").is_err());
        assert!(parse_peers("1").is_err());
        let split = parse_peers("1=127.0.0.1:1/127.0.0.1:2,2=127.0.0.1:3").unwrap();
        assert_eq!(split[&1].peer_addr(), "127.0.0.1:2");
        assert_eq!(split[&2].peer_addr(), "127.0.0.1:3");
        assert!(parse_peers("1=127.0.0.1:1/").is_err());
        assert!(parse_peers("1=/127.0.0.1:2").is_err());
        let long = format!("1=127.0.0.1:1/{}:2", "x".repeat(256));
        assert!(parse_peers(&long).unwrap_err().contains("at most 256 bytes"));
        let many: Vec<String> = (1..=33).map(|id| format!("{id}=127.0.0.1:{id}")).collect();
        assert!(parse_peers(&many.join(",")).unwrap_err().contains("at most 32 members"));
        assert_eq!(parse_peers(&many[..32].join(",")).unwrap().len(), 32);
    }
}
