//! The gRPC client API: a thin translation between protobuf messages and [`Node`].

use crate::auth::{Access, authenticate};
use crate::client_clocks::ClientReading;
use crate::error::ServiceError;
use crate::guarded::Guarded;
use crate::node::AcquireRequest;
use crate::node::{ClusterView, Node, WatchItem, Watched};
use crate::tls::Caller;
use futures_util::Stream;
use picket_core::{
    CancelCause, CheckOutcome, Event, LockInfo, ReleaseCause, RequestId, SessionEnd, SessionId,
    SessionInfo, Wait,
};
use picket_proto::v1::{self, picket_server};
use picket_proto::{ERROR_CODE_KEY, HOLDER_TOKEN_KEY, LEADER_KEY};
use std::pin::Pin;
use std::sync::Arc;
use tonic::metadata::MetadataValue;
use tonic::{Request, Response, Status};

/// Serves [`picket_server::Picket`] from a node.
#[derive(Clone, Debug)]
pub struct ClientService {
    node: Arc<Node>,
}

impl ClientService {
    /// The caller of a request, from its connection and `authorization` metadata
    /// ([`crate::auth`]).
    fn who<T>(&self, request: &Request<T>) -> Result<Access, Status> {
        let metadata = request.metadata();
        if let Some(expected) = metadata.get(picket_proto::EXPECT_CLUSTER_KEY) {
            let following = metadata.contains_key(picket_proto::FOLLOW_RESTORE_KEY);
            let checked = self.node.check_expected_cluster(expected.as_bytes(), following);
            checked.map_err(|error| status(&error))?;
        }
        let caller = request.extensions().get::<Caller>();
        let authorization = metadata.get("authorization").map(|value| value.as_bytes());
        authenticate(self.node.auth(), caller, authorization).map_err(|error| status(&error))
    }

    /// The service for `node`.
    #[must_use]
    pub fn new(node: Arc<Node>) -> Self {
        Self { node }
    }

    /// The tonic service for `node`, decoding requests of at most `max_message_bytes`
    /// ([`crate::ServerLimits::max_grpc_message_bytes`]). The wire protocol's hot calls bypass
    /// it (`listener/direct.rs`) and encode answers as it does with this configuration: one
    /// that compresses answers or limits them must be mirrored there.
    #[must_use]
    pub fn server(node: Arc<Node>, max_message_bytes: usize) -> picket_server::PicketServer<Self> {
        picket_server::PicketServer::new(Self::new(node))
            .max_decoding_message_size(max_message_bytes)
    }
}

/// A gRPC status for a service error: code, sentence, and metadata for programs.
#[must_use]
pub fn status(error: &ServiceError) -> Status {
    let mut status = Status::new(error.grpc_code(), error.to_string());
    let metadata = status.metadata_mut();
    metadata.insert(ERROR_CODE_KEY, MetadataValue::from_static(error.code().as_str()));
    metadata.insert(picket_proto::OUTCOME_KEY, MetadataValue::from_static(error.outcome()));
    if let Some(addr) = error.leader_addr().and_then(|addr| addr.parse().ok()) {
        metadata.insert(LEADER_KEY, addr);
    }
    if let Some(token) = error.holder_token() {
        metadata.insert(HOLDER_TOKEN_KEY, token.into());
    }
    status
}

type RpcResult<T> = Result<Response<T>, Status>;

fn respond<T>(result: Result<T, ServiceError>) -> RpcResult<T> {
    result.map(Response::new).map_err(|error| status(&error))
}

fn limit_from(limit: u32) -> usize {
    if limit == 0 { usize::MAX } else { limit as usize }
}

