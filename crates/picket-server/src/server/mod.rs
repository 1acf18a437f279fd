//! Starting and stopping a node: storage, Raft, the leader's duties, a port that serves gRPC
//! and HTTP/JSON to clients, and peers' Raft traffic on that port or on one of its own.

mod config;
pub(crate) mod formation;

pub use config::{
    DEFAULT_CLUSTER_ID, DEFAULT_PORT, MAX_WAL_SEGMENT_BYTES, MIN_WAL_SEGMENT_BYTES, RaftTuning,
    ServerConfig, StartError,
};

use crate::auth::AuthFile;
use crate::driver;
use crate::grpc::ClientService;
use crate::http;
use crate::hub::Hub;
use crate::log_store::{LogStore, WriterStats};
use crate::metrics::Metrics;
use crate::network::{Network, RaftService};
use crate::node::Node;
use crate::raft_types::{Member, NodeId, Raft};
use crate::snapshot_cadence::SnapshotCadence;
use crate::state_machine::StateStore;
use crate::tls::ServerTls;
use openraft::{Config, SnapshotPolicy};
use picket_core::Limits;
use picket_core::SequencerSigner;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// A running node.
#[derive(Debug)]
pub struct ServerHandle {
    addr: SocketAddr,
    peer_addr: Option<SocketAddr>,
    node: Arc<Node>,
    shutdown: watch::Sender<bool>,
    serving: JoinHandle<()>,
    serving_peers: Option<JoinHandle<()>>,
    duties: JoinHandle<()>,
}

impl ServerHandle {
    /// The address the node is listening on for clients (and peers, without a peer port).
    #[must_use]
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The address the node is listening on for peers, when it has a peer port.
    #[must_use]
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        self.peer_addr
    }

    /// The node.
    #[must_use]
    pub fn node(&self) -> &Arc<Node> {
        &self.node
    }

    /// Stops serving, stops Raft and waits until both have stopped.
    pub async fn shutdown(self) {
        let _ = self.shutdown.send(true);
        let _ = self.serving.await;
        if let Some(serving_peers) = self.serving_peers {
            let _ = serving_peers.await;
        }
        let _ = self.duties.await;
        if let Err(error) = self.node.raft().shutdown().await {
            tracing::warn!(%error, "raft did not shut down cleanly");
        }
    }

    /// Resolves when the node's Raft core stops by itself, with the reason: a fatal error, such
    /// as a log that could not be written or synced. The node then can neither vote nor
    /// replicate, and should exit so that a supervisor restarts it once the cause is fixed.
    pub fn raft_stopped(&self) -> impl Future<Output = String> + Send + 'static {
        use openraft::async_runtime::WatchReceiver;
        // The full metrics change with every entry the core writes, so waiting on them would
        // wake this future (on the thread that runs it, often the process's main thread) once
        // per command. The server metrics change only with leadership and membership, and end
        // when the core does; a look every second catches a stop reported any other way.
        let metrics = self.node.raft().metrics();
        let mut server_metrics = self.node.raft().server_metrics();
        let mut halted = self.node.halted();
        async move {
            loop {
                if let Some(reason) = halted.borrow_and_update().clone() {
                    return reason;
                }
                if let Err(fatal) = &metrics.borrow_watched().running_state {
                    return fatal.to_string();
                }
                tokio::select! {
                    changed = server_metrics.changed() => if changed.is_err() {
                        // A halt shuts the core down: say why rather than that it ended.
                        return halted.borrow().clone()
                            .or_else(|| metrics.borrow_watched().running_state.clone().err().map(|fatal| fatal.to_string()))
                            .unwrap_or_else(|| "the Raft core ended".to_owned());
                    },
                    _ = halted.changed() => {}
                    () = tokio::time::sleep(std::time::Duration::from_secs(1)) => {}
                }
            }
        }
    }

    /// Runs until the server stops by itself (it does not, unless it fails).
    pub async fn wait(self) {
        let _ = self.serving.await;
    }
}

#[derive(Serialize, Deserialize)]
struct NodeFile {
    node_id: NodeId,
}

