//! Node-to-node Raft traffic over gRPC.
//!
//! Each RPC carries one openraft request serialized with serde_json (a snapshot carries its
//! bytes raw after a JSON header), so the protobuf schema does not mirror openraft's types. Every
//! request names the node it is meant for; a node that receives a request for another id refuses
//! it, so a peer that moved to another address is never mistaken for the one that left.
//!
//! Peers speak the wire protocol to each other (gRPC over HTTP/2 to a peer of an older build).
//! There the four Raft messages skip tonic's stacks at both ends, as the client API's hot calls
//! do: the sender's [`Connection`] encodes them into their frame itself, and the receiver's
//! connection task hands them to [`RaftService`] straight from the frame
//! (`listener/direct.rs`). The bytes on the wire are those of the generated client and server.

mod contacts;
mod stream;

use crate::clock::Clock;
use crate::framing;
use crate::log_store::LogStore;
use crate::node::Node;
use crate::raft_types::{LogId, Member, NodeId, Raft, Snapshot, SnapshotMeta, TypeConfig, Vote};
use crate::state_machine::{ClusterIdCell, OnlyQueueWaiters};
use crate::tls::Caller;
use contacts::Contacts;
use openraft::base::{BoxFuture, BoxStream};
use openraft::error::{RPCError, ReplicationClosed, StreamingError, Unreachable};
use openraft::network::{RPCOption, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, VoteRequest, VoteResponse,
};
use openraft::{OptionalSend, RaftNetworkV2};
use picket_core::ErrorCode;
use picket_proto::connection::{Connection, Protocol};
use picket_proto::tls::ClientTls;
use picket_proto::v1::raft_client::RaftClient;
use picket_proto::v1::raft_server;
use picket_proto::v1::{AbandonRequest, AbandonResponse, ClockReading, Empty, RaftPayload};
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tonic::service::interceptor::InterceptedService;
use tonic::{Request, Response, Status};

/// Metadata key naming the node a Raft request is meant for.
const TARGET_NODE_KEY: &str = "picket-target-node";
/// The metadata key of the restore the sender holds ([`crate::backup::restore_identity`]).
const RESTORE_KEY: &str = "picket-restore";
/// The metadata key of the restore epoch of the sender's applied state (sent by every build
/// since it was added, 0 included; absent from older builds' messages).
const RESTORE_EPOCH_KEY: &str = "picket-restore-epoch";
/// The metadata key of the sender's cluster id ([`picket_core::Command::NameCluster`]).
pub(crate) const CLUSTER_KEY: &str = "picket-cluster";
/// The metadata key of a refusal for another cluster's message: the refusing node's cluster id.
const OTHER_CLUSTER_KEY: &str = "picket-other-cluster";
/// The metadata key of a refusal for a message meant for another node: the refusing node's id.
const OTHER_NODE_KEY: &str = "picket-other-node";
/// Largest Raft message, in bytes: bounds what a peer can make this node allocate.
pub const MAX_RAFT_MESSAGE_BYTES: usize = picket_proto::MAX_RAFT_MESSAGE_BYTES;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// Creates a client per peer for openraft, over TLS when the cluster runs it.
#[derive(Clone, Debug, Default)]
pub struct Network {
    tls: Option<ClientTls>,
    contacts: Contacts,
    only_queue_waiters: Option<OnlyQueueWaiters>,
    restore: Option<Arc<str>>,
    cluster_id: ClusterIdCell,
}

impl Network {
    /// Peers reached over TLS with `tls`, or in plaintext.
    #[must_use]
    pub fn new(tls: Option<ClientTls>) -> Self {
        Self {
            tls,
            contacts: Contacts::default(),
            only_queue_waiters: None,
            restore: None,
            cluster_id: ClusterIdCell::default(),
        }
    }

    /// Every Raft message carries the cluster id the applied state holds (once a leader has
    /// named the cluster), so that a node of another cluster refuses it.
    #[must_use]
    pub fn with_cluster_id(mut self, cluster_id: ClusterIdCell) -> Self {
        self.cluster_id = cluster_id;
        self
    }

    /// Every Raft message says this node was restored as `identity` (see
    /// [`crate::backup::restore_identity`]), so that a peer restored otherwise refuses it.
    #[must_use]
    pub fn with_restore(mut self, identity: Option<String>) -> Self {
        self.restore = identity.map(Arc::from);
        self
    }

