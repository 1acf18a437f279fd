//! Property test of issue 14's promise, no ghost holders: random interleavings of acquire,
//! retry, broken connections, giving up, release and expiry for a few sessions, applied to the
//! real state machine in a random log order, with the server's shell and the Rust client
//! modelled by the rules they follow:
//!
//! - the shell answers an acquire when it is applied (a grant, a refusal) or, for a queued one,
//!   when its lock's grant or cancellation event comes; a handler whose caller went away before
//!   it answered proposes `Abandon` for its attempt (`AcquireGuard` in `picket-server`);
//! - the client retries an attempt whose outcome it does not know with the same request id and
//!   the next attempt, and when it gives up on one, abandons its last attempt, and asks for the
//!   lock again once that abandon is answered or its request timeout passed, when the abandon
//!   may still be on its way (`Transport::acquire` in `picket-client`); a grant it hears of
//!   becomes a guard; its watch
//!   marks a guard lost when the guard's grant ends other than by the guard's own release, and
//!   every guard of a session that ended (`state::dispatch`); a grant that ended before any
//!   guard held it is remembered, and a guard made from it starts lost
//!   (`SessionState::register_grant`); a guard's completed release ends any other guard of the
//!   same grant (`guard::release`).
//!
//! After every step: every holder in the state is known to a guard of its token, a release on
//! its way, or a request still in progress (whose answer or abandonment is on its way); every
//! waiter to a request in progress; every guard that is not lost holds its grant (or its
//! release is on its way). After all work in flight has landed and every answer reached its
//! client, the same with no request in progress: what the state holds, a guard knows.

use picket_core::{
    Command, Event, Input, Limits, ReleaseCause, RequestId, Response, SessionId, StateMachine, Wait,
};
use proptest::prelude::*;
use std::collections::BTreeMap;

const SESSIONS: usize = 3;
const LOCKS: [&str; 2] = ["a", "b"];
const TTL_MS: u64 = 2_000;

#[derive(Clone, Copy, Debug)]
enum Step {
    /// The client asks for a lock it neither holds nor is asking for.
    Ask { who: usize, lock: usize, wait: Wait },
    /// The log takes one of the commands on their way (network order is any order).
    Apply { pick: usize },
    /// The answer to the client's current attempt reaches it, if the shell has one.
    Deliver { who: usize, lock: usize },
    /// The connection of the client's current attempt breaks.
    Break { who: usize, lock: usize },
    /// The client tries the request again.
    Retry { who: usize, lock: usize },
    /// The client gives up on the request.
    GiveUp { who: usize, lock: usize },
    /// A guard releases its lock.
    Release { who: usize, lock: usize },
    /// The client stops waiting for its abandon of a given-up request (its request timeout
    /// passed); the abandon may still reach the log, later.
    StopWaitingForAbandon { who: usize, lock: usize },
    /// Time passes; the leader's tick renews the sessions in `renew` (a bit per session).
    Tick { advance_ms: u64, renew: u8 },
}

fn step() -> impl Strategy<Value = Step> {
    let who = 0..SESSIONS;
    let lock = 0..LOCKS.len();
    let wait = prop_oneof![
        Just(Wait::Try),
        Just(Wait::Forever),
        (1_u64..3_000).prop_map(|wait_ms| Wait::For { wait_ms })
    ];
    prop_oneof![
        3 => (who.clone(), lock.clone(), wait).prop_map(|(who, lock, wait)| Step::Ask { who, lock, wait }),
        6 => any::<usize>().prop_map(|pick| Step::Apply { pick }),
        3 => (who.clone(), lock.clone()).prop_map(|(who, lock)| Step::Deliver { who, lock }),
        2 => (who.clone(), lock.clone()).prop_map(|(who, lock)| Step::Break { who, lock }),
        2 => (who.clone(), lock.clone()).prop_map(|(who, lock)| Step::Retry { who, lock }),
        1 => (who.clone(), lock.clone()).prop_map(|(who, lock)| Step::GiveUp { who, lock }),
        2 => (who.clone(), lock.clone()).prop_map(|(who, lock)| Step::Release { who, lock }),
        1 => (who, lock).prop_map(|(who, lock)| Step::StopWaitingForAbandon { who, lock }),
        2 => (0_u64..1_500, any::<u8>()).prop_map(|(advance_ms, renew)| Step::Tick { advance_ms, renew }),
    ]
}

