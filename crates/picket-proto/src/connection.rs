//! One connection to one endpoint: Picket's wire protocol ([`crate::wire`]), or HTTP/2 driven
//! through the `h2` crate directly.
//!
//! tonic's `Channel` puts a `tower::Buffer` in front of hyper's client, and hyper's client hands
//! every request to its connection task and spawns a task per request to wait for the response:
//! three task hand-offs per call before the bytes reach the socket, paid on the client's share
//! of the CPU and in its latency. Here the caller's task opens the stream itself and is woken
//! directly by the connection's task when the response arrives. Picket's clients (the Rust
//! client, and each node's Raft client to its peers) talk to one endpoint at a time and
//! reconnect themselves, so they need neither the buffer nor the channel's reconnect layer.

use bytes::{Bytes, BytesMut};
use http_body::{Body as HttpBody, Frame};
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tonic::Status;
use tonic::body::Body;

use crate::tls::ClientTls;
use crate::wire_client::{WireBody, WireConnection};

/// Marks a request that certainly never left this process (no connection, or one that closed
/// before the request was written): it may be sent again even when it is not idempotent. It is
/// the source of that request's `UNAVAILABLE` status, a mark only this process can set: a
/// status that came from a server never carries it, whatever its message says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the request was not sent")]
pub struct NotSent;

/// The `UNAVAILABLE` status of a request that was not sent, marked with [`NotSent`].
#[must_use]
pub fn not_sent_status(message: &str) -> Status {
    marked_unsent(message, NotSent)
}

/// The `UNAVAILABLE` status of a request not sent, with `mark` as its source.
fn marked_unsent(message: &str, mark: impl std::error::Error + Send + Sync + 'static) -> Status {
    let mut status = Status::unavailable(format!("not sent: {message}"));
    status.set_source(std::sync::Arc::new(mark));
    status
}

/// Marks a request not sent because nothing could be reached at its endpoint: no TCP
/// connection could be made (refused, unreachable, or not made within the connect timeout).
/// A request so marked was not sent either ([`was_not_sent`]). A connection that was made and
/// then failed (its TLS handshake, its HTTP/2 handshake, or the answer was not in time) is
/// not marked so: something listens there, and which cluster it belongs to is not known.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("nothing was reached at the endpoint")]
pub struct NothingReached;

/// Whether `status` is marked [`NotSent`] (or [`NothingReached`], which is not sent either).
#[must_use]
pub fn was_not_sent(status: &Status) -> bool {
    std::error::Error::source(status)
        .is_some_and(|source| source.is::<NotSent>() || source.is::<NothingReached>())
}

/// Whether `status` is marked [`NothingReached`]: no TCP connection could be made to the
/// endpoint.
#[must_use]
pub fn nothing_reached(status: &Status) -> bool {
    std::error::Error::source(status).is_some_and(|source| source.is::<NothingReached>())
}

/// The `UNAVAILABLE` status of a connection that could not reach its endpoint, marked with
/// [`NothingReached`].
fn nothing_reached_status(message: &str) -> Status {
    marked_unsent(message, NothingReached)
}

/// Per-stream and per-connection receive windows: large enough that a watch stream's burst of
/// events is not throttled by window updates (the same figures as hyper's client defaults).
const STREAM_WINDOW_BYTES: u32 = 2 * 1024 * 1024;
const CONNECTION_WINDOW_BYTES: u32 = 5 * 1024 * 1024;

/// Which framing a connection speaks: gRPC over HTTP/2, or Picket's own ([`crate::wire`]),
/// which carries the same calls for less work on both ends.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Protocol {
    /// gRPC over HTTP/2, which every node and every gRPC client speaks.
    Grpc,
    /// Picket's wire protocol; a node that does not speak it (an older build) is spoken to
    /// in gRPC instead.
    #[default]
    Wire,
}

impl Protocol {
    /// The protocol named by the environment variable `PICKET_PROTOCOL` (`wire` or `grpc`),
    /// else the default: the one every client of a process speaks unless told otherwise.
    #[must_use]
    pub fn from_env() -> Self {
        std::env::var("PICKET_PROTOCOL").ok().and_then(|name| name.parse().ok()).unwrap_or_default()
    }
}

