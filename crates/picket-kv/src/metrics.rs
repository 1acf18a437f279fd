//! The store's Prometheus metrics at `GET /metrics`: writes admitted, by admission
//! (`advanced`, `same`, `duplicate`), and requests refused, by the refusal's code (`stale_token`,
//! `unverified_token`, `bad_signature`, ...). Counted by a layer that reads each answer's
//! JSON body, so every route and the fence's middleware are counted alike.

use axum::body::{Body, to_bytes};
use axum::extract::{Request, State};
use axum::http::{Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

/// Largest answer body read to count it; answers to writes and refusals are far smaller.
const MAX_COUNTED_BODY_BYTES: usize = 64 * 1024;
/// Most distinct codes counted; the rest count as `other`, so a buggy or hostile path cannot
/// grow the label set.
const MAX_CODES: usize = 64;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AdmissionLabels {
    admission: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RefusalLabels {
    code: String,
}

/// The store's counters.
#[derive(Debug)]
pub struct KvMetrics {
    registry: Registry,
    admitted: Family<AdmissionLabels, Counter>,
    refused: Family<RefusalLabels, Counter>,
    seen: Mutex<BTreeSet<String>>,
}

impl Default for KvMetrics {
    fn default() -> Self {
        let admitted = Family::<AdmissionLabels, Counter>::default();
        let refused = Family::<RefusalLabels, Counter>::default();
        let mut registry = Registry::with_prefix("picket_kv");
        registry.register(
            "admissions",
            "Writes admitted by the fence, by admission: advanced (a newer token), same (the current token) or duplicate (a retry answered from memory)",
            admitted.clone(),
        );
        registry.register(
            "refusals",
            "Requests refused, by code (stale_token, unverified_token, bad_signature, ...)",
            refused.clone(),
        );
        Self { registry, admitted, refused, seen: Mutex::default() }
    }
}

impl KvMetrics {
    fn count(&self, status: StatusCode, body: &serde_json::Value) {
        if status.is_success() {
            if let Some(admission) = body["admission"].as_str() {
                let admission = self.bounded(admission);
                self.admitted.get_or_create(&AdmissionLabels { admission }).inc();
            }
        } else if let Some(code) = body["code"].as_str() {
            let code = self.bounded(code);
            self.refused.get_or_create(&RefusalLabels { code }).inc();
        }
    }

    /// The text exposition.
    #[must_use]
    pub fn render(&self) -> String {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry)
            .expect("writing to a String does not fail");
        text
    }
}

impl KvMetrics {
    /// `value`, or `other` once [`MAX_CODES`] distinct values have been counted.
    fn bounded(&self, value: &str) -> String {
        let mut seen = self.seen.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if seen.contains(value) || seen.len() < MAX_CODES {
            seen.insert(value.to_owned());
            value.to_owned()
        } else {
            "other".to_owned()
        }
    }
}

/// Counts the answer to every write and every refusal.
pub async fn count(
    State(metrics): State<Arc<KvMetrics>>,
    request: Request,
    next: Next,
) -> Response {
    let is_write = matches!(*request.method(), Method::PUT | Method::DELETE | Method::POST);
    let response = next.run(request).await;
    let status = response.status();
    let is_json = response
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|value| value.as_bytes().starts_with(b"application/json"));
    if !(is_json && (is_write || !status.is_success())) {
        return response;
    }
    let (parts, body) = response.into_parts();
    let Ok(bytes) = to_bytes(body, MAX_COUNTED_BODY_BYTES).await else {
        return (StatusCode::INTERNAL_SERVER_ERROR, "the answer was too large to count")
            .into_response();
    };
    if let Ok(value) = serde_json::from_slice::<serde_json::Value>(&bytes) {
        metrics.count(status, &value);
    }
    Response::from_parts(parts, Body::from(bytes))
}

/// `GET /metrics`.
pub async fn render(State(metrics): State<Arc<KvMetrics>>) -> Response {
    let content_type = "application/openmetrics-text; version=1.0.0; charset=utf-8";
    ([(header::CONTENT_TYPE, content_type)], metrics.render()).into_response()
}