/// Where the client's request for one lock stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Asking {
    Idle,
    /// Waiting for the answer to `attempt`.
    Waiting {
        request: RequestId,
        attempt: u32,
        wait: Wait,
    },
    /// `attempt` failed without an answer: the client will retry or give up.
    Failed {
        request: RequestId,
        attempt: u32,
        wait: Wait,
    },
}

/// What the shell's handler of one attempt knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Handler {
    /// Its acquire is on its way to the log.
    Proposed,
    /// Its acquire was queued; it waits for the grant or the end of the wait.
    Queued,
    /// It has its answer (settled): a grant's token, or `None` for a refusal.
    Answered(Option<u64>),
}

/// A command on its way to the log, with where it came from.
#[derive(Clone, Debug)]
struct OnItsWay {
    who: usize,
    lock: usize,
    command: Command,
    /// Sent by the client (not by the server's shell).
    from_client: bool,
}

#[derive(Clone, Copy, Debug)]
struct Guard {
    token: u64,
    lost: bool,
    /// The request whose answer made it.
    request: RequestId,
}

struct World {
    machine: StateMachine,
    now_ms: u64,
    sessions: Vec<SessionId>,
    session_ended: Vec<bool>,
    asking: BTreeMap<(usize, usize), Asking>,
    /// The shell's handlers, by (who, lock, request, attempt).
    handlers: BTreeMap<(usize, usize, u64, u32), Handler>,
    guards: BTreeMap<(usize, usize), Guard>,
    /// Grants whose end a client's watch heard of before any guard held them: (who, lock, token).
    ended_unguarded: Vec<(usize, usize, u64)>,
    on_its_way: Vec<OnItsWay>,
    next_request: u64,
    /// A guard that lost its grant to the abandoning of another request, if one did.
    taken_by_abandon: Option<String>,
    log: Vec<String>,
}

impl World {
    fn new() -> Self {
        let mut machine = StateMachine::new(Limits::default());
        let mut sessions = Vec::new();
        for _ in 0..SESSIONS {
            let open = Command::OpenSession { ttl_ms: TTL_MS, lock_delay_ms: 0, owner: None };
            match machine.apply(&Input::new(0, open)).result {
                Ok(Response::SessionOpened { session, .. }) => sessions.push(session),
                other => panic!("a session opens: {other:?}"),
            }
        }
        Self {
            machine,
            now_ms: 0,
            sessions,
            session_ended: vec![false; SESSIONS],
            asking: BTreeMap::new(),
            handlers: BTreeMap::new(),
            guards: BTreeMap::new(),
            ended_unguarded: Vec::new(),
            on_its_way: Vec::new(),
            next_request: 1,
            taken_by_abandon: None,
            log: Vec::new(),
        }
    }

    fn asking(&self, who: usize, lock: usize) -> Asking {
        self.asking.get(&(who, lock)).copied().unwrap_or(Asking::Idle)
    }

    fn send_acquire(
        &mut self,
        who: usize,
        lock: usize,
        (request, attempt, wait): (RequestId, u32, Wait),
    ) {
        self.asking.insert((who, lock), Asking::Waiting { request, attempt, wait });
        self.handlers.insert((who, lock, request.0, attempt), Handler::Proposed);
        let session = self.sessions[who];
        let command =
            Command::Acquire { session, name: LOCKS[lock].to_owned(), wait, request, attempt };
        self.on_its_way.push(OnItsWay { who, lock, command, from_client: true });
    }

    fn send_abandon(
        &mut self,
        (who, lock): (usize, usize),
        (request, attempt): (RequestId, u32),
        from_client: bool,
    ) {
        let session = self.sessions[who];
        let command = Command::Abandon { session, name: LOCKS[lock].to_owned(), request, attempt };
        self.on_its_way.push(OnItsWay { who, lock, command, from_client });
    }

    /// Whether the client's own abandon of a request for this lock is on its way: the client
    /// asks again only once it is answered (`Transport::abandon_done`).
    fn client_abandoning(&self, who: usize, lock: usize) -> bool {
        self.on_its_way.iter().any(|way| {
            way.from_client
                && (way.who, way.lock) == (who, lock)
                && matches!(way.command, Command::Abandon { .. })
        })
    }

