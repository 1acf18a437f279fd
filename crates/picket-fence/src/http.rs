//! HTTP middleware for axum services: reads the stamp from headers, verifies a token that would
//! advance the fence with the lock service, and turns refusals into structured 409 answers.
//!
//! Headers:
//!
//! | header | meaning |
//! |---|---|
//! | `Picket-Sequencer` | the grant's sequencer, e.g. `p1.34.jobs/report` (required for writes) |
//! | `Picket-Seq` | optional sequence number of this write within the grant |
//! | `Idempotency-Key` | optional; a retry with the same stamp and key gets the original outcome |
//!
//! The middleware decides what it can decide alone (malformed headers, a token of another lock,
//! a newer token that the lock service says is not current) and hands the handler a
//! [`FenceContext`]. The handler performs the admission in the same atomic step as its write,
//! for example with [`crate::FencedStore::write`], and answers a refusal with
//! [`refusal_response`]. Requests to one resource are served one at a time, from the check to
//! the handler's answer. Verification with the lock service happens before that, without
//! holding the resource: while the service is slow or down, requests that need no verification
//! are still served, and one that does fails closed (`unverified_token`) after
//! [`FenceConfig::with_verify_timeout`]. Install it with
//! `axum::middleware::from_fn_with_state(Arc::new(FenceConfig::new(..)), picket_fence::http::fence)`.

use crate::refusal::{Refusal, RefusalReason};
use crate::rule::{FenceRecord, Policy, Presented, Stamp};
use axum::extract::{Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use futures_util::future::BoxFuture;
use picket_core::{CheckOutcome, Sequencer};
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;

/// Header carrying the sequencer.
pub const SEQUENCER_HEADER: &str = "picket-sequencer";
/// Header carrying the optional per-grant sequence number.
pub const SEQ_HEADER: &str = "picket-seq";
/// Header carrying the optional idempotency key.
pub const IDEMPOTENCY_HEADER: &str = "idempotency-key";

/// Maps a request to the guarded resource it touches and that resource's policy; `None` for a
/// request the fence does not guard.
pub trait Resolve: Send + Sync + 'static {
    /// The resource and policy of `parts`, if guarded.
    fn resolve(&self, parts: &Parts) -> Option<(String, Policy)>;
}

impl<F> Resolve for F
where
    F: Fn(&Parts) -> Option<(String, Policy)> + Send + Sync + 'static,
{
    fn resolve(&self, parts: &Parts) -> Option<(String, Policy)> {
        self(parts)
    }
}

/// Reads a resource's current fence record, for deciding whether a token would advance it.
pub trait Records: Send + Sync + 'static {
    /// The record, or `None` when nothing was admitted yet.
    ///
    /// # Errors
    /// A sentence when the record cannot be read.
    fn record(&self, resource: &str) -> Result<Option<FenceRecord>, String>;
}

impl Records for crate::FencedStore {
    fn record(&self, resource: &str) -> Result<Option<FenceRecord>, String> {
        crate::FencedStore::record(self, resource).map_err(|error| error.to_string())
    }
}

/// Asks the lock service whether a sequencer is its lock's current grant (verify on advance).
pub trait GrantChecker: Send + Sync + 'static {
    /// The service's answer, or a sentence when it cannot be asked.
    fn check<'a>(&'a self, sequencer: &'a Sequencer)
    -> BoxFuture<'a, Result<CheckOutcome, String>>;
}

/// How long verify on advance waits for the lock service by default before it refuses the
/// write as unverified.
pub const DEFAULT_VERIFY_TIMEOUT: Duration = Duration::from_secs(1);

/// How the middleware guards a service.
pub struct FenceConfig {
    resolve: Box<dyn Resolve>,
    records: Arc<dyn Records>,
    checker: Option<Arc<dyn GrantChecker>>,
    verify_timeout: Duration,
    /// One lock per resource, held from the stamp's check through the handler's write, so
    /// the check and the write are one step.
    resource_locks:
        std::sync::Mutex<std::collections::BTreeMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

impl FenceConfig {
    /// Guards the requests `resolve` maps to resources, deciding advancing tokens with
    /// `checker` (verify on advance) when given.
    pub fn new(
        resolve: impl Resolve,
        records: Arc<dyn Records>,
        checker: Option<Arc<dyn GrantChecker>>,
    ) -> Self {
        Self {
            resolve: Box::new(resolve),
            records,
            checker,
            verify_timeout: DEFAULT_VERIFY_TIMEOUT,
            resource_locks: std::sync::Mutex::new(std::collections::BTreeMap::new()),
        }
    }

