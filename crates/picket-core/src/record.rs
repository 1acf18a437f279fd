//! The records the state machine keeps per session and per lock.

use crate::types::{CancelCause, RequestId, SessionId};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeSet, VecDeque};

/// A live session.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct SessionRecord {
    pub(crate) ttl_ms: u64,
    pub(crate) lock_delay_ms: u64,
    pub(crate) deadline_ms: u64,
    /// The lease its last renewal gave it, where that was longer than its TTL (a tick's
    /// `renew_for`, apply rules 6): a `Refresh` renews it for this, not for the TTL alone, so a
    /// lease lengthened for its client's clock is never cut by a refresh.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) lease_ms: Option<u64>,
    /// Locks this session holds.
    pub(crate) held: BTreeSet<String>,
    /// Locks this session is queued for.
    pub(crate) waiting: BTreeSet<String>,
    /// The principal that opened it, when the service authenticates clients.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) owner: Option<String>,
    /// The session's latest abandoned acquire requests, oldest first, at most
    /// [`ABANDONED_REQUESTS_KEPT`]. An attempt of one of them that reaches the log after its
    /// abandon (a half-open connection delivers it late) is refused instead of granted to a
    /// caller that is gone.
    #[serde(default, skip_serializing_if = "VecDeque::is_empty")]
    pub(crate) abandoned: VecDeque<RequestAttempt>,
    /// The session's latest acquire requests whose wait ended without a grant (timed out or
    /// cancelled), oldest first, at most [`ENDED_WAITS_KEPT`] (apply rules 3). A retry of one
    /// gets the answer the wait ended with instead of a second wait.
    #[serde(default, skip_serializing_if = "VecDeque::is_empty")]
    pub(crate) ended_waits: VecDeque<EndedWait>,
}

/// How many ended waits a session remembers. A retry arrives within a client's retry window
/// (seconds) of its wait's end; a session whose waits end faster than that on other locks is
/// rare, and a retry it forgot starts a wait again, as before apply rules 3.
pub(crate) const ENDED_WAITS_KEPT: usize = 8;

/// An acquire request whose wait ended without a grant, and why.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct EndedWait {
    pub(crate) request: RequestId,
    pub(crate) cause: CancelCause,
}

/// How many abandoned requests a session remembers. A client abandons a request only when it
/// gives up on it or its connection breaks, and each abandon is one log entry, so a late
/// attempt of a request the session forgot needs that many abandons of the same session while
/// it is on its way.
pub(crate) const ABANDONED_REQUESTS_KEPT: usize = 16;

/// An acquire request, up to and including `attempt`: one that was abandoned (in a session's
/// memory) or one that was told of a grant (in a lock's).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct RequestAttempt {
    pub(crate) request: RequestId,
    pub(crate) attempt: u32,
}

impl SessionRecord {
    pub(crate) fn lock_count(&self) -> usize {
        self.held.len() + self.waiting.len()
    }

    /// Whether `attempt` of `request` was abandoned (it, or a later attempt of the request).
    pub(crate) fn abandoned(&self, request: RequestId, attempt: u32) -> bool {
        self.abandoned.iter().any(|entry| entry.request == request && attempt <= entry.attempt)
    }

    /// How `request`'s wait ended, if the session remembers that it ended without a grant.
    pub(crate) fn ended_wait(&self, request: RequestId) -> Option<CancelCause> {
        self.ended_waits.iter().find(|ended| ended.request == request).map(|ended| ended.cause)
    }

    /// Remembers that `request`'s wait ended for `cause`, forgetting the wait that ended
    /// longest ago when the memory is full. A request that ends a wait again (its retry waited:
    /// it was forgotten, or written under older rules) counts from its latest end.
    pub(crate) fn remember_ended_wait(&mut self, request: RequestId, cause: CancelCause) {
        self.ended_waits.retain(|ended| ended.request != request);
        if self.ended_waits.len() == ENDED_WAITS_KEPT {
            self.ended_waits.pop_front();
        }
        self.ended_waits.push_back(EndedWait { request, cause });
        assert!(self.ended_waits.len() <= ENDED_WAITS_KEPT);
    }