    /// Replication streams that send entries only queueing waiters (as `only_queue_waiters`
    /// says) with the next request, if it comes within a moment (see [`stream`]). Without it,
    /// only requests that carry nothing but a commit index wait.
    #[must_use]
    pub fn with_only_queue_waiters(mut self, only_queue_waiters: OnlyQueueWaiters) -> Self {
        self.only_queue_waiters = Some(only_queue_waiters);
        self
    }
}

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = PeerClient;

    async fn new_client(&mut self, target: NodeId, node: &Member) -> PeerClient {
        PeerClient {
            target,
            addr: node.peer_addr().to_owned(),
            tls: self.tls.clone(),
            connection: None,
            contacts: Some(self.contacts.clone()),
            only_queue_waiters: self.only_queue_waiters.clone(),
            restore: self.restore.clone(),
            cluster_id: self.cluster_id.clone(),
        }
    }
}

/// Sends Raft RPCs to one peer. Connects lazily and reconnects after a failure.
#[derive(Debug)]
pub struct PeerClient {
    target: NodeId,
    addr: String,
    tls: Option<ClientTls>,
    connection: Option<Connection>,
    /// Where Raft's clients report reaching or losing the peer; `None` for clock probes.
    contacts: Option<Contacts>,
    /// Which entries only queue waiters, for the replication stream.
    only_queue_waiters: Option<OnlyQueueWaiters>,
    /// The restore this node holds, told with every message (`None`: never restored).
    restore: Option<Arc<str>>,
    /// The cluster id this node's applied state holds, told with every message once named.
    cluster_id: ClusterIdCell,
}

fn unreachable(message: impl ToString) -> Unreachable<TypeConfig> {
    Unreachable::from_string(message)
}

fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    serde_json::to_vec(value).expect("raft messages always serialize")
}

fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, String> {
    serde_json::from_slice(bytes).map_err(|error| format!("undecodable raft message: {error}"))
}

impl PeerClient {
    /// The connection to the peer, opened now if none is open.
    async fn connection(&mut self) -> Result<Connection, Unreachable<TypeConfig>> {
        let connection = match self.connection.take().filter(|open| !open.is_closed()) {
            Some(open) => open,
            // The same calls in the wire protocol (a peer of an older build is spoken to in
            // gRPC): Raft traffic spares HTTP/2's work per message too.
            None => Connection::open_with(
                &self.addr,
                CONNECT_TIMEOUT,
                MAX_RAFT_MESSAGE_BYTES,
                self.tls.as_ref(),
                Protocol::Wire,
            )
            .await
            .map_err(|status| {
                let detail = status.message();
                unreachable(format!("node {} at {}: {detail}", self.target, self.addr))
            })?,
        };
        self.connection = Some(connection.clone());
        Ok(connection)
    }

    /// The generated client on the peer's connection, for the calls `Connection` does not make
    /// itself.
    async fn client(&mut self) -> Result<RaftClient<Connection>, Unreachable<TypeConfig>> {
        let connection = self.connection().await?;
        let origin = connection.origin();
        Ok(RaftClient::with_origin(connection, origin)
            .max_decoding_message_size(MAX_RAFT_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_RAFT_MESSAGE_BYTES))
    }

    fn request<T>(&self, body: T, timeout: Duration) -> Request<T> {
        let mut request = Request::new(body);
        request.set_timeout(timeout);
        request.metadata_mut().insert(
            TARGET_NODE_KEY,
            self.target.to_string().parse().expect("a number is valid metadata"),
        );
        if let Some(identity) = &self.restore
            && let Ok(value) = identity.parse()
        {
            request.metadata_mut().insert(RESTORE_KEY, value);
        }
        if let Some(cluster_id) = self.cluster_id.get()
            && let Ok(value) = cluster_id.parse()
        {
            request.metadata_mut().insert(CLUSTER_KEY, value);
        }
        request.metadata_mut().insert(RESTORE_EPOCH_KEY, self.cluster_id.restore_epoch().into());
        request
    }

    /// Sends one RPC and decodes the answer. Transport failures drop the connection so the next
    /// call reconnects.
    async fn call<Resp, F, Fut>(
        &mut self,
        data: Vec<u8>,
        timeout: Duration,
        send: F,
    ) -> Result<Resp, Unreachable<TypeConfig>>
    where
        Resp: DeserializeOwned,
        F: FnOnce(Connection, Request<RaftPayload>) -> Fut,
        Fut: Future<Output = Result<Response<RaftPayload>, Status>>,
    {
        let result = self.call_once(data, timeout, send).await;
        if let Some(contacts) = &self.contacts {
            let failure = result.as_ref().err().map(ToString::to_string);
            contacts.note(self.target, &self.addr, failure.as_deref());
        }
        result
    }