pub(crate) fn lock_message(caller: &Guarded<'_>, info: LockInfo) -> v1::LockInfo {
    let holder = info.holder;
    let sequencer = holder
        .map(|holder| caller.holder_sequencer(&info.name, holder.token, holder.session))
        .unwrap_or_default();
    v1::LockInfo {
        name: info.name,
        holder_session_id: holder.map_or(0, |holder| holder.session.0),
        token: holder.map_or(0, |holder| holder.token),
        waiters: info.waiters.into_iter().map(|session| session.0).collect(),
        delayed: info.delayed_until_ms.is_some(),
        sequencer,
    }
}

fn session_message(info: SessionInfo) -> v1::SessionInfo {
    v1::SessionInfo {
        session_id: info.session.0,
        ttl_ms: info.ttl_ms,
        lock_delay_ms: info.lock_delay_ms,
        held: info.held,
        waiting: info.waiting,
    }
}

/// The wire names of a check outcome: status and the current grant's token (0 for none).
#[must_use]
pub fn check_fields(outcome: CheckOutcome, presented_token: u64) -> (&'static str, u64) {
    match outcome {
        CheckOutcome::Current { .. } => ("current", presented_token),
        CheckOutcome::Superseded { current_token } => ("superseded", current_token.unwrap_or(0)),
        CheckOutcome::UnknownLock => ("unknown_lock", 0),
    }
}

fn cluster_message(view: ClusterView) -> v1::ClusterInfo {
    v1::ClusterInfo {
        members: view
            .members
            .into_iter()
            .map(|member| v1::Member {
                node_id: member.node_id,
                addr: member.addr,
                voter: member.voter,
                peer_addr: member.peer_addr.unwrap_or_default(),
            })
            .collect(),
        leader_id: view.leader_id.unwrap_or(0),
        leader_addr: view.leader_addr.unwrap_or_default(),
        node_id: view.node_id,
        role: view.role.to_owned(),
        applied_revision: view.applied_revision,
        applied_log_index: view.applied_log_index,
        clock_gaps_total: view.clock_gaps_total,
        clock_rate_factor: view.clock_rate_factor,
        peer_clock_rates: view.peer_clock_rates.into_iter().collect(),
        client_clocks_off_rate: u64::try_from(view.client_clocks_off_rate).unwrap_or(u64::MAX),
        apply_rules: view.apply_rules,
        newest_applied_rules: view.newest_applied_rules,
        voter_sets: view.voter_sets.into_iter().map(|node_ids| v1::VoterSet { node_ids }).collect(),
        cluster_id: view.cluster_id.unwrap_or_default(),
        restored_from_cluster_id: view.restored_from_cluster_id.unwrap_or_default(),
        waiting_for_peers: view.waiting_for_peers,
    }
}

/// A watch item on the wire: the typed kind and cause, and their names for clients built
/// before the typed fields.
#[must_use]
pub fn watch_message(item: WatchItem) -> v1::WatchEvent {
    let (revision, event) = match item {
        WatchItem::Resync { revision } => {
            return v1::WatchEvent {
                kind: "resync".into(),
                event_kind: v1::WatchEventKind::Resync.into(),
                revision,
                ..v1::WatchEvent::default()
            };
        }
        WatchItem::Event { revision, event } => (revision, event),
    };
    let mut message = v1::WatchEvent {
        kind: event.kind_name().to_owned(),
        name: event.lock_name().unwrap_or_default().to_owned(),
        session_id: event.session().0,
        cause: event.cause_name().unwrap_or_default().to_owned(),
        revision,
        ..v1::WatchEvent::default()
    };
    match &event {
        Event::Granted { token, .. } => {
            message.event_kind = v1::WatchEventKind::Granted.into();
            message.token = *token;
        }
        Event::Released { token, cause, .. } => {
            message.event_kind = v1::WatchEventKind::Released.into();
            message.token = *token;
            message.release_cause = release_cause_message(*cause).into();
        }
        Event::Queued { position, .. } => {
            message.event_kind = v1::WatchEventKind::Queued.into();
            message.position = u32::try_from(*position).unwrap_or(u32::MAX);
        }
        Event::Cancelled { cause, .. } => {
            message.event_kind = v1::WatchEventKind::Cancelled.into();
            message.cancel_cause = cancel_cause_message(*cause).into();
        }
        Event::SessionEnded { cause, .. } => {
            message.event_kind = v1::WatchEventKind::SessionEnded.into();
            message.session_end = session_end_message(*cause).into();
        }
        // An event kind of a newer core: its name goes out, its typed kind stays unspecified.
        _ => {}
    }
    message
}

