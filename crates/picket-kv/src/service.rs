//! The store's handlers: single-key writes and reads, units over several resources, and fence
//! registration, each checked by the fence in the same transaction as its write.

use crate::guards::Guards;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use picket_fence::http::{FenceConfig, FenceContext, SEQUENCER_HEADER, refusal_response};
use picket_fence::{Admission, FencedStore, Policy, ResourceGuard, StoreError, WriteError};
use serde::Deserialize;
use serde_json::json;
use std::sync::Arc;

#[derive(Clone)]
pub(crate) struct Kv {
    pub(crate) store: Arc<FencedStore>,
    pub(crate) guards: Arc<Guards>,
    pub(crate) config: Arc<FenceConfig>,
    pub(crate) fenced: bool,
}

fn error(status: StatusCode, code: &str, message: impl Into<String>) -> Response {
    (status, Json(json!({ "code": code, "message": message.into() }))).into_response()
}

fn write_error(failure: WriteError) -> Response {
    match failure {
        WriteError::Refused(refusal) => refusal_response(&refusal),
        WriteError::Store(too_large @ StoreError::TooLarge { .. }) => {
            error(StatusCode::PAYLOAD_TOO_LARGE, "too_large", too_large.to_string())
        }
        other => error(StatusCode::INTERNAL_SERVER_ERROR, "storage_error", other.to_string()),
    }
}

fn admission_name(admission: Admission) -> &'static str {
    match admission {
        Admission::Advanced { .. } => "advanced",
        Admission::Same => "same",
        Admission::Duplicate => "duplicate",
    }
}

fn unguarded(key: &str) -> Response {
    error(
        StatusCode::FORBIDDEN,
        "unguarded_key",
        format!("no --guard covers key {key:?}: this store only takes fenced writes"),
    )
}

async fn blocking<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(work).await.expect("a storage task does not panic")
}

pub(crate) async fn put_key(
    State(kv): State<Kv>,
    context: Option<Extension<FenceContext>>,
    Path(key): Path<String>,
    body: Bytes,
) -> Response {
    write_key(kv, context, key, Some(body)).await
}

pub(crate) async fn delete_key(
    State(kv): State<Kv>,
    context: Option<Extension<FenceContext>>,
    Path(key): Path<String>,
) -> Response {
    write_key(kv, context, key, None).await
}