    /// Bounds how long verify on advance waits for the lock service; past it, the write is
    /// refused as unverified (503, `unverified_token`), so an unreachable service costs each
    /// such write at most this long.
    #[must_use]
    pub fn with_verify_timeout(mut self, verify_timeout: Duration) -> Self {
        self.verify_timeout = verify_timeout;
        self
    }

    /// The lock of one resource. Resources come from `resolve`, so their number is bounded by
    /// the service's configuration.
    fn resource_lock(&self, resource: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut locks =
            self.resource_locks.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        locks.entry(resource.to_owned()).or_default().clone()
    }

    /// Holds several resources at once, for a handler that serves a unit over them outside the
    /// middleware. Taken in name order, so two units never wait for each other in a cycle.
    pub async fn hold(&self, resources: &[String]) -> Vec<tokio::sync::OwnedMutexGuard<()>> {
        let mut names: Vec<&String> = resources.iter().collect();
        names.sort();
        names.dedup();
        let mut guards = Vec::with_capacity(names.len());
        for name in names {
            guards.push(self.resource_lock(name).lock_owned().await);
        }
        guards
    }
}

impl std::fmt::Debug for FenceConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FenceConfig")
            .field("verify", &self.checker.is_some())
            .field("verify_timeout", &self.verify_timeout)
            .finish_non_exhaustive()
    }
}

/// What the middleware hands a guarded request's handler.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FenceContext {
    /// The guarded resource.
    pub resource: String,
    /// Its policy.
    pub policy: Policy,
    /// The stamp, when the request carried one (reads may omit it).
    pub presented: Option<Presented>,
}

/// A JSON error answer in the same shape as Picket's own API.
fn error_response(status: StatusCode, code: &str, message: impl Into<String>) -> Response {
    (status, axum::Json(json!({ "code": code, "message": message.into() }))).into_response()
}

/// The structured answer to a refused write: 409 with the resource, the lock, the presented
/// stamp and the highest token, so the client can re-read the grant instead of guessing.
#[must_use]
pub fn refusal_response(refusal: &Refusal) -> Response {
    let status = match refusal.reason {
        RefusalReason::Unverified => StatusCode::SERVICE_UNAVAILABLE,
        RefusalReason::InvalidResource
        | RefusalReason::InvalidToken
        | RefusalReason::InvalidIdempotencyKey => StatusCode::BAD_REQUEST,
        _ => StatusCode::CONFLICT,
    };
    let body = json!({
        "code": refusal.reason.code(),
        "message": refusal.to_string(),
        "resource": refusal.resource,
        "lock": refusal.lock,
        "presented_lock": refusal.presented_lock,
        "presented_token": refusal.presented.token,
        "presented_seq": refusal.presented.seq,
        "highest_token": refusal.highest_token,
        "reason": refusal.reason,
    });
    (status, axum::Json(body)).into_response()
}

/// Reads the stamp headers. `Ok(None)` when no sequencer was sent.
///
/// # Errors
/// A 400 answer for a garbled header.
pub fn presented_from_headers(headers: &HeaderMap) -> Result<Option<Presented>, Response> {
    let header = |name: &str| -> Result<Option<&str>, Response> {
        headers
            .get(name)
            .map(|value| {
                value.to_str().map_err(|_| {
                    error_response(
                        StatusCode::BAD_REQUEST,
                        "bad_header",
                        format!("the {name} header is not printable ASCII"),
                    )
                })
            })
            .transpose()
    };
    let Some(sequencer) = header(SEQUENCER_HEADER)? else { return Ok(None) };
    let sequencer = Sequencer::parse(sequencer).map_err(|error| {
        error_response(StatusCode::BAD_REQUEST, "bad_sequencer", error.to_string())
    })?;
    let seq = header(SEQ_HEADER)?
        .map(|seq| {
            seq.trim().parse::<u64>().map_err(|_| {
                error_response(
                    StatusCode::BAD_REQUEST,
                    "bad_header",
                    "the picket-seq header must be a non-negative integer",
                )
            })
        })
        .transpose()?;
    let idempotency_key = header(IDEMPOTENCY_HEADER)?.map(str::to_owned);
    Ok(Some(Presented {
        lock: sequencer.name,
        stamp: Stamp { token: sequencer.token, seq },
        idempotency_key,
    }))
}

