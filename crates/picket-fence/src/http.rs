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
//! [`FenceConfig::with_verify_timeout`]. A verification that aged past that bound while the
//! request waited for the resource is done again ([`verify_then_hold`]). Install it with
//! `axum::middleware::from_fn_with_state(Arc::new(FenceConfig::new(..)), picket_fence::http::fence)`.

use crate::refusal::{Refusal, RefusalReason};
use crate::rule::{FenceRecord, Policy, Presented, Stamp};
use axum::extract::{Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use futures_util::future::BoxFuture;
use picket_core::{CheckOutcome, Sequencer, SequencerKeys, VerifyError};
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// Any error a [`Records`] or [`GrantChecker`] implementation meets, kept with its source chain.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Why a fence record could not be read; the write is refused as a storage error.
#[derive(Debug, thiserror::Error)]
#[error("the fence record of {resource:?} cannot be read: {cause}")]
pub struct RecordsError {
    /// The resource whose record was asked for.
    pub resource: String,
    /// What the storage said.
    pub cause: BoxError,
}

/// Why the lock service could not say whether a sequencer is current; the write is refused as
/// unverified (fail closed).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CheckError {
    /// No answer came within the verification bound.
    #[error("the lock service gave no answer within {timeout_ms} ms")]
    Timeout {
        /// The bound ([`FenceConfig::with_verify_timeout`]).
        timeout_ms: u128,
    },
    /// The lock service could not be reached, or refused the question.
    #[error("the lock service could not be asked: {0}")]
    Unreachable(BoxError),
}

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
    /// [`RecordsError`] when the record cannot be read.
    fn record(&self, resource: &str) -> Result<Option<FenceRecord>, RecordsError>;
}

impl Records for crate::FencedStore {
    fn record(&self, resource: &str) -> Result<Option<FenceRecord>, RecordsError> {
        crate::FencedStore::record(self, resource)
            .map_err(|error| RecordsError { resource: resource.to_owned(), cause: error.into() })
    }
}

/// Asks the lock service whether a sequencer is its lock's current grant (verify on advance).
pub trait GrantChecker: Send + Sync + 'static {
    /// The service's answer, or [`CheckError::Unreachable`] when it cannot be asked.
    fn check<'a>(
        &'a self,
        sequencer: &'a Sequencer,
    ) -> BoxFuture<'a, Result<CheckOutcome, CheckError>>;
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
    /// The lock service's public keys: every presented sequencer must carry a valid signature.
    keys: Option<SequencerKeys>,
    /// One lock per resource, held from the stamp's check through the handler's write, so
    /// the check and the write are one step. A resource has an entry only while a request
    /// holds or awaits it ([`ResourceHold`]), so the map holds at most as many entries as
    /// there are requests in flight, whatever names `resolve` makes up.
    resource_locks: Arc<ResourceLocks>,
}

type ResourceLocks =
    std::sync::Mutex<std::collections::BTreeMap<String, Arc<tokio::sync::Mutex<()>>>>;

/// A resource held by a request: its lock is given back when this is dropped, and the
/// resource's entry forgotten once no request holds or awaits it (found in review: entries
/// were kept for ever, one per resource name a resolver ever made, so a resolver naming a
/// resource per key grew the map with every new key a client sent).
#[derive(Debug)]
#[must_use = "the resource is held only while this lives"]
pub struct ResourceHold {
    guard: Option<tokio::sync::OwnedMutexGuard<()>>,
    name: String,
    locks: Arc<ResourceLocks>,
}

impl Drop for ResourceHold {
    fn drop(&mut self) {
        drop(self.guard.take());
        let mut locks = self.locks.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        // The map's own reference is the last: nobody holds it, and a request that awaits it
        // holds a clone (taken under this same lock).
        if locks.get(&self.name).is_some_and(|lock| Arc::strong_count(lock) == 1) {
            locks.remove(&self.name);
        }
    }
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
            keys: None,
            resource_locks: Arc::default(),
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

    /// Takes only sequencers signed by one of `keys` (for their cluster), checked before any
    /// other rule and without asking the lock service: a forged or altered sequencer, or an
    /// unsigned one, is refused with 403 `bad_signature`, even while the service is down.
    #[must_use]
    pub fn with_sequencer_keys(mut self, keys: SequencerKeys) -> Self {
        self.keys = Some(keys);
        self
    }

    /// The stamp a request presents, its sequencer's signature verified when the fence holds
    /// the lock service's public keys. `Ok(None)` when no sequencer was sent.
    ///
    /// # Errors
    /// A 400 answer for a garbled header, 403 `bad_signature` for a signature that does not
    /// verify.
    pub fn presented(&self, headers: &HeaderMap) -> Result<Option<Presented>, Response> {
        presented_from_headers(headers, self.keys.as_ref())
    }

    /// The lock of one resource, made when no request holds or awaits it.
    fn resource_lock(&self, resource: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut locks =
            self.resource_locks.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        locks.entry(resource.to_owned()).or_default().clone()
    }

