//! Small worlds, explored exhaustively. Random testing samples interleavings; this enumerates
//! every one up to a bound.
//!
//! A world is a few clients, one lock, one resource, the real `picket-core` state machine as the
//! lock service and the real `picket-fence` rule at the resource. Every message (acquire,
//! keepalive, release, the service's answer, a write) is in flight until the explorer delivers
//! it, in any order, so a client's write can arrive after its release, after its session
//! expired and after the next holder's write: a paused client and a slow network are the same
//! thing here. Keepalives reach the leader and ride in its next `Tick`, as in the server; time
//! moves in steps, each a `Tick` at the new time that renews those sessions and expires the
//! others past their deadline (sessions live one step, with no grace); acquires either try or
//! wait in the queue, where expiry, release and lock-delay's end grant them; and the leader can
//! change (a `Refresh`, as a new leader proposes first).
//!
//! Every reachable state is checked:
//! - tokens strictly increase: every new grant's token is above every earlier grant's;
//! - the resource never admits a write with a token below one it already admitted;
//! - the state machine's own invariants hold.
//!
//! The search is breadth-first over states deduplicated by a hash of everything in them (the
//! machine's snapshot bytes included), so the first violation found has a shortest trace.

use picket_core::{
    Command, Event, Input, Limits, RequestId, Response, SessionId, StateMachine, Wait,
};
use picket_fence::{FenceRecord, Policy, Presented, Stamp};
use std::collections::hash_map::DefaultHasher;
use std::collections::{BTreeMap, VecDeque};
use std::hash::{Hash, Hasher};

const LOCK: &str = "L";
const RESOURCE: &str = "r";
/// One step of time; sessions live one step past their last keepalive (with no expiry grace),
/// so a session that is not renewed expires at the second tick after it was last renewed.
const STEP_MS: u64 = 1_000;
const TTL_MS: u64 = STEP_MS;
/// The longest trace kept for a violation.
const MAX_TRACE: usize = 256;

/// How far to explore.
#[derive(Clone, Debug)]
pub struct Bounds {
    /// Clients, each with its own session (1 to 3).
    pub clients: u8,
    /// Acquires each client may send.
    pub acquires_per_client: u8,
    /// Keepalives each client may send.
    pub keepalives_per_client: u8,
    /// Steps of time the world may advance.
    pub time_steps: u8,
    /// Leader changes (`Refresh`).
    pub refreshes: u8,
    /// Lock-delay after an expiry, in steps.
    pub lock_delay_steps: u8,
    /// Stop (with an incomplete result) after this many distinct states.
    pub max_states: usize,
    /// Acquires wait in the lock's queue (else they only try).
    pub wait_in_queue: bool,
    /// A deliberate bug, to show the explorer catches it: the resource admits every write.
    pub fence_admits_everything: bool,
    /// A deliberate bug: a leader change starts the lock state afresh (the sessions reopened
    /// under the same ids), so the token counter starts again.
    pub token_counter_resets_on_refresh: bool,
}

impl Default for Bounds {
    fn default() -> Self {
        Self {
            clients: 2,
            acquires_per_client: 1,
            keepalives_per_client: 1,
            time_steps: 2,
            refreshes: 1,
            lock_delay_steps: 0,
            max_states: 2_000_000,
            wait_in_queue: false,
            fence_admits_everything: false,
            token_counter_resets_on_refresh: false,
        }
    }
}

/// What the exploration found.
#[derive(Clone, Debug)]
pub struct Exploration {
    /// Distinct states reached.
    pub states: usize,
    /// Transitions taken (including those into states already seen).
    pub transitions: usize,
    /// The longest shortest path from the start, in transitions.
    pub depth: usize,
    /// Whether every state within the bounds was reached (else `max_states` cut it short).
    pub complete: bool,
    /// Transitions in which a session expired.
    pub expiries: usize,
    /// Transitions in which a lock was granted after some session had expired.
    pub grants_after_expiry: usize,
    /// The first violation found, with the actions that lead to it from the start.
    pub violation: Option<Violation>,
}

/// A broken property and a shortest trace to it.
#[derive(Clone, Debug)]
pub struct Violation {
    /// What broke.
    pub property: String,
    /// The actions from the start, in order.
    pub trace: Vec<String>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
enum Phase {
    Idle,
    Asking,
    Holding { token: u64 },
}

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
struct Client {
    session: SessionId,
    phase: Phase,
    acquires_left: u8,
    keepalives_left: u8,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord)]
