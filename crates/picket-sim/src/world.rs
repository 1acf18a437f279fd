//! One simulated run: clients doing read-modify-write cycles on a shared counter under a lock,
//! an authority, a resource, a network with random delays, and the scenario's faults.
//!
//! A client cycle: acquire; (fence on acquire: register the token); read the counter; check its
//! own deadline (the last check); possibly pause; write counter + 1 with its token; release.
//!
//! Ground truth is kept outside every participant: each grant gets an id in the order the
//! authority made them, so the run can tell which writes came from a superseded grant whatever
//! the strategy's tokens say.

use crate::authority::{self, AcquireReply, Authority, Granted, LOCK};
use crate::config::{Scenario, SimConfig, Strategy};
use crate::rng::Rng;
use picket_fence::rule::{self, FenceRecord, Policy, Presented};
use serde::{Deserialize, Serialize};
use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};

/// What one run measured.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunStats {
    /// Grants made.
    pub grants: u64,
    /// Writes the resource admitted.
    pub writes_admitted: u64,
    /// Writes admitted after a newer grant had already reached the resource: the stale-holder
    /// writes the seeds' table asks about.
    pub stale_admitted: u64,
    /// Writes refused because a newer grant had reached the resource.
    pub stale_refused: u64,
    /// Writes refused although no newer grant existed: the newest grant's token was refused
    /// (ZooKeeper's reset counter wedges the resource this way) or that grant had already
    /// expired with nobody holding the lock since.
    pub newest_grant_refused: u64,
    /// Writes admitted while a newer grant existed at the authority (before it reached the
    /// resource): the window fence on acquire or verify on advance closes.
    pub superseded_admitted: u64,
    /// Increments acknowledged to clients.
    pub acked_increments: u64,
    /// Acknowledged increments missing from the final counter.
    pub lost_updates: u64,
    /// Grants whose token was not greater than the previous grant's.
    pub token_regressions: u64,
}

impl RunStats {
    /// Any safety violation in this run.
    #[must_use]
    pub fn violated(&self) -> bool {
        self.stale_admitted > 0 || self.lost_updates > 0 || self.token_regressions > 0
    }

    /// Adds another run's counts.
    pub fn add(&mut self, other: &Self) {
        self.grants += other.grants;
        self.writes_admitted += other.writes_admitted;
        self.stale_admitted += other.stale_admitted;
        self.stale_refused += other.stale_refused;
        self.newest_grant_refused += other.newest_grant_refused;
        self.superseded_admitted += other.superseded_admitted;
        self.acked_increments += other.acked_increments;
        self.lost_updates += other.lost_updates;
        self.token_regressions += other.token_regressions;
    }
}

/// A grant as a client and the resource see it, with its ground-truth id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Grant {
    id: u64,
    token: Option<u64>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Idle,
    Acquiring,
    Registering,
    Reading,
    Writing,
    Releasing,
}

#[derive(Debug)]
enum Event {
    Think(usize),
    AcquireArrives(usize),
    AcquireRetry(usize, u64),
    Busy(usize),
    GrantArrives(usize, Grant, u64),
    ReleaseArrives(usize),
    ReleaseDone(usize),
    ReleaseTimeout(usize, u64),
    RegisterArrives(usize, Grant),
    RegisterReply(usize, bool),
    ReadArrives(usize, Grant),
    ReadReply(usize, Option<u64>),
    WriteArrives(usize, Grant, u64),
    VerifyArrives(usize, Grant, u64),
    VerifyReply(usize, Grant, u64, bool),
    WriteReply(usize, bool),
    PauseEnd(usize),
    Tick,
    PartitionStart,
    PartitionEnd(usize),
    ResourceRestart,
    Failover,
    ClockStep,
}

#[derive(Debug)]
struct Client {
    phase: Phase,
    grant: Option<Grant>,
    /// Deadline on the client's own clock, in µs.
    deadline_us: u64,
    /// When the current acquire was sent, on the client's clock.
    asked_at_us: u64,
    attempt: u64,
    paused_until_us: u64,
    partitioned: bool,
    clock_rate: f64,
    clock_offset_us: i64,
    /// The value this cycle will write: what it read, plus one.
    value_to_write: u64,
    acked: u64,
}

