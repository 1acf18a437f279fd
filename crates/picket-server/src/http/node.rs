//! The node and the cluster over HTTP: health, readiness, metrics, the dashboard, the OpenAPI
//! document, backups, membership.

use super::{ApiError, ApiResult, Body, PathParam, Who};
use crate::node::{ClusterView, Node};
use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};
use std::sync::Arc;

/// Readiness: 200 when this node can serve (a leader is known and this node has caught up),
/// 503 with the reason otherwise. Load balancers and orchestrators route by this; `/healthz`
/// only says the process is alive.
pub(super) async fn readyz(State(node): State<Arc<Node>>) -> Response {
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
pub(super) const OPENAPI: &str = include_str!("openapi.json");

pub(super) async fn openapi() -> Response {
    ([(axum::http::header::CONTENT_TYPE, "application/json")], OPENAPI).into_response()
}

/// The live dashboard: one page, embedded in the binary, that reads this node's own API
/// (cluster, locks, sessions, the watch stream and /metrics) with the caller's bearer token.
/// The page itself holds no data, so it needs no credentials; every call it makes does.
pub(super) async fn dashboard() -> Response {
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
pub(super) async fn backup(
    State(node): State<Arc<Node>>,
    Who(who): Who,
) -> Result<Response, ApiError> {
    let bytes = node.as_caller(who).backup().await?;
    let headers = [
        (axum::http::header::CONTENT_TYPE, "application/octet-stream"),
        (axum::http::header::CONTENT_DISPOSITION, "attachment; filename=\"picket.backup\""),
    ];
    Ok((headers, bytes).into_response())
}

/// Prometheus metrics (see [`crate::metrics`]). They name locks (the longest queues), so with
/// authentication on they need the `read` role over every lock.
pub(super) async fn metrics(
    State(node): State<Arc<Node>>,
    Who(who): Who,
) -> Result<Response, ApiError> {
    who.require_prefix(crate::auth::Role::Read, "")?;
    let content_type = "application/openmetrics-text; version=1.0.0; charset=utf-8";
    let text = node.render_metrics();
    Ok(([(axum::http::header::CONTENT_TYPE, content_type)], text).into_response())
}

pub(super) async fn healthz(State(node): State<Arc<Node>>) -> Json<Value> {
    let view = node.cluster();
    Json(json!({ "status": "ok", "node_id": view.node_id, "role": view.role }))
}

/// A cluster view as JSON.
#[must_use]
pub fn cluster_json(view: &ClusterView) -> Value {
    let members: Vec<Value> = view
        .members
        .iter()
        .map(|member| {
            let mut json = json!({
                "node_id": member.node_id,
                "addr": member.addr,
                "voter": member.voter,
            });
            if let Some(peer_addr) = &member.peer_addr {
                json["peer_addr"] = json!(peer_addr);
            }
            json
        })
        .collect();
    json!({
        "members": members,
        "voter_sets": view.voter_sets,
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
        "client_clocks_off_rate": view.client_clocks_off_rate,
        "apply_rules": view.apply_rules,
        "newest_applied_rules": view.newest_applied_rules,
        "limits": view.limits,
        "limits_refused": view.limits_refused,
        "restore": view.restore,
        "other_restore_refused_total": view.other_restore_refused_total,
        "cluster_id": view.cluster_id,
        "restored_from_cluster_id": view.restored_from_cluster_id,
        "other_cluster_refused_total": view.other_cluster_refused_total,
        "waiting_for_peers": view.waiting_for_peers,
    })
}

pub(super) async fn cluster(State(node): State<Arc<Node>>, Who(who): Who) -> Json<Value> {
    Json(cluster_json(&node.as_caller(who).cluster()))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct AddMemberBody {
    node_id: u64,
    addr: String,
    #[serde(default)]
    peer_addr: Option<String>,
}

pub(super) async fn add_member(
    State(node): State<Arc<Node>>,
    Who(who): Who,
    Body(body): Body<AddMemberBody>,
) -> ApiResult<Value> {
    Ok(Json(cluster_json(
        &node.as_caller(who).add_member(body.node_id, body.addr, body.peer_addr).await?,
    )))
}

pub(super) async fn remove_member(
    State(node): State<Arc<Node>>,
    Who(who): Who,
    PathParam(id): PathParam<u64>,
) -> ApiResult<Value> {
    Ok(Json(cluster_json(&node.as_caller(who).remove_member(id).await?)))
}
