//! Sessions over HTTP: open, keep alive, close, revoke, list.

use super::{ApiResult, Body, PathParam, QueryParams, Who, session_path};
use crate::client_clocks::ClientReading;
use crate::node::Node;
use axum::Json;
use axum::extract::State;
use picket_core::{SessionId, SessionInfo};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use std::sync::Arc;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct OpenSessionBody {
    ttl_ms: u64,
    #[serde(default)]
    lock_delay_ms: u64,
}

#[derive(Serialize)]
pub(super) struct SessionOpened {
    session_id: u64,
    ttl_ms: u64,
}

pub(super) async fn open_session(
    State(node): State<Arc<Node>>,
    Who(who): Who,
    QueryParams(query): QueryParams<ClockQuery>,
    Body(body): Body<OpenSessionBody>,
) -> ApiResult<SessionOpened> {
    let reading = ClientReading::from_request(query.clock_id, query.clock_ms);
    let (session, ttl_ms) =
        node.as_caller(who).open_session(body.ttl_ms, body.lock_delay_ms, reading).await?;
    Ok(Json(SessionOpened { session_id: session.0, ttl_ms }))
}

/// A reading of the client's clock, optional, with a keepalive or an open:
/// `?clock_id=N&clock_ms=M` (see [`crate::client_clocks`]). Other parameters are ignored, as
/// they were before either took any: a client that sent one must not start getting 400.
#[derive(Deserialize)]
pub(super) struct ClockQuery {
    #[serde(default)]
    clock_id: u64,
    #[serde(default)]
    clock_ms: f64,
}

pub(super) async fn keep_alive(
    State(node): State<Arc<Node>>,
    Who(who): Who,
    PathParam(id): PathParam<String>,
    QueryParams(query): QueryParams<ClockQuery>,
) -> ApiResult<SessionOpened> {
    let session = session_path(&id)?;
    let reading = ClientReading::from_request(query.clock_id, query.clock_ms);
    let ttl_ms = node.as_caller(who).keep_alive(session, reading).await?;
    Ok(Json(SessionOpened { session_id: session.0, ttl_ms }))
}

pub(super) async fn close_session(
    State(node): State<Arc<Node>>,
    Who(who): Who,
    PathParam(id): PathParam<String>,
) -> ApiResult<Value> {
    node.as_caller(who).close_session(session_path(&id)?).await?;
    Ok(Json(json!({})))
}

pub(super) async fn revoke_session(
    State(node): State<Arc<Node>>,
    Who(who): Who,
    PathParam(id): PathParam<String>,
) -> ApiResult<Value> {
    node.as_caller(who).revoke_session(session_path(&id)?).await?;
    Ok(Json(json!({})))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ListSessionsQuery {
    after: Option<u64>,
    limit: Option<usize>,
}

#[derive(Serialize)]
pub(super) struct SessionJson {
    session_id: u64,
    ttl_ms: u64,
    lock_delay_ms: u64,
    held: Vec<String>,
    waiting: Vec<String>,
}

pub(super) fn session_json(info: SessionInfo) -> SessionJson {
    SessionJson {
        session_id: info.session.0,
        ttl_ms: info.ttl_ms,
        lock_delay_ms: info.lock_delay_ms,
        held: info.held,
        waiting: info.waiting,
    }
}

pub(super) async fn list_sessions(
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
