//! The hot unary calls of the client service, sent on a [`Connection`] without tonic's client
//! stack when the connection speaks the wire protocol.
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
/// it, so every frame behind it waits that long; a longer one (a keepalive-many answer for
/// more than about ten thousand sessions) is read by tonic on its caller's task. Far below
/// tonic's own bound (4 MiB, its `DEFAULT_MAX_RECV_MESSAGE_SIZE`), which tonic enforces.
const PLAIN_MESSAGE_BYTES: usize = 64 * 1024;

/// Headers of an answer that only tonic reads: a compressed answer, and a status's details
/// (which tonic decodes, and on which it panics when they are not base64).
const LEFT_TO_TONIC: [HeaderName; 2] =
    [HeaderName::from_static("grpc-encoding"), HeaderName::from_static("grpc-status-details-bin")];

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
    /// `OpenSession`, as [`v1::picket_client::PicketClient::open_session`] answers it.
    ///
    /// # Errors
    /// The call's status, as the generated client returns it.
    pub async fn open_session(
        &self,
        request: v1::OpenSessionRequest,
    ) -> Result<Response<v1::OpenSessionResponse>, Status> {
        self.unary("/picket.v1.Picket/OpenSession", request).await
    }

    /// `KeepAlive`, as the generated client answers it.
    ///
    /// # Errors
    /// The call's status, as the generated client returns it.
    pub async fn keep_alive(
        &self,
        request: v1::KeepAliveRequest,
    ) -> Result<Response<v1::KeepAliveResponse>, Status> {
        self.unary("/picket.v1.Picket/KeepAlive", request).await
    }

    /// `KeepAliveMany`, as the generated client answers it.
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

    /// `Acquire`, as the generated client answers it.
    ///
    /// # Errors
    /// The call's status, as the generated client returns it.
    pub async fn acquire(
        &self,
        request: v1::AcquireRequest,
    ) -> Result<Response<v1::AcquireResponse>, Status> {
        self.unary("/picket.v1.Picket/Acquire", request).await
    }

    /// `Release`, as the generated client answers it.
    ///
    /// # Errors
    /// The call's status, as the generated client returns it.
    pub async fn release(
        &self,
        request: v1::ReleaseRequest,
    ) -> Result<Response<v1::Empty>, Status> {
        self.unary("/picket.v1.Picket/Release", request).await
    }

    /// The generated client on this connection, for every other call.
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
        self.read_unary(path, request).await.0
    }

    /// [`Connection::unary`]'s answer, and whether it was read directly.
    async fn read_unary<Req, Resp>(
        &self,
        path: &'static str,
        request: Req,
    ) -> (Result<Response<Resp>, Status>, bool)
    where
        Req: prost::Message + Send + 'static,
        Resp: prost::Message + Default + Send + 'static,
    {
        let Some(wire) = self.wire_link() else {
            let mut grpc = tonic::client::Grpc::with_origin(self.clone(), self.origin());
            let codec = tonic_prost::ProstCodec::<Req, Resp>::default();
            let path = http::uri::PathAndQuery::from_static(path);
            return (grpc.unary(tonic::Request::new(request), path, codec).await, false);
        };
        let body = grpc_message(&request);
        if let Err(refused) = self.check_request_size(body.len()) {
            return (Err(refused), false);
        }
        let mut headers = http::HeaderMap::new();
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
                return (read_by_tonic(path, response).await, false);
            }
        };
        (read_by_tonic(path, answer).await, false)
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
) -> Result<Response<Resp>, Status>
where
    Resp: prost::Message + Default + Send + 'static,
    B: http_body::Body<Data = Bytes, Error = Status> + Send + 'static,
{
    let mut grpc = tonic::client::Grpc::new(Answered(Some(response)));
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
mod tests {
    use super::*;
    use crate::connection::{Protocol, not_sent_status, was_not_sent};
    use crate::wire_client::tests::{Node, listener};
    use http::HeaderMap;
    use std::time::Duration;

    const TIMEOUT: Duration = Duration::from_secs(5);

    fn headers(entries: &[(&'static str, &str)]) -> HeaderMap {
        entries
            .iter()
            .map(|(name, value)| (http::HeaderName::from_static(name), value.parse().unwrap()))
            .collect()
    }

    fn message_body(flag: u8, message: &[u8], length: usize) -> Bytes {
        let mut body = vec![flag];
        body.extend_from_slice(&u32::try_from(length).unwrap().to_be_bytes());
        body.extend_from_slice(message);
        Bytes::from(body)
    }

    fn head(entries: &[(&'static str, &str)]) -> Answer {
        Ok(Frame::Head { id: 0, status: 200, headers: headers(entries) })
    }

    fn data(data: Bytes) -> Answer {
        Ok(Frame::Data { id: 0, data })
    }

    fn trailers(entries: &[(&'static str, &str)]) -> Answer {
        Ok(Frame::Trailers { id: 0, trailers: headers(entries) })
    }

    const CONTENT: (&str, &str) = ("content-type", "application/grpc");
    const OK: (&str, &str) = ("grpc-status", "0");

    /// tonic's bound on an answer message.
    const TONIC_MESSAGE_BYTES: usize = 4 * 1024 * 1024;

    /// A grant whose encoded message is `length` bytes long.
    fn grant_of_length(length: usize) -> Vec<u8> {
        // The token's field takes 2 bytes, the sequencer's tag 1, and its length 1 to 4.
        (4..=7)
            .map(|overhead| {
                let sequencer = "s".repeat(length - overhead);
                let grant = v1::AcquireResponse { token: 7, sequencer, already_held: false };
                prost::Message::encode_to_vec(&grant)
            })
            .find(|encoded| encoded.len() == length)
            .expect("a sequencer of some length makes it")
    }

    /// The answer forms a node may send, each with whether it is read directly: one message
    /// and `grpc-status: 0`, or a refusal in the head (as the node sends them), and
    /// everything else, left to tonic.
    fn answer_forms() -> Vec<(&'static str, bool, Vec<Answer>)> {
        let granted = prost::Message::encode_to_vec(&v1::AcquireResponse {
            token: 7,
            sequencer: "picket:v1:lock:7".into(),
            already_held: false,
        });
        let plain = message_body(0, &granted, granted.len());
        let longest = grant_of_length(PLAIN_MESSAGE_BYTES);
        let longer = grant_of_length(PLAIN_MESSAGE_BYTES + 1);
        let too_long = grant_of_length(TONIC_MESSAGE_BYTES + 1);
        let refused = [
            CONTENT,
            ("grpc-status", "9"),
            ("grpc-message", "lock%20busy"),
            ("picket-error-code", "lock_busy"),
            ("picket-holder-token", "5"),
        ];
        let (half, rest) = plain.split_at(4);
        vec![
            (
                "granted",
                true,
                vec![head(&[CONTENT]), data(plain.clone()), trailers(&[OK, ("x-late", "1")])],
            ),
            (
                "granted, metadata in both",
                true,
                vec![
                    head(&[CONTENT, ("x-both", "a"), ("x-both", "b")]),
                    data(plain.clone()),
                    trailers(&[OK, ("x-both", "c")]),
                ],
            ),
            (
                "granted, the longest message read directly",
                true,
                vec![
                    head(&[CONTENT]),
                    data(message_body(0, &longest, longest.len())),
                    trailers(&[OK]),
                ],
            ),
            (
                "granted, a longer message",
                false,
                vec![
                    head(&[CONTENT]),
                    data(message_body(0, &longer, longer.len())),
                    trailers(&[OK]),
                ],
            ),
            (
                "granted, with a message beside the status",
                true,
                vec![
                    head(&[CONTENT]),
                    data(plain.clone()),
                    trailers(&[OK, ("grpc-message", "fine")]),
                ],
            ),
            (
                "granted, with a message badly escaped beside the status",
                false,
                vec![
                    head(&[CONTENT]),
                    data(plain.clone()),
                    trailers(&[OK, ("grpc-message", "%FF")]),
                ],
            ),
            ("refused in the head", true, vec![head(&refused), trailers(&[])]),
            ("refused, no trailers", true, vec![head(&refused)]),
            (
                "refused, data after",
                true,
                vec![head(&refused), data(plain.clone()), trailers(&[OK])],
            ),
            (
                "refused, not found",
                true,
                vec![
                    Ok(Frame::Head { id: 0, status: 404, headers: headers(&refused) }),
                    trailers(&[]),
                ],
            ),
            (
                "refused, a status not a number",
                true,
                vec![head(&[("grpc-status", "abc")]), trailers(&[])],
            ),
            (
                "refused, a message badly escaped",
                true,
                vec![head(&[("grpc-status", "9"), ("grpc-message", "100%FF")]), trailers(&[])],
            ),
            (
                "refused after the message",
                false,
                vec![
                    head(&[CONTENT]),
                    data(plain.clone()),
                    trailers(&[("grpc-status", "14"), ("grpc-message", "gone")]),
                ],
            ),
            (
                "too long a message",
                false,
                vec![
                    head(&[CONTENT]),
                    data(message_body(0, &too_long, too_long.len())),
                    trailers(&[OK]),
                ],
            ),
            (
                "compressed",
                false,
                vec![
                    head(&[CONTENT]),
                    data(message_body(1, &granted, granted.len())),
                    trailers(&[OK]),
                ],
            ),
            (
                "cut short",
                false,
                vec![
                    head(&[CONTENT]),
                    data(message_body(0, &granted[..3], granted.len())),
                    trailers(&[OK]),
                ],
            ),
            (
                "split over two frames",
                false,
                vec![
                    head(&[CONTENT]),
                    data(Bytes::copy_from_slice(half)),
                    data(Bytes::copy_from_slice(rest)),
                    trailers(&[OK]),
                ],
            ),
            (
                "two messages",
                false,
                vec![
                    head(&[CONTENT]),
                    data([plain.clone(), plain.clone()].concat().into()),
                    trailers(&[OK]),
                ],
            ),
            (
                "undecodable",
                false,
                vec![head(&[CONTENT]), data(message_body(0, &[0xff, 0xff], 2)), trailers(&[OK])],
            ),
            (
                "compressed, no trailers",
                false,
                vec![head(&[CONTENT]), data(message_body(1, &granted, granted.len()))],
            ),
            (
                "too long a message declared, no trailers",
                false,
                vec![head(&[CONTENT]), data(message_body(0, &granted, TONIC_MESSAGE_BYTES + 1))],
            ),
            (
                "undecodable, no trailers",
                false,
                vec![head(&[CONTENT]), data(message_body(0, &[0xff, 0xff], 2))],
            ),
            ("no message", false, vec![head(&[CONTENT, OK]), trailers(&[])]),
            ("no status", false, vec![head(&[CONTENT]), data(plain.clone()), trailers(&[])]),
            (
                "encoded",
                false,
                vec![
                    head(&[CONTENT, ("grpc-encoding", "gzip")]),
                    data(plain.clone()),
                    trailers(&[OK]),
                ],
            ),
            (
                "refused, encoded",
                false,
                vec![head(&[("grpc-status", "9"), ("grpc-encoding", "gzip")]), trailers(&[])],
            ),
            (
                "not found",
                false,
                vec![
                    Ok(Frame::Head { id: 0, status: 404, headers: HeaderMap::new() }),
                    trailers(&[]),
                ],
            ),
            (
                "reset",
                false,
                vec![head(&[CONTENT]), Err(Status::internal("the node ended the call: gone"))],
            ),
            (
                "reset after the message",
                false,
                vec![
                    head(&[CONTENT]),
                    data(plain.clone()),
                    Err(Status::internal("the node ended the call: gone")),
                ],
            ),
            ("no head", false, vec![data(plain.clone()), trailers(&[OK])]),
            ("trailers first", false, vec![trailers(&[OK])]),
            (
                "details",
                false,
                vec![
                    head(&[CONTENT, ("grpc-status", "9"), ("grpc-status-details-bin", "AA")]),
                    trailers(&[]),
                ],
            ),
        ]
    }

    /// What a caller can see of an answer: the message and metadata, or the status with its
    /// not-sent mark.
    fn seen<T: std::fmt::Debug>(answer: Result<Response<T>, Status>) -> String {
        match answer {
            Ok(response) => {
                let metadata = response.metadata().clone().into_headers();
                format!("{:?} {metadata:?}", response.into_inner())
            }
            Err(status) => format!(
                "{:?} {:?} {:?} {:?} not sent: {}",
                status.code(),
                status.message(),
                status.details(),
                status.metadata().clone().into_headers(),
                was_not_sent(&status),
            ),
        }
    }

    /// Every form is read as tonic's own client reads it, and only the plain forms directly.
    #[tokio::test]
    async fn answers_read_directly_are_read_as_tonic_reads_them() {
        let failed = ("failed, not sent", false, vec![Err(not_sent_status("gone"))]);
        for (form, direct, answers) in answer_forms().into_iter().chain([failed]) {
            let path = "/picket.v1.Picket/Acquire";
            let by_tonic =
                seen(read_by_tonic::<v1::AcquireResponse, _>(path, replay(answers.clone())).await);
            match plain_answer::<v1::AcquireResponse>(answers) {
                Ok(answer) => {
                    assert!(direct, "{form} is left to tonic");
                    assert_eq!(seen(answer), by_tonic, "{form}");
                }
                Err(_) => assert!(!direct, "{form} is read directly"),
            }
        }
    }

    /// What the test node read: each request (id, path, metadata, body) and the calls cancelled.
    #[derive(Default)]
    struct Read {
        requests: Vec<(u64, String, HeaderMap, Bytes)>,
        cancelled: std::collections::HashSet<u64>,
    }

    impl Read {
        /// The next request's id, path and frame; the link's authorization is passed over.
        async fn next_request(&mut self, node: &mut Node) -> Option<u64> {
            loop {
                match node.next().await? {
                    Frame::Request { id, path, headers, body } => {
                        self.requests.push((id, path, headers, body));
                        return Some(id);
                    }
                    Frame::Cancel { id } => {
                        self.cancelled.insert(id);
                    }
                    _ => {}
                }
            }
        }
    }

    /// Answers one request after another with `script`'s answers, the call's id set in each.
    async fn answer_in_turn(node: &mut Node, script: Vec<Vec<Answer>>) -> Read {
        let mut read = Read::default();
        for answers in script {
            let id = read.next_request(node).await.expect("a request was due");
            for answer in answers {
                let frame = match answer {
                    Ok(Frame::Head { status, headers, .. }) => Frame::Head { id, status, headers },
                    Ok(Frame::Data { data, .. }) => Frame::Data { id, data },
                    Ok(Frame::Trailers { trailers, .. }) => Frame::Trailers { id, trailers },
                    Err(status) => {
                        let message = status.message().strip_prefix("the node ended the call: ");
                        Frame::Reset { id, message: message.unwrap().to_owned() }
                    }
                    Ok(other) => panic!("not an answer: {other:?}"),
                };
                node.send(frame).await;
            }
        }
        read
    }

    async fn within<T>(call: impl std::future::Future<Output = T>) -> T {
        tokio::time::timeout(TIMEOUT, call).await.expect("answered in time")
    }

    /// Over a wire connection, each hot call sends the frame the generated client sends and
    /// returns what it returns, for every form of answer, and as soon as it does; a call the
    /// node never read is not sent either way.
    #[tokio::test]
    async fn a_hot_call_over_the_wire_is_the_generated_clients_call() {
        let forms = answer_forms();
        let empty = vec![head(&[CONTENT]), data(message_body(0, &[], 0)), trailers(&[OK])];
        // Each answer serves two calls: the direct one, then the generated client's.
        let script: Vec<Vec<Answer>> = forms
            .iter()
            .map(|(_, _, answers)| answers.clone())
            .chain(std::iter::repeat_n(empty, 6))
            .flat_map(|answers| [answers.clone(), answers])
            .collect();
        let calls = script.len();
        let (listener, addr) = listener().await;
        let node = tokio::spawn(async move {
            let mut node = Node::accept(&listener).await;
            let mut read = answer_in_turn(&mut node, script).await;
            // One more call, which the node says it never read.
            let id = read.next_request(&mut node).await.expect("the last call came");
            node.send(Frame::GoAway { last_id: id - 1 }).await;
            (node, read)
        });
        let connection = Connection::open_with(&addr, TIMEOUT, 1 << 20, None, Protocol::Wire)
            .await
            .unwrap()
            .with_bearer_token("secret")
            .unwrap();
        let acquire = v1::AcquireRequest {
            name: "orders".into(),
            session_id: 3,
            wait_ms: Some(250),
            request_id: Some(9),
            attempt: 1,
        };
        let path = "/picket.v1.Picket/Acquire";
        for (form, plain, _) in &forms {
            let (direct, read_directly) =
                within(connection.read_unary::<_, v1::AcquireResponse>(path, acquire.clone()))
                    .await;
            assert_eq!(read_directly, *plain, "{form}");
            let generated = seen(within(connection.grpc().acquire(acquire.clone())).await);
            assert_eq!(seen(direct), generated, "{form}");
        }
        let open =
            v1::OpenSessionRequest { ttl_ms: 5_000, lock_delay_ms: 0, clock_id: 2, clock_ms: 1.5 };
        let keepalive = v1::KeepAliveRequest { session_id: 3, clock_id: 2, clock_ms: 2.5 };
        let many = v1::KeepAliveManyRequest { session_ids: vec![3, 4], clock_id: 2, clock_ms: 3.5 };
        let session = v1::SessionRequest { session_id: 3 };
        let release = v1::ReleaseRequest { name: "orders".into(), session_id: 3, token: 7 };
        let pairs = [
            (
                seen(within(connection.open_session(open)).await),
                seen(within(connection.grpc().open_session(open)).await),
            ),
            (
                seen(within(connection.keep_alive(keepalive)).await),
                seen(within(connection.grpc().keep_alive(keepalive)).await),
            ),
            (
                seen(within(connection.keep_alive_many(many.clone())).await),
                seen(within(connection.grpc().keep_alive_many(many)).await),
            ),
            (
                seen(within(connection.close_session(session)).await),
                seen(within(connection.grpc().close_session(session)).await),
            ),
            (
                seen(within(connection.release(release.clone())).await),
                seen(within(connection.grpc().release(release)).await),
            ),
            (
                seen(within(connection.acquire(acquire.clone())).await),
                seen(within(connection.grpc().acquire(acquire.clone())).await),
            ),
        ];
        for (direct, generated) in pairs {
            assert_eq!(direct, generated);
        }
        let unread = within(connection.acquire(acquire.clone())).await.unwrap_err();
        assert!(was_not_sent(&unread), "{unread:?}");
        let (_node, read) = tokio::time::timeout(TIMEOUT, node).await.unwrap().unwrap();
        assert_eq!(read.requests.len(), calls + 1);
        for pair in read.requests[..calls].chunks(2) {
            let (direct, generated) = (&pair[0], &pair[1]);
            let frame = |request: &(u64, String, HeaderMap, Bytes)| {
                (request.1.clone(), request.2.clone(), request.3.clone())
            };
            assert_eq!(frame(direct), frame(generated), "the same request frame");
        }
        // The calls the two cancel are the same, but that the direct call sends no cancel for
        // an answer that ended with a refusal in its head.
        for ((form, plain, _), pair) in forms.iter().zip(read.requests.chunks(2)) {
            let (direct, generated) = (pair[0].0, pair[1].0);
            let cancelled = (read.cancelled.contains(&direct), read.cancelled.contains(&generated));
            if *plain {
                assert!(!cancelled.0, "{form}: an answer read whole is not cancelled");
            } else {
                assert_eq!(cancelled.0, cancelled.1, "{form}: cancelled (direct, generated)");
            }
        }
        let paths: Vec<&str> = read.requests[..calls]
            .iter()
            .rev()
            .step_by(2)
            .take(6)
            .map(|request| request.1.as_str())
            .collect();
        assert_eq!(
            paths,
            ["Acquire", "Release", "CloseSession", "KeepAliveMany", "KeepAlive", "OpenSession"]
                .map(|method| format!("/picket.v1.Picket/{method}"))
        );
    }
}
