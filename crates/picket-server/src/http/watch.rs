//! Watches over HTTP: server-sent events, one JSON object per event.

use super::{ApiError, QueryParams, Who};
use crate::node::{Node, WatchItem, Watched};
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use futures_util::Stream;
use picket_core::{ErrorCode, Event, SessionId};
use serde::Deserialize;
use serde_json::{Value, json};
use std::convert::Infallible;
use std::sync::Arc;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct WatchQuery {
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
    let mut body = json!({
        "kind": event.kind_name(),
        "revision": revision,
        "session_id": event.session().0,
    });
    if let Some(name) = event.lock_name() {
        body["name"] = json!(name);
    }
    if let Some(cause) = event.cause_name() {
        body["cause"] = json!(cause);
    }
    match event {
        Event::Granted { token, .. } | Event::Released { token, .. } => {
            body["token"] = json!(token);
        }
        Event::Queued { position, .. } => body["position"] = json!(position),
        _ => {}
    }
    body
}

pub(super) async fn watch(
    State(node): State<Arc<Node>>,
    Who(who): Who,
    QueryParams(query): QueryParams<WatchQuery>,
) -> Result<Sse<impl Stream<Item = Result<SseEvent, Infallible>>>, ApiError> {
    let target = match (query.name, query.prefix, query.session_id) {
        (Some(_), None, None) | (None, Some(_), None) if query.losses_only => {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                ErrorCode::BadRequest,
                "losses_only= applies to a session watch; give session_id= with it",
            ));
        }
        (Some(name), None, None) => Watched::Lock(name),
        (None, Some(prefix), None) => Watched::Prefix(prefix),
        (None, None, Some(session)) if query.losses_only => {
            Watched::SessionLosses(vec![SessionId(session)])
        }
        (None, None, Some(session)) => Watched::Session(SessionId(session)),
        _ => {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                ErrorCode::BadRequest,
                "give exactly one of name=, prefix= or session_id=",
            ));
        }
    };
    let watch = node.as_caller(who).watch(target)?;
    let stream = futures_util::stream::unfold(watch, |mut watch| async move {
        let item = watch.next().await?;
        let event = match item {
            Ok(item) => SseEvent::default().event("event").data(watch_json(&item).to_string()),
            Err(error) => SseEvent::default().event("error").data(
                json!({ "code": error.code().as_str(), "message": error.to_string() }).to_string(),
            ),
        };
        Some((Ok(event), watch))
    });
    Ok(Sse::new(stream).keep_alive(KeepAlive::default()))
}
