//! Property tests: random command sequences applied to the state machine and to a deliberately
//! naive reference model, compared after every step.
//!
//! The model keeps plain vectors and rescans everything on every command; it has no indices and
//! no incremental promotion. Where the two disagree on a response, an error code or the visible
//! state, the state machine is wrong (or the model is, which is as good to know). On top of the
//! comparison, every step checks that `validate` predicted apply's refusal exactly, and the
//! invariants a user relies on: one holder per lock, tokens of
//! a lock always greater than any earlier token of that lock (across dropped records, name reuse
//! and snapshot restores), FIFO grants, nothing held or awaited by an ended session, lock-delay
//! honoured, and refused commands changing nothing.

use picket_core::{
    Applied, Command, Event, HolderInfo, Input, Limits, LockInfo, RequestId, Response, SessionId,
    SessionInfo, StateMachine, Wait, validate_name,
};
use proptest::prelude::*;
use std::collections::BTreeMap;

const NAMES: [&str; 5] = ["a", "b", "jobs/x", "jobs/y", ""];
const TTLS_MS: [u64; 3] = [1_000, 1_500, 3_000];
const DELAYS_MS: [u64; 3] = [0, 0, 500];

#[derive(Clone, Debug)]
enum Op {
    Open {
        ttl: usize,
        delay: usize,
    },
    KeepAlive {
        who: usize,
    },
    Close {
        who: usize,
    },
    Revoke {
        who: usize,
    },
    Acquire {
        who: usize,
        name: usize,
        wait: Wait,
        request: u64,
        attempt: u32,
    },
    Abandon {
        who: usize,
        name: usize,
        request: u64,
        attempt: u32,
    },
    Cancel {
        who: usize,
        name: usize,
    },
    Release {
        who: usize,
        name: usize,
        right_token: bool,
    },
    /// Renewals with a lease of their own (a client clock running at another rate) too.
    Tick {
        renew: Vec<usize>,
        renew_for: Vec<(usize, u64)>,
    },
    Refresh {
        clock_ms: u64,
    },
    /// One of [`CLUSTER_IDS`]: two well-formed, one not.
    NameCluster {
        id: usize,
    },
}

/// The ids a step may name the cluster with: two well-formed, and one with an uppercase digit.
const CLUSTER_IDS: [&str; 3] = [
    "00112233445566778899aabbccddeeff",
    "ffeeddccbbaa99887766554433221100",
    "00112233445566778899AABBCCDDEEFF",
];

#[derive(Clone, Debug)]
struct Step {
    /// How far the proposer's clock moved; a reading behind the state's clock is also possible.
    advance_ms: u64,
    reads_behind: bool,
    op: Op,
}

fn wait_strategy() -> impl Strategy<Value = Wait> {
    prop_oneof![
        Just(Wait::Try),
        Just(Wait::Forever),
        Just(Wait::For { wait_ms: 0 }),
        (1u64..1_500).prop_map(|wait_ms| Wait::For { wait_ms }),
        Just(Wait::For { wait_ms: 500 }),
    ]
}

fn op_strategy() -> impl Strategy<Value = Op> {
    let who = 0usize..8;
    let name = 0..NAMES.len();
    prop_oneof![
        3 => (0..TTLS_MS.len(), 0..DELAYS_MS.len()).prop_map(|(ttl, delay)| Op::Open { ttl, delay }),
        1 => who.clone().prop_map(|who| Op::KeepAlive { who }),
        1 => who.clone().prop_map(|who| Op::Close { who }),
        1 => who.clone().prop_map(|who| Op::Revoke { who }),
        8 => (who.clone(), name.clone(), wait_strategy(), 0u64..6, 0u32..3).prop_map(
            |(who, name, wait, request, attempt)| Op::Acquire { who, name, wait, request, attempt }
        ),
        2 => (who.clone(), name.clone(), 0u64..6, 0u32..3)
            .prop_map(|(who, name, request, attempt)| Op::Abandon { who, name, request, attempt }),
        1 => (who.clone(), name.clone()).prop_map(|(who, name)| Op::Cancel { who, name }),
        5 => (who.clone(), name, proptest::bool::weighted(0.85))
            .prop_map(|(who, name, right_token)| Op::Release { who, name, right_token }),
        4 => (
            proptest::collection::vec(who.clone(), 0..4),
            proptest::collection::vec((who, 0u64..20_000), 0..3)
        )
            .prop_map(|(renew, renew_for)| Op::Tick { renew, renew_for }),
        1 => (0u64..10_000).prop_map(|clock_ms| Op::Refresh { clock_ms }),
        1 => (0..CLUSTER_IDS.len()).prop_map(|id| Op::NameCluster { id }),
    ]
}

