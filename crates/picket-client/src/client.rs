//! The client's public handle: sessions, reads, membership and watches, over the layers below
//! it (the transport, the keepalive batcher, sessions and the session watcher).

use crate::error::{ClientError, ErrorCode};
use crate::info::{Grant, LockState, SessionSummary};
use crate::keepalive::KeepAlives;
use crate::session::Session;
use crate::transport::{ClientConfig, Retry, Transport};
use crate::watcher::{self, SessionWatcher};
use picket_core::{CheckOutcome, Wait};
use picket_proto::v1;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::OnceCell;

/// A handle to a Picket cluster. Cheap to clone; clones share connections, the keepalive
/// batcher and the session watcher.
#[derive(Clone, Debug)]
pub struct Client {
    transport: Transport,
    keepalives: Arc<KeepAlives>,
    watcher: Arc<OnceCell<Arc<SessionWatcher>>>,
}

/// How long a backup may take to begin arriving (the node copies and encodes the whole state
/// first), unless the configured request timeout is longer.
const BACKUP_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(300);

impl Client {
    /// Connects to a cluster through any of its members (`host:port`) and checks that one of
    /// them answers.
    ///
    /// # Errors
    /// [`ClientError::Unreachable`] when none answers; [`ClientError::OtherCluster`] when only
    /// nodes of another cluster than [`ClientConfig::cluster_id`] answer;
    /// [`ClientError::InvalidArgument`] for an empty or malformed endpoint list or cluster id.
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
        let client = Self {
            transport: Transport::new(endpoints, config)?,
            keepalives: Arc::new(KeepAlives::default()),
            watcher: Arc::new(OnceCell::new()),
        };
        client.cluster().await?;
        Ok(client)
    }

    /// The endpoints this client was given.
    #[must_use]
    pub fn endpoints(&self) -> &[String] {
        self.transport.endpoints()
    }

    /// The id of the cluster this client keeps to: the one it was given
    /// ([`ClientConfig::cluster_id`]), else the first named one it reached (a restore of it
    /// since, if it followed one). `None` while it has reached no named cluster. Nodes of
    /// any other cluster are not used.
    #[must_use]
    pub fn cluster_id(&self) -> Option<String> {
        self.transport.cluster_id()
    }

    /// The watcher of this client's sessions, started on first use.
    async fn session_watcher(&self) -> Arc<SessionWatcher> {
        self.watcher
            .get_or_init(|| async {
                let watcher = Arc::new(SessionWatcher::default());
                tokio::spawn(watcher::run(self.transport.downgrade(), watcher.clone()));
                watcher
            })
            .await
            .clone()
    }

    /// Opens a session and has the session watcher follow it, waiting until a stream covers
    /// it, so an end applied right after the open is not missed.
    async fn open_session(
        &self,
        ttl: Duration,
        lock_delay: Duration,
    ) -> Result<Session, ClientError> {
        let session =
            Session::open(self.transport.clone(), self.keepalives.clone(), ttl, lock_delay).await?;
        let watcher = self.session_watcher().await;
        let generation = watcher.register(session.id(), session.state());
        if !watcher.covered(generation, watcher::COVER_TIMEOUT).await {
            tracing::debug!(
                session = session.id(),
                "no watch stream yet; the keepalive protects the session meanwhile"
            );
        }
        Ok(session)
    }

    /// Opens a session with `ttl` whose keepalive runs in the background until it is closed
    /// or dropped.
    ///
    /// # Errors
    /// A refused TTL, or the cluster being unreachable.
    pub async fn session(&self, ttl: Duration) -> Result<Session, ClientError> {
        self.open_session(ttl, Duration::ZERO).await
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
        self.open_session(ttl, lock_delay).await
    }

    /// Membership and leadership, from whichever node answers.
    ///
    /// # Errors
    /// When no node answers.
    pub async fn cluster(&self) -> Result<v1::ClusterInfo, ClientError> {
        let timeout = Some(self.transport.config().request_timeout);
        self.transport
            .call(Retry::Safe, timeout, |connection| async move {
                connection.grpc().cluster(v1::Empty {}).await
            })
            .await
    }

    /// A consistent backup of the lock state, taken on the leader (admins only): the bytes of
    /// a backup file, to restore with `picket serve --restore FILE`. It is held whole in
    /// memory; [`Client::backup_chunks`] hands it over piece by piece instead.
    ///
    /// # Errors
    /// Permission denied; the cluster being unreachable; the stream breaking before its end
    /// (nothing partial is returned).
    pub async fn backup(&self) -> Result<Vec<u8>, ClientError> {
        let mut chunks = self.backup_chunks().await?;
        let mut bytes = Vec::new();
        while let Some(chunk) = chunks.next().await? {
            bytes.extend_from_slice(&chunk);
        }
        Ok(bytes)
    }

    /// [`Client::backup`] as it arrives: the backup file's bytes in order, a chunk at a time,
    /// so that a caller writing them to a file holds one chunk, not the whole backup. Only a
    /// stream read to its end is a whole backup. Read it as it comes: over the wire protocol
    /// (the default), a stream left more than 64 MiB unread is ended, with an error that says
    /// so; over gRPC (`Protocol::Grpc`) the node waits for a slow reader instead.
    ///
    /// # Errors
    /// Permission denied; the cluster being unreachable; the stream read too slowly (above).
    pub async fn backup_chunks(&self) -> Result<BackupChunks, ClientError> {
        // The node answers once it has copied and encoded the whole state, which for a large
        // one takes longer than a request's timeout: a backup under it failed every time, and
        // each retry started another copy on the leader (found in an audit).
        let timeout = Some(self.transport.config().request_timeout.max(BACKUP_TIMEOUT));
        let chunks = self
            .transport
            .call(Retry::Safe, timeout, |connection| async move {
                connection.grpc().backup(v1::Empty {}).await
            })
            .await?;
        Ok(BackupChunks { chunks })
    }

    /// The state of one lock.
    ///
    /// # Errors
    /// An invalid name; the cluster being unreachable.
    pub async fn lock_info(&self, name: &str) -> Result<LockState, ClientError> {
        let timeout = Some(self.transport.config().request_timeout);
        self.transport
            .call(Retry::Safe, timeout, |connection| {
                let request = v1::GetLockRequest { name: name.to_owned() };
                async move { connection.grpc().get_lock(request).await }
            })
            .await
            .map(LockState::from)
    }

    /// Locks whose names start with `prefix`, at most `limit` (0 for the server's maximum).
    ///
    /// # Errors
    /// The cluster being unreachable.
    pub async fn locks(&self, prefix: &str, limit: u32) -> Result<Vec<LockState>, ClientError> {
        let timeout = Some(self.transport.config().request_timeout);
        let response = self
            .transport
            .call(Retry::Safe, timeout, |connection| {
                let request =
                    v1::ListLocksRequest { prefix: prefix.to_owned(), after: String::new(), limit };
                async move { connection.grpc().list_locks(request).await }
            })
            .await?;
        Ok(response.locks.into_iter().map(LockState::from).collect())
    }

    /// Live sessions, at most `limit` (0 for the server's maximum).
    ///
    /// # Errors
    /// The cluster being unreachable.
    pub async fn sessions(&self, limit: u32) -> Result<Vec<SessionSummary>, ClientError> {
        let timeout = Some(self.transport.config().request_timeout);
        let response = self
            .transport
            .call(Retry::Safe, timeout, |connection| async move {
                connection.grpc().list_sessions(v1::ListSessionsRequest { after: 0, limit }).await
            })
            .await?;
        Ok(response.sessions.into_iter().map(SessionSummary::from).collect())
    }

    /// Whether `sequencer` is its lock's current grant, was superseded (with the current
    /// grant's token, if anyone holds the lock), or names no grant ever made.
    ///
    /// # Errors
    /// A malformed or forged sequencer; the cluster being unreachable.
    pub async fn check(&self, sequencer: &str) -> Result<CheckOutcome, ClientError> {
        let timeout = Some(self.transport.config().request_timeout);
        let answer = self
            .transport
            .call(Retry::Safe, timeout, |connection| {
                let request = v1::CheckRequest { sequencer: sequencer.to_owned() };
                async move { connection.grpc().check(request).await }
            })
            .await?;
        crate::info::check_outcome(&answer)
    }

    /// Acquires `name` in an existing session that its owner keeps alive, waiting as `wait`
    /// says. Prefer [`Client::session`] and [`Session`] unless another process owns the
    /// session.
    ///
    /// # Errors
    /// Refusals (`lock_busy`, `wait_timed_out`, `unknown_session`, ...); the cluster being
    /// unreachable.
    pub async fn acquire_in(
        &self,
        session_id: u64,
        name: &str,
        wait: Wait,
    ) -> Result<Grant, ClientError> {
        let granted = self.transport.acquire(session_id, name, wait).await?;
        Ok(Grant::of(name, &granted))
    }

    /// Releases the grant `token` of `name` held by `session_id`: [`Released::Now`], or
    /// [`Released::Earlier`] when a retry after a lost answer found the grant already gone.
    ///
    /// # Errors
    /// `not_held` or `token_mismatch`; the cluster being unreachable.
    pub async fn release_in(
        &self,
        session_id: u64,
        name: &str,
        token: u64,
    ) -> Result<crate::Released, ClientError> {
        self.transport.release(session_id, name, token).await
    }

    /// Adds a node as a voter (it must be running, started with `--join`). Clients reach it at
    /// `addr`; peers at `peer_addr` if it serves them on a port of its own (`--peer-listen`).
    ///
    /// # Errors
    /// A refused membership change; the cluster being unreachable.
    pub async fn add_member(
        &self,
        node_id: u64,
        addr: &str,
        peer_addr: Option<&str>,
    ) -> Result<v1::ClusterInfo, ClientError> {
        self.transport
            .call(Retry::UnlessSent, None, |connection| {
                let request = v1::AddMemberRequest {
                    node_id,
                    addr: addr.to_owned(),
                    peer_addr: peer_addr.unwrap_or_default().to_owned(),
                };
                async move { connection.grpc().add_member(request).await }
            })
            .await
    }

    /// Removes a node from the voters.
    ///
    /// # Errors
    /// A refused membership change; the cluster being unreachable.
    pub async fn remove_member(&self, node_id: u64) -> Result<v1::ClusterInfo, ClientError> {
        self.transport
            .call(Retry::UnlessSent, None, |connection| async move {
                connection.grpc().remove_member(v1::RemoveMemberRequest { node_id }).await
            })
            .await
    }

    /// Ends a session as an expiry would (an operator's `consul session destroy`).
    ///
    /// # Errors
    /// An unknown session; the cluster being unreachable.
    pub async fn revoke_session(&self, session_id: u64) -> Result<(), ClientError> {
        let timeout = Some(self.transport.config().request_timeout);
        self.transport
            .call(Retry::Safe, timeout, |connection| async move {
                connection.grpc().revoke_session(v1::SessionRequest { session_id }).await
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
    ) -> Result<crate::WatchStream, ClientError> {
        let request = v1::WatchRequest { target: Some(target), losses_only: false };
        self.watch_with(request).await.map(crate::WatchStream::new)
    }

    /// A stream of events as `request` asks, e.g. only the losses of a set of sessions
    /// (`losses_only`), which is how sessions learn that they lost something; as the node sends
    /// them (read each with [`crate::watched`]).
    ///
    /// # Errors
    /// The cluster being unreachable.
    pub async fn watch_with(
        &self,
        request: v1::WatchRequest,
    ) -> Result<tonic::Streaming<v1::WatchEvent>, ClientError> {
        self.transport.watch_with(request).await
    }
}

/// A backup arriving in chunks, from [`Client::backup_chunks`].
pub struct BackupChunks {
    chunks: tonic::Streaming<v1::BackupChunk>,
}

impl BackupChunks {
    /// The backup's next bytes, or `None` once all of it has arrived.
    ///
    /// # Errors
    /// The stream breaking before its end (`backup_incomplete`): what arrived before is not a
    /// whole backup, and the backup is to be taken again.
    pub async fn next(&mut self) -> Result<Option<Vec<u8>>, ClientError> {
        let broken = |status: tonic::Status| ClientError::Service {
            code: ErrorCode::BackupIncomplete,
            message: format!(
                "the backup stream broke before its end: {}; try again",
                status.message()
            ),
            holder_token: None,
        };
        let chunk = self.chunks.message().await.map_err(broken)?;
        Ok(chunk.map(|chunk| chunk.data))
    }
}

impl std::fmt::Debug for BackupChunks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BackupChunks").finish_non_exhaustive()
    }
}
