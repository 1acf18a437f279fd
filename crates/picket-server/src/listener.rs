//! Accepting connections: how many at once, how long a client may take to send a request's
//! headers, how long a connection may stay open with no request, keepalive pings on HTTP/2, and
//! a graceful stop.
//!
//! The client port serves the gRPC and HTTP/JSON APIs (gRPC also in Picket's own framing,
//! `listener/wire.rs`, told apart by its first bytes), and the peers' Raft traffic unless the
//! node has a peer port (`--peer-listen`), served by a second accept loop with a bound of its
//! own, so that clients cannot crowd peers out. Every connection
//! costs a file descriptor and a task, so a node holds at most `max_connections` at once: past
//! that it stops accepting, and further connections wait in the kernel's backlog until one
//! closes (nothing already connected is slowed). One address may hold at most
//! `max_connections_per_ip` of them: a further connection from it is closed as soon as it is
//! accepted, so one client host cannot take every place from the others. A client that opens a connection and sends
//! nothing, or sends its headers a byte at a time, could otherwise hold its place for ever: a
//! connection must send its opening (the HTTP/2 preface or an HTTP/1 request line) within
//! [`HEADER_READ_TIMEOUT`], HTTP/1 headers must arrive within it too, an HTTP/2 connection
//! whose peer stops answering pings is closed after [`KEEPALIVE_INTERVAL`] and
//! [`KEEPALIVE_TIMEOUT`] (any other, by the kernel's TCP keepalive probes after as long), and a
//! connection with no request or stream open for
//! `idle_timeout` is closed gracefully (HTTP/2 `GOAWAY`: the Rust client connects again on
//! its next call).

use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::service::TowerToHyperService;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tower::ServiceExt as _;

use crate::ServerLimits;
use crate::tls::{Caller, ServerTls};
use tokio::io::AsyncReadExt as _;
use wire::Opening;

mod direct;
mod wire;

pub(crate) use direct::DirectCalls;

/// How long an HTTP/1 client has to send a request's headers (and how long an HTTP/1
/// connection may sit idle between requests).
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// How often an idle HTTP/2 connection is pinged (and how long any connection may be silent
/// before the kernel probes it).
pub const KEEPALIVE_INTERVAL: Duration = picket_proto::wire::KEEPALIVE_IDLE;
/// How long a ping may go unanswered before the connection is closed.
pub const KEEPALIVE_TIMEOUT: Duration = picket_proto::wire::KEEPALIVE_TIMEOUT;
/// How long a stopping node waits for open connections to finish (watch streams never do).
const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);
/// How long to wait before accepting again after accepting failed (out of file descriptors).
const ACCEPT_RETRY: Duration = Duration::from_millis(50);

/// The longest opening an HTTP/2 client sends before anything else (its connection preface).
const PREFACE_BYTES: usize = 24;

/// What the connection asks for, if it sends, within [`HEADER_READ_TIMEOUT`], enough to tell
/// its protocol: the whole HTTP/2 preface, an HTTP/1 request line, or the wire protocol's
/// opening (which ends a line too).
async fn opens_in_time(stream: &tokio::net::TcpStream) -> Option<Opening> {
    let opening = async {
        let mut buffer = [0_u8; PREFACE_BYTES];
        loop {
            match stream.peek(&mut buffer).await {
                Ok(0) | Err(_) => return None,
                Ok(read) if read == PREFACE_BYTES || buffer[..read].contains(&b'\n') => {
                    return Some(Opening::of(&buffer[..read]).unwrap_or(Opening::Http));
                }
                // A partial opening: wait for more (peek returns at once while bytes wait).
                Ok(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            }
        }
    };
    tokio::time::timeout(HEADER_READ_TIMEOUT, opening).await.ok().flatten()
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

/// Where a node's listener is: serving, draining (no new requests; open ones may finish) or
/// closed (connections still open are dropped).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Phase {
    Serving,
    Draining,
    Closed,
}

/// How many requests (streams, watch streams among them) are open on one connection, and how
/// many have started in all. A request counts from its arrival until its response body has been
/// sent or dropped, so a long watch stream keeps its connection busy.
#[derive(Clone, Debug)]
struct Activity(Arc<tokio::sync::watch::Sender<Requests>>);

#[derive(Clone, Copy, Debug, Default)]
struct Requests {
    open: usize,
    started: u64,
}

impl Activity {
    fn new() -> Self {
        Self(Arc::new(tokio::sync::watch::Sender::new(Requests::default())))
    }

    fn start(&self) -> Active {
        self.0.send_modify(|requests| {
            requests.open += 1;
            requests.started += 1;
        });
        Active(self.clone())
    }

    /// Resolves once no request has been open for `idle_timeout` straight. A request that
    /// starts and ends between two looks still restarts the wait: it counts as started.
    async fn idle_for(&self, idle_timeout: Duration) {
        let mut requests = self.0.subscribe();
        loop {
            // The sender lives as long as `self`, so neither wait can fail.
            let _ = requests.wait_for(|requests| requests.open == 0).await;
            let started = requests.borrow().started;
            let busy_again = requests.wait_for(|requests| requests.started != started);
            if tokio::time::timeout(idle_timeout, busy_again).await.is_err() {
                return;
            }
        }
    }
}

/// One open request; its place in [`Activity`] is given back when it drops.
#[derive(Debug)]
struct Active(Activity);

impl Drop for Active {
    fn drop(&mut self) {
        self.0.0.send_modify(|requests| requests.open -= 1);
    }
}

/// A response body that holds its request's [`Active`] until the body is done with.
struct Tracked {
    body: axum::body::Body,
    _active: Active,
}

impl hyper::body::Body for Tracked {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        std::pin::Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.body.size_hint()
    }
}

