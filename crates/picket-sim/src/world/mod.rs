//! One simulated run: clients doing read-modify-write cycles on a shared counter under a lock,
//! an authority, a resource, a network with random delays, and the scenario's faults.
//!
//! A client cycle: acquire; (fence on acquire: register the token); read the counter; check its
//! own deadline (the last check); possibly pause; write counter + 1 with its token; release.
//!
//! Ground truth is kept outside every participant: each grant gets an id in the order the
//! authority made them, so the run can tell which writes came from a superseded grant whatever
//! the strategy's tokens say.

mod cycle;
mod faults;
mod resource;

use crate::authority::{self, Authority, LOCK};
use crate::config::{Scenario, SimConfig, Strategy};
use crate::rng::Rng;
use picket_fence::rule::{FenceRecord, Policy};
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
