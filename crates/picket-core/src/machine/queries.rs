//! What the state machine answers without changing: locks, sessions, checks and counts.

use super::StateMachine;
use crate::outcome::WaitEnd;
use crate::query::{
    CheckOutcome, HolderInfo, LockInfo, Occupancy, QueueSummary, SessionInfo, SessionLease,
};
use crate::record::{LockRecord, SessionRecord};
use crate::sequencer::Sequencer;
use crate::types::{CancelCause, RequestId, SessionId};

/// Queries. They read the state as of the last applied command.
impl StateMachine {
    /// The state of one lock, or `None` when nobody holds it, waits for it or is delayed on it.
    #[must_use]
    pub fn lock(&self, name: &str) -> Option<LockInfo> {
        self.locks.get(name).map(|lock| lock_info(name, lock))
    }

    /// How many locks are held, how many sessions wait in queues, and the `top` longest queues
    /// (longest first, then by name), for metrics. Reads every lock once.
    #[must_use]
    pub fn queue_summary(&self, top: usize) -> QueueSummary {
        let mut summary = QueueSummary::default();
        for (name, lock) in &self.locks {
            summary.held += usize::from(lock.holder.is_some());
            summary.waiters += lock.waiters.len();
            summary.delayed += usize::from(lock.delay.is_some());
            if lock.waiters.is_empty() || top == 0 {
                continue;
            }
            let shorter =
                summary.longest.last().is_some_and(|(_, depth)| *depth >= lock.waiters.len());
            if summary.longest.len() == top && shorter {
                continue;
            }
            let at = summary.longest.partition_point(|(_, depth)| *depth >= lock.waiters.len());
            summary.longest.insert(at, (name.clone(), lock.waiters.len()));
            summary.longest.truncate(top);
        }
        summary
    }

    /// Whether `name` is held, awaited or delayed, without copying its queue (cheaper than
    /// [`StateMachine::lock`], for counting on the apply path); `None` for a free lock.
    #[must_use]
    pub fn occupancy(&self, name: &str) -> Option<Occupancy> {
        self.locks.get(name).map(|lock| Occupancy {
            held: lock.holder.is_some(),
            waiters: lock.waiters.len(),
            delayed: lock.delay.is_some(),
        })
    }

    /// The session holding `name` now, if any (cheaper than [`StateMachine::lock`]).
    #[must_use]
    pub fn holder(&self, name: &str) -> Option<SessionId> {
        self.locks.get(name).and_then(|lock| lock.holder).map(|holder| holder.session)
    }

    /// Locks whose names start with `prefix`, in name order, after the name `after` (for
    /// paging), at most `limit` of them and never more than the listing limit.
    #[must_use]
    pub fn locks(&self, prefix: &str, after: Option<&str>, limit: usize) -> Vec<LockInfo> {
        let limit = limit.min(self.limits.max_list);
        let start = after.filter(|after| *after >= prefix).unwrap_or(prefix);
        self.locks
            .range::<str, _>((std::ops::Bound::Included(start), std::ops::Bound::Unbounded))
            .filter(|(name, _)| Some(name.as_str()) != after)
            .take_while(|(name, _)| name.starts_with(prefix))
            .take(limit)
            .map(|(name, lock)| lock_info(name, lock))
            .collect()
    }

    /// How the wait of acquire `request`, by `session` for `name`, stands in this state: `None`
    /// while it still waits, otherwise how it ended, as the events the shell missed would have
    /// told it. For a shell that lost those events (a snapshot replaced the state) and must
    /// still answer the request's caller.
    #[must_use]
    pub fn wait_end(&self, session: SessionId, name: &str, request: RequestId) -> Option<WaitEnd> {
        let lock = self.locks.get(name);
        let holder = lock.and_then(|lock| lock.holder).filter(|holder| holder.session == session);
        if let (Some(lock), Some(holder)) = (lock, holder) {
            // Only the grant this request produced or was told of is its own: a grant to
            // another request of the session came after this one's wait ended, and telling
            // this caller it holds the lock would give it a grant another caller relies on.
            let told = lock.also_told.iter().any(|told| told.request == request);
            if holder.request == request || told {
                return Some(WaitEnd::Granted { token: holder.token });
            }
        }
        let Some(record) = self.sessions.get(&session) else {
            // The session's end took its wait with it; how it ended is no longer kept, and
            // every retry of the request is refused as an unknown session.
            return Some(WaitEnd::Cancelled { cause: CancelCause::SessionExpired });
        };
        if record.waiting.contains(name) && self.waiter(name, session).request == request {
            return None;
        }
        // Not holding and not waiting under this request: its wait ended. The state remembers
        // how for the session's last few cancelled waits. An older one, or a grant of this
        // request that has ended since, left no trace: it is reported as timed out, which is
        // true in the one way that matters to the caller: it holds no grant.
        let cause = record.ended_wait(request).unwrap_or(CancelCause::TimedOut);
        Some(WaitEnd::Cancelled { cause })
    }

