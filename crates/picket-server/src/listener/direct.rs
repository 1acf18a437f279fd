//! The hot unary calls served straight from a wire frame: the client API's lock and session
//! calls, and the Raft messages peers send one another. The same handlers as the router's,
//! without building an HTTP request, routing it and going through tonic's codec.
//!
//! Only a request in the plain form is taken here: exactly one uncompressed message within the
//! service's size limit that decodes, with no `grpc-encoding`. Anything else goes to the
//! router, so every refusal of a malformed call is tonic's own. The handler gets the metadata
//! and caller the router would give it, and a Raft message passes the same gate as the router's
//! interceptor (only a cluster member's connection, in a TLS cluster). The answer is written as
//! tonic writes it: headers, one message and `grpc-status: 0`, or, for an error, the status in
//! the headers with no message (a "trailers-only" answer).

use crate::grpc::ClientService;
use crate::metrics::Metrics;
use crate::network::{MAX_RAFT_MESSAGE_BYTES, RaftService};
use crate::tls::Caller;
use bytes::{BufMut as _, Bytes, BytesMut};
use futures_util::future::BoxFuture;
use http::{HeaderMap, HeaderValue};
use picket_proto::v1::RaftPayload;
use picket_proto::v1::picket_server::Picket as _;
use picket_proto::v1::raft_server::Raft as _;
use picket_proto::wire::Frame;
use std::future::Future;
use std::sync::Arc;
use tonic::{Request, Response, Status};

/// The length of a gRPC message's prefix: whether it is compressed, and its length.
const MESSAGE_PREFIX_BYTES: usize = 5;

/// Headers tonic leaves out of a response's metadata: they are the protocol's own.
const RESERVED_HEADERS: [&str; 5] =
    ["te", "content-type", "grpc-message", "grpc-message-type", "grpc-status"];

/// The `content-type` of every gRPC answer.
static GRPC_CONTENT_TYPE: HeaderValue = HeaderValue::from_static("application/grpc");
/// The `grpc-status` trailer of an answer that succeeded.
static GRPC_STATUS_OK: HeaderValue = HeaderValue::from_static("0");

/// The calls served directly.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Hot {
    Client(ClientCall),
    Raft(RaftMessage),
}

/// The client API's hot calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum ClientCall {
    OpenSession,
    KeepAlive,
    KeepAliveMany,
    CloseSession,
    Acquire,
    Release,
}

/// The Raft messages a leader and candidates send (not the clock reads and abandons, which are
/// rare).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum RaftMessage {
    AppendEntries,
    Vote,
    PreVote,
    InstallSnapshot,
}

impl Hot {
    const ALL: [Self; 10] = [
        Self::Client(ClientCall::OpenSession),
        Self::Client(ClientCall::KeepAlive),
        Self::Client(ClientCall::KeepAliveMany),
        Self::Client(ClientCall::CloseSession),
        Self::Client(ClientCall::Acquire),
        Self::Client(ClientCall::Release),
        Self::Raft(RaftMessage::AppendEntries),
        Self::Raft(RaftMessage::Vote),
        Self::Raft(RaftMessage::PreVote),
        Self::Raft(RaftMessage::InstallSnapshot),
    ];

    /// The call's path, as the router knows it.
    pub(super) fn path(self) -> &'static str {
        match self {
            Self::Client(ClientCall::OpenSession) => "/picket.v1.Picket/OpenSession",
            Self::Client(ClientCall::KeepAlive) => "/picket.v1.Picket/KeepAlive",
            Self::Client(ClientCall::KeepAliveMany) => "/picket.v1.Picket/KeepAliveMany",
            Self::Client(ClientCall::CloseSession) => "/picket.v1.Picket/CloseSession",
            Self::Client(ClientCall::Acquire) => "/picket.v1.Picket/Acquire",
            Self::Client(ClientCall::Release) => "/picket.v1.Picket/Release",
            Self::Raft(RaftMessage::AppendEntries) => "/picket.v1.Raft/AppendEntries",
            Self::Raft(RaftMessage::Vote) => "/picket.v1.Raft/Vote",
            Self::Raft(RaftMessage::PreVote) => "/picket.v1.Raft/PreVote",
            Self::Raft(RaftMessage::InstallSnapshot) => "/picket.v1.Raft/InstallSnapshot",
        }
    }

    fn of(path: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|hot| hot.path() == path)
    }
}

/// The calls a port's wire connections serve themselves: the client API's on a client port,
/// the Raft messages wherever the port serves the `Raft` service.
#[derive(Clone, Debug)]
pub(crate) struct DirectCalls {
    client: Option<ClientService>,
    raft: Option<RaftService>,
    /// Counts the calls served directly (`picket_wire_direct_calls_total`).
    metrics: Arc<Metrics>,
    /// The client API's limit on a request message (tonic's `max_decoding_message_size`).
    max_message_bytes: usize,
}

/// A call served directly: its answer's frames, encoded.
pub(super) type DirectCall = BoxFuture<'static, Bytes>;

