//! The HTTP/JSON API: the same operations as gRPC, so `curl` works.
//!
//! Errors are `{"code": "...", "message": "..."}` with a fitting status, plus `holder_token` or
//! `leader` where they apply. Request bodies are bounded and must not carry unknown fields.
//!
//! Lock names go in the path as they are, `/` included (`GET /v1/locks/jobs/nightly`); other
//! characters outside `A-Z a-z 0-9 - . _ ~ /` must be percent-encoded.

use crate::auth::{Access, authenticate};
use crate::error::ServiceError;
use crate::grpc::{check_fields, to_snake_case};
use crate::guarded::Guarded;
use crate::node::{AcquireRequest, ClusterView, Node, WatchItem, WatchTarget};
use crate::tls::Caller;
use axum::extract::rejection::QueryRejection;
use axum::extract::{DefaultBodyLimit, FromRequest, FromRequestParts, Path, Request, State};
use axum::http::StatusCode;
use axum::http::request::Parts;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::{Json, Router};
use futures_util::Stream;
use picket_core::{Event, LockInfo, RequestId, SessionId, SessionInfo, Wait};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use std::convert::Infallible;
use std::sync::Arc;

/// The header that names the leader's address on a `421 not_leader` answer; [`router`] adds a
/// `Location` on the leader for the same path.
pub const LEADER_HEADER: &str = "picket-leader";

/// Largest request body, in bytes.
pub const MAX_BODY_BYTES: usize = 64 * 1024;

/// The HTTP routes of a node.
pub fn router(node: Arc<Node>) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/ui", get(dashboard))
        .route("/v1/openapi.json", get(openapi))
        .route("/v1/backup", get(backup))
        .route("/v1/sessions", post(open_session).get(list_sessions))
        .route("/v1/sessions/{id}", delete(close_session))
        .route("/v1/sessions/{id}/keepalive", post(keep_alive))
        .route("/v1/sessions/{id}/revoke", post(revoke_session))
        .route("/v1/locks", get(list_locks))
        // A lock may be named "acquire" or "release": GET on these paths still reads the lock.
        .route("/v1/locks/acquire", post(acquire).get(get_lock_named_acquire))
        .route("/v1/locks/release", post(release).get(get_lock_named_release))
        .route("/v1/locks/cancel", post(cancel).get(get_lock_named_cancel))
        .route("/v1/locks/abandon", post(abandon).get(get_lock_named_abandon))
        .route("/v1/locks/{*name}", get(get_lock))
        .route("/v1/check", get(check))
        .route("/v1/watch", get(watch))
        .route("/v1/cluster", get(cluster))
        .route("/v1/cluster/members", post(add_member))
        .route("/v1/cluster/members/{id}", delete(remove_member))
        .method_not_allowed_fallback(method_not_allowed)
        .layer(axum::middleware::from_fn(locate_leader))
        .layer(axum::middleware::from_fn(refuse_cross_site))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(node)
}

/// Refuses a request that changes something when a browser says another site sent it.
///
/// The API takes JSON whatever its `Content-Type` says, so a web page could make a visitor's
/// browser POST to a node it can reach (loopback, or with the browser's client certificate)
/// without asking first. Browsers name the sender: `Sec-Fetch-Site` other than `same-origin`
/// or `none`, or an `Origin` whose host is not the node's. Clients other than browsers (curl,
/// the Rust and Python clients) send neither header and are not affected; the dashboard is
/// served by the node itself, so its calls are same-origin.
async fn refuse_cross_site(request: Request, next: axum::middleware::Next) -> Response {
    use axum::http::Method;
    let changes = !matches!(*request.method(), Method::GET | Method::HEAD | Method::OPTIONS);
    if changes && sent_by_another_site(request.headers()) {
        return ApiError::new(
            StatusCode::FORBIDDEN,
            "cross_site_request",
            "a browser sent this on behalf of another site; send it from the node's own page or a client that is not a browser",
        )
        .into_response();
    }
    next.run(request).await
}