    /// Holds several resources at once, for a handler that serves a unit over them outside the
    /// middleware. Taken in name order, so two units never wait for each other in a cycle.
    pub async fn hold(&self, resources: &[String]) -> Vec<ResourceHold> {
        let mut names: Vec<&String> = resources.iter().collect();
        names.sort();
        names.dedup();
        let mut held = Vec::with_capacity(names.len());
        for name in names {
            // Awaited as a hold already, so a request dropped while it waits forgets the
            // entry too.
            let mut hold = ResourceHold {
                guard: None,
                name: name.clone(),
                locks: self.resource_locks.clone(),
            };
            hold.guard = Some(self.resource_lock(name).lock_owned().await);
            held.push(hold);
        }
        held
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

/// Reads the stamp headers, and verifies the sequencer's signature with `keys` when given.
/// `Ok(None)` when no sequencer was sent.
///
/// # Errors
/// A 400 answer for a garbled header, 403 `bad_signature` for a signature that does not
/// verify.
pub fn presented_from_headers(
    headers: &HeaderMap,
    keys: Option<&SequencerKeys>,
) -> Result<Option<Presented>, Response> {
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
    let Some(text) = header(SEQUENCER_HEADER)? else { return Ok(None) };
    let malformed = |error: &dyn std::fmt::Display| {
        error_response(StatusCode::BAD_REQUEST, "bad_sequencer", error.to_string())
    };
    let sequencer = match keys {
        None => Sequencer::parse(text).map_err(|error| malformed(&error))?,
        Some(keys) => keys.verify_text(text).map_err(|error| match error {
            VerifyError::Malformed(error) => malformed(&error),
            VerifyError::Seal(error) => {
                error_response(StatusCode::FORBIDDEN, "bad_signature", error.to_string())
            }
            other => malformed(&other),
        })?,
    };
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
        request_digest: None,
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
/// lock service is given [`FenceConfig::with_verify_timeout`] to answer. Returns when the
/// service confirmed the grant, `None` when no call was needed.
///
/// # Errors
/// The answer to send instead: a structured refusal, or an error reading the record.
pub async fn verify_advance(
    config: &FenceConfig,
    resource: &str,
    policy: &Policy,
    presented: &Presented,
) -> Result<Option<Instant>, Response> {
    let Some(checker) = &config.checker else { return Ok(None) };
    let record = config.records.record(resource).map_err(|error| {
        error_response(StatusCode::INTERNAL_SERVER_ERROR, "storage_error", error.to_string())
    })?;
    let highest = record.as_ref().map_or(0, |record| record.highest_token);
    if presented.stamp.token <= highest {
        return Ok(None);
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
            Err(CheckError::Timeout { timeout_ms: config.verify_timeout.as_millis() })
        });
    match answer {
        Ok(CheckOutcome::Current { .. }) => Ok(Some(Instant::now())),
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

/// Most rounds of verifying and then waiting for the resources before a write is refused as
/// unverified.
const MAX_VERIFY_ROUNDS: usize = 3;

/// Verifies `presented` with the lock service for every resource it would advance, then holds
/// the resources (in name order). A verification older than the verification bound by the
/// time the resources are held, for a token that still advances one of them, is done again
/// (the grant may have been superseded while the request waited), at most
/// [`MAX_VERIFY_ROUNDS`] times; then the write is refused as unverified.
///
/// # Errors
/// The answer to send instead: a structured refusal, or an error reading a record.
pub async fn verify_then_hold(
    config: &FenceConfig,
    resources: &[(String, Policy)],
    presented: &Presented,
) -> Result<Vec<ResourceHold>, Response> {
    let names: Vec<String> = resources.iter().map(|(resource, _)| resource.clone()).collect();
    for _ in 0..MAX_VERIFY_ROUNDS {
        let mut oldest: Option<Instant> = None;
        for (resource, policy) in resources {
            if let Some(at) = verify_advance(config, resource, policy, presented).await? {
                oldest = Some(oldest.map_or(at, |earlier| earlier.min(at)));
            }
        }
        let held = config.hold(&names).await;
        let aged = oldest.is_some_and(|at| at.elapsed() > config.verify_timeout);
        if !aged || !advances_any(config, &names, presented) {
            return Ok(held);
        }
    }
    let (resource, policy) = resources.first().expect("a write guards at least one resource");
    let record = config
        .records
        .record(resource)
        .ok()
        .flatten()
        .unwrap_or_else(|| FenceRecord::empty(policy));
    let refusal = Refusal::new(
        resource,
        &record,
        &presented.lock,
        presented.stamp,
        RefusalReason::Unverified,
    );
    Err(refusal_response(&refusal))
}

/// Whether `presented` is above the highest token of any of `resources` (an unreadable record
/// counts as yes: verify again rather than trust an old answer).
fn advances_any(config: &FenceConfig, resources: &[String], presented: &Presented) -> bool {
    resources.iter().any(|resource| match config.records.record(resource) {
        Ok(record) => presented.stamp.token > record.map_or(0, |record| record.highest_token),
        Err(_) => true,
    })
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
    let presented = match config.presented(&parts.headers) {
        // A keyed write says at least where it goes, so a key reused for another method or
        // path is refused rather than answered as a duplicate; a handler that knows more (the
        // body) says so with `Presented::with_request`, which replaces this.
        Ok(Some(presented)) if presented.idempotency_key.is_some() => {
            let target = parts.uri.path_and_query().map_or("", |target| target.as_str());
            Some(presented.with_request(&[parts.method.as_str().as_bytes(), target.as_bytes()]))
        }
        Ok(presented) => presented,
        Err(response) => return response,
    };
    // Verified before the resource is held (see `verify_then_hold`), so a slow lock service
    // stalls only the requests that need it.
    let _serialized = match presented.as_ref().filter(|presented| presented.lock == policy.lock) {
        Some(presented) => {
            let resources = [(resource.clone(), policy.clone())];
            match verify_then_hold(&config, &resources, presented).await {
                Ok(held) => held,
                Err(response) => return response,
            }
        }
        None => config.hold(std::slice::from_ref(&resource)).await,
    };
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

#[cfg(test)]
mod tests;