    async fn call_once<Resp, F, Fut>(
        &mut self,
        data: Vec<u8>,
        timeout: Duration,
        send: F,
    ) -> Result<Resp, Unreachable<TypeConfig>>
    where
        Resp: DeserializeOwned,
        F: FnOnce(Connection, Request<RaftPayload>) -> Fut,
        Fut: Future<Output = Result<Response<RaftPayload>, Status>>,
    {
        let connection = self.connection().await?;
        let request = self.request(RaftPayload { data, error: String::new() }, timeout);
        // The deadline travels as `grpc-timeout` too; it is enforced here so a peer that stops
        // answering cannot hold replication longer than openraft allowed.
        let answer = tokio::time::timeout(timeout, send(connection, request))
            .await
            .unwrap_or_else(|_| Err(Status::deadline_exceeded("the peer did not answer in time")));
        let payload = match answer {
            Ok(response) => response.into_inner(),
            Err(status) => {
                self.connection = None;
                return Err(unreachable(format!(
                    "node {} at {}: {}",
                    self.target,
                    self.addr,
                    status.message()
                )));
            }
        };
        if !payload.error.is_empty() {
            return Err(unreachable(format!("node {} refused: {}", self.target, payload.error)));
        }
        decode(&payload.data).map_err(unreachable)
    }
}

/// What a peer told of itself in its answer to a clock reading.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PeerState {
    /// It holds a log: it formed or joined a cluster, or was restored from a backup.
    pub(crate) holds_log: bool,
    /// Its state's restore epoch (0: never restored, or not sent its state yet).
    pub(crate) restore_epoch: u64,
}

/// Why a node refuses another's messages for as long as it runs (see
/// [`ClockProbe::lasting_refusal`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum LastingRefusal {
    /// It holds the state of the cluster with this id.
    OtherCluster(String),
    /// It is the node with this id, not the one the message was meant for.
    OtherNode(NodeId),
    /// It holds a state of this restore epoch, newer than this node's: it was restored from a
    /// backup, and refuses the messages of a cluster of an older epoch.
    NewerEpoch(u64),
}

/// Reads a peer's clock (see [`crate::rate`]).
#[derive(Debug)]
pub(crate) struct ClockProbe {
    peer: PeerClient,
}

impl ClockProbe {
    /// A probe of node `target` at `addr`, telling the cluster id `cluster_id` holds; connects
    /// on first use.
    pub(crate) fn new(
        target: NodeId,
        addr: String,
        tls: Option<ClientTls>,
        cluster_id: ClusterIdCell,
    ) -> Self {
        Self {
            peer: PeerClient {
                target,
                addr,
                tls,
                connection: None,
                contacts: None,
                only_queue_waiters: None,
                restore: None,
                cluster_id,
            },
        }
    }

    /// The peer's address.
    pub(crate) fn addr(&self) -> &str {
        &self.peer.addr
    }

    /// The peer's clock source reading, in milliseconds, and the newest apply rules it knows.
    pub(crate) async fn read(&mut self, timeout: Duration) -> Result<(f64, u32), String> {
        let reading = self.read_or_refusal(timeout).await.map_err(|status| self.failed(&status))?;
        Ok((reading.source_ms, reading.apply_rules))
    }

    /// Whether the peer holds a log, and its state's restore epoch (see
    /// [`crate::server::formation`]).
    pub(crate) async fn peer_state(&mut self, timeout: Duration) -> Result<PeerState, String> {
        let reading = self.read_or_refusal(timeout).await.map_err(|status| self.failed(&status))?;
        Ok(PeerState { holds_log: reading.holds_log, restore_epoch: reading.restore_epoch })
    }

    fn failed(&self, status: &Status) -> String {
        format!("node {} at {}: {}", self.peer.target, self.peer.addr, status.message())
    }

    /// Why the peer can never take this cluster's messages, when it refuses them for good: it
    /// holds another cluster's state, or one of a newer restore epoch, or it is another node.
    /// `None` when it answers otherwise, or fails in any other way (it may not be up yet).
    pub(crate) async fn lasting_refusal(&mut self, timeout: Duration) -> Option<LastingRefusal> {
        let refusal = match self.read_or_refusal(timeout).await {
            Ok(reading) => {
                let newer = reading.holds_log
                    && reading.restore_epoch > self.peer.cluster_id.restore_epoch();
                return newer.then_some(LastingRefusal::NewerEpoch(reading.restore_epoch));
            }
            Err(refusal) => refusal,
        };
        let metadata = refusal.metadata();
        let told = |key| metadata.get(key).and_then(|value| value.to_str().ok());
        if let Some(theirs) = told(OTHER_CLUSTER_KEY) {
            return Some(LastingRefusal::OtherCluster(theirs.to_owned()));
        }
        let node_id = told(OTHER_NODE_KEY)?.parse().ok()?;
        Some(LastingRefusal::OtherNode(node_id))
    }