fn check_data_dir(config: &ServerConfig) -> Result<(), StartError> {
    let path = &config.data_dir;
    let io = |source| StartError::DataDir { path: path.clone(), source };
    std::fs::create_dir_all(path).map_err(io)?;
    // A new data directory is durable only once its parent is synced.
    crate::wal::sync_parent_dir(path).map_err(io)?;
    let node_file = path.join("node.json");
    match std::fs::read(&node_file) {
        Ok(bytes) => {
            let stored: NodeFile = serde_json::from_slice(&bytes)
                .map_err(|error| io(std::io::Error::new(std::io::ErrorKind::InvalidData, error)))?;
            if stored.node_id != config.node_id {
                return Err(StartError::WrongNode {
                    path: path.clone(),
                    found: stored.node_id,
                    configured: config.node_id,
                });
            }
            Ok(())
        }
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            let bytes =
                serde_json::to_vec(&NodeFile { node_id: config.node_id }).expect("serializes");
            // Synced: a power cut must not leave an empty `node.json` that stops the node
            // from starting again.
            crate::backup::write_synced(&node_file, &bytes).map_err(io)
        }
        Err(error) => Err(io(error)),
    }
}

/// Refuses to serve, beyond loopback, what anyone who reaches the port could abuse: plaintext
/// (anyone could act as any client or as a member), or clients without credentials (TLS and no
/// auth file: any client that trusts the CA could end, keep alive or release any session),
/// unless the operator said the network is trusted.
fn check_exposure(config: &ServerConfig) -> Result<(), StartError> {
    for listen in std::iter::once(config.listen).chain(config.peer_listen) {
        if config.tls.is_none() && !listen.ip().is_loopback() && !config.insecure_plaintext {
            return Err(StartError::Config(format!(
                "refusing to serve plaintext on {listen}: anyone who can reach that address \
                 could act as any client or as a cluster member. Give --tls-cert, --tls-key and \
                 --peer-ca, listen on loopback, or pass --insecure-plaintext on a network only \
                 you can reach"
            )));
        }
    }
    // Only its own flag: `--insecure-plaintext` says nothing of a node that serves TLS.
    let anonymous = config.auth_file.is_none() && !config.insecure_anonymous_clients;
    if config.tls.is_some() && anonymous && !config.listen.ip().is_loopback() {
        return Err(StartError::Config(format!(
            "refusing to serve clients without credentials on {}: anyone whose client trusts \
             the CA could end, keep alive or release any session and its locks. Give \
             --auth-file (bearer tokens, or client certificates named as principals), listen \
             on loopback, or pass --insecure-anonymous-clients on a network only you can reach",
            config.listen
        )));
    }
    Ok(())
}

fn raft_config(tuning: &RaftTuning) -> Result<Arc<Config>, StartError> {
    let config = Config {
        cluster_name: "picket".to_owned(),
        heartbeat_interval: tuning.heartbeat_ms,
        election_timeout_min: tuning.election_timeout_min_ms,
        election_timeout_max: tuning.election_timeout_max_ms,
        // Snapshots are asked for by `snapshot_cadence`, after a count of entries that grows
        // with the state.
        snapshot_policy: SnapshotPolicy::Never,
        max_in_snapshot_log_to_keep: tuning.keep_entries_after_snapshot,
        // A restarted leader must win an election in a new term before it leads again. Its
        // last entries may have reached its followers but not its own disk; leading on in the
        // same term, it would propose other entries under those same log ids, which the
        // followers take for the ones they hold (a forked log), and it would serve reads at a
        // committed index it never made durable. ARCHITECTURE.md, "Leadership after a restart".
        enable_leader_restore: Some(false),
        // A leader's replication streams learn of a new entry as soon as it is handed to the
        // log, not at the end of the core's loop turn. openraft then also stops taking client
        // requests in a loop turn once a notification waits (smaller batches, its docs warn).
        // Measured both ways (BENCHMARKS.md, "Followers sync at once"): on the cluster a gain in
        // one A/B run of two and no loss outside the ranges; on one node every row within its
        // range.
        broadcast_submitted_on_append: Some(true),
        ..Config::default()
    };
    config.validate().map(Arc::new).map_err(|error| StartError::Config(error.to_string()))
}

