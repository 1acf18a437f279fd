//! Bounds on every input the state machine accepts.
//!
//! The limits are part of the replicated state: every replica must refuse exactly the same
//! commands, so a node cannot take its limits from its own configuration file. A new state
//! starts with the defaults; they change only by [`crate::Command::SetLimits`], an entry of
//! the log like any other (a leader writes it from its flags), and travel inside every
//! snapshot.

use serde::{Deserialize, Serialize};
use thiserror::Error;

/// Limits that contradict themselves or the caps, naming the first rule they break.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Error)]
#[error("invalid limits: {rule}")]
pub struct InvalidLimits {
    /// The rule, as a sentence ("`min_ttl_ms` must not exceed `max_ttl_ms`").
    pub rule: &'static str,
}

/// Bounds on names, TTLs, counts and listings. See [`Limits::default`] for the values.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limits {
    /// Longest lock name, in UTF-8 bytes.
    pub max_name_bytes: usize,
    /// Shortest session TTL a client may ask for.
    pub min_ttl_ms: u64,
    /// Longest session TTL a client may ask for.
    pub max_ttl_ms: u64,
    /// Longest lock-delay a session may ask for.
    pub max_lock_delay_ms: u64,
    /// Longest bounded wait of an acquire.
    pub max_wait_ms: u64,
    /// Most sessions alive at once.
    pub max_sessions: usize,
    /// Most lock records at once (locks held, awaited or in lock-delay). States written before
    /// this limit existed read as the default.
    #[serde(default = "default_max_locks")]
    pub max_locks: usize,
    /// Most locks one session may hold or wait for at once.
    pub max_locks_per_session: usize,
    /// Most sessions queued behind one lock.
    pub max_waiters_per_lock: usize,
    /// Most entries one listing returns.
    pub max_list: usize,
    /// Most session ids one tick may renew.
    pub max_renewals_per_tick: usize,
    /// How long past its deadline a session lives before a tick expires it. The deadline is
    /// what clients are promised (TTL after their last keepalive); the grace is the server's own
    /// margin for keepalives that reached the leader but were not yet read when a tick fell due.
    /// States written before the grace existed read as the default.
    #[serde(default = "default_session_expiry_grace_ms")]
    pub session_expiry_grace_ms: u64,
}

/// The most [`Limits::max_name_bytes`] may be.
pub const MAX_NAME_BYTES_CAP: usize = 65_536;
/// The longest name of a session's owner (a principal's name), in bytes.
pub const MAX_OWNER_BYTES: usize = 128;
/// The most [`Limits::max_renewals_per_tick`] may be.
pub const MAX_RENEWALS_PER_TICK_CAP: usize = 1_000_000;

/// The default [`Limits::session_expiry_grace_ms`]: half a second, the same bound the leader
/// uses to tell a stall or a clock jump from ordinary scheduling delay.
pub const DEFAULT_SESSION_EXPIRY_GRACE_MS: u64 = 500;

/// The default [`Limits::max_locks`].
pub const DEFAULT_MAX_LOCKS: usize = 1_000_000;

fn default_max_locks() -> usize {
    DEFAULT_MAX_LOCKS
}

fn default_session_expiry_grace_ms() -> u64 {
    DEFAULT_SESSION_EXPIRY_GRACE_MS
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_name_bytes: 256,
            min_ttl_ms: 1_000,
            max_ttl_ms: 3_600_000,
            max_lock_delay_ms: 60_000,
            max_wait_ms: 3_600_000,
            max_sessions: 200_000,
            max_locks: DEFAULT_MAX_LOCKS,
            max_locks_per_session: 1_000,
            max_waiters_per_lock: 10_000,
            max_list: 1_000,
            max_renewals_per_tick: 200_000,
            session_expiry_grace_ms: DEFAULT_SESSION_EXPIRY_GRACE_MS,
        }
    }
}

impl Limits {
    /// Checks that the limits themselves make sense; a state machine refuses to start otherwise.
    ///
    /// # Errors
    /// [`InvalidLimits`] naming the first limit that is out of place.
    pub fn validate(&self) -> Result<(), InvalidLimits> {
        let checks: [(bool, &str); 12] = [
            (self.max_name_bytes > 0, "max_name_bytes must be at least 1"),
            // The caps keep every command's encoding far below the log's entry bound.
            (self.max_name_bytes <= MAX_NAME_BYTES_CAP, "max_name_bytes must be at most 65,536"),
            (
                self.max_renewals_per_tick <= MAX_RENEWALS_PER_TICK_CAP,
                "max_renewals_per_tick must be at most 1,000,000",
            ),
            (self.min_ttl_ms > 0, "min_ttl_ms must be at least 1"),
            (self.min_ttl_ms <= self.max_ttl_ms, "min_ttl_ms must not exceed max_ttl_ms"),
            (self.max_sessions > 0, "max_sessions must be at least 1"),
            (self.max_locks > 0, "max_locks must be at least 1"),
            (self.max_locks_per_session > 0, "max_locks_per_session must be at least 1"),
            (self.max_waiters_per_lock > 0, "max_waiters_per_lock must be at least 1"),
            (self.max_list > 0, "max_list must be at least 1"),
            (
                self.max_renewals_per_tick >= self.max_sessions,
                "max_renewals_per_tick must allow renewing every session in one tick",
            ),
            (
                self.session_expiry_grace_ms <= self.min_ttl_ms,
                "session_expiry_grace_ms must not exceed min_ttl_ms",
            ),
        ];
        match checks.iter().find(|(ok, _)| !ok) {
            Some((_, rule)) => Err(InvalidLimits { rule }),
            None => Ok(()),
        }
    }
}