impl Client {
    fn clock_us(&self, now_us: u64) -> u64 {
        #[allow(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            clippy::cast_precision_loss
        )]
        let scaled = (now_us as f64 * self.clock_rate) as i64;
        u64::try_from(scaled.saturating_add(self.clock_offset_us).max(0)).unwrap_or(0)
    }
}

#[derive(Debug)]
struct Resource {
    value: u64,
    record: Option<FenceRecord>,
    durable: bool,
    /// A write is waiting for the lock service's answer (verify on advance): the resource holds
    /// every other operation until it is decided, so the check and the write stay one step.
    verifying: bool,
    held: std::collections::VecDeque<Event>,
}

/// The simulated world.
struct World {
    config: SimConfig,
    strategy: Strategy,
    rng: Rng,
    now_us: u64,
    queue: BinaryHeap<Reverse<(u64, u64)>>,
    events: BTreeMap<u64, Event>,
    next_event: u64,
    clients: Vec<Client>,
    authority: Box<dyn Authority>,
    resource: Resource,
    policy: Policy,
    /// Ground truth: grants made so far, the newest id, and the newest that reached the resource.
    grants_made: u64,
    /// Per client: the ground-truth id of the last grant the authority made to it, delivered
    /// or not. A repeated grant (a retried acquire) is that grant again.
    granted_id: Vec<u64>,
    newest_grant: u64,
    newest_at_resource: u64,
    last_token: Option<u64>,
    stats: RunStats,
    trace: Option<Vec<String>>,
}

const TICK_US: u64 = 50_000;
const ACQUIRE_TIMEOUT_US: u64 = 1_000_000;

impl World {
    fn new(config: &SimConfig, strategy: Strategy, seed: u64, trace: bool) -> Self {
        let mut rng = Rng::new(seed);
        let clock_faults = config.scenario == Scenario::Clock;
        let clients = (0..config.clients)
            .map(|_| Client {
                phase: Phase::Idle,
                grant: None,
                deadline_us: 0,
                asked_at_us: 0,
                attempt: 0,
                paused_until_us: 0,
                partitioned: false,
                clock_rate: if clock_faults { 0.9 + rng.unit() * 0.2 } else { 1.0 },
                clock_offset_us: 0,
                value_to_write: 0,
                acked: 0,
            })
            .collect();
        let authority_rate = if clock_faults { 0.95 + rng.unit() * 0.1 } else { 1.0 };
        let durable = strategy != Strategy::PicketVolatileFence;
        let mut world = Self {
            config: config.clone(),
            strategy,
            rng,
            now_us: 0,
            queue: BinaryHeap::new(),
            events: BTreeMap::new(),
            next_event: 0,
            clients,
            authority: authority::for_strategy(strategy, config, authority_rate),
            resource: Resource {
                value: 0,
                record: None,
                durable,
                verifying: false,
                held: std::collections::VecDeque::new(),
            },
            policy: Policy::new(LOCK),
            grants_made: 0,
            granted_id: vec![0; config.clients],
            newest_grant: 0,
            newest_at_resource: 0,
            last_token: None,
            stats: RunStats::default(),
            trace: trace.then(Vec::new),
        };
        for client in 0..config.clients {
            let start = world.rng.range(0, 20_000);
            world.schedule(start, Event::Think(client));
        }
        world.schedule(TICK_US, Event::Tick);
        world.schedule_faults();
        world
    }

    fn schedule_faults(&mut self) {
        match self.config.scenario {
            Scenario::Partition => {
                let at = self.rng.exp_us(8_000_000.0);
                self.schedule(at, Event::PartitionStart);
            }
            Scenario::Clock => {
                let at = self.rng.exp_us(5_000_000.0);
                self.schedule(at, Event::ClockStep);
            }
            Scenario::Restart => {
                let restart = self.rng.exp_us(10_000_000.0);
                let failover = self.rng.exp_us(15_000_000.0);
                self.schedule(restart, Event::ResourceRestart);
                self.schedule(failover, Event::Failover);
            }
            Scenario::Canonical | Scenario::Recreate => {}
        }
    }

    fn schedule(&mut self, delay_us: u64, event: Event) {
        let id = self.next_event;
        self.next_event += 1;
        self.queue.push(Reverse((self.now_us + delay_us, id)));
        self.events.insert(id, event);
    }

    /// A one-way network delay: 0.5 ms plus an exponential tail; random delays also reorder.
    fn delay(&mut self) -> u64 {
        500 + self.rng.exp_us(self.config.mean_delay_ms * 1_000.0)
    }