    async fn read_or_refusal(&mut self, timeout: Duration) -> Result<ClockReading, Status> {
        let mut client =
            self.peer.client().await.map_err(|error| Status::unavailable(error.to_string()))?;
        let request = self.peer.request(Empty {}, timeout);
        let answer = tokio::time::timeout(timeout, client.read_clock(request))
            .await
            .unwrap_or_else(|_| Err(Status::deadline_exceeded("the peer did not answer in time")));
        match answer {
            Ok(reading) => Ok(reading.into_inner()),
            Err(status) => {
                self.peer.connection = None;
                Err(status)
            }
        }
    }
}

impl RaftNetworkV2<TypeConfig> for PeerClient {
    type SnapshotData = Vec<u8>;

    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.call(encode(&rpc), option.soft_ttl(), |connection, request| async move {
            connection.append_entries(request).await
        })
        .await
        .map_err(RPCError::Unreachable)
    }

    /// openraft's sequential stream, but that a request nobody waits on (a new commit index
    /// alone, or entries that only queue waiters) after a log id the follower confirmed on this
    /// stream waits a moment to go with the next one (see [`stream`]).
    fn stream_append<'s, S>(
        &'s mut self,
        input: S,
        option: RPCOption,
    ) -> BoxFuture<'s, Result<BoxStream<'s, stream::StreamItem>, RPCError<TypeConfig>>>
    where
        S: futures_util::Stream<Item = AppendEntriesRequest<TypeConfig>>
            + OptionalSend
            + Unpin
            + 'static,
    {
        Box::pin(async move { Ok(stream::replicate(self, input, option)) })
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.call(encode(&rpc), option.soft_ttl(), |connection, request| async move {
            connection.vote(request).await
        })
        .await
        .map_err(RPCError::Unreachable)
    }

    async fn pre_vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.call(encode(&rpc), option.soft_ttl(), |connection, request| async move {
            connection.pre_vote(request).await
        })
        .await
        .map_err(RPCError::Unreachable)
    }

    async fn full_snapshot(
        &mut self,
        vote: Vote,
        snapshot: Snapshot,
        cancel: impl Future<Output = ReplicationClosed> + Send + 'static,
        option: RPCOption,
    ) -> Result<SnapshotResponse<TypeConfig>, StreamingError<TypeConfig>> {
        let data = encode_snapshot(&vote, &snapshot.meta, &snapshot.snapshot);
        let send = self.call(data, option.hard_ttl(), |connection, request| async move {
            connection.install_snapshot(request).await
        });
        tokio::select! {
            closed = cancel => Err(StreamingError::Closed(closed)),
            result = send => result.map_err(StreamingError::Unreachable),
        }
    }
}

/// A snapshot message: the JSON of (vote, meta) as the header of a [`crate::framing`] frame whose
/// body is the state machine's bytes.
fn encode_snapshot(vote: &Vote, meta: &SnapshotMeta, data: &[u8]) -> Vec<u8> {
    framing::frame(&encode(&(vote, meta)), data)
}

fn decode_snapshot(bytes: &[u8]) -> Result<(Vote, Snapshot), String> {
    let (header, data) =
        framing::unframe(bytes).map_err(|error| format!("snapshot message: {error}"))?;
    let (vote, meta): (Vote, SnapshotMeta) = decode(header)?;
    Ok((vote, Snapshot { meta, snapshot: data.to_vec() }))
}

/// Admits only cluster members' connections to the `Raft` service, when on (a TLS cluster).
#[derive(Clone, Copy, Debug)]
pub struct MembersOnly(bool);

impl tonic::service::Interceptor for MembersOnly {
    fn call(&mut self, request: Request<()>) -> Result<Request<()>, Status> {
        admit(self.0, request.extensions().get::<Caller>())?;
        Ok(request)
    }
}

/// Refuses `caller` unless it may send Raft messages: with `members_only` (a TLS cluster), only a
/// cluster member may. The router's [`MembersOnly`] and the wire protocol's direct calls keep
/// the same gate.
fn admit(members_only: bool, caller: Option<&Caller>) -> Result<(), Status> {
    if !members_only || caller.is_some_and(|caller| caller.member) {
        return Ok(());
    }
    let remote = caller.and_then(|caller| caller.remote);
    let (code, error_code, reason) = match caller.and_then(|caller| caller.certificate.as_ref()) {
        None => (
            tonic::Code::Unauthenticated,
            ErrorCode::Unauthenticated,
            "only a cluster member may send Raft messages: this connection presented no certificate",
        ),
        Some(_) => (
            tonic::Code::PermissionDenied,
            ErrorCode::PermissionDenied,
            "only a cluster member may send Raft messages: this connection's certificate is not signed by the cluster's peer CA",
        ),
    };
    if let Some(unlogged) = crate::auth::audit::UNPROVEN.admit(std::time::Instant::now()) {
        tracing::warn!(target: "picket::audit", ?remote, reason, unlogged, "refused a Raft message");
    }
    let mut status = Status::new(code, reason);
    status.metadata_mut().insert(
        picket_proto::ERROR_CODE_KEY,
        tonic::metadata::MetadataValue::from_static(error_code.as_str()),
    );
    Err(status)
}

