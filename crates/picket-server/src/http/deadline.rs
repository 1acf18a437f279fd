//! Bounds on a client request's body, for HTTP/JSON and gRPC alike: a deadline, and a share of
//! the node's bytes of bodies in flight.
//!
//! The listener bounds how long a connection may take to send its opening and its HTTP/1
//! headers, but not its body: a client that declared a body (an HTTP/1 `Content-Length`, or a
//! gRPC message's length prefix, for which the decoder reserves the whole length) and then
//! trickled it, or never finished it, held its buffer, its request and its connection for as
//! long as it liked. gRPC authenticates a call only once its message is read, so this needed
//! no credentials. A client's request body must now arrive whole within [`BODY_DEADLINE`] of
//! the request's headers; past it, the body reads as failed and the request is refused.
//!
//! The deadline bounds how long a body is held, not how many are held at once: up to
//! `--max-streams-per-connection` on each of `--max-connections` connections, each reserving
//! its gRPC message's declared length (128 KiB by default) for five bytes sent. So a body
//! still on its way also holds its worst case in bytes of the node's
//! `ServerLimits::max_body_bytes_in_flight` until it has been read, of which one client host
//! may hold a quarter ([`HOST_SHARES`]); past either bound a request is refused at once (429
//! `too_many_request_bodies`), its body unread.
//!
//! Raft's messages are exempt from both: their snapshot chunks are large (a slow link must
//! not make a snapshot's install fail for ever), and under TLS a connection that is not a
//! member's is refused before its body is read; without TLS (loopback, or
//! `--insecure-plaintext`) whoever reaches the port is trusted as a peer anyway. The wire
//! protocol's frames are not requests of this app until they are whole ([`WholeBody`]): a
//! frame is bounded by its size, and a connection that sends nothing by the idle timeout.

use crate::ServerLimits;
use crate::limits::{Budget, ServerLimit};
use axum::body::{Body, Bytes, HttpBody};
use axum::extract::{Request, State};
use axum::response::{IntoResponse as _, Response};
use hyper::body::{Frame, SizeHint};
use std::collections::HashMap;
use std::future::Future as _;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::sync::OwnedSemaphorePermit;

/// How long a client request's body may take to arrive whole, from its headers: as long as
/// the headers themselves may take ([`crate::listener::HEADER_READ_TIMEOUT`]). A body is at
/// most 128 KiB by default, so this asks at least about 13 KB/s of a client (more where
/// `--max-grpc-message-bytes` is raised: 1.6 MB/s at its 16 MiB bound).
pub const BODY_DEADLINE: Duration = crate::listener::HEADER_READ_TIMEOUT;

/// The path prefix of the peers' Raft service, whose bodies have no deadline here.
const RAFT_PATHS: &str = "/picket.v1.Raft/";

/// The path prefix of the HTTP/JSON API, whose bodies are read as they arrive (no reservation
/// by their declared length) and at most `max_http_body_bytes` of them.
const HTTP_API_PATHS: &str = "/v1/";

/// A gRPC message's length prefix.
const GRPC_PREFIX_BYTES: usize = 5;

/// Marks a request whose body is already whole in memory (a wire-protocol call, read as one
/// frame): it holds no place among the bodies in flight, and has no deadline to meet.
#[derive(Clone, Copy, Debug)]
pub(crate) struct WholeBody;

/// One client host may hold at most this share of the node's bytes of bodies in flight (one
/// `HOST_SHARES`th), so that one host without credentials cannot take all of it and have
/// every other client's requests refused (found in review). A host is an IPv4 address or an
/// IPv6 /64, as for `--max-connections-per-ip`.
pub(crate) const HOST_SHARES: usize = 4;

/// What a node holds its clients' request bodies to.
#[derive(Clone, Debug)]
pub(crate) struct BodyBounds {
    in_flight: Arc<Budget>,
    per_host: Arc<PerHost>,
    max_bytes_in_flight: usize,
    max_http_body_bytes: usize,
    max_grpc_message_bytes: usize,
}