/// What one connection is served with.
#[derive(Clone)]
struct Serving {
    app: axum::Router,
    builder: Builder<TokioExecutor>,
    idle_timeout: Duration,
    phase: tokio::sync::watch::Receiver<Phase>,
    /// Most calls open at once on one wire connection (`max_streams_per_connection`).
    max_calls: usize,
    /// Largest request message a wire call may carry.
    max_message_bytes: usize,
    /// Largest Raft message, for the connections that may send them.
    max_raft_message_bytes: usize,
    /// The calls a wire connection serves without the router: the client API's hot calls on the
    /// client port, and Raft messages where the port serves the `Raft` service.
    direct: Option<DirectCalls>,
}

/// Serves one connection until it ends, it has been idle for the idle timeout, or the node
/// closes; every request on it carries `caller` as an extension, its membership judged by the
/// TLS files in force when the request arrives (`tls`).
async fn serve_one<Io>(io: Io, serving: Serving, caller: Caller, tls: Option<Arc<ServerTls>>)
where
    Io: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let Serving { app, builder, idle_timeout, mut phase, .. } = serving;
    let activity = Activity::new();
    let tracking = activity.clone();
    let caller = Arc::new(std::sync::Mutex::new(caller));
    let service = tower::service_fn(move |mut request: http::Request<hyper::body::Incoming>| {
        let mut judged = caller.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(tls) = &tls {
            tls.judge_again(&mut judged);
        }
        request.extensions_mut().insert(judged.clone());
        drop(judged);
        let active = tracking.start();
        let app = app.clone();
        async move {
            let response = app.oneshot(request).await?;
            Ok::<_, std::convert::Infallible>(
                response.map(|body| axum::body::Body::new(Tracked { body, _active: active })),
            )
        }
    });
    let connection =
        builder.serve_connection_with_upgrades(TokioIo::new(io), TowerToHyperService::new(service));
    let mut connection = std::pin::pin!(connection);
    let mut closing = false;
    loop {
        // Before closing, a drain starts the graceful close; once closing, only the end of the
        // drain (or of the connection) matters.
        let next_phase = if closing { Phase::Closed } else { Phase::Draining };
        tokio::select! {
            ended = connection.as_mut() => {
                if let Err(error) = ended {
                    tracing::debug!(%error, "a connection ended with an error");
                }
                return;
            }
            () = activity.idle_for(idle_timeout), if !closing => {
                tracing::debug!(?idle_timeout, "closing a connection idle for the idle timeout");
                connection.as_mut().graceful_shutdown();
                closing = true;
            }
            changed = phase.wait_for(|phase| *phase >= next_phase) => {
                if closing || changed.is_err() {
                    return;
                }
                connection.as_mut().graceful_shutdown();
                closing = true;
            }
        }
    }
}

/// How a node's listener bounds its connections.
#[derive(Clone, Copy, Debug)]
pub struct ConnectionLimits {
    /// Most connections open at once; at most [`ServerLimits::MOST_CONNECTIONS`].
    pub max_connections: usize,
    /// Most connections open at once from one IP address (at least 1).
    pub max_connections_per_ip: usize,
    /// How long a connection may stay open with no request or stream open.
    pub idle_timeout: Duration,
    /// Most streams (requests, watch streams among them) open at once on one HTTP/2
    /// connection; an HTTP/1 connection carries one request at a time. A client past it waits
    /// for a stream to end (the Rust client's session watcher shares 5,000 sessions per stream).
    pub max_streams_per_connection: u32,
    /// Largest request message a call in the wire protocol may carry (the gRPC bound,
    /// [`ServerLimits::max_grpc_message_bytes`]).
    pub max_message_bytes: usize,
    /// Largest Raft message a wire connection that may send them carries (a cluster member's,
    /// or any on a node without TLS, where the `Raft` service admits everyone); 0 where the
    /// listener does not serve the `Raft` service.
    pub max_raft_message_bytes: usize,
}

