//! Accepting connections: how many at once, how long a client may take to send a request's
//! headers, keepalive pings on HTTP/2, and a graceful stop.
//!
//! One port serves the gRPC and HTTP/JSON APIs and the peers' Raft traffic. Every connection
//! costs a file descriptor and a task, so a node holds at most `max_connections` at once: past
//! that it stops accepting, and further connections wait in the kernel's backlog until one
//! closes (nothing already connected is slowed). A client that opens a connection and sends
//! nothing, or sends its headers a byte at a time, could otherwise hold its place for ever: a
//! connection must send its opening (the HTTP/2 preface or an HTTP/1 request line) within
//! [`HEADER_READ_TIMEOUT`], HTTP/1 headers must arrive within it too, and an HTTP/2 connection
//! whose peer stops answering pings is closed after [`KEEPALIVE_INTERVAL`] and
//! [`KEEPALIVE_TIMEOUT`]. Not bounded in time: an HTTP/2 connection that answers pings but opens
//! no stream (it holds one place of `max_connections` until it closes); and peers share the
//! bound with clients.

use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tower::ServiceExt as _;

use crate::tls::{Caller, ServerTls};

/// How long an HTTP/1 client has to send a request's headers (and how long an HTTP/1
/// connection may sit idle between requests).
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// How often an idle HTTP/2 connection is pinged.
pub const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(20);
/// How long a ping may go unanswered before the connection is closed.
pub const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);
/// Most streams (requests, watch streams among them) open at once on one HTTP/2 connection;
/// an HTTP/1 connection carries one request at a time. A client past it waits for a stream to
/// end (the Rust client's session watcher shares 5,000 sessions per stream).
pub const MAX_STREAMS_PER_CONNECTION: u32 = 200;
/// How long a stopping node waits for open connections to finish (watch streams never do).
const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);
/// How long to wait before accepting again after accepting failed (out of file descriptors).
const ACCEPT_RETRY: Duration = Duration::from_millis(50);

/// The longest opening an HTTP/2 client sends before anything else (its connection preface).
const PREFACE_BYTES: usize = 24;

/// Whether the connection sends, within [`HEADER_READ_TIMEOUT`], enough to tell its protocol:
/// the whole HTTP/2 preface, or an HTTP/1 request line.
async fn opens_in_time(stream: &tokio::net::TcpStream) -> bool {
    let opening = async {
        let mut buffer = [0_u8; PREFACE_BYTES];
        loop {
            match stream.peek(&mut buffer).await {
                Ok(0) | Err(_) => return false,
                Ok(read) if read == PREFACE_BYTES || buffer[..read].contains(&b'\n') => {
                    return true;
                }
                // A partial opening: wait for more (peek returns at once while bytes wait).
                Ok(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            }
        }
    };
    tokio::time::timeout(HEADER_READ_TIMEOUT, opening).await.unwrap_or(false)
}

/// A stream whose first read must bring data within [`HEADER_READ_TIMEOUT`]: a TLS client that
/// finishes its handshake and then sends nothing is closed, as a plaintext one is.
struct OpensInTime<S> {
    inner: S,
    deadline: Option<std::pin::Pin<Box<tokio::time::Sleep>>>,
}

impl<S> OpensInTime<S> {
    fn new(inner: S) -> Self {
        Self { inner, deadline: Some(Box::pin(tokio::time::sleep(HEADER_READ_TIMEOUT))) }
    }
}

impl<S: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for OpensInTime<S> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let poll = std::pin::Pin::new(&mut self.inner).poll_read(cx, buf);
        if self.deadline.is_none() {
            return poll;
        }
        if poll.is_ready() {
            if buf.filled().len() > before {
                self.deadline = None;
            }
            return poll;
        }
        let expired =
            self.deadline.as_mut().is_some_and(|deadline| deadline.as_mut().poll(cx).is_ready());
        if expired {
            return std::task::Poll::Ready(Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "the connection sent nothing in time",
            )));
        }
        poll
    }
}

