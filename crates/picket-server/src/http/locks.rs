//! Locks over HTTP: acquire, release, cancel, abandon, read, list, check a sequencer.

use super::{ApiResult, Body, PathParam, QueryParams, Who};
use crate::auth::Access;
use crate::grpc::check_fields;
use crate::guarded::Guarded;
use crate::node::{AcquireRequest, Node};
use axum::Json;
use axum::extract::State;
use picket_core::{LockInfo, RequestId, SessionId, Wait};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use std::sync::Arc;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct AcquireBody {
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
pub(super) struct AbandonBody {
    name: String,
    session_id: u64,
    request_id: u64,
    #[serde(default)]
    attempt: u32,
}

#[derive(Serialize)]
pub(super) struct Granted {
    name: String,
    token: u64,
    sequencer: String,
    already_held: bool,
}

pub(super) async fn acquire(
    State(node): State<Arc<Node>>,
    Who(who): Who,
    Body(body): Body<AcquireBody>,
) -> ApiResult<Granted> {
    let asked = AcquireRequest {
        wait: Wait::from_wait_ms(body.wait_ms),
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
pub(super) struct ReleaseBody {
    name: String,
    session_id: u64,
    token: u64,
}

pub(super) async fn abandon(
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

pub(super) async fn release(
    State(node): State<Arc<Node>>,
    Who(who): Who,
    Body(body): Body<ReleaseBody>,
) -> ApiResult<Value> {
    node.as_caller(who).release(SessionId(body.session_id), &body.name, body.token).await?;
    Ok(Json(json!({})))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct CancelBody {
    name: String,
    session_id: u64,
}

pub(super) async fn cancel(
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

pub(super) async fn get_lock(
    State(node): State<Arc<Node>>,
    Who(who): Who,
    PathParam(name): PathParam<String>,
) -> ApiResult<Value> {
    lock_view(&node, who, &name).await
}

/// One lock as `who` may see it.
/// It carries the revision it was read at: a free lock keeps no record, so its last token is
/// not known, but every token it had is at most that revision and any later grant's is above.
pub(super) async fn lock_view(node: &Arc<Node>, who: Access, name: &str) -> ApiResult<Value> {
    let caller = node.as_caller(who);
    let (info, revision) = caller.lock_at(name).await?;
    let mut view = lock_json(&caller, &info);
    view["revision"] = json!(revision);
    Ok(Json(view))
}

pub(super) async fn get_lock_named_acquire(
    State(node): State<Arc<Node>>,
    Who(who): Who,
) -> ApiResult<Value> {
    lock_view(&node, who, "acquire").await
}

pub(super) async fn get_lock_named_release(
    State(node): State<Arc<Node>>,
    Who(who): Who,
) -> ApiResult<Value> {
    lock_view(&node, who, "release").await
}

pub(super) async fn get_lock_named_cancel(
    State(node): State<Arc<Node>>,
    Who(who): Who,
) -> ApiResult<Value> {
    lock_view(&node, who, "cancel").await
}

pub(super) async fn get_lock_named_abandon(
    State(node): State<Arc<Node>>,
    Who(who): Who,
) -> ApiResult<Value> {
    lock_view(&node, who, "abandon").await
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ListLocksQuery {
    #[serde(default)]
    prefix: String,
    after: Option<String>,
    limit: Option<usize>,
}

pub(super) async fn list_locks(
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
pub(super) struct CheckQuery {
    sequencer: String,
}

pub(super) async fn check(
    State(node): State<Arc<Node>>,
    Who(who): Who,
    QueryParams(query): QueryParams<CheckQuery>,
) -> ApiResult<Value> {
    let (outcome, presented_token) = node.as_caller(who).check(&query.sequencer).await?;
    let (status, current_token) = check_fields(outcome, presented_token);
    let current_token = (current_token > 0).then_some(current_token);
    Ok(Json(json!({ "status": status, "current_token": current_token })))
}
