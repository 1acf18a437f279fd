//! Picket's reference fenced resource: a small HTTP key-value store built only from
//! `picket-fence`, the durable [`FencedStore`] (redb: fence records and data in one transaction,
//! fsynced before the answer) and the HTTP middleware (stamp headers, verify on advance,
//! structured refusals). Each guarded key prefix is one resource bound to one lock; writes to
//! keys outside every guard are refused. `picket kv serve` runs it.
//!
//! | Method and path | Meaning |
//! |---|---|
//! | `PUT /kv/{key}` | set the key to the body (`Picket-Sequencer` required) |
//! | `GET /kv/{key}` | read; with `Picket-Sequencer`, refused if the grant is stale |
//! | `DELETE /kv/{key}` | delete (`Picket-Sequencer` required) |
//! | `POST /txn` | a unit: `{"ops": [{"put": {"key", "value"}}, {"delete": {"key"}}]}`, one check, one transaction, all resources or none |
//! | `POST /fence/{prefix}` | register the sequencer's token with the resource (fence on acquire) |
//! | `GET /fence/{prefix}` | the resource's fence record |
//! | `GET /metrics` | admissions and refusals ([`metrics`]) |

mod guards;
pub mod metrics;
mod service;

use axum::extract::DefaultBodyLimit;
use axum::http::request::Parts;
use axum::routing::{get, post, put};
use axum::{Json, Router};
use guards::{Guards, resolve};
use picket_core::SequencerKeys;
use picket_fence::http::{FenceConfig, GrantChecker, fence};
use picket_fence::{FencedStore, Policy, StoreError};
use serde_json::json;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// How a store is set up.
#[derive(Clone)]
pub struct KvConfig {
    /// Where the store keeps its data (`kv.redb` inside it).
    pub data_dir: PathBuf,
    /// Each guarded key prefix and the policy (lock, mode) its writes are fenced under.
    pub guards: Vec<(String, Policy)>,
    /// Asks the lock service about a token newer than any seen (verify on advance); `None` to
    /// skip verification.
    pub checker: Option<Arc<dyn GrantChecker>>,
    /// How long verify on advance waits for the lock service.
    pub verify_timeout: Duration,
    /// Take only sequencers signed with one of these keys.
    pub sequencer_keys: Option<SequencerKeys>,
    /// False applies writes without any fence check: UNSAFE, for measuring the fence's cost.
    pub fenced: bool,
}

impl std::fmt::Debug for KvConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KvConfig")
            .field("data_dir", &self.data_dir)
            .field("guards", &self.guards)
            .field("verifies", &self.checker.is_some())
            .field("verify_timeout", &self.verify_timeout)
            .field("fenced", &self.fenced)
            .finish_non_exhaustive()
    }
}

