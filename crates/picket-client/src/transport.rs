//! The bottom layer of the client: connections to the cluster's nodes, finding and following
//! the leader, and retrying what is safe to retry. Everything above (keepalives, sessions,
//! the session watcher, [`crate::Client`]) calls the cluster through a [`Transport`].

use crate::error::{ClientError, ErrorCode, Failure, classify};
use picket_core::Wait;
use picket_proto::connection::{Connection, Protocol};
use picket_proto::tls::ClientTls;
use picket_proto::v1;
use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;
use tokio::time::Instant;
use tonic::transport::Endpoint;
use tonic::{Response, Status};

mod abandons;
use abandons::Abandons;
mod identity;
use identity::{Identity, Verdict};

/// How long the client keeps trying before it gives up on a call, how long one attempt may
/// take, and how long to wait between attempts.
#[derive(Clone)]
pub struct ClientConfig {
    /// Total time to keep retrying one call across endpoints and elections.
    pub retry_for: Duration,
    /// Longest single attempt (a waiting acquire is exempt: it waits as long as it asked to).
    pub request_timeout: Duration,
    /// Longest time to open a connection.
    pub connect_timeout: Duration,
    /// First pause between attempts; it doubles up to `max_backoff`.
    pub initial_backoff: Duration,
    /// Longest pause between attempts.
    pub max_backoff: Duration,
    /// TLS toward the nodes (whom to trust, which certificate to present); `None` for
    /// plaintext. Build one with [`ClientTls::from_files`].
    pub tls: Option<ClientTls>,
    /// A bearer token sent with every request, for a cluster that authenticates its clients
    /// (the secret itself; the cluster's auth file keeps only its SHA-256).
    pub bearer_token: Option<String>,
    /// How calls are framed: [`Protocol::Wire`] (the default, Picket's own framing of the
    /// same calls, cheaper on both ends) or [`Protocol::Grpc`] (gRPC over HTTP/2, for a path
    /// that passes only HTTP). Watch streams and every other call travel the same way. A node
    /// that does not speak the wire protocol (an older build) is spoken to in gRPC. The default
    /// is what the environment variable `PICKET_PROTOCOL` names (`wire` or `grpc`), if it does.
    pub protocol: Protocol,
    /// The id of the cluster this client belongs to (`cluster_id` in `picket members --json`
    /// or `GET /v1/cluster`), or `None` for the first named cluster it reaches. Each connection
    /// the client opens first asks its node which cluster it belongs to, and a node of another
    /// one is not used ([`ClientError::OtherCluster`]): session ids of two clusters coincide.
    /// A cluster restored from a backup of this one (`picket serve --restore`) is followed.
    pub cluster_id: Option<String>,
}

impl std::fmt::Debug for ClientConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The token is a secret: say whether there is one, never what it is.
        f.debug_struct("ClientConfig")
            .field("retry_for", &self.retry_for)
            .field("request_timeout", &self.request_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("initial_backoff", &self.initial_backoff)
            .field("max_backoff", &self.max_backoff)
            .field("tls", &self.tls.is_some())
            .field("bearer_token", &self.bearer_token.as_ref().map(|_| "<redacted>"))
            .field("protocol", &self.protocol)
            .field("cluster_id", &self.cluster_id)
            .finish()
    }
}

impl Default for ClientConfig {
    fn default() -> Self {
        Self {
            retry_for: Duration::from_secs(10),
            request_timeout: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(2),
            initial_backoff: Duration::from_millis(20),
            max_backoff: Duration::from_millis(500),
            tls: None,
            bearer_token: None,
            protocol: Protocol::from_env(),
            cluster_id: None,
        }
    }
}

/// Whether a call may be sent again after a failure that may have happened after sending it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Retry {
    /// Reads, keepalives, and writes that are idempotent in Picket (acquire by the same
    /// session returns the same grant; release and close are checked by the caller).
    Safe,
    /// Only when the request certainly was not applied (refused by a follower, or never sent).
    UnlessSent,
}

/// The connections to one cluster. Cheap to clone; clones share connections.
#[derive(Clone, Debug)]
pub(crate) struct Transport {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    endpoints: Vec<String>,
    config: ClientConfig,
    /// Where calls go first, if anywhere.
    leader: Mutex<Option<Leader>>,
    connections: Mutex<HashMap<String, Connection>>,
    /// The abandons of given-up acquires, sent by a task of their own.
    abandons: Arc<Abandons>,
    /// The cluster the client keeps to.
    identity: Identity,
    /// Whether a new connection is checked against [`Inner::identity`]: always, but in unit
    /// tests whose fake nodes answer nothing.
    check_cluster: bool,
}

/// The node calls go to first: the last one a call succeeded at, or the one a refusal named as
/// leader. Once a call there succeeded, its connection is kept with it, so that the calls after
/// go straight to it.
#[derive(Debug)]
struct Leader {
    endpoint: Arc<str>,
    connection: Option<Connection>,
}

