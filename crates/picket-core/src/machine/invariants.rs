//! Snapshots of the state, and the check of its every invariant.

use super::{Deadlines, RestoreError, StateMachine};
use crate::command::{APPLY_RULES, CLUSTER_ID_HEX_DIGITS, is_cluster_id};
use crate::record::{
    ABANDONED_REQUESTS_KEPT, ENDED_WAITS_KEPT, LockRecord, SessionRecord, TOLD_REQUESTS_KEPT,
};
use crate::types::{RequestId, SessionId};
use std::collections::BTreeSet;
use thiserror::Error;

/// An invariant of the state that does not hold: a bug in this crate, or a damaged snapshot.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum BrokenInvariant {
    #[error("{count} sessions exceed the limit of {max}")]
    TooManySessions { count: usize, max: usize },
    #[error("session {session} was not opened at a past revision")]
    SessionFromTheFuture { session: SessionId },
    #[error("session {session} holds or waits for too many locks")]
    SessionOverItsLocks { session: SessionId },
    #[error("session {session} remembers too many abandoned requests, or one twice")]
    SessionOverItsAbandonedRequests { session: SessionId },
    #[error("session {session} remembers too many ended waits, or one twice")]
    SessionOverItsEndedWaits { session: SessionId },
    #[error("session {session} remembers a lease not longer than its TTL, or over four times it")]
    SessionLeaseOutOfBounds { session: SessionId },
    #[error("session {session} lists {name:?} as held but is not its holder")]
    HeldButNotHolder { session: SessionId, name: String },
    #[error("session {session} lists {name:?} as awaited but is not queued")]
    AwaitedButNotQueued { session: SessionId, name: String },
    #[error("lock {name:?} is idle but keeps a record")]
    IdleLockKept { name: String },
    #[error("lock {name:?} is free but has waiters")]
    FreeLockWithWaiters { name: String },
    #[error("lock {name:?} is held during its lock-delay")]
    HeldDuringLockDelay { name: String },
    #[error("lock {name:?} has too many waiters")]
    TooManyWaiters { name: String },
    #[error("lock {name:?} has token {token} from the future")]
    TokenFromTheFuture { name: String, token: u64 },
    #[error("lock {name:?} is held by session {session} which does not list it")]
    HolderDoesNotListIt { name: String, session: SessionId },
    #[error("session {session} is queued twice for {name:?}")]
    QueuedTwice { name: String, session: SessionId },
    #[error("session {session} waits for {name:?}, which it holds")]
    WaitsForItsOwnLock { name: String, session: SessionId },
    #[error("session {session} is queued for {name:?} but does not list it")]
    WaiterDoesNotListIt { name: String, session: SessionId },
    #[error(
        "lock {name:?} remembers requests told of a grant it does not have, too many, or one twice"
    )]
    ToldRequests { name: String },
    #[error("a deadline index disagrees with the records")]
    DeadlineIndex,
    #[error(
        "the cluster id {cluster_id:?} is not {digits} lowercase hexadecimal digits, or the state says it holds no entry of apply rules 7"
    )]
    MalformedClusterId { cluster_id: String, digits: usize },
    #[error(
        "the id of the cluster this state was restored from, {cluster_id:?}, is not {digits} lowercase hexadecimal digits"
    )]
    MalformedRestoredFrom { cluster_id: String, digits: usize },
}

/// Snapshots and invariants.
impl StateMachine {
    /// The whole state as bytes. Two state machines that applied the same inputs produce the
    /// same bytes.
    #[must_use]
    pub fn snapshot(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("the state always serializes")
    }

    /// Rebuilds a state machine from [`StateMachine::snapshot`] bytes, checking every invariant.
    ///
    /// # Errors
    /// [`RestoreError`] when the bytes do not decode or describe an inconsistent state.
    pub fn restore(bytes: &[u8]) -> Result<Self, RestoreError> {
        let mut machine: Self = serde_json::from_slice(bytes)?;
        if machine.newest_apply_rules > APPLY_RULES {
            return Err(RestoreError::UnknownApplyRules {
                rules: machine.newest_apply_rules,
                known: APPLY_RULES,
            });
        }
        machine.limits.validate()?;
        machine.rebuild_indices();
        machine.check_invariants()?;
        Ok(machine)
    }