    /// Remembers that `request` was abandoned up to `attempt`, forgetting the request
    /// abandoned longest ago when the memory is full. A request abandoned again counts from its
    /// latest abandon.
    pub(crate) fn remember_abandoned(&mut self, request: RequestId, attempt: u32) {
        let mut attempt = attempt;
        if let Some(index) = self.abandoned.iter().position(|entry| entry.request == request) {
            let earlier = self.abandoned.remove(index).expect("the position is in range");
            attempt = attempt.max(earlier.attempt);
        }
        if self.abandoned.len() == ABANDONED_REQUESTS_KEPT {
            self.abandoned.pop_front();
        }
        self.abandoned.push_back(RequestAttempt { request, attempt });
        assert!(self.abandoned.len() <= ABANDONED_REQUESTS_KEPT);
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
    /// Other acquire requests of the holder's session that were answered `already_held` for
    /// the current grant (apply rules 2), each with its latest attempt, oldest first, at most
    /// [`TOLD_REQUESTS_KEPT`]. Abandoning a request releases the grant only when no other
    /// request was told of it: the abandoned one's caller is gone, the others' may not be.
    #[serde(default, skip_serializing_if = "VecDeque::is_empty")]
    pub(crate) also_told: VecDeque<RequestAttempt>,
}

/// How many requests besides the producing one a grant remembers as told of it. A session
/// asks for a lock it holds again only on a retry after a lost answer, or when two of its
/// callers ask at once; past this, the request told longest ago is forgotten (its abandon then
/// finds nothing to undo, and the grant stays with the others, whose holders release it).
pub(crate) const TOLD_REQUESTS_KEPT: usize = 3;

impl LockRecord {
    pub(crate) fn is_idle(&self) -> bool {
        self.holder.is_none() && self.waiters.is_empty() && self.delay.is_none()
    }

    /// A lock can be granted at once when nobody holds it and no lock-delay is in force.
    pub(crate) fn is_free(&self) -> bool {
        self.holder.is_none() && self.delay.is_none()
    }

    /// Counts `request` among the requests told of the current grant, forgetting the one told
    /// longest ago when the memory is full.
    pub(crate) fn tell(&mut self, request: RequestId, attempt: u32) {
        let holder = self.holder.as_mut().expect("only a held lock's grant is told");
        if holder.request == request {
            holder.attempt = holder.attempt.max(attempt);
            return;
        }
        if let Some(entry) = self.also_told.iter_mut().find(|entry| entry.request == request) {
            entry.attempt = entry.attempt.max(attempt);
            return;
        }
        if self.also_told.len() == TOLD_REQUESTS_KEPT {
            self.also_told.pop_front();
        }
        self.also_told.push_back(RequestAttempt { request, attempt });
        assert!(self.also_told.len() <= TOLD_REQUESTS_KEPT);
    }

    /// No longer counts `request` among the requests told of the current grant; another one
    /// is left to hold it.
    pub(crate) fn forget(&mut self, request: RequestId) {
        assert!(!self.also_told.is_empty(), "the last request told of a grant releases it");
        let holder = self.holder.as_mut().expect("only a held lock's grant is told");
        if holder.request == request {
            let next = self.also_told.pop_front().expect("checked");
            holder.request = next.request;
            holder.attempt = next.attempt;
        } else {
            self.also_told.retain(|entry| entry.request != request);
        }
    }

    pub(crate) fn position_of(&self, session: SessionId) -> Option<usize> {
        self.waiters.iter().position(|waiter| waiter.session == session)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn session() -> SessionRecord {
        SessionRecord {
            ttl_ms: 1_000,
            lock_delay_ms: 0,
            deadline_ms: 1_000,
            lease_ms: None,
            held: BTreeSet::new(),
            waiting: BTreeSet::new(),
            owner: None,
            abandoned: VecDeque::new(),
            ended_waits: VecDeque::new(),
        }
    }

    #[test]
    fn an_abandoned_request_covers_its_attempt_and_earlier_ones_only() {
        let mut record = session();
        record.remember_abandoned(RequestId(7), 2);
        assert!(record.abandoned(RequestId(7), 0));
        assert!(record.abandoned(RequestId(7), 2));
        assert!(!record.abandoned(RequestId(7), 3), "the caller's retry goes on");
        assert!(!record.abandoned(RequestId(8), 0));
        // An earlier attempt's late abandon does not lower what is remembered.
        record.remember_abandoned(RequestId(7), 1);
        assert!(record.abandoned(RequestId(7), 2));
        assert_eq!(record.abandoned.len(), 1);
    }

    #[test]
    fn abandoned_requests_are_bounded_and_the_oldest_is_forgotten_first() {
        let mut record = session();
        let kept = u64::try_from(ABANDONED_REQUESTS_KEPT).unwrap();
        for request in 0..=kept {
            record.remember_abandoned(RequestId(request), 0);
        }
        assert_eq!(record.abandoned.len(), ABANDONED_REQUESTS_KEPT);
        assert!(!record.abandoned(RequestId(0), 0));
        assert!((1..=kept).all(|request| record.abandoned(RequestId(request), 0)));
    }

    /// Regression (found in review): a request abandoned again was still the first forgotten.
    #[test]
    fn a_request_abandoned_again_is_forgotten_last() {
        let mut record = session();
        let kept = u64::try_from(ABANDONED_REQUESTS_KEPT).unwrap();
        for request in 0..kept {
            record.remember_abandoned(RequestId(request), 0);
        }
        record.remember_abandoned(RequestId(0), 1);
        record.remember_abandoned(RequestId(kept), 0);
        assert!(record.abandoned(RequestId(0), 1), "abandoned again, so kept");
        assert!(!record.abandoned(RequestId(1), 0), "now the longest ago");
        assert_eq!(record.abandoned.len(), ABANDONED_REQUESTS_KEPT);
    }
}