enum Message {
    Acquire { client: u8, request: u64 },
    KeepAlive { client: u8 },
    Release { client: u8, token: u64 },
    Answer { client: u8, token: Option<u64> },
    Write { client: u8, token: u64 },
}

#[derive(Clone, Debug)]
struct World {
    machine: StateMachine,
    now_ms: u64,
    steps_left: u8,
    refreshes_left: u8,
    clients: Vec<Client>,
    /// A multiset, kept sorted so that equal worlds hash equally.
    in_flight: Vec<Message>,
    /// Sessions whose keepalive reached the leader since its last tick, sorted.
    renew: Vec<SessionId>,
    /// Whether some session has expired.
    expired: bool,
    fence: Option<FenceRecord>,
    max_granted: u64,
    max_admitted: u64,
}

impl World {
    fn start(bounds: &Bounds) -> Self {
        let (machine, sessions) = fresh_machine(bounds, 0);
        let clients = sessions
            .into_iter()
            .map(|session| Client {
                session,
                phase: Phase::Idle,
                acquires_left: bounds.acquires_per_client,
                keepalives_left: bounds.keepalives_per_client,
            })
            .collect();
        Self {
            machine,
            now_ms: 0,
            steps_left: bounds.time_steps,
            refreshes_left: bounds.refreshes,
            clients,
            in_flight: Vec::new(),
            renew: Vec::new(),
            expired: false,
            fence: None,
            max_granted: 0,
            max_admitted: 0,
        }
    }

    fn fingerprint(&self) -> u64 {
        let mut hasher = DefaultHasher::new();
        self.machine.snapshot().hash(&mut hasher);
        self.now_ms.hash(&mut hasher);
        self.steps_left.hash(&mut hasher);
        self.refreshes_left.hash(&mut hasher);
        self.clients.hash(&mut hasher);
        self.in_flight.hash(&mut hasher);
        self.renew.hash(&mut hasher);
        self.expired.hash(&mut hasher);
        serde_json::to_vec(&self.fence).expect("a fence record serializes").hash(&mut hasher);
        self.max_granted.hash(&mut hasher);
        self.max_admitted.hash(&mut hasher);
        hasher.finish()
    }

    fn send(&mut self, message: Message) {
        let at = self.in_flight.binary_search(&message).unwrap_or_else(|at| at);
        self.in_flight.insert(at, message);
    }

    fn client_of(&self, session: SessionId) -> Option<u8> {
        let index = self.clients.iter().position(|client| client.session == session)?;
        u8::try_from(index).ok()
    }

    /// Applies `command` at the world's time; checks the machine's invariants and that every
    /// new grant's token is above every earlier one. Each grant and each ended wait is
    /// answered to its client.
    fn apply(&mut self, command: Command, seen: &mut Seen) -> Result<Result<Response, ()>, String> {
        let applied = self.machine.apply(&Input::new(self.now_ms, command));
        self.machine.check_invariants().map_err(|error| format!("machine invariant: {error}"))?;
        for event in &applied.events {
            match event {
                Event::Granted { token, session, .. } => {
                    if *token <= self.max_granted {
                        return Err(format!(
                            "token {token} granted after token {} had been granted",
                            self.max_granted
                        ));
                    }
                    self.max_granted = *token;
                    seen.granted_after_expiry |= self.expired;
                    if let Some(client) = self.client_of(*session) {
                        self.send(Message::Answer { client, token: Some(*token) });
                    }
                }
                Event::Cancelled { session, .. } => {
                    if let Some(client) = self.client_of(*session) {
                        self.send(Message::Answer { client, token: None });
                    }
                }
                Event::SessionEnded { .. } => {
                    self.expired = true;
                    seen.expired = true;
                }
                _ => {}
            }
        }
        Ok(applied.result.map_err(|_| ()))
    }

    /// Every action possible from this world, by name.
    fn actions(&self) -> Vec<Action> {
        let mut actions = Vec::new();
        for (index, client) in self.clients.iter().enumerate() {
            let client_index = u8::try_from(index).expect("at most 3 clients");
            match client.phase {
                Phase::Idle if client.acquires_left > 0 => {
                    actions.push(Action::Acquire(client_index));
                }
                Phase::Holding { .. } => actions.push(Action::WriteAndRelease(client_index)),
                _ => {}
            }
            if client.keepalives_left > 0 {
                actions.push(Action::KeepAlive(client_index));
            }
        }
        let mut previous = None;
        for message in &self.in_flight {
            // Equal messages lead to equal worlds: deliver one of them.
            if previous != Some(message) {
                actions.push(Action::Deliver(message.clone()));
            }
            previous = Some(message);
        }
        if self.steps_left > 0 {
            actions.push(Action::Advance);
        }
        if self.refreshes_left > 0 {
            actions.push(Action::Refresh);
        }
        actions
    }

