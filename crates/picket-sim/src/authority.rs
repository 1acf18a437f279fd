//! Lock authorities: who grants the lock, with what token, and when a silent holder loses it.
//!
//! The lease, etcd and ZooKeeper models are small re-statements of those systems' lock recipes.
//! The Picket authority is not a model: it is `picket-core`'s state machine itself, driven by
//! the same commands the server sends it.

use crate::config::SimConfig;
use picket_core::{
    Command, Input, Limits, RequestId, Response, Sequencer, SessionId, StateMachine, Wait,
};
use std::collections::{BTreeMap, VecDeque};

/// The one lock every client competes for.
pub const LOCK: &str = "res";

/// A grant as the authority reports it. The world gives it a ground-truth id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Granted {
    /// The client that now holds the lock.
    pub client: usize,
    /// The fencing token, if the strategy has one.
    pub token: Option<u64>,
    /// How long the client may assume it holds the lock, from when it asked.
    pub lease_ms: u64,
    /// False when this repeats a grant the client already had (a retried request).
    pub fresh: bool,
}

/// The answer to an acquire request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AcquireReply {
    /// Granted now.
    Granted(Granted),
    /// Queued: a grant will come from a later tick.
    Queued,
    /// Not granted and not queued: try again later (Redlock).
    Busy,
}

/// A lock authority.
pub trait Authority {
    /// A client asks for the lock at simulated time `now_us`.
    fn acquire(&mut self, now_us: u64, client: usize) -> AcquireReply;
    /// A client gives the lock up. Returns the grant to the next waiter, if the release made
    /// one.
    fn release(&mut self, now_us: u64, client: usize) -> Vec<Granted>;
    /// Time passes; `heard[c]` says whether client c's keepalives reached the authority since
    /// the last tick. Returns grants made to waiters.
    fn tick(&mut self, now_us: u64, heard: &[bool]) -> Vec<Granted>;
    /// Whether `token` is the lock's current grant (verify on advance).
    fn is_current(&self, token: u64) -> bool;
    /// The lock service's leader fails over (state survives unless a mutation says otherwise).
    fn failover(&mut self, now_us: u64);
    /// The lock is deleted and recreated, if nobody holds or waits for it.
    fn recreate_if_idle(&mut self);
    /// A node's wall clock jumps by `by_ms` (only Redlock's nodes use wall clocks for expiry).
    fn step_node_clock(&mut self, _node_pick: u64, _by_ms: i64) {}
}

fn ms(now_us: u64) -> u64 {
    now_us / 1_000
}

/// A single-node lease with a FIFO queue; tokens from a counter policy.
#[derive(Debug)]
pub struct LeaseAuthority {
    ttl_ms: u64,
    holder: Option<(usize, u64)>,
    queue: VecDeque<(usize, u64)>,
    last_heard_ms: BTreeMap<usize, u64>,
    tokens: TokenSource,
    clock_rate: f64,
}

/// Where a lease authority's tokens come from.
#[derive(Debug)]
pub enum TokenSource {
    /// No token (lease + trust).
    None,
    /// etcd: a revision that every change advances and that never resets; the token is the
    /// revision at which the waiter's key was created.
    Revision(u64),
    /// ZooKeeper: the lock parent's child counter; the token is the waiter node's sequence
    /// number. Recreating the parent resets it.
    Sequence(u64),
}

impl LeaseAuthority {
    /// A lease authority whose clock runs at `clock_rate` of real time.
    #[must_use]
    pub fn new(config: &SimConfig, tokens: TokenSource, clock_rate: f64) -> Self {
        Self {
            ttl_ms: config.ttl_ms,
            holder: None,
            queue: VecDeque::new(),
            last_heard_ms: BTreeMap::new(),
            tokens,
            clock_rate,
        }
    }

