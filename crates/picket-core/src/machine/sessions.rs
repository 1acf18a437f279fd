//! Sessions: opening, keeping alive and ending them, and the tick that expires them, times out
//! waits and ends lock-delays.

use super::{StateMachine, Step};
use crate::error::CommandError;
use crate::limits::MAX_OWNER_BYTES;
use crate::outcome::{Event, Response};
use crate::record::SessionRecord;
use crate::types::{CancelCause, SessionEnd, SessionId};
use std::collections::{BTreeSet, VecDeque};

impl StateMachine {
    pub(super) fn plan_open(
        &self,
        ttl_ms: u64,
        lock_delay_ms: u64,
        owner: Option<&str>,
    ) -> Result<(), CommandError> {
        let limits = &self.limits;
        if let Some(owner) = owner
            && !(1..=MAX_OWNER_BYTES).contains(&owner.len())
        {
            return Err(CommandError::InvalidOwner {
                owner_bytes: owner.len(),
                max_owner_bytes: MAX_OWNER_BYTES,
            });
        }
        if !(limits.min_ttl_ms..=limits.max_ttl_ms).contains(&ttl_ms) {
            return Err(CommandError::TtlOutOfRange {
                ttl_ms,
                min_ttl_ms: limits.min_ttl_ms,
                max_ttl_ms: limits.max_ttl_ms,
            });
        }
        if lock_delay_ms > limits.max_lock_delay_ms {
            return Err(CommandError::LockDelayOutOfRange {
                lock_delay_ms,
                max_lock_delay_ms: limits.max_lock_delay_ms,
            });
        }
        if self.sessions.len() >= limits.max_sessions {
            return Err(CommandError::TooManySessions { max_sessions: limits.max_sessions });
        }
        Ok(())
    }

    pub(super) fn open_session(
        &mut self,
        (ttl_ms, lock_delay_ms): (u64, u64),
        owner: Option<String>,
        step: &mut Step,
    ) -> Response {
        let session = SessionId(self.revision);
        let deadline_ms = step.now_ms.saturating_add(ttl_ms);
        let record = SessionRecord {
            ttl_ms,
            lock_delay_ms,
            deadline_ms,
            lease_ms: None,
            held: BTreeSet::new(),
            waiting: BTreeSet::new(),
            owner,
            abandoned: VecDeque::new(),
            ended_waits: VecDeque::new(),
        };
        assert!(self.sessions.insert(session, record).is_none(), "session ids are never reused");
        self.deadlines.add_session(deadline_ms, session);
        Response::SessionOpened { session, ttl_ms, deadline_ms }
    }

    pub(super) fn keep_alive(&mut self, session: SessionId, step: &Step) -> Response {
        let deadline_ms = self.renew(session, step);
        Response::KeptAlive { session, deadline_ms }
    }

    /// Gives a live session a full TTL from the step's clock and returns its new deadline.
    pub(super) fn renew(&mut self, session: SessionId, step: &Step) -> u64 {
        let ttl_ms = self.sessions.get(&session).expect("renew a live session").ttl_ms;
        self.renew_for(session, step, ttl_ms)
    }

    /// Gives `session` a deadline `lease_ms` from the step's clock; returns it. Under apply
    /// rules 6 the session remembers a lease longer than its TTL for a later `Refresh`, and
    /// forgets it with a renewal for its TTL.
    pub(super) fn renew_for(&mut self, session: SessionId, step: &Step, lease_ms: u64) -> u64 {
        let record = self.sessions.get_mut(&session).expect("renew a live session");
        if step.rules >= 6 {
            record.lease_ms = (lease_ms > record.ttl_ms).then_some(lease_ms);
        }
        let old_deadline_ms = record.deadline_ms;
        record.deadline_ms = step.now_ms.saturating_add(lease_ms);
        let deadline_ms = record.deadline_ms;
        self.deadlines.move_session(old_deadline_ms, deadline_ms, session);
        deadline_ms
    }

    pub(super) fn end_one(
        &mut self,
        session: SessionId,
        end: SessionEnd,
        step: &mut Step,
    ) -> Response {
        let freed = self.end_sessions(&[session], end, step);
        self.promote_all(&freed, step);
        Response::SessionEnded { session }
    }