/// Starts a node and returns once it is serving. A fresh one-node cluster elects itself within
/// an election timeout; use the cluster endpoint or [`Node::cluster`] to wait for a leader.
///
/// # Errors
/// [`StartError`] when the data directory, the configuration or the port is unusable.
pub async fn start(config: ServerConfig) -> Result<ServerHandle, StartError> {
    let segment_bytes = config.tuning.wal_segment_bytes;
    if !(MIN_WAL_SEGMENT_BYTES..=MAX_WAL_SEGMENT_BYTES).contains(&segment_bytes) {
        return Err(StartError::Config(format!(
            "the WAL segment size {segment_bytes} bytes is out of range; choose between {MIN_WAL_SEGMENT_BYTES} and {MAX_WAL_SEGMENT_BYTES}"
        )));
    }
    if let Some(misfit) = crate::http::BodyBounds::misfit(&config.limits) {
        return Err(StartError::Config(misfit));
    }
    let prefixes = &config.metrics_prefixes;
    let longest_name = Limits::default().max_name_bytes;
    if prefixes.len() > crate::metrics::MAX_CONFIGURED_PREFIXES
        || prefixes.iter().any(|prefix| prefix.is_empty() || prefix.len() > longest_name)
    {
        return Err(StartError::Config(format!(
            "give at most {} metrics prefixes, each 1 to {longest_name} bytes long",
            crate::metrics::MAX_CONFIGURED_PREFIXES,
        )));
    }
    check_exposure(&config)?;
    let tls = match config.tls.clone() {
        Some(files) => Some(Arc::new(
            ServerTls::load(files).map_err(|error| StartError::Config(error.to_string()))?,
        )),
        None => None,
    };
    let to_peers = tls.as_ref().map(|tls| tls.to_peers().clone());
    let auth = match config.auth_file.clone() {
        Some(path) => Some(Arc::new(
            AuthFile::load(path).map_err(|error| StartError::Config(error.to_string()))?,
        )),
        None => None,
    };
    let signer = match &config.signing_key {
        Some(path) => Some(Arc::new(load_signer(path, &config.cluster_id)?)),
        None => None,
    };
    // Checked against a new cluster's limits: a state whose own differ is checked again by
    // the leader, which says why it keeps them.
    config.limits.replicated.applied_to(&Limits::default()).validate().map_err(|invalid| {
        StartError::Config(format!(
            "{invalid}: choose limit flags that agree (--max-renewals-per-tick at least --max-sessions)"
        ))
    })?;
    check_data_dir(&config)?;
    let listener = TcpListener::bind(config.listen)
        .await
        .map_err(|source| StartError::Listen { addr: config.listen, source })?;
    let addr = listener
        .local_addr()
        .map_err(|source| StartError::Listen { addr: config.listen, source })?;
    let advertise = config.advertise.clone().unwrap_or_else(|| addr.to_string());
    let peer_listener = match config.peer_listen {
        Some(listen) => Some(
            TcpListener::bind(listen)
                .await
                .map_err(|source| StartError::Listen { addr: listen, source })?,
        ),
        None => None,
    };
    let peer_addr = match &peer_listener {
        Some(listener) => Some(listener.local_addr().map_err(|source| StartError::Listen {
            addr: config.peer_listen.unwrap_or(config.listen),
            source,
        })?),
        None => None,
    };
    let own_peer_addr = config.peers.get(&config.node_id).and_then(|own| own.peer_addr.as_deref());
    let peer_advertise = peer_addr.map(|bound| {
        peer_advertise_of(config.peer_advertise.as_deref(), own_peer_addr, bound, &advertise)
    });
    let mut peers = config.peers.clone();
    if peers.is_empty() {
        peers.insert(
            config.node_id,
            Member::with_peer_addr(advertise.clone(), peer_advertise.clone()),
        );
    }
    check_own_member(&config, &peers, peer_addr)?;

    let data_error = |source| StartError::DataDir { path: config.data_dir.clone(), source };
    let hub = Arc::new(Hub::new(config.limits.max_watched_sessions));
    if config.node_id == 0 || config.node_id == crate::backup::RESTORE_LEADER {
        return Err(StartError::Config(format!(
            "node id {} is reserved; choose a node id between 1 and {}",
            config.node_id,
            crate::backup::RESTORE_LEADER - 1
        )));
    }
    if config.restore.is_some() && config.join {
        return Err(StartError::Config(
            "--restore starts a new cluster and --join joins an existing one; a node that joins a restored cluster gets its state from the leader".into(),
        ));
    }
    let backup = config.restore.as_deref().map(crate::backup::read).transpose()?;
    let log_stats = Arc::new(WriterStats::default());
    let metrics = Arc::new(Metrics::new(config.metrics_prefixes.clone(), &log_stats));
    let cadence = Arc::new(SnapshotCadence::new(config.tuning.snapshot_every_entries));
    let store = StateStore::open(
        &config.data_dir,
        Limits::default(),
        cadence.clone(),
        hub,
        metrics.clone(),
    )
    .map_err(data_error)?;
    // One judgement of queued acquires for the log's writer (defer the sync) and the
    // replication streams (wait for the release behind).
    let queue_judge = store.queue_judge();
    let log = LogStore::open_counted(
        &config.data_dir,
        segment_bytes,
        Some(queue_judge.clone()),
        log_stats.clone(),
    )
    .map_err(data_error)?;
    match backup {
        Some(backup) => {
            restore(&config.data_dir, backup, &config.restore_options, &peers, &store, &log)
                .await?;
        }
        None => {
            let has_log = has_log(&log).await.map_err(data_error)?;
            crate::backup::check_not_cut_short(&config.data_dir, has_log)?;
        }
    }
    let restore = crate::backup::restore_identity(&config.data_dir).map_err(data_error)?;
    let log_handle = log.clone();
    let raft = Raft::new(
        config.node_id,
        raft_config(&config.tuning)?,
        Network::new(to_peers.clone())
            .with_only_queue_waiters(queue_judge)
            .with_restore(restore.clone())
            .with_cluster_id(store.cluster_id()),
        log,
        store.clone(),
    )
    .await
    .map_err(|error| StartError::Raft(error.to_string()))?;
    // A single node forms its cluster at once; a node of several forms it once its peers have
    // answered (see `formation`), after it serves them below.
    let forming = !config.join && !has_log(&log_handle).await.map_err(data_error)?;
    if forming
        && peers.len() == 1
        && let Err(error) = formation::initialize(&raft, &peers).await
    {
        let _ = raft.shutdown().await;
        return Err(StartError::Raft(error));
    }
    if let Err(error) = check_stored_member(&raft, &config, peer_addr).await {
        let _ = raft.shutdown().await;
        return Err(error);
    }

    let leader_lease = std::time::Duration::from_millis(config.tuning.election_timeout_max_ms);
    let clock = Arc::new(crate::clock::Clock::new(&config.clock));
    let node = Arc::new(
        Node::new(
            config.node_id,
            raft.clone(),
            store,
            log_stats,
            leader_lease,
            clock.clone(),
            &config.limits,
        )
        .with_peer_tls(to_peers)
        .with_restore(restore)
        .with_auth(auth.clone())
        .with_signer(signer),
    );
    let (shutdown, shutdown_signal) = watch::channel(false);
    let pulse_node = node.clone();
    let pulse_signal = shutdown_signal.clone();
    tokio::spawn(async move {
        let wake = pulse_node.renewals().wake();
        crate::clock::pulse(pulse_node.clock(), pulse_node.gaps(), wake, pulse_signal).await;
    });
    tokio::spawn(follow_role(raft.clone(), metrics, log_handle.clone(), shutdown_signal.clone()));
    let duties = tokio::spawn(driver::run(node.clone(), shutdown_signal.clone()));
    tokio::spawn(crate::snapshot_cadence::run(raft.clone(), cadence, shutdown_signal.clone()));
    tokio::spawn(crate::rate::run(node.clone(), shutdown_signal.clone()));
    // Served by the router, and straight from wire frames (`DirectCalls`) beside it.
    let raft_calls = RaftService::new(node.clone(), log_handle, clock, tls.is_some());
    let raft_service = raft_calls.clone().into_server();
    let mut grpc = tonic::service::Routes::new(ClientService::server(
        node.clone(),
        config.limits.max_grpc_message_bytes,
    ));
    let peer_app = match peer_addr {
        Some(_) => Some(
            tonic::service::Routes::new(raft_service)
                .into_axum_router()
                .fallback(http::not_on_peer_port),
        ),
        None => {
            grpc = grpc.add_service(raft_service);
            None
        }
    };
    // tonic's router brings a fallback for unknown gRPC methods; ours answers unknown paths in
    // the HTTP API's JSON error format instead.
    let mut app = grpc
        .into_axum_router()
        .merge(http::router(node.clone(), config.limits.max_http_body_bytes));
    if let Some(peer_advertise) = &peer_advertise {
        app = app.merge(crate::network::raft_served_elsewhere(peer_advertise.clone()));
    }
    // A client's request body has a deadline (`http::BODY_DEADLINE`) and a place among the
    // node's bodies in flight; Raft's have neither.
    let body_bounds = http::BodyBounds::new(&config.limits);
    let app = app
        .fallback(http::not_found)
        .layer(axum::middleware::from_fn_with_state(body_bounds, http::body_bounds));
    if let Some(tls) = &tls {
        let tls = tls.clone();
        let stop = shutdown_signal.clone();
        tokio::spawn(
            async move { crate::reload::every_check(stop, || tls.reload_if_changed()).await },
        );
    }
    if let Some(auth) = auth {
        let stop = shutdown_signal.clone();
        tokio::spawn(revoke_removed_principals(node.clone(), auth.clone(), stop.clone()));
        tokio::spawn(
            async move { crate::reload::every_check(stop, || auth.reload_if_changed()).await },
        );
    }
    let idle_timeout = config.limits.idle_connection_timeout;
    let serving_peers = peer_listener.zip(peer_app).map(|(listener, peer_app)| {
        let limits = crate::listener::ConnectionLimits {
            max_connections: config.limits.max_peer_connections,
            // Peers are few and authenticated by their certificates; the port's own bound is
            // theirs alone.
            max_connections_per_ip: config.limits.max_peer_connections,
            idle_timeout,
            max_streams_per_connection: config.limits.max_streams_per_connection,
            max_message_bytes: config.limits.max_grpc_message_bytes,
            max_raft_message_bytes: crate::network::MAX_RAFT_MESSAGE_BYTES,
        };
        let direct = crate::listener::DirectCalls::new(
            node.metrics().clone(),
            config.limits.max_grpc_message_bytes,
        )
        .with_raft(raft_calls.clone());
        let serving =
            serve(listener, peer_app, Some(direct), limits, tls.clone(), shutdown_signal.clone());
        tokio::spawn(serving)
    });
    let limits = crate::listener::ConnectionLimits {
        max_connections: config.limits.max_connections,
        max_connections_per_ip: config.limits.max_connections_per_ip,
        idle_timeout,
        max_streams_per_connection: config.limits.max_streams_per_connection,
        max_message_bytes: config.limits.max_grpc_message_bytes,
        // The client port serves the Raft service unless the node has a peer port.
        max_raft_message_bytes: if peer_addr.is_some() {
            0
        } else {
            crate::network::MAX_RAFT_MESSAGE_BYTES
        },
    };
    let mut direct = crate::listener::DirectCalls::new(
        node.metrics().clone(),
        config.limits.max_grpc_message_bytes,
    )
    .with_client(ClientService::new(node.clone()));
    // The client port serves the Raft service unless the node has a peer port.
    if peer_addr.is_none() {
        direct = direct.with_raft(raft_calls);
    }
    if forming && peers.len() > 1 {
        let stop = shutdown_signal.clone();
        tokio::spawn(formation::form(node.clone(), raft.clone(), peers, stop));
    }
    let serving = tokio::spawn(serve(listener, app, Some(direct), limits, tls, shutdown_signal));
    tracing::info!(node = config.node_id, %addr, peer_addr = ?peer_addr, "serving");
    Ok(ServerHandle { addr, peer_addr, node, shutdown, serving, serving_peers, duties })
}