    fn local_ms(&self, now_us: u64) -> u64 {
        #[allow(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            clippy::cast_precision_loss
        )]
        let local = (ms(now_us) as f64 * self.clock_rate) as u64;
        local
    }

    /// A waiter's token, taken when it joins the queue, as etcd and ZooKeeper do.
    fn next_token(&mut self) -> u64 {
        match &mut self.tokens {
            TokenSource::None => 0,
            TokenSource::Revision(revision) | TokenSource::Sequence(revision) => {
                *revision += 1;
                *revision
            }
        }
    }

    fn bump_revision(&mut self) {
        if let TokenSource::Revision(revision) = &mut self.tokens {
            *revision += 1;
        }
    }

    fn grant(&self, client: usize, token: u64, fresh: bool) -> Granted {
        let token = match self.tokens {
            TokenSource::None => None,
            _ => Some(token),
        };
        Granted { client, token, lease_ms: self.ttl_ms, fresh }
    }

    fn promote(&mut self) -> Option<Granted> {
        if self.holder.is_some() {
            return None;
        }
        let (client, token) = self.queue.pop_front()?;
        self.holder = Some((client, token));
        Some(self.grant(client, token, true))
    }
}

impl Authority for LeaseAuthority {
    fn acquire(&mut self, now_us: u64, client: usize) -> AcquireReply {
        let now_ms = self.local_ms(now_us);
        self.last_heard_ms.insert(client, now_ms);
        if let Some((holder, token)) = self.holder
            && holder == client
        {
            return AcquireReply::Granted(self.grant(client, token, false));
        }
        if self.queue.iter().any(|(waiter, _)| *waiter == client) {
            return AcquireReply::Queued;
        }
        let token = self.next_token();
        self.queue.push_back((client, token));
        match self.promote() {
            Some(granted) => AcquireReply::Granted(granted),
            None => AcquireReply::Queued,
        }
    }

    fn release(&mut self, _now_us: u64, client: usize) -> Vec<Granted> {
        if self.holder.is_some_and(|(holder, _)| holder == client) {
            self.holder = None;
            self.bump_revision();
        }
        self.promote().into_iter().collect()
    }

    fn tick(&mut self, now_us: u64, heard: &[bool]) -> Vec<Granted> {
        let now_ms = self.local_ms(now_us);
        for (client, heard) in heard.iter().enumerate() {
            if *heard {
                self.last_heard_ms.insert(client, now_ms);
            }
        }
        let ttl_ms = self.ttl_ms;
        let expired = |client: &usize, last_heard: &BTreeMap<usize, u64>| {
            last_heard.get(client).is_some_and(|heard| heard + ttl_ms < now_ms)
        };
        if let Some((holder, _)) = self.holder
            && expired(&holder, &self.last_heard_ms)
        {
            self.holder = None;
            self.bump_revision();
        }
        let last_heard = self.last_heard_ms.clone();
        self.queue.retain(|(waiter, _)| !expired(waiter, &last_heard));
        self.promote().into_iter().collect()
    }

    fn is_current(&self, token: u64) -> bool {
        self.holder.is_some_and(|(_, held)| held == token)
    }

    fn failover(&mut self, _now_us: u64) {}

    fn recreate_if_idle(&mut self) {
        if self.holder.is_none()
            && self.queue.is_empty()
            && let TokenSource::Sequence(counter) = &mut self.tokens
        {
            // A Curator container node: the empty parent is deleted, and a new one starts its
            // child counter from zero.
            *counter = 0;
        }
    }
}

/// Redlock over independent nodes with their own clocks: a random value on a majority, with a
/// TTL and a drift allowance. No queue, no keepalive, no token.
#[derive(Debug)]
pub struct RedlockAuthority {
    ttl_ms: u64,
    /// Per node: (holder, expiry on the node's clock).
    nodes: Vec<Option<(usize, u64)>>,
    /// Per node: clock offset in ms (wall clocks: they may jump).
    offsets_ms: Vec<i64>,
}

impl RedlockAuthority {
    /// `nodes` Redis nodes.
    #[must_use]
    pub fn new(config: &SimConfig, nodes: usize) -> Self {
        Self { ttl_ms: config.ttl_ms, nodes: vec![None; nodes], offsets_ms: vec![0; nodes] }
    }

    fn node_ms(&self, node: usize, now_us: u64) -> u64 {
        u64::try_from(
            i64::try_from(ms(now_us))
                .unwrap_or(i64::MAX)
                .saturating_add(self.offsets_ms[node])
                .max(0),
        )
        .unwrap_or(0)
    }
}