impl BodyBounds {
    pub(crate) fn new(limits: &ServerLimits) -> Self {
        let max_bytes_in_flight = limits.max_body_bytes_in_flight;
        Self {
            in_flight: Arc::new(Budget::new(ServerLimit::BodyBytesInFlight, max_bytes_in_flight)),
            per_host: Arc::default(),
            max_bytes_in_flight,
            max_http_body_bytes: limits.max_http_body_bytes,
            max_grpc_message_bytes: limits.max_grpc_message_bytes,
        }
    }

    /// Why `limits` would leave a client host's share smaller than the largest charge, if
    /// they would: bodies of that size would always be refused.
    pub(crate) fn misfit(limits: &ServerLimits) -> Option<String> {
        let bounds = Self::new(limits);
        let largest = bounds.largest_charge();
        (bounds.max_per_host() < largest).then(|| {
            format!(
                "--max-body-bytes-in-flight {} leaves one client host {} bytes of it (a \
                 {HOST_SHARES}th), less than one request body may hold ({largest} bytes: the \
                 larger of --max-grpc-message-bytes plus 5 and --max-http-body-bytes); give it \
                 at least {}",
                limits.max_body_bytes_in_flight,
                bounds.max_per_host(),
                largest * HOST_SHARES
            )
        })
    }

    fn largest_charge(&self) -> usize {
        self.max_http_body_bytes.max(self.max_grpc_message_bytes + GRPC_PREFIX_BYTES)
    }

    fn max_per_host(&self) -> usize {
        self.max_bytes_in_flight / HOST_SHARES
    }

    /// The bytes a request's body may come to hold while it is read: an HTTP/JSON body its
    /// declared length (hyper holds a body to it) up to the HTTP bound; anything else, a gRPC
    /// message whose declared length its decoder reserves, the larger of the two bounds. At
    /// least 1, and at most a host's share (which [`Self::misfit`] keeps above the bounds).
    fn charge(&self, request: &Request) -> u32 {
        let most = if request.uri().path().starts_with(HTTP_API_PATHS) {
            let declared = request
                .headers()
                .get(axum::http::header::CONTENT_LENGTH)
                .and_then(|length| length.to_str().ok()?.parse::<usize>().ok());
            declared
                .map_or(self.max_http_body_bytes, |declared| declared.min(self.max_http_body_bytes))
        } else {
            self.largest_charge()
        };
        let charge = most.min(self.max_per_host()).max(1);
        u32::try_from(charge).expect("a body's bound is at most 16 MiB")
    }

    /// Places for `request`'s body: its host's share first, then the node's.
    fn take(&self, request: &Request) -> Result<BodyPlace, crate::ServiceError> {
        let charge = self.charge(request);
        let host = request
            .extensions()
            .get::<crate::tls::Caller>()
            .and_then(|caller| caller.remote)
            .map(|remote| crate::listener::client_host(remote.ip()));
        let host = match host {
            Some(host) => Some(self.per_host.take(host, charge as usize, self.max_per_host())?),
            None => None,
        };
        Ok(BodyPlace { _node: self.in_flight.take_many(charge)?, _host: host })
    }
}

/// What a body on its way holds until it has been read: places among the node's bytes and
/// among its host's.
#[derive(Debug)]
struct BodyPlace {
    _node: OwnedSemaphorePermit,
    _host: Option<HostPlace>,
}

/// Bytes of bodies on their way, per client host. A host has an entry only while it holds
/// some, so the table holds at most as many entries as there are bodies on their way.
#[derive(Debug, Default)]
struct PerHost {
    held: std::sync::Mutex<HashMap<IpAddr, usize>>,
}

impl PerHost {
    fn take(
        self: &Arc<Self>,
        host: IpAddr,
        bytes: usize,
        max: usize,
    ) -> Result<HostPlace, crate::ServiceError> {
        let mut held = self.held.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let taken = held.get(&host).copied().unwrap_or(0);
        if taken + bytes > max {
            return Err(crate::ServiceError::Exhausted {
                limit: ServerLimit::BodyBytesInFlightPerHost,
                max,
            });
        }
        held.insert(host, taken + bytes);
        Ok(HostPlace { per_host: self.clone(), host, bytes })
    }
}

