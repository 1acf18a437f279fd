//! The lock state machine.
//!
//! ```text
//!            Input { now_ms, command, principal }
//!                      │
//!                      ▼
//!   ┌──────────────────────────────────────────┐
//!   │ StateMachine                              │
//!   │  validate ── refused ──► Err, no change   │
//!   │     │                                     │
//!   │  accept: revision += 1, clock = now_ms    │
//!   │     │                                     │
//!   │  mutate, then promote waiters of every    │
//!   │  lock the command freed                   │
//!   └──────────────────────────────────────────┘
//!                      │
//!                      ▼
//!      Applied { revision, result, events }
//! ```
//!
//! Every command is validated completely before anything changes, so a refused command leaves
//! the state byte-for-byte as it was. An accepted command advances the revision by one; every
//! grant made while applying it gets that revision as its token. Because the revision never
//! goes back (it is part of the state and of every snapshot) and a lock is granted at most once
//! per command, a grant's token is greater than the token of every earlier grant of that lock,
//! whether or not the lock's record was dropped in between.

use crate::command::{Command, Input};
use crate::error::CommandError;
use crate::limits::{Limits, MAX_OWNER_BYTES};
use crate::name::validate_name;
use crate::outcome::{Applied, Event, Response};
use crate::query::{
    CheckOutcome, HolderInfo, LockInfo, Occupancy, QueueSummary, SessionInfo, SessionLease,
};
use crate::record::{Delay, Holder, LockRecord, SessionRecord, Waiter};
use crate::sequencer::Sequencer;
use crate::types::{CancelCause, ReleaseCause, RequestId, SessionEnd, SessionId, Wait};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use thiserror::Error;

/// Why a snapshot could not be restored.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum RestoreError {
    /// The bytes are not a snapshot.
    #[error("the snapshot cannot be decoded ({0}): it is damaged or from an incompatible version")]
    Decode(#[from] serde_json::Error),
    /// The snapshot decodes but breaks an invariant of the state.
    #[error("the snapshot is inconsistent ({0}): it is damaged; restore from another replica")]
    Inconsistent(String),
}

/// The deterministic lock state machine. See the module documentation.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct StateMachine {
    limits: Limits,
    revision: u64,
    now_ms: u64,
    sessions: BTreeMap<SessionId, SessionRecord>,
    locks: BTreeMap<String, LockRecord>,
    /// Derived indices, rebuilt on restore rather than stored: (deadline, session).
    #[serde(skip)]
    session_deadlines: BTreeSet<(u64, SessionId)>,
    /// (deadline, session, lock) for every bounded wait.
    #[serde(skip)]
    wait_deadlines: BTreeSet<(u64, SessionId, String)>,
    /// (end, lock) for every lock-delay in force.
    #[serde(skip)]
    delay_ends: BTreeSet<(u64, String)>,
}

/// What an accepted command will do, decided from the state before any change.
#[derive(Debug)]
enum Plan {
    /// Nothing to decide beyond acceptance.
    Simple,
    Acquire(AcquirePlan),
    Abandon(AbandonPlan),
}

#[derive(Debug)]
enum AcquirePlan {
    /// The session holds the lock already, with this token.
    AlreadyHeld {
        token: u64,
    },
    Grant,
    /// The session waits already under this request: it keeps its place with the new wait.
    Rewait {
        wait_ms: Option<u64>,
    },
    Enqueue {
        wait_ms: Option<u64>,
    },
}

#[derive(Debug)]
enum AbandonPlan {
    Wait,
    Grant { token: u64 },
}

/// What one command did so far: its clock, its events, and the locks it granted.
struct Step {
    /// The state's clock once this command is accepted: never behind the previous command's.
    now_ms: u64,
    /// The command's own reading of the leader's clock, which may be behind `now_ms` when
    /// commands stamped concurrently reach the log out of order. A tick expires by this reading
    /// alone: the leader read it before taking the keepalives the tick carries, so a keepalive
    /// it acknowledged after that reading is never expired by this tick.
    stamp_ms: u64,
    events: Vec<Event>,
    granted: BTreeSet<String>,
}