    fn run(&mut self, step: Step) {
        self.log.push(format!("{step:?}"));
        match step {
            Step::Ask { who, lock, wait } => {
                if self.session_ended[who]
                    || self.asking(who, lock) != Asking::Idle
                    || self.guards.contains_key(&(who, lock))
                    || self.client_abandoning(who, lock)
                {
                    return;
                }
                let request = RequestId(self.next_request);
                self.next_request += 1;
                self.send_acquire(who, lock, (request, 0, wait));
            }
            Step::Apply { pick } => {
                if self.on_its_way.is_empty() {
                    return;
                }
                // Any order, an abandon before the attempt it abandons included: a half-open
                // connection can deliver an attempt after its caller gave up on it, or after
                // the node whose connection broke abandoned it.
                let next = self.on_its_way.remove(pick % self.on_its_way.len());
                self.apply(&next);
            }
            Step::Deliver { who, lock } => self.deliver(who, lock),
            Step::Break { who, lock } => {
                let Asking::Waiting { request, attempt, wait } = self.asking(who, lock) else {
                    return;
                };
                self.asking.insert((who, lock), Asking::Failed { request, attempt, wait });
                // The handler's caller went away: unless it had its answer, it abandons its
                // attempt; a settled answer is simply lost on the way.
                let handler = self.handlers.remove(&(who, lock, request.0, attempt));
                if !matches!(handler, Some(Handler::Answered(_))) {
                    self.send_abandon((who, lock), (request, attempt), false);
                }
            }
            Step::Retry { who, lock } => {
                if let Asking::Failed { request, attempt, wait } = self.asking(who, lock) {
                    self.send_acquire(who, lock, (request, attempt + 1, wait));
                }
            }
            Step::GiveUp { who, lock } => {
                if let Asking::Failed { request, attempt, .. } = self.asking(who, lock) {
                    self.asking.insert((who, lock), Asking::Idle);
                    self.send_abandon((who, lock), (request, attempt), true);
                }
            }
            Step::StopWaitingForAbandon { who, lock } => {
                for way in &mut self.on_its_way {
                    if (way.who, way.lock) == (who, lock)
                        && matches!(way.command, Command::Abandon { .. })
                    {
                        way.from_client = false;
                    }
                }
            }
            Step::Release { who, lock } => {
                if let Some(guard) = self.guards.remove(&(who, lock)) {
                    let session = self.sessions[who];
                    let name = LOCKS[lock].to_owned();
                    let command = Command::Release { session, name, token: guard.token };
                    self.on_its_way.push(OnItsWay { who, lock, command, from_client: true });
                }
            }
            Step::Tick { advance_ms, renew } => {
                self.now_ms += advance_ms;
                let renew = (0..SESSIONS)
                    .filter(|who| renew & (1 << who) != 0)
                    .map(|who| self.sessions[who])
                    .collect();
                let applied = self.machine.apply(&Input::new(
                    self.now_ms,
                    Command::Tick { renew, renew_for: Vec::new() },
                ));
                self.hear(&applied.events);
            }
        }
    }

    fn apply(&mut self, next: &OnItsWay) {
        let applied = self.machine.apply(&Input::new(self.now_ms, next.command.clone()));
        if let Command::Acquire { request, attempt, .. } = next.command {
            let key = (next.who, next.lock, request.0, attempt);
            // A handler whose caller went away no longer answers anyone.
            if let Some(handler) = self.handlers.get_mut(&key) {
                *handler = match &applied.result {
                    Ok(Response::Granted { token, .. }) => Handler::Answered(Some(*token)),
                    Ok(Response::Queued { .. }) => Handler::Queued,
                    _ => Handler::Answered(None),
                };
            }
        }
        // Abandoning one request never takes away a grant another request was told it holds.
        if let (Command::Abandon { request, .. }, Ok(Response::Abandoned { released_token, .. })) =
            (&next.command, &applied.result)
            && let Some(guard) = self.guards.get(&(next.who, next.lock))
            && Some(guard.token) == *released_token
            && guard.request != *request
        {
            self.taken_by_abandon = Some(format!(
                "abandoning request {request} released token {} of session {}'s guard, which \
                 request {} made",
                guard.token, next.who, guard.request
            ));
        }
        // A guard's release, once done, ends every guard of that grant: another acquire of the
        // lock in the session may have been answered `already_held` meanwhile (`guard::release`).
        if let (Command::Release { token, .. }, Ok(_)) = (&next.command, &applied.result) {
            self.grant_ended(next.who, next.lock, *token);
        }
        self.hear(&applied.events);
    }

