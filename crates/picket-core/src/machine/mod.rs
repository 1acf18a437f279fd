//! The lock state machine.
//!
//! ```text
//!        Input { now_ms, command, principal, rules }
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

use crate::command::{APPLY_RULES, CLUSTER_ID_HEX_DIGITS, Command, Input, is_cluster_id};
use crate::error::CommandError;
use crate::limits::{InvalidLimits, Limits};
use crate::outcome::{Applied, Event, Response};
use crate::record::{LockRecord, SessionRecord};
use crate::types::{SessionEnd, SessionId};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use thiserror::Error;

mod deadlines;
mod invariants;
mod locks;
mod queries;
mod sessions;

use deadlines::Deadlines;
pub use invariants::BrokenInvariant;

/// Why a snapshot could not be restored.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum RestoreError {
    /// The bytes are not a snapshot.
    #[error("the snapshot cannot be decoded ({0}): it is damaged or from an incompatible version")]
    Decode(#[from] serde_json::Error),
    /// The snapshot decodes but breaks an invariant of the state.
    #[error("the snapshot is inconsistent ({0}): it is damaged; restore from another replica")]
    Inconsistent(#[from] BrokenInvariant),
    /// The snapshot's limits are inconsistent.
    #[error("the snapshot's limits are invalid ({0}): it is damaged; restore from another replica")]
    Limits(#[from] InvalidLimits),
    /// The snapshot holds a state built under apply rules this build does not know.
    #[error(
        "the snapshot holds a state built under apply rules {rules}, newer than this build's \
         {known}: run this node on the same version as the rest of the cluster"
    )]
    UnknownApplyRules {
        /// The newest rules the state was built under.
        rules: u32,
        /// The newest rules this build knows.
        known: u32,
    },
}

/// The deterministic lock state machine. See the module documentation.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct StateMachine {
    limits: Limits,
    revision: u64,
    now_ms: u64,
    sessions: BTreeMap<SessionId, SessionRecord>,
    locks: BTreeMap<String, LockRecord>,
    /// The newest apply rules of any accepted command, so that a snapshot tells which rules
    /// its state needs: a build that does not know them refuses it rather than read it
    /// without what it does not understand. Absent (0) in snapshots of older builds.
    #[serde(default, skip_serializing_if = "is_zero")]
    newest_apply_rules: u32,
    /// The cluster's id ([`Command::NameCluster`], apply rules 7): set once, never changed.
    /// Absent in snapshots of older builds, of clusters not named yet, and of restored states.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    cluster_id: Option<String>,
    /// The id of the cluster this state was restored from, if it was restored from a backup
    /// of a named cluster ([`StateMachine::into_epoch`]). Clients that opened sessions in that
    /// cluster may carry them here: a restore starts a new epoch of revisions, so no session
    /// opened here has the id of one opened there after the backup. Not written by any
    /// command, so older builds, which do not read it, apply the log alike.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    restored_from_cluster_id: Option<String>,
    /// Derived from the records, rebuilt on restore rather than stored.
    #[serde(skip)]
    deadlines: Deadlines,
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
    /// The session holds the lock already, with this token; under apply rules 2 and later,
    /// the request is told of the grant and counts among its requests (see
    /// [`crate::APPLY_RULES`]).
    AlreadyHeld {
        token: u64,
        tell: bool,
    },
    Grant,
    /// The session waits already under this request: it keeps its place with the new wait
    /// (apply rules 2 and earlier).
    Rewait {
        wait_ms: Option<u64>,
    },
    /// The session waits already under this request: the retry joins that wait, place and
    /// deadline unchanged (apply rules 3).
    Join,
    Enqueue {
        wait_ms: Option<u64>,
    },
}

#[derive(Debug)]
enum AbandonPlan {
    Wait,
    Grant {
        token: u64,
    },
    /// The request is one of several told of the grant: it no longer counts among them, and
    /// the grant stays for the others.
    Forget,
    /// The request has no wait or grant (it was refused, answered and released, or not applied
    /// yet): only remembered as abandoned.
    Nothing,
}