/// Serves `app` on `listener` (over TLS when `tls` is given) within `limits` until `stop`
/// resolves (wire connections serve the calls `direct` takes without `app`); then stops
/// accepting and gives open connections a few seconds to finish.
///
/// # Panics
/// If `limits.max_connections` is 0 or above [`ServerLimits::MOST_CONNECTIONS`].
pub async fn serve(
    listener: TcpListener,
    app: axum::Router,
    direct: Option<DirectCalls>,
    limits: ConnectionLimits,
    tls: Option<Arc<ServerTls>>,
    stop: impl Future<Output = ()>,
) {
    let max_connections = limits.max_connections;
    assert!(
        (1..=ServerLimits::MOST_CONNECTIONS).contains(&max_connections),
        "a node accepts from 1 to {} connections",
        ServerLimits::MOST_CONNECTIONS
    );
    let places = Arc::new(Semaphore::new(max_connections));
    let (phase, watching) = tokio::sync::watch::channel(Phase::Serving);
    let mut builder = Builder::new(TokioExecutor::new());
    builder.http1().timer(TokioTimer::new()).header_read_timeout(HEADER_READ_TIMEOUT);
    builder
        .http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(Some(KEEPALIVE_INTERVAL))
        .keep_alive_timeout(KEEPALIVE_TIMEOUT)
        .max_concurrent_streams(limits.max_streams_per_connection);
    let serving = Serving {
        app,
        builder,
        idle_timeout: limits.idle_timeout,
        phase: watching,
        max_calls: limits.max_streams_per_connection as usize,
        max_message_bytes: limits.max_message_bytes,
        max_raft_message_bytes: limits.max_raft_message_bytes,
        direct,
    };
    let per_ip = Arc::new(PerIp::default());
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
        let Some(ip_place) = per_ip.take(remote.ip(), limits.max_connections_per_ip) else {
            // Closed at once: its place goes back to the others.
            continue;
        };
        // Without TCP_NODELAY, HTTP/2's small frames wait for delayed ACKs (about 40 ms per
        // request on Linux loopback).
        if let Err(error) = stream.set_nodelay(true) {
            tracing::debug!(%error, "cannot set TCP_NODELAY");
        }
        // The wire protocol has no ping: a client host gone silent is found by the kernel's
        // probes (or its unacknowledged data), after as long as HTTP/2's unanswered ping takes.
        if let Err(error) = picket_proto::wire::keep_alive(&stream) {
            tracing::debug!(%error, "cannot turn on TCP keepalive");
        }
        let serving = serving.clone();
        let tls = tls.clone();
        tokio::spawn(async move {
            accept_one(stream, remote, serving, tls).await;
            drop(ip_place);
            drop(place);
        });
    }
    drop(listener);
    phase.send_replace(Phase::Draining);
    // Every connection gives its place back when it ends, so all places back means all closed.
    let all = u32::try_from(max_connections).expect("bounded by ServerLimits::MOST_CONNECTIONS");
    if tokio::time::timeout(DRAIN_TIMEOUT, places.acquire_many(all)).await.is_err() {
        tracing::debug!("connections still open after the drain timeout are dropped");
    }
    phase.send_replace(Phase::Closed);
}

/// Connections open per remote IP address (per [`client_host`]: an IPv6 /64 counts as one
/// address). An address has an entry only while it has a connection open, so the table holds
/// at most as many entries as the listener has places.
#[derive(Debug, Default)]
struct PerIp {
    open: std::sync::Mutex<std::collections::HashMap<std::net::IpAddr, IpCount>>,
}

#[derive(Debug, Default)]
struct IpCount {
    open: usize,
    /// Whether a refusal was logged since the address was last below its bound.
    refusal_logged: bool,
}

impl PerIp {
    /// A place for one more connection from `ip`, or `None` when its host has `max` open.
    fn take(self: &Arc<Self>, ip: std::net::IpAddr, max: usize) -> Option<IpPlace> {
        let ip = client_host(ip);
        let mut open = self.open.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let count = open.entry(ip).or_default();
        if count.open >= max {
            if !count.refusal_logged {
                count.refusal_logged = true;
                tracing::warn!(
                    %ip,
                    max,
                    "a client address has --max-connections-per-ip connections open; further \
                     ones from it are closed at once until one of them closes (raise the flag \
                     when many clients share one address, behind a NAT or a proxy)"
                );
            }
            return None;
        }
        count.open += 1;
        Some(IpPlace { table: self.clone(), ip })
    }
}