/// On a client port of a node that serves peers on a port of its own: answers every Raft RPC
/// with a status naming that port, so a peer configured with this node's client address says
/// what is wrong instead of failing to decode an HTTP error.
pub fn raft_served_elsewhere(peer_addr: String) -> axum::Router {
    let refuse = move || {
        let peer_addr = peer_addr.clone();
        async move {
            let mut status = Status::failed_precondition(format!(
                "this is a client port: this node serves Raft messages on its peer port \
             ({peer_addr}); give it as this node's peer address (ID=CLIENT_ADDR/PEER_ADDR)"
            ));
            status.metadata_mut().insert(
                picket_proto::ERROR_CODE_KEY,
                tonic::metadata::MetadataValue::from_static(ErrorCode::PeerPortElsewhere.as_str()),
            );
            status.into_http::<axum::body::Body>()
        }
    };
    axum::Router::new().route("/picket.v1.Raft/{*method}", axum::routing::any(refuse))
}

/// How the reason a node halts on a contradicted commit begins: the fault harness and operators'
/// alerts look for it.
pub const COMMITTED_ENTRY_LOST: &str = "committed entries were lost";

/// Receives Raft RPCs from peers and hands them to the local Raft.
#[derive(Clone)]
pub struct RaftService {
    raft: Raft,
    node: Arc<Node>,
    /// The node's log, read to check that a leader's entries agree with what it committed.
    log: LogStore,
    node_id: NodeId,
    clock: Arc<Clock>,
    members_only: bool,
}

impl std::fmt::Debug for RaftService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RaftService({})", self.node_id)
    }
}

impl RaftService {
    /// Serves `node`'s Raft, `node`'s abandons handed over by its peers, and `clock`'s readings to a leader that compares rates.
    /// With `members_only`, only connections whose certificate chains to the peer CA are
    /// served (a TLS cluster); without, anyone who reaches the port is (plaintext on loopback or
    /// a network the operator trusts).
    #[must_use]
    pub fn new(node: Arc<Node>, log: LogStore, clock: Arc<Clock>, members_only: bool) -> Self {
        Self { raft: node.raft().clone(), node_id: node.id(), node, log, clock, members_only }
    }

    /// Refuses, and halts this node on, entries from a leader that contradict entries this
    /// node's log holds as committed. Handed to openraft, such a message trips a debug assertion,
    /// and in a release build it is taken as agreeing (openraft trusts the committed prefix), so
    /// this node would go on from a state the cluster no longer has.
    fn check_committed_agree(&self, rpc: &AppendEntriesRequest<TypeConfig>) -> Result<(), Status> {
        let sent = rpc.prev_log_id.iter().chain(rpc.entries.iter().map(|entry| &entry.log_id));
        match self.log.contradicted_commit(&rpc.vote, sent) {
            Some((held, sent)) => Err(self.halt_on_lost_commit(&rpc.vote, held, sent, "")),
            None => Ok(()),
        }
    }

    /// The same for a snapshot: one that ends after the entry this node holds committed (by log
    /// id order) but not at a greater index contradicts it. openraft asserts that it never
    /// happens, in release builds too, so the node would stop with a panic instead.
    fn check_snapshot_agrees(&self, vote: &Vote, last: Option<&LogId>) -> Result<(), Status> {
        match self.log.snapshot_contradicting_commit(vote, last) {
            Some((held, sent)) => {
                Err(self.halt_on_lost_commit(vote, held, sent, "a snapshot ending "))
            }
            None => Ok(()),
        }
    }

    /// Halts this node because the leader of `vote` sent `sent` where it committed `held`.
    fn halt_on_lost_commit(&self, vote: &Vote, held: LogId, sent: LogId, what: &str) -> Status {
        let reason = format!(
            "{COMMITTED_ENTRY_LOST}: this node committed entry {held}, and the leader (vote {vote}) \
             sends {what}{sent} at its index. A majority of the cluster lost entries it had \
             acknowledged (disks that dropped synced writes, or data directories restored by \
             hand). Stopping rather than go on from a history the cluster no longer has: check \
             the members' disks, then wipe this node's data directory and join it again"
        );
        tracing::error!(%held, %sent, "{reason}");
        self.node.halt(reason.clone());
        Status::failed_precondition(reason)
    }