impl<S: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for OpensInTime<S> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        data: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.inner).poll_write(cx, data)
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Serves one connection until it ends; every request on it carries `caller` as an extension.
async fn serve_one<Io>(
    io: Io,
    app: axum::Router,
    caller: Caller,
    builder: &Builder<TokioExecutor>,
    watcher: hyper_util::server::graceful::Watcher,
) where
    Io: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let app = app.map_request(move |mut request: http::Request<hyper::body::Incoming>| {
        request.extensions_mut().insert(caller.clone());
        request
    });
    let service = TowerToHyperService::new(app);
    let connection = builder.serve_connection_with_upgrades(TokioIo::new(io), service);
    if let Err(error) = watcher.watch(connection.into_owned()).await {
        tracing::debug!(%error, "a connection ended with an error");
    }
}

/// Serves `app` on `listener` (over TLS when `tls` is given), at most `max_connections` at once, until `stop` resolves; then
/// stops accepting and gives open connections a few seconds to finish.
///
/// # Panics
/// If `max_connections` is 0.
pub async fn serve(
    listener: TcpListener,
    app: axum::Router,
    max_connections: usize,
    tls: Option<Arc<ServerTls>>,
    stop: impl Future<Output = ()>,
) {
    assert!(max_connections > 0, "a node accepts at least one connection");
    let places = Arc::new(Semaphore::new(max_connections));
    let graceful = GracefulShutdown::new();
    let mut builder = Builder::new(TokioExecutor::new());
    builder.http1().timer(TokioTimer::new()).header_read_timeout(HEADER_READ_TIMEOUT);
    builder
        .http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(Some(KEEPALIVE_INTERVAL))
        .keep_alive_timeout(KEEPALIVE_TIMEOUT)
        .max_concurrent_streams(MAX_STREAMS_PER_CONNECTION);
    let mut stop = std::pin::pin!(stop);
    loop {
        let place = tokio::select! {
            place = places.clone().acquire_owned() => place.expect("the semaphore is never closed"),
            () = &mut stop => break,
        };
        let (stream, remote) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    tracing::warn!(%error, "cannot accept a connection; retrying");
                    tokio::time::sleep(ACCEPT_RETRY).await;
                    continue;
                }
            },
            () = &mut stop => break,
        };
        // Without TCP_NODELAY, HTTP/2's small frames wait for delayed ACKs (about 40 ms per
        // request on Linux loopback).
        if let Err(error) = stream.set_nodelay(true) {
            tracing::debug!(%error, "cannot set TCP_NODELAY");
        }
        let app = app.clone();
        let builder = builder.clone();
        let watcher = graceful.watcher();
        let tls = tls.clone();
        tokio::spawn(async move {
            match tls {
                None => {
                    // hyper reads the first bytes (to tell HTTP/1 from HTTP/2) without a timer;
                    // a connection that sends nothing, or a few bytes and then nothing, is
                    // closed here.
                    if opens_in_time(&stream).await {
                        let caller = Caller { remote: Some(remote), ..Caller::default() };
                        serve_one(stream, app, caller, &builder, watcher).await;
                    }
                }
                Some(tls) => {
                    let loaded = tls.current();
                    let handshake = loaded.acceptor().accept(stream);
                    match tokio::time::timeout(HEADER_READ_TIMEOUT, handshake).await {
                        Ok(Ok(stream)) => {
                            let certificates = stream.get_ref().1.peer_certificates();
                            let caller = loaded.caller(remote, certificates);
                            // Past the handshake the opening is encrypted, so it cannot be
                            // peeked at: the first read carries the deadline instead.
                            let stream = OpensInTime::new(stream);
                            serve_one(stream, app, caller, &builder, watcher).await;
                        }
                        Ok(Err(error)) => {
                            tracing::info!(
                                target: "picket::audit",
                                %remote,
                                %error,
                                "refused a connection: its TLS handshake failed"
                            );
                        }
                        Err(_) => tracing::debug!("a TLS handshake did not finish in time"),
                    }
                }
            }
            drop(place);
        });
    }
    drop(listener);
    if tokio::time::timeout(DRAIN_TIMEOUT, graceful.shutdown()).await.is_err() {
        tracing::debug!("connections still open after the drain timeout are dropped");
    }
}