/// A handle that does not keep the connections open, for background tasks: they stop once
/// every [`Transport`] is gone.
#[derive(Debug, Clone)]
pub(crate) struct WeakTransport(Weak<Inner>);

impl WeakTransport {
    pub(crate) fn upgrade(&self) -> Option<Transport> {
        self.0.upgrade().map(|inner| Transport { inner })
    }
}

/// Refuses what would send a secret in the clear: an `https://` endpoint without TLS
/// configured, and a bearer token over plaintext to anything but loopback.
fn check_transport(
    given: &[String],
    endpoints: &[String],
    config: &ClientConfig,
) -> Result<(), ClientError> {
    if config.tls.is_some() {
        return Ok(());
    }
    if let Some(endpoint) = given.iter().find(|endpoint| endpoint.trim().starts_with("https://")) {
        return Err(ClientError::InvalidArgument(format!(
            "{endpoint:?} asks for TLS, but no CA is configured: give the CA that signed the nodes' certificates (--ca)"
        )));
    }
    let loopback = |endpoint: &String| {
        let host = endpoint.rsplit_once(':').map_or(endpoint.as_str(), |(host, _)| host);
        let host = host.trim_start_matches('[').trim_end_matches(']');
        host == "localhost" || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
    };
    if config.bearer_token.is_some()
        && let Some(endpoint) = endpoints.iter().find(|endpoint| !loopback(endpoint))
    {
        return Err(ClientError::InvalidArgument(format!(
            "refusing to send a bearer token in plaintext to {endpoint}: connect with TLS (--ca)"
        )));
    }
    Ok(())
}

/// Refusals naming a leader followed at once before the client backs off: a node that just
/// lost the leadership may name one that names it back until the election settles.
const MAX_REDIRECTS: u32 = 3;

/// Largest request the client sends; the server's own limit is far smaller, so a larger one is a
/// bug in the caller, not a request worth buffering.
const MAX_REQUEST_BYTES: usize = 16 * 1024 * 1024;

impl Transport {
    /// Checks and normalizes `endpoints` (`host:port`, optionally with a scheme); opens nothing.
    pub(crate) fn new(
        endpoints: impl IntoIterator<Item = impl Into<String>>,
        config: ClientConfig,
    ) -> Result<Self, ClientError> {
        let given: Vec<String> = endpoints.into_iter().map(Into::into).collect();
        let endpoints: Vec<String> = given
            .iter()
            .map(|endpoint| {
                let endpoint = endpoint.trim();
                let endpoint = endpoint.strip_prefix("https://").unwrap_or(endpoint);
                endpoint.trim_start_matches("http://").trim_end_matches('/').to_owned()
            })
            .filter(|endpoint| !endpoint.is_empty())
            .collect();
        if endpoints.is_empty() {
            return Err(ClientError::InvalidArgument(
                "give at least one endpoint, e.g. 127.0.0.1:7687".into(),
            ));
        }
        for endpoint in &endpoints {
            Endpoint::from_shared(format!("http://{endpoint}")).map_err(|error| {
                ClientError::InvalidArgument(format!("{endpoint:?} is not host:port ({error})"))
            })?;
        }
        check_transport(&given, &endpoints, &config)?;
        if let Some(cluster_id) = &config.cluster_id {
            check_cluster_id(cluster_id)?;
        }
        Ok(Self {
            inner: Arc::new(Inner {
                identity: Identity::new(config.cluster_id.clone(), endpoints.clone()),
                endpoints,
                config,
                leader: Mutex::new(None),
                connections: Mutex::new(HashMap::new()),
                abandons: Arc::default(),
                check_cluster: true,
            }),
        })
    }

    pub(crate) fn endpoints(&self) -> &[String] {
        &self.inner.endpoints
    }

    pub(crate) fn config(&self) -> &ClientConfig {
        &self.inner.config
    }

    pub(crate) fn downgrade(&self) -> WeakTransport {
        WeakTransport(Arc::downgrade(&self.inner))
    }

    /// The cluster this client keeps to, once it knows one: the one it was given, else the
    /// first named one a connection found.
    pub(crate) fn cluster_id(&self) -> Option<String> {
        self.inner.identity.cluster_id()
    }