/// A hot call in the plain form, read and waiting for a place. Its message is decoded when it
/// starts, so a call that waits holds no more than its frame's bytes.
pub(super) struct DirectRequest {
    hot: Hot,
    headers: HeaderMap,
    body: Bytes,
    caller: Caller,
}

impl DirectRequest {
    /// The call as the router takes it: path, metadata, body and caller.
    pub(super) fn into_routed(self) -> (&'static str, HeaderMap, Bytes, Caller) {
        (self.hot.path(), self.headers, self.body, self.caller)
    }
}

impl DirectCalls {
    /// Serves no call directly until given a service ([`DirectCalls::with_client`],
    /// [`DirectCalls::with_raft`]).
    pub(crate) fn new(metrics: Arc<Metrics>, max_message_bytes: usize) -> Self {
        Self { client: None, raft: None, metrics, max_message_bytes }
    }

    /// Serves the client API's hot calls with `service`.
    pub(crate) fn with_client(mut self, service: ClientService) -> Self {
        self.client = Some(service);
        self
    }

    /// Serves Raft messages with `service`, as the `Raft` service on this port would.
    pub(crate) fn with_raft(mut self, service: RaftService) -> Self {
        self.raft = Some(service);
        self
    }

    /// The call at `path` if it is one served here.
    fn hot(&self, path: &str) -> Option<Hot> {
        let hot = Hot::of(path)?;
        let served = match hot {
            Hot::Client(_) => self.client.is_some(),
            Hot::Raft(_) => self.raft.is_some(),
        };
        served.then_some(hot)
    }

    /// The longest request message `hot` takes: a Raft message's bound for the `Raft` service,
    /// as its tonic server is configured, and the client API's for the others.
    fn max_message_bytes(&self, hot: Hot) -> usize {
        match hot {
            Hot::Client(_) => self.max_message_bytes,
            Hot::Raft(_) => MAX_RAFT_MESSAGE_BYTES,
        }
    }

    /// Takes a call to `path` made by `caller` if it is a hot call in the plain form: exactly
    /// one uncompressed message within the limit and no `grpc-encoding`. Anything else is given
    /// back for the router.
    pub(super) fn take(
        &self,
        path: &str,
        headers: HeaderMap,
        body: Bytes,
        caller: &Caller,
    ) -> Result<DirectRequest, (HeaderMap, Bytes)> {
        let Some(hot) = self.hot(path) else {
            return Err((headers, body));
        };
        if headers.contains_key("grpc-encoding")
            || plain_message(&body, self.max_message_bytes(hot)).is_none()
        {
            return Err((headers, body));
        }
        Ok(DirectRequest { hot, headers, body, caller: caller.clone() })
    }

    /// Starts the call `id`: its handler's future with the answer's frames as output, or the
    /// request back for the router when its message does not decode (tonic refuses it).
    pub(super) fn start(
        &self,
        id: u64,
        request: DirectRequest,
    ) -> Result<DirectCall, DirectRequest> {
        let max = self.max_message_bytes(request.hot);
        let started = match (request.hot, &self.client, &self.raft) {
            (Hot::Client(call), Some(client), _) => client_call(id, call, request, max, client),
            (Hot::Raft(message), _, Some(raft)) => raft_call(id, message, request, max, raft),
            // Not served here (`take` takes no such call): the router serves it.
            _ => Err(request),
        };
        if started.is_ok() {
            self.metrics.note_direct_wire_call();
        }
        started
    }
}

/// Starts the client API's hot call `request` (a `call`), as [`DirectCalls::start`] does.
fn client_call(
    id: u64,
    call: ClientCall,
    request: DirectRequest,
    max: usize,
    service: &ClientService,
) -> Result<DirectCall, DirectRequest> {
    let service = service.clone();
    match call {
        ClientCall::Acquire => {
            unary(id, request, max, move |call| async move { service.acquire(call).await })
        }
        ClientCall::Release => {
            unary(id, request, max, move |call| async move { service.release(call).await })
        }
        ClientCall::KeepAlive => {
            unary(id, request, max, move |call| async move { service.keep_alive(call).await })
        }
        ClientCall::KeepAliveMany => {
            unary(id, request, max, move |call| async move { service.keep_alive_many(call).await })
        }
        ClientCall::OpenSession => {
            unary(id, request, max, move |call| async move { service.open_session(call).await })
        }
        ClientCall::CloseSession => {
            unary(id, request, max, move |call| async move { service.close_session(call).await })
        }
    }
}

/// Starts the Raft `message` of `request`, as [`DirectCalls::start`] does. It goes first
/// through the gate the router's interceptor keeps: a connection that may not send Raft messages
/// is refused as it is there, before its message is decoded.
fn raft_call(
    id: u64,
    message: RaftMessage,
    request: DirectRequest,
    max: usize,
    raft: &RaftService,
) -> Result<DirectCall, DirectRequest> {
    if let Err(refused) = raft.admit(&request.caller) {
        return Ok(Box::pin(async move { answer::<RaftPayload>(id, Err(refused)) }));
    }
    let raft = raft.clone();
    unary(id, request, max, move |call| async move {
        match message {
            RaftMessage::AppendEntries => raft.append_entries(call).await,
            RaftMessage::Vote => raft.vote(call).await,
            RaftMessage::PreVote => raft.pre_vote(call).await,
            RaftMessage::InstallSnapshot => raft.install_snapshot(call).await,
        }
    })
}

