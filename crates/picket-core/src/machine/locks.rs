//! Locks: acquiring (at once or by waiting in the queue), abandoning, cancelling a wait,
//! releasing, and granting a freed lock to the head of its queue.

use super::{AbandonPlan, AcquirePlan, StateMachine, Step};
use crate::error::CommandError;
use crate::name::validate_name;
use crate::outcome::{Event, Response};
use crate::record::{Delay, Holder, LockRecord, Waiter};
use crate::types::{CancelCause, ReleaseCause, RequestId, SessionId, Wait};
use std::collections::BTreeSet;

impl StateMachine {
    pub(super) fn plan_acquire(
        &self,
        session: SessionId,
        name: &str,
        wait: Wait,
        (request, attempt): (RequestId, u32),
        rules: u32,
    ) -> Result<AcquirePlan, CommandError> {
        validate_name(name, &self.limits).map_err(CommandError::InvalidName)?;
        let wait = wait.normalized();
        let wait_ms = self.validate_wait(wait)?;
        let session_record = self.session_record(session)?;
        if rules >= 1 && session_record.abandoned(request, attempt) {
            // Its caller is gone: a grant would have nobody to hold it.
            return Err(CommandError::RequestAbandoned { name: name.to_owned(), session, request });
        }
        let lock_record = self.locks.get(name);
        let holder = lock_record.and_then(|lock| lock.holder);
        if let Some(holder) = holder.filter(|holder| holder.session == session) {
            return Ok(AcquirePlan::AlreadyHeld { token: holder.token, tell: rules >= 2 });
        }
        let free = lock_record.is_none_or(LockRecord::is_free);
        if lock_record.is_none() && self.locks.len() >= self.limits.max_locks {
            // A grant would create a record; there is no room for one.
            return Err(CommandError::TooManyLocks { max_locks: self.limits.max_locks });
        }
        if wait == Wait::Try {
            if free {
                self.check_session_room(session)?;
                return Ok(AcquirePlan::Grant);
            }
            return Err(self.busy_error(name));
        }
        if session_record.waiting.contains(name) {
            let waiting_request = self.waiter(name, session).request;
            if waiting_request != request {
                return Err(CommandError::AlreadyWaiting {
                    name: name.to_owned(),
                    session,
                    waiting_request,
                });
            }
            return Ok(if rules >= 3 {
                AcquirePlan::Join
            } else {
                AcquirePlan::Rewait { wait_ms }
            });
        }
        // Decided after the grant and the wait a request may hold, which always win: a request
        // remembered as ended can wait again through an entry of older rules.
        if rules >= 3
            && let Some(cause) = session_record.ended_wait(request)
        {
            // A retry after its answer was lost: it gets that answer, not a second wait.
            let holder_token = self.locks.get(name).and_then(|lock| lock.holder).map(|h| h.token);
            return Err(CommandError::WaitEnded {
                name: name.to_owned(),
                session,
                request,
                cause,
                holder_token,
            });
        }
        self.check_session_room(session)?;
        if free {
            return Ok(AcquirePlan::Grant);
        }
        let queue_len = lock_record.map_or(0, |lock| lock.waiters.len());
        if queue_len >= self.limits.max_waiters_per_lock {
            return Err(CommandError::TooManyWaiters {
                name: name.to_owned(),
                max_waiters: self.limits.max_waiters_per_lock,
            });
        }
        Ok(AcquirePlan::Enqueue { wait_ms })
    }

    pub(super) fn acquire(
        &mut self,
        session: SessionId,
        name: &str,
        (request, attempt): (RequestId, u32),
        plan: AcquirePlan,
        step: &mut Step,
    ) -> Response {
        match plan {
            AcquirePlan::AlreadyHeld { token, tell } => {
                let lock = self.locks.get_mut(name).expect("a held lock has a record");
                if tell {
                    // This request's caller is told it holds the lock; the producing request's
                    // may be gone, and abandoning that one must not take the grant away.
                    lock.tell(request, attempt);
                } else {
                    let stored = lock.holder.as_mut().expect("the lock is held");
                    if stored.request == request {
                        stored.attempt = stored.attempt.max(attempt);
                    }
                }
                Response::Granted { name: name.to_owned(), token, already_held: true }
            }
            AcquirePlan::Grant => {
                let token = self.grant(name, session, (request, attempt), step);
                Response::Granted { name: name.to_owned(), token, already_held: false }
            }
            AcquirePlan::Rewait { wait_ms } => {
                self.rewait(name, session, wait_ms, attempt, step.now_ms)
            }
            AcquirePlan::Join => self.join_wait(name, session, attempt),
            AcquirePlan::Enqueue { wait_ms } => {
                let position = self.enqueue(name, session, wait_ms, (request, attempt), step);
                Response::Queued { name: name.to_owned(), position }
            }
        }
    }