    /// Sends a message between a client and the authority; lost while the client is cut off.
    fn send_to_authority(&mut self, client: usize, event: Event) {
        if self.clients[client].partitioned {
            self.note(format!("client{client}'s message to the lock service is lost (partition)"));
            return;
        }
        let delay = self.delay();
        self.schedule(delay, event);
    }

    fn send(&mut self, event: Event) {
        let delay = self.delay();
        self.schedule(delay, event);
    }

    fn note(&mut self, line: String) {
        if let Some(trace) = &mut self.trace {
            #[allow(clippy::cast_precision_loss)]
            let seconds = self.now_us as f64 / 1e6;
            trace.push(format!("t={seconds:9.3}s  {line}"));
        }
    }

    fn run(mut self) -> (RunStats, Vec<String>) {
        let end_us = self.config.duration_ms * 1_000;
        while let Some(Reverse((at, id))) = self.queue.pop() {
            if at > end_us {
                break;
            }
            self.now_us = at;
            let event = self.events.remove(&id).expect("every queued event is stored");
            self.handle(event);
        }
        let acked: u64 = self.clients.iter().map(|client| client.acked).sum();
        self.stats.acked_increments = acked;
        self.stats.lost_updates = acked.saturating_sub(self.resource.value);
        (self.stats, self.trace.unwrap_or_default())
    }

    fn is_paused(&self, client: usize) -> bool {
        self.now_us < self.clients[client].paused_until_us
    }

    /// A message for a paused client waits until it wakes: the process is not running.
    fn defer_if_paused(&mut self, client: usize, event: Event) -> Option<Event> {
        if self.is_paused(client) {
            let wait = self.clients[client].paused_until_us - self.now_us;
            self.schedule(wait, event);
            return None;
        }
        Some(event)
    }

    fn handle(&mut self, event: Event) {
        let target = match &event {
            Event::Think(c)
            | Event::AcquireRetry(c, _)
            | Event::Busy(c)
            | Event::GrantArrives(c, _, _)
            | Event::RegisterReply(c, _)
            | Event::ReadReply(c, _)
            | Event::WriteReply(c, _)
            | Event::ReleaseDone(c)
            | Event::ReleaseTimeout(c, _) => Some(*c),
            _ => None,
        };
        let event = match target {
            Some(client) => match self.defer_if_paused(client, event) {
                Some(event) => event,
                None => return,
            },
            None => event,
        };
        let at_resource = matches!(
            event,
            Event::RegisterArrives(..) | Event::ReadArrives(..) | Event::WriteArrives(..)
        );
        if at_resource && self.resource.verifying {
            self.resource.held.push_back(event);
            return;
        }
        match event {
            Event::Think(c) => self.start_cycle(c),
            Event::AcquireRetry(c, attempt) => {
                if self.clients[c].phase == Phase::Acquiring && self.clients[c].attempt == attempt {
                    self.ask(c);
                }
            }
            Event::Busy(c) => {
                if self.clients[c].phase == Phase::Acquiring {
                    let wait = self.rng.range(5_000, 50_000);
                    let attempt = self.clients[c].attempt;
                    self.schedule(wait, Event::AcquireRetry(c, attempt));
                }
            }
            Event::AcquireArrives(c) => self.authority_acquire(c),
            Event::ReleaseArrives(c) => {
                for granted in self.authority.release(self.now_us, c) {
                    self.deliver(granted);
                }
                self.maybe_recreate();
                self.send_to_authority(c, Event::ReleaseDone(c));
            }
            Event::ReleaseDone(c) => self.released(c, None),
            Event::ReleaseTimeout(c, attempt) => self.released(c, Some(attempt)),
            Event::GrantArrives(c, grant, lease_ms) => self.on_grant(c, grant, lease_ms),
            Event::RegisterArrives(c, grant) => self.resource_register(c, grant),
            Event::RegisterReply(c, ok) => self.on_registered(c, ok),
            Event::ReadArrives(c, grant) => self.resource_read(c, grant),
            Event::ReadReply(c, value) => self.on_read(c, value),
            Event::WriteArrives(c, grant, value) => self.resource_write(c, grant, value),
            Event::VerifyArrives(c, grant, value) => {
                let current = grant.token.is_some_and(|token| self.authority.is_current(token));
                self.send(Event::VerifyReply(c, grant, value, current));
            }
            Event::VerifyReply(c, grant, value, current) => {
                self.resource.verifying = false;
                self.decide_write(c, grant, value, Some(current));
                // Replay what arrived meanwhile, in order, until one of them verifies again.
                while !self.resource.verifying {
                    let Some(held) = self.resource.held.pop_front() else { break };
                    self.handle(held);
                }
            }
            Event::WriteReply(c, ok) => self.on_write_reply(c, ok),
            Event::PauseEnd(c) => self.write(c),
            Event::Tick => self.tick(),
            Event::PartitionStart => self.partition(),
            Event::PartitionEnd(c) => {
                self.clients[c].partitioned = false;
                self.note(format!("client{c} reconnects to the lock service"));
            }
            Event::ResourceRestart => self.restart_resource(),
            Event::Failover => {
                self.authority.failover(self.now_us);
                self.note("the lock service's leader fails over".into());
                let next = self.rng.exp_us(15_000_000.0);
                self.schedule(next, Event::Failover);
            }
            Event::ClockStep => self.clock_step(),
        }
    }