/// Where the restore epoch starts in a revision: the top 16 bits are the epoch, the low 48
/// count commands within it (2^48 is 89 years at 100,000 commands a second).
pub const RESTORE_EPOCH_SHIFT: u32 = 48;

impl StateMachine {
    /// An empty state with the given limits.
    ///
    /// # Panics
    /// If the limits are inconsistent (see [`Limits::validate`]); that is a configuration bug.
    #[must_use]
    pub fn new(limits: Limits) -> Self {
        if let Err(message) = limits.validate() {
            panic!("invalid limits: {message}");
        }
        Self {
            limits,
            revision: 0,
            now_ms: 0,
            sessions: BTreeMap::new(),
            locks: BTreeMap::new(),
            session_deadlines: BTreeSet::new(),
            wait_deadlines: BTreeSet::new(),
            delay_ends: BTreeSet::new(),
        }
    }

    /// The revision: how many commands have been accepted. Every grant's token is the revision
    /// of the command that granted it.
    #[must_use]
    pub fn revision(&self) -> u64 {
        self.revision
    }

    /// The restore epoch: the revision's top 16 bits. A cluster starts in epoch 0 and counts
    /// up within it; a state restored from a backup starts the next epoch
    /// ([`StateMachine::into_next_epoch`]).
    #[must_use]
    pub fn restore_epoch(&self) -> u64 {
        self.revision >> RESTORE_EPOCH_SHIFT
    }

    /// This state as the start of the next restore epoch: its revision becomes that epoch's
    /// first, so every token granted from now on is greater than any revision the state it was
    /// copied from could reach within its own epoch, however long that one went on after the
    /// copy. Everything else (sessions, grants and their tokens, queues) is kept. `None` in the
    /// last epoch.
    #[must_use]
    pub fn into_next_epoch(self) -> Option<Self> {
        let next = self.restore_epoch() + 1;
        self.into_epoch(next)
    }

    /// This state as the start of restore epoch `epoch`, which must be above its own: for a
    /// restore that must also start above tokens the state never saw (a backup restored a
    /// second time, whose first restore went on granting). `None` when `epoch` is not above
    /// this state's, or past the last epoch.
    #[must_use]
    pub fn into_epoch(mut self, epoch: u64) -> Option<Self> {
        let next = epoch;
        if next <= self.restore_epoch() {
            return None;
        }
        if next >> (u64::BITS - RESTORE_EPOCH_SHIFT) != 0 {
            return None;
        }
        self.revision = next << RESTORE_EPOCH_SHIFT;
        Some(self)
    }

    /// This state without any session, grant, wait or lock-delay: its limits, clock and
    /// revision only. A restore that must not bring back holders nobody remembers starts from
    /// it (`picket serve --restore`, the default): every lock is free, and the next token is
    /// still above every earlier one.
    #[must_use]
    pub fn without_sessions(self) -> Self {
        Self {
            limits: self.limits,
            revision: self.revision,
            now_ms: self.now_ms,
            sessions: BTreeMap::new(),
            locks: BTreeMap::new(),
            session_deadlines: BTreeSet::new(),
            wait_deadlines: BTreeSet::new(),
            delay_ends: BTreeSet::new(),
        }
    }

    /// The state machine's clock: the `now_ms` of the last accepted command.
    #[must_use]
    pub fn now_ms(&self) -> u64 {
        self.now_ms
    }

    /// The limits this state enforces.
    #[must_use]
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// The earliest clock reading at which a [`Command::Tick`] would change something: a session
    /// expiring, a bounded wait timing out, or a lock-delay ending. `None` when nothing is
    /// pending. The leader sleeps until then instead of ticking on a fixed period.
    #[must_use]
    pub fn next_deadline_ms(&self) -> Option<u64> {
        // Sessions end once the clock is past their deadline and its grace, waits once it is
        // past their deadline, delays once it reaches their end.
        let session = self
            .session_deadlines
            .first()
            .map(|(deadline_ms, _)| self.session_expiry_ms(*deadline_ms).saturating_add(1));
        let wait =
            self.wait_deadlines.first().map(|(deadline_ms, _, _)| deadline_ms.saturating_add(1));
        let delay = self.delay_ends.first().map(|(until_ms, _)| *until_ms);
        [session, wait, delay].into_iter().flatten().min()
    }