fn is_read(method: &Method) -> bool {
    matches!(*method, Method::GET | Method::HEAD)
}

/// Verify on advance: a token above the resource's highest is asked about once before it may
/// land. Tokens at or below the highest need no call: the rule decides them alone. Handlers
/// that resolve resources themselves (a unit over several resources) call this for each.
///
/// Call it *before* holding the resource. That is safe: the highest token only grows, so a
/// token at or below the highest now is never admitted as a new highest later, and a token
/// above it has been verified; whatever lands in between, the rule decides at write time. The
/// lock service is given [`FenceConfig::with_verify_timeout`] to answer.
///
/// # Errors
/// The answer to send instead: a structured refusal, or an error reading the record.
pub async fn verify_advance(
    config: &FenceConfig,
    resource: &str,
    policy: &Policy,
    presented: &Presented,
) -> Result<(), Response> {
    let Some(checker) = &config.checker else { return Ok(()) };
    let record = config.records.record(resource).map_err(|error| {
        error_response(StatusCode::INTERNAL_SERVER_ERROR, "storage_error", error)
    })?;
    let highest = record.as_ref().map_or(0, |record| record.highest_token);
    if presented.stamp.token <= highest {
        return Ok(());
    }
    let empty;
    let record = match &record {
        Some(record) => record,
        None => {
            empty = FenceRecord::empty(policy);
            &empty
        }
    };
    let sequencer = Sequencer::new(presented.lock.clone(), presented.stamp.token);
    let refuse = |reason| Refusal::new(resource, record, &presented.lock, presented.stamp, reason);
    let answer = tokio::time::timeout(config.verify_timeout, checker.check(&sequencer))
        .await
        .unwrap_or_else(|_| {
            Err(format!("no answer within {} ms", config.verify_timeout.as_millis()))
        });
    match answer {
        Ok(CheckOutcome::Current { .. }) => Ok(()),
        Ok(CheckOutcome::Superseded { current_token }) => {
            Err(refusal_response(&refuse(RefusalReason::NotCurrent { current_token })))
        }
        Ok(CheckOutcome::UnknownLock) => {
            Err(refusal_response(&refuse(RefusalReason::NotCurrent { current_token: None })))
        }
        Err(detail) => {
            tracing::warn!(%detail, "verify on advance: the lock service could not be asked");
            Err(refusal_response(&refuse(RefusalReason::Unverified)))
        }
    }
}

/// The middleware. See the module documentation.
pub async fn fence(
    State(config): State<Arc<FenceConfig>>,
    request: Request,
    next: Next,
) -> Response {
    let (mut parts, body) = request.into_parts();
    let Some((resource, policy)) = config.resolve.resolve(&parts) else {
        return next.run(Request::from_parts(parts, body)).await;
    };
    let presented = match presented_from_headers(&parts.headers) {
        Ok(presented) => presented,
        Err(response) => return response,
    };
    // Verified before the resource is held (see `verify_advance`), so a slow lock service
    // stalls only the requests that need it.
    if let Some(presented) = presented.as_ref().filter(|presented| presented.lock == policy.lock)
        && let Err(response) = verify_advance(&config, &resource, &policy, presented).await
    {
        return response;
    }
    let resource_lock = config.resource_lock(&resource);
    let _serialized = resource_lock.lock().await;
    match &presented {
        None if !is_read(&parts.method) => {
            return error_response(
                StatusCode::PRECONDITION_REQUIRED,
                "sequencer_required",
                format!(
                    "writes to {resource:?} need a {SEQUENCER_HEADER} header with a current grant of lock {:?}",
                    policy.lock
                ),
            );
        }
        Some(presented) if presented.lock != policy.lock => {
            let record = config
                .records
                .record(&resource)
                .ok()
                .flatten()
                .unwrap_or_else(|| FenceRecord::empty(&policy));
            let refusal = Refusal::new(
                &resource,
                &record,
                &presented.lock,
                presented.stamp,
                RefusalReason::WrongLock,
            );
            return refusal_response(&refusal);
        }
        Some(_) | None => {}
    }
    parts.extensions.insert(FenceContext { resource, policy, presented });
    next.run(Request::from_parts(parts, body)).await
}