/// Why the store cannot start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KvError {
    /// No guard was given: the store only takes fenced writes.
    #[error(
        "give at least one guarded prefix (--guard PREFIX=LOCK): the store only takes fenced writes"
    )]
    NoGuards,
    /// A guard that could never take a write.
    #[error("the guard --guard {prefix:?}={lock:?} is refused: {why}")]
    BadGuard {
        /// Its prefix.
        prefix: String,
        /// Its lock.
        lock: String,
        /// What is wrong and what to do.
        why: String,
    },
    /// The data directory cannot be created.
    #[error("cannot create {path}: {source}")]
    DataDir {
        /// The directory.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The fenced store cannot be opened.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Refuses guards that could never take a write, or that one another would hide: a prefix is
/// the guarded resource's name, so it must be a name the fence takes (1 to
/// `MAX_RESOURCE_BYTES` bytes), and two guards of one prefix would leave the second unused.
/// (Such guards were taken, and every write under them failed at request time.)
fn check_guards(guards: &[(String, Policy)]) -> Result<(), KvError> {
    let mut seen = std::collections::HashSet::new();
    for (prefix, policy) in guards {
        let refuse = |why: String| KvError::BadGuard {
            prefix: prefix.clone(),
            lock: policy.lock.clone(),
            why,
        };
        if prefix.is_empty() || prefix.len() > picket_fence::rule::MAX_RESOURCE_BYTES {
            return Err(refuse(format!(
                "a prefix must be 1 to {} bytes long",
                picket_fence::rule::MAX_RESOURCE_BYTES
            )));
        }
        if policy.lock.is_empty() {
            return Err(refuse("name the lock that guards the prefix".into()));
        }
        if !seen.insert(prefix.as_str()) {
            return Err(refuse("another guard has the same prefix; give each prefix once".into()));
        }
    }
    Ok(())
}

/// The store's HTTP service over the store in `config.data_dir`, opened (or created) here.
///
/// # Errors
/// [`KvError`] when there is no guard or the store cannot be opened.
pub fn router(config: KvConfig) -> Result<Router, KvError> {
    if config.guards.is_empty() {
        return Err(KvError::NoGuards);
    }
    check_guards(&config.guards)?;
    std::fs::create_dir_all(&config.data_dir)
        .map_err(|source| KvError::DataDir { path: config.data_dir.clone(), source })?;
    let store = Arc::new(FencedStore::open(config.data_dir.join("kv.redb"))?);
    let mut guards = config.guards;
    guards.sort_by_key(|(prefix, _)| std::cmp::Reverse(prefix.len()));
    let guards = Arc::new(Guards(guards));
    // Without a fence there is no highest token to advance, so nothing to verify either.
    let checker = if config.fenced { config.checker } else { None };
    let resolver_guards = guards.clone();
    let mut fence_config = FenceConfig::new(
        move |parts: &Parts| resolve(&resolver_guards, parts),
        store.clone(),
        checker,
    )
    .with_verify_timeout(config.verify_timeout);
    if let Some(keys) = config.sequencer_keys {
        fence_config = fence_config.with_sequencer_keys(keys);
    }
    let fence_config = Arc::new(fence_config);
    let kv = service::Kv { store, guards, config: fence_config.clone(), fenced: config.fenced };
    let counts = Arc::new(metrics::KvMetrics::default());
    Ok(Router::new()
        .route(
            "/kv/{*key}",
            put(service::put_key).get(service::get_key).delete(service::delete_key),
        )
        .route("/fence/{*prefix}", post(service::register).get(service::fence_record))
        .route_layer(axum::middleware::from_fn_with_state(fence_config, fence))
        .route("/txn", post(service::transaction))
        .route("/healthz", get(|| async { Json(json!({ "status": "ok" })) }))
        .layer(DefaultBodyLimit::max(picket_fence::MAX_VALUE_BYTES + 64 * 1024))
        .with_state(kv)
        .layer(axum::middleware::from_fn_with_state(counts.clone(), metrics::count))
        .route("/metrics", get(metrics::render).with_state(counts)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Found in review: an empty or overlong prefix, or one given twice, was taken, and every
    /// write under it failed at request time (or the second guard was never used).
    #[test]
    fn guards_that_could_never_take_a_write_are_refused_at_start() {
        let guard = |prefix: &str, lock: &str| (prefix.to_owned(), Policy::new(lock));
        assert!(check_guards(&[guard("orders/", "orders"), guard("users/", "users")]).is_ok());
        let refused = |guards: &[(String, Policy)]| check_guards(guards).unwrap_err().to_string();
        assert!(refused(&[guard("", "orders")]).contains("1 to 512 bytes"));
        assert!(refused(&[guard(&"p".repeat(513), "orders")]).contains("1 to 512 bytes"));
        assert!(refused(&[guard("orders/", "")]).contains("name the lock"));
        let twice = refused(&[guard("orders/", "a"), guard("orders/", "b")]);
        assert!(twice.contains("same prefix") && twice.contains("--guard"), "{twice}");
    }
}