    /// The open connection to `endpoint`, opened first if there is none or it has closed, and
    /// then checked to lead to the client's cluster.
    async fn connection(&self, endpoint: &str) -> Result<Connection, Failure> {
        let before = self.inner.identity.generation();
        let cached = self.lock_connections().get(endpoint).filter(|c| !c.is_closed()).cloned();
        if let Some(connection) = cached {
            return Ok(connection);
        }
        let opened = Connection::open_with(
            endpoint,
            self.inner.config.connect_timeout,
            MAX_REQUEST_BYTES,
            self.inner.config.tls.as_ref(),
            self.inner.config.protocol,
        )
        .await
        .map_err(|status| {
            // Only an endpoint where nothing could be reached counts toward the client's
            // cluster being gone: a node that took the connection and then failed its TLS
            // handshake (a certificate this client does not trust) or did not answer in time
            // (stalled) may still be a node of it, and a restore must not draw the client away.
            if picket_proto::connection::nothing_reached(&status) {
                self.inner.identity.unreachable(endpoint);
            }
            classify(&status)
        })?;
        let opened = match &self.inner.config.bearer_token {
            Some(token) => opened.with_bearer_token(token).map_err(|s| classify(&s))?,
            None => opened,
        };
        let followed = self.inner.check_cluster && self.check_cluster(endpoint, &opened).await?;
        if followed {
            // A restore of the client's cluster: the connections to the nodes of the cluster
            // before are not used again.
            self.lock_connections().clear();
            self.set_leader_hint(None);
        }
        // Another call may have opened one meanwhile; keep a single live connection.
        let mut connections = self.lock_connections();
        // Read with the map locked: a follow bumps the generation before it clears the map, so
        // a connection judged before another task's follow is never kept after it.
        if self.inner.identity.generation() != before + u64::from(followed) {
            return Err(Failure::Unsent(format!(
                "{endpoint} was judged before the client followed its cluster to a restore"
            )));
        }
        forget_named(&mut connections, &self.inner.endpoints, endpoint);
        let entry = connections.entry(endpoint.to_owned()).or_insert_with(|| opened.clone());
        if entry.is_closed() {
            *entry = opened;
        }
        Ok(entry.clone())
    }

    /// Asks the node at the other end of a new `connection` which cluster it belongs to, and
    /// refuses it when that is not the client's. `Ok(true)` when the client follows the node's
    /// cluster from now on, as a restore of its own. Nothing of the caller's request has been
    /// sent yet, so a failure here leaves it free to go elsewhere.
    async fn check_cluster(
        &self,
        endpoint: &str,
        connection: &Connection,
    ) -> Result<bool, Failure> {
        let mut client = connection.grpc();
        let asked = client.cluster(v1::Empty {});
        let info = match tokio::time::timeout(self.inner.config.request_timeout, asked).await {
            Ok(Ok(info)) => info.into_inner(),
            // A refusal of the service's own (unauthenticated, overloaded, stopping) is what
            // the request would have met there too.
            Ok(Err(status)) if status.metadata().contains_key(picket_proto::ERROR_CODE_KEY) => {
                return Err(classify(&status));
            }
            Ok(Err(status)) => {
                return Err(Failure::Unsent(format!(
                    "asking {endpoint} which cluster it belongs to: {}: {}",
                    status.code(),
                    status.message()
                )));
            }
            Err(_) => {
                return Err(Failure::Unsent(format!(
                    "{endpoint} did not say which cluster it belongs to within {:?}",
                    self.inner.config.request_timeout
                )));
            }
        };
        match self.inner.identity.judge(endpoint, &info.cluster_id, &info.restored_from_cluster_id)
        {
            Verdict::Same => Ok(false),
            Verdict::Unknown => Err(Failure::Unavailable(format!(
                "{endpoint} does not know its cluster's id yet (starting, or catching up)"
            ))),
            Verdict::Learned => {
                tracing::debug!(%endpoint, cluster_id = %info.cluster_id, "keeping to the cluster found");
                Ok(false)
            }
            Verdict::Followed => {
                tracing::warn!(
                    %endpoint,
                    cluster_id = %info.cluster_id,
                    restored_from = %info.restored_from_cluster_id,
                    "the client's cluster was restored from a backup; following the restored one"
                );
                Ok(true)
            }
            Verdict::Other(error) => {
                tracing::warn!(%endpoint, "{error}");
                Err(Failure::OtherCluster(error))
            }
        }
    }

    fn lock_connections(&self) -> std::sync::MutexGuard<'_, HashMap<String, Connection>> {
        self.inner.connections.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn lock_leader(&self) -> std::sync::MutexGuard<'_, Option<Leader>> {
        self.inner.leader.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn set_leader_hint(&self, endpoint: Option<&str>) {
        *self.lock_leader() =
            endpoint.map(|endpoint| Leader { endpoint: endpoint.into(), connection: None });
    }

    /// Notes that a call to `endpoint`, made on `connection`, succeeded: the calls after it go
    /// there first, on that connection. Nothing changes when it was already so.
    fn answered_at(&self, endpoint: &Arc<str>, connection: Option<Connection>) {
        let mut leader = self.lock_leader();
        match leader.as_mut() {
            Some(known) if Arc::ptr_eq(&known.endpoint, endpoint) => {
                if connection.is_some() {
                    known.connection = connection;
                }
            }
            _ => *leader = Some(Leader { endpoint: endpoint.clone(), connection }),
        }
    }