    /// The last clock reading at which a session with this deadline is still alive.
    fn session_expiry_ms(&self, deadline_ms: u64) -> u64 {
        deadline_ms.saturating_add(self.limits.session_expiry_grace_ms)
    }

    /// Number of live sessions.
    #[must_use]
    pub fn session_count(&self) -> usize {
        self.sessions.len()
    }

    /// Number of lock records (held, awaited or delayed locks).
    #[must_use]
    pub fn lock_count(&self) -> usize {
        self.locks.len()
    }

    /// Applies one input. Never panics on any input; panics only if an internal invariant is
    /// broken, which is a bug in this crate.
    pub fn apply(&mut self, input: &Input) -> Applied {
        let now_ms = match input.command {
            // A new leader's clock is unrelated to the old one's, so it replaces it.
            Command::Refresh => input.now_ms,
            // Within one leader, time never runs backwards even if a reading does.
            _ => self.now_ms.max(input.now_ms),
        };
        let revision_before = self.revision;
        let mut step =
            Step { now_ms, stamp_ms: input.now_ms, events: Vec::new(), granted: BTreeSet::new() };
        let result = self.dispatch(input, &mut step);
        match &result {
            Ok(_) => assert_eq!(
                self.revision,
                revision_before + 1,
                "an accepted command advances the revision by one"
            ),
            Err(_) => {
                assert_eq!(self.revision, revision_before, "a refused command changes nothing");
                assert!(step.events.is_empty(), "a refused command emits no events");
            }
        }
        Applied { revision: self.revision, result, events: step.events }
    }

    /// Whether `command` would be accepted by the current state, and if not, the refusal that
    /// applying it now would return. The same code decides at apply time, so a leader can refuse
    /// a command before it reaches the log (the state may still change before it is applied;
    /// apply decides again).
    ///
    /// # Errors
    /// The refusal.
    pub fn validate(&self, command: &Command) -> Result<(), CommandError> {
        self.plan(command).map(|_| ())
    }

    /// The refusal of `command` that no command not yet applied could overturn, if any: the
    /// leader answers it without writing the command to the log, so input that would be
    /// refused costs no log entry, no sync and no replication.
    ///
    /// Only refusals that hold whatever comes next qualify: bad input (a name, a TTL, a
    /// lock-delay, a wait, a tick's size), and an unknown session whose id is not above the
    /// revision (ids are revisions and never reused, so that session ended for good). Other
    /// refusals depend on state that an entry still in flight may change (an acquire proposed
    /// just before an abandon of it), and are decided at apply.
    #[must_use]
    pub fn refusal_before_log(&self, command: &Command) -> Option<CommandError> {
        self.validate(command).err().filter(|refusal| self.refusal_lasts(refusal))
    }

    /// Whether a refusal by this state holds whatever is applied next (see
    /// [`StateMachine::refusal_before_log`]).
    #[must_use]
    pub fn refusal_lasts(&self, refusal: &CommandError) -> bool {
        match refusal {
            CommandError::InvalidName(_)
            | CommandError::TtlOutOfRange { .. }
            | CommandError::LockDelayOutOfRange { .. }
            | CommandError::WaitOutOfRange { .. }
            | CommandError::TooManyRenewals { .. } => true,
            CommandError::UnknownSession { session } => session.0 <= self.revision,
            _ => false,
        }
    }

    /// Decides, from the state before any change, whether the command is accepted and what it
    /// will do.
    /// Refuses a command sent by a principal in a session another principal (or nobody)
    /// opened. Decided here, at apply, so no command can slip between a check and its write.
    fn check_principal(&self, input: &Input) -> Result<(), CommandError> {
        let (Some(principal), Some(session)) = (&input.principal, input.command.session_used())
        else {
            return Ok(());
        };
        match self.sessions.get(&session) {
            Some(record) if record.owner.as_deref() != Some(principal.as_str()) => {
                Err(CommandError::NotOwner { session })
            }
            // An unknown session is refused as such by the command's own plan.
            _ => Ok(()),
        }
    }