/// Serves `app` on `listener` until `stop` turns true.
async fn serve(
    listener: TcpListener,
    app: axum::Router,
    direct: Option<crate::listener::DirectCalls>,
    limits: crate::listener::ConnectionLimits,
    tls: Option<Arc<ServerTls>>,
    mut stop: watch::Receiver<bool>,
) {
    let stopped = async move {
        let _ = stop.wait_for(|stop| *stop).await;
    };
    crate::listener::serve(listener, app, direct, limits, tls, stopped).await;
}

/// Checks that `peers` names this node as it serves: its peers must reach its Raft service where
/// it listens for them (`bound_peer_addr`, or as `--peer-advertise` says), or they would never
/// reach it (a member whose peer address is its client port, while it serves peers on a port of
/// its own) or would reach another node.
/// While this node leads, revokes the sessions of principals removed from the auth file:
/// after every reload, and once per term it settles as leader (a reload a deposed leader saw
/// may not have been swept). Ends on `stop`.
async fn revoke_removed_principals(
    node: Arc<Node>,
    auth: Arc<AuthFile>,
    mut stop: watch::Receiver<bool>,
) {
    let mut reloads = auth.reloads();
    let mut swept: Option<(u64, u64)> = None;
    let mut interval = tokio::time::interval(crate::reload::CHECK_EVERY);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = interval.tick() => {}
            _ = reloads.changed() => {}
            _ = stop.wait_for(|stop| *stop) => return,
        }
        let Some(term) = node.settled_term() else { continue };
        let sweep = (auth.generation(), term);
        if swept == Some(sweep) {
            continue;
        }
        node.revoke_sessions_of_removed_principals(|name| auth.knows_principal(name)).await;
        swept = Some(sweep);
    }
}