impl std::str::FromStr for Protocol {
    type Err = String;

    fn from_str(name: &str) -> Result<Self, String> {
        match name {
            "wire" => Ok(Self::Wire),
            "grpc" => Ok(Self::Grpc),
            other => Err(format!("{other:?} is not a protocol: say wire or grpc")),
        }
    }
}

/// An open connection to one node. Cheap to clone; clones multiplex on the same connection.
#[derive(Clone, Debug)]
pub struct Connection {
    link: Link,
    max_request_bytes: usize,
    origin: http::Uri,
    /// Sent as the `authorization` header of every request.
    authorization: Option<http::HeaderValue>,
}

#[derive(Clone, Debug)]
enum Link {
    H2(h2::client::SendRequest<Bytes>),
    Wire(WireConnection),
}

impl Connection {
    /// Opens a TCP connection to `endpoint` (`host:port`) with `TCP_NODELAY`, performs the TLS
    /// handshake when `tls` is given (the server's certificate must name the endpoint's host),
    /// and then the HTTP/2 handshake, all within `connect_timeout`. A request body larger than
    /// `max_request_bytes` is refused before it is sent.
    ///
    /// # Errors
    /// `UNAVAILABLE`, marked [`NotSent`], when the endpoint cannot be reached in time or its
    /// certificate is not trusted, and marked [`NothingReached`] instead when no TCP
    /// connection could be made; `INVALID_ARGUMENT` when it is not `host:port`.
    pub async fn open(
        endpoint: &str,
        connect_timeout: Duration,
        max_request_bytes: usize,
        tls: Option<&ClientTls>,
    ) -> Result<Self, Status> {
        Self::open_with(endpoint, connect_timeout, max_request_bytes, tls, Protocol::Grpc).await
    }

    /// [`Connection::open`], speaking `protocol`. A node asked for [`Protocol::Wire`] that
    /// does not speak it is connected to again, in gRPC, within the same `connect_timeout`.
    ///
    /// # Errors
    /// As [`Connection::open`].
    pub async fn open_with(
        endpoint: &str,
        connect_timeout: Duration,
        max_request_bytes: usize,
        tls: Option<&ClientTls>,
        protocol: Protocol,
    ) -> Result<Self, Status> {
        let scheme = if tls.is_some() { "https" } else { "http" };
        let origin = format!("{scheme}://{endpoint}").parse().map_err(|error| {
            Status::invalid_argument(format!("{endpoint:?} is not host:port ({error})"))
        })?;
        let server_name = match tls {
            Some(_) => Some(crate::tls::server_name(endpoint).map_err(Status::invalid_argument)?),
            None => None,
        };
        // Set once a TCP connection is made: a failure after it met something at the endpoint.
        let reached = std::sync::atomic::AtomicBool::new(false);
        let connecting = async {
            if protocol == Protocol::Wire {
                let stream = connect(endpoint, tls, server_name.clone(), &reached).await?;
                let started = match stream {
                    Stream::Plain(stream) => WireConnection::start(stream, connect_timeout).await?,
                    Stream::Tls(stream) => WireConnection::start(stream, connect_timeout).await?,
                };
                if let Some(wire) = started {
                    return Ok(Link::Wire(wire));
                }
                tracing::debug!(%endpoint, "the node does not speak the wire protocol; using gRPC");
            }
            let send = match connect(endpoint, tls, server_name, &reached).await? {
                Stream::Plain(stream) => handshake(stream).await?,
                Stream::Tls(stream) => handshake(stream).await?,
            };
            Ok::<_, std::io::Error>(Link::H2(send))
        };
        let failure = match tokio::time::timeout(connect_timeout, connecting).await {
            Ok(Ok(link)) => {
                return Ok(Self { link, max_request_bytes, origin, authorization: None });
            }
            Ok(Err(error)) => format!("cannot connect to {endpoint}: {error}"),
            Err(_) => format!("cannot connect to {endpoint} within {connect_timeout:?}"),
        };
        if reached.load(std::sync::atomic::Ordering::Relaxed) {
            Err(not_sent_status(&failure))
        } else {
            Err(nothing_reached_status(&failure))
        }
    }

