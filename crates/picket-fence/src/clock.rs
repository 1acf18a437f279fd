//! The time a backend gives the rule.
//!
//! The rule reads no clock (so that every decision can be replayed); the backends read one and
//! pass its reading in. The reading only decides when idempotency keys are forgotten, so the
//! clock is the wall clock: remembered keys carry their time across restarts of the resource.

use std::fmt;
use std::sync::Arc;

/// Where a backend reads the time, in milliseconds since the Unix epoch: the system's wall
/// clock, or any function (a test's clock that it moves itself).
#[derive(Clone)]
pub struct WallClock(Arc<dyn Fn() -> u64 + Send + Sync>);

impl WallClock {
    /// The system's wall clock. A clock before 1970 reads 0 (every key then stays until the
    /// count forgets it).
    #[must_use]
    #[expect(
        clippy::disallowed_methods,
        clippy::disallowed_types,
        reason = "the crate's one clock: the backends' default, given to the rule as an argument"
    )]
    pub fn system() -> Self {
        Self(Arc::new(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |since| u64::try_from(since.as_millis()).unwrap_or(u64::MAX))
        }))
    }

    /// A clock that reads `now_ms()`.
    pub fn from_fn(now_ms: impl Fn() -> u64 + Send + Sync + 'static) -> Self {
        Self(Arc::new(now_ms))
    }

    /// The time now, in milliseconds since the Unix epoch.
    #[must_use]
    pub fn now_ms(&self) -> u64 {
        (self.0)()
    }
}

impl Default for WallClock {
    fn default() -> Self {
        Self::system()
    }
}

impl fmt::Debug for WallClock {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str("WallClock")
    }
}