    fn plan(&self, command: &Command) -> Result<Plan, CommandError> {
        match command {
            Command::OpenSession { ttl_ms, lock_delay_ms, owner } => {
                self.plan_open(*ttl_ms, *lock_delay_ms, owner.as_deref()).map(|()| Plan::Simple)
            }
            Command::KeepAlive { session }
            | Command::CloseSession { session }
            | Command::RevokeSession { session } => {
                self.session_record(*session).map(|_| Plan::Simple)
            }
            Command::Acquire { session, name, wait, request, .. } => {
                self.plan_acquire(*session, name, *wait, *request).map(Plan::Acquire)
            }
            Command::Abandon { session, name, request, attempt } => {
                self.plan_abandon(*session, name, (*request, *attempt)).map(Plan::Abandon)
            }
            Command::Cancel { session, name } => {
                self.plan_cancel(*session, name).map(|()| Plan::Simple)
            }
            Command::Release { session, name, token } => {
                self.plan_release(*session, name, *token).map(|()| Plan::Simple)
            }
            Command::Tick { renew } => self.plan_tick(renew).map(|()| Plan::Simple),
            Command::Refresh => Ok(Plan::Simple),
        }
    }

    fn dispatch(&mut self, input: &Input, step: &mut Step) -> Result<Response, CommandError> {
        let command = &input.command;
        self.check_principal(input)?;
        let plan = self.plan(command)?;
        self.accept(step);
        Ok(match (command, plan) {
            (Command::OpenSession { ttl_ms, lock_delay_ms, owner }, _) => {
                self.open_session((*ttl_ms, *lock_delay_ms), owner.clone(), step)
            }
            (Command::KeepAlive { session }, _) => self.keep_alive(*session, step),
            (Command::CloseSession { session }, _) => {
                self.end_one(*session, SessionEnd::Closed, step)
            }
            (Command::RevokeSession { session }, _) => {
                self.end_one(*session, SessionEnd::Revoked, step)
            }
            (Command::Acquire { session, name, request, attempt, .. }, Plan::Acquire(plan)) => {
                self.acquire(*session, name, (*request, *attempt), plan, step)
            }
            (Command::Abandon { session, name, .. }, Plan::Abandon(plan)) => {
                self.abandon(*session, name, plan, step)
            }
            (Command::Cancel { session, name }, _) => self.cancel(*session, name, step),
            (Command::Release { session, name, .. }, _) => self.release(*session, name, step),
            (Command::Tick { renew }, _) => self.tick(renew, step),
            (Command::Refresh, _) => self.refresh(step),
            (command, plan) => unreachable!("{command} was planned as {plan:?}"),
        })
    }

    /// Marks the command accepted. Called exactly once per accepted command, by `dispatch`,
    /// after its plan and before the first change.
    fn accept(&mut self, step: &Step) {
        self.revision =
            self.revision.checked_add(1).expect("revision overflow after 2^64 commands");
        self.now_ms = step.now_ms;
    }

    fn session_record(&self, session: SessionId) -> Result<&SessionRecord, CommandError> {
        self.sessions.get(&session).ok_or(CommandError::UnknownSession { session })
    }

    fn plan_open(
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

    fn open_session(
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
            held: BTreeSet::new(),
            waiting: BTreeSet::new(),
            owner,
        };
        assert!(self.sessions.insert(session, record).is_none(), "session ids are never reused");
        assert!(self.session_deadlines.insert((deadline_ms, session)));
        Response::SessionOpened { session, ttl_ms, deadline_ms }
    }

    fn keep_alive(&mut self, session: SessionId, step: &Step) -> Response {
        let deadline_ms = self.renew(session, step.now_ms);
        Response::KeptAlive { session, deadline_ms }
    }

    /// Gives a live session a full TTL from `now_ms` and returns its new deadline.
    fn renew(&mut self, session: SessionId, now_ms: u64) -> u64 {
        let record = self.sessions.get_mut(&session).expect("renew a live session");
        let old_deadline_ms = record.deadline_ms;
        record.deadline_ms = now_ms.saturating_add(record.ttl_ms);
        let deadline_ms = record.deadline_ms;
        assert!(self.session_deadlines.remove(&(old_deadline_ms, session)));
        assert!(self.session_deadlines.insert((deadline_ms, session)));
        deadline_ms
    }