fn release_cause_message(cause: ReleaseCause) -> v1::ReleaseCause {
    match cause {
        ReleaseCause::Released => v1::ReleaseCause::Released,
        ReleaseCause::SessionClosed => v1::ReleaseCause::SessionClosed,
        ReleaseCause::SessionExpired => v1::ReleaseCause::SessionExpired,
        ReleaseCause::SessionRevoked => v1::ReleaseCause::SessionRevoked,
        ReleaseCause::Abandoned => v1::ReleaseCause::Abandoned,
    }
}

fn cancel_cause_message(cause: CancelCause) -> v1::CancelCause {
    match cause {
        CancelCause::Requested => v1::CancelCause::Requested,
        CancelCause::TimedOut => v1::CancelCause::TimedOut,
        CancelCause::SessionClosed => v1::CancelCause::SessionClosed,
        CancelCause::SessionExpired => v1::CancelCause::SessionExpired,
        CancelCause::SessionRevoked => v1::CancelCause::SessionRevoked,
        CancelCause::Abandoned => v1::CancelCause::Abandoned,
    }
}

fn session_end_message(end: SessionEnd) -> v1::SessionEnd {
    match end {
        SessionEnd::Closed => v1::SessionEnd::Closed,
        SessionEnd::Expired => v1::SessionEnd::Expired,
        SessionEnd::Revoked => v1::SessionEnd::Revoked,
    }
}

type WatchStream = Pin<Box<dyn Stream<Item = Result<v1::WatchEvent, Status>> + Send>>;
type BackupStream = Pin<Box<dyn Stream<Item = Result<v1::BackupChunk, Status>> + Send>>;

/// A backup travels in chunks of this size, well under any message limit.
const BACKUP_CHUNK_BYTES: usize = 1 << 20;

/// `bytes` as the stream of chunks a backup travels in. Each chunk is copied out only when the
/// stream is polled for it, so a backup being sent is held once, not twice.
fn backup_chunks(bytes: Vec<u8>) -> BackupStream {
    let chunk_count = bytes.len().div_ceil(BACKUP_CHUNK_BYTES);
    Box::pin(futures_util::stream::iter((0..chunk_count).map(move |index| {
        let start = index * BACKUP_CHUNK_BYTES;
        let end = bytes.len().min(start + BACKUP_CHUNK_BYTES);
        Ok(v1::BackupChunk { data: bytes[start..end].to_vec() })
    })))
}

#[tonic::async_trait]
impl picket_server::Picket for ClientService {
    async fn open_session(
        &self,
        request: Request<v1::OpenSessionRequest>,
    ) -> RpcResult<v1::OpenSessionResponse> {
        let who = self.who(&request)?;
        let request = request.into_inner();
        let reading = ClientReading::from_request(request.clock_id, request.clock_ms);
        let (ttl_ms, lock_delay_ms) = (request.ttl_ms, request.lock_delay_ms);
        let opened = self.node.as_caller(who).open_session(ttl_ms, lock_delay_ms, reading).await;
        respond(
            opened
                .map(|(session, ttl_ms)| v1::OpenSessionResponse { session_id: session.0, ttl_ms }),
        )
    }