/// A host's place among [`PerHost`]'s bytes, given back when dropped.
#[derive(Debug)]
struct HostPlace {
    per_host: Arc<PerHost>,
    host: IpAddr,
    bytes: usize,
}

impl Drop for HostPlace {
    fn drop(&mut self) {
        let mut held = self.per_host.held.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(taken) = held.get_mut(&self.host) {
            *taken = taken.saturating_sub(self.bytes);
            if *taken == 0 {
                held.remove(&self.host);
            }
        }
    }
}

/// Gives the request's body [`BODY_DEADLINE`] to arrive, and a place among the node's bodies
/// in flight while it does, unless it is a Raft message or whole already.
pub(crate) async fn body_bounds(
    State(bounds): State<BodyBounds>,
    request: Request,
    next: axum::middleware::Next,
) -> Response {
    // A request with no body left to come (a GET, nearly) needs no wrapper.
    if request.body().is_end_stream()
        || request.uri().path().starts_with(RAFT_PATHS)
        || request.extensions().get::<WholeBody>().is_some()
    {
        return next.run(request).await;
    }
    let place = match bounds.take(&request) {
        Ok(place) => place,
        Err(refusal) => return refused(&request, refusal),
    };
    let request = request.map(|body| Body::new(DeadlineBody::new(body, BODY_DEADLINE, place)));
    next.run(request).await
}

/// The refusal of a request past a bound, in its API's own form.
fn refused(request: &Request, error: crate::ServiceError) -> Response {
    tracing::debug!(%error, path = request.uri().path(), "refusing a request before its body");
    if request.uri().path().starts_with(HTTP_API_PATHS) {
        super::ApiError::from(error).into_response()
    } else {
        crate::grpc::status(&error).into_http()
    }
}

/// Why a request body was cut short.
#[derive(Debug, thiserror::Error)]
#[error(
    "the request's body did not arrive within {0:?} of its headers; send it whole at once, or on a faster link"
)]
pub struct BodyTooSlow(Duration);

/// A request body that fails once `deadline` has passed without its end, and holds its place
/// among the node's bodies in flight until its end (or its failure, or its drop).
struct DeadlineBody {
    inner: Body,
    limit: Duration,
    /// Made when the body is first found waiting: a body that arrives with its headers (nearly
    /// every one) never starts a timer.
    deadline: Option<Pin<Box<tokio::time::Sleep>>>,
    started: tokio::time::Instant,
    place: Option<BodyPlace>,
}

