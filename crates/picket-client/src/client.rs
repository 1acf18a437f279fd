//! The connection to a cluster: finds the leader, follows it, retries what is safe to retry.

use crate::error::{ClientError, Failure, classify};
use crate::session::Session;
use picket_proto::MAX_KEEPALIVE_BATCH;
use picket_proto::connection::Connection;
use picket_proto::tls::ClientTls;
use picket_proto::v1::{self, picket_client::PicketClient};
use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tonic::transport::Endpoint;
use tonic::{Response, Status};

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

/// A handle to a Picket cluster. Cheap to clone; clones share connections.
#[derive(Clone, Debug)]
pub struct Client {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    endpoints: Vec<String>,
    config: ClientConfig,
    leader: Mutex<Option<String>>,
    connections: Mutex<HashMap<String, Connection>>,
    keepalives: tokio::sync::OnceCell<mpsc::Sender<KeepAliveJob>>,
    watcher: tokio::sync::OnceCell<Arc<crate::watcher::SessionWatcher>>,
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

/// A handle that does not keep the client alive, for its background tasks.
#[derive(Debug, Clone)]
pub(crate) struct WeakClient(std::sync::Weak<Inner>);

/// One session's keepalive waiting to join a batch.
type KeepAliveJob = (u64, oneshot::Sender<Result<u64, ClientError>>);

/// Largest request the client sends; the server's own limit is far smaller, so a larger one is a
/// bug in the caller, not a request worth buffering.
const MAX_REQUEST_BYTES: usize = 16 * 1024 * 1024;
/// How long the batcher waits for more keepalives to join a batch.
const KEEPALIVE_LINGER: Duration = Duration::from_millis(2);

impl Client {
    /// Connects to a cluster through any of its members (`host:port`) and checks that one of
    /// them answers.
    ///
    /// # Errors
    /// [`ClientError::Unreachable`] when none answers; [`ClientError::InvalidArgument`] for an
    /// empty or malformed endpoint list.
    pub async fn connect(
        endpoints: impl IntoIterator<Item = impl Into<String>>,
    ) -> Result<Self, ClientError> {
        Self::connect_with(endpoints, ClientConfig::default()).await
    }

    /// [`Client::connect`] with explicit timeouts.
    ///
    /// # Errors
    /// As [`Client::connect`].
    pub async fn connect_with(
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
        let client = Self {
            inner: Arc::new(Inner {
                endpoints,
                config,
                leader: Mutex::new(None),
                connections: Mutex::new(HashMap::new()),
                keepalives: tokio::sync::OnceCell::new(),
                watcher: tokio::sync::OnceCell::new(),
            }),
        };
        client.cluster().await?;
        Ok(client)
    }

    /// The endpoints this client was given.
    #[must_use]
    pub fn endpoints(&self) -> &[String] {
        &self.inner.endpoints
    }

    pub(crate) fn config(&self) -> &ClientConfig {
        &self.inner.config
    }

    /// The open connection to `endpoint`, opened first if there is none or it has closed.
    async fn connection(&self, endpoint: &str) -> Result<PicketClient<Connection>, Status> {
        let cached = self.lock_connections().get(endpoint).filter(|c| !c.is_closed()).cloned();
        let connection = match cached {
            Some(connection) => connection,
            None => {
                let opened = Connection::open(
                    endpoint,
                    self.inner.config.connect_timeout,
                    MAX_REQUEST_BYTES,
                    self.inner.config.tls.as_ref(),
                )
                .await?;
                let opened = match &self.inner.config.bearer_token {
                    Some(token) => opened.with_bearer_token(token)?,
                    None => opened,
                };
                // Another call may have opened one meanwhile; keep a single live connection.
                let mut connections = self.lock_connections();
                let entry =
                    connections.entry(endpoint.to_owned()).or_insert_with(|| opened.clone());
                if entry.is_closed() {
                    *entry = opened;
                }
                entry.clone()
            }
        };
        let origin = connection.origin();
        Ok(PicketClient::with_origin(connection, origin))
    }