    /// One session.
    #[must_use]
    pub fn session(&self, session: SessionId) -> Option<SessionInfo> {
        self.sessions.get(&session).map(|record| session_info(session, record))
    }

    /// A live session's TTL and deadlines, cheaper than [`StateMachine::session`].
    #[must_use]
    pub fn session_lease(&self, session: SessionId) -> Option<SessionLease> {
        self.sessions.get(&session).map(|record| SessionLease {
            ttl_ms: record.ttl_ms,
            deadline_ms: record.deadline_ms,
            alive_until_ms: self.session_expiry_ms(record.deadline_ms),
        })
    }

    /// Sessions in id order after `after`, at most `limit` and never more than the listing limit.
    #[must_use]
    pub fn sessions(&self, after: Option<SessionId>, limit: usize) -> Vec<SessionInfo> {
        self.sessions_of(None, after, limit)
    }

    /// Like [`StateMachine::sessions`], only the sessions `owner` opened (all when `None`).
    #[must_use]
    pub fn sessions_of(
        &self,
        owner: Option<&str>,
        after: Option<SessionId>,
        limit: usize,
    ) -> Vec<SessionInfo> {
        let limit = limit.min(self.limits.max_list);
        let start = after.map_or(std::ops::Bound::Unbounded, std::ops::Bound::Excluded);
        self.sessions
            .range((start, std::ops::Bound::Unbounded))
            .filter(|(_, record)| owner.is_none() || record.owner.as_deref() == owner)
            .take(limit)
            .map(|(session, record)| session_info(*session, record))
            .collect()
    }

    /// The principal that opened a live session: `None` for an unknown session, `Some(None)`
    /// for a session opened without authentication.
    #[must_use]
    pub fn session_owner(&self, session: SessionId) -> Option<Option<&str>> {
        self.sessions.get(&session).map(|record| record.owner.as_deref())
    }

    /// Whether the sequencer names the lock's current grant.
    #[must_use]
    pub fn check(&self, sequencer: &Sequencer) -> CheckOutcome {
        let Some(lock) = self.locks.get(&sequencer.name) else {
            // Nobody holds, awaits or is delayed on the lock. A token this state has reached was
            // a grant that ended (or never was this lock's): superseded either way. A token
            // above the revision was never issued at all.
            if sequencer.token <= self.revision {
                return CheckOutcome::Superseded { current_token: None };
            }
            return CheckOutcome::UnknownLock;
        };
        match lock.holder {
            Some(holder) if holder.token == sequencer.token => {
                CheckOutcome::Current { session: holder.session }
            }
            holder => CheckOutcome::Superseded { current_token: holder.map(|holder| holder.token) },
        }
    }
}

fn lock_info(name: &str, lock: &LockRecord) -> LockInfo {
    LockInfo {
        name: name.to_owned(),
        holder: lock
            .holder
            .map(|holder| HolderInfo { session: holder.session, token: holder.token }),
        waiters: lock.waiters.iter().map(|waiter| waiter.session).collect(),
        delayed_until_ms: lock.delay.map(|delay| delay.until_ms),
    }
}

fn session_info(session: SessionId, record: &SessionRecord) -> SessionInfo {
    SessionInfo {
        session,
        ttl_ms: record.ttl_ms,
        lock_delay_ms: record.lock_delay_ms,
        deadline_ms: record.deadline_ms,
        held: record.held.iter().cloned().collect(),
        waiting: record.waiting.iter().cloned().collect(),
        owner: record.owner.clone(),
    }
}