    /// The queue entry of a session that waits for `name`.
    pub(super) fn waiter(&self, name: &str, session: SessionId) -> &Waiter {
        let lock = self.locks.get(name).expect("a waiter's lock has a record");
        let position = lock.position_of(session).expect("the session is queued");
        &lock.waiters[position]
    }

    /// Decides what abandoning `request`'s attempt undoes at `name`: its wait, or the grant it
    /// produced, unless a later attempt of the request reached them since.
    pub(super) fn plan_abandon(
        &self,
        session: SessionId,
        name: &str,
        (request, attempt): (RequestId, u32),
        rules: u32,
    ) -> Result<AbandonPlan, CommandError> {
        validate_name(name, &self.limits).map_err(CommandError::InvalidName)?;
        let record = self.session_record(session)?;
        let abandons = |made_by: RequestId, latest_attempt: u32| {
            made_by == request && attempt >= latest_attempt
        };
        if record.waiting.contains(name) && {
            let waiter = self.waiter(name, session);
            abandons(waiter.request, waiter.attempt)
        } {
            return Ok(AbandonPlan::Wait);
        }
        let lock = self.locks.get(name);
        let holder = lock.and_then(|lock| lock.holder).filter(|holder| holder.session == session);
        let told = lock.map(|lock| &lock.also_told);
        let told_of_it = told
            .is_some_and(|told| told.iter().any(|entry| abandons(entry.request, entry.attempt)));
        match holder {
            Some(holder) if abandons(holder.request, holder.attempt) || told_of_it => {
                // The grant ends only with the last request told of it (apply rules 2 tell
                // more than the producing one). An abandon under rules 1 can meet told
                // requests too, in a log where a leader that had not yet heard of rules 2
                // follows one that wrote them: it keeps the grant for them as well. That is
                // the safer reading, and deterministic: it depends only on the state, which
                // every replica shares.
                if told.is_some_and(|told| !told.is_empty()) {
                    Ok(AbandonPlan::Forget)
                } else {
                    Ok(AbandonPlan::Grant { token: holder.token })
                }
            }
            _ if rules >= 1 => Ok(AbandonPlan::Nothing),
            _ => Err(CommandError::NothingToAbandon { name: name.to_owned(), session, request }),
        }
    }

    pub(super) fn abandon(
        &mut self,
        session: SessionId,
        name: &str,
        (request, attempt): (RequestId, u32),
        (plan, rules): (AbandonPlan, u32),
        step: &mut Step,
    ) -> Response {
        if rules >= 1 {
            let record = self.sessions.get_mut(&session).expect("planned on a live session");
            record.remember_abandoned(request, attempt);
        }
        match plan {
            AbandonPlan::Nothing => {
                Response::Abandoned { name: name.to_owned(), released_token: None }
            }
            AbandonPlan::Forget => {
                let lock = self.locks.get_mut(name).expect("planned on a held lock");
                lock.forget(request);
                Response::Abandoned { name: name.to_owned(), released_token: None }
            }
            AbandonPlan::Wait => {
                self.leave_queue(name, session, CancelCause::Abandoned, step);
                Response::Abandoned { name: name.to_owned(), released_token: None }
            }
            AbandonPlan::Grant { token } => {
                let record = self.sessions.get_mut(&session).expect("planned on a live session");
                assert!(record.held.remove(name));
                self.end_grant(name, session, ReleaseCause::Abandoned, 0, step);
                self.promote(name, step);
                Response::Abandoned { name: name.to_owned(), released_token: Some(token) }
            }
        }
    }

    /// Returns the bounded wait in milliseconds, `None` for waiting without a deadline or not at
    /// all.
    pub(super) fn validate_wait(&self, wait: Wait) -> Result<Option<u64>, CommandError> {
        match wait {
            Wait::Try | Wait::Forever => Ok(None),
            Wait::For { wait_ms } if wait_ms > self.limits.max_wait_ms => {
                Err(CommandError::WaitOutOfRange { wait_ms, max_wait_ms: self.limits.max_wait_ms })
            }
            Wait::For { wait_ms } => Ok(Some(wait_ms)),
        }
    }