    fn start_cycle(&mut self, c: usize) {
        let client = &mut self.clients[c];
        client.phase = Phase::Acquiring;
        client.grant = None;
        client.attempt += 1;
        self.ask(c);
    }

    fn ask(&mut self, c: usize) {
        let now = self.now_us;
        self.clients[c].asked_at_us = self.clients[c].clock_us(now);
        let attempt = self.clients[c].attempt;
        self.send_to_authority(c, Event::AcquireArrives(c));
        self.schedule(ACQUIRE_TIMEOUT_US, Event::AcquireRetry(c, attempt));
    }

    /// Records a grant in the ground truth and sends it to its client.
    fn deliver(&mut self, granted: Granted) {
        let c = granted.client;
        let id = if granted.fresh {
            self.grants_made += 1;
            self.stats.grants += 1;
            self.newest_grant = self.grants_made;
            if let Some(token) = granted.token {
                if self.last_token.is_some_and(|last| token <= last) {
                    self.stats.token_regressions += 1;
                    self.note(format!(
                        "TOKEN REGRESSION: grant {} got token {token} after {}",
                        self.grants_made,
                        self.last_token.unwrap_or(0)
                    ));
                }
                self.last_token = Some(token);
            }
            self.note(format!(
                "lock service grants the lock to client{c}{}",
                token_text(granted.token)
            ));
            self.granted_id[c] = self.grants_made;
            self.grants_made
        } else {
            self.granted_id[c]
        };
        let grant = Grant { id, token: granted.token };
        self.send_to_authority(c, Event::GrantArrives(c, grant, granted.lease_ms));
    }

    fn authority_acquire(&mut self, c: usize) {
        match self.authority.acquire(self.now_us, c) {
            AcquireReply::Granted(granted) => self.deliver(granted),
            AcquireReply::Queued => {}
            AcquireReply::Busy => self.send_to_authority(c, Event::Busy(c)),
        }
    }

    fn on_grant(&mut self, c: usize, grant: Grant, lease_ms: u64) {
        if self.clients[c].phase != Phase::Acquiring {
            // A grant the client no longer wants (it retried and moved on): give it back.
            self.send_to_authority(c, Event::ReleaseArrives(c));
            return;
        }
        let client = &mut self.clients[c];
        client.grant = Some(grant);
        client.deadline_us =
            client.asked_at_us + (lease_ms.saturating_sub(self.config.client_margin_ms)) * 1_000;
        if self.strategy.fence_on_acquire() {
            client.phase = Phase::Registering;
            self.send(Event::RegisterArrives(c, grant));
        } else {
            client.phase = Phase::Reading;
            self.send(Event::ReadArrives(c, grant));
        }
    }

    fn on_registered(&mut self, c: usize, ok: bool) {
        if !ok {
            self.give_up(c);
            return;
        }
        let grant = self.clients[c].grant.expect("a registering client holds a grant");
        self.clients[c].phase = Phase::Reading;
        self.send(Event::ReadArrives(c, grant));
    }