/// The peer address this node gives out (in its own entry when it starts a new cluster, and
/// in the client port's refusal of Raft messages): `--peer-advertise`; else the one its own
/// `--peers` entry names (`check_own_member` checks its port); else the bound address, with
/// the client address's host in place of an address that names every interface (0.0.0.0
/// names nothing a peer could dial).
fn peer_advertise_of(
    flag: Option<&str>,
    own_entry: Option<&str>,
    bound: std::net::SocketAddr,
    advertise: &str,
) -> String {
    if let Some(given) = flag.or(own_entry) {
        return given.to_owned();
    }
    match advertise.rsplit_once(':') {
        Some((host, _)) if bound.ip().is_unspecified() => format!("{host}:{}", bound.port()),
        _ => bound.to_string(),
    }
}

fn check_own_member(
    config: &ServerConfig,
    peers: &BTreeMap<NodeId, Member>,
    bound_peer_addr: Option<SocketAddr>,
) -> Result<(), StartError> {
    let id = config.node_id;
    let Some(own) = peers.get(&id) else {
        if config.join {
            return Ok(());
        }
        return Err(StartError::Config(format!(
            "--peers does not list this node ({id}); list every initial voter including this one, or start with --join"
        )));
    };
    match own_member_mismatch(config, own, bound_peer_addr) {
        Some(mismatch) => Err(StartError::Config(format!(
            "--peers {mismatch}; write this node's entry as {id}=CLIENT_ADDR/PEER_ADDR with \
             --peer-listen, or {id}=ADDR without"
        ))),
        None => Ok(()),
    }
}