    /// The tonic service, with message size bounds. In a TLS cluster, a request from a
    /// connection that is not a cluster member's is refused by an interceptor, before its
    /// message is read. The wire protocol's Raft messages bypass it (`listener/direct.rs`),
    /// through the same gate, and encode answers as it does with this configuration: one that
    /// compresses answers or limits them must be mirrored there.
    #[must_use]
    pub fn into_server(self) -> InterceptedService<raft_server::RaftServer<Self>, MembersOnly> {
        let members_only = MembersOnly(self.members_only);
        let server = raft_server::RaftServer::new(self)
            .max_decoding_message_size(MAX_RAFT_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_RAFT_MESSAGE_BYTES);
        InterceptedService::new(server, members_only)
    }

    /// Refuses `caller`'s Raft messages unless it may send them (see [`MembersOnly`]).
    ///
    /// # Errors
    /// `Unauthenticated` or `PermissionDenied`, as the router's interceptor refuses it.
    pub(crate) fn admit(&self, caller: &Caller) -> Result<(), Status> {
        admit(self.members_only, Some(caller))
    }

    /// Refuses a Raft message from a peer restored otherwise than this node (see
    /// [`crate::backup::same_restore`]), or whose state is at an older restore epoch than this
    /// node's: before openraft sees it, so that neither its entries nor its term reach this node.
    fn check_restore<T>(&self, request: &Request<T>) -> Result<(), Status> {
        self.check_restore_epoch(request)?;
        let sent = request.metadata().get(RESTORE_KEY).and_then(|value| value.to_str().ok());
        let (Some(own), Some(sent)) = (self.node.restore(), sent) else {
            return Ok(());
        };
        if crate::backup::same_restore(own, sent) {
            return Ok(());
        }
        let reason = format!(
            "this node was restored as {own} and the sender as {sent} (backup digest, restore \
             epoch, sessions kept or ended): nodes restored from different backups, or with a \
             different --restore-above or --restore-sessions, hold different states at the same \
             log position, and their tokens could go down across a failover. Restore every node \
             alike into empty data directories, or restore one and add the others with --join"
        );
        if self.node.other_restore_refused() {
            tracing::error!("refusing Raft messages: {reason}");
        }
        Err(Status::failed_precondition(reason))
    }

    /// Refuses a Raft message whose sender's state is at an older restore epoch than this
    /// node's: the sender leads, or stands for, a cluster formed before the restore this node
    /// holds (or formed beside it from nothing), whose entries or snapshot would replace the
    /// restored state with one whose tokens are below it. Within one cluster no sender is
    /// behind: a node that joins or was started without `--restore` has epoch 0 until it is
    /// sent the state, and sends no Raft request until then (it is a learner, or has formed
    /// nothing: see [`crate::server::formation`]). A message without an epoch (an older build)
    /// is let through, as before epochs were sent.
    fn check_restore_epoch<T>(&self, request: &Request<T>) -> Result<(), Status> {
        let sent = request.metadata().get(RESTORE_EPOCH_KEY).and_then(|value| value.to_str().ok());
        self.check_epoch(sent.and_then(|sent| sent.parse::<u64>().ok()), "the sender's state")
    }

    /// Refuses `what`, of restore epoch `sent`, when that is older than this node's state's
    /// (see [`RaftService::check_restore_epoch`]); `None` (not told) is let through.
    fn check_epoch(&self, sent: Option<u64>, what: &str) -> Result<(), Status> {
        let own = self.node.cluster_id_cell().restore_epoch();
        let Some(sent) = sent.filter(|sent| *sent < own) else {
            return Ok(());
        };
        let reason = format!(
            "this node's state is at restore epoch {own} and {what} at epoch {sent}: the sender \
             belongs to a cluster formed before this node's restore, or beside it, and its \
             entries would replace the restored state with one whose tokens are lower. Stop the \
             sender; to make it a member of the restored cluster, start it on an empty data \
             directory with --join (or with the same --restore)"
        );
        if self.node.older_epoch_refused() {
            tracing::error!("refusing Raft messages: {reason}");
        }
        Err(Status::failed_precondition(reason))
    }

    /// Refuses a Raft message from a node of another cluster: one whose applied state holds
    /// another cluster id than this node's ([`picket_core::Command::NameCluster`]). Checked
    /// before openraft sees the message, so that neither its term nor its entries reach this
    /// node: a node started on another cluster's data directory, at an address of this
    /// cluster, would otherwise take part in its elections, and could win one with its longer
    /// log. A message without an id (a peer of an older build, or one whose cluster is not named
    /// yet, or a node that joins and has no state yet) is let through, as before ids existed.
    fn check_cluster<T>(&self, request: &Request<T>) -> Result<(), Status> {
        let sent = request.metadata().get(CLUSTER_KEY).and_then(|value| value.to_str().ok());
        let (Some(own), Some(sent)) = (self.node.cluster_id(), sent) else {
            return Ok(());
        };
        if *own == *sent {
            return Ok(());
        }
        let reason = format!(
            "this node belongs to cluster {own} and the sender to cluster {sent}: either a node \
             of another cluster (its data directory holds that cluster's state) is reachable at \
             an address this cluster's membership names, or that cluster tried to add this \
             node. Check the members' addresses; a node meant to join a cluster must start on an \
             empty data directory with --join"
        );
        if self.node.other_cluster_refused() {
            tracing::error!("refusing Raft messages: {reason}");
        }
        let mut status = Status::failed_precondition(reason);
        if let Ok(value) = own.parse() {
            status.metadata_mut().insert(OTHER_CLUSTER_KEY, value);
        }
        Err(status)
    }