    fn on_read(&mut self, c: usize, value: Option<u64>) {
        let Some(value) = value else {
            self.note(format!(
                "client{c} is told its grant is stale before it writes; it gives up"
            ));
            self.give_up(c);
            return;
        };
        // The last check: is my lease still valid by my own clock?
        let now = self.now_us;
        let client = &self.clients[c];
        if client.clock_us(now) >= client.deadline_us {
            self.note(format!("client{c} sees its lease ran out and does not write"));
            self.give_up(c);
            return;
        }
        self.clients[c].phase = Phase::Writing;
        self.clients[c].value_to_write = value + 1;
        if self.rng.chance(self.config.pause_rate) {
            let pause = self.rng.exp_us(self.config.mean_pause_ms * 1_000.0);
            self.clients[c].paused_until_us = self.now_us + pause;
            #[allow(clippy::cast_precision_loss)]
            let seconds = pause as f64 / 1e6;
            self.note(format!(
                "client{c} checked its lease, then pauses for {seconds:.3}s (GC) before writing"
            ));
            self.schedule(pause, Event::PauseEnd(c));
        } else {
            self.write(c);
        }
    }

    fn write(&mut self, c: usize) {
        if self.clients[c].phase != Phase::Writing {
            return;
        }
        let grant = self.clients[c].grant.expect("a writing client holds a grant");
        let value = self.clients[c].value_to_write;
        self.send(Event::WriteArrives(c, grant, value));
    }

    fn on_write_reply(&mut self, c: usize, ok: bool) {
        if ok {
            self.clients[c].acked += 1;
        }
        self.give_up(c);
    }

    /// Ends the cycle: release (the authority ignores a release of a grant already gone), wait
    /// for the release to be confirmed (or give up on it after a timeout), then think before the
    /// next cycle. Waiting keeps a client's next acquire from overtaking its own release.
    fn give_up(&mut self, c: usize) {
        self.clients[c].phase = Phase::Releasing;
        self.clients[c].grant = None;
        let attempt = self.clients[c].attempt;
        self.send_to_authority(c, Event::ReleaseArrives(c));
        self.schedule(ACQUIRE_TIMEOUT_US, Event::ReleaseTimeout(c, attempt));
    }

    fn released(&mut self, c: usize, timed_out_attempt: Option<u64>) {
        let client = &self.clients[c];
        if client.phase != Phase::Releasing
            || timed_out_attempt.is_some_and(|attempt| attempt != client.attempt)
        {
            return;
        }
        self.clients[c].phase = Phase::Idle;
        let think = self.rng.range(1_000, 20_000);
        self.schedule(think, Event::Think(c));
    }

    fn presented(grant: Grant) -> Presented {
        Presented::new(LOCK, grant.token.unwrap_or(0))
    }

    fn resource_register(&mut self, c: usize, grant: Grant) {
        let ok = match rule::register(
            LOCK,
            self.resource.record.as_ref(),
            &self.policy,
            LOCK,
            grant.token.unwrap_or(0),
        ) {
            Ok(record) => {
                self.resource.record = Some(record);
                self.newest_at_resource = self.newest_at_resource.max(grant.id);
                self.note(format!(
                    "client{c} registers{} with the resource",
                    token_text(grant.token)
                ));
                true
            }
            Err(_) => false,
        };
        self.send(Event::RegisterReply(c, ok));
    }

    fn resource_read(&mut self, c: usize, grant: Grant) {
        // Picket clients send their stamp with reads too, and hear at once when it is stale.
        let stale = self.strategy.is_picket()
            && rule::check_read(
                LOCK,
                self.resource.record.as_ref(),
                &self.policy,
                LOCK,
                grant.token.unwrap_or(0),
            )
            .is_err();
        let value = (!stale).then_some(self.resource.value);
        self.send(Event::ReadReply(c, value));
    }

    fn resource_write(&mut self, c: usize, grant: Grant, value: u64) {
        let highest = self.resource.record.as_ref().map_or(0, |record| record.highest_token);
        let advancing = grant.token.is_some_and(|token| token > highest);
        if self.strategy == crate::config::Strategy::PicketVerify
            && advancing
            && !self.config.mutations.fence_admits_everything
        {
            // Verify on advance: ask the lock service before a newer token may land, and hold the
            // resource until the answer is in.
            self.resource.verifying = true;
            self.send(Event::VerifyArrives(c, grant, value));
            return;
        }
        self.decide_write(c, grant, value, None);
    }