    /// Takes `action`; an error is a broken property.
    fn take(&mut self, action: &Action, bounds: &Bounds) -> Result<Seen, String> {
        let mut seen = Seen::default();
        match action {
            Action::Acquire(client) => {
                let state = &mut self.clients[usize::from(*client)];
                state.acquires_left -= 1;
                state.phase = Phase::Asking;
                let request = u64::from(bounds.acquires_per_client - state.acquires_left);
                self.send(Message::Acquire { client: *client, request });
            }
            Action::WriteAndRelease(client) => {
                let state = &mut self.clients[usize::from(*client)];
                let Phase::Holding { token } = state.phase else {
                    unreachable!("only a holder writes")
                };
                state.phase = Phase::Idle;
                self.send(Message::Write { client: *client, token });
                self.send(Message::Release { client: *client, token });
            }
            Action::KeepAlive(client) => {
                self.clients[usize::from(*client)].keepalives_left -= 1;
                self.send(Message::KeepAlive { client: *client });
            }
            Action::Deliver(message) => {
                let at = self.in_flight.binary_search(message).expect("the message is in flight");
                self.in_flight.remove(at);
                self.deliver(message.clone(), bounds, &mut seen)?;
            }
            Action::Advance => {
                self.steps_left -= 1;
                self.now_ms += STEP_MS;
                let renew = std::mem::take(&mut self.renew);
                self.apply(Command::Tick { renew, renew_for: Vec::new() }, &mut seen)?.ok();
            }
            Action::Refresh => {
                self.refreshes_left -= 1;
                if bounds.token_counter_resets_on_refresh {
                    let (machine, sessions) = fresh_machine(bounds, self.now_ms);
                    let before: Vec<SessionId> =
                        self.clients.iter().map(|client| client.session).collect();
                    assert_eq!(sessions, before, "a fresh machine opens the same session ids");
                    self.machine = machine;
                }
                self.apply(Command::Refresh, &mut seen)?.ok();
            }
        }
        Ok(seen)
    }

    fn deliver(
        &mut self,
        message: Message,
        bounds: &Bounds,
        seen: &mut Seen,
    ) -> Result<(), String> {
        match message {
            Message::Acquire { client, request } => {
                let session = self.clients[usize::from(client)].session;
                let wait = if bounds.wait_in_queue { Wait::Forever } else { Wait::Try };
                let acquire = Command::Acquire {
                    session,
                    name: LOCK.to_owned(),
                    wait,
                    request: RequestId(request),
                    attempt: 0,
                };
                // A grant is answered from its event; a queued acquire hears when its wait
                // ends; a refusal is answered now.
                match self.apply(acquire, seen)? {
                    Ok(Response::Granted { already_held: true, token, .. }) => {
                        self.send(Message::Answer { client, token: Some(token) });
                    }
                    Ok(_) => {}
                    Err(()) => self.send(Message::Answer { client, token: None }),
                }
            }
            Message::KeepAlive { client } => {
                let session = self.clients[usize::from(client)].session;
                if let Err(at) = self.renew.binary_search(&session) {
                    self.renew.insert(at, session);
                }
            }
            Message::Release { client, token } => {
                let session = self.clients[usize::from(client)].session;
                self.apply(Command::Release { session, name: LOCK.to_owned(), token }, seen)?.ok();
            }
            Message::Answer { client, token } => {
                self.clients[usize::from(client)].phase = match token {
                    Some(token) => Phase::Holding { token },
                    None => Phase::Idle,
                };
            }
            Message::Write { token, .. } => self.write(token, bounds)?,
        }
        Ok(())
    }

    /// The resource judges a write with `token` by the real fence rule.
    fn write(&mut self, token: u64, bounds: &Bounds) -> Result<(), String> {
        let presented = Presented {
            lock: LOCK.to_owned(),
            stamp: Stamp { token, seq: None },
            idempotency_key: None,
            request_digest: None,
        };
        let admitted = if bounds.fence_admits_everything {
            true
        } else {
            let policy = Policy::new(LOCK);
            // The writes carry no idempotency key, so the time (which only forgets keys) is
            // not part of this world's state.
            let now_ms = 0;
            match picket_fence::rule::admit(
                RESOURCE,
                self.fence.as_ref(),
                &policy,
                &presented,
                now_ms,
            ) {
                Ok((_, record)) => {
                    self.fence = Some(record);
                    true
                }
                Err(_) => false,
            }
        };
        if admitted {
            if token < self.max_admitted {
                return Err(format!(
                    "the resource admitted a write with token {token} after one with token {}",
                    self.max_admitted
                ));
            }
            self.max_admitted = token;
        }
        Ok(())
    }
}

