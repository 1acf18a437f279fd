//! The hot unary calls of the client service, and the Raft messages nodes send their peers,
//! sent on a [`Connection`] without tonic's client stack when the connection speaks the wire
//! protocol.
//!
//! Through the generated client, a call is encoded by a body stream, passed through tonic's
//! `Grpc` and the connection's `tower` service, and its answer is handed over frame by frame
//! through a queue of its own and decoded by tonic's `Streaming`: work paid on every lock
//! operation, on the client's share of the CPU and in its latency. Here the call is encoded
//! straight into the request frame the generated client sends. While its answer may still be
//! plain (a head without a status, then one uncompressed message of at most 64 KiB that
//! decodes, then `grpc-status: 0`; or a refusal's status in the head: the two answers a node
//! sends), the connection's reader gathers it, at most those three frames, and the plain answer
//! is decoded directly. At the first frame that shows otherwise the answer is handed to tonic's
//! own unary client, which reads it from there as it comes, as the generated client would have;
//! an answer whose trailers show it (a failure, or no status, after the message) is replayed
//! to tonic whole. The result and its timing are the generated client's (tests below compare
//! them on thirty-two forms of answer), but for the reader's check of a gathered message, one
//! decoding of at most 64 KiB that frames behind it on the connection wait for (a hot answer is
//! tens of bytes). One thing differs on the wire: no cancel is sent for an answer that had
//! ended, where the generated client's body, dropped before it read the trailers that follow a
//! refusal in the head, cancels the call. On an HTTP/2
//! connection the calls are tonic's.

use crate::connection::Connection;
use crate::v1;
use crate::wire::Frame;
use crate::wire_client::{Answer, Unary, replay};
use bytes::{BufMut, Bytes, BytesMut};
use http::HeaderName;
use std::future::{Ready, ready};
use std::task::{Context, Poll};
use tonic::metadata::MetadataMap;
use tonic::{Code, Response, Status};

/// The longest answer message read directly. The connection's reader decodes it once to check
/// it, so every frame behind it waits that long; a longer one is read by tonic on its caller's
/// task. The hot answers stay far below it (a keepalive-many answer for the 10,000 sessions a
/// batch may name is about 40 KB at most, an answer to a Raft message tens of bytes), as below
/// the bound tonic enforces on longer ones ([`CLIENT_ANSWER_BYTES`] for the client service,
/// [`crate::MAX_RAFT_MESSAGE_BYTES`] for Raft messages).
const PLAIN_MESSAGE_BYTES: usize = 64 * 1024;

/// The longest answer to a client service call: the generated client's bound (tonic's
/// `DEFAULT_MAX_RECV_MESSAGE_SIZE`, 4 MiB), which the Rust client keeps.
const CLIENT_ANSWER_BYTES: usize = 4 << 20;

/// Headers of an answer that only tonic reads: a compressed answer, and a status's details
/// (which tonic decodes, and on which it panics when they are not base64).
const LEFT_TO_TONIC: [HeaderName; 2] =
    [HeaderName::from_static("grpc-encoding"), HeaderName::from_static("grpc-status-details-bin")];

/// Metadata tonic's client leaves out of a request (its `into_sanitized_headers`): the
/// protocol's own headers, which it writes itself or which only an answer carries.
const RESERVED_HEADERS: [HeaderName; 5] = [
    http::header::TE,
    http::header::CONTENT_TYPE,
    HeaderName::from_static("grpc-message"),
    HeaderName::from_static("grpc-message-type"),
    HeaderName::from_static("grpc-status"),
];

/// The answer's gRPC status code and message.
const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
const GRPC_MESSAGE: HeaderName = HeaderName::from_static("grpc-message");

/// Whether an answer message (without its 5-byte prefix) decodes as the call's answer type.
pub(crate) type MessageCheck = fn(&[u8]) -> bool;

/// Whether a unary call's answer, of which `answers` came so far, may still be plain once
/// `next` is added (see [`crate::wire_client::WireConnection::unary`]).
pub(crate) enum Plain {
    /// It may: keep gathering.
    Gather,
    /// Its end: a head carrying a refusal's status (all tonic reads of such an answer), the
    /// trailers after the message, or a failure.
    Ended,
    /// It cannot be plain: hand it over to be read as it comes, as tonic reads it.
    Not,
}