    async fn keep_alive(
        &self,
        request: Request<v1::KeepAliveRequest>,
    ) -> RpcResult<v1::KeepAliveResponse> {
        let who = self.who(&request)?;
        let request = request.into_inner();
        let (session_id, reading) =
            (request.session_id, ClientReading::from_request(request.clock_id, request.clock_ms));
        let kept = self.node.as_caller(who).keep_alive(SessionId(session_id), reading).await;
        respond(kept.map(|ttl_ms| v1::KeepAliveResponse { session_id, ttl_ms }))
    }

    async fn keep_alive_many(
        &self,
        request: Request<v1::KeepAliveManyRequest>,
    ) -> RpcResult<v1::KeepAliveManyResponse> {
        let who = self.who(&request)?;
        let request = request.into_inner();
        let reading = ClientReading::from_request(request.clock_id, request.clock_ms);
        let sessions: Vec<SessionId> = request.session_ids.into_iter().map(SessionId).collect();
        let kept = self.node.as_caller(who).keep_alive_many(&sessions, reading).await;
        respond(kept.map(|ttls| v1::KeepAliveManyResponse {
            ttl_ms: ttls.into_iter().map(|ttl| ttl.unwrap_or(0)).collect(),
        }))
    }

    async fn close_session(&self, request: Request<v1::SessionRequest>) -> RpcResult<v1::Empty> {
        let who = self.who(&request)?;
        let session = SessionId(request.into_inner().session_id);
        respond(self.node.as_caller(who).close_session(session).await.map(|()| v1::Empty {}))
    }

    async fn revoke_session(&self, request: Request<v1::SessionRequest>) -> RpcResult<v1::Empty> {
        let who = self.who(&request)?;
        let session = SessionId(request.into_inner().session_id);
        respond(self.node.as_caller(who).revoke_session(session).await.map(|()| v1::Empty {}))
    }

    async fn list_sessions(
        &self,
        request: Request<v1::ListSessionsRequest>,
    ) -> RpcResult<v1::ListSessionsResponse> {
        let who = self.who(&request)?;
        let request = request.into_inner();
        let after = (request.after > 0).then_some(SessionId(request.after));
        let sessions = self.node.as_caller(who).sessions(after, limit_from(request.limit)).await;
        respond(sessions.map(|sessions| v1::ListSessionsResponse {
            sessions: sessions.into_iter().map(session_message).collect(),
        }))
    }

    async fn acquire(
        &self,
        request: Request<v1::AcquireRequest>,
    ) -> RpcResult<v1::AcquireResponse> {
        let who = self.who(&request)?;
        let request = request.into_inner();
        let wait = Wait::from_wait_ms(request.wait_ms);
        let asked = AcquireRequest {
            wait,
            request: request.request_id.map(RequestId),
            attempt: request.attempt,
            principal: None,
        };
        let grant = self
            .node
            .as_caller(who)
            .acquire(SessionId(request.session_id), &request.name, asked)
            .await;
        respond(grant.map(|grant| v1::AcquireResponse {
            token: grant.token,
            sequencer: grant.sequencer,
            already_held: grant.already_held,
        }))
    }

    async fn abandon(
        &self,
        request: Request<v1::AbandonRequest>,
    ) -> RpcResult<v1::AbandonResponse> {
        let who = self.who(&request)?;
        let request = request.into_inner();
        let abandoned = self
            .node
            .as_caller(who)
            .abandon(
                SessionId(request.session_id),
                &request.name,
                RequestId(request.request_id),
                request.attempt,
            )
            .await;
        respond(abandoned.map(|released_token| v1::AbandonResponse { released_token }))
    }

    async fn cancel(&self, request: Request<v1::CancelRequest>) -> RpcResult<v1::Empty> {
        let who = self.who(&request)?;
        let request = request.into_inner();
        let cancelled =
            self.node.as_caller(who).cancel(SessionId(request.session_id), &request.name).await;
        respond(cancelled.map(|()| v1::Empty {}))
    }

