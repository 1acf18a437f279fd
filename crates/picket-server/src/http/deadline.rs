//! A deadline on a client request's body, for HTTP/JSON and gRPC alike.
//!
//! The listener bounds how long a connection may take to send its opening and its HTTP/1
//! headers, but not its body: a client that declared a body (an HTTP/1 `Content-Length`, or a
//! gRPC message's length prefix, for which the decoder reserves the whole length) and then
//! trickled it, or never finished it, held its buffer, its request and its connection for as
//! long as it liked. gRPC authenticates a call only once its message is read, so this needed
//! no credentials. A client's request body must now arrive whole within [`BODY_DEADLINE`] of
//! the request's headers; past it, the body reads as failed and the request is refused.
//! Raft's messages are exempt: their snapshot chunks are large (a slow link must not make a
//! snapshot's install fail for ever), and under TLS a connection that is not a member's is
//! refused before its body is read; without TLS (loopback, or `--insecure-plaintext`)
//! whoever reaches the port is trusted as a peer anyway. The wire protocol's frames are not
//! requests of this app until they are whole: a frame is bounded by its size, and a
//! connection that sends nothing by the idle timeout.

use axum::body::{Body, Bytes, HttpBody};
use axum::extract::Request;
use axum::response::Response;
use hyper::body::{Frame, SizeHint};
use std::future::Future as _;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

/// How long a client request's body may take to arrive whole, from its headers: as long as
/// the headers themselves may take ([`crate::listener::HEADER_READ_TIMEOUT`]). A body is at
/// most 128 KiB by default, so this asks at least about 13 KB/s of a client (more where
/// `--max-grpc-message-bytes` is raised: 1.6 MB/s at its 16 MiB bound).
pub const BODY_DEADLINE: Duration = crate::listener::HEADER_READ_TIMEOUT;

/// The path prefix of the peers' Raft service, whose bodies have no deadline here.
const RAFT_PATHS: &str = "/picket.v1.Raft/";

/// Gives the request's body [`BODY_DEADLINE`] to arrive, unless it is a Raft message.
pub(crate) async fn body_deadline(request: Request, next: axum::middleware::Next) -> Response {
    // A request with no body left to come (a GET, nearly) needs no wrapper.
    if request.body().is_end_stream() || request.uri().path().starts_with(RAFT_PATHS) {
        return next.run(request).await;
    }
    let request = request.map(|body| Body::new(DeadlineBody::new(body, BODY_DEADLINE)));
    next.run(request).await
}

/// Why a request body was cut short.
#[derive(Debug, thiserror::Error)]
#[error(
    "the request's body did not arrive within {0:?} of its headers; send it whole at once, or on a faster link"
)]
pub struct BodyTooSlow(Duration);

/// A request body that fails once `deadline` has passed without its end.
struct DeadlineBody {
    inner: Body,
    limit: Duration,
    /// Made when the body is first found waiting: a body that arrives with its headers (nearly
    /// every one) never starts a timer.
    deadline: Option<Pin<Box<tokio::time::Sleep>>>,
    started: tokio::time::Instant,
}

impl DeadlineBody {
    fn new(inner: Body, limit: Duration) -> Self {
        Self { inner, limit, deadline: None, started: tokio::time::Instant::now() }
    }
}

impl HttpBody for DeadlineBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let this = &mut *self;
        if let Poll::Ready(frame) = Pin::new(&mut this.inner).poll_frame(cx) {
            return Poll::Ready(frame);
        }
        let at = this.started + this.limit;
        let deadline = this.deadline.get_or_insert_with(|| Box::pin(tokio::time::sleep_until(at)));
        if deadline.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Some(Err(axum::Error::new(BodyTooSlow(this.limit)))));
        }
        Poll::Pending
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt as _;

    /// A body that never ends fails at the deadline, not before; one that is there at once
    /// reads whole.
    #[tokio::test(start_paused = true)]
    async fn a_body_that_does_not_arrive_in_time_fails_and_one_that_does_reads() {
        let whole = DeadlineBody::new(Body::from("{}"), BODY_DEADLINE);
        assert_eq!(whole.collect().await.unwrap().to_bytes(), "{}");

        let never =
            Body::from_stream(futures_util::stream::pending::<Result<Bytes, BodyTooSlow>>());
        let started = tokio::time::Instant::now();
        let error = DeadlineBody::new(never, BODY_DEADLINE).collect().await.unwrap_err();
        assert_eq!(started.elapsed(), BODY_DEADLINE);
        assert!(error.to_string().contains("did not arrive within"), "{error}");
    }
}