fn step_strategy() -> impl Strategy<Value = Step> {
    // Clock steps that are multiples of the TTLs, plus single milliseconds, make deadlines land
    // exactly on `now` and one either side of it, where off-by-one mistakes live.
    let advance_ms = prop_oneof![
        2 => 0u64..700,
        1 => prop::sample::select(vec![0u64, 1, 250, 500, 1_000]),
    ];
    (advance_ms, proptest::bool::weighted(0.05), op_strategy())
        .prop_map(|(advance_ms, reads_behind, op)| Step { advance_ms, reads_behind, op })
}

// ---------------------------------------------------------------------------------------------
// The reference model.

#[derive(Clone, Debug)]
struct ModelSession {
    id: SessionId,
    ttl_ms: u64,
    lock_delay_ms: u64,
    deadline_ms: u64,
    /// The lease its last renewal gave it when longer than its TTL; a refresh renews for it
    /// (apply rules 6).
    longer_lease_ms: Option<u64>,
    /// Abandoned requests with their latest abandoned attempt, in the order first abandoned;
    /// the oldest is forgotten beyond 16.
    abandoned: Vec<(RequestId, u32)>,
    /// Requests whose wait ended without a grant, with the code a retry gets, in the order
    /// they ended; the oldest is forgotten beyond 8 (apply rules 3).
    ended: Vec<(RequestId, &'static str)>,
}

#[derive(Clone, Debug)]
struct ModelWaiter {
    session: SessionId,
    request: RequestId,
    attempt: u32,
    wait_ms: Option<u64>,
    deadline_ms: Option<u64>,
}

#[derive(Clone, Debug, Default)]
struct ModelLock {
    holder: Option<HolderInfo>,
    /// The requests told of the holder's grant, each with its latest attempt: the producing
    /// one first, then those answered `already_held`, oldest first (at most 1 + 3).
    knowers: Vec<(RequestId, u32)>,
    queue: Vec<ModelWaiter>,
    /// (until, length)
    delay: Option<(u64, u64)>,
}

#[derive(Clone, Debug)]
struct Model {
    limits: Limits,
    revision: u64,
    now_ms: u64,
    sessions: Vec<ModelSession>,
    locks: BTreeMap<String, ModelLock>,
    /// Set by the first well-formed naming, never changed after.
    cluster_id: Option<String>,
}

/// What the model expects: an accepted command's response, or a refusal's error code.
type Expected = Result<Response, &'static str>;

impl Model {
    fn new(limits: Limits) -> Self {
        Self {
            limits,
            revision: 0,
            now_ms: 0,
            sessions: Vec::new(),
            locks: BTreeMap::new(),
            cluster_id: None,
        }
    }

    fn session(&self, id: SessionId) -> Option<&ModelSession> {
        self.sessions.iter().find(|session| session.id == id)
    }

    fn held_by(&self, id: SessionId) -> usize {
        self.locks.values().filter(|lock| lock.holder.is_some_and(|h| h.session == id)).count()
    }

    fn waits_of(&self, id: SessionId) -> usize {
        self.locks.values().filter(|lock| lock.queue.iter().any(|w| w.session == id)).count()
    }

    fn accept(&mut self, now_ms: u64) {
        self.revision += 1;
        self.now_ms = now_ms;
    }