    /// What the client's session does when it learns that grant `token` ended: its guard is
    /// lost, or, with no guard yet, a guard made from it later starts lost.
    fn grant_ended(&mut self, who: usize, lock: usize, token: u64) {
        match self.guards.get_mut(&(who, lock)) {
            Some(guard) if guard.token == token => guard.lost = true,
            _ => self.ended_unguarded.push((who, lock, token)),
        }
    }

    /// The events of one command, as the shell's waiting handlers and the clients' watches see
    /// them.
    fn hear(&mut self, events: &[Event]) {
        for event in events {
            let who_of = |session: SessionId| self.sessions.iter().position(|s| *s == session);
            let lock_of = |name: &str| LOCKS.iter().position(|lock| *lock == name);
            match event {
                Event::Granted { name, session, token } => {
                    let (who, lock) = (who_of(*session).unwrap(), lock_of(name).unwrap());
                    self.answer_queued(who, lock, Some(*token));
                }
                Event::Cancelled { name, session, .. } => {
                    let (who, lock) = (who_of(*session).unwrap(), lock_of(name).unwrap());
                    self.answer_queued(who, lock, None);
                }
                Event::Released { name, session, token, cause } => {
                    let (who, lock) = (who_of(*session).unwrap(), lock_of(name).unwrap());
                    if *cause != ReleaseCause::Released {
                        self.grant_ended(who, lock, *token);
                    }
                }
                Event::SessionEnded { session, .. } => {
                    let who = who_of(*session).unwrap();
                    self.session_ended[who] = true;
                    for ((owner, _), guard) in &mut self.guards {
                        if *owner == who {
                            guard.lost = true;
                        }
                    }
                }
                _ => {}
            }
        }
    }

    fn answer_queued(&mut self, who: usize, lock: usize, answer: Option<u64>) {
        for ((owner, held, _, _), handler) in &mut self.handlers {
            if (*owner, *held) == (who, lock) && *handler == Handler::Queued {
                *handler = Handler::Answered(answer);
            }
        }
    }

    fn deliver(&mut self, who: usize, lock: usize) {
        let Asking::Waiting { request, attempt, .. } = self.asking(who, lock) else {
            return;
        };
        let key = (who, lock, request.0, attempt);
        let Some(Handler::Answered(answer)) = self.handlers.get(&key).copied() else {
            return;
        };
        self.handlers.remove(&key);
        self.asking.insert((who, lock), Asking::Idle);
        if let Some(token) = answer {
            // A guard of a session or a grant already known to have ended starts lost.
            let lost =
                self.session_ended[who] || self.ended_unguarded.contains(&(who, lock, token));
            self.guards.insert((who, lock), Guard { token, lost, request });
        }
    }

    fn releasing(&self, who: usize, lock: usize, token: u64) -> bool {
        self.on_its_way.iter().any(|way| {
            (way.who, way.lock) == (who, lock)
                && matches!(way.command, Command::Release { token: released, .. } if released == token)
        })
    }

    fn in_progress(&self, who: usize, lock: usize) -> bool {
        self.asking(who, lock) != Asking::Idle
            || self.on_its_way.iter().any(|way| {
                (way.who, way.lock) == (who, lock) && matches!(way.command, Command::Abandon { .. })
            })
    }