    async fn release(&self, request: Request<v1::ReleaseRequest>) -> RpcResult<v1::Empty> {
        let who = self.who(&request)?;
        let request = request.into_inner();
        let released = self
            .node
            .as_caller(who)
            .release(SessionId(request.session_id), &request.name, request.token)
            .await;
        respond(released.map(|()| v1::Empty {}))
    }

    async fn get_lock(&self, request: Request<v1::GetLockRequest>) -> RpcResult<v1::LockInfo> {
        let who = self.who(&request)?;
        let caller = self.node.as_caller(who);
        let info = caller.lock(&request.into_inner().name).await;
        respond(info.map(|info| lock_message(&caller, info)))
    }

    async fn list_locks(
        &self,
        request: Request<v1::ListLocksRequest>,
    ) -> RpcResult<v1::ListLocksResponse> {
        let who = self.who(&request)?;
        let request = request.into_inner();
        let after = (!request.after.is_empty()).then_some(request.after.as_str());
        let caller = self.node.as_caller(who);
        let locks = caller.locks(&request.prefix, after, limit_from(request.limit)).await;
        respond(locks.map(|locks| v1::ListLocksResponse {
            locks: locks.into_iter().map(|info| lock_message(&caller, info)).collect(),
        }))
    }

    async fn check(&self, request: Request<v1::CheckRequest>) -> RpcResult<v1::CheckResponse> {
        let who = self.who(&request)?;
        let outcome = self.node.as_caller(who).check(&request.into_inner().sequencer).await;
        respond(outcome.map(|(outcome, presented_token)| {
            let (status, current_token) = check_fields(outcome, presented_token);
            let (check_status, holder_session_id) = match outcome {
                CheckOutcome::Current { session } => (v1::CheckStatus::Current, session.0),
                CheckOutcome::Superseded { .. } => (v1::CheckStatus::Superseded, 0),
                CheckOutcome::UnknownLock => (v1::CheckStatus::UnknownLock, 0),
            };
            v1::CheckResponse {
                status: status.to_owned(),
                current_token,
                holder_session_id,
                check_status: check_status.into(),
            }
        }))
    }

    type WatchStream = WatchStream;

    async fn watch(&self, request: Request<v1::WatchRequest>) -> RpcResult<Self::WatchStream> {
        let who = self.who(&request)?;
        let request = request.into_inner();
        let losses_only = request.losses_only;
        let target = match request.target {
            Some(v1::watch_request::Target::Name(_) | v1::watch_request::Target::Prefix(_))
                if losses_only =>
            {
                return Err(Status::invalid_argument(
                    "losses_only applies to session watches; watch a session or a set of sessions",
                ));
            }
            Some(v1::watch_request::Target::Name(name)) => Watched::Lock(name),
            Some(v1::watch_request::Target::Prefix(prefix)) => Watched::Prefix(prefix),
            Some(v1::watch_request::Target::SessionId(session)) if losses_only => {
                Watched::SessionLosses(vec![SessionId(session)])
            }
            Some(v1::watch_request::Target::SessionId(session)) => {
                Watched::Session(SessionId(session))
            }
            Some(v1::watch_request::Target::Sessions(set)) => {
                if set.session_ids.is_empty()
                    || set.session_ids.len() > crate::node::MAX_WATCHED_SESSIONS
                {
                    return Err(Status::invalid_argument(format!(
                        "watch 1 to {} sessions per stream",
                        crate::node::MAX_WATCHED_SESSIONS
                    )));
                }
                let sessions = set.session_ids.into_iter().map(SessionId).collect();
                if losses_only {
                    Watched::SessionLosses(sessions)
                } else {
                    Watched::Sessions(sessions)
                }
            }
            None => {
                return Err(Status::invalid_argument(
                    "say what to watch: a lock name, a prefix or a session id",
                ));
            }
        };
        let watch = self.node.as_caller(who).watch(target).map_err(|error| status(&error))?;
        let stream = futures_util::stream::unfold(watch, |mut watch| async move {
            let item = watch.next().await?;
            Some((item.map(watch_message).map_err(|error| status(&error)), watch))
        });
        Ok(Response::new(Box::pin(stream)))
    }