/// What one command did so far: its clock, its events, and the locks it granted.
struct Step {
    /// The apply rules of the command's entry.
    rules: u32,
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
        if let Err(invalid) = limits.validate() {
            panic!("{invalid}");
        }
        Self {
            limits,
            revision: 0,
            now_ms: 0,
            sessions: BTreeMap::new(),
            locks: BTreeMap::new(),
            newest_apply_rules: 0,
            cluster_id: None,
            restored_from_cluster_id: None,
            deadlines: Deadlines::default(),
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
    /// copy. Sessions, grants and their tokens, and queues are kept; the cluster id is not
    /// (see [`StateMachine::into_epoch`]). `None` in the last epoch.
    #[must_use]
    pub fn into_next_epoch(self) -> Option<Self> {
        let next = self.restore_epoch() + 1;
        self.into_epoch(next)
    }

    /// This state as the start of restore epoch `epoch`, which must be above its own: for a
    /// restore that must also start above tokens the state never saw (a backup restored a
    /// second time, whose first restore went on granting). `None` when `epoch` is not above
    /// this state's, or past the last epoch.
    ///
    /// The state loses its cluster id: the restored nodes are a new cluster, whose first leader
    /// names it anew, so that they and the nodes of the cluster the backup came from refuse
    /// each other's Raft messages. The id becomes the state's
    /// [`StateMachine::restored_from_cluster_id`], which clients of that cluster follow.
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
        if let Some(cluster_id) = self.cluster_id.take() {
            self.restored_from_cluster_id = Some(cluster_id);
        }
        Some(self)
    }