/// See [`Plain`]. Only a head without a status, one data frame holding exactly one
/// uncompressed message within [`PLAIN_MESSAGE_BYTES`] that decodes as the call's answer
/// (`decodes`: checked by the reader with the call's [`MessageCheck`]), and the trailers are
/// gathered: a
/// whole answer holds at most that. Any other frame is one at which tonic either decides the
/// call or goes on reading, so it is handed to tonic then, as early as the generated client
/// would meet it.
pub(crate) fn still_plain(answers: &[Answer], next: &Answer, decodes: bool) -> Plain {
    match (answers, next) {
        (_, Err(_)) => Plain::Ended,
        ([], Ok(Frame::Head { status, headers, .. })) if !left_to_tonic(headers) => {
            match headers.get(GRPC_STATUS).map(|code| Code::from_bytes(code.as_bytes())) {
                // A refusal's status in the head is all tonic reads of its answer.
                Some(code) if code != Code::Ok => Plain::Ended,
                // A head saying OK ends the answer for tonic only once it has read the body.
                Some(_) => Plain::Not,
                None if *status == 200 => Plain::Gather,
                None => Plain::Not,
            }
        }
        ([_], Ok(Frame::Data { .. })) if decodes => Plain::Gather,
        ([_, _], Ok(Frame::Trailers { .. })) => Plain::Ended,
        _ => Plain::Not,
    }
}

fn left_to_tonic(headers: &http::HeaderMap) -> bool {
    LEFT_TO_TONIC.iter().any(|name| headers.contains_key(name))
}

impl Connection {
    /// `OpenSession`, as [`v1::picket_client::PicketClient::open_session`] answers it. Over the
    /// wire protocol this and the nine calls below skip tonic's client stack; the result is the
    /// generated client's (see `unary.rs` in the source for how, and for the one difference on
    /// the wire: no cancel follows an answer that had ended).
    ///
    /// # Errors
    /// The call's status, as the generated client returns it.
    pub async fn open_session(
        &self,
        request: v1::OpenSessionRequest,
    ) -> Result<Response<v1::OpenSessionResponse>, Status> {
        self.unary("/picket.v1.Picket/OpenSession", request).await
    }

    /// `KeepAlive` (a session's keepalive), as the generated client answers it.
    ///
    /// # Errors
    /// The call's status, as the generated client returns it.
    pub async fn keep_alive(
        &self,
        request: v1::KeepAliveRequest,
    ) -> Result<Response<v1::KeepAliveResponse>, Status> {
        self.unary("/picket.v1.Picket/KeepAlive", request).await
    }

    /// `KeepAliveMany` (the keepalive of several sessions), as the generated client answers it.
    ///
    /// # Errors
    /// The call's status, as the generated client returns it.
    pub async fn keep_alive_many(
        &self,
        request: v1::KeepAliveManyRequest,
    ) -> Result<Response<v1::KeepAliveManyResponse>, Status> {
        self.unary("/picket.v1.Picket/KeepAliveMany", request).await
    }

    /// `CloseSession`, as the generated client answers it.
    ///
    /// # Errors
    /// The call's status, as the generated client returns it.
    pub async fn close_session(
        &self,
        request: v1::SessionRequest,
    ) -> Result<Response<v1::Empty>, Status> {
        self.unary("/picket.v1.Picket/CloseSession", request).await
    }

    /// `Acquire` (a lock), as the generated client answers it.
    ///
    /// # Errors
    /// The call's status, as the generated client returns it.
    pub async fn acquire(
        &self,
        request: v1::AcquireRequest,
    ) -> Result<Response<v1::AcquireResponse>, Status> {
        self.unary("/picket.v1.Picket/Acquire", request).await
    }

    /// `Release` (of a lock's grant), as the generated client answers it.
    ///
    /// # Errors
    /// The call's status, as the generated client returns it.
    pub async fn release(
        &self,
        request: v1::ReleaseRequest,
    ) -> Result<Response<v1::Empty>, Status> {
        self.unary("/picket.v1.Picket/Release", request).await
    }

    /// `Raft/AppendEntries`, as [`v1::raft_client::RaftClient::append_entries`] answers it
    /// with its decoding bound at [`crate::MAX_RAFT_MESSAGE_BYTES`]: the same as the client
    /// service's hot calls above, but that it takes a request with metadata (the target node,
    /// the deadline) and sends it as the generated client sends it.
    ///
    /// # Errors
    /// The call's status, as the generated client returns it.
    pub async fn append_entries(
        &self,
        request: tonic::Request<v1::RaftPayload>,
    ) -> Result<Response<v1::RaftPayload>, Status> {
        self.read_unary("/picket.v1.Raft/AppendEntries", request, crate::MAX_RAFT_MESSAGE_BYTES)
            .await
            .0
    }