impl Authority for RedlockAuthority {
    fn acquire(&mut self, now_us: u64, client: usize) -> AcquireReply {
        let mut won = Vec::new();
        let mut already = 0;
        for node in 0..self.nodes.len() {
            let now_ms = self.node_ms(node, now_us);
            let free = match self.nodes[node] {
                None => true,
                Some((_, expiry_ms)) if expiry_ms <= now_ms => true,
                Some((holder, _)) => {
                    already += usize::from(holder == client);
                    holder == client
                }
            };
            if free {
                self.nodes[node] = Some((client, now_ms + self.ttl_ms));
                won.push(node);
            }
        }
        if won.len() > self.nodes.len() / 2 {
            // The validity the client may count on: TTL minus the clock drift allowance
            // (1% of the TTL plus 2 ms, as the Redlock description suggests).
            let drift_ms = self.ttl_ms / 100 + 2;
            let fresh = already <= self.nodes.len() / 2;
            return AcquireReply::Granted(Granted {
                client,
                token: None,
                lease_ms: self.ttl_ms - drift_ms,
                fresh,
            });
        }
        for node in won {
            self.nodes[node] = None;
        }
        AcquireReply::Busy
    }

    fn release(&mut self, _now_us: u64, client: usize) -> Vec<Granted> {
        for node in &mut self.nodes {
            if node.is_some_and(|(holder, _)| holder == client) {
                *node = None;
            }
        }
        Vec::new()
    }

    fn tick(&mut self, _now_us: u64, _heard: &[bool]) -> Vec<Granted> {
        Vec::new()
    }

    fn is_current(&self, _token: u64) -> bool {
        false
    }

    fn failover(&mut self, _now_us: u64) {}

    fn recreate_if_idle(&mut self) {}

    fn step_node_clock(&mut self, node_pick: u64, by_ms: i64) {
        let node = usize::try_from(node_pick % self.nodes.len() as u64).unwrap_or(0);
        self.offsets_ms[node] += by_ms;
    }
}

/// Picket: `picket-core`'s state machine, driven as the server drives it: sessions with a TTL,
/// acquires that wait in the queue, ticks that carry keepalives, a refresh after failover.
#[derive(Debug)]
pub struct PicketAuthority {
    machine: StateMachine,
    ttl_ms: u64,
    sessions: BTreeMap<usize, SessionId>,
    /// The leader's clock: (offset added to simulated time, rate). A new leader has another.
    clock_offset_ms: u64,
    clock_rate: f64,
    reset_on_failover: bool,
}

impl PicketAuthority {
    /// A fresh lock service.
    #[must_use]
    pub fn new(config: &SimConfig, clock_rate: f64) -> Self {
        // Every simulated authority expires a lease exactly at its TTL, so the strategies are
        // compared on equal terms; the server's expiry grace covers keepalives waiting unread
        // in a leader's sockets, which the simulation does not model.
        let limits = Limits { min_ttl_ms: 1, session_expiry_grace_ms: 0, ..Limits::default() };
        Self {
            machine: StateMachine::new(limits),
            ttl_ms: config.ttl_ms,
            sessions: BTreeMap::new(),
            clock_offset_ms: 0,
            clock_rate,
            reset_on_failover: config.mutations.token_counter_resets_on_restart,
        }
    }

    fn now_ms(&self, now_us: u64) -> u64 {
        #[allow(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            clippy::cast_precision_loss
        )]
        let local = (ms(now_us) as f64 * self.clock_rate) as u64;
        local + self.clock_offset_ms
    }

    fn apply(&mut self, now_us: u64, command: Command) -> picket_core::Applied {
        let input = Input::new(self.now_ms(now_us), command);
        self.machine.apply(&input)
    }

    /// The client's live session, opening one if it has none (or its old one expired).
    fn session(&mut self, now_us: u64, client: usize) -> SessionId {
        if let Some(session) = self.sessions.get(&client)
            && self.machine.session(*session).is_some()
        {
            return *session;
        }
        let applied = self.apply(
            now_us,
            Command::OpenSession { ttl_ms: self.ttl_ms, lock_delay_ms: 0, owner: None },
        );
        let Ok(Response::SessionOpened { session, .. }) = applied.result else {
            panic!("opening a session failed: {:?}", applied.result)
        };
        self.sessions.insert(client, session);
        session
    }

    fn client_of(&self, session: SessionId) -> Option<usize> {
        self.sessions.iter().find(|(_, id)| **id == session).map(|(client, _)| *client)
    }

    fn granted_events(&self, events: &[picket_core::Event]) -> Vec<Granted> {
        events
            .iter()
            .filter_map(|event| match event {
                picket_core::Event::Granted { session, token, .. } => {
                    self.client_of(*session).map(|client| Granted {
                        client,
                        token: Some(*token),
                        lease_ms: self.ttl_ms,
                        fresh: true,
                    })
                }
                _ => None,
            })
            .collect()
    }
}