/// How this node's entry `own` (in `--peers` or in its log's membership) disagrees with where it
/// serves its peers, if it does.
fn own_member_mismatch(
    config: &ServerConfig,
    own: &Member,
    bound_peer_addr: Option<SocketAddr>,
) -> Option<String> {
    match (&own.peer_addr, config.peer_listen) {
        (None, Some(listen)) => Some(format!(
            "gives this node no peer address, so its peers would send Raft messages to its \
             client port, but it serves peers on --peer-listen {listen}"
        )),
        (Some(peer_addr), None) => Some(format!(
            "gives this node the peer address {peer_addr}, but it has no --peer-listen"
        )),
        (Some(peer_addr), Some(listen)) => {
            // With --peer-advertise the entry must say exactly that; without, the host may be
            // a name or an address the node does not bind, but the port must be the one bound.
            let matches = match &config.peer_advertise {
                Some(advertised) => peer_addr == advertised,
                None => bound_peer_addr.is_some_and(|bound| {
                    let port = peer_addr.rsplit_once(':').map(|(_, port)| port.parse::<u16>());
                    port.is_some_and(|port| port == Ok(bound.port()))
                }),
            };
            let advertised = config
                .peer_advertise
                .as_ref()
                .map(|advertised| format!(" advertised as {advertised}"))
                .unwrap_or_default();
            (!matches).then(|| {
                format!(
                    "gives this node the peer address {peer_addr}, but it serves peers on \
                     --peer-listen {listen}{advertised} (behind a port mapping, give the \
                     address peers reach with --peer-advertise)"
                )
            })
        }
        (None, None) => None,
    }
}