    fn apply(&mut self, input: &Input) -> Expected {
        let now_ms = match input.command {
            Command::Refresh => input.now_ms,
            _ => self.now_ms.max(input.now_ms),
        };
        match &input.command {
            Command::OpenSession { ttl_ms, lock_delay_ms, .. } => {
                if *ttl_ms < self.limits.min_ttl_ms || *ttl_ms > self.limits.max_ttl_ms {
                    return Err("ttl_out_of_range");
                }
                if *lock_delay_ms > self.limits.max_lock_delay_ms {
                    return Err("lock_delay_out_of_range");
                }
                if self.sessions.len() >= self.limits.max_sessions {
                    return Err("too_many_sessions");
                }
                self.accept(now_ms);
                let id = SessionId(self.revision);
                let deadline_ms = now_ms + ttl_ms;
                self.sessions.push(ModelSession {
                    id,
                    ttl_ms: *ttl_ms,
                    lock_delay_ms: *lock_delay_ms,
                    deadline_ms,
                    longer_lease_ms: None,
                    abandoned: Vec::new(),
                    ended: Vec::new(),
                });
                Ok(Response::SessionOpened { session: id, ttl_ms: *ttl_ms, deadline_ms })
            }
            Command::KeepAlive { session } => {
                let Some(found) = self.session(*session) else { return Err("unknown_session") };
                let deadline_ms = now_ms + found.ttl_ms;
                self.accept(now_ms);
                let found = self.sessions.iter_mut().find(|s| s.id == *session).unwrap();
                found.deadline_ms = deadline_ms;
                found.longer_lease_ms = None;
                Ok(Response::KeptAlive { session: *session, deadline_ms })
            }
            Command::CloseSession { session } | Command::RevokeSession { session } => {
                if self.session(*session).is_none() {
                    return Err("unknown_session");
                }
                self.accept(now_ms);
                let delay = matches!(input.command, Command::RevokeSession { .. });
                self.end(&[*session], delay);
                self.promote_everything();
                Ok(Response::SessionEnded { session: *session })
            }
            Command::Acquire { session, name, wait, request, attempt } => {
                self.acquire(*session, name, *wait, (*request, *attempt), now_ms)
            }
            Command::Abandon { session, name, request, attempt } => {
                self.abandon(*session, name, (*request, *attempt), now_ms)
            }
            Command::Cancel { session, name } => {
                if validate_name(name, &self.limits).is_err() {
                    return Err("invalid_name");
                }
                if self.session(*session).is_none() {
                    return Err("unknown_session");
                }
                let queued = self
                    .locks
                    .get(name)
                    .is_some_and(|l| l.queue.iter().any(|w| w.session == *session));
                if !queued {
                    return Err("not_waiting");
                }
                self.accept(now_ms);
                let queue = &mut self.locks.get_mut(name).unwrap().queue;
                let request = queue.iter().find(|w| w.session == *session).unwrap().request;
                queue.retain(|w| w.session != *session);
                self.remember_ended(*session, request, "wait_ended");
                self.promote_everything();
                Ok(Response::Cancelled { name: name.clone() })
            }
            Command::Release { session, name, token } => {
                if validate_name(name, &self.limits).is_err() {
                    return Err("invalid_name");
                }
                if self.session(*session).is_none() {
                    return Err("unknown_session");
                }
                match self.locks.get(name).and_then(|l| l.holder) {
                    Some(h) if h.session == *session && h.token == *token => {}
                    Some(h) if h.session == *session => return Err("token_mismatch"),
                    _ => return Err("not_held"),
                }
                self.accept(now_ms);
                let entry = self.locks.get_mut(name).unwrap();
                entry.holder = None;
                entry.knowers.clear();
                self.promote_everything();
                Ok(Response::Released { name: name.clone() })
            }
            Command::Tick { renew, renew_for } => {
                if renew.len() + renew_for.len() > self.limits.max_renewals_per_tick {
                    return Err("too_many_renewals");
                }
                self.accept(now_ms);
                for session in self.sessions.iter_mut().filter(|s| renew.contains(&s.id)) {
                    session.deadline_ms = now_ms + session.ttl_ms;
                    session.longer_lease_ms = None;
                }
                // A lease of its own, held to between a quarter of the TTL and four times it.
                for (id, lease_ms) in renew_for {
                    if let Some(session) = self.sessions.iter_mut().find(|s| s.id == *id) {
                        let lease_ms = (*lease_ms).max(session.ttl_ms / 4).min(session.ttl_ms * 4);
                        session.deadline_ms = now_ms + lease_ms;
                        session.longer_lease_ms = (lease_ms > session.ttl_ms).then_some(lease_ms);
                    }
                }
                // Expiry goes by the tick's own reading, which may be behind the state's clock,
                // and a session lives through its deadline's grace.
                let stamp_ms = input.now_ms;
                let grace_ms = self.limits.session_expiry_grace_ms;
                let expired: Vec<SessionId> = self
                    .sessions
                    .iter()
                    .filter(|s| s.deadline_ms + grace_ms < stamp_ms)
                    .map(|s| s.id)
                    .collect();
                self.end(&expired, true);
                // Timed-out waits in the order the core's deadline index holds them.
                let mut timed_out: Vec<(u64, SessionId, String, RequestId)> = Vec::new();
                for (name, lock) in &self.locks {
                    for w in &lock.queue {
                        if let Some(deadline_ms) = w.deadline_ms.filter(|d| *d < stamp_ms) {
                            timed_out.push((deadline_ms, w.session, name.clone(), w.request));
                        }
                    }
                }
                timed_out.sort();
                for (_, session, _, request) in timed_out {
                    self.remember_ended(session, request, "wait_timed_out");
                }
                for lock in self.locks.values_mut() {
                    lock.queue.retain(|w| w.deadline_ms.is_none_or(|d| d >= stamp_ms));
                    if lock.delay.is_some_and(|(until, _)| until <= stamp_ms) {
                        lock.delay = None;
                    }
                }
                self.promote_everything();
                Ok(Response::Ticked)
            }
            Command::Refresh => {
                self.accept(now_ms);
                for session in &mut self.sessions {
                    let lease_ms = session.longer_lease_ms.unwrap_or(session.ttl_ms);
                    session.deadline_ms = now_ms + lease_ms;
                }
                for lock in self.locks.values_mut() {
                    for waiter in &mut lock.queue {
                        waiter.deadline_ms = waiter.wait_ms.map(|w| now_ms + w);
                    }
                    if let Some((until, length)) = &mut lock.delay {
                        *until = now_ms + *length;
                    }
                }
                Ok(Response::Refreshed)
            }
            Command::NameCluster { cluster_id } => {
                let well_formed = cluster_id.len() == 32
                    && cluster_id.chars().all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c));
                let named_otherwise = self.cluster_id.as_ref().is_some_and(|id| id != cluster_id);
                if !well_formed || named_otherwise {
                    return Err("cluster_name_refused");
                }
                self.accept(now_ms);
                self.cluster_id = Some(cluster_id.clone());
                Ok(Response::ClusterNamed)
            }
            other => panic!("the model does not know {other}"),
        }
    }

    fn abandon(
        &mut self,
        session: SessionId,
        name: &str,
        (request, attempt): (RequestId, u32),
        now_ms: u64,
    ) -> Expected {
        if validate_name(name, &self.limits).is_err() {
            return Err("invalid_name");
        }
        if self.session(session).is_none() {
            return Err("unknown_session");
        }
        self.remember_abandoned(session, (request, attempt));
        let lock = self.locks.get(name).cloned().unwrap_or_default();
        let waits = lock
            .queue
            .iter()
            .any(|w| w.session == session && w.request == request && attempt >= w.attempt);
        if waits {
            self.accept(now_ms);
            self.locks.get_mut(name).unwrap().queue.retain(|w| w.session != session);
            self.promote_everything();
            return Ok(Response::Abandoned { name: name.into(), released_token: None });
        }
        let told = lock.knowers.iter().position(|(r, latest)| *r == request && attempt >= *latest);
        match (lock.holder, told) {
            (Some(h), Some(index)) if h.session == session => {
                self.accept(now_ms);
                let entry = self.locks.get_mut(name).unwrap();
                entry.knowers.remove(index);
                if !entry.knowers.is_empty() {
                    // Another request was told of the grant: it stays.
                    return Ok(Response::Abandoned { name: name.into(), released_token: None });
                }
                entry.holder = None;
                self.promote_everything();
                Ok(Response::Abandoned { name: name.into(), released_token: Some(h.token) })
            }
            _ => {
                self.accept(now_ms);
                Ok(Response::Abandoned { name: name.into(), released_token: None })
            }
        }
    }

    /// Every abandon of a live session with a valid name is accepted and remembers its request,
    /// whatever it undoes.
    fn remember_abandoned(&mut self, session: SessionId, (request, attempt): (RequestId, u32)) {
        let record = self.sessions.iter_mut().find(|s| s.id == session).unwrap();
        match record.abandoned.iter_mut().find(|(r, _)| *r == request) {
            Some((_, latest)) => *latest = (*latest).max(attempt),
            None => {
                record.abandoned.push((request, attempt));
                if record.abandoned.len() > 16 {
                    record.abandoned.remove(0);
                }
            }
        }
    }

    /// Remembers that `request`'s wait ended without a grant, and the code its retry gets.
    fn remember_ended(&mut self, session: SessionId, request: RequestId, code: &'static str) {
        let record = self.sessions.iter_mut().find(|s| s.id == session).unwrap();
        record.ended.retain(|(r, _)| *r != request);
        record.ended.push((request, code));
        if record.ended.len() > 8 {
            record.ended.remove(0);
        }
    }

    fn acquire(
        &mut self,
        session: SessionId,
        name: &str,
        wait: Wait,
        (request, attempt): (RequestId, u32),
        now_ms: u64,
    ) -> Expected {
        if validate_name(name, &self.limits).is_err() {
            return Err("invalid_name");
        }
        let wait = if wait == (Wait::For { wait_ms: 0 }) { Wait::Try } else { wait };
        let wait_ms = match wait {
            Wait::For { wait_ms } if wait_ms > self.limits.max_wait_ms => {
                return Err("wait_out_of_range");
            }
            Wait::For { wait_ms } => Some(wait_ms),
            _ => None,
        };
        let Some(record) = self.session(session) else { return Err("unknown_session") };
        if record.abandoned.iter().any(|(r, latest)| *r == request && attempt <= *latest) {
            return Err("request_abandoned");
        }
        let ended = record.ended.iter().find(|(r, _)| *r == request).map(|(_, code)| *code);
        let lock = self.locks.get(name).cloned().unwrap_or_default();
        if let Some(holder) = lock.holder.filter(|h| h.session == session) {
            self.accept(now_ms);
            // Every request told of a grant counts (apply rules 2); past four, the one told
            // longest ago after the producing one is forgotten.
            let knowers = &mut self.locks.get_mut(name).unwrap().knowers;
            match knowers.iter_mut().find(|(r, _)| *r == request) {
                Some((_, latest)) => *latest = (*latest).max(attempt),
                None => {
                    knowers.push((request, attempt));
                    if knowers.len() > 4 {
                        knowers.remove(1);
                    }
                }
            }
            return Ok(Response::Granted {
                name: name.into(),
                token: holder.token,
                already_held: true,
            });
        }
        let free = lock.holder.is_none() && lock.delay.is_none();
        let waiting = lock.queue.iter().position(|w| w.session == session);
        let room =
            self.held_by(session) + self.waits_of(session) < self.limits.max_locks_per_session;
        if wait == Wait::Try {
            if !free {
                return Err(if lock.holder.is_some() { "lock_busy" } else { "lock_delayed" });
            }
            if !room {
                return Err("too_many_locks_for_session");
            }
        } else if let Some(position) = waiting {
            if lock.queue[position].request != request {
                return Err("already_waiting");
            }
            self.accept(now_ms);
            // A retry joins the wait: its deadline stays.
            let waiter = &mut self.locks.get_mut(name).unwrap().queue[position];
            waiter.attempt = waiter.attempt.max(attempt);
            return Ok(Response::Queued { name: name.into(), position });
        } else if let Some(code) = ended {
            // After the grant and the wait the request may hold, which win.
            return Err(code);
        } else if !room {
            return Err("too_many_locks_for_session");
        } else if !free && lock.queue.len() >= self.limits.max_waiters_per_lock {
            return Err("too_many_waiters");
        }
        self.accept(now_ms);
        let token = self.revision;
        let entry = self.locks.entry(name.to_owned()).or_default();
        if free {
            entry.holder = Some(HolderInfo { session, token });
            entry.knowers = vec![(request, attempt)];
            Ok(Response::Granted { name: name.into(), token, already_held: false })
        } else {
            entry.queue.push(ModelWaiter {
                session,
                request,
                attempt,
                wait_ms,
                deadline_ms: wait_ms.map(|w| now_ms + w),
            });
            Ok(Response::Queued { name: name.into(), position: entry.queue.len() - 1 })
        }
    }

    fn end(&mut self, ended: &[SessionId], with_delay: bool) {
        for id in ended {
            let session = self.session(*id).unwrap().clone();
            self.sessions.retain(|s| s.id != *id);
            for lock in self.locks.values_mut() {
                lock.queue.retain(|w| w.session != *id);
                if lock.holder.is_some_and(|h| h.session == *id) {
                    lock.holder = None;
                    lock.knowers.clear();
                    if with_delay && session.lock_delay_ms > 0 {
                        lock.delay =
                            Some((self.now_ms + session.lock_delay_ms, session.lock_delay_ms));
                    }
                }
            }
        }
    }

    /// Grants every free lock to the head of its queue and forgets idle locks.
    fn promote_everything(&mut self) {
        let token = self.revision;
        for lock in self.locks.values_mut() {
            if lock.holder.is_none() && lock.delay.is_none() && !lock.queue.is_empty() {
                let head = lock.queue.remove(0);
                lock.holder = Some(HolderInfo { session: head.session, token });
                lock.knowers = vec![(head.request, head.attempt)];
            }
        }
        self.locks.retain(|_, lock| {
            lock.holder.is_some() || !lock.queue.is_empty() || lock.delay.is_some()
        });
    }

    fn lock_infos(&self) -> Vec<LockInfo> {
        self.locks
            .iter()
            .map(|(name, lock)| LockInfo {
                name: name.clone(),
                holder: lock.holder,
                waiters: lock.queue.iter().map(|w| w.session).collect(),
                delayed_until_ms: lock.delay.map(|(until, _)| until),
            })
            .collect()
    }

    fn session_deadlines(&self) -> Vec<(SessionId, u64)> {
        let mut deadlines: Vec<_> = self.sessions.iter().map(|s| (s.id, s.deadline_ms)).collect();
        deadlines.sort_unstable();
        deadlines
    }
}

