//! The hot unary calls of the client service, sent on a [`Connection`] without tonic's client
//! stack when the connection speaks the wire protocol.
//!
//! Through the generated client, a call is encoded by a body stream, passed through tonic's
//! `Grpc` and the connection's `tower` service, and its answer is handed over frame by frame
//! through a queue of its own and decoded by tonic's `Streaming`: work paid on every lock
//! operation, on the client's share of the CPU and in its latency. Here the call is encoded
//! straight into its frame, its answer is gathered whole by the connection's reader, and the
//! plain answer the node sends nearly always (the message and `grpc-status: 0`, or a refusal's
//! status in the head alone) is decoded directly. Anything else is replayed through tonic's own
//! client code frame by frame, so every answer is read exactly as the generated client reads
//! it. On an HTTP/2 connection the calls are the generated client's.

use crate::connection::Connection;
use crate::v1;
use crate::wire::Frame;
use crate::wire_client::{Answer, ReplayBody, replay};
use bytes::{BufMut, Bytes, BytesMut};
use std::future::{Ready, ready};
use std::task::{Context, Poll};
use tonic::metadata::MetadataMap;
use tonic::{Code, Response, Status};

/// The longest answer message tonic's client decodes by default (its
/// `DEFAULT_MAX_RECV_MESSAGE_SIZE`); a longer one is left to tonic, which refuses it.
const MAX_ANSWER_MESSAGE_BYTES: usize = 4 * 1024 * 1024;

/// Headers of an answer that only tonic reads: a compressed answer, and a status's details
/// (which tonic decodes, and refuses when they are not base64).
const LEFT_TO_TONIC: [&str; 2] = ["grpc-encoding", "grpc-status-details-bin"];

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
        let Some(wire) = self.wire_link() else {
            let mut grpc = tonic::client::Grpc::with_origin(self.clone(), self.origin());
            let codec = tonic_prost::ProstCodec::<Req, Resp>::default();
            let path = http::uri::PathAndQuery::from_static(path);
            return grpc.unary(tonic::Request::new(request), path, codec).await;
        };
        let body = grpc_message(&request);
        self.check_request_size(body.len())?;
        let mut headers = http::HeaderMap::new();
        if let Some(authorization) = self.authorization() {
            headers.insert(http::header::AUTHORIZATION, authorization.clone());
        }
        let answers = wire.unary(path, headers, body).await?;
        match plain_answer(answers) {
            Ok(answer) => answer,
            Err(answers) => read_by_tonic(path, answers).await,
        }
    }
}