    /// Sends `authorization: Bearer <token>` with every request on this connection.
    ///
    /// # Errors
    /// `INVALID_ARGUMENT` when the token cannot be a header value (a control character).
    pub fn with_bearer_token(mut self, token: &str) -> Result<Self, Status> {
        let mut value = http::HeaderValue::try_from(format!("Bearer {token}")).map_err(|_| {
            Status::invalid_argument("the bearer token holds a character a header cannot carry")
        })?;
        value.set_sensitive(true);
        if let Link::Wire(wire) = &self.link {
            // Sent once for the link; calls of a handle whose token differs carry their own.
            wire.authorize(&value);
        }
        self.authorization = Some(value);
        Ok(self)
    }

    /// `http://host:port` (or `https://`) of the endpoint, for a generated client's `with_origin`.
    #[must_use]
    pub fn origin(&self) -> http::Uri {
        self.origin.clone()
    }

    /// Whether the connection can no longer open streams; such a connection is replaced
    /// before the next call.
    #[must_use]
    pub fn is_closed(&self) -> bool {
        let send = match &self.link {
            Link::H2(send) => send,
            Link::Wire(wire) => return wire.is_closed(),
        };
        // `poll_ready` on a clone answers at once: ready, an error once the connection has
        // gone, or pending while the server's stream limit is reached (which is not closed).
        let mut probe = send.clone();
        let waker = std::task::Waker::noop();
        matches!(probe.poll_ready(&mut Context::from_waker(waker)), Poll::Ready(Err(_)))
    }

    /// The wire link, when the connection speaks the wire protocol.
    pub(crate) fn wire_link(&self) -> Option<&WireConnection> {
        match &self.link {
            Link::Wire(wire) => Some(wire),
            Link::H2(_) => None,
        }
    }

    /// The authorization every request on this connection carries.
    pub(crate) fn authorization(&self) -> Option<&http::HeaderValue> {
        self.authorization.as_ref()
    }

    /// Refuses a request body longer than this connection sends.
    pub(crate) fn check_request_size(&self, length: usize) -> Result<(), Status> {
        check_request_size(length, self.max_request_bytes)
    }

    /// Which protocol the connection speaks.
    #[must_use]
    pub fn protocol(&self) -> Protocol {
        match self.link {
            Link::H2(_) => Protocol::Grpc,
            Link::Wire(_) => Protocol::Wire,
        }
    }
}

/// A connected stream, plain or under TLS.
enum Stream {
    Plain(tokio::net::TcpStream),
    Tls(Box<tokio_rustls::client::TlsStream<tokio::net::TcpStream>>),
}

/// Connects to `endpoint` with `TCP_NODELAY`, and performs the TLS handshake when `tls` is
/// given. Sets `reached` once the TCP connection is made.
async fn connect(
    endpoint: &str,
    tls: Option<&ClientTls>,
    server_name: Option<rustls::pki_types::ServerName<'static>>,
    reached: &std::sync::atomic::AtomicBool,
) -> std::io::Result<Stream> {
    let stream = tokio::net::TcpStream::connect(endpoint).await?;
    reached.store(true, std::sync::atomic::Ordering::Relaxed);
    // Without TCP_NODELAY, small frames wait for delayed ACKs.
    stream.set_nodelay(true)?;
    // A node whose host went away without a word is found by the kernel's probes: the wire
    // protocol has no ping of its own (HTTP/2's pings are on as well).
    if let Err(error) = crate::wire::keep_alive(&stream) {
        tracing::debug!(%error, "cannot turn on TCP keepalive");
    }
    let (Some(tls), Some(server_name)) = (tls, server_name) else {
        return Ok(Stream::Plain(stream));
    };
    let connector = tokio_rustls::TlsConnector::from(tls.current());
    let stream = connector.connect(server_name, stream).await.map_err(|error| {
        std::io::Error::other(format!(
            "the TLS handshake failed: {error}; check that the CA given (--ca) signed the \
             node's certificate and that the certificate names this host"
        ))
    })?;
    Ok(Stream::Tls(Box::new(stream)))
}

