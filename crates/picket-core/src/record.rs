//! The records the state machine keeps per session and per lock.

use crate::types::{RequestId, SessionId};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeSet, VecDeque};

/// A live session.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct SessionRecord {
    pub(crate) ttl_ms: u64,
    pub(crate) lock_delay_ms: u64,
    pub(crate) deadline_ms: u64,
    /// Locks this session holds.
    pub(crate) held: BTreeSet<String>,
    /// Locks this session is queued for.
    pub(crate) waiting: BTreeSet<String>,
    /// The principal that opened it, when the service authenticates clients.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) owner: Option<String>,
}

impl SessionRecord {
    pub(crate) fn lock_count(&self) -> usize {
        self.held.len() + self.waiting.len()
    }
}

/// The current grant of a lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Holder {
    pub(crate) session: SessionId,
    pub(crate) token: u64,
    /// The acquire request that produced this grant; only abandoning that request releases it.
    #[serde(default)]
    pub(crate) request: RequestId,
    /// The latest attempt of that request that reached the grant.
    #[serde(default)]
    pub(crate) attempt: u32,
}

/// A session queued for a lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Waiter {
    pub(crate) session: SessionId,
    /// The bounded wait asked for, kept so a new leader can restart it in full.
    pub(crate) wait_ms: Option<u64>,
    /// When the wait times out, for bounded waits.
    pub(crate) deadline_ms: Option<u64>,
    /// The acquire request waiting; the grant it gets carries the same request.
    #[serde(default)]
    pub(crate) request: RequestId,
    /// The latest attempt of that request that reached the wait.
    #[serde(default)]
    pub(crate) attempt: u32,
}

/// A lock-delay in force after a holder's session expired or was revoked.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Delay {
    pub(crate) until_ms: u64,
    /// The full delay, kept so a new leader can restart it in full.
    pub(crate) length_ms: u64,
}

/// A lock that is held, has waiters, or is in its lock-delay. A lock with none of these has no
/// record at all, so memory is bounded by live locks rather than by every name ever used.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct LockRecord {
    pub(crate) holder: Option<Holder>,
    pub(crate) waiters: VecDeque<Waiter>,
    pub(crate) delay: Option<Delay>,
}

impl LockRecord {
    pub(crate) fn is_idle(&self) -> bool {
        self.holder.is_none() && self.waiters.is_empty() && self.delay.is_none()
    }

    /// A lock can be granted at once when nobody holds it and no lock-delay is in force.
    pub(crate) fn is_free(&self) -> bool {
        self.holder.is_none() && self.delay.is_none()
    }

    pub(crate) fn position_of(&self, session: SessionId) -> Option<usize> {
        self.waiters.iter().position(|waiter| waiter.session == session)
    }
}