    pub(super) fn check_session_room(&self, session: SessionId) -> Result<(), CommandError> {
        let record = self.session_record(session)?;
        if record.lock_count() >= self.limits.max_locks_per_session {
            return Err(CommandError::TooManyLocksForSession {
                session,
                max_locks: self.limits.max_locks_per_session,
            });
        }
        Ok(())
    }

    pub(super) fn busy_error(&self, name: &str) -> CommandError {
        let lock = self.locks.get(name).expect("a busy lock has a record");
        match (lock.holder, lock.delay) {
            (Some(holder), _) => {
                CommandError::LockBusy { name: name.to_owned(), holder_token: holder.token }
            }
            (None, Some(delay)) => {
                CommandError::LockDelayed { name: name.to_owned(), until_ms: delay.until_ms }
            }
            // Free but the session is already queued: only possible inside a lock-delay or
            // behind a holder, both handled above.
            (None, None) => unreachable!("a free lock has no waiters"),
        }
    }

    /// A session that is already queued asks again: it keeps its place and takes the new wait.
    pub(super) fn rewait(
        &mut self,
        name: &str,
        session: SessionId,
        wait_ms: Option<u64>,
        attempt: u32,
        now_ms: u64,
    ) -> Response {
        let lock = self.locks.get_mut(name).expect("a waiter's lock has a record");
        let position = lock.position_of(session).expect("the session is queued");
        let waiter = &mut lock.waiters[position];
        waiter.attempt = waiter.attempt.max(attempt);
        self.deadlines.remove_wait(waiter.deadline_ms, session, name);
        waiter.wait_ms = wait_ms;
        waiter.deadline_ms = wait_ms.map(|wait_ms| now_ms.saturating_add(wait_ms));
        self.deadlines.add_wait(waiter.deadline_ms, session, name);
        Response::Queued { name: name.to_owned(), position }
    }

    /// A retry of the request a session waits under: the wait goes on as it was.
    fn join_wait(&mut self, name: &str, session: SessionId, attempt: u32) -> Response {
        let lock = self.locks.get_mut(name).expect("a waiter's lock has a record");
        let position = lock.position_of(session).expect("the session is queued");
        let waiter = &mut lock.waiters[position];
        waiter.attempt = waiter.attempt.max(attempt);
        Response::Queued { name: name.to_owned(), position }
    }

    pub(super) fn enqueue(
        &mut self,
        name: &str,
        session: SessionId,
        wait_ms: Option<u64>,
        (request, attempt): (RequestId, u32),
        step: &mut Step,
    ) -> usize {
        let deadline_ms = wait_ms.map(|wait_ms| step.now_ms.saturating_add(wait_ms));
        let lock = self.locks.get_mut(name).expect("a busy lock has a record");
        lock.waiters.push_back(Waiter { session, wait_ms, deadline_ms, request, attempt });
        let position = lock.waiters.len() - 1;
        assert!(position < self.limits.max_waiters_per_lock);
        let record = self.sessions.get_mut(&session).expect("a waiter's session is live");
        assert!(record.waiting.insert(name.to_owned()));
        self.deadlines.add_wait(deadline_ms, session, name);
        step.events.push(Event::Queued { name: name.to_owned(), session, position });
        position
    }

    pub(super) fn plan_cancel(&self, session: SessionId, name: &str) -> Result<(), CommandError> {
        validate_name(name, &self.limits).map_err(CommandError::InvalidName)?;
        let record = self.session_record(session)?;
        if !record.waiting.contains(name) {
            return Err(CommandError::NotWaiting { name: name.to_owned(), session });
        }
        Ok(())
    }

    pub(super) fn cancel(&mut self, session: SessionId, name: &str, step: &mut Step) -> Response {
        self.leave_queue(name, session, CancelCause::Requested, step);
        Response::Cancelled { name: name.to_owned() }
    }

    /// Takes a live session out of a lock's queue for `cause`, and grants the lock on if that
    /// unblocks it.
    pub(super) fn leave_queue(
        &mut self,
        name: &str,
        session: SessionId,
        cause: CancelCause,
        step: &mut Step,
    ) {
        let waiter = self.remove_waiter(name, session);
        let record = self.sessions.get_mut(&session).expect("a waiter's session is live");
        assert!(record.waiting.remove(name));
        if step.rules >= 3 && cause == CancelCause::Requested {
            // An abandoned request is remembered as such (`remember_abandoned`).
            record.remember_ended_wait(waiter.request, cause);
        }
        step.events.push(Event::Cancelled { name: name.to_owned(), session, cause });
        self.promote(name, step);
    }