/// What one transition did, for the exploration's counts.
#[derive(Clone, Copy, Debug, Default)]
struct Seen {
    expired: bool,
    granted_after_expiry: bool,
}

/// A state machine with one session per client opened at `now_ms`, and their ids.
fn fresh_machine(bounds: &Bounds, now_ms: u64) -> (StateMachine, Vec<SessionId>) {
    let limits = Limits { session_expiry_grace_ms: 0, ..Limits::default() };
    let mut machine = StateMachine::new(limits);
    let mut sessions = Vec::new();
    for _ in 0..bounds.clients {
        let open = Command::OpenSession {
            ttl_ms: TTL_MS,
            lock_delay_ms: u64::from(bounds.lock_delay_steps) * STEP_MS,
            owner: None,
        };
        let applied = machine.apply(&Input::new(now_ms, open));
        let Ok(Response::SessionOpened { session, .. }) = applied.result else {
            panic!("a session opens in an empty world: {:?}", applied.result);
        };
        sessions.push(session);
    }
    (machine, sessions)
}

#[derive(Clone, Debug)]
enum Action {
    Acquire(u8),
    WriteAndRelease(u8),
    KeepAlive(u8),
    Deliver(Message),
    Advance,
    Refresh,
}

/// Explores every world reachable within `bounds`.
///
/// # Panics
/// When `bounds` asks for no client or more than three.
#[must_use]
pub fn explore(bounds: &Bounds) -> Exploration {
    assert!((1..=3).contains(&bounds.clients), "one to three clients");
    let start = World::start(bounds);
    // For each state seen: the state it was first reached from, and the action taken.
    let mut parents: BTreeMap<u64, Option<(u64, Action)>> = BTreeMap::new();
    let start_print = start.fingerprint();
    parents.insert(start_print, None);
    let mut queue = VecDeque::from([(start, start_print, 0_usize)]);
    let mut exploration = Exploration {
        states: 1,
        transitions: 0,
        depth: 0,
        complete: true,
        expiries: 0,
        grants_after_expiry: 0,
        violation: None,
    };
    while let Some((world, print, depth)) = queue.pop_front() {
        exploration.depth = exploration.depth.max(depth);
        for action in world.actions() {
            exploration.transitions += 1;
            let mut next = world.clone();
            match next.take(&action, bounds) {
                Ok(seen) => {
                    exploration.expiries += usize::from(seen.expired);
                    exploration.grants_after_expiry += usize::from(seen.granted_after_expiry);
                }
                Err(property) => {
                    let mut trace = trace_to(&parents, print);
                    trace.push(describe(&action));
                    exploration.violation = Some(Violation { property, trace });
                    return exploration;
                }
            }
            let next_print = next.fingerprint();
            if parents.contains_key(&next_print) {
                continue;
            }
            if parents.len() >= bounds.max_states {
                exploration.complete = false;
                continue;
            }
            parents.insert(next_print, Some((print, action)));
            exploration.states += 1;
            queue.push_back((next, next_print, depth + 1));
        }
    }
    exploration
}

/// The actions from the start to the state `print`.
fn trace_to(parents: &BTreeMap<u64, Option<(u64, Action)>>, mut print: u64) -> Vec<String> {
    let mut trace = Vec::new();
    while let Some(Some((parent, action))) = parents.get(&print) {
        trace.push(describe(action));
        print = *parent;
        if trace.len() >= MAX_TRACE {
            break;
        }
    }
    trace.reverse();
    trace
}

fn describe(action: &Action) -> String {
    match action {
        Action::Acquire(client) => format!("client {client} sends acquire"),
        Action::WriteAndRelease(client) => format!("client {client} sends its write and release"),
        Action::KeepAlive(client) => format!("client {client} sends a keepalive"),
        Action::Deliver(message) => format!("deliver {message:?}"),
        Action::Advance => format!("time advances {STEP_MS} ms (a tick with the keepalives)"),
        Action::Refresh => "the leader changes (refresh)".to_owned(),
    }
}

#[cfg(test)]
mod tests;
