//! The HTTP/JSON API: the same operations as gRPC, so `curl` works.
//!
//! Errors are `{"code": "...", "message": "..."}` with a fitting status, plus `holder_token` or
//! `leader` where they apply. Request bodies are bounded and must not carry unknown fields.
//!
//! Lock names go in the path as they are, `/` included (`GET /v1/locks/jobs/nightly`); other
//! characters outside `A-Z a-z 0-9 - . _ ~ /` must be percent-encoded.

mod deadline;
mod locks;
mod node;
mod sessions;
mod watch;

pub use locks::lock_json;
pub use node::cluster_json;
pub use watch::watch_json;

use crate::auth::{Access, authenticate};
use crate::error::ServiceError;
use crate::node::Node;
use crate::tls::Caller;
use axum::extract::rejection::QueryRejection;
use axum::extract::{DefaultBodyLimit, FromRequest, FromRequestParts, Path, Request};
use axum::http::StatusCode;
use axum::http::request::Parts;
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::{Json, Router};
use locks::{
    abandon, acquire, cancel, check, get_lock, get_lock_named_abandon, get_lock_named_acquire,
    get_lock_named_cancel, get_lock_named_release, list_locks, release,
};
use node::{
    add_member, backup, cluster, dashboard, healthz, metrics, openapi, readyz, remove_member,
};
use picket_core::{ErrorCode, SessionId};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use sessions::{close_session, keep_alive, list_sessions, open_session, revoke_session};
use std::sync::Arc;

pub use deadline::BODY_DEADLINE;
pub(crate) use deadline::{BodyBounds, WholeBody, body_bounds};

/// The header that names the leader's address on a `421 not_leader` answer; [`router`] adds a
/// `Location` on the leader for the same path.
pub const LEADER_HEADER: &str = "picket-leader";

/// The HTTP routes of a node, reading request bodies of at most `max_body_bytes`
/// ([`crate::ServerLimits::max_http_body_bytes`]).
pub fn router(node: Arc<Node>, max_body_bytes: usize) -> Router {
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
        .route("/v1/watch", get(watch::watch))
        .route("/v1/cluster", get(cluster))
        .route("/v1/cluster/members", post(add_member))
        .route("/v1/cluster/members/{id}", delete(remove_member))
        .method_not_allowed_fallback(method_not_allowed)
        .layer(axum::middleware::from_fn(locate_leader))
        .layer(axum::middleware::from_fn(refuse_cross_site))
        .layer(DefaultBodyLimit::max(max_body_bytes))
        .layer(axum::middleware::from_fn_with_state(node.clone(), keep_to_cluster))
        .with_state(node)
}

/// Refuses, before anything else, a request whose `picket-expect-cluster` names another cluster
/// than this node's (or than the one it was restored from, when the request also says
/// `picket-follow-restore`: that cluster's clients may go on here), and names this node's
/// cluster on every answer (`picket-cluster-id`), so a client learns it.
///
/// Session ids of two clusters coincide: a client whose endpoints mix the nodes of two clusters
/// would otherwise keep alive, release or acquire in another client's session. A node that does
/// not know its cluster's id yet (not named, or its log not replayed so far) cannot tell, and
/// refuses a request that names one as `unavailable`, so that the client tries elsewhere or
/// again; a request that names none is let through.
async fn keep_to_cluster(
    axum::extract::State(node): axum::extract::State<Arc<Node>>,
    request: Request,
    next: axum::middleware::Next,
) -> Response {
    let checked = match request.headers().get(picket_proto::EXPECT_CLUSTER_KEY) {
        Some(expected) => {
            let following = request.headers().contains_key(picket_proto::FOLLOW_RESTORE_KEY);
            node.check_expected_cluster(expected.as_bytes(), following)
        }
        None => Ok(()),
    };
    let mut response = match checked {
        Ok(()) => next.run(request).await,
        Err(error) => ApiError::from(error).into_response(),
    };
    let own = node.cluster_id();
    if let Some(value) = own.and_then(|own| axum::http::HeaderValue::from_str(&own).ok()) {
        response.headers_mut().insert(picket_proto::CLUSTER_ID_KEY, value);
    }
    response
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
            ErrorCode::CrossSiteRequest,
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
    fn new(status: StatusCode, code: ErrorCode, message: impl Into<String>) -> Self {
        let body =
            json!({ "code": code.as_str(), "message": message.into(), "outcome": "not_applied" });
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
                let advice = "the body is over this node's bound (--max-http-body-bytes, 64 KiB \
                              by default): send less"
                    .to_owned();
                ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, ErrorCode::BodyTooLarge, advice)
            } else {
                ApiError::new(rejection.status(), ErrorCode::BadRequest, rejection.body_text())
            }
        })?;
        serde_json::from_slice(&bytes).map(Self).map_err(|error| {
            let advice = format!("the body is not the JSON this call takes: {error}");
            ApiError::new(StatusCode::BAD_REQUEST, ErrorCode::BadRequest, advice)
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
                ErrorCode::BadRequest,
                format!("{}; percent-encode names as UTF-8", rejection.body_text()),
            )),
        }
    }
}