    /// `Raft/Vote`, as the generated client answers it (see [`Connection::append_entries`]).
    ///
    /// # Errors
    /// The call's status, as the generated client returns it.
    pub async fn vote(
        &self,
        request: tonic::Request<v1::RaftPayload>,
    ) -> Result<Response<v1::RaftPayload>, Status> {
        self.read_unary("/picket.v1.Raft/Vote", request, crate::MAX_RAFT_MESSAGE_BYTES).await.0
    }

    /// `Raft/PreVote`, as the generated client answers it (see [`Connection::append_entries`]).
    ///
    /// # Errors
    /// The call's status, as the generated client returns it.
    pub async fn pre_vote(
        &self,
        request: tonic::Request<v1::RaftPayload>,
    ) -> Result<Response<v1::RaftPayload>, Status> {
        self.read_unary("/picket.v1.Raft/PreVote", request, crate::MAX_RAFT_MESSAGE_BYTES).await.0
    }

    /// `Raft/InstallSnapshot`, as the generated client answers it (see
    /// [`Connection::append_entries`]).
    ///
    /// # Errors
    /// The call's status, as the generated client returns it.
    pub async fn install_snapshot(
        &self,
        request: tonic::Request<v1::RaftPayload>,
    ) -> Result<Response<v1::RaftPayload>, Status> {
        self.read_unary("/picket.v1.Raft/InstallSnapshot", request, crate::MAX_RAFT_MESSAGE_BYTES)
            .await
            .0
    }

    /// The generated client on this connection, for every other call. On a wire connection it
    /// speaks the wire protocol too, through tonic's client stack.
    #[must_use]
    pub fn grpc(&self) -> v1::picket_client::PicketClient<Connection> {
        v1::picket_client::PicketClient::with_origin(self.clone(), self.origin())
    }

    async fn unary<Req, Resp>(
        &self,
        path: &'static str,
        request: Req,
    ) -> Result<Response<Resp>, Status>
    where
        Req: prost::Message + Send + 'static,
        Resp: prost::Message + Default + Send + 'static,
    {
        self.read_unary(path, tonic::Request::new(request), CLIENT_ANSWER_BYTES).await.0
    }

    /// [`Connection::unary`]'s answer, and whether it was read directly. The request's metadata
    /// is sent as the generated client sends it, but for the headers tonic keeps for itself; an
    /// answer message longer than `max_answer_bytes` is refused, as the generated client
    /// configured with that bound refuses it.
    async fn read_unary<Req, Resp>(
        &self,
        path: &'static str,
        request: tonic::Request<Req>,
        max_answer_bytes: usize,
    ) -> (Result<Response<Resp>, Status>, bool)
    where
        Req: prost::Message + Send + 'static,
        Resp: prost::Message + Default + Send + 'static,
    {
        let Some(wire) = self.wire_link() else {
            let mut grpc = tonic::client::Grpc::with_origin(self.clone(), self.origin())
                .max_decoding_message_size(max_answer_bytes);
            let codec = tonic_prost::ProstCodec::<Req, Resp>::default();
            let path = http::uri::PathAndQuery::from_static(path);
            return (grpc.unary(request, path, codec).await, false);
        };
        let (metadata, _, message) = request.into_parts();
        let body = grpc_message(&message);
        if let Err(refused) = self.check_request_size(body.len()) {
            return (Err(refused), false);
        }
        let mut headers = metadata.into_headers();
        for reserved in RESERVED_HEADERS {
            headers.remove(reserved);
        }
        // As on the generated client's way (`Connection`'s `call`), the connection's own
        // authorization stands in for any the request carries.
        if let Some(authorization) = self.authorization() {
            headers.insert(http::header::AUTHORIZATION, authorization.clone());
        }
        let answer = match wire.unary(path, headers, body, decodes::<Resp>).await {
            Err(refused) => return (Err(refused), false),
            Ok(Unary::Whole(answers)) => match plain_answer(answers) {
                Ok(answer) => return (answer, true),
                Err(answers) => replay(answers),
            },
            Ok(Unary::Live(response)) => {
                return (read_by_tonic(path, response, max_answer_bytes).await, false);
            }
        };
        (read_by_tonic(path, answer, max_answer_bytes).await, false)
    }
}

/// `message` as a gRPC body: a zero byte (not compressed), its length as a big-endian `u32`,
/// then the message, as tonic's encoder writes one.
fn grpc_message(message: &impl prost::Message) -> Bytes {
    let length = message.encoded_len();
    let mut body = BytesMut::with_capacity(5 + length);
    body.put_u8(0);
    // A message past u32 cannot be framed; the request bound, checked next, refuses it.
    body.put_u32(u32::try_from(length).unwrap_or(u32::MAX));
    message.encode(&mut body).expect("the buffer holds the message's encoded length");
    body.freeze()
}