impl Authority for PicketAuthority {
    fn acquire(&mut self, now_us: u64, client: usize) -> AcquireReply {
        let session = self.session(now_us, client);
        // A client that asks again while it waits is retrying: the same request, which keeps
        // its place in the queue.
        let request = RequestId(0);
        let command = Command::Acquire {
            session,
            name: LOCK.into(),
            wait: Wait::Forever,
            request,
            attempt: 0,
        };
        let applied = self.apply(now_us, command);
        match applied.result {
            Ok(Response::Granted { token, already_held, .. }) => AcquireReply::Granted(Granted {
                client,
                token: Some(token),
                lease_ms: self.ttl_ms,
                fresh: !already_held,
            }),
            Ok(Response::Queued { .. }) => AcquireReply::Queued,
            other => panic!("acquire failed: {other:?}"),
        }
    }

    fn release(&mut self, now_us: u64, client: usize) -> Vec<Granted> {
        let Some(session) = self.sessions.get(&client).copied() else { return Vec::new() };
        let holder = self.machine.lock(LOCK).and_then(|lock| lock.holder);
        let Some(holder) = holder.filter(|holder| holder.session == session) else {
            return Vec::new();
        };
        let applied = self
            .apply(now_us, Command::Release { session, name: LOCK.into(), token: holder.token });
        assert!(applied.result.is_ok(), "release failed: {:?}", applied.result);
        // A release grants the lock to the next waiter in the same command.
        self.granted_events(&applied.events)
    }

    fn tick(&mut self, now_us: u64, heard: &[bool]) -> Vec<Granted> {
        let renew: Vec<SessionId> = heard
            .iter()
            .enumerate()
            .filter(|(_, heard)| **heard)
            .filter_map(|(client, _)| self.sessions.get(&client).copied())
            .collect();
        let applied = self.apply(now_us, Command::Tick { renew, renew_for: Vec::new() });
        self.granted_events(&applied.events)
    }

    fn is_current(&self, token: u64) -> bool {
        self.machine.check(&Sequencer::new(LOCK, token)).is_current()
    }

    fn failover(&mut self, now_us: u64) {
        if self.reset_on_failover {
            // The mutation: the new leader starts from an empty state, its revision from zero.
            self.machine = StateMachine::new(self.machine.limits().clone());
            self.sessions.clear();
        } else {
            // The real thing: the new leader holds the replicated state, restored as a snapshot.
            self.machine =
                StateMachine::restore(&self.machine.snapshot()).expect("a snapshot restores");
        }
        // The new leader's monotonic clock reads differently; it refreshes every session.
        self.clock_offset_ms += 1_000_000;
        self.apply(now_us, Command::Refresh);
    }

    fn recreate_if_idle(&mut self) {
        // Picket drops an idle lock's record by itself; its tokens come from the revision, which
        // never resets, so recreation changes nothing.
    }
}

/// The authority a strategy uses in a scenario.
#[must_use]
pub fn for_strategy(
    strategy: crate::config::Strategy,
    config: &SimConfig,
    clock_rate: f64,
) -> Box<dyn Authority> {
    use crate::config::Strategy;
    match strategy {
        Strategy::LeaseTrust => {
            Box::new(LeaseAuthority::new(config, TokenSource::None, clock_rate))
        }
        Strategy::Redlock => Box::new(RedlockAuthority::new(config, 5)),
        Strategy::Zookeeper => {
            Box::new(LeaseAuthority::new(config, TokenSource::Sequence(0), clock_rate))
        }
        Strategy::Etcd => {
            Box::new(LeaseAuthority::new(config, TokenSource::Revision(0), clock_rate))
        }
        _ => Box::new(PicketAuthority::new(config, clock_rate)),
    }
}