    /// Checks every structural invariant of the state. It costs a pass over the whole state, so
    /// the shells run it on restore and the tests after every step; the cheap ones are also
    /// asserted inline on every change.
    ///
    /// # Errors
    /// The first broken invariant.
    pub fn check_invariants(&self) -> Result<(), BrokenInvariant> {
        if self.sessions.len() > self.limits.max_sessions {
            return Err(BrokenInvariant::TooManySessions {
                count: self.sessions.len(),
                max: self.limits.max_sessions,
            });
        }
        for (session, record) in &self.sessions {
            self.check_session(*session, record)?;
        }
        for (name, lock) in &self.locks {
            self.check_lock(name, lock)?;
        }
        if Deadlines::of(&self.sessions, &self.locks) != self.deadlines {
            return Err(BrokenInvariant::DeadlineIndex);
        }
        // An older build reads a snapshot without rules 7 and would drop the id unseen.
        let unreadable = |id: &String| !is_cluster_id(id) || self.newest_apply_rules < 7;
        if let Some(cluster_id) = self.cluster_id.as_ref().filter(|id| unreadable(id)) {
            return Err(BrokenInvariant::MalformedClusterId {
                cluster_id: cluster_id.clone(),
                digits: CLUSTER_ID_HEX_DIGITS,
            });
        }
        if let Some(cluster_id) =
            self.restored_from_cluster_id.as_ref().filter(|id| !is_cluster_id(id))
        {
            return Err(BrokenInvariant::MalformedRestoredFrom {
                cluster_id: cluster_id.clone(),
                digits: CLUSTER_ID_HEX_DIGITS,
            });
        }
        Ok(())
    }

    fn check_session(
        &self,
        session: SessionId,
        record: &SessionRecord,
    ) -> Result<(), BrokenInvariant> {
        if session.0 == 0 || session.0 > self.revision {
            return Err(BrokenInvariant::SessionFromTheFuture { session });
        }
        if record.lock_count() > self.limits.max_locks_per_session {
            return Err(BrokenInvariant::SessionOverItsLocks { session });
        }
        let distinct: BTreeSet<RequestId> =
            record.abandoned.iter().map(|entry| entry.request).collect();
        if record.abandoned.len() > ABANDONED_REQUESTS_KEPT
            || distinct.len() != record.abandoned.len()
        {
            return Err(BrokenInvariant::SessionOverItsAbandonedRequests { session });
        }
        let ended: BTreeSet<RequestId> =
            record.ended_waits.iter().map(|ended| ended.request).collect();
        if record.ended_waits.len() > ENDED_WAITS_KEPT || ended.len() != record.ended_waits.len() {
            return Err(BrokenInvariant::SessionOverItsEndedWaits { session });
        }
        let lease_bounds = record.ttl_ms.saturating_add(1)..=record.ttl_ms.saturating_mul(4);
        if record.lease_ms.is_some_and(|lease_ms| !lease_bounds.contains(&lease_ms)) {
            return Err(BrokenInvariant::SessionLeaseOutOfBounds { session });
        }
        for name in &record.held {
            let holder = self.locks.get(name).and_then(|lock| lock.holder);
            if holder.map(|holder| holder.session) != Some(session) {
                return Err(BrokenInvariant::HeldButNotHolder { session, name: name.clone() });
            }
        }
        for name in &record.waiting {
            let queued = self.locks.get(name).and_then(|lock| lock.position_of(session));
            if queued.is_none() {
                return Err(BrokenInvariant::AwaitedButNotQueued { session, name: name.clone() });
            }
        }
        Ok(())
    }

    fn check_lock(&self, name: &str, lock: &LockRecord) -> Result<(), BrokenInvariant> {
        let name_owned = || name.to_owned();
        if lock.is_idle() {
            return Err(BrokenInvariant::IdleLockKept { name: name_owned() });
        }
        if lock.is_free() && !lock.waiters.is_empty() {
            return Err(BrokenInvariant::FreeLockWithWaiters { name: name_owned() });
        }
        if lock.holder.is_some() && lock.delay.is_some() {
            return Err(BrokenInvariant::HeldDuringLockDelay { name: name_owned() });
        }
        if lock.waiters.len() > self.limits.max_waiters_per_lock {
            return Err(BrokenInvariant::TooManyWaiters { name: name_owned() });
        }
        let told: BTreeSet<RequestId> = lock.also_told.iter().map(|entry| entry.request).collect();
        let told_wrong = lock.also_told.len() > TOLD_REQUESTS_KEPT
            || told.len() != lock.also_told.len()
            || lock.holder.map_or(!told.is_empty(), |holder| told.contains(&holder.request));
        if told_wrong {
            return Err(BrokenInvariant::ToldRequests { name: name_owned() });
        }
        if let Some(holder) = lock.holder {
            if holder.token == 0 || holder.token > self.revision {
                return Err(BrokenInvariant::TokenFromTheFuture {
                    name: name_owned(),
                    token: holder.token,
                });
            }
            let listed =
                self.sessions.get(&holder.session).is_some_and(|record| record.held.contains(name));
            if !listed {
                return Err(BrokenInvariant::HolderDoesNotListIt {
                    name: name_owned(),
                    session: holder.session,
                });
            }
        }
        let mut seen = BTreeSet::new();
        for waiter in &lock.waiters {
            let session = waiter.session;
            if !seen.insert(session) {
                return Err(BrokenInvariant::QueuedTwice { name: name_owned(), session });
            }
            if lock.holder.is_some_and(|holder| holder.session == session) {
                return Err(BrokenInvariant::WaitsForItsOwnLock { name: name_owned(), session });
            }
            let listed =
                self.sessions.get(&session).is_some_and(|record| record.waiting.contains(name));
            if !listed {
                return Err(BrokenInvariant::WaiterDoesNotListIt { name: name_owned(), session });
            }
        }
        Ok(())
    }
}