fn sent_by_another_site(headers: &axum::http::HeaderMap) -> bool {
    let fetch_site = headers.get("sec-fetch-site").and_then(|value| value.to_str().ok());
    if fetch_site.is_some_and(|site| site != "same-origin" && site != "none") {
        return true;
    }
    let Some(origin) = headers.get(axum::http::header::ORIGIN) else { return false };
    let host = headers.get(axum::http::header::HOST).and_then(|value| value.to_str().ok());
    let origin_host =
        origin.to_str().ok().and_then(|origin| origin.split_once("://")).map(|(_, host)| host);
    origin_host.is_none() || origin_host != host
}

/// On a `421 not_leader` answer, adds `Location`: the same path and query on the leader, as a
/// network-path reference (`//leader:port/path`), so it keeps the scheme the caller used.
async fn locate_leader(request: Request, next: axum::middleware::Next) -> Response {
    let path = request.uri().path_and_query().map_or("/", |path| path.as_str()).to_owned();
    let mut response = next.run(request).await;
    let leader = response.headers().get(LEADER_HEADER).and_then(|leader| leader.to_str().ok());
    if let Some(location) = leader.and_then(|leader| format!("//{leader}{path}").parse().ok()) {
        response.headers_mut().insert(axum::http::header::LOCATION, location);
    }
    response
}

/// An error response.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    body: Value,
}

impl ApiError {
    /// An error of a request that changed nothing.
    fn new(status: StatusCode, code: &str, message: impl Into<String>) -> Self {
        let body = json!({ "code": code, "message": message.into(), "outcome": "not_applied" });
        Self { status, body }
    }
}

impl From<ServiceError> for ApiError {
    fn from(error: ServiceError) -> Self {
        let status =
            StatusCode::from_u16(error.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut api = Self::new(status, error.code(), error.to_string());
        api.body["outcome"] = json!(error.outcome());
        if let Some(token) = error.holder_token() {
            api.body["holder_token"] = json!(token);
        }
        if let Some(leader) = error.leader_addr() {
            api.body["leader"] = json!(leader);
        }
        api
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let leader = self.body["leader"].as_str().and_then(|leader| leader.parse().ok());
        let mut response = (self.status, Json(self.body)).into_response();
        if let Some(leader) = leader {
            response.headers_mut().insert(LEADER_HEADER, leader);
        }
        // RFC 9110: a 401 names the scheme that would be accepted.
        if self.status == StatusCode::UNAUTHORIZED {
            response.headers_mut().insert(
                axum::http::header::WWW_AUTHENTICATE,
                axum::http::HeaderValue::from_static("Bearer realm=\"picket\""),
            );
        }
        response
    }
}

type ApiResult<T> = Result<Json<T>, ApiError>;

/// The caller of a request, authenticated from its connection and `authorization` header
/// ([`crate::auth`]); a request that proves nobody the node knows is refused with 401 before
/// its body is read.
struct Who(Access);

impl FromRequestParts<Arc<Node>> for Who {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, node: &Arc<Node>) -> Result<Self, ApiError> {
        let caller = parts.extensions.get::<Caller>();
        let authorization =
            parts.headers.get(axum::http::header::AUTHORIZATION).map(|value| value.as_bytes());
        Ok(Self(authenticate(node.auth(), caller, authorization)?))
    }
}

/// A JSON body whose rejection is answered in the API's error format.
struct Body<T>(T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for Body<T> {
    type Rejection = ApiError;

    /// The body is read as JSON whatever its `Content-Type` says: `curl -d` sends
    /// `application/x-www-form-urlencoded`, and refusing a JSON body for its label helps nobody.
    async fn from_request(request: Request, state: &S) -> Result<Self, Self::Rejection> {
        let bytes = axum::body::Bytes::from_request(request, state).await.map_err(|rejection| {
            if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
                let advice = format!("the body is over {MAX_BODY_BYTES} bytes");
                ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, "body_too_large", advice)
            } else {
                ApiError::new(rejection.status(), "bad_request", rejection.body_text())
            }
        })?;
        serde_json::from_slice(&bytes).map(Self).map_err(|error| {
            let advice = format!("the body is not the JSON this call takes: {error}");
            ApiError::new(StatusCode::BAD_REQUEST, "bad_request", advice)
        })
    }
}

/// A path parameter whose rejection (a name that is not UTF-8 once decoded, an id that is not a
/// number) is answered in the API's error format.
struct PathParam<T>(T);