    /// Where the next attempt goes, and the connection to it if it is the leader's and open.
    fn next_target(&self, next_endpoint: usize) -> (Arc<str>, Option<Connection>) {
        match self.lock_leader().as_ref() {
            Some(leader) => (
                leader.endpoint.clone(),
                leader.connection.as_ref().filter(|open| !open.is_closed()).cloned(),
            ),
            None => {
                let endpoints = &self.inner.endpoints;
                (endpoints[next_endpoint % endpoints.len()].as_str().into(), None)
            }
        }
    }

    /// Runs one call against the cluster: at the leader if known, following `not_leader`
    /// refusals, moving to the next endpoint when one is down, and backing off during
    /// elections, until `retry_for` runs out.
    pub(crate) async fn call<T, F, Fut>(
        &self,
        retry: Retry,
        timeout: Option<Duration>,
        mut attempt: F,
    ) -> Result<T, ClientError>
    where
        F: FnMut(Connection) -> Fut,
        Fut: Future<Output = Result<Response<T>, Status>>,
    {
        let config = &self.inner.config;
        let deadline = Instant::now() + config.retry_for;
        let mut backoff = config.initial_backoff;
        let mut next_endpoint = 0;
        let mut last_failure;
        let mut reached_any = false;
        let mut refused = 0;
        let mut redirects = 0;
        let mut other_cluster = None;
        loop {
            let generation = self.inner.identity.generation();
            let (target, known) = self.next_target(next_endpoint);
            // A connection opened or looked up here is kept with the leader once a call on it
            // succeeds; the leader's own is already there.
            let (connected, keep) = match known {
                Some(connection) => (Ok(connection), None),
                None => match self.connection(&target).await {
                    Ok(connection) => (Ok(connection.clone()), Some(connection)),
                    Err(failure) => (Err(failure), None),
                },
            };
            let failure = match connected {
                Err(failure) => failure,
                Ok(connection) => {
                    let call = attempt(connection);
                    let result = match timeout {
                        Some(timeout) => {
                            tokio::time::timeout(timeout, call).await.unwrap_or_else(|_| {
                                Err(Status::deadline_exceeded("the request timed out"))
                            })
                        }
                        None => call.await,
                    };
                    match result {
                        Ok(response) => {
                            // Not after a follow of the client's cluster to a restore: the
                            // node answered for the cluster before.
                            if self.inner.identity.generation() == generation {
                                self.answered_at(&target, keep);
                            }
                            return Ok(response.into_inner());
                        }
                        Err(status) => classify(&status),
                    }
                }
            };
            match failure {
                Failure::Final(error) => return Err(error),
                Failure::NotLeader(Some(leader)) if *leader != *target => {
                    reached_any = true;
                    self.set_leader_hint(Some(&leader));
                    // Nodes with stale views during an election can name each other: follow a
                    // few names at once, then back off before calling the last one named.
                    redirects += 1;
                    if redirects <= MAX_REDIRECTS {
                        continue;
                    }
                    last_failure =
                        format!("{target}: names {leader} as leader, which has not served");
                }
                // A node that knows no leader, or names itself without serving (one removed
                // from the cluster keeps its last vote for itself), or cannot serve now (cut
                // off from a quorum, catching up): another endpoint may reach the leader. The
                // client used to ask the same one again, so a first endpoint cut off from the
                // others kept every call from the cluster until `retry_for` ran out.
                Failure::NotLeader(_) => {
                    reached_any = true;
                    last_failure = format!("{target}: no leader yet");
                    self.set_leader_hint(None);
                    next_endpoint += 1;
                }
                Failure::Unavailable(detail) => {
                    reached_any = true;
                    last_failure = format!("{target}: {detail}");
                    self.set_leader_hint(None);
                    next_endpoint += 1;
                }
                Failure::Unsent(_) | Failure::OtherCluster(_) => {
                    match failure {
                        Failure::OtherCluster(error) => {
                            last_failure = format!("{target}: another cluster's node");
                            other_cluster = Some(error);
                        }
                        Failure::Unsent(detail) => last_failure = format!("{target}: {detail}"),
                        _ => unreachable!("matched above"),
                    }
                    self.set_leader_hint(None);
                    next_endpoint += 1;
                    refused += 1;
                    // Every endpoint refused the connection (or was another cluster's) three
                    // times over and none ever answered: nothing of the client's cluster is
                    // listening. Say so now instead of after `retry_for`.
                    if !reached_any && refused >= 3 * self.inner.endpoints.len() {
                        return Err(self.unreached(other_cluster, last_failure));
                    }
                }
                Failure::Broken(detail) => {
                    if retry == Retry::UnlessSent {
                        return Err(ClientError::OutcomeUnknown(format!("{target}: {detail}")));
                    }
                    last_failure = format!("{target}: {detail}");
                    self.set_leader_hint(None);
                    next_endpoint += 1;
                }
            }
            if Instant::now() + backoff > deadline {
                return Err(if reached_any {
                    ClientError::Service {
                        code: ErrorCode::Unavailable,
                        message: format!(
                            "the cluster has no leader that can serve ({last_failure}); retry later"
                        ),
                        holder_token: None,
                    }
                } else {
                    self.unreached(other_cluster, last_failure)
                });
            }
            tokio::time::sleep(backoff).await;
            // Only redirects with no pause between them count toward the bound.
            redirects = 0;
            backoff = (backoff * 2).min(config.max_backoff);
        }
    }