    /// Ends the sessions: cancels their waits, releases their grants (with lock-delay where the
    /// cause calls for it) and forgets them. Returns the locks that may now be granted.
    ///
    /// All the sessions go before any lock is re-granted, so a lock freed by one of them is never
    /// granted to another that is ending in the same command.
    pub(super) fn end_sessions(
        &mut self,
        sessions: &[SessionId],
        end: SessionEnd,
        step: &mut Step,
    ) -> BTreeSet<String> {
        let mut freed = BTreeSet::new();
        for &session in sessions {
            let record = self.sessions.remove(&session).expect("end a live session");
            self.deadlines.remove_session(record.deadline_ms, session);
            for name in &record.waiting {
                self.remove_waiter(name, session);
                step.events.push(Event::Cancelled {
                    name: name.clone(),
                    session,
                    cause: end.cancel_cause(),
                });
                freed.insert(name.clone());
            }
            for name in &record.held {
                let delay_ms = if end.applies_lock_delay() { record.lock_delay_ms } else { 0 };
                self.end_grant(name, session, end.release_cause(), delay_ms, step);
                freed.insert(name.clone());
            }
            step.events.push(Event::SessionEnded { session, cause: end });
        }
        freed
    }

    pub(super) fn plan_tick(&self, renewals: usize) -> Result<(), CommandError> {
        if renewals > self.limits.max_renewals_per_tick {
            return Err(CommandError::TooManyRenewals {
                count: renewals,
                max: self.limits.max_renewals_per_tick,
            });
        }
        Ok(())
    }

    pub(super) fn tick(
        &mut self,
        renew: &[SessionId],
        renew_for: &[(SessionId, u64)],
        step: &mut Step,
    ) -> Response {
        for &session in renew {
            if self.sessions.contains_key(&session) {
                self.renew(session, step);
            }
        }
        for &(session, lease_ms) in renew_for {
            if let Some(record) = self.sessions.get(&session) {
                // `plan` refuses `renew_for` under rules older than 5.
                assert!(step.rules >= 5, "renew_for is planned under rules 5 or later");
                let lease_ms = lease_ms.clamp(record.ttl_ms / 4, record.ttl_ms.saturating_mul(4));
                self.renew_for(session, step, lease_ms);
            }
        }
        let stamp_ms = step.stamp_ms;
        let expired = self
            .deadlines
            .sessions_expired(|deadline_ms| self.session_expiry_ms(deadline_ms) < stamp_ms);
        let mut freed = self.end_sessions(&expired, SessionEnd::Expired, step);
        freed.append(&mut self.time_out_waits(step));
        freed.append(&mut self.end_delays(stamp_ms));
        self.promote_all(&freed, step);
        Response::Ticked
    }

    /// Drops every bounded wait whose deadline has passed by the tick's own reading. Returns
    /// the locks touched.
    pub(super) fn time_out_waits(&mut self, step: &mut Step) -> BTreeSet<String> {
        let mut touched = BTreeSet::new();
        for (session, name) in self.deadlines.waits_before(step.stamp_ms) {
            let waiter = self.remove_waiter(&name, session);
            let record = self.sessions.get_mut(&session).expect("a waiter's session is live");
            assert!(record.waiting.remove(&name));
            if step.rules >= 3 {
                record.remember_ended_wait(waiter.request, CancelCause::TimedOut);
            }
            step.events.push(Event::Cancelled {
                name: name.clone(),
                session,
                cause: CancelCause::TimedOut,
            });
            touched.insert(name);
        }
        touched
    }

    /// Ends every lock-delay that is over. Returns the locks touched.
    pub(super) fn end_delays(&mut self, now_ms: u64) -> BTreeSet<String> {
        let mut touched = BTreeSet::new();
        for name in self.deadlines.take_delays_until(now_ms) {
            let lock = self.locks.get_mut(&name).expect("a delayed lock has a record");
            assert!(lock.delay.take().is_some());
            touched.insert(name);
        }
        touched
    }

    /// Gives every session a full lease from the step's clock: its TTL, or under apply rules 6
    /// the longer lease its last renewal gave it (see [`SessionRecord::lease_ms`]).
    pub(super) fn refresh(&mut self, step: &Step) -> Response {
        let now_ms = step.now_ms;
        for record in self.sessions.values_mut() {
            let lease_ms = match record.lease_ms {
                Some(lease_ms) if step.rules >= 6 => lease_ms.max(record.ttl_ms),
                _ => record.ttl_ms,
            };
            record.deadline_ms = now_ms.saturating_add(lease_ms);
        }
        for lock in self.locks.values_mut() {
            for waiter in &mut lock.waiters {
                waiter.deadline_ms = waiter.wait_ms.map(|wait_ms| now_ms.saturating_add(wait_ms));
            }
            if let Some(delay) = &mut lock.delay {
                delay.until_ms = now_ms.saturating_add(delay.length_ms);
            }
        }
        self.rebuild_indices();
        Response::Refreshed
    }
}