/// The host a connection comes from, for the per-address bound: an IPv4 address (also when it
/// comes mapped into IPv6), or an IPv6 address's /64 prefix. One IPv6 host is commonly given a
/// whole /64, and could otherwise take every place of the node from as many addresses (found
/// in a hostile-input audit).
pub(crate) fn client_host(ip: std::net::IpAddr) -> std::net::IpAddr {
    match ip {
        std::net::IpAddr::V4(_) => ip,
        std::net::IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => std::net::IpAddr::V4(v4),
            None if v6.is_loopback() => ip,
            None => {
                let prefix = u128::from(v6) & !u128::from(u64::MAX);
                std::net::IpAddr::V6(std::net::Ipv6Addr::from(prefix))
            }
        },
    }
}

/// One connection's place in its address's count; given back when dropped.
struct IpPlace {
    table: Arc<PerIp>,
    ip: std::net::IpAddr,
}

impl Drop for IpPlace {
    fn drop(&mut self) {
        let mut open = self.table.open.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(count) = open.get_mut(&self.ip) {
            count.open -= 1;
            count.refusal_logged = false;
            if count.open == 0 {
                open.remove(&self.ip);
            }
        }
    }
}

/// Resolves once the listener drains (or is gone).
async fn draining(mut phase: tokio::sync::watch::Receiver<Phase>) {
    let _ = phase.wait_for(|phase| *phase >= Phase::Draining).await;
}

/// Checks a new connection's opening (and its TLS handshake) in time, then serves it. A drain
/// ends a connection still opening at once: it has asked for nothing yet, and a silent one
/// would otherwise hold the stop for the whole drain timeout.
async fn accept_one(
    stream: tokio::net::TcpStream,
    remote: std::net::SocketAddr,
    serving: Serving,
    tls: Option<Arc<ServerTls>>,
) {
    let Some(tls) = tls else {
        // hyper reads the first bytes (to tell HTTP/1 from HTTP/2) without a timer; a
        // connection that sends nothing, or a few bytes and then nothing, is closed here.
        let opened = tokio::select! {
            opened = opens_in_time(&stream) => opened,
            () = draining(serving.phase.clone()) => None,
        };
        let caller = Caller { remote: Some(remote), ..Caller::default() };
        match opened {
            Some(Opening::Http) => serve_one(stream, serving, caller, None).await,
            Some(Opening::Wire) => {
                let mut stream = stream;
                // Peeked whole already: the read returns at once.
                let mut opening = [0_u8; picket_proto::wire::MAGIC.len()];
                if stream.read_exact(&mut opening).await.is_ok() {
                    wire::serve_wire(stream, serving, caller, None).await;
                }
            }
            None => {}
        }
        return;
    };
    let loaded = tls.current();
    let handshake = tokio::time::timeout(HEADER_READ_TIMEOUT, loaded.acceptor().accept(stream));
    let handshake = tokio::select! {
        handshake = handshake => handshake,
        () = draining(serving.phase.clone()) => return,
    };
    match handshake {
        Ok(Ok(stream)) => {
            let certificates = stream.get_ref().1.peer_certificates();
            let caller = loaded.caller(remote, certificates);
            // Past the handshake the opening is encrypted, so it cannot be peeked at: the
            // first read carries the deadline instead.
            let mut stream = OpensInTime::new(stream);
            // The whole opening within the deadline, not only its first byte.
            let sniffing = tokio::time::timeout(HEADER_READ_TIMEOUT, wire::sniff(&mut stream));
            let opened = tokio::select! {
                opened = sniffing => opened.unwrap_or_else(|_| {
                    Err(std::io::Error::new(std::io::ErrorKind::TimedOut, "no opening in time"))
                }),
                () = draining(serving.phase.clone()) => return,
            };
            match opened {
                Ok((Opening::Wire, _)) => {
                    wire::serve_wire(stream, serving, caller, Some(tls)).await
                }
                Ok((Opening::Http, first)) => {
                    // hyper reads the opening's bytes again, before the rest of the stream.
                    let (read, write) = tokio::io::split(stream);
                    let read = std::io::Cursor::new(first).chain(read);
                    serve_one(tokio::io::join(read, write), serving, caller, Some(tls)).await;
                }
                Err(error) => tracing::debug!(%error, "a TLS connection sent no opening in time"),
            }
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

#[cfg(test)]
mod tests;
