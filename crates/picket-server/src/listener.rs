//! Accepting connections: how many at once, how long a client may take to send a request's
//! headers, keepalive pings on HTTP/2, and a graceful stop.
//!
//! One port serves the gRPC and HTTP/JSON APIs and the peers' Raft traffic. Every connection
//! costs a file descriptor and a task, so a node holds at most `max_connections` at once: past
//! that it stops accepting, and further connections wait in the kernel's backlog until one
//! closes (nothing already connected is slowed). A client that opens a connection and sends
//! nothing, or sends its headers a byte at a time, could otherwise hold its place for ever:
//! HTTP/1 headers must arrive within [`HEADER_READ_TIMEOUT`] (which also closes HTTP/1
//! connections idle that long between requests), and an HTTP/2 connection whose peer stops
//! answering pings is closed after [`KEEPALIVE_INTERVAL`] and [`KEEPALIVE_TIMEOUT`].

use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

/// How long an HTTP/1 client has to send a request's headers (and how long an HTTP/1
/// connection may sit idle between requests).
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// How often an idle HTTP/2 connection is pinged.
pub const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(20);
/// How long a ping may go unanswered before the connection is closed.
pub const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a stopping node waits for open connections to finish (watch streams never do).
const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);
/// How long to wait before accepting again after accepting failed (out of file descriptors).
const ACCEPT_RETRY: Duration = Duration::from_millis(50);

/// Serves `app` on `listener`, at most `max_connections` at once, until `stop` resolves; then
/// stops accepting and gives open connections a few seconds to finish.
///
/// # Panics
/// If `max_connections` is 0.
pub async fn serve(
    listener: TcpListener,
    app: axum::Router,
    max_connections: usize,
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
        .keep_alive_timeout(KEEPALIVE_TIMEOUT);
    let mut stop = std::pin::pin!(stop);
    loop {
        let place = tokio::select! {
            place = places.clone().acquire_owned() => place.expect("the semaphore is never closed"),
            () = &mut stop => break,
        };
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
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
        let service = TowerToHyperService::new(app.clone());
        let connection =
            builder.serve_connection_with_upgrades(TokioIo::new(stream), service).into_owned();
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                tracing::debug!(%error, "a connection ended with an error");
            }
            drop(place);
        });
    }
    drop(listener);
    if tokio::time::timeout(DRAIN_TIMEOUT, graceful.shutdown()).await.is_err() {
        tracing::debug!("connections still open after the drain timeout are dropped");
    }
}