impl<S: Send + Sync, T: DeserializeOwned + Send> FromRequestParts<S> for PathParam<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        match Path::<T>::from_request_parts(parts, state).await {
            Ok(Path(value)) => Ok(Self(value)),
            Err(rejection) => Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                "bad_request",
                format!("{}; percent-encode names as UTF-8", rejection.body_text()),
            )),
        }
    }
}

/// Answers a method a path does not take, in the API's error format.
async fn method_not_allowed(method: axum::http::Method, uri: axum::http::Uri) -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        format!("{} does not take {method}; see the HTTP API in README.md", uri.path()),
    )
}

/// Query parameters whose rejection is answered in the API's error format.
struct QueryParams<T>(T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequestParts<S> for QueryParams<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        match axum::extract::Query::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Query(value)) => Ok(Self(value)),
            Err(rejection) => Err(query_rejection(&rejection)),
        }
    }
}

fn query_rejection(rejection: &QueryRejection) -> ApiError {
    ApiError::new(StatusCode::BAD_REQUEST, "bad_request", rejection.body_text())
}

fn session_path(id: &str) -> Result<SessionId, ApiError> {
    id.parse().map(SessionId).map_err(|_| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "bad_request",
            format!("{id:?} is not a session id (a positive number)"),
        )
    })
}

/// The answer to a path no route serves.
pub async fn not_found() -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "not_found",
        "no such endpoint; see the README for the HTTP API",
    )
}

/// Readiness: 200 when this node can serve (a leader is known and this node has caught up),
/// 503 with the reason otherwise. Load balancers and orchestrators route by this; `/healthz`
/// only says the process is alive.
async fn readyz(State(node): State<Arc<Node>>) -> Response {
    let view = node.cluster();
    let identity =
        json!({ "node_id": view.node_id, "role": view.role, "leader_id": view.leader_id });
    match node.readiness() {
        Ok(()) => {
            let mut body = identity;
            body["status"] = json!("ready");
            Json(body).into_response()
        }
        Err(not_ready) => {
            let mut body = identity;
            body["status"] = json!("not_ready");
            body["code"] = json!(not_ready.code());
            body["message"] = json!(not_ready.message());
            (StatusCode::SERVICE_UNAVAILABLE, Json(body)).into_response()
        }
    }
}

/// The OpenAPI description of this API, as shipped in the binary (see the test that checks it
/// against [`router`]).
const OPENAPI: &str = include_str!("openapi.json");

async fn openapi() -> Response {
    ([(axum::http::header::CONTENT_TYPE, "application/json")], OPENAPI).into_response()
}

/// The live dashboard: one page, embedded in the binary, that reads this node's own API
/// (cluster, locks, sessions, the watch stream and /metrics) with the caller's bearer token.
/// The page itself holds no data, so it needs no credentials; every call it makes does.
async fn dashboard() -> Response {
    let headers = [
        (axum::http::header::CONTENT_TYPE, "text/html; charset=utf-8"),
        (
            axum::http::header::CONTENT_SECURITY_POLICY,
            "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'",
        ),
        (axum::http::header::X_FRAME_OPTIONS, "DENY"),
    ];
    (headers, include_str!("ui/index.html")).into_response()
}

/// A backup of the lock state (see [`crate::backup`]), admins only, on the leader.
async fn backup(State(node): State<Arc<Node>>, Who(who): Who) -> Result<Response, ApiError> {
    let bytes = node.as_caller(who).backup().await?;
    let headers = [
        (axum::http::header::CONTENT_TYPE, "application/octet-stream"),
        (axum::http::header::CONTENT_DISPOSITION, "attachment; filename=\"picket.backup\""),
    ];
    Ok((headers, bytes).into_response())
}

/// Prometheus metrics (see [`crate::metrics`]). They name locks (the longest queues), so with
/// authentication on they need the `read` role over every lock.
async fn metrics(State(node): State<Arc<Node>>, Who(who): Who) -> Result<Response, ApiError> {
    who.require_prefix(crate::auth::Role::Read, "")?;
    let content_type = "application/openmetrics-text; version=1.0.0; charset=utf-8";
    let text = node.render_metrics();
    Ok(([(axum::http::header::CONTENT_TYPE, content_type)], text).into_response())
}