    /// This state without any session, grant, wait or lock-delay: its limits, clock and
    /// revision only (not its cluster id: the restore it is for is a new cluster). A restore that must not bring back holders nobody remembers starts from
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
            newest_apply_rules: 0,
            // A cluster id needs apply rules 7, which this state no longer says it holds; the
            // cluster it names is the one this state is restored from.
            cluster_id: None,
            restored_from_cluster_id: self.cluster_id.or(self.restored_from_cluster_id),
            deadlines: Deadlines::default(),
        }
    }

    /// The cluster's id, once a leader has named it ([`Command::NameCluster`]).
    #[must_use]
    pub fn cluster_id(&self) -> Option<&str> {
        self.cluster_id.as_deref()
    }

    /// The id of the named cluster this state was restored from, if any (the nearest, after
    /// restores of restores).
    #[must_use]
    pub fn restored_from_cluster_id(&self) -> Option<&str> {
        self.restored_from_cluster_id.as_deref()
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
        let (session, wait, delay) = self.deadlines.earliest();
        let session =
            session.map(|deadline_ms| self.session_expiry_ms(deadline_ms).saturating_add(1));
        let wait = wait.map(|deadline_ms| deadline_ms.saturating_add(1));
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
        let mut step = Step {
            rules: input.rules,
            now_ms,
            stamp_ms: input.now_ms,
            events: Vec::new(),
            granted: BTreeSet::new(),
        };
        let result = self.dispatch(input, &mut step);
        match &result {
            Ok(_) => {
                assert_eq!(
                    self.revision,
                    revision_before + 1,
                    "an accepted command advances the revision by one"
                );
                self.newest_apply_rules = self.newest_apply_rules.max(input.rules);
            }
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
        self.validate_under(command, APPLY_RULES)
    }

    /// [`StateMachine::validate`] for an entry to be written under apply rules `rules` (a
    /// leader whose voters do not all know this build's rules yet writes older ones).
    ///
    /// # Errors
    /// The refusal; [`CommandError::UnknownApplyRules`] for rules this build does not know.
    pub fn validate_under(&self, command: &Command, rules: u32) -> Result<(), CommandError> {
        if rules > APPLY_RULES {
            return Err(CommandError::UnknownApplyRules { rules, known: APPLY_RULES });
        }
        self.plan(command, rules).map(|_| ())
    }

    /// Whether applying `command` now would only put a session in a lock's queue (or keep it
    /// there): an acquire that waits, refused nothing and granted nothing. Nobody is answered
    /// on such a command alone (its caller hears when a later command grants or ends the
    /// wait), so the shell may let its sync wait to be shared with the next one. The state may
    /// change before the command is applied; apply decides again.
    #[must_use]
    pub fn only_queues(&self, command: &Command) -> bool {
        // Asked on the log's write path for every entry: only an acquire is worth planning.
        matches!(command, Command::Acquire { .. })
            && matches!(
                self.plan(command, APPLY_RULES),
                Ok(Plan::Acquire(
                    AcquirePlan::Enqueue { .. } | AcquirePlan::Rewait { .. } | AcquirePlan::Join
                ))
            )
    }

    /// The newest apply rules of any entry this state accepted (0 before versions existed).
    #[must_use]
    pub fn newest_apply_rules(&self) -> u32 {
        self.newest_apply_rules
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
            | CommandError::TooManyRenewals { .. }
            | CommandError::RevisionsExhausted { .. } => true,
            CommandError::UnknownSession { session } => session.0 <= self.revision,
            _ => false,
        }
    }

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

    /// Decides, from the state before any change, whether the command is accepted and what it
    /// will do.
    fn plan(&self, command: &Command, rules: u32) -> Result<Plan, CommandError> {
        if self.revision == u64::MAX {
            // Accepting it would need a revision, and so a token, above the greatest.
            return Err(CommandError::RevisionsExhausted { revision: self.revision });
        }
        match command {
            Command::OpenSession { ttl_ms, lock_delay_ms, owner } => {
                self.plan_open(*ttl_ms, *lock_delay_ms, owner.as_deref()).map(|()| Plan::Simple)
            }
            Command::KeepAlive { session }
            | Command::CloseSession { session }
            | Command::RevokeSession { session } => {
                self.session_record(*session).map(|_| Plan::Simple)
            }
            Command::Acquire { session, name, wait, request, attempt } => self
                .plan_acquire(*session, name, *wait, (*request, *attempt), rules)
                .map(Plan::Acquire),
            Command::Abandon { session, name, request, attempt } => {
                self.plan_abandon(*session, name, (*request, *attempt), rules).map(Plan::Abandon)
            }
            Command::Cancel { session, name } => {
                self.plan_cancel(*session, name).map(|()| Plan::Simple)
            }
            Command::Release { session, name, token } => {
                self.plan_release(*session, name, *token).map(|()| Plan::Simple)
            }
            Command::Tick { renew, renew_for } => {
                if rules < command.oldest_rules() {
                    return Err(CommandError::OlderApplyRules {
                        rules,
                        needs: command.oldest_rules(),
                    });
                }
                self.plan_tick(renew.len().saturating_add(renew_for.len())).map(|()| Plan::Simple)
            }
            Command::Refresh => Ok(Plan::Simple),
            Command::SetLimits { limits } => {
                if rules < command.oldest_rules() {
                    return Err(CommandError::LimitsRefused {
                        reason: format!(
                            "written under apply rules {rules}; setting limits needs {}",
                            command.oldest_rules()
                        ),
                    });
                }
                self.plan_set_limits(limits).map(|()| Plan::Simple)
            }
            Command::NameCluster { cluster_id } => {
                if rules < command.oldest_rules() {
                    return Err(CommandError::OlderApplyRules {
                        rules,
                        needs: command.oldest_rules(),
                    });
                }
                self.plan_name_cluster(cluster_id).map(|()| Plan::Simple)
            }
        }
    }

    /// Decides whether the cluster can be named `cluster_id`: a well-formed id, on a state
    /// not named yet or named so already.
    fn plan_name_cluster(&self, cluster_id: &str) -> Result<(), CommandError> {
        let refused = |reason: String| {
            Err(CommandError::ClusterNameRefused { proposed: cluster_id.to_owned(), reason })
        };
        if !is_cluster_id(cluster_id) {
            return refused(format!(
                "a cluster id is {CLUSTER_ID_HEX_DIGITS} lowercase hexadecimal digits"
            ));
        }
        match &self.cluster_id {
            Some(named) if named != cluster_id => refused(format!("it is named {named} already")),
            _ => Ok(()),
        }
    }

    /// Decides whether the state can take `limits`: they must make sense, and nothing the state
    /// holds may exceed them (what exists is never ended for a limit, and the invariants hold
    /// every count within its limit).
    fn plan_set_limits(&self, limits: &Limits) -> Result<(), CommandError> {
        let refused = |reason: String| Err(CommandError::LimitsRefused { reason });
        if let Err(invalid) = limits.validate() {
            return refused(invalid.rule.to_owned());
        }
        let most_locks_of_a_session =
            self.sessions.values().map(SessionRecord::lock_count).max().unwrap_or(0);
        let longest_queue = self.locks.values().map(|lock| lock.waiters.len()).max().unwrap_or(0);
        let in_use = [
            ("max_sessions", "sessions are open", self.sessions.len(), limits.max_sessions),
            ("max_locks", "locks have records", self.locks.len(), limits.max_locks),
            (
                "max_locks_per_session",
                "locks are held or awaited by one session",
                most_locks_of_a_session,
                limits.max_locks_per_session,
            ),
            (
                "max_waiters_per_lock",
                "sessions wait for one lock",
                longest_queue,
                limits.max_waiters_per_lock,
            ),
        ];
        if let Some((limit, what, count, max)) =
            in_use.iter().find(|(_, _, count, max)| count > max)
        {
            return refused(format!("{count} {what}, more than {limit} = {max}"));
        }
        // Releasing, cancelling and abandoning check the name: a lock whose name a lower bound
        // refuses could not be let go.
        let longest_name = self.locks.keys().map(String::len).max().unwrap_or(0);
        if longest_name > limits.max_name_bytes {
            return refused(format!(
                "a lock named with {longest_name} bytes exists, more than max_name_bytes = {}",
                limits.max_name_bytes
            ));
        }
        Ok(())
    }

    fn dispatch(&mut self, input: &Input, step: &mut Step) -> Result<Response, CommandError> {
        let command = &input.command;
        if input.rules > APPLY_RULES {
            // Applying it under other rules would part this replica from those that know them.
            return Err(CommandError::UnknownApplyRules { rules: input.rules, known: APPLY_RULES });
        }
        self.check_principal(input)?;
        let plan = self.plan(command, input.rules)?;
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
            (Command::Abandon { session, name, request, attempt }, Plan::Abandon(plan)) => {
                self.abandon(*session, name, (*request, *attempt), (plan, input.rules), step)
            }
            (Command::Cancel { session, name }, _) => self.cancel(*session, name, step),
            (Command::Release { session, name, .. }, _) => self.release(*session, name, step),
            (Command::Tick { renew, renew_for }, _) => self.tick(renew, renew_for, step),
            (Command::Refresh, _) => self.refresh(step),
            (Command::SetLimits { limits }, _) => {
                self.limits = limits.clone();
                Response::LimitsSet
            }
            (Command::NameCluster { cluster_id }, _) => {
                self.cluster_id = Some(cluster_id.clone());
                Response::ClusterNamed
            }
            (command, plan) => unreachable!("{command} was planned as {plan:?}"),
        })
    }

    /// Marks the command accepted. Called exactly once per accepted command, by `dispatch`,
    /// after its plan and before the first change.
    fn accept(&mut self, step: &Step) {
        // `plan` refuses every command once the revision is at its greatest.
        self.revision =
            self.revision.checked_add(1).expect("plan refuses commands when revisions run out");
        self.now_ms = step.now_ms;
    }

    fn session_record(&self, session: SessionId) -> Result<&SessionRecord, CommandError> {
        self.sessions.get(&session).ok_or(CommandError::UnknownSession { session })
    }

    fn rebuild_indices(&mut self) {
        self.deadlines = Deadlines::of(&self.sessions, &self.locks);
    }
}

/// For serde: leaves a zero field out.
#[allow(clippy::trivially_copy_pass_by_ref)]
fn is_zero(value: &u32) -> bool {
    *value == 0
}