    fn decide_write(&mut self, c: usize, grant: Grant, value: u64, verified: Option<bool>) {
        let admitted =
            if !self.strategy.resource_checks() || self.config.mutations.fence_admits_everything {
                true
            } else if verified == Some(false) {
                false
            } else {
                match rule::admit(
                    LOCK,
                    self.resource.record.as_ref(),
                    &self.policy,
                    &Self::presented(grant),
                ) {
                    Ok((_, record)) => {
                        self.resource.record = Some(record);
                        true
                    }
                    Err(_) => false,
                }
            };
        let behind = grant.id < self.newest_at_resource;
        let highest = self.resource.record.as_ref().map_or(0, |record| record.highest_token);
        if admitted {
            self.stats.writes_admitted += 1;
            if behind {
                self.stats.stale_admitted += 1;
            }
            if grant.id < self.newest_grant {
                self.stats.superseded_admitted += 1;
            }
            self.newest_at_resource = self.newest_at_resource.max(grant.id);
            self.resource.value = value;
            let label = if behind {
                "  <- STALE WRITE ADMITTED"
            } else if grant.id < self.newest_grant {
                "  <- superseded grant, admitted"
            } else {
                ""
            };
            self.note(format!(
                "resource ACCEPTS client{c}'s write{} (counter = {value}){label}",
                token_text(grant.token)
            ));
        } else {
            if behind {
                self.stats.stale_refused += 1;
            } else if grant.id >= self.newest_grant {
                self.stats.newest_grant_refused += 1;
            } else {
                self.stats.stale_refused += 1;
            }
            let why = if verified == Some(false) {
                "the lock service says it is not the current grant".to_owned()
            } else {
                format!("highest seen is {highest}")
            };
            self.note(format!(
                "resource REFUSES client{c}'s write{}: {why}",
                token_text(grant.token)
            ));
        }
        self.send(Event::WriteReply(c, admitted));
    }

    fn tick(&mut self) {
        let heard: Vec<bool> = (0..self.clients.len())
            .map(|c| !self.is_paused(c) && !self.clients[c].partitioned)
            .collect();
        let grants = self.authority.tick(self.now_us, &heard);
        for granted in grants {
            self.deliver(granted);
        }
        self.maybe_recreate();
        self.schedule(TICK_US, Event::Tick);
    }

    fn maybe_recreate(&mut self) {
        if self.config.scenario == Scenario::Recreate && self.rng.chance(0.3) {
            self.authority.recreate_if_idle();
        }
    }

    fn partition(&mut self) {
        let c = usize::try_from(self.rng.range(0, self.clients.len() as u64)).unwrap_or(0);
        if !self.clients[c].partitioned {
            self.clients[c].partitioned = true;
            let length = self.rng.exp_us(3_000_000.0);
            #[allow(clippy::cast_precision_loss)]
            let seconds = length as f64 / 1e6;
            self.note(format!("client{c} is cut off from the lock service for {seconds:.3}s"));
            self.schedule(length, Event::PartitionEnd(c));
        }
        let next = self.rng.exp_us(8_000_000.0);
        self.schedule(next, Event::PartitionStart);
    }

    fn restart_resource(&mut self) {
        if !self.resource.durable {
            self.resource.record = None;
        }
        self.note(format!(
            "the resource restarts ({})",
            if self.resource.durable { "highest token on disk" } else { "highest token forgotten" }
        ));
        let next = self.rng.exp_us(10_000_000.0);
        self.schedule(next, Event::ResourceRestart);
    }

    fn clock_step(&mut self) {
        let c = usize::try_from(self.rng.range(0, self.clients.len() as u64)).unwrap_or(0);
        let step = i64::try_from(self.rng.exp_us(1_000_000.0)).unwrap_or(0);
        let step = if self.rng.chance(0.5) { step } else { -step };
        self.clients[c].clock_offset_us += step;
        let node_step = i64::try_from(self.rng.exp_us(1_500_000.0) / 1_000).unwrap_or(0);
        let node = self.rng.next_u64();
        self.authority.step_node_clock(node, node_step);
        self.note(format!(
            "client{c}'s clock steps by {step} µs; a lock node's wall clock jumps {node_step} ms"
        ));
        let next = self.rng.exp_us(5_000_000.0);
        self.schedule(next, Event::ClockStep);
    }
}

fn token_text(token: Option<u64>) -> String {
    token.map_or_else(String::new, |token| format!(" (token {token})"))
}

/// Runs one seed of one strategy.
#[must_use]
pub fn run(
    config: &SimConfig,
    strategy: Strategy,
    seed: u64,
    trace: bool,
) -> (RunStats, Vec<String>) {
    World::new(config, strategy, seed, trace).run()
}