async fn write_key(
    kv: Kv,
    context: Option<Extension<FenceContext>>,
    key: String,
    value: Option<Bytes>,
) -> Response {
    let Some(Extension(context)) = context else { return unguarded(&key) };
    let presented = context.presented.expect("the middleware requires a stamp for writes");
    // A retry with the same idempotency key must be the same write: a PUT of the same value to
    // the same key, or a DELETE of the same key.
    let presented = match &value {
        Some(value) => presented.with_request(&[b"PUT", key.as_bytes(), value]),
        None => presented.with_request(&[b"DELETE", key.as_bytes()]),
    };
    let token = presented.stamp.token;
    let result = blocking(move || {
        let guard = ResourceGuard { resource: &context.resource, policy: &context.policy };
        let guards: &[ResourceGuard<'_>] =
            if kv.fenced { std::slice::from_ref(&guard) } else { &[] };
        kv.store.write(guards, &presented, |unit| match &value {
            Some(value) => unit.put(&key, value).map(|()| true),
            None => unit.delete(&key),
        })
    })
    .await;
    match result {
        Ok(applied) => Json(json!({ "token": token, "admission": admission_name(applied.admission), "existed": applied.output })).into_response(),
        Err(write) => write_error(write),
    }
}

pub(crate) async fn get_key(
    State(kv): State<Kv>,
    context: Option<Extension<FenceContext>>,
    Path(key): Path<String>,
) -> Response {
    let stamped = context.and_then(|Extension(mut context)| {
        context.presented.take().map(|presented| (context, presented))
    });
    let result = blocking(move || match stamped {
        Some((context, presented)) => {
            let guard = ResourceGuard { resource: &context.resource, policy: &context.policy };
            kv.store.get_checked(guard, &presented.lock, presented.stamp.token, &key)
        }
        None => kv.store.get(&key).map_err(WriteError::Store),
    })
    .await;
    match result {
        Ok(Some(value)) => value.into_response(),
        Ok(None) => error(StatusCode::NOT_FOUND, "not_found", "no such key"),
        Err(write) => write_error(write),
    }
}

pub(crate) async fn register(
    State(kv): State<Kv>,
    context: Option<Extension<FenceContext>>,
    Path(prefix): Path<String>,
) -> Response {
    let Some(Extension(context)) = context else {
        return error(
            StatusCode::NOT_FOUND,
            "unknown_resource",
            format!("no --guard has the prefix {prefix:?}"),
        );
    };
    let presented = context.presented.expect("the middleware requires a stamp for writes");
    let result = blocking(move || {
        let guard = ResourceGuard { resource: &context.resource, policy: &context.policy };
        kv.store.register(guard, &presented.lock, presented.stamp.token)
    })
    .await;
    match result {
        Ok(()) => Json(json!({ "registered": true })).into_response(),
        Err(write) => write_error(write),
    }
}

pub(crate) async fn fence_record(State(kv): State<Kv>, Path(prefix): Path<String>) -> Response {
    match blocking(move || kv.store.record(&prefix)).await {
        Ok(record) => Json(json!({ "record": record })).into_response(),
        Err(store) => error(StatusCode::INTERNAL_SERVER_ERROR, "storage_error", store.to_string()),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "snake_case")]
enum Op {
    Put { key: String, value: String },
    Delete { key: String },
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Transaction {
    ops: Vec<Op>,
}

/// Most operations in one unit.
const MAX_UNIT_OPS: usize = 1_000;

pub(crate) async fn transaction(State(kv): State<Kv>, headers: HeaderMap, body: Bytes) -> Response {
    let unit: Transaction = match serde_json::from_slice(&body) {
        Ok(unit) => unit,
        Err(parse) => return error(StatusCode::BAD_REQUEST, "bad_request", parse.to_string()),
    };
    if unit.ops.is_empty() || unit.ops.len() > MAX_UNIT_OPS {
        return error(
            StatusCode::BAD_REQUEST,
            "bad_request",
            format!("a unit has 1 to {MAX_UNIT_OPS} operations"),
        );
    }
    let presented = match kv.config.presented(&headers) {
        Ok(Some(presented)) => presented.with_request(&[b"UNIT", &body]),
        Ok(None) => {
            return error(
                StatusCode::PRECONDITION_REQUIRED,
                "sequencer_required",
                format!("a unit needs a {SEQUENCER_HEADER} header"),
            );
        }
        Err(response) => return response,
    };
    let mut resources: Vec<(String, Policy)> = Vec::new();
    for op in &unit.ops {
        let (Op::Put { key, .. } | Op::Delete { key }) = op;
        let Some(guard) = kv.guards.for_key(key) else { return unguarded(key) };
        if !resources.iter().any(|(resource, _)| *resource == guard.0) {
            resources.push(guard);
        }
    }
    // Verified before the resources are held, so a slow lock service stalls only this unit.
    let _held = match picket_fence::http::verify_then_hold(&kv.config, &resources, &presented).await
    {
        Ok(held) => held,
        Err(response) => return response,
    };
    let token = presented.stamp.token;
    let result = blocking(move || {
        let guards: Vec<ResourceGuard<'_>> =
            resources.iter().map(|(resource, policy)| ResourceGuard { resource, policy }).collect();
        kv.store.write(&guards, &presented, |writer| {
            for op in &unit.ops {
                match op {
                    Op::Put { key, value } => writer.put(key, value.as_bytes())?,
                    Op::Delete { key } => {
                        writer.delete(key)?;
                    }
                }
            }
            Ok::<_, StoreError>(unit.ops.len())
        })
    })
    .await;
    match result {
        Ok(applied) => Json(json!({ "token": token, "admission": admission_name(applied.admission), "applied": applied.output })).into_response(),
        Err(write) => write_error(write),
    }
}