    /// What the state holds, somebody knows; and what a guard thinks it holds, the state holds.
    /// Once `settled`, only a guard (or its release) knows a holder, and only a request still
    /// queued knows a waiter.
    fn check(&self, settled: bool) -> Result<(), String> {
        if let Some(taken) = &self.taken_by_abandon {
            return Err(taken.clone());
        }
        for (lock, name) in LOCKS.iter().enumerate() {
            let Some(info) = self.machine.lock(name) else { continue };
            if let Some(holder) = info.holder {
                let who = self.sessions.iter().position(|s| *s == holder.session).unwrap();
                let guarded = self
                    .guards
                    .get(&(who, lock))
                    .is_some_and(|guard| guard.token == holder.token && !guard.lost);
                let known = guarded
                    || self.releasing(who, lock, holder.token)
                    || (!settled && self.in_progress(who, lock));
                if !known {
                    return Err(format!(
                        "ghost holder: session {who} holds {name} (token {}) and no guard, \
                         release or request knows it",
                        holder.token
                    ));
                }
            }
            for waiter in &info.waiters {
                let who = self.sessions.iter().position(|s| s == waiter).unwrap();
                let known = if settled {
                    self.still_queued(who, lock)
                } else {
                    self.in_progress(who, lock)
                };
                if !known {
                    return Err(format!(
                        "ghost waiter: session {who} waits for {name} and no request knows it"
                    ));
                }
            }
        }
        for (&(who, lock), guard) in &self.guards {
            let holder = self.machine.lock(LOCKS[lock]).and_then(|info| info.holder);
            let holds = holder.is_some_and(|holder| {
                holder.session == self.sessions[who] && holder.token == guard.token
            });
            if !guard.lost && !holds {
                return Err(format!(
                    "a guard missed its loss: session {who}'s guard of {} (token {}) is not lost, \
                     but the state holds {holder:?}",
                    LOCKS[lock], guard.token
                ));
            }
        }
        Ok(())
    }

    /// Lands everything on its way and gives every client its answer: a failed attempt is given
    /// up, as the client does once it runs out of retries.
    fn settle(&mut self) {
        for _ in 0..64 {
            while !self.on_its_way.is_empty() {
                let next = self.on_its_way.remove(0);
                self.apply(&next);
            }
            let pending: Vec<(usize, usize)> = self.asking.keys().copied().collect();
            for (who, lock) in pending {
                match self.asking(who, lock) {
                    Asking::Failed { .. } => self.run(Step::GiveUp { who, lock }),
                    Asking::Waiting { .. } => self.deliver(who, lock),
                    Asking::Idle => {}
                }
            }
            if self.on_its_way.is_empty() {
                return;
            }
        }
    }

    /// Requests still waiting in a queue, which only a grant or the end of the wait answers.
    fn still_queued(&self, who: usize, lock: usize) -> bool {
        matches!(self.asking(who, lock), Asking::Waiting { request, attempt, .. }
            if self.handlers.get(&(who, lock, request.0, attempt)) == Some(&Handler::Queued))
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2_000, ..ProptestConfig::default() })]

    #[test]
    fn no_interleaving_leaves_a_ghost_holder_or_a_guard_that_missed_its_loss(
        steps in proptest::collection::vec(step(), 1..80)
    ) {
        let mut world = World::new();
        for step in steps {
            world.run(step);
            if let Err(ghost) = world.check(false) {
                prop_assert!(false, "{ghost}\nafter:\n{}", world.log.join("\n"));
            }
        }
        world.settle();
        if let Err(ghost) = world.check(true) {
            prop_assert!(false, "after settling: {ghost}\nafter:\n{}", world.log.join("\n"));
        }
    }
}

/// Regression (issue 14, "abandons retry for a bounded time"): a client that gave up on a
/// request stops waiting for its abandon after its request timeout and asks again; the earlier
/// request's grant is answered `already_held` to the new one, and the earlier request's
/// abandon, landing late (the node whose connection broke retries it for longer than the
/// client waits), released the grant the new request's guard holds. Under apply rules 2 the
/// grant belongs to the request last told it holds it, so the late abandon finds nothing.
#[test]
fn a_late_abandon_of_a_given_up_request_takes_no_grant_a_later_request_was_told_of() {
    let (who, lock) = (0, 0);
    let mut world = World::new();
    let steps = [
        Step::Ask { who, lock, wait: Wait::Forever },
        // The connection breaks: the node abandons the attempt; the client gives up on it,
        // abandons it too, and stops waiting for that abandon.
        Step::Break { who, lock },
        Step::GiveUp { who, lock },
        Step::StopWaitingForAbandon { who, lock },
        Step::Ask { who, lock, wait: Wait::Forever },
        // On its way: [first acquire, node's abandon, client's abandon, second acquire].
        Step::Apply { pick: 0 },
        Step::Apply { pick: 2 },
        Step::Deliver { who, lock },
        // The node's abandon of the first request lands last.
        Step::Apply { pick: 0 },
    ];
    for step in steps {
        world.run(step);
    }
    assert!(world.guards.contains_key(&(who, lock)), "the second request made a guard");
    if let Err(ghost) = world.check(false) {
        panic!("{ghost}\nafter:\n{}", world.log.join("\n"));
    }
}