    /// Takes a session out of a lock's queue and the wait-deadline index, and returns its
    /// place in the queue. The caller updates the session's own record.
    pub(super) fn remove_waiter(&mut self, name: &str, session: SessionId) -> Waiter {
        let lock = self.locks.get_mut(name).expect("a waiter's lock has a record");
        let position = lock.position_of(session).expect("the session is queued");
        let waiter = lock.waiters.remove(position).expect("position is in range");
        self.deadlines.remove_wait(waiter.deadline_ms, session, name);
        waiter
    }

    pub(super) fn plan_release(
        &self,
        session: SessionId,
        name: &str,
        token: u64,
    ) -> Result<(), CommandError> {
        validate_name(name, &self.limits).map_err(CommandError::InvalidName)?;
        self.session_record(session)?;
        let holder = self.locks.get(name).and_then(|lock| lock.holder);
        match holder {
            Some(holder) if holder.session == session && holder.token == token => {}
            Some(holder) if holder.session == session => {
                return Err(CommandError::TokenMismatch {
                    name: name.to_owned(),
                    presented_token: token,
                    current_token: holder.token,
                });
            }
            _ => {
                return Err(CommandError::NotHeld {
                    name: name.to_owned(),
                    session,
                    holder_token: holder.map(|holder| holder.token),
                });
            }
        }
        Ok(())
    }

    pub(super) fn release(&mut self, session: SessionId, name: &str, step: &mut Step) -> Response {
        let record = self.sessions.get_mut(&session).expect("planned on a live session");
        assert!(record.held.remove(name));
        self.end_grant(name, session, ReleaseCause::Released, 0, step);
        self.promote(name, step);
        Response::Released { name: name.to_owned() }
    }

    /// Clears a lock's holder, starting a lock-delay if `delay_ms` is positive. The caller
    /// updates the session's own record and promotes the next waiter.
    pub(super) fn end_grant(
        &mut self,
        name: &str,
        session: SessionId,
        cause: ReleaseCause,
        delay_ms: u64,
        step: &mut Step,
    ) {
        let lock = self.locks.get_mut(name).expect("a held lock has a record");
        let holder = lock.holder.take().expect("the lock is held");
        lock.also_told.clear();
        assert_eq!(holder.session, session, "only the holder's grant ends");
        assert!(lock.delay.is_none(), "a held lock is never in a lock-delay");
        if delay_ms > 0 {
            let until_ms = step.now_ms.saturating_add(delay_ms);
            lock.delay = Some(Delay { until_ms, length_ms: delay_ms });
            self.deadlines.add_delay(until_ms, name);
        }
        step.events.push(Event::Released {
            name: name.to_owned(),
            session,
            token: holder.token,
            cause,
        });
    }

    pub(super) fn promote_all(&mut self, names: &BTreeSet<String>, step: &mut Step) {
        for name in names {
            self.promote(name, step);
        }
    }

    /// Grants a free lock to the head of its queue, or drops its record if it is idle.
    pub(super) fn promote(&mut self, name: &str, step: &mut Step) {
        let Some(lock) = self.locks.get_mut(name) else { return };
        if !lock.is_free() {
            return;
        }
        match lock.waiters.pop_front() {
            Some(waiter) => {
                self.deadlines.remove_wait(waiter.deadline_ms, waiter.session, name);
                let record =
                    self.sessions.get_mut(&waiter.session).expect("a waiter's session is live");
                assert!(record.waiting.remove(name));
                self.grant(name, waiter.session, (waiter.request, waiter.attempt), step);
            }
            None => {
                assert!(lock.is_idle());
                self.locks.remove(name);
            }
        }
    }

    /// Makes `session` the holder of the free lock `name` for attempt `attempt` of `request`
    /// and returns the token.
    pub(super) fn grant(
        &mut self,
        name: &str,
        session: SessionId,
        (request, attempt): (RequestId, u32),
        step: &mut Step,
    ) -> u64 {
        let token = self.revision;
        assert!(
            step.granted.insert(name.to_owned()),
            "a lock is granted at most once per command, so tokens of a lock never repeat"
        );
        let lock = self.locks.entry(name.to_owned()).or_default();
        assert!(lock.is_free(), "only a free lock is granted");
        assert!(lock.position_of(session).is_none(), "the grantee has left the queue");
        lock.holder = Some(Holder { session, token, request, attempt });
        let record = self.sessions.get_mut(&session).expect("the grantee's session is live");
        assert!(record.held.insert(name.to_owned()));
        assert!(record.lock_count() <= self.limits.max_locks_per_session);
        step.events.push(Event::Granted { name: name.to_owned(), session, token });
        token
    }
}