    /// The error of a call that reached no node of the client's cluster: the last node found
    /// in another cluster, if any was, else the last transport error.
    fn unreached(&self, other_cluster: Option<ClientError>, last_failure: String) -> ClientError {
        other_cluster.unwrap_or_else(|| ClientError::Unreachable {
            endpoints: self.inner.endpoints.join(","),
            detail: last_failure,
        })
    }

    /// Opens a watch stream as `request` asks.
    pub(crate) async fn watch_with(
        &self,
        request: v1::WatchRequest,
    ) -> Result<tonic::Streaming<v1::WatchEvent>, ClientError> {
        self.call(Retry::Safe, Some(self.inner.config.request_timeout), |connection| {
            let request = request.clone();
            async move { connection.grpc().watch(request).await }
        })
        .await
    }

    /// Acquires `name` in session `session_id`, waiting as `wait` says. A waiting acquire is
    /// not cut off by the request timeout (the server ends the wait). Every attempt carries the same request id, so a
    /// retry after a broken connection joins the first attempt's wait or gets its grant: it is
    /// safe to retry.
    pub(crate) async fn acquire(
        &self,
        session_id: u64,
        name: &str,
        wait: Wait,
    ) -> Result<v1::AcquireResponse, ClientError> {
        let request_timeout = self.inner.config.request_timeout;
        let wait_ms = wait.wait_ms();
        let timeout = wait_ms.map(|wait_ms| request_timeout + Duration::from_millis(wait_ms));
        self.abandon_done(session_id, name).await;
        let request_id = fresh_request_id();
        let attempts = std::sync::atomic::AtomicU32::new(0);
        // Dropped before the call ends (the caller gave up on it: a timeout, a `select!`), the
        // acquire is abandoned too: its answer may have been on its way.
        let mut unanswered = UnansweredAcquire {
            transport: self,
            session_id,
            name,
            request_id,
            attempts: &attempts,
            armed: true,
        };
        let result = self
            .call(Retry::Safe, timeout, |connection| {
                let attempt = attempts.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let request = v1::AcquireRequest {
                    name: name.to_owned(),
                    session_id,
                    wait_ms,
                    request_id: Some(request_id),
                    attempt,
                };
                async move { connection.acquire(request).await }
            })
            .await;
        unanswered.armed = false;
        let sent = attempts.load(std::sync::atomic::Ordering::Relaxed);
        // After a retry, an earlier attempt's answer was lost: it may have made a grant that
        // the last attempt's refusal does not show. Abandoning what did nothing changes nothing.
        if let Err(error) = &result
            && sent > 0
            && (sent > 1 || outcome_may_linger(error))
        {
            self.abandon_in_background(session_id, name, request_id, sent - 1);
        }
        result
    }

    /// Waits until an abandon of `name` in `session_id` on its way has been answered (or has
    /// given up): a new acquire of the lock answered `already_held` before it landed would be
    /// told it holds a grant the abandon then takes away.
    async fn abandon_done(&self, session_id: u64, name: &str) {
        // Bounded: an abandon that cannot get through keeps trying (see `abandons.rs`), and
        // this acquire gets its own chance to say the cluster is unreachable. Nodes on apply
        // rules 2 or later keep a grant for a request told of it whenever the abandon lands,
        // so going on early is safe with them.
        let longest = self.inner.config.retry_for;
        self.inner.abandons.wait_for(self, session_id, name, longest).await;
    }

    /// Undoes, in the background, whatever the given-up acquire's last attempt left in the
    /// lock state: its wait, or a grant whose answer never arrived, which no guard would know
    /// of and the session would hold for as long as it lives. Abandoning an attempt that did
    /// nothing, or that a retry overtook, changes nothing, so it is always safe to send. Not
    /// given up after one round of retries: until it lands, the session may hold a grant
    /// nobody knows of, or one a later request was told of and has given up on too (that
    /// one's abandon cannot end the grant while this request still counts as told of it).
    fn abandon_in_background(&self, session_id: u64, name: &str, request_id: u64, attempt: u32) {
        let request = v1::AbandonRequest { name: name.to_owned(), session_id, request_id, attempt };
        self.inner.abandons.queue(self, request);
    }