// ---------------------------------------------------------------------------------------------
// Driving both and checking.

/// Everything the test learned from events, kept across dropped records and restores.
#[derive(Default)]
struct History {
    /// Highest token ever granted per lock name.
    max_token: BTreeMap<String, u64>,
    /// Sessions that ended.
    ended: Vec<SessionId>,
}

fn to_input(step: &Step, model: &Model, opened: &[SessionId]) -> Input {
    let who = |index: usize| opened.get(index).copied().unwrap_or(SessionId(9_999));
    let now_ms = if step.reads_behind {
        model.now_ms.saturating_sub(step.advance_ms)
    } else {
        model.now_ms + step.advance_ms
    };
    let name = |index: usize| NAMES[index].to_owned();
    let command = match &step.op {
        Op::Open { ttl, delay } => Command::OpenSession {
            ttl_ms: TTLS_MS[*ttl],
            lock_delay_ms: DELAYS_MS[*delay],
            owner: None,
        },
        Op::KeepAlive { who: w } => Command::KeepAlive { session: who(*w) },
        Op::Close { who: w } => Command::CloseSession { session: who(*w) },
        Op::Revoke { who: w } => Command::RevokeSession { session: who(*w) },
        Op::Acquire { who: w, name: n, wait, request, attempt } => Command::Acquire {
            session: who(*w),
            name: name(*n),
            wait: *wait,
            request: RequestId(*request),
            attempt: *attempt,
        },
        Op::Abandon { who: w, name: n, request, attempt } => Command::Abandon {
            session: who(*w),
            name: name(*n),
            request: RequestId(*request),
            attempt: *attempt,
        },
        Op::Cancel { who: w, name: n } => Command::Cancel { session: who(*w), name: name(*n) },
        Op::Release { who: w, name: n, right_token } => {
            let holder_token = model.locks.get(NAMES[*n]).and_then(|l| l.holder).map(|h| h.token);
            let token = match (holder_token, right_token) {
                (Some(token), true) => token,
                (Some(token), false) => token + 1,
                (None, _) => 1,
            };
            Command::Release { session: who(*w), name: name(*n), token }
        }
        Op::Tick { renew, renew_for } => Command::Tick {
            renew: renew.iter().map(|w| who(*w)).collect(),
            renew_for: renew_for.iter().map(|(w, lease_ms)| (who(*w), *lease_ms)).collect(),
        },
        Op::Refresh { clock_ms } => {
            return Input::new(*clock_ms, Command::Refresh);
        }
        Op::NameCluster { id } => Command::NameCluster { cluster_id: CLUSTER_IDS[*id].to_owned() },
    };
    Input::new(now_ms, command)
}