/// `message` as a gRPC body: a zero byte (not compressed), its length as a big-endian `u32`,
/// then the message, as tonic's encoder writes one.
fn grpc_message(message: &impl prost::Message) -> Bytes {
    let length = message.encoded_len();
    let mut body = BytesMut::with_capacity(5 + length);
    body.put_u8(0);
    // A message past u32 cannot be framed; the request bound refuses it long before.
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
    if LEFT_TO_TONIC.iter().any(|name| headers.contains_key(*name)) {
        return Err(answers);
    }
    if headers.contains_key("grpc-status") {
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
    !LEFT_TO_TONIC.iter().any(|name| trailers.contains_key(*name))
        && Status::from_header_map(trailers).is_some_and(|status| status.code() == Code::Ok)
}

/// The message of a body that holds exactly one uncompressed message within the bound.
fn one_message(data: &Bytes) -> Option<&[u8]> {
    let (prefix, message) = data.split_at_checked(5)?;
    let length = u32::from_be_bytes(prefix[1..].try_into().ok()?) as usize;
    (prefix[0] == 0 && length == message.len() && length <= MAX_ANSWER_MESSAGE_BYTES)
        .then_some(message)
}

/// The answers read by tonic's own unary client, frame by frame, as if the call had gone
/// through it (its request is not sent again: the replay answers it).
async fn read_by_tonic<Resp>(
    path: &'static str,
    answers: Vec<Answer>,
) -> Result<Response<Resp>, Status>
where
    Resp: prost::Message + Default + Send + 'static,
{
    let mut grpc = tonic::client::Grpc::new(Replay(Some(answers)));
    let codec = tonic_prost::ProstCodec::<(), Resp>::default();
    let path = http::uri::PathAndQuery::from_static(path);
    grpc.unary(tonic::Request::new(()), path, codec).await
}

/// A service that answers its one call with answers already received.
struct Replay(Option<Vec<Answer>>);

impl tower_service::Service<http::Request<tonic::body::Body>> for Replay {
    type Response = http::Response<ReplayBody>;
    type Error = Status;
    type Future = Ready<Result<Self::Response, Status>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Status>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _request: http::Request<tonic::body::Body>) -> Self::Future {
        ready(replay(self.0.take().unwrap_or_default()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::connection::Protocol;
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

    /// The answer forms a node may send, each with whether it is read directly: the message
    /// and `grpc-status: 0`, or a refusal in the head alone (as the node sends them), and
    /// everything else, left to tonic.
    fn answer_forms() -> Vec<(&'static str, bool, Vec<Answer>)> {
        let granted = prost::Message::encode_to_vec(&v1::AcquireResponse {
            token: 7,
            sequencer: "picket:v1:lock:7".into(),
            already_held: false,
        });
        let plain = message_body(0, &granted, granted.len());
        let head = |entries: &[(&'static str, &str)]| {
            Ok(Frame::Head { id: 0, status: 200, headers: headers(entries) })
        };
        let data = |data: Bytes| Ok(Frame::Data { id: 0, data });
        let trailers = |entries: &[(&'static str, &str)]| {
            Ok(Frame::Trailers { id: 0, trailers: headers(entries) })
        };
        let content = ("content-type", "application/grpc");
        let ok = ("grpc-status", "0");
        vec![
            (
                "granted",
                true,
                vec![head(&[content]), data(plain.clone()), trailers(&[ok, ("x-late", "1")])],
            ),
            (
                "refused in the head",
                true,
                vec![
                    head(&[
                        content,
                        ("grpc-status", "9"),
                        ("grpc-message", "lock%20busy"),
                        ("picket-error-code", "lock_busy"),
                        ("picket-holder-token", "5"),
                    ]),
                    trailers(&[]),
                ],
            ),
            (
                "refused after the message",
                false,
                vec![
                    head(&[content]),
                    data(plain.clone()),
                    trailers(&[("grpc-status", "14"), ("grpc-message", "gone")]),
                ],
            ),
            (
                "compressed",
                false,
                vec![
                    head(&[content]),
                    data(message_body(1, &granted, granted.len())),
                    trailers(&[ok]),
                ],
            ),
            (
                "cut short",
                false,
                vec![
                    head(&[content]),
                    data(message_body(0, &granted[..3], granted.len())),
                    trailers(&[ok]),
                ],
            ),
            (
                "two messages",
                false,
                vec![
                    head(&[content]),
                    data([plain.clone(), plain.clone()].concat().into()),
                    trailers(&[ok]),
                ],
            ),
            (
                "undecodable",
                false,
                vec![head(&[content]), data(message_body(0, &[0xff, 0xff], 2)), trailers(&[ok])],
            ),
            ("no message", false, vec![head(&[content, ok]), trailers(&[])]),
            ("no status", false, vec![head(&[content]), data(plain.clone()), trailers(&[])]),
            (
                "encoded",
                false,
                vec![
                    head(&[content, ("grpc-encoding", "gzip")]),
                    data(plain.clone()),
                    trailers(&[ok]),
                ],
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
                vec![head(&[content]), Err(Status::internal("the node ended the call: gone"))],
            ),
            ("no head", false, vec![data(plain.clone()), trailers(&[ok])]),
            (
                "details",
                false,
                vec![
                    head(&[content, ("grpc-status", "9"), ("grpc-status-details-bin", "AA")]),
                    trailers(&[]),
                ],
            ),
        ]
    }

    /// What a caller can see of an answer: the message and metadata, or the status.
    fn seen(answer: Result<Response<v1::AcquireResponse>, Status>) -> String {
        match answer {
            Ok(response) => {
                format!("{:?} {:?}", response.get_ref(), response.metadata().clone().into_headers())
            }
            Err(status) => format!(
                "{:?} {:?} {:?} {:?}",
                status.code(),
                status.message(),
                status.details(),
                status.metadata().clone().into_headers()
            ),
        }
    }

    /// Every form is read as tonic's own client reads it, and only the plain forms directly.
    #[tokio::test]
    async fn answers_read_directly_are_read_as_tonic_reads_them() {
        for (form, direct, answers) in answer_forms() {
            let by_tonic = seen(read_by_tonic("/picket.v1.Picket/Acquire", answers.clone()).await);
            match plain_answer::<v1::AcquireResponse>(answers) {
                Ok(answer) => {
                    assert!(direct, "{form} is left to tonic");
                    assert_eq!(seen(answer), by_tonic, "{form}");
                }
                Err(_) => assert!(!direct, "{form} is read directly"),
            }
        }
    }

    /// Over a wire connection, a hot call sends the frame the generated client sends and
    /// returns what it returns, for every form of answer.
    #[tokio::test]
    async fn a_hot_call_over_the_wire_is_the_generated_clients_call() {
        let forms = answer_forms();
        let count = forms.len();
        let (listener, addr) = listener().await;
        let node = tokio::spawn(async move {
            let mut node = Node::accept(&listener).await;
            let mut requests = Vec::new();
            // Each form answers two calls: the direct one, then the generated client's.
            for (_, _, answers) in forms.iter().flat_map(|form| [form, form]) {
                // The link's authorization comes first, once; tonic cancels a call whose answer
                // it stopped reading before the end (a refusal in the head).
                let (id, path, headers, body) = loop {
                    match node.next().await {
                        Some(Frame::Request { id, path, headers, body }) => {
                            break (id, path, headers, body);
                        }
                        Some(Frame::Authorization { .. } | Frame::Cancel { .. }) => {}
                        other => panic!("a request was due, not {other:?}"),
                    }
                };
                requests.push((path, headers, body));
                for answer in answers {
                    let frame = match answer.clone() {
                        Ok(Frame::Head { status, headers, .. }) => {
                            Frame::Head { id, status, headers }
                        }
                        Ok(Frame::Data { data, .. }) => Frame::Data { id, data },
                        Ok(Frame::Trailers { trailers, .. }) => Frame::Trailers { id, trailers },
                        Err(status) => Frame::Reset {
                            id,
                            message: status
                                .message()
                                .strip_prefix("the node ended the call: ")
                                .unwrap()
                                .to_owned(),
                        },
                        Ok(other) => panic!("unexpected {other:?}"),
                    };
                    node.send(frame).await;
                }
            }
            requests
        });
        let connection = Connection::open_with(&addr, TIMEOUT, 1024, None, Protocol::Wire)
            .await
            .unwrap()
            .with_bearer_token("secret")
            .unwrap();
        let request = v1::AcquireRequest {
            name: "orders".into(),
            session_id: 3,
            wait_ms: Some(250),
            request_id: Some(9),
            attempt: 1,
        };
        for (form, ..) in answer_forms() {
            let direct = seen(connection.acquire(request.clone()).await);
            let generated = seen(connection.grpc().acquire(request.clone()).await);
            assert_eq!(direct, generated, "{form}");
        }
        let requests = tokio::time::timeout(TIMEOUT, node).await.unwrap().unwrap();
        assert_eq!(requests.len(), 2 * count);
        for pair in requests.chunks(2) {
            assert_eq!(pair[0], pair[1], "the same request frame");
            assert_eq!(pair[0].0, "/picket.v1.Picket/Acquire");
        }
    }
}