    /// Releases grant `token` of `name` held by `session_id`, retried like a read. The first
    /// attempt's refusals are the caller's (`not_held`, `token_mismatch`). After a retry, a
    /// `not_held` naming another token (or none) may be this call's own earlier success, which
    /// left the lock no longer held under `token`: that is what was asked, so it counts as done.
    pub(crate) async fn release(
        &self,
        session_id: u64,
        name: &str,
        token: u64,
    ) -> Result<crate::Released, ClientError> {
        let timeout = Some(self.inner.config.request_timeout);
        let mut attempts = 0_u32;
        let result = self
            .call(Retry::Safe, timeout, |connection| {
                attempts += 1;
                let request = v1::ReleaseRequest { name: name.to_owned(), session_id, token };
                async move { connection.release(request).await }
            })
            .await;
        match result {
            // A retry after a lost answer: the first attempt may have been the one.
            Err(error) if attempts > 1 && released_elsewhere(&error, token) => {
                Ok(crate::Released::Earlier)
            }
            other => other.map(|_| crate::Released::Now),
        }
    }
}

/// Refuses a given cluster id that no cluster could have: 32 lowercase hexadecimal digits.
fn check_cluster_id(cluster_id: &str) -> Result<(), ClientError> {
    if picket_core::is_cluster_id(cluster_id) {
        return Ok(());
    }
    let digits = picket_core::CLUSTER_ID_HEX_DIGITS;
    Err(ClientError::InvalidArgument(format!(
        "{cluster_id:?} is not a cluster id ({digits} lowercase hexadecimal digits): copy it from `picket members` or GET /v1/cluster"
    )))
}

/// Most connections kept open to nodes outside the configured endpoints: leaders a node named.
const MOST_NAMED_CONNECTIONS: usize = 8;

/// Before a connection to `opening` is kept: past [`MOST_NAMED_CONNECTIONS`] to nodes outside
/// `configured`, forgets those (not `opening`). The calls under way keep their own handles,
/// and the leader its own. Every node a refusal named as leader was kept for the client's
/// life: a cluster whose nodes moved, or a node naming aliases of itself, grew the map (and
/// the connections held open) without bound (found in review).
fn forget_named<T>(connections: &mut HashMap<String, T>, configured: &[String], opening: &str) {
    let named = connections.keys().filter(|name| !configured.contains(name)).count();
    if named >= MOST_NAMED_CONNECTIONS {
        connections.retain(|name, _| name == opening || configured.contains(name));
    }
}

/// An acquire call in progress; dropped while still armed (its caller gave up on it before
/// it ended), it abandons the request's last attempt.
struct UnansweredAcquire<'a> {
    transport: &'a Transport,
    session_id: u64,
    name: &'a str,
    request_id: u64,
    attempts: &'a std::sync::atomic::AtomicU32,
    armed: bool,
}

impl Drop for UnansweredAcquire<'_> {
    fn drop(&mut self) {
        let sent = self.attempts.load(std::sync::atomic::Ordering::Relaxed);
        if self.armed && sent > 0 && tokio::runtime::Handle::try_current().is_ok() {
            self.transport.abandon_in_background(
                self.session_id,
                self.name,
                self.request_id,
                sent - 1,
            );
        }
    }
}

/// Whether an acquire that failed with `error` may have left a wait or a grant behind: its
/// last attempt may have reached the service and the answer was lost (a broken connection, no
/// leader until the retries ran out). A refusal answered the last attempt, and a lost session
/// or an argument refused before sending left nothing.
pub(crate) fn outcome_may_linger(error: &ClientError) -> bool {
    match error {
        // Another cluster's nodes were all that answered at the end; an earlier attempt may
        // have reached the client's own.
        ClientError::OutcomeUnknown(_)
        | ClientError::Unreachable { .. }
        | ClientError::OtherCluster { .. } => true,
        ClientError::Service { code, .. } => *code == ErrorCode::Unavailable,
        ClientError::UnknownRefusal { .. }
        | ClientError::SessionLost(_)
        | ClientError::InvalidArgument(_) => false,
    }
}

/// Whether `error` says the lock is no longer held under `token` (free, or held under another
/// token): what a release of `token` leaves behind.
pub(crate) fn released_elsewhere(error: &ClientError, token: u64) -> bool {
    error.is(ErrorCode::NotHeld) && error.holder_token() != Some(token)
}