/// Answers a method a path does not take, in the API's error format.
async fn method_not_allowed(method: axum::http::Method, uri: axum::http::Uri) -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        ErrorCode::MethodNotAllowed,
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
    ApiError::new(StatusCode::BAD_REQUEST, ErrorCode::BadRequest, rejection.body_text())
}

fn session_path(id: &str) -> Result<SessionId, ApiError> {
    id.parse().map(SessionId).map_err(|_| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            ErrorCode::BadRequest,
            format!("{id:?} is not a session id (a positive number)"),
        )
    })
}

/// The answer to a path no route serves.
pub async fn not_found() -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        ErrorCode::NotFound,
        "no such endpoint; see the README for the HTTP API",
    )
}

/// Answers everything on a peer port (`--peer-listen`) that is not a Raft message.
pub async fn not_on_peer_port() -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        ErrorCode::PeerPort,
        "this is a peer port: it serves only Raft messages between cluster members; clients use \
         the node's client port (--listen)",
    )
}

#[cfg(test)]
mod tests {
    use super::node::OPENAPI;
    use super::*;

    /// Every (method, path) [`router`] serves, read from its source: the GET handlers of lock
    /// names that collide with an operation (`get_lock_named_*`) are `GET /v1/locks/{name}`.
    fn routes_in_source() -> std::collections::BTreeSet<(String, String)> {
        let source = include_str!("mod.rs");
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
        let source = include_str!("mod.rs");
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

    /// `keep_to_cluster` wraps every route: each operation says so, so that a route added
    /// later is described with it too.
    #[test]
    fn every_operation_describes_the_cluster_headers_and_the_412() {
        let description: Value = serde_json::from_str(OPENAPI).expect("the description is JSON");
        for (path, operations) in description["paths"].as_object().expect("paths") {
            for (method, operation) in operations.as_object().expect("operations") {
                let parameters = operation["parameters"].to_string();
                for parameter in ["ExpectCluster", "FollowRestore"] {
                    let reference = format!("#/components/parameters/{parameter}");
                    assert!(parameters.contains(&reference), "{method} {path}: {parameter}");
                }
                let responses = &operation["responses"];
                assert!(responses["412"].is_object(), "{method} {path}: its 412");
                let named = &responses["200"]["headers"][picket_proto::CLUSTER_ID_KEY];
                assert!(named.is_object(), "{method} {path}: its 200 names the cluster");
            }
        }
        let error = &description["components"]["responses"]["Error"];
        assert!(error["headers"][picket_proto::CLUSTER_ID_KEY].is_object(), "{error}");
        let parameters = &description["components"]["parameters"];
        assert_eq!(parameters["ExpectCluster"]["name"], picket_proto::EXPECT_CLUSTER_KEY);
        assert_eq!(parameters["FollowRestore"]["name"], picket_proto::FOLLOW_RESTORE_KEY);
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