    fn end_one(&mut self, session: SessionId, end: SessionEnd, step: &mut Step) -> Response {
        let freed = self.end_sessions(&[session], end, step);
        self.promote_all(&freed, step);
        Response::SessionEnded { session }
    }

    /// Ends the sessions: cancels their waits, releases their grants (with lock-delay where the
    /// cause calls for it) and forgets them. Returns the locks that may now be granted.
    ///
    /// All the sessions go before any lock is re-granted, so a lock freed by one of them is never
    /// granted to another that is ending in the same command.
    fn end_sessions(
        &mut self,
        sessions: &[SessionId],
        end: SessionEnd,
        step: &mut Step,
    ) -> BTreeSet<String> {
        let mut freed = BTreeSet::new();
        for &session in sessions {
            let record = self.sessions.remove(&session).expect("end a live session");
            assert!(self.session_deadlines.remove(&(record.deadline_ms, session)));
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

    fn plan_acquire(
        &self,
        session: SessionId,
        name: &str,
        wait: Wait,
        request: RequestId,
    ) -> Result<AcquirePlan, CommandError> {
        validate_name(name, &self.limits).map_err(CommandError::InvalidName)?;
        // Waiting zero milliseconds is trying.
        let wait = if wait == (Wait::For { wait_ms: 0 }) { Wait::Try } else { wait };
        let wait_ms = self.validate_wait(wait)?;
        let session_record = self.session_record(session)?;
        let lock_record = self.locks.get(name);
        let holder = lock_record.and_then(|lock| lock.holder);
        if let Some(holder) = holder.filter(|holder| holder.session == session) {
            return Ok(AcquirePlan::AlreadyHeld { token: holder.token });
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
            return Ok(AcquirePlan::Rewait { wait_ms });
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

    fn acquire(
        &mut self,
        session: SessionId,
        name: &str,
        (request, attempt): (RequestId, u32),
        plan: AcquirePlan,
        step: &mut Step,
    ) -> Response {
        match plan {
            AcquirePlan::AlreadyHeld { token } => {
                let lock = self.locks.get_mut(name).expect("a held lock has a record");
                let stored = lock.holder.as_mut().expect("the lock is held");
                if stored.request == request {
                    stored.attempt = stored.attempt.max(attempt);
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
            AcquirePlan::Enqueue { wait_ms } => {
                let position = self.enqueue(name, session, wait_ms, (request, attempt), step);
                Response::Queued { name: name.to_owned(), position }
            }
        }
    }

    /// The queue entry of a session that waits for `name`.
    fn waiter(&self, name: &str, session: SessionId) -> &Waiter {
        let lock = self.locks.get(name).expect("a waiter's lock has a record");
        let position = lock.position_of(session).expect("the session is queued");
        &lock.waiters[position]
    }

    /// Decides what abandoning `request`'s attempt undoes at `name`: its wait, or the grant it
    /// produced, unless a later attempt of the request reached them since.
    fn plan_abandon(
        &self,
        session: SessionId,
        name: &str,
        (request, attempt): (RequestId, u32),
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
        let holder = self.locks.get(name).and_then(|lock| lock.holder);
        match holder
            .filter(|holder| holder.session == session && abandons(holder.request, holder.attempt))
        {
            Some(holder) => Ok(AbandonPlan::Grant { token: holder.token }),
            None => Err(CommandError::NothingToAbandon { name: name.to_owned(), session, request }),
        }
    }

    fn abandon(
        &mut self,
        session: SessionId,
        name: &str,
        plan: AbandonPlan,
        step: &mut Step,
    ) -> Response {
        match plan {
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
    fn validate_wait(&self, wait: Wait) -> Result<Option<u64>, CommandError> {
        match wait {
            Wait::Try | Wait::Forever => Ok(None),
            Wait::For { wait_ms } if wait_ms > self.limits.max_wait_ms => {
                Err(CommandError::WaitOutOfRange { wait_ms, max_wait_ms: self.limits.max_wait_ms })
            }
            Wait::For { wait_ms } => Ok(Some(wait_ms)),
        }
    }

    fn check_session_room(&self, session: SessionId) -> Result<(), CommandError> {
        let record = self.session_record(session)?;
        if record.lock_count() >= self.limits.max_locks_per_session {
            return Err(CommandError::TooManyLocksForSession {
                session,
                max_locks: self.limits.max_locks_per_session,
            });
        }
        Ok(())
    }

    fn busy_error(&self, name: &str) -> CommandError {
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
    fn rewait(
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
        if let Some(deadline_ms) = waiter.deadline_ms {
            assert!(self.wait_deadlines.remove(&(deadline_ms, session, name.to_owned())));
        }
        waiter.wait_ms = wait_ms;
        waiter.deadline_ms = wait_ms.map(|wait_ms| now_ms.saturating_add(wait_ms));
        if let Some(deadline_ms) = waiter.deadline_ms {
            assert!(self.wait_deadlines.insert((deadline_ms, session, name.to_owned())));
        }
        Response::Queued { name: name.to_owned(), position }
    }

    fn enqueue(
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
        if let Some(deadline_ms) = deadline_ms {
            assert!(self.wait_deadlines.insert((deadline_ms, session, name.to_owned())));
        }
        step.events.push(Event::Queued { name: name.to_owned(), session, position });
        position
    }

    fn plan_cancel(&self, session: SessionId, name: &str) -> Result<(), CommandError> {
        validate_name(name, &self.limits).map_err(CommandError::InvalidName)?;
        let record = self.session_record(session)?;
        if !record.waiting.contains(name) {
            return Err(CommandError::NotWaiting { name: name.to_owned(), session });
        }
        Ok(())
    }

    fn cancel(&mut self, session: SessionId, name: &str, step: &mut Step) -> Response {
        self.leave_queue(name, session, CancelCause::Requested, step);
        Response::Cancelled { name: name.to_owned() }
    }

    /// Takes a live session out of a lock's queue for `cause`, and grants the lock on if that
    /// unblocks it.
    fn leave_queue(&mut self, name: &str, session: SessionId, cause: CancelCause, step: &mut Step) {
        self.remove_waiter(name, session);
        let record = self.sessions.get_mut(&session).expect("a waiter's session is live");
        assert!(record.waiting.remove(name));
        step.events.push(Event::Cancelled { name: name.to_owned(), session, cause });
        self.promote(name, step);
    }

    /// Takes a session out of a lock's queue and the wait-deadline index. The caller updates the
    /// session's own record.
    fn remove_waiter(&mut self, name: &str, session: SessionId) {
        let lock = self.locks.get_mut(name).expect("a waiter's lock has a record");
        let position = lock.position_of(session).expect("the session is queued");
        let waiter = lock.waiters.remove(position).expect("position is in range");
        if let Some(deadline_ms) = waiter.deadline_ms {
            assert!(self.wait_deadlines.remove(&(deadline_ms, session, name.to_owned())));
        }
    }

    fn plan_release(&self, session: SessionId, name: &str, token: u64) -> Result<(), CommandError> {
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

    fn release(&mut self, session: SessionId, name: &str, step: &mut Step) -> Response {
        let record = self.sessions.get_mut(&session).expect("planned on a live session");
        assert!(record.held.remove(name));
        self.end_grant(name, session, ReleaseCause::Released, 0, step);
        self.promote(name, step);
        Response::Released { name: name.to_owned() }
    }

    /// Clears a lock's holder, starting a lock-delay if `delay_ms` is positive. The caller
    /// updates the session's own record and promotes the next waiter.
    fn end_grant(
        &mut self,
        name: &str,
        session: SessionId,
        cause: ReleaseCause,
        delay_ms: u64,
        step: &mut Step,
    ) {
        let lock = self.locks.get_mut(name).expect("a held lock has a record");
        let holder = lock.holder.take().expect("the lock is held");
        assert_eq!(holder.session, session, "only the holder's grant ends");
        assert!(lock.delay.is_none(), "a held lock is never in a lock-delay");
        if delay_ms > 0 {
            let until_ms = step.now_ms.saturating_add(delay_ms);
            lock.delay = Some(Delay { until_ms, length_ms: delay_ms });
            assert!(self.delay_ends.insert((until_ms, name.to_owned())));
        }
        step.events.push(Event::Released {
            name: name.to_owned(),
            session,
            token: holder.token,
            cause,
        });
    }

    fn plan_tick(&self, renew: &[SessionId]) -> Result<(), CommandError> {
        if renew.len() > self.limits.max_renewals_per_tick {
            return Err(CommandError::TooManyRenewals {
                count: renew.len(),
                max: self.limits.max_renewals_per_tick,
            });
        }
        Ok(())
    }

    fn tick(&mut self, renew: &[SessionId], step: &mut Step) -> Response {
        for &session in renew {
            if self.sessions.contains_key(&session) {
                self.renew(session, step.now_ms);
            }
        }
        let stamp_ms = step.stamp_ms;
        let expired: Vec<SessionId> = self
            .session_deadlines
            .iter()
            .take_while(|(deadline_ms, _)| self.session_expiry_ms(*deadline_ms) < stamp_ms)
            .map(|(_, session)| *session)
            .collect();
        let mut freed = self.end_sessions(&expired, SessionEnd::Expired, step);
        freed.append(&mut self.time_out_waits(step));
        freed.append(&mut self.end_delays(stamp_ms));
        self.promote_all(&freed, step);
        Response::Ticked
    }

    /// Drops every bounded wait whose deadline has passed by the tick's own reading. Returns
    /// the locks touched.
    fn time_out_waits(&mut self, step: &mut Step) -> BTreeSet<String> {
        let now_ms = step.stamp_ms;
        let timed_out: Vec<(u64, SessionId, String)> = self
            .wait_deadlines
            .iter()
            .take_while(|(deadline_ms, _, _)| *deadline_ms < now_ms)
            .cloned()
            .collect();
        let mut touched = BTreeSet::new();
        for (_, session, name) in timed_out {
            self.remove_waiter(&name, session);
            let record = self.sessions.get_mut(&session).expect("a waiter's session is live");
            assert!(record.waiting.remove(&name));
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
    fn end_delays(&mut self, now_ms: u64) -> BTreeSet<String> {
        let ended: Vec<(u64, String)> = self
            .delay_ends
            .iter()
            .take_while(|(until_ms, _)| *until_ms <= now_ms)
            .cloned()
            .collect();
        let mut touched = BTreeSet::new();
        for entry in ended {
            assert!(self.delay_ends.remove(&entry));
            let (_, name) = entry;
            let lock = self.locks.get_mut(&name).expect("a delayed lock has a record");
            assert!(lock.delay.take().is_some());
            touched.insert(name);
        }
        touched
    }

    fn refresh(&mut self, step: &Step) -> Response {
        let now_ms = step.now_ms;
        for record in self.sessions.values_mut() {
            record.deadline_ms = now_ms.saturating_add(record.ttl_ms);
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

    fn promote_all(&mut self, names: &BTreeSet<String>, step: &mut Step) {
        for name in names {
            self.promote(name, step);
        }
    }

    /// Grants a free lock to the head of its queue, or drops its record if it is idle.
    fn promote(&mut self, name: &str, step: &mut Step) {
        let Some(lock) = self.locks.get_mut(name) else { return };
        if !lock.is_free() {
            return;
        }
        match lock.waiters.pop_front() {
            Some(waiter) => {
                if let Some(deadline_ms) = waiter.deadline_ms {
                    assert!(self.wait_deadlines.remove(&(
                        deadline_ms,
                        waiter.session,
                        name.to_owned()
                    )));
                }
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
    fn grant(
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

    fn rebuild_indices(&mut self) {
        self.session_deadlines =
            self.sessions.iter().map(|(session, record)| (record.deadline_ms, *session)).collect();
        self.wait_deadlines = self
            .locks
            .iter()
            .flat_map(|(name, lock)| {
                lock.waiters.iter().filter_map(move |waiter| {
                    waiter
                        .deadline_ms
                        .map(|deadline_ms| (deadline_ms, waiter.session, name.clone()))
                })
            })
            .collect();
        self.delay_ends = self
            .locks
            .iter()
            .filter_map(|(name, lock)| lock.delay.map(|delay| (delay.until_ms, name.clone())))
            .collect();
    }
}

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
        machine.limits.validate().map_err(RestoreError::Inconsistent)?;
        machine.rebuild_indices();
        machine.check_invariants().map_err(RestoreError::Inconsistent)?;
        Ok(machine)
    }

    /// Checks every structural invariant of the state. It costs a pass over the whole state, so
    /// the shells run it on restore and the tests after every step; the cheap ones are also
    /// asserted inline on every change.
    ///
    /// # Errors
    /// A sentence naming the first broken invariant.
    pub fn check_invariants(&self) -> Result<(), String> {
        if self.sessions.len() > self.limits.max_sessions {
            return Err(format!("{} sessions exceed the limit", self.sessions.len()));
        }
        for (session, record) in &self.sessions {
            self.check_session(*session, record)?;
        }
        for (name, lock) in &self.locks {
            self.check_lock(name, lock)?;
        }
        let mut copy = self.clone();
        copy.rebuild_indices();
        if copy.session_deadlines != self.session_deadlines
            || copy.wait_deadlines != self.wait_deadlines
            || copy.delay_ends != self.delay_ends
        {
            return Err("a deadline index disagrees with the records".to_owned());
        }
        Ok(())
    }

    fn check_session(&self, session: SessionId, record: &SessionRecord) -> Result<(), String> {
        if session.0 == 0 || session.0 > self.revision {
            return Err(format!("session {session} was not opened at a past revision"));
        }
        if record.lock_count() > self.limits.max_locks_per_session {
            return Err(format!("session {session} holds or waits for too many locks"));
        }
        for name in &record.held {
            let holder = self.locks.get(name).and_then(|lock| lock.holder);
            if holder.map(|holder| holder.session) != Some(session) {
                return Err(format!(
                    "session {session} lists {name:?} as held but is not its holder"
                ));
            }
        }
        for name in &record.waiting {
            let queued = self.locks.get(name).and_then(|lock| lock.position_of(session));
            if queued.is_none() {
                return Err(format!(
                    "session {session} lists {name:?} as awaited but is not queued"
                ));
            }
        }
        Ok(())
    }

    fn check_lock(&self, name: &str, lock: &LockRecord) -> Result<(), String> {
        if lock.is_idle() {
            return Err(format!("lock {name:?} is idle but keeps a record"));
        }
        if lock.is_free() && !lock.waiters.is_empty() {
            return Err(format!("lock {name:?} is free but has waiters"));
        }
        if lock.holder.is_some() && lock.delay.is_some() {
            return Err(format!("lock {name:?} is held during its lock-delay"));
        }
        if lock.waiters.len() > self.limits.max_waiters_per_lock {
            return Err(format!("lock {name:?} has too many waiters"));
        }
        if let Some(holder) = lock.holder {
            if holder.token == 0 || holder.token > self.revision {
                return Err(format!("lock {name:?} has token {} from the future", holder.token));
            }
            let listed =
                self.sessions.get(&holder.session).is_some_and(|record| record.held.contains(name));
            if !listed {
                return Err(format!(
                    "lock {name:?} is held by session {} which does not list it",
                    holder.session
                ));
            }
        }
        let mut seen = BTreeSet::new();
        for waiter in &lock.waiters {
            if !seen.insert(waiter.session) {
                return Err(format!("session {} is queued twice for {name:?}", waiter.session));
            }
            if lock.holder.is_some_and(|holder| holder.session == waiter.session) {
                return Err(format!(
                    "session {} waits for {name:?}, which it holds",
                    waiter.session
                ));
            }
            let listed = self
                .sessions
                .get(&waiter.session)
                .is_some_and(|record| record.waiting.contains(name));
            if !listed {
                return Err(format!(
                    "session {} is queued for {name:?} but does not list it",
                    waiter.session
                ));
            }
        }
        Ok(())
    }
}