/// The message of a body that holds exactly one, uncompressed and of at most
/// `max_message_bytes`.
fn plain_message(body: &Bytes, max_message_bytes: usize) -> Option<&[u8]> {
    let (prefix, message) = body.split_at_checked(MESSAGE_PREFIX_BYTES)?;
    let compressed = prefix[0];
    let length = u32::from_be_bytes([prefix[1], prefix[2], prefix[3], prefix[4]]);
    let plain = compressed == 0
        && usize::try_from(length).is_ok_and(|length| length == message.len())
        && message.len() <= max_message_bytes;
    plain.then_some(message)
}

/// Decodes the request's message as `Req` (the request back if it does not decode: the
/// router refuses it) and runs `handler` on it as a gRPC request with the call's metadata and
/// caller, as the router would make it.
fn unary<Req, Resp, Handler, Answer>(
    id: u64,
    request: DirectRequest,
    max_message_bytes: usize,
    handler: Handler,
) -> Result<DirectCall, DirectRequest>
where
    Req: prost::Message + Default + Send + 'static,
    Resp: prost::Message + 'static,
    Handler: FnOnce(Request<Req>) -> Answer + Send + 'static,
    Answer: Future<Output = Result<Response<Resp>, Status>> + Send + 'static,
{
    let decoded = plain_message(&request.body, max_message_bytes)
        .and_then(|message| Req::decode(message).ok());
    let Some(message) = decoded else {
        return Err(request);
    };
    let DirectRequest { mut headers, caller, .. } = request;
    headers.insert(http::header::CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    headers.insert(http::header::TE, HeaderValue::from_static("trailers"));
    let mut request = http::Request::new(message);
    *request.headers_mut() = headers;
    request.extensions_mut().insert(caller);
    Ok(Box::pin(async move { answer(id, handler(Request::from_http(request)).await) }))
}

/// The frames of an answer, as tonic's unary answer becomes over the wire protocol.
fn answer<Resp: prost::Message>(id: u64, answer: Result<Response<Resp>, Status>) -> Bytes {
    let mut out = BytesMut::new();
    match answer {
        Ok(response) => {
            let (metadata, message, _) = response.into_parts();
            let headers = metadata.into_headers();
            let handlers_own =
                headers.iter().filter(|(name, _)| !RESERVED_HEADERS.contains(&name.as_str()));
            let content_type = (&http::header::CONTENT_TYPE, &GRPC_CONTENT_TYPE);
            Frame::encode_headers(
                &mut out,
                id,
                Some(200),
                std::iter::once(content_type).chain(handlers_own),
            );
            let length = message.encoded_len();
            let mut data = BytesMut::with_capacity(MESSAGE_PREFIX_BYTES + length);
            data.put_u8(0);
            // A handler's answer is far below 4 GiB: the largest is a page of a listing.
            data.put_u32(u32::try_from(length).expect("an answer under 4 GiB"));
            message.encode_raw(&mut data);
            Frame::Data { id, data: data.freeze() }.encode(&mut out);
            Frame::encode_headers(&mut out, id, None, [(&Status::GRPC_STATUS, &GRPC_STATUS_OK)]);
        }
        Err(status) => {
            let (head, ()) = status.into_http::<()>().into_parts();
            Frame::Head { id, status: head.status.as_u16(), headers: head.headers }
                .encode(&mut out);
            Frame::Trailers { id, trailers: HeaderMap::new() }.encode(&mut out);
        }
    }
    out.freeze()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn framed(compressed: u8, length: u32, message: &[u8]) -> Bytes {
        let mut body = vec![compressed];
        body.extend_from_slice(&length.to_be_bytes());
        body.extend_from_slice(message);
        Bytes::from(body)
    }

    #[test]
    fn only_one_uncompressed_message_within_the_limit_is_taken_directly() {
        let plain = |body: &Bytes| plain_message(body, 4).map(<[u8]>::to_vec);
        assert_eq!(plain(&framed(0, 3, b"abc")), Some(b"abc".to_vec()));
        assert_eq!(plain(&framed(0, 0, b"")), Some(Vec::new()));
        assert_eq!(plain(&framed(1, 3, b"abc")), None, "compressed");
        assert_eq!(plain(&framed(0, 4, b"abc")), None, "short");
        assert_eq!(plain(&framed(0, 2, b"abc")), None, "a second message follows");
        assert_eq!(plain(&framed(0, 5, b"abcde")), None, "over the limit");
        assert_eq!(plain(&Bytes::from_static(b"\0\0\0")), None, "no prefix");
    }
}