fn check_step(
    machine: &StateMachine,
    model: &Model,
    input: &Input,
    applied: &Applied,
    expected: &Expected,
    history: &mut History,
) -> Result<(), TestCaseError> {
    match (&applied.result, expected) {
        (Ok(actual), Ok(expected)) => prop_assert_eq!(actual, expected, "response to {}", input),
        (Err(error), Err(code)) => {
            prop_assert_eq!(error.code().as_str(), *code, "refusal of {}", input)
        }
        (actual, expected) => {
            prop_assert!(
                false,
                "{}: machine said {:?}, model expected {:?}",
                input,
                actual,
                expected
            )
        }
    }
    machine.check_invariants().map_err(|broken| TestCaseError::fail(broken.to_string()))?;
    // The next deadline is exactly the first time a tick would change something.
    let mut probe = machine.clone();
    match machine.next_deadline_ms() {
        Some(due_ms) => {
            // The deadline may already be overdue when no tick ran since.
            let before = probe.snapshot();
            if due_ms > machine.now_ms() {
                let early = probe.apply(&Input::new(
                    due_ms - 1,
                    Command::Tick { renew: vec![], renew_for: vec![] },
                ));
                prop_assert!(
                    early.events.is_empty(),
                    "a tick before the next deadline changed something"
                );
            }
            let mut probe = StateMachine::restore(&before).unwrap();
            let due = probe
                .apply(&Input::new(due_ms, Command::Tick { renew: vec![], renew_for: vec![] }));
            let delay_ended = machine.locks("", None, usize::MAX).iter().any(|l| {
                l.delayed_until_ms.is_some_and(|until| until <= due_ms.max(machine.now_ms()))
            });
            prop_assert!(
                !due.events.is_empty() || delay_ended,
                "a tick at the next deadline changed nothing"
            );
        }
        None => {
            let far = probe.apply(&Input::new(
                machine.now_ms() + 100_000_000,
                Command::Tick { renew: vec![], renew_for: vec![] },
            ));
            prop_assert!(
                far.events.is_empty(),
                "nothing was pending, yet a tick changed something"
            );
        }
    }
    prop_assert_eq!(machine.revision(), model.revision);
    prop_assert_eq!(machine.now_ms(), model.now_ms);
    // Once named, a cluster keeps its id.
    prop_assert_eq!(machine.cluster_id(), model.cluster_id.as_deref());
    prop_assert_eq!(machine.locks("", None, usize::MAX), model.lock_infos());
    let sessions: Vec<SessionInfo> = machine.sessions(None, usize::MAX);
    let deadlines: Vec<(SessionId, u64)> =
        sessions.iter().map(|s| (s.session, s.deadline_ms)).collect();
    prop_assert_eq!(deadlines, model.session_deadlines());

    for event in &applied.events {
        match event {
            Event::Granted { name, token, .. } => {
                let previous = history.max_token.get(name).copied().unwrap_or(0);
                prop_assert!(
                    *token > previous,
                    "token {} of {:?} not above earlier {}",
                    token,
                    name,
                    previous
                );
                history.max_token.insert(name.clone(), *token);
                prop_assert_eq!(*token, machine.revision());
            }
            Event::SessionEnded { session, .. } => history.ended.push(*session),
            _ => {}
        }
    }
    // An ended session holds nothing and waits for nothing.
    for lock in machine.locks("", None, usize::MAX) {
        for ended in &history.ended {
            prop_assert!(lock.holder.is_none_or(|h| h.session != *ended));
            prop_assert!(!lock.waiters.contains(ended));
        }
        // Lock-delay honoured: nobody holds a lock while its delay is in force.
        prop_assert!(lock.holder.is_none() || lock.delayed_until_ms.is_none());
    }
    Ok(())
}