/// The HTTP/2 handshake over an open stream; the connection is driven by a task of its own.
async fn handshake<Io>(io: Io) -> std::io::Result<h2::client::SendRequest<Bytes>>
where
    Io: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (send, connection) = h2::client::Builder::new()
        .enable_push(false)
        .initial_window_size(STREAM_WINDOW_BYTES)
        .initial_connection_window_size(CONNECTION_WINDOW_BYTES)
        .handshake(io)
        .await
        .map_err(std::io::Error::other)?;
    tokio::spawn(async move {
        if let Err(error) = connection.await {
            tracing::debug!(%error, "connection to the server closed");
        }
    });
    Ok(send)
}

fn not_sent(what: &str, error: &h2::Error) -> Status {
    not_sent_status(&format!("{what} ({error}); connect again"))
}

/// Reads a request body whole. tonic's unary and server-streaming requests carry one message,
/// encoded as soon as the body is polled.
async fn read_body(mut body: Body, max_bytes: usize) -> Result<Bytes, Status> {
    let mut buffer = BytesMut::new();
    while let Some(frame) = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await {
        let frame = frame?;
        if let Ok(data) = frame.into_data() {
            check_request_size(buffer.len() + data.len(), max_bytes)?;
            buffer.extend_from_slice(&data);
        }
    }
    Ok(buffer.freeze())
}

fn check_request_size(length: usize, max_bytes: usize) -> Result<(), Status> {
    if length > max_bytes {
        return Err(Status::invalid_argument(format!(
            "the request is larger than {max_bytes} bytes; send less at once"
        )));
    }
    Ok(())
}

async fn send(
    link: Link,
    max_request_bytes: usize,
    request: http::Request<Body>,
) -> Result<http::Response<ResponseBody>, Status> {
    let (parts, body) = request.into_parts();
    let body = read_body(body, max_request_bytes).await?;
    let sender = match link {
        Link::H2(sender) => sender,
        Link::Wire(wire) => {
            let response = wire.call(parts.uri.path(), parts.headers, body).await?;
            return Ok(response.map(|body| ResponseBody { inner: Inner::Wire(body) }));
        }
    };
    // Waits while the server's limit of concurrent streams is reached.
    let mut sender = sender
        .ready()
        .await
        .map_err(|error| not_sent("the connection closed before the request was sent", &error))?;
    let (response, mut stream) =
        sender
            .send_request(http::Request::from_parts(parts, ()), false)
            .map_err(|error| not_sent("the server refused a new stream", &error))?;
    // Past this point the request may have reached the server.
    stream.send_data(body, true).map_err(from_h2)?;
    let response = response.await.map_err(from_h2)?;
    Ok(response.map(|body| ResponseBody { inner: Inner::H2 { body, trailers_due: true } }))
}

/// A failed stream as a gRPC status; tonic reads an `h2::Error` (a reset stream, a protocol
/// error) into the matching code.
fn from_h2(error: h2::Error) -> Status {
    Status::from_error(Box::new(error))
}

impl tower_service::Service<http::Request<Body>> for Connection {
    type Response = http::Response<ResponseBody>;
    type Error = Status;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Status>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Status>> {
        // Readiness (the server's stream limit) is awaited inside the call.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, mut request: http::Request<Body>) -> Self::Future {
        // On a wire link the call leaves it out again when the link was authorized with it.
        if let Some(authorization) = &self.authorization {
            request.headers_mut().insert(http::header::AUTHORIZATION, authorization.clone());
        }
        Box::pin(send(self.link.clone(), self.max_request_bytes, request))
    }
}

/// A response body read straight from its HTTP/2 stream or its wire call: the data frames,
/// then the trailers that carry the gRPC status.
#[derive(Debug)]
pub struct ResponseBody {
    inner: Inner,
}