/// Checks this node's entry in the membership its log holds (a node that already has a log
/// ignores `--peers`) against where it serves its peers: a node restarted with `--peer-listen`
/// added or dropped would be dialled where it no longer listens. Waits up to a second for the
/// Raft core to publish what it loaded; a node not yet a member is not checked.
async fn check_stored_member(
    raft: &Raft,
    config: &ServerConfig,
    bound_peer_addr: Option<SocketAddr>,
) -> Result<(), StartError> {
    use openraft::async_runtime::WatchReceiver;
    let id = config.node_id;
    let mut metrics = raft.metrics();
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(1);
    let own = loop {
        let own = metrics.borrow_watched().membership_config.membership().get_node(&id).cloned();
        if own.is_some() {
            break own;
        }
        match tokio::time::timeout_at(deadline, metrics.changed()).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) | Err(_) => break None,
        }
    };
    let Some(own) = own else { return Ok(()) };
    match own_member_mismatch(config, &own, bound_peer_addr) {
        Some(mismatch) => Err(StartError::Config(format!(
            "the membership in this node's log {mismatch}. A member's addresses cannot change: \
             start it as it joined, or remove it and add it back as a new node under a new id \
             with an empty data directory"
        ))),
        None => Ok(()),
    }
}

/// Whether the node's log holds anything: an entry, a purge or a vote.
async fn has_log(log: &LogStore) -> std::io::Result<bool> {
    use openraft::storage::{RaftLogReader, RaftLogStorage};
    let mut log = log.clone();
    let state = log.get_log_state().await?;
    let vote = log.read_vote().await?;
    Ok(state.last_log_id.is_some() || vote.is_some())
}

/// Restores `backup` into a node about to start (see [`crate::backup`]): the restored state
/// becomes a snapshot at the restore log id, with `peers` as its membership, and the log starts
/// after it, so the node starts as a member of a cluster whose history begins with that state.
async fn restore(
    data_dir: &std::path::Path,
    backup: crate::backup::Backup,
    options: &crate::backup::RestoreOptions,
    peers: &BTreeMap<NodeId, Member>,
    store: &StateStore,
    log: &LogStore,
) -> Result<(), StartError> {
    use openraft::storage::{RaftLogStorage, RaftStateMachine};
    let data_error = |source| StartError::DataDir { path: data_dir.to_owned(), source };
    let mut log = log.clone();
    let has_log = has_log(&log).await.map_err(data_error)?;
    let revision = backup.meta.revision;
    let crate::backup::RestorePlan::Write(machine) =
        crate::backup::plan(data_dir, backup, options, has_log)?
    else {
        tracing::info!("already restored from this backup; starting from what this node has");
        return Ok(());
    };
    let log_id = crate::backup::restore_log_id();
    let meta = crate::raft_types::SnapshotMeta {
        last_log_id: Some(log_id),
        last_membership: crate::backup::restored_membership(peers),
    };
    let first_revision = machine.revision() + 1;
    store.clone().install_snapshot(&meta, machine.snapshot()).await.map_err(data_error)?;
    log.purge(log_id).await.map_err(data_error)?;
    tracing::info!(
        backup_revision = revision,
        first_revision,
        "restored the lock state from a backup; new tokens start a new restore epoch"
    );
    Ok(())
}

/// Follows this node's role until shutdown: counts every change of the leader it sees, and sets
/// its log's sync policy from the role ([`LogStore::follow_role`]).
async fn follow_role(
    raft: Raft,
    metrics: Arc<Metrics>,
    log: LogStore,
    mut stop: watch::Receiver<bool>,
) {
    use openraft::async_runtime::WatchReceiver;
    // Server metrics change only with leadership and membership, not with every entry.
    let mut watched = raft.server_metrics();
    let mut leader = watched.borrow_watched().current_leader;
    loop {
        {
            let server = watched.borrow_watched();
            let members = server.membership_config.membership().nodes().count();
            let leading = server.state == openraft::ServerState::Leader;
            log.follow_role(leading, members);
        }
        tokio::select! {
            changed = watched.changed() => {
                if changed.is_err() {
                    return;
                }
            }
            _ = stop.wait_for(|stop| *stop) => return,
        }
        let now = watched.borrow_watched().current_leader;
        if now.is_some() && now != leader {
            metrics.leader_changed();
        }
        if now.is_some() {
            leader = now;
        }
    }
}