fn run_sequence(steps: &[Step], restore_at: Option<usize>) -> Result<Vec<u8>, TestCaseError> {
    let limits = Limits {
        max_locks_per_session: 3,
        max_waiters_per_lock: 3,
        max_sessions: 6,
        ..Limits::default()
    };
    let mut machine = StateMachine::new(limits.clone());
    let mut model = Model::new(limits);
    let mut opened: Vec<SessionId> = Vec::new();
    let mut history = History::default();
    for (index, step) in steps.iter().enumerate() {
        if restore_at == Some(index) {
            machine = StateMachine::restore(&machine.snapshot())
                .map_err(|error| TestCaseError::fail(error.to_string()))?;
        }
        let input = to_input(step, &model, &opened);
        // A refusal given before the log must hold whatever is applied first.
        if let (Some(refusal), Some(next)) =
            (machine.refusal_before_log(&input.command), steps.get(index + 1))
        {
            let mut later = machine.clone();
            later.apply(&to_input(next, &model, &opened));
            prop_assert_eq!(
                later.apply(&input).result.err(),
                Some(refusal),
                "a refusal before the log was overturned by {}",
                to_input(next, &model, &opened)
            );
        }
        let before = machine.snapshot();
        let predicted = machine.validate(&input.command);
        let applied = machine.apply(&input);
        // The leader's check before proposing is the very decision apply makes.
        prop_assert_eq!(
            predicted.err(),
            applied.result.clone().err(),
            "validate disagrees with apply on {}",
            input
        );
        let expected = model.apply(&input);
        if applied.result.is_err() {
            prop_assert_eq!(&before, &machine.snapshot(), "refused {} changed the state", input);
            prop_assert!(applied.events.is_empty());
        }
        if let Ok(Response::SessionOpened { session, .. }) = &applied.result {
            opened.push(*session);
        }
        check_step(&machine, &model, &input, &applied, &expected, &mut history)?;
    }
    Ok(machine.snapshot())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1_000, ..ProptestConfig::default() })]

    /// The state machine agrees with the model at every step, every invariant holds throughout,
    /// and a snapshot taken and restored midway changes nothing: the run ends in the same bytes
    /// as an uninterrupted run of the same commands.
    #[test]
    fn state_machine_matches_the_reference_model(
        steps in proptest::collection::vec(step_strategy(), 1..120),
        restore_fraction in 0.0f64..1.0,
    ) {
        let uninterrupted = run_sequence(&steps, None)?;
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss, clippy::cast_precision_loss)]
        let restore_at = (restore_fraction * steps.len() as f64) as usize;
        let restored = run_sequence(&steps, Some(restore_at))?;
        prop_assert_eq!(uninterrupted, restored, "same commands, same bytes");
    }
}
