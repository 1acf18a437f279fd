//! The state machine's three deadline indices, owned by one type.
//!
//! A tick must find the sessions to expire, the waits to time out and the lock-delays to end
//! without walking every record, so each kind of deadline is also kept in a sorted set. The sets
//! are derived from the records (rebuilt on restore, never stored in a snapshot) and must agree
//! with them after every command. Every edit goes through a method here that asserts the entry
//! it adds was absent and the entry it removes was present, so a record and its index can never
//! drift apart silently.

use crate::record::{LockRecord, SessionRecord};
use crate::types::SessionId;
use std::collections::{BTreeMap, BTreeSet};

/// The sorted deadlines of live sessions, bounded waits and lock-delays.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Deadlines {
    /// (deadline, session) for every live session.
    sessions: BTreeSet<(u64, SessionId)>,
    /// (deadline, session, lock) for every bounded wait.
    waits: BTreeSet<(u64, SessionId, String)>,
    /// (end, lock) for every lock-delay in force.
    delays: BTreeSet<(u64, String)>,
}

impl Deadlines {
    /// The indices of the given records.
    pub(crate) fn of(
        sessions: &BTreeMap<SessionId, SessionRecord>,
        locks: &BTreeMap<String, LockRecord>,
    ) -> Self {
        let sessions =
            sessions.iter().map(|(session, record)| (record.deadline_ms, *session)).collect();
        let waits = locks
            .iter()
            .flat_map(|(name, lock)| {
                lock.waiters.iter().filter_map(move |waiter| {
                    waiter
                        .deadline_ms
                        .map(|deadline_ms| (deadline_ms, waiter.session, name.clone()))
                })
            })
            .collect();
        let delays = locks
            .iter()
            .filter_map(|(name, lock)| lock.delay.map(|delay| (delay.until_ms, name.clone())))
            .collect();
        Self { sessions, waits, delays }
    }

    pub(crate) fn add_session(&mut self, deadline_ms: u64, session: SessionId) {
        assert!(self.sessions.insert((deadline_ms, session)), "a session has one deadline");
    }

    pub(crate) fn remove_session(&mut self, deadline_ms: u64, session: SessionId) {
        assert!(self.sessions.remove(&(deadline_ms, session)), "the session's deadline is indexed");
    }

    pub(crate) fn move_session(&mut self, from_ms: u64, to_ms: u64, session: SessionId) {
        self.remove_session(from_ms, session);
        self.add_session(to_ms, session);
    }

    /// Indexes a wait's deadline; a wait without one (waiting for ever) has nothing to index.
    pub(crate) fn add_wait(&mut self, deadline_ms: Option<u64>, session: SessionId, name: &str) {
        if let Some(deadline_ms) = deadline_ms {
            assert!(
                self.waits.insert((deadline_ms, session, name.to_owned())),
                "a session waits once per lock"
            );
        }
    }

    pub(crate) fn remove_wait(&mut self, deadline_ms: Option<u64>, session: SessionId, name: &str) {
        if let Some(deadline_ms) = deadline_ms {
            assert!(
                self.waits.remove(&(deadline_ms, session, name.to_owned())),
                "the wait's deadline is indexed"
            );
        }
    }

    pub(crate) fn add_delay(&mut self, until_ms: u64, name: &str) {
        assert!(self.delays.insert((until_ms, name.to_owned())), "a lock has one lock-delay");
    }

    /// The earliest deadline of each kind: a session's, a wait's, a lock-delay's end.
    pub(crate) fn earliest(&self) -> (Option<u64>, Option<u64>, Option<u64>) {
        (
            self.sessions.first().map(|(deadline_ms, _)| *deadline_ms),
            self.waits.first().map(|(deadline_ms, _, _)| *deadline_ms),
            self.delays.first().map(|(until_ms, _)| *until_ms),
        )
    }

    /// Sessions whose deadline satisfies `expired`, earliest first. Deadlines are sorted, so
    /// `expired` must hold for a prefix of them (it is "the deadline is before some time").
    pub(crate) fn sessions_expired(&self, expired: impl Fn(u64) -> bool) -> Vec<SessionId> {
        self.sessions
            .iter()
            .take_while(|(deadline_ms, _)| expired(*deadline_ms))
            .map(|(_, session)| *session)
            .collect()
    }

    /// Bounded waits whose deadline is before `now_ms`, earliest first, as (session, lock).
    pub(crate) fn waits_before(&self, now_ms: u64) -> Vec<(SessionId, String)> {
        self.waits
            .iter()
            .take_while(|(deadline_ms, _, _)| *deadline_ms < now_ms)
            .map(|(_, session, name)| (*session, name.clone()))
            .collect()
    }

    /// Removes and returns the locks whose lock-delay ends at or before `now_ms`.
    pub(crate) fn take_delays_until(&mut self, now_ms: u64) -> Vec<String> {
        let mut ended = Vec::new();
        while let Some((until_ms, _)) = self.delays.first()
            && *until_ms <= now_ms
        {
            let (_, name) = self.delays.pop_first().expect("checked non-empty");
            ended.push(name);
        }
        ended
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_are_taken_up_to_and_including_now() {
        let mut deadlines = Deadlines::default();
        deadlines.add_delay(10, "a");
        deadlines.add_delay(20, "b");
        deadlines.add_delay(30, "c");
        assert_eq!(deadlines.take_delays_until(20), ["a", "b"]);
        assert_eq!(deadlines.earliest().2, Some(30));
    }

    #[test]
    fn waits_without_deadline_are_not_indexed() {
        let mut deadlines = Deadlines::default();
        deadlines.add_wait(None, SessionId(1), "a");
        deadlines.remove_wait(None, SessionId(1), "a");
        assert_eq!(deadlines, Deadlines::default());
    }

    #[test]
    #[should_panic(expected = "the session's deadline is indexed")]
    fn removing_a_session_that_was_never_indexed_is_a_bug() {
        Deadlines::default().remove_session(5, SessionId(1));
    }
}