#[derive(Debug)]
enum Inner {
    H2 { body: h2::RecvStream, trailers_due: bool },
    Wire(WireBody),
}

impl HttpBody for ResponseBody {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        match &mut self.inner {
            Inner::H2 { body, trailers_due } => poll_h2(body, trailers_due, cx),
            Inner::Wire(body) => Pin::new(body).poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.inner {
            Inner::H2 { body, trailers_due } => !trailers_due && body.is_end_stream(),
            Inner::Wire(body) => body.is_end_stream(),
        }
    }
}

fn poll_h2(
    body: &mut h2::RecvStream,
    trailers_due: &mut bool,
    cx: &mut Context<'_>,
) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
    match body.poll_data(cx) {
        Poll::Pending => return Poll::Pending,
        Poll::Ready(Some(Ok(data))) => {
            // Hand the window back at once: the bytes are the caller's now.
            let _ = body.flow_control().release_capacity(data.len());
            return Poll::Ready(Some(Ok(Frame::data(data))));
        }
        Poll::Ready(Some(Err(error))) => {
            return Poll::Ready(Some(Err(from_h2(error))));
        }
        Poll::Ready(None) => {}
    }
    if !*trailers_due {
        return Poll::Ready(None);
    }
    match body.poll_trailers(cx) {
        Poll::Pending => Poll::Pending,
        Poll::Ready(Ok(trailers)) => {
            *trailers_due = false;
            Poll::Ready(trailers.map(|trailers| Ok(Frame::trailers(trailers))))
        }
        Poll::Ready(Err(error)) => {
            *trailers_due = false;
            Poll::Ready(Some(Err(from_h2(error))))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tower_service::Service;

    const TIMEOUT: Duration = Duration::from_secs(5);

    fn request(body: &'static [u8]) -> http::Request<Body> {
        let mut request = http::Request::new(Body::new(one_frame(body)));
        *request.uri_mut() = "http://127.0.0.1/picket.v1.Picket/Test".parse().unwrap();
        *request.method_mut() = http::Method::POST;
        request
    }

    /// A one-frame body, as tonic's unary encoder produces.
    fn one_frame(bytes: &'static [u8]) -> impl HttpBody<Data = Bytes, Error = Status> {
        struct Once(Option<Bytes>);
        impl HttpBody for Once {
            type Data = Bytes;
            type Error = Status;
            fn poll_frame(
                mut self: Pin<&mut Self>,
                _: &mut Context<'_>,
            ) -> Poll<Option<Result<http_body::Frame<Bytes>, Status>>> {
                Poll::Ready(self.0.take().map(|data| Ok(http_body::Frame::data(data))))
            }
        }
        Once(Some(Bytes::from_static(bytes)))
    }

    async fn listener() -> (tokio::net::TcpListener, String) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        (listener, addr)
    }

    async fn next_frame(body: &mut ResponseBody) -> Option<http_body::Frame<Bytes>> {
        std::future::poll_fn(|cx| Pin::new(&mut *body).poll_frame(cx)).await.map(Result::unwrap)
    }

    #[tokio::test]
    async fn nothing_listening_is_refused_as_not_sent() {
        let (listener, addr) = listener().await;
        drop(listener);
        let error = Connection::open(&addr, TIMEOUT, 1024, None).await.unwrap_err();
        assert_eq!(error.code(), tonic::Code::Unavailable);
        assert!(was_not_sent(&error), "{}", error.message());
        assert!(nothing_reached(&error), "no TCP connection: {}", error.message());
        assert!(error.message().contains(&addr), "{}", error.message());
    }

    /// Something that accepts the connection and then does not answer its opening is not
    /// nothing: a client must not take the node there for gone (it may be a node of its
    /// cluster that is stalled, or whose certificate the client does not trust).
    #[tokio::test]
    async fn a_connection_made_but_not_answered_is_not_sent_yet_reached_something() {
        let (listener, addr) = listener().await;
        let silent = tokio::spawn(async move {
            let (stream, _) = listener.accept().await.unwrap();
            tokio::time::sleep(TIMEOUT).await;
            drop(stream);
        });
        let quick = Duration::from_millis(200);
        let error =
            Connection::open_with(&addr, quick, 1024, None, Protocol::Wire).await.unwrap_err();
        silent.abort();
        assert_eq!(error.code(), tonic::Code::Unavailable);
        assert!(was_not_sent(&error), "{}", error.message());
        assert!(!nothing_reached(&error), "a TCP connection was made: {}", error.message());
    }

    /// The request's body reaches the server whole, and the response's data comes before the
    /// trailers that carry the gRPC status.
    #[tokio::test]
    async fn a_call_carries_its_body_and_reads_data_then_trailers() {
        let (listener, addr) = listener().await;
        let server = tokio::spawn(async move {
            let (stream, _) = listener.accept().await.unwrap();
            let mut connection = h2::server::handshake(stream).await.unwrap();
            let (request, mut respond) = connection.accept().await.unwrap().unwrap();
            tokio::spawn(async move { while connection.accept().await.is_some() {} });
            assert_eq!(request.uri().path(), "/picket.v1.Picket/Test");
            let mut body = request.into_body();
            let mut received = Vec::new();
            while let Some(data) = body.data().await {
                received.extend_from_slice(&data.unwrap());
            }
            let mut send = respond.send_response(http::Response::new(()), false).unwrap();
            send.send_data(Bytes::from_static(b"answer"), false).unwrap();
            let mut trailers = http::HeaderMap::new();
            trailers.insert("grpc-status", "0".parse().unwrap());
            send.send_trailers(trailers).unwrap();
            received
        });
        let mut connection = Connection::open(&addr, TIMEOUT, 1024, None).await.unwrap();
        let response = connection.call(request(b"question")).await.unwrap();
        let mut body = response.into_body();
        let data = next_frame(&mut body).await.unwrap().into_data().unwrap();
        assert_eq!(&data[..], b"answer");
        let trailers = next_frame(&mut body).await.unwrap().into_trailers().unwrap();
        assert_eq!(trailers["grpc-status"], "0");
        assert!(next_frame(&mut body).await.is_none());
        assert!(body.is_end_stream());
        assert_eq!(server.await.unwrap(), b"question");
    }

    #[tokio::test]
    async fn a_body_over_the_limit_is_refused_before_sending() {
        let (listener, addr) = listener().await;
        let (streams_tx, streams_rx) = tokio::sync::oneshot::channel();
        tokio::spawn(async move {
            let (stream, _) = listener.accept().await.unwrap();
            let mut connection = h2::server::handshake(stream).await.unwrap();
            let mut streams = 0;
            while let Some(Ok(_)) = connection.accept().await {
                streams += 1;
            }
            let _ = streams_tx.send(streams);
        });
        let mut connection = Connection::open(&addr, TIMEOUT, 4, None).await.unwrap();
        let error = connection.call(request(b"too long")).await.unwrap_err();
        assert_eq!(error.code(), tonic::Code::InvalidArgument);
        drop(connection);
        assert_eq!(streams_rx.await.unwrap(), 0, "no stream reached the server");
    }

    /// A connection the server closed is seen as closed, and a call on it fails as not sent,
    /// so that the caller opens a new one and may retry anything.
    #[tokio::test]
    async fn a_connection_the_server_closed_is_closed_and_refuses_as_not_sent() {
        let (listener, addr) = listener().await;
        tokio::spawn(async move {
            let (stream, _) = listener.accept().await.unwrap();
            let connection = h2::server::handshake(stream).await.unwrap();
            drop(connection);
        });
        let mut connection = Connection::open(&addr, TIMEOUT, 1024, None).await.unwrap();
        let deadline = tokio::time::Instant::now() + TIMEOUT;
        while !connection.is_closed() {
            assert!(tokio::time::Instant::now() < deadline, "the closed connection was not seen");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let error = connection.call(request(b"late")).await.unwrap_err();
        assert_eq!(error.code(), tonic::Code::Unavailable);
        assert!(was_not_sent(&error), "{}", error.message());
    }
}