/// The answer read directly when it is one of the two plain forms (see the module's doc), as
/// the generated client reads it; otherwise the answers, given back untouched.
fn plain_answer<Resp>(answers: Vec<Answer>) -> Result<Result<Response<Resp>, Status>, Vec<Answer>>
where
    Resp: prost::Message + Default,
{
    let Some(Ok(Frame::Head { headers, .. })) = answers.first() else {
        return Err(answers);
    };
    if left_to_tonic(headers) {
        return Err(answers);
    }
    if headers.contains_key(GRPC_STATUS) {
        // A status in the head is the whole answer to tonic, whatever follows it.
        return match Status::from_header_map(headers) {
            Some(status) if status.code() != Code::Ok => Ok(Err(status)),
            _ => Err(answers),
        };
    }
    let message = match &answers[..] {
        [
            Ok(Frame::Head { status: 200, .. }),
            Ok(Frame::Data { data, .. }),
            Ok(Frame::Trailers { trailers, .. }),
        ] if answered_ok(trailers) => {
            // A message that does not decode is left to tonic, which words the error.
            one_message(data).and_then(|message| Resp::decode(message).ok())
        }
        _ => None,
    };
    let Some(message) = message else {
        return Err(answers);
    };
    // tonic's unary answer carries the head's headers with the trailers merged in.
    let mut metadata = http::HeaderMap::new();
    for answer in answers {
        if let Ok(Frame::Head { headers, .. } | Frame::Trailers { trailers: headers, .. }) = answer
        {
            metadata.extend(headers);
        }
    }
    Ok(Ok(Response::from_parts(
        MetadataMap::from_headers(metadata),
        message,
        http::Extensions::new(),
    )))
}

/// Whether `trailers` end a call as answered, and carry nothing only tonic reads.
fn answered_ok(trailers: &http::HeaderMap) -> bool {
    if left_to_tonic(trailers) {
        return false;
    }
    if !trailers.contains_key(GRPC_MESSAGE) {
        // The node's form, read without a copy of the trailers: with no message to decode,
        // tonic's status is the code alone.
        let code = trailers.get(GRPC_STATUS).map(|code| Code::from_bytes(code.as_bytes()));
        return code == Some(Code::Ok);
    }
    // A message that does not decode makes tonic's status `Unknown`, whatever the code.
    Status::from_header_map(trailers).is_some_and(|status| status.code() == Code::Ok)
}

/// Whether `message` decodes as a `Resp`. The connection's reader checks a message before it
/// gathers it (outside the connection's lock), so that one tonic would refuse is handed to tonic
/// at once; the plain answer then decodes it again. Both are small against tonic's stack: a hot
/// answer is tens of bytes.
fn decodes<Resp: prost::Message + Default>(message: &[u8]) -> bool {
    Resp::decode(message).is_ok()
}

/// The message of a body that holds exactly one uncompressed message within the bound.
pub(crate) fn one_message(data: &Bytes) -> Option<&[u8]> {
    let (prefix, message) = data.split_at_checked(5)?;
    let length = u32::from_be_bytes(prefix[1..].try_into().ok()?) as usize;
    (prefix[0] == 0 && length == message.len() && length <= PLAIN_MESSAGE_BYTES).then_some(message)
}

/// An answer read by tonic's own unary client, as if the call had gone through it (its
/// request is not sent again: the answer is already there, or on its way).
async fn read_by_tonic<Resp, B>(
    path: &'static str,
    response: Result<http::Response<B>, Status>,
    max_answer_bytes: usize,
) -> Result<Response<Resp>, Status>
where
    Resp: prost::Message + Default + Send + 'static,
    B: http_body::Body<Data = Bytes, Error = Status> + Send + 'static,
{
    let mut grpc = tonic::client::Grpc::new(Answered(Some(response)))
        .max_decoding_message_size(max_answer_bytes);
    let codec = tonic_prost::ProstCodec::<(), Resp>::default();
    let path = http::uri::PathAndQuery::from_static(path);
    grpc.unary(tonic::Request::new(()), path, codec).await
}

/// A service that answers its one call with a response it was given.
struct Answered<B>(Option<Result<http::Response<B>, Status>>);

impl<B> tower_service::Service<http::Request<tonic::body::Body>> for Answered<B> {
    type Response = http::Response<B>;
    type Error = Status;
    type Future = Ready<Result<Self::Response, Status>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Status>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _request: http::Request<tonic::body::Body>) -> Self::Future {
        ready(self.0.take().unwrap_or_else(|| Err(Status::internal("the answer was read once"))))
    }
}

#[cfg(test)]
mod tests;