    /// Refuses a snapshot whose state holds another cluster id than this node's, or none,
    /// when it would replace what this node holds (its saved commit, or what it applied): from a sender that told no id (an older
    /// build, or a cluster not named yet) it would otherwise unname this node, or make it
    /// another cluster's. Within one cluster that never happens: a snapshot that ends past a
    /// named node's commit was taken after the naming, which that node committed. A snapshot
    /// that ends at or before the commit is left to openraft, which skips it.
    fn check_snapshot_cluster(
        &self,
        sent: Option<&str>,
        last: Option<&LogId>,
    ) -> Result<(), Status> {
        let Some(own) = self.node.cluster_id() else {
            return Ok(());
        };
        // What this node holds for good: its log's saved commit, or what it applied (a node
        // that got its state from a snapshot has applied the naming but may have saved no
        // commit since).
        let applied = self.node.read_local(|state| state.last_applied);
        let held = self.log.committed().max(applied);
        if !snapshot_of_another_cluster(&own, sent, last, held) {
            return Ok(());
        }
        let reason = format!(
            "this node belongs to cluster {own}, and the snapshot sent holds the state of {}: \
             a node of another cluster, or of an older build, leads at an address this \
             cluster's membership names. Check the members' addresses and builds",
            sent.map_or_else(
                || "a cluster with no id".to_owned(),
                |sent| format!("cluster {sent}")
            )
        );
        if self.node.other_cluster_refused() {
            tracing::error!("refusing a snapshot: {reason}");
        }
        Err(Status::failed_precondition(reason))
    }

    /// Refuses a request meant for another node.
    fn check_target<T>(&self, request: &Request<T>) -> Result<(), Status> {
        let target = request.metadata().get(TARGET_NODE_KEY).and_then(|value| value.to_str().ok());
        match target.and_then(|target| target.parse::<NodeId>().ok()) {
            Some(target) if target == self.node_id => Ok(()),
            Some(target) => {
                let mut status = Status::failed_precondition(format!(
                    "this is node {}, not node {target}: the peer list names the wrong address",
                    self.node_id
                ));
                status.metadata_mut().insert(OTHER_NODE_KEY, self.node_id.into());
                Err(status)
            }
            None => Err(Status::invalid_argument("raft request without a target node id")),
        }
    }
}

/// Whether a snapshot whose state holds cluster id `sent`, ending at `last`, sent to a node of
/// cluster `own` that committed up to `committed`, would replace that node's state with another
/// cluster's (or an unnamed one): see [`RaftService::check_snapshot_cluster`].
fn snapshot_of_another_cluster(
    own: &str,
    sent: Option<&str>,
    last: Option<&LogId>,
    committed: Option<LogId>,
) -> bool {
    let past_commit = last.is_some_and(|last| Some(*last) > committed);
    sent != Some(own) && past_commit
}

fn reply<T: Serialize, E: std::fmt::Display>(
    result: Result<T, E>,
) -> Result<Response<RaftPayload>, Status> {
    Ok(Response::new(match result {
        Ok(value) => RaftPayload { data: encode(&value), error: String::new() },
        Err(error) => RaftPayload { data: Vec::new(), error: error.to_string() },
    }))
}

#[tonic::async_trait]
impl raft_server::Raft for RaftService {
    async fn append_entries(
        &self,
        request: Request<RaftPayload>,
    ) -> Result<Response<RaftPayload>, Status> {
        self.check_target(&request)?;
        self.check_restore(&request)?;
        self.check_cluster(&request)?;
        let rpc: AppendEntriesRequest<TypeConfig> =
            decode(&request.into_inner().data).map_err(Status::invalid_argument)?;
        self.check_committed_agree(&rpc)?;
        reply(self.raft.append_entries(rpc).await)
    }

    async fn vote(&self, request: Request<RaftPayload>) -> Result<Response<RaftPayload>, Status> {
        self.check_target(&request)?;
        self.check_restore(&request)?;
        self.check_cluster(&request)?;
        let rpc: VoteRequest<TypeConfig> =
            decode(&request.into_inner().data).map_err(Status::invalid_argument)?;
        reply(self.raft.vote(rpc).await)
    }