async fn healthz(State(node): State<Arc<Node>>) -> Json<Value> {
    let view = node.cluster();
    Json(json!({ "status": "ok", "node_id": view.node_id, "role": view.role }))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct OpenSessionBody {
    ttl_ms: u64,
    #[serde(default)]
    lock_delay_ms: u64,
}

#[derive(Serialize)]
struct SessionOpened {
    session_id: u64,
    ttl_ms: u64,
}

async fn open_session(
    State(node): State<Arc<Node>>,
    Who(who): Who,
    Body(body): Body<OpenSessionBody>,
) -> ApiResult<SessionOpened> {
    let (session, ttl_ms) =
        node.as_caller(who).open_session(body.ttl_ms, body.lock_delay_ms).await?;
    Ok(Json(SessionOpened { session_id: session.0, ttl_ms }))
}

async fn keep_alive(
    State(node): State<Arc<Node>>,
    Who(who): Who,
    PathParam(id): PathParam<String>,
) -> ApiResult<SessionOpened> {
    let session = session_path(&id)?;
    let ttl_ms = node.as_caller(who).keep_alive(session).await?;
    Ok(Json(SessionOpened { session_id: session.0, ttl_ms }))
}

async fn close_session(
    State(node): State<Arc<Node>>,
    Who(who): Who,
    PathParam(id): PathParam<String>,
) -> ApiResult<Value> {
    node.as_caller(who).close_session(session_path(&id)?).await?;
    Ok(Json(json!({})))
}

async fn revoke_session(
    State(node): State<Arc<Node>>,
    Who(who): Who,
    PathParam(id): PathParam<String>,
) -> ApiResult<Value> {
    node.as_caller(who).revoke_session(session_path(&id)?).await?;
    Ok(Json(json!({})))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ListSessionsQuery {
    after: Option<u64>,
    limit: Option<usize>,
}

#[derive(Serialize)]
struct SessionJson {
    session_id: u64,
    ttl_ms: u64,
    lock_delay_ms: u64,
    held: Vec<String>,
    waiting: Vec<String>,
}

fn session_json(info: SessionInfo) -> SessionJson {
    SessionJson {
        session_id: info.session.0,
        ttl_ms: info.ttl_ms,
        lock_delay_ms: info.lock_delay_ms,
        held: info.held,
        waiting: info.waiting,
    }
}

async fn list_sessions(
    State(node): State<Arc<Node>>,
    Who(who): Who,
    QueryParams(query): QueryParams<ListSessionsQuery>,
) -> ApiResult<Value> {
    let sessions = node
        .as_caller(who)
        .sessions(query.after.map(SessionId), query.limit.unwrap_or(usize::MAX))
        .await?;
    let sessions: Vec<SessionJson> = sessions.into_iter().map(session_json).collect();
    Ok(Json(json!({ "sessions": sessions })))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AcquireBody {
    name: String,
    session_id: u64,
    /// Absent: wait until granted; 0: try once; N: wait at most N ms.
    wait_ms: Option<u64>,
    /// The request's id within the session; a retry sends the id of the request it retries.
    /// Absent: the server picks one.
    request_id: Option<u64>,
    /// 0 for the first attempt at the request, one more for each retry.
    #[serde(default)]
    attempt: u32,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AbandonBody {
    name: String,
    session_id: u64,
    request_id: u64,
    #[serde(default)]
    attempt: u32,
}

#[derive(Serialize)]
struct Granted {
    name: String,
    token: u64,
    sequencer: String,
    already_held: bool,
}

async fn acquire(
    State(node): State<Arc<Node>>,
    Who(who): Who,
    Body(body): Body<AcquireBody>,
) -> ApiResult<Granted> {
    let wait = match body.wait_ms {
        None => Wait::Forever,
        Some(0) => Wait::Try,
        Some(wait_ms) => Wait::For { wait_ms },
    };
    let asked = AcquireRequest {
        wait,
        request: body.request_id.map(RequestId),
        attempt: body.attempt,
        principal: None,
    };
    let grant = node.as_caller(who).acquire(SessionId(body.session_id), &body.name, asked).await?;
    Ok(Json(Granted {
        name: grant.name,
        token: grant.token,
        sequencer: grant.sequencer,
        already_held: grant.already_held,
    }))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ReleaseBody {
    name: String,
    session_id: u64,
    token: u64,
}

async fn abandon(
    State(node): State<Arc<Node>>,
    Who(who): Who,
    Body(body): Body<AbandonBody>,
) -> ApiResult<Value> {
    let released_token = node
        .as_caller(who)
        .abandon(SessionId(body.session_id), &body.name, RequestId(body.request_id), body.attempt)
        .await?;
    Ok(Json(json!({ "released_token": released_token })))
}

async fn release(
    State(node): State<Arc<Node>>,
    Who(who): Who,
    Body(body): Body<ReleaseBody>,
) -> ApiResult<Value> {
    node.as_caller(who).release(SessionId(body.session_id), &body.name, body.token).await?;
    Ok(Json(json!({})))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CancelBody {
    name: String,
    session_id: u64,
}

async fn cancel(
    State(node): State<Arc<Node>>,
    Who(who): Who,
    Body(body): Body<CancelBody>,
) -> ApiResult<Value> {
    node.as_caller(who).cancel(SessionId(body.session_id), &body.name).await?;
    Ok(Json(json!({})))
}

/// A lock as JSON: holder (with its sequencer), queue, and lock-delay.
#[must_use]
pub fn lock_json(caller: &Guarded<'_>, info: &LockInfo) -> Value {
    let holder = info.holder.map(|holder| {
        json!({
            "session_id": holder.session.0,
            "token": holder.token,
            "sequencer": caller.holder_sequencer(&info.name, holder.token, holder.session),
        })
    });
    let waiters: Vec<u64> = info.waiters.iter().map(|session| session.0).collect();
    json!({
        "name": info.name,
        "holder": holder,
        "waiters": waiters,
        "delayed": info.delayed_until_ms.is_some(),
    })
}

async fn get_lock(
    State(node): State<Arc<Node>>,
    Who(who): Who,
    PathParam(name): PathParam<String>,
) -> ApiResult<Value> {
    lock_view(&node, who, &name).await
}

/// One lock as `who` may see it.
/// It carries the revision it was read at: a free lock keeps no record, so its last token is
/// not known, but every token it had is at most that revision and any later grant's is above.
async fn lock_view(node: &Arc<Node>, who: Access, name: &str) -> ApiResult<Value> {
    let caller = node.as_caller(who);
    let (info, revision) = caller.lock_at(name).await?;
    let mut view = lock_json(&caller, &info);
    view["revision"] = json!(revision);
    Ok(Json(view))
}

async fn get_lock_named_acquire(State(node): State<Arc<Node>>, Who(who): Who) -> ApiResult<Value> {
    lock_view(&node, who, "acquire").await
}

async fn get_lock_named_release(State(node): State<Arc<Node>>, Who(who): Who) -> ApiResult<Value> {
    lock_view(&node, who, "release").await
}

async fn get_lock_named_cancel(State(node): State<Arc<Node>>, Who(who): Who) -> ApiResult<Value> {
    lock_view(&node, who, "cancel").await
}

async fn get_lock_named_abandon(State(node): State<Arc<Node>>, Who(who): Who) -> ApiResult<Value> {
    lock_view(&node, who, "abandon").await
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ListLocksQuery {
    #[serde(default)]
    prefix: String,
    after: Option<String>,
    limit: Option<usize>,
}

async fn list_locks(
    State(node): State<Arc<Node>>,
    Who(who): Who,
    QueryParams(query): QueryParams<ListLocksQuery>,
) -> ApiResult<Value> {
    let caller = node.as_caller(who);
    let locks = caller
        .locks(&query.prefix, query.after.as_deref(), query.limit.unwrap_or(usize::MAX))
        .await?;
    let locks: Vec<Value> = locks.iter().map(|info| lock_json(&caller, info)).collect();
    Ok(Json(json!({ "locks": locks })))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CheckQuery {
    sequencer: String,
}

async fn check(
    State(node): State<Arc<Node>>,
    Who(who): Who,
    QueryParams(query): QueryParams<CheckQuery>,
) -> ApiResult<Value> {
    let (outcome, presented_token) = node.as_caller(who).check(&query.sequencer).await?;
    let (status, current_token) = check_fields(outcome, presented_token);
    let current_token = (current_token > 0).then_some(current_token);
    Ok(Json(json!({ "status": status, "current_token": current_token })))
}

/// A cluster view as JSON.
#[must_use]
pub fn cluster_json(view: &ClusterView) -> Value {
    let members: Vec<Value> = view
        .members
        .iter()
        .map(|(node_id, addr, voter)| json!({ "node_id": node_id, "addr": addr, "voter": voter }))
        .collect();
    json!({
        "members": members,
        "leader_id": view.leader_id,
        "leader_addr": view.leader_addr,
        "node_id": view.node_id,
        "role": view.role,
        "term": view.term,
        "commit_index": view.commit_index,
        "applied_revision": view.applied_revision,
        "applied_log_index": view.applied_log_index,
        "snapshot_log_index": view.snapshot_log_index,
        "purged_log_index": view.purged_log_index,
        "clock_gaps_total": view.clock_gaps_total,
        "clock_rate_factor": view.clock_rate_factor,
        "peer_clock_rates": view.peer_clock_rates,
    })
}

async fn cluster(State(node): State<Arc<Node>>, Who(who): Who) -> Json<Value> {
    Json(cluster_json(&node.as_caller(who).cluster()))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AddMemberBody {
    node_id: u64,
    addr: String,
}

async fn add_member(
    State(node): State<Arc<Node>>,
    Who(who): Who,
    Body(body): Body<AddMemberBody>,
) -> ApiResult<Value> {
    Ok(Json(cluster_json(&node.as_caller(who).add_member(body.node_id, body.addr).await?)))
}

async fn remove_member(
    State(node): State<Arc<Node>>,
    Who(who): Who,
    PathParam(id): PathParam<u64>,
) -> ApiResult<Value> {
    Ok(Json(cluster_json(&node.as_caller(who).remove_member(id).await?)))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WatchQuery {
    name: Option<String>,
    prefix: Option<String>,
    session_id: Option<u64>,
    /// With `session_id`: only the session's losses (see the gRPC `WatchRequest`).
    #[serde(default)]
    losses_only: bool,
}

/// A watch item as JSON, the same fields as the gRPC `WatchEvent`.
#[must_use]
pub fn watch_json(item: &WatchItem) -> Value {
    let (revision, event) = match item {
        WatchItem::Resync { revision } => return json!({ "kind": "resync", "revision": revision }),
        WatchItem::Event { revision, event } => (revision, event),
    };
    let cause = |value: &dyn std::fmt::Debug| to_snake_case(&format!("{value:?}"));
    let mut body = json!({ "revision": revision, "session_id": event.session().0 });
    if let Some(name) = event.lock_name() {
        body["name"] = json!(name);
    }
    match event {
        Event::Granted { token, .. } => {
            body["kind"] = json!("granted");
            body["token"] = json!(token);
        }
        Event::Released { token, cause: why, .. } => {
            body["kind"] = json!("released");
            body["token"] = json!(token);
            body["cause"] = json!(cause(why));
        }
        Event::Queued { position, .. } => {
            body["kind"] = json!("queued");
            body["position"] = json!(position);
        }
        Event::Cancelled { cause: why, .. } => {
            body["kind"] = json!("cancelled");
            body["cause"] = json!(cause(why));
        }
        Event::SessionEnded { cause: why, .. } => {
            body["kind"] = json!("session_ended");
            body["cause"] = json!(cause(why));
        }
        _ => body["kind"] = json!("unknown"),
    }
    body
}

async fn watch(
    State(node): State<Arc<Node>>,
    Who(who): Who,
    QueryParams(query): QueryParams<WatchQuery>,
) -> Result<Sse<impl Stream<Item = Result<SseEvent, Infallible>>>, ApiError> {
    let target = match (query.name, query.prefix, query.session_id) {
        (Some(_), None, None) | (None, Some(_), None) if query.losses_only => {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                "bad_request",
                "losses_only= applies to a session watch; give session_id= with it",
            ));
        }
        (Some(name), None, None) => WatchTarget::Lock(name),
        (None, Some(prefix), None) => WatchTarget::Prefix(prefix),
        (None, None, Some(session)) if query.losses_only => {
            WatchTarget::SessionLosses(vec![SessionId(session)])
        }
        (None, None, Some(session)) => WatchTarget::Session(SessionId(session)),
        _ => {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                "bad_request",
                "give exactly one of name=, prefix= or session_id=",
            ));
        }
    };
    let watch = node.as_caller(who).watch(target)?;
    let stream = futures_util::stream::unfold(watch, |mut watch| async move {
        let item = watch.next().await?;
        let event = match item {
            Ok(item) => SseEvent::default().event("event").data(watch_json(&item).to_string()),
            Err(error) => SseEvent::default()
                .event("error")
                .data(json!({ "code": error.code(), "message": error.to_string() }).to_string()),
        };
        Some((Ok(event), watch))
    });
    Ok(Sse::new(stream).keep_alive(KeepAlive::default()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every (method, path) [`router`] serves, read from its source: the GET handlers of lock
    /// names that collide with an operation (`get_lock_named_*`) are `GET /v1/locks/{name}`.
    fn routes_in_source() -> std::collections::BTreeSet<(String, String)> {
        let source = include_str!("http.rs");
        let start = source.find("pub fn router(").expect("the router");
        let end = start + source[start..].find("\n}\n").expect("its end");
        let mut routes = std::collections::BTreeSet::new();
        for line in source[start..end].lines().map(str::trim) {
            let Some(rest) = line.strip_prefix(".route(\"") else { continue };
            let (path, handlers) = rest.split_once('"').expect("a quoted path");
            let path = path.replace("{*", "{");
            for handler in handlers.split(['(', ')', '.', ',', ' ']) {
                if matches!(handler, "get" | "post" | "put" | "delete") {
                    routes.insert((handler.to_owned(), path.clone()));
                }
            }
            if handlers.contains("get_lock_named_") {
                routes.remove(&("get".to_owned(), path.clone()));
            }
        }
        routes
    }

    #[test]
    fn the_openapi_description_lists_exactly_the_routes_the_router_serves() {
        let description: Value = serde_json::from_str(OPENAPI).expect("the description is JSON");
        assert_eq!(description["openapi"], "3.1.0");
        let mut described = std::collections::BTreeSet::new();
        for (path, operations) in description["paths"].as_object().expect("paths") {
            for (method, operation) in operations.as_object().expect("operations") {
                assert!(operation["summary"].is_string(), "{method} {path} has a summary");
                assert!(operation["responses"]["200"].is_object(), "{method} {path}: its 200");
                described.insert((method.clone(), path.clone()));
            }
        }
        let served = routes_in_source();
        assert!(served.len() > 20, "the router's routes were read: {served:?}");
        // Every route call was read: one written over several lines would be missed.
        let source = include_str!("http.rs");
        let router = &source[source.find("pub fn router(").expect("the router")..];
        let router = &router[..router.find("\n}\n").expect("its end")];
        let calls = router.matches(".route(").count();
        let read = router.lines().filter(|line| line.trim().starts_with(".route(\"")).count();
        assert_eq!(calls, read, "write each .route(\"...\", ...) of the router on one line");
        let undescribed: Vec<_> = served.difference(&described).collect();
        let unserved: Vec<_> = described.difference(&served).collect();
        assert!(undescribed.is_empty(), "routes missing from openapi.json: {undescribed:?}");
        assert!(
            unserved.is_empty(),
            "openapi.json describes routes the router lacks: {unserved:?}"
        );
    }

    #[test]
    fn every_reference_in_the_openapi_description_resolves() {
        let description: Value = serde_json::from_str(OPENAPI).expect("the description is JSON");
        let references = OPENAPI.split("\"$ref\": \"").skip(1);
        let mut count = 0;
        for reference in references {
            let target = reference.split('"').next().expect("a reference");
            let pointer = target.strip_prefix('#').expect("a local reference");
            assert!(description.pointer(pointer).is_some(), "{target} resolves");
            count += 1;
        }
        assert!(count > 20, "references were found: {count}");
    }

    #[test]
    fn a_refused_authentication_names_the_bearer_scheme() {
        let refused: ApiError = ServiceError::Unauthenticated("no token".into()).into();
        let response = refused.into_response();
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
        assert_eq!(
            response.headers()[axum::http::header::WWW_AUTHENTICATE],
            "Bearer realm=\"picket\""
        );
        let denied: ApiError = ServiceError::PermissionDenied("not yours".into()).into();
        let response = denied.into_response();
        assert_eq!(response.status(), StatusCode::FORBIDDEN);
        assert!(!response.headers().contains_key(axum::http::header::WWW_AUTHENTICATE));
    }
}