    fn lock_connections(&self) -> std::sync::MutexGuard<'_, HashMap<String, Connection>> {
        self.inner.connections.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn leader_hint(&self) -> Option<String> {
        self.inner.leader.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    fn set_leader_hint(&self, leader: Option<String>) {
        *self.inner.leader.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = leader;
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
        F: FnMut(PicketClient<Connection>) -> Fut,
        Fut: Future<Output = Result<Response<T>, Status>>,
    {
        let config = &self.inner.config;
        let deadline = Instant::now() + config.retry_for;
        let mut backoff = config.initial_backoff;
        let mut next_endpoint = 0;
        let mut last_failure;
        let mut reached_any = false;
        let mut refused = 0;
        loop {
            let target = self.leader_hint().unwrap_or_else(|| {
                self.inner.endpoints[next_endpoint % self.inner.endpoints.len()].clone()
            });
            let result = match self.connection(&target).await {
                Err(unsent) => Err(unsent),
                Ok(connection) => {
                    let call = attempt(connection);
                    match timeout {
                        Some(timeout) => {
                            tokio::time::timeout(timeout, call).await.unwrap_or_else(|_| {
                                Err(Status::deadline_exceeded("the request timed out"))
                            })
                        }
                        None => call.await,
                    }
                }
            };
            let failure = match result {
                Ok(response) => {
                    self.set_leader_hint(Some(target));
                    return Ok(response.into_inner());
                }
                Err(status) => classify(&status),
            };
            match failure {
                Failure::Final(error) => return Err(error),
                Failure::NotLeader(Some(leader)) if leader != target => {
                    reached_any = true;
                    self.set_leader_hint(Some(leader));
                    continue;
                }
                Failure::NotLeader(_) => {
                    reached_any = true;
                    last_failure = format!("{target}: no leader yet");
                    self.set_leader_hint(None);
                }
                Failure::Unavailable(detail) => {
                    reached_any = true;
                    last_failure = format!("{target}: {detail}");
                    self.set_leader_hint(None);
                }
                Failure::Unsent(detail) => {
                    last_failure = format!("{target}: {detail}");
                    self.set_leader_hint(None);
                    next_endpoint += 1;
                    refused += 1;
                    // Every endpoint refused the connection three times over and none ever
                    // answered: nothing is listening. Say so now instead of after `retry_for`.
                    if !reached_any && refused >= 3 * self.inner.endpoints.len() {
                        return Err(ClientError::Unreachable {
                            endpoints: self.inner.endpoints.join(","),
                            detail: last_failure,
                        });
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
                        code: "unavailable".into(),
                        message: format!(
                            "the cluster has no leader that can serve ({last_failure}); retry later"
                        ),
                        holder_token: None,
                    }
                } else {
                    ClientError::Unreachable {
                        endpoints: self.inner.endpoints.join(","),
                        detail: last_failure,
                    }
                });
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(config.max_backoff);
        }
    }

    pub(crate) fn downgrade(&self) -> WeakClient {
        WeakClient(Arc::downgrade(&self.inner))
    }

    pub(crate) fn upgrade(weak: &WeakClient) -> Option<Self> {
        weak.0.upgrade().map(|inner| Self { inner })
    }

    /// The watcher of this client's sessions, if started.
    pub(crate) fn existing_session_watcher(&self) -> Option<&Arc<crate::watcher::SessionWatcher>> {
        self.inner.watcher.get()
    }

    /// The watcher of this client's sessions, started on first use.
    pub(crate) async fn session_watcher(&self) -> Arc<crate::watcher::SessionWatcher> {
        self.inner
            .watcher
            .get_or_init(|| async {
                let watcher = Arc::new(crate::watcher::SessionWatcher::default());
                tokio::spawn(crate::watcher::run(self.clone(), watcher.clone()));
                watcher
            })
            .await
            .clone()
    }

    /// Keeps `session_id` alive, sharing one RPC with every other session of this client whose
    /// keepalive is due within the same couple of milliseconds. Returns the session's TTL.
    pub(crate) async fn keep_alive(&self, session_id: u64) -> Result<u64, ClientError> {
        let batcher = self
            .inner
            .keepalives
            .get_or_init(|| async {
                let (sender, receiver) = mpsc::channel(MAX_KEEPALIVE_BATCH);
                tokio::spawn(run_keepalive_batcher(self.clone(), receiver));
                sender
            })
            .await;
        let (reply, answer) = oneshot::channel();
        batcher.send((session_id, reply)).await.map_err(|_| batcher_gone())?;
        answer.await.map_err(|_| batcher_gone())?
    }

    /// Opens a session with `ttl` whose keepalive runs in the background until it is closed
    /// or dropped.
    ///
    /// # Errors
    /// A refused TTL, or the cluster being unreachable.
    pub async fn session(&self, ttl: Duration) -> Result<Session, ClientError> {
        Session::open(self.clone(), ttl, Duration::ZERO).await
    }

    /// [`Client::session`] with a lock-delay: after the session expires or is revoked, its
    /// locks stay ungrantable this long.
    ///
    /// # Errors
    /// As [`Client::session`].
    pub async fn session_with_lock_delay(
        &self,
        ttl: Duration,
        lock_delay: Duration,
    ) -> Result<Session, ClientError> {
        Session::open(self.clone(), ttl, lock_delay).await
    }

    /// Membership and leadership, from whichever node answers.
    ///
    /// # Errors
    /// When no node answers.
    pub async fn cluster(&self) -> Result<v1::ClusterInfo, ClientError> {
        let timeout = Some(self.inner.config.request_timeout);
        self.call(
            Retry::Safe,
            timeout,
            |mut client| async move { client.cluster(v1::Empty {}).await },
        )
        .await
    }

    /// A consistent backup of the lock state, taken on the leader (admins only): the bytes of
    /// a backup file, to restore with `picket serve --restore FILE`.
    ///
    /// # Errors
    /// Permission denied; the cluster being unreachable; the stream breaking before its end
    /// (nothing partial is returned).
    pub async fn backup(&self) -> Result<Vec<u8>, ClientError> {
        let timeout = Some(self.inner.config.request_timeout);
        let mut chunks =
            self.call(Retry::Safe, timeout, |mut client| async move {
                client.backup(v1::Empty {}).await
            })
            .await?;
        let mut bytes = Vec::new();
        let broken = |status: tonic::Status| ClientError::Service {
            code: "backup_incomplete".into(),
            message: format!(
                "the backup stream broke before its end: {}; try again",
                status.message()
            ),
            holder_token: None,
        };
        while let Some(chunk) = chunks.message().await.map_err(broken)? {
            bytes.extend_from_slice(&chunk.data);
        }
        Ok(bytes)
    }

    /// The state of one lock.
    ///
    /// # Errors
    /// An invalid name; the cluster being unreachable.
    pub async fn lock_info(&self, name: &str) -> Result<v1::LockInfo, ClientError> {
        let timeout = Some(self.inner.config.request_timeout);
        self.call(Retry::Safe, timeout, |mut client| {
            let request = v1::GetLockRequest { name: name.to_owned() };
            async move { client.get_lock(request).await }
        })
        .await
    }

    /// Locks whose names start with `prefix`, at most `limit` (0 for the server's maximum).
    ///
    /// # Errors
    /// The cluster being unreachable.
    pub async fn locks(&self, prefix: &str, limit: u32) -> Result<Vec<v1::LockInfo>, ClientError> {
        let timeout = Some(self.inner.config.request_timeout);
        let response = self
            .call(Retry::Safe, timeout, |mut client| {
                let request =
                    v1::ListLocksRequest { prefix: prefix.to_owned(), after: String::new(), limit };
                async move { client.list_locks(request).await }
            })
            .await?;
        Ok(response.locks)
    }

    /// Live sessions, at most `limit` (0 for the server's maximum).
    ///
    /// # Errors
    /// The cluster being unreachable.
    pub async fn sessions(&self, limit: u32) -> Result<Vec<v1::SessionInfo>, ClientError> {
        let timeout = Some(self.inner.config.request_timeout);
        let response = self
            .call(Retry::Safe, timeout, |mut client| async move {
                client.list_sessions(v1::ListSessionsRequest { after: 0, limit }).await
            })
            .await?;
        Ok(response.sessions)
    }

    /// Whether `sequencer` is its lock's current grant: `("current" | "superseded" |
    /// "unknown_lock", current token or 0)`.
    ///
    /// # Errors
    /// A malformed sequencer; the cluster being unreachable.
    pub async fn check(&self, sequencer: &str) -> Result<v1::CheckResponse, ClientError> {
        let timeout = Some(self.inner.config.request_timeout);
        self.call(Retry::Safe, timeout, |mut client| {
            let request = v1::CheckRequest { sequencer: sequencer.to_owned() };
            async move { client.check(request).await }
        })
        .await
    }

    /// Acquires `name` in an existing session that its owner keeps alive. `wait_ms`: `None`
    /// waits until granted, `Some(0)` tries once, `Some(n)` waits at most n ms. Prefer
    /// [`Client::session`] and [`Session`] unless another process owns the session.
    ///
    /// # Errors
    /// Refusals (`lock_busy`, `wait_timed_out`, `unknown_session`, ...); the cluster being
    /// unreachable.
    pub async fn acquire_in(
        &self,
        session_id: u64,
        name: &str,
        wait_ms: Option<u64>,
    ) -> Result<v1::AcquireResponse, ClientError> {
        let timeout = wait_ms
            .map(|wait_ms| self.inner.config.request_timeout + Duration::from_millis(wait_ms));
        // Every attempt carries the same request id, so a retry joins the wait or gets the
        // grant of the attempt it repeats instead of being a second request.
        let request_id = Some(fresh_request_id());
        let mut attempt = 0;
        self.call(Retry::Safe, timeout, |mut client| {
            let request = v1::AcquireRequest {
                name: name.to_owned(),
                session_id,
                wait_ms,
                request_id,
                attempt,
            };
            attempt += 1;
            async move { client.acquire(request).await }
        })
        .await
    }

    /// Releases the grant `token` of `name` held by `session_id`.
    ///
    /// # Errors
    /// `not_held` or `token_mismatch`; the cluster being unreachable.
    pub async fn release_in(
        &self,
        session_id: u64,
        name: &str,
        token: u64,
    ) -> Result<(), ClientError> {
        let timeout = Some(self.inner.config.request_timeout);
        self.call(Retry::UnlessSent, timeout, |mut client| {
            let request = v1::ReleaseRequest { name: name.to_owned(), session_id, token };
            async move { client.release(request).await }
        })
        .await
        .map(|_| ())
    }

    /// Adds a node as a voter (it must be running, started with `--join`).
    ///
    /// # Errors
    /// A refused membership change; the cluster being unreachable.
    pub async fn add_member(
        &self,
        node_id: u64,
        addr: &str,
    ) -> Result<v1::ClusterInfo, ClientError> {
        self.call(Retry::UnlessSent, None, |mut client| {
            let request = v1::AddMemberRequest { node_id, addr: addr.to_owned() };
            async move { client.add_member(request).await }
        })
        .await
    }

    /// Removes a node from the voters.
    ///
    /// # Errors
    /// A refused membership change; the cluster being unreachable.
    pub async fn remove_member(&self, node_id: u64) -> Result<v1::ClusterInfo, ClientError> {
        self.call(Retry::UnlessSent, None, |mut client| async move {
            client.remove_member(v1::RemoveMemberRequest { node_id }).await
        })
        .await
    }

    /// Ends a session as an expiry would (an operator's `consul session destroy`).
    ///
    /// # Errors
    /// An unknown session; the cluster being unreachable.
    pub async fn revoke_session(&self, session_id: u64) -> Result<(), ClientError> {
        let timeout = Some(self.inner.config.request_timeout);
        self.call(Retry::Safe, timeout, |mut client| async move {
            client.revoke_session(v1::SessionRequest { session_id }).await
        })
        .await
        .map(|_| ())
    }

    /// A stream of events for one lock (`Target::Name`), a prefix (`Target::Prefix`) or a
    /// session (`Target::SessionId`).
    ///
    /// # Errors
    /// The cluster being unreachable.
    pub async fn watch(
        &self,
        target: v1::watch_request::Target,
    ) -> Result<tonic::Streaming<v1::WatchEvent>, ClientError> {
        self.watch_with(v1::WatchRequest { target: Some(target), losses_only: false }).await
    }

    /// A stream of events as `request` asks, e.g. only the losses of a set of sessions
    /// (`losses_only`), which is how sessions learn that they lost something.
    ///
    /// # Errors
    /// The cluster being unreachable.
    pub async fn watch_with(
        &self,
        request: v1::WatchRequest,
    ) -> Result<tonic::Streaming<v1::WatchEvent>, ClientError> {
        self.call(Retry::Safe, Some(self.inner.config.request_timeout), |mut client| {
            let request = request.clone();
            async move { client.watch(request).await }
        })
        .await
    }
}

fn batcher_gone() -> ClientError {
    ClientError::OutcomeUnknown("the client's keepalive task stopped".into())
}

/// Collects keepalives for a moment and sends them as one `KeepAliveMany` call. Holds only a
/// weak interest in the client: it stops when every sender (every clone of the client) is gone.
async fn run_keepalive_batcher(client: Client, mut jobs: mpsc::Receiver<KeepAliveJob>) {
    let weak = Arc::downgrade(&client.inner);
    drop(client);
    while let Some(first) = jobs.recv().await {
        let mut batch = vec![first];
        let linger = tokio::time::sleep(KEEPALIVE_LINGER);
        tokio::pin!(linger);
        while batch.len() < MAX_KEEPALIVE_BATCH {
            tokio::select! {
                () = &mut linger => break,
                job = jobs.recv() => match job {
                    Some(job) => batch.push(job),
                    None => break,
                },
            }
        }
        let Some(inner) = weak.upgrade() else { return };
        let client = Client { inner };
        let ids: Vec<u64> = batch.iter().map(|(id, _)| *id).collect();
        let timeout = Some(client.inner.config.request_timeout);
        let result = client
            .call(Retry::Safe, timeout, |mut grpc| {
                let request = v1::KeepAliveManyRequest { session_ids: ids.clone() };
                async move { grpc.keep_alive_many(request).await }
            })
            .await;
        drop(client);
        match result {
            Ok(response) => {
                for ((session, reply), ttl_ms) in batch.into_iter().zip(response.ttl_ms) {
                    let answer = if ttl_ms == 0 {
                        Err(ClientError::Service {
                            code: "unknown_session".into(),
                            message: format!(
                                "session {session} does not exist (it expired or was closed): open a new session"
                            ),
                            holder_token: None,
                        })
                    } else {
                        Ok(ttl_ms)
                    };
                    let _ = reply.send(answer);
                }
            }
            Err(error) => {
                for (_, reply) in batch {
                    let _ = reply.send(Err(error.clone()));
                }
            }
        }
    }
}

/// A random request id: unique among a session's requests in practice.
pub(crate) fn fresh_request_id() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u64(COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
    hasher.finish()
}