    async fn pre_vote(
        &self,
        request: Request<RaftPayload>,
    ) -> Result<Response<RaftPayload>, Status> {
        self.check_target(&request)?;
        self.check_restore(&request)?;
        self.check_cluster(&request)?;
        let rpc: VoteRequest<TypeConfig> =
            decode(&request.into_inner().data).map_err(Status::invalid_argument)?;
        reply(self.raft.pre_vote(rpc).await)
    }

    async fn install_snapshot(
        &self,
        request: Request<RaftPayload>,
    ) -> Result<Response<RaftPayload>, Status> {
        self.check_target(&request)?;
        self.check_restore(&request)?;
        self.check_cluster(&request)?;
        let (vote, snapshot) =
            decode_snapshot(&request.into_inner().data).map_err(Status::invalid_argument)?;
        // A snapshot whose state does not decode is refused here: handed to openraft, the
        // failure to install it would be a storage error, which stops this node's Raft.
        let machine =
            crate::state_machine::restore_machine(&snapshot.snapshot).map_err(|error| {
                Status::invalid_argument(format!("the snapshot's state is unusable: {error}"))
            })?;
        // Another cluster's snapshot is refused before the check that would halt this node on
        // it as a lost commit: the fault is the sender's, not this node's.
        self.check_snapshot_cluster(machine.cluster_id(), snapshot.meta.last_log_id.as_ref())?;
        // The sender's header is not trusted alone: a sender of an older build tells no epoch.
        self.check_epoch(Some(machine.restore_epoch()), "the snapshot's state")?;
        self.check_snapshot_agrees(&vote, snapshot.meta.last_log_id.as_ref())?;
        reply(self.raft.install_full_snapshot(vote, snapshot).await)
    }

    async fn abandon(
        &self,
        request: Request<AbandonRequest>,
    ) -> Result<Response<AbandonResponse>, Status> {
        self.check_cluster(&request)?;
        let request = request.into_inner();
        let session = picket_core::SessionId(request.session_id);
        let (name, attempt) = (request.name.as_str(), request.attempt);
        let abandoned = self
            .node
            .abandon(session, name, picket_core::RequestId(request.request_id), attempt, None)
            .await;
        abandoned
            .map(|released_token| Response::new(AbandonResponse { released_token }))
            .map_err(|error| crate::grpc::status(&error))
    }

    async fn read_clock(&self, request: Request<Empty>) -> Result<Response<ClockReading>, Status> {
        self.check_target(&request)?;
        // A node of another cluster must neither report its rules nor set the rate here.
        self.check_cluster(&request)?;
        // Read without a lock the apply or the log's writer holds: the leader's rate check
        // drops a reading whose round trip was long.
        Ok(Response::new(ClockReading {
            source_ms: self.clock.source_ms(),
            apply_rules: crate::apply_rules::known_apply_rules(),
            holds_log: crate::server::formation::holds_log(&self.raft),
            restore_epoch: self.node.cluster_id_cell().restore_epoch(),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A named node refuses a snapshot of another cluster, or of none, that ends past its
    /// commit; one of its own cluster, or one openraft will skip (at or before the commit), is
    /// let through.
    #[test]
    fn a_named_node_refuses_a_snapshot_that_would_unname_it() {
        let at = |index| {
            LogId::new(openraft::vote::leader_id_adv::LeaderId { term: 2, node_id: 1 }, index)
        };
        let own = "0123456789abcdef0123456789abcdef";
        let other = Some("fedcba9876543210fedcba9876543210");
        let committed = Some(at(10));
        assert!(snapshot_of_another_cluster(own, other, Some(&at(11)), committed));
        assert!(snapshot_of_another_cluster(own, None, Some(&at(11)), committed));
        assert!(snapshot_of_another_cluster(own, None, Some(&at(1)), None), "nothing committed");
        assert!(!snapshot_of_another_cluster(own, Some(own), Some(&at(11)), committed));
        assert!(!snapshot_of_another_cluster(own, None, Some(&at(10)), committed));
        assert!(!snapshot_of_another_cluster(own, other, Some(&at(9)), committed));
        assert!(!snapshot_of_another_cluster(own, other, None, committed), "an empty snapshot");
    }

    #[test]
    fn snapshot_messages_round_trip_and_refuse_truncation() {
        let vote = Vote::new(3, 1);
        let meta = SnapshotMeta::default();
        let bytes = encode_snapshot(&vote, &meta, b"state");
        let (decoded_vote, snapshot) = decode_snapshot(&bytes).unwrap();
        assert_eq!(decoded_vote, vote);
        assert_eq!(snapshot.snapshot, b"state");
        assert!(decode_snapshot(&bytes[..10]).is_err());
        assert!(decode_snapshot(&[]).is_err());
    }
}
