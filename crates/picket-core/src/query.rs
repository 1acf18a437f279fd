//! Read-only views of the state, as the APIs return them.

use crate::types::SessionId;
use serde::{Deserialize, Serialize};

/// The state of one lock.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockInfo {
    /// The lock.
    pub name: String,
    /// The current grant, if any.
    pub holder: Option<HolderInfo>,
    /// The queue, head first.
    pub waiters: Vec<SessionId>,
    /// When a lock-delay in force ends, on the state machine's clock.
    pub delayed_until_ms: Option<u64>,
}

/// What one lock holds now, without copying its queue ([`crate::StateMachine::occupancy`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Occupancy {
    /// Someone holds it.
    pub held: bool,
    /// Sessions waiting for it.
    pub waiters: usize,
    /// A lock-delay is in force.
    pub delayed: bool,
}

/// Counts over every lock, for metrics ([`crate::StateMachine::queue_summary`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct QueueSummary {
    /// Locks held now.
    pub held: usize,
    /// Sessions waiting in any lock's queue.
    pub waiters: usize,
    /// Locks in a lock-delay.
    pub delayed: usize,
    /// The longest queues as (lock, waiters), longest first.
    pub longest: Vec<(String, usize)>,
}

/// A current grant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HolderInfo {
    /// The holding session.
    pub session: SessionId,
    /// The grant's token.
    pub token: u64,
}

/// The state of one session.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionInfo {
    /// The session.
    pub session: SessionId,
    /// Its TTL.
    pub ttl_ms: u64,
    /// Its lock-delay.
    pub lock_delay_ms: u64,
    /// When it expires without a keepalive, on the state machine's clock.
    pub deadline_ms: u64,
    /// Locks it holds.
    pub held: Vec<String>,
    /// Locks it waits for.
    pub waiting: Vec<String>,
    /// The principal that opened it, when the service authenticates clients.
    pub owner: Option<String>,
}

/// Whether a sequencer names the current grant of its lock.
/// What a keepalive needs to know of a session, without its lists of locks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SessionLease {
    /// Its TTL.
    pub ttl_ms: u64,
    /// When it expires without a keepalive, on the state machine's clock: what its client was
    /// promised.
    pub deadline_ms: u64,
    /// The last clock reading at which a tick leaves it alive: its deadline plus the grace.
    pub alive_until_ms: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum CheckOutcome {
    /// The sequencer's token is the lock's current grant.
    Current {
        /// The holding session.
        session: SessionId,
    },
    /// The lock is held under another token, or by nobody; the sequencer's grant is over.
    Superseded {
        /// The current grant's token, if anyone holds the lock.
        current_token: Option<u64>,
    },
    /// No such lock is held, awaited or delayed, and no grant has had this token yet: it is
    /// above every token issued so far (a forged token, or one from another cluster).
    UnknownLock,
}

impl CheckOutcome {
    /// True only for the current grant.
    #[must_use]
    pub fn is_current(&self) -> bool {
        matches!(self, Self::Current { .. })
    }
}