/// Reads the signing key: an Ed25519 private key in a PEM `PRIVATE KEY` (PKCS#8) file.
fn load_signer(path: &std::path::Path, cluster_id: &str) -> Result<SequencerSigner, StartError> {
    let config_error = |detail: String| {
        StartError::Config(format!("cannot use the signing key {}: {detail}", path.display()))
    };
    let key =
        picket_proto::tls::read_pkcs8(path).map_err(|error| config_error(error.to_string()))?;
    SequencerSigner::from_pkcs8(cluster_id, &key).map_err(|error| config_error(error.to_string()))
}

#[cfg(test)]
mod tests {
    use super::peer_advertise_of;

    /// SPEC: beyond loopback, clients authenticate. A node with TLS and no auth file serves
    /// every client as anyone, so beyond loopback it starts only when told the network is
    /// trusted; on loopback, or with an auth file, it starts. (The refusal is run end to end
    /// in `tests/tls.rs`; the cases that start are here, as no test binds beyond loopback.)
    #[test]
    fn clients_without_credentials_are_served_beyond_loopback_only_when_asked_for() {
        use super::{ServerConfig, check_exposure};
        let tls = crate::tls::TlsFiles {
            cert: "node.pem".into(),
            key: "node-key.pem".into(),
            peer_ca: "peer-ca.pem".into(),
            client_ca: None,
        };
        let on = |listen: &str| {
            let mut config = ServerConfig::single("data", listen.parse().unwrap());
            config.tls = Some(tls.clone());
            config
        };
        let refused = check_exposure(&on("0.0.0.0:7687")).unwrap_err().to_string();
        assert!(refused.contains("without credentials on 0.0.0.0:7687"), "{refused}");
        assert!(check_exposure(&on("127.0.0.1:7687")).is_ok(), "loopback");
        let mut with_auth = on("10.0.0.1:7687");
        with_auth.auth_file = Some("auth.toml".into());
        assert!(check_exposure(&with_auth).is_ok(), "clients authenticate");
        let mut plaintext_flag = on("10.0.0.1:7687");
        plaintext_flag.insecure_plaintext = true;
        assert!(check_exposure(&plaintext_flag).is_err(), "--insecure-plaintext is not this");
        let mut told = on("10.0.0.1:7687");
        told.insecure_anonymous_clients = true;
        assert!(check_exposure(&told).is_ok(), "the operator said the network is trusted");
        let mut plaintext = ServerConfig::single("data", "10.0.0.1:7687".parse().unwrap());
        assert!(check_exposure(&plaintext).is_err(), "plaintext beyond loopback");
        plaintext.insecure_plaintext = true;
        assert!(check_exposure(&plaintext).is_ok(), "plaintext on a trusted network is open too");
    }

    /// Review of issue 13's peer port: a node bound to every interface refused Raft messages
    /// on its client port naming 0.0.0.0 as where to send them, and started a new cluster
    /// with that as its own peer address.
    #[test]
    fn the_peer_address_given_out_is_one_a_peer_can_dial() {
        let bound = |addr: &str| addr.parse().expect("an address");
        let any = bound("0.0.0.0:7688");
        assert_eq!(peer_advertise_of(Some("p.example:9"), None, any, "c:1"), "p.example:9");
        assert_eq!(peer_advertise_of(None, Some("n1:7688"), any, "c:1"), "n1:7688");
        assert_eq!(peer_advertise_of(None, None, any, "10.0.0.5:7687"), "10.0.0.5:7688");
        assert_eq!(peer_advertise_of(None, None, any, "[::1]:7687"), "[::1]:7688");
        let loopback = bound("127.0.0.1:7688");
        assert_eq!(peer_advertise_of(None, None, loopback, "x:1"), "127.0.0.1:7688");
    }
}