/// A random request id: unique among a session's requests in practice.
fn fresh_request_id() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u64(COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
    hasher.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::LostReason;

    /// Connections to nodes a refusal named are kept a few at a time; the configured ones
    /// always.
    #[test]
    fn connections_to_named_nodes_are_bounded() {
        let configured = vec!["a:1".to_owned(), "b:1".to_owned()];
        let mut connections: HashMap<String, u32> = HashMap::new();
        for name in &configured {
            connections.insert(name.clone(), 0);
        }
        for n in 0..100_u32 {
            let named = format!("named-{n}:1");
            forget_named(&mut connections, &configured, &named);
            connections.insert(named, n);
            let outside = connections.keys().filter(|name| !configured.contains(name)).count();
            assert!(outside <= MOST_NAMED_CONNECTIONS, "{outside} after {n}");
            assert!(configured.iter().all(|name| connections.contains_key(name)));
        }
        // A full set of named connections, one of them the node being opened again.
        connections.retain(|name, _| configured.contains(name));
        for n in 0..MOST_NAMED_CONNECTIONS {
            connections.insert(format!("named-{n}:1"), 0);
        }
        forget_named(&mut connections, &configured, "named-3:1");
        let mut kept: Vec<&str> = connections.keys().map(String::as_str).collect();
        kept.sort_unstable();
        assert_eq!(kept, ["a:1", "b:1", "named-3:1"], "the one being opened stays, alone");
    }

    impl Transport {
        /// This transport, not checking which cluster a connection leads to: the fake nodes
        /// here answer nothing, and the calls under test make their own answers.
        fn unchecked(mut self) -> Self {
            Arc::get_mut(&mut self.inner).expect("not shared yet").check_cluster = false;
            self
        }
    }

    /// A node that takes wire connections and answers nothing: the calls under test make their
    /// own answers.
    async fn silent_node() -> String {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut opening = [0_u8; picket_proto::wire::MAGIC.len()];
                    stream.read_exact(&mut opening).await?;
                    stream.write_all(picket_proto::wire::MAGIC).await?;
                    stream.write_all(&16_u32.to_le_bytes()).await?;
                    stream.write_all(&(1_u32 << 20).to_le_bytes()).await?;
                    let mut sink = [0_u8; 1024];
                    while stream.read(&mut sink).await? > 0 {}
                    std::io::Result::Ok(())
                });
            }
        });
        addr
    }

    /// Two nodes that name each other as leader (stale views during an election) are not
    /// called in a loop without end: the client backs off after a few redirects and gives up
    /// when its retry window closes.
    #[tokio::test]
    async fn nodes_naming_each_other_as_leader_are_not_called_without_end() {
        let nodes = [silent_node().await, silent_node().await];
        let config = ClientConfig {
            retry_for: Duration::from_millis(300),
            initial_backoff: Duration::from_millis(10),
            max_backoff: Duration::from_millis(20),
            protocol: Protocol::Wire,
            ..ClientConfig::default()
        };
        let transport = Transport::new(nodes.clone(), config).unwrap().unchecked();
        let attempts = std::sync::atomic::AtomicU32::new(0);
        // Each attempt is refused at once, so a client that never backs off never yields
        // either: the refusals turn final after 1,000 attempts instead of spinning for ever.
        let call = transport.call(Retry::Safe, None, |connection| {
            let attempt = attempts.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let called = connection.origin().authority().map(ToString::to_string);
            let other = nodes.iter().find(|node| Some(node.as_str()) != called.as_deref());
            let mut refusal = Status::unavailable("not the leader");
            let code = if attempt < 1_000 { ErrorCode::NotLeader } else { ErrorCode::InvalidName };
            refusal
                .metadata_mut()
                .insert(picket_proto::ERROR_CODE_KEY, code.as_str().parse().unwrap());
            refusal
                .metadata_mut()
                .insert(picket_proto::LEADER_KEY, other.unwrap().parse().unwrap());
            async move { Err::<Response<()>, _>(refusal) }
        });
        let error = tokio::time::timeout(Duration::from_secs(10), call)
            .await
            .expect("the call was not given up in time")
            .unwrap_err();
        let attempts = attempts.load(std::sync::atomic::Ordering::Relaxed);
        assert_eq!(
            error.code(),
            Some(ErrorCode::Unavailable),
            "{error}: still following redirects after {attempts} attempts"
        );
        assert!(error.to_string().contains("names"), "{error}");
        assert!((4..=200).contains(&attempts), "{attempts} attempts in 300 ms");
    }

    /// During an outage, the abandons of many given-up acquires wait in one bounded queue and
    /// are sent by one task. Each used to run on a task of its own, trying for an hour: a
    /// caller retrying its acquire with a short timeout left one behind per attempt. (On one
    /// thread, so that the task takes none before the queue is full: the first 200 are the
    /// ones dropped.)
    #[tokio::test]
    async fn abandons_during_an_outage_share_one_task_and_a_bounded_queue() {
        use abandons::MAX_PENDING_ABANDONS;
        // A port nothing listens on: every call is refused at once, as in an outage.
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let endpoint = closed.local_addr().unwrap().to_string();
        drop(closed);
        let config = ClientConfig {
            retry_for: Duration::from_millis(200),
            request_timeout: Duration::from_millis(100),
            connect_timeout: Duration::from_millis(100),
            initial_backoff: Duration::from_millis(5),
            max_backoff: Duration::from_millis(20),
            ..ClientConfig::default()
        };
        let transport = Transport::new([endpoint], config).unwrap();
        let runtime = tokio::runtime::Handle::current();
        let given_up = MAX_PENDING_ABANDONS + 200;
        for n in 0..given_up {
            transport.abandon_in_background(1, &format!("lock-{n}"), n as u64, 0);
        }
        let tasks = runtime.metrics().num_alive_tasks();
        assert_eq!(tasks, 1, "{tasks} tasks for {given_up} abandons");
        let waiting = transport.inner.abandons.waiting();
        assert!(waiting <= MAX_PENDING_ABANDONS, "{waiting} abandons waiting");
        // The oldest were dropped, so a new acquire of their lock does not wait for them; the
        // newest are still trying, so one of their lock waits (as long as it is allowed).
        let dropped =
            transport.inner.abandons.wait_for(&transport, 1, "lock-0", Duration::from_secs(3_600));
        tokio::time::timeout(Duration::from_secs(5), dropped)
            .await
            .expect("an acquire waited for an abandon that was dropped");
        let newest = format!("lock-{}", given_up - 1);
        let trying =
            transport.inner.abandons.wait_for(&transport, 1, &newest, Duration::from_secs(3_600));
        tokio::time::timeout(Duration::from_millis(500), trying)
            .await
            .expect_err("an abandon still trying was reported done");
        // Once every handle of the client is gone, so is the task.
        drop(transport);
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while runtime.metrics().num_alive_tasks() > 0 {
            assert!(std::time::Instant::now() < deadline, "the abandons' task outlived the client");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// A client that outlives the runtime its abandons task was on (dropped with it, here
    /// before it ever ran) starts another for the abandons left, when an acquire waits for
    /// one of them or another is queued, and never two.
    #[test]
    fn abandons_go_on_after_the_runtime_of_their_task_is_gone() {
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let endpoint = closed.local_addr().unwrap().to_string();
        drop(closed);
        let config = ClientConfig { retry_for: Duration::from_millis(200), ..Default::default() };
        let transport = Transport::new([endpoint], config).unwrap();
        let first = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        first.block_on(async { transport.abandon_in_background(1, "a", 1, 0) });
        drop(first);
        let second = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        second.block_on(async {
            let tasks = || tokio::runtime::Handle::current().metrics().num_alive_tasks();
            let abandons = &transport.inner.abandons;
            abandons.wait_for(&transport, 1, "a", Duration::from_millis(100)).await;
            assert_eq!(tasks(), 1, "no task sends the abandon left by the runtime");
            transport.abandon_in_background(1, "b", 2, 0);
            assert_eq!(tasks(), 1, "a second task");
        });
    }

    /// With every place for an abandon on its way taken and others due again, the task waits
    /// for one to end: it used to turn without pause for as long as the calls took.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_abandons_task_waits_while_every_place_is_taken() {
        let config = ClientConfig {
            retry_for: Duration::from_millis(300),
            request_timeout: Duration::from_millis(100),
            connect_timeout: Duration::from_millis(100),
            initial_backoff: Duration::from_millis(5),
            max_backoff: Duration::from_millis(5),
            ..ClientConfig::default()
        };
        let transport = Transport::new([silent_node().await], config).unwrap().unchecked();
        for n in 0..20 {
            transport.abandon_in_background(1, &format!("lock-{n}"), n, 0);
        }
        tokio::time::sleep(Duration::from_millis(1_500)).await;
        let turns = transport.inner.abandons.turns.load(std::sync::atomic::Ordering::Relaxed);
        assert!(turns < 2_000, "{turns} turns in 1.5 s for 20 abandons");
    }

    #[test]
    fn a_given_up_acquire_is_abandoned_unless_its_last_attempt_was_answered() {
        let refusal = |code: ErrorCode| ClientError::Service {
            code,
            message: String::new(),
            holder_token: None,
        };
        assert!(outcome_may_linger(&ClientError::OutcomeUnknown("leadership moved".into())));
        assert!(outcome_may_linger(&ClientError::Unreachable {
            endpoints: "127.0.0.1:1".into(),
            detail: "a broken connection".into(),
        }));
        assert!(
            outcome_may_linger(&refusal(ErrorCode::Unavailable)),
            "no leader until the retries ran out"
        );
        for answered in [
            ErrorCode::LockBusy,
            ErrorCode::WaitTimedOut,
            ErrorCode::UnknownSession,
            ErrorCode::AlreadyWaiting,
        ] {
            assert!(!outcome_may_linger(&refusal(answered)), "{answered}");
        }
        assert!(!outcome_may_linger(&ClientError::SessionLost(LostReason::Expired)));
        assert!(!outcome_may_linger(&ClientError::InvalidArgument("too long".into())));
    }
}