impl DeadlineBody {
    fn new(inner: Body, limit: Duration, place: BodyPlace) -> Self {
        let started = tokio::time::Instant::now();
        Self { inner, limit, deadline: None, started, place: Some(place) }
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
            // Read whole, or failed: what it held is the decoder's now, sized by what came.
            if !matches!(frame, Some(Ok(_))) || this.inner.is_end_stream() {
                this.place = None;
            }
            return Poll::Ready(frame);
        }
        let at = this.started + this.limit;
        let deadline = this.deadline.get_or_insert_with(|| Box::pin(tokio::time::sleep_until(at)));
        if deadline.as_mut().poll(cx).is_ready() {
            this.place = None;
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
    use axum::routing::post;
    use http_body_util::BodyExt as _;
    use tower::ServiceExt as _;

    fn place() -> BodyPlace {
        let node = Arc::new(tokio::sync::Semaphore::new(1)).try_acquire_owned().unwrap();
        BodyPlace { _node: node, _host: None }
    }

    /// A body that never ends fails at the deadline, not before; one that is there at once
    /// reads whole.
    #[tokio::test(start_paused = true)]
    async fn a_body_that_does_not_arrive_in_time_fails_and_one_that_does_reads() {
        let whole = DeadlineBody::new(Body::from("{}"), BODY_DEADLINE, place());
        assert_eq!(whole.collect().await.unwrap().to_bytes(), "{}");

        let never =
            Body::from_stream(futures_util::stream::pending::<Result<Bytes, BodyTooSlow>>());
        let started = tokio::time::Instant::now();
        let error = DeadlineBody::new(never, BODY_DEADLINE, place()).collect().await.unwrap_err();
        assert_eq!(started.elapsed(), BODY_DEADLINE);
        assert!(error.to_string().contains("did not arrive within"), "{error}");
    }

    fn bounds(max_body_bytes_in_flight: usize) -> BodyBounds {
        BodyBounds::new(&ServerLimits {
            max_body_bytes_in_flight,
            max_http_body_bytes: 64 * 1024,
            max_grpc_message_bytes: 128 * 1024,
            ..ServerLimits::default()
        })
    }

    fn post_to(path: &str, content_length: Option<usize>, body: Body) -> Request {
        let mut request = axum::http::Request::post(path);
        if let Some(length) = content_length {
            request = request.header(axum::http::header::CONTENT_LENGTH, length);
        }
        request.body(body).unwrap()
    }

    /// An HTTP/JSON body is charged its declared length (up to the HTTP bound); a gRPC one the
    /// message bound and its prefix, whatever it declares; none more than the whole budget.
    #[test]
    fn a_body_is_charged_what_it_may_come_to_hold() {
        let bounds = bounds(1 << 20);
        let charge = |path, length| bounds.charge(&post_to(path, length, Body::empty()));
        assert_eq!(charge("/v1/sessions", Some(40)), 40);
        assert_eq!(charge("/v1/sessions", Some(1 << 30)), 64 * 1024);
        assert_eq!(charge("/v1/sessions", None), 64 * 1024);
        assert_eq!(charge("/picket.v1.Picket/OpenSession", Some(40)), 128 * 1024 + 5);
        assert_eq!(charge("/picket.v1.Picket/OpenSession", None), 128 * 1024 + 5);
        // No more than a host's share.
        let small = super::tests::bounds(200 * 1024);
        assert_eq!(small.charge(&post_to("/x", None, Body::empty())), 50 * 1024);
    }

    /// A budget that leaves a host less than one body's bound is refused at start.
    #[test]
    fn a_budget_too_small_for_one_body_per_host_is_a_misfit() {
        let limits = |max_body_bytes_in_flight| ServerLimits {
            max_body_bytes_in_flight,
            max_grpc_message_bytes: 128 * 1024,
            ..ServerLimits::default()
        };
        assert_eq!(BodyBounds::misfit(&limits(4 * (128 * 1024 + 5))), None);
        let misfit = BodyBounds::misfit(&limits(4 * (128 * 1024 + 5) - 1)).expect("a misfit");
        assert!(misfit.contains("give it at least 524308"), "{misfit}");
        assert!(BodyBounds::misfit(&limits(0)).is_some());
        assert_eq!(BodyBounds::misfit(&ServerLimits::default()), None);
    }

    /// Regression (found in review): one host could take the whole budget with bodies it
    /// never sent, and have every other client's requests refused. A host holds at most a
    /// quarter; another host is still served.
    #[tokio::test]
    async fn one_host_holds_at_most_its_share() {
        let bounds = bounds(1 << 20);
        let from = |host: [u8; 4], path: &str| {
            let mut request = post_to(path, None, Body::empty());
            request.extensions_mut().insert(crate::tls::Caller {
                remote: Some(std::net::SocketAddr::from((host, 4000))),
                tls: false,
                member: false,
                certificate: None,
                judged_by: 0,
            });
            request
        };
        let grpc = "/picket.v1.Picket/OpenSession";
        let first = bounds.take(&from([10, 0, 0, 1], grpc)).expect("a place");
        let _second = bounds.take(&from([10, 0, 0, 1], "/v1/sessions")).expect("a place");
        let refused = bounds.take(&from([10, 0, 0, 1], grpc)).expect_err("past its share");
        assert_eq!(refused.code(), picket_core::ErrorCode::TooManyRequestBodies);
        assert!(refused.to_string().contains("from this client's host"), "{refused}");
        let _other = bounds.take(&from([10, 0, 0, 2], grpc)).expect("another host's place");
        drop(first);
        let _again = bounds.take(&from([10, 0, 0, 1], grpc)).expect("its place back");
        assert_eq!(bounds.per_host.held.lock().unwrap().len(), 2, "one entry per host");
    }

    /// Bodies still on their way hold their places; past the budget a request is refused at
    /// once, in its API's form, and a body read whole gives its place back.
    #[tokio::test]
    async fn bodies_on_their_way_hold_the_budget_and_one_past_it_is_refused() {
        // Room for four gRPC bodies and 1 KiB more, not five (and each host's share fits one);
        // requests without a caller's address count against the node's bound alone.
        const GRPC: usize = 128 * 1024 + 5;
        let bounds = bounds(4 * GRPC + 1024);
        let app = axum::Router::new()
            .route("/v1/read", post(|body: Bytes| async move { body.len().to_string() }))
            .route(
                "/picket.v1.Picket/OpenSession",
                post(|body: Bytes| async move { body.len().to_string() }),
            )
            .layer(axum::middleware::from_fn_with_state(bounds.clone(), body_bounds));
        let mut senders = Vec::new();
        let mut waiting = Vec::new();
        for _ in 0..4 {
            let (sender, receiver) = tokio::sync::mpsc::channel::<Result<Bytes, BodyTooSlow>>(1);
            let chunks = futures_util::stream::unfold(receiver, |mut receiver| async move {
                receiver.recv().await.map(|chunk| (chunk, receiver))
            });
            let body = Body::from_stream(chunks);
            let request = post_to("/picket.v1.Picket/OpenSession", None, body);
            waiting.push(tokio::spawn(app.clone().oneshot(request)));
            senders.push(sender);
        }
        let taken = |bytes: usize| {
            let bounds = bounds.clone();
            let held = async move {
                while bounds.in_flight.taken() != bytes {
                    tokio::task::yield_now().await;
                }
            };
            tokio::time::timeout(Duration::from_secs(10), held)
        };
        taken(4 * GRPC).await.expect("the four bodies hold their places");

        let grpc =
            app.clone().oneshot(post_to("/picket.v1.Picket/OpenSession", None, Body::from("x")));
        let grpc = grpc.await.unwrap();
        assert_eq!(grpc.headers()["grpc-status"], "8", "RESOURCE_EXHAUSTED: {grpc:?}");
        let http = app.clone().oneshot(post_to("/v1/read", None, Body::from("x"))).await.unwrap();
        assert_eq!(http.status(), 429);
        let refusal = http.into_body().collect().await.unwrap().to_bytes();
        let refusal: serde_json::Value = serde_json::from_slice(&refusal).unwrap();
        assert_eq!(refusal["code"], "too_many_request_bodies", "{refusal}");
        // A small body declared as such still fits beside them.
        let small = app.clone().oneshot(post_to("/v1/read", Some(2), Body::from("{}"))).await;
        assert_eq!(small.unwrap().status(), 200);

        // One body arrives whole: its request is answered and its place is free again.
        senders[0].send(Ok(Bytes::from_static(b"hello"))).await.unwrap();
        drop(senders.remove(0));
        let answered = waiting.remove(0).await.unwrap().unwrap();
        assert_eq!(answered.status(), 200);
        assert_eq!(bounds.in_flight.taken(), 3 * GRPC);
        let again = app.clone().oneshot(post_to("/v1/read", None, Body::from("x"))).await.unwrap();
        assert_eq!(again.status(), 200);

        // Requests dropped with their bodies unread give their places back too.
        for request in waiting {
            request.abort();
        }
        taken(0).await.expect("every place back");
    }

    /// A wire call's body is whole in memory already: it takes no place, and is not refused
    /// when the budget is full.
    #[tokio::test]
    async fn a_whole_body_takes_no_place() {
        let bounds = bounds(64 * 1024);
        let _all = bounds.in_flight.take_many(64 * 1024).unwrap();
        let app = axum::Router::new()
            .route(
                "/picket.v1.Picket/OpenSession",
                post(|body: Bytes| async move { body.len().to_string() }),
            )
            .layer(axum::middleware::from_fn_with_state(bounds.clone(), body_bounds));
        let mut request = post_to("/picket.v1.Picket/OpenSession", None, Body::from("x"));
        request.extensions_mut().insert(WholeBody);
        assert_eq!(app.oneshot(request).await.unwrap().status(), 200);
    }
}