    async fn cluster(&self, request: Request<v1::Empty>) -> RpcResult<v1::ClusterInfo> {
        let who = self.who(&request)?;
        Ok(Response::new(cluster_message(self.node.as_caller(who).cluster())))
    }

    type BackupStream = BackupStream;

    async fn backup(&self, request: Request<v1::Empty>) -> RpcResult<Self::BackupStream> {
        let who = self.who(&request)?;
        let bytes = self.node.as_caller(who).backup().await.map_err(|error| status(&error))?;
        Ok(Response::new(backup_chunks(bytes)))
    }

    async fn add_member(
        &self,
        request: Request<v1::AddMemberRequest>,
    ) -> RpcResult<v1::ClusterInfo> {
        let who = self.who(&request)?;
        let request = request.into_inner();
        respond(
            self.node
                .as_caller(who)
                .add_member(
                    request.node_id,
                    request.addr,
                    Some(request.peer_addr).filter(|peer_addr| !peer_addr.is_empty()),
                )
                .await
                .map(cluster_message),
        )
    }

    async fn remove_member(
        &self,
        request: Request<v1::RemoveMemberRequest>,
    ) -> RpcResult<v1::ClusterInfo> {
        let who = self.who(&request)?;
        respond(
            self.node
                .as_caller(who)
                .remove_member(request.into_inner().node_id)
                .await
                .map(cluster_message),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each typed cause goes out with the name clients built before it read, and the two
    /// agree: the typed value's protobuf name ends in the upper-case wire name.
    #[test]
    fn every_cause_goes_out_typed_and_named_alike() {
        let upper = |name: &str| name.to_ascii_uppercase();
        for cause in ReleaseCause::ALL {
            let typed = release_cause_message(cause).as_str_name();
            assert_eq!(typed, format!("RELEASE_CAUSE_{}", upper(cause.as_str())));
        }
        for cause in CancelCause::ALL {
            let typed = cancel_cause_message(cause).as_str_name();
            assert_eq!(typed, format!("CANCEL_CAUSE_{}", upper(cause.as_str())));
        }
        for end in SessionEnd::ALL {
            let typed = session_end_message(end).as_str_name();
            assert_eq!(typed, format!("SESSION_END_{}", upper(end.as_str())));
        }
        let ended = WatchItem::Event {
            revision: 9,
            event: Event::Released {
                name: "a".into(),
                session: picket_core::SessionId(3),
                token: 7,
                cause: ReleaseCause::SessionExpired,
            },
        };
        let message = watch_message(ended);
        assert_eq!(message.event_kind(), v1::WatchEventKind::Released);
        assert_eq!(message.release_cause(), v1::ReleaseCause::SessionExpired);
        assert_eq!(
            (message.kind.as_str(), message.cause.as_str()),
            ("released", "session_expired")
        );
        assert_eq!(message.cancel_cause(), v1::CancelCause::Unspecified);
    }

    #[tokio::test]
    async fn a_backup_travels_in_whole_chunks_that_make_it_up_in_order() {
        use futures_util::StreamExt as _;
        let bytes: Vec<u8> = (0..2 * BACKUP_CHUNK_BYTES + 5).map(|at| [1, 2, 3][at % 3]).collect();
        let chunks: Vec<Vec<u8>> =
            backup_chunks(bytes.clone()).map(|chunk| chunk.expect("a chunk").data).collect().await;
        let sizes: Vec<usize> = chunks.iter().map(Vec::len).collect();
        assert_eq!(sizes, [BACKUP_CHUNK_BYTES, BACKUP_CHUNK_BYTES, 5]);
        assert_eq!(chunks.concat(), bytes);
        assert_eq!(backup_chunks(Vec::new()).count().await, 0, "nothing to send, no chunk");
    }
}
