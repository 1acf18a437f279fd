//! A node's Prometheus metrics, served at `GET /metrics` in the OpenMetrics text format.
//!
//! Three kinds of figures:
//! - what this node *applied*: sessions opened and ended, grants, releases, cancelled waits,
//!   lock-delays and refusals. Every replica applies every committed command, so each node
//!   counts the whole cluster's lock traffic; read them from one node, do not sum over nodes.
//! - what this node did as a server: how long waiting acquires waited, keepalives per tick,
//!   WAL syncs (latency and bytes), snapshots, leader changes it saw, refusals before the log.
//! - gauges read from the state and from Raft when scraped: live sessions, held locks,
//!   waiters, the longest queues, role, term, commit and applied index.
//!
//! Lock-level counters carry a `prefix` label of bounded cardinality: the longest configured
//! prefix (`--metrics-prefix`) a name starts with, or without any configured, the name's first
//! path segment; at most [`MAX_PREFIX_LABELS`] distinct values, the rest count as `other`.

use crate::wal::WriterStats;
use picket_core::{Applied, Event, QueueSummary, ReleaseCause};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::sync::atomic::AtomicU64;
use std::time::{Duration, Instant};

/// Most distinct `prefix` label values; names beyond them count as `other`.
pub const MAX_PREFIX_LABELS: usize = 64;
/// Most configured prefixes.
pub const MAX_CONFIGURED_PREFIXES: usize = 256;
/// How many of the longest queues `picket_lock_queue_depth` shows.
pub const QUEUE_DEPTH_TOP: usize = 10;
/// How long a summary of the queues serves scrapes before the locks are walked again: the walk
/// reads every lock under the state's read lock, which holds up applying, so however many
/// scrapers and dashboards ask, it runs at most this often.
pub const QUEUE_SUMMARY_MAX_AGE: Duration = Duration::from_secs(5);
/// Most released locks remembered while their waiters wait for the next grant (handoff
/// latency); past it, handoffs go unmeasured until some complete.
const MAX_HANDOFFS_TRACKED: usize = 10_000;
/// The `prefix` label of names outside every configured prefix, or beyond the label bound.
const OTHER: &str = "other";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PrefixLabels {
    prefix: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PrefixCauseLabels {
    prefix: String,
    cause: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CauseLabels {
    cause: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RefusalLabels {
    code: String,
    /// `before_log` (refused by the node that received it) or `applied` (refused by the state
    /// machine, on every replica).
    stage: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LockLabels {
    lock: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RoleLabels {
    role: String,
}

/// What a scrape reads from the node at that moment.
#[derive(Clone, Debug, Default)]
pub struct Scrape {
    /// Live sessions.
    pub sessions: usize,
    /// Held locks, waiters, lock-delays and the longest queues.
    pub queues: QueueSummary,
    /// This node's Raft role: leader, follower, candidate, learner or shutdown.
    pub role: &'static str,
    /// The current term.
    pub term: u64,
    /// The last log index known committed.
    pub commit_index: u64,
    /// The last log index applied.
    pub applied_index: u64,
    /// The last log index in this node's log.
    pub last_log_index: u64,
    /// Members of the cluster, voters and learners.
    pub members: usize,
    /// Gaps this node's clock or process lost since it started.
    pub clock_gaps: u64,
    /// The factor this leader's clock runs at, set from its peers' clocks (1 when not leading).
    pub clock_rate_factor: f64,
    /// Whether this node leads and writes entries under older apply rules than it knows.
    pub apply_rules_held_back: bool,
    /// Watch streams open on this node (`--max-watch-streams`).
    pub watch_streams: usize,
    /// Sessions this node's watches follow in all (`--max-watched-sessions`).
    pub watched_sessions: usize,
}

/// Which `prefix` label a lock name counts under.
#[derive(Debug)]
struct Prefixes {
    /// Longest first, so the most specific prefix wins.
    configured: Vec<String>,
    seen: Mutex<BTreeSet<String>>,
}

impl Prefixes {
    fn label(&self, name: &str) -> String {
        if !self.configured.is_empty() {
            let matched = self.configured.iter().find(|prefix| name.starts_with(prefix.as_str()));
            return matched.map_or(OTHER, String::as_str).to_owned();
        }
        let segment = name.split('/').next().unwrap_or(name);
        let mut seen = self.seen.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if seen.contains(segment) {
            return segment.to_owned();
        }
        if seen.len() < MAX_PREFIX_LABELS {
            seen.insert(segment.to_owned());
            return segment.to_owned();
        }
        OTHER.to_owned()
    }
}

/// The metrics of one node. Counting never blocks on a scrape for longer than one label
/// lookup, and never fails.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    prefixes: Prefixes,
    sessions_opened: Counter,
    sessions_ended: Family<CauseLabels, Counter>,
    grants: Family<PrefixLabels, Counter>,
    releases: Family<PrefixCauseLabels, Counter>,
    waits_cancelled: Family<PrefixCauseLabels, Counter>,
    lock_delays: Family<PrefixLabels, Counter>,
    refusals: Family<RefusalLabels, Counter>,
    acquire_wait_seconds: Histogram,
    handoff_seconds: Histogram,
    /// Locks released while others waited, and when: the next grant of each is a handoff.
    released_at: Mutex<BTreeMap<String, Instant>>,
    keepalives_per_tick: Histogram,
    /// The last summary of the queues and when it was made ([`QUEUE_SUMMARY_MAX_AGE`]).
    queues: Mutex<Option<(Instant, QueueSummary)>>,
    snapshot_bytes: Gauge,
    snapshot_build_seconds: Histogram,
    leader_changes: Counter,
    limits_refused: Counter,
    wire_direct_calls: Counter,
    sessions: Gauge,
    locks_held: Gauge,
    lock_waiters: Gauge,
    locks_delayed: Gauge,
    queue_depth: Family<LockLabels, Gauge>,
    raft_role: Family<RoleLabels, Gauge>,
    raft_term: Gauge,
    raft_commit_index: Gauge,
    raft_applied_index: Gauge,
    raft_last_log_index: Gauge,
    cluster_members: Gauge,
    clock_gaps: Gauge,
    clock_rate_factor: Gauge<f64, AtomicU64>,
    apply_rules_held_back: Gauge,
    watch_streams: Gauge,
    watched_sessions: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new(Vec::new(), &WriterStats::default())
    }
}

/// Latencies from 100 µs to about 6.5 s.
fn latency_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.000_1, 2.0, 17))
}

impl Metrics {
    /// Metrics with `prefixes` as the `prefix` labels (empty: first path segments), exporting
    /// the log's counters in `wal`.
    ///
    /// # Panics
    /// When more than [`MAX_CONFIGURED_PREFIXES`] prefixes are given; validate them first.
    #[must_use]
    pub fn new(mut prefixes: Vec<String>, wal: &WriterStats) -> Self {
        assert!(prefixes.len() <= MAX_CONFIGURED_PREFIXES, "configured prefixes are bounded");
        prefixes.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
        let mut metrics = Self {
            registry: Registry::with_prefix("picket"),
            prefixes: Prefixes { configured: prefixes, seen: Mutex::default() },
            sessions_opened: Counter::default(),
            sessions_ended: Family::default(),
            grants: Family::default(),
            releases: Family::default(),
            waits_cancelled: Family::default(),
            lock_delays: Family::default(),
            refusals: Family::default(),
            acquire_wait_seconds: latency_histogram(),
            handoff_seconds: latency_histogram(),
            released_at: Mutex::default(),
            keepalives_per_tick: Histogram::new(exponential_buckets(1.0, 4.0, 10)),
            queues: Mutex::default(),
            snapshot_bytes: Gauge::default(),
            snapshot_build_seconds: latency_histogram(),
            leader_changes: Counter::default(),
            limits_refused: Counter::default(),
            wire_direct_calls: Counter::default(),
            sessions: Gauge::default(),
            locks_held: Gauge::default(),
            lock_waiters: Gauge::default(),
            locks_delayed: Gauge::default(),
            queue_depth: Family::default(),
            raft_role: Family::default(),
            raft_term: Gauge::default(),
            raft_commit_index: Gauge::default(),
            raft_applied_index: Gauge::default(),
            raft_last_log_index: Gauge::default(),
            cluster_members: Gauge::default(),
            clock_gaps: Gauge::default(),
            clock_rate_factor: Gauge::default(),
            apply_rules_held_back: Gauge::default(),
            watch_streams: Gauge::default(),
            watched_sessions: Gauge::default(),
        };
        metrics.register(wal);
        metrics
    }

    fn register(&mut self, wal: &WriterStats) {
        let registry = &mut self.registry;
        registry.register(
            "sessions_opened",
            "Sessions opened (applied on this node)",
            self.sessions_opened.clone(),
        );
        registry.register(
            "sessions_ended",
            "Sessions ended, by cause: closed, expired or revoked",
            self.sessions_ended.clone(),
        );
        registry.register("grants", "Locks granted, by name prefix", self.grants.clone());
        registry.register(
            "releases",
            "Grants ended, by name prefix and cause: released, session_closed, session_expired, session_revoked or abandoned",
            self.releases.clone(),
        );
        registry.register(
            "waits_cancelled",
            "Waiters that left a queue without a grant, by name prefix and cause",
            self.waits_cancelled.clone(),
        );
        registry.register(
            "lock_delays",
            "Lock-delays begun (a grant ended by its session's expiry or revocation), by name prefix",
            self.lock_delays.clone(),
        );
        registry.register(
            "refusals",
            "Commands refused, by code and stage: before_log (by the node that received them) or applied (by the state machine, on every replica)",
            self.refusals.clone(),
        );
        registry.register_with_unit(
            "acquire_wait",
            "Time from a waiting acquire's arrival at this node to its grant",
            Unit::Seconds,
            self.acquire_wait_seconds.clone(),
        );
        registry.register_with_unit(
            "handoff",
            "Time from applying the end of a grant that others waited for to applying the next grant of that lock (0 when one entry does both; lock-delays show here)",
            Unit::Seconds,
            self.handoff_seconds.clone(),
        );
        registry.register(
            "keepalives_per_tick",
            "Keepalives renewed by each tick this node proposed as leader",
            self.keepalives_per_tick.clone(),
        );
        registry.register_with_unit(
            "snapshot_size",
            "Size of the last snapshot this node built",
            Unit::Bytes,
            self.snapshot_bytes.clone(),
        );
        registry.register_with_unit(
            "snapshot_build",
            "Time to build and persist a snapshot",
            Unit::Seconds,
            self.snapshot_build_seconds.clone(),
        );
        registry.register(
            "leader_changes",
            "Changes of the leader this node saw",
            self.leader_changes.clone(),
        );
        registry.register(
            "limits_refused",
            "Times the state refused the limits this node's flags set, as leader",
            self.limits_refused.clone(),
        );
        registry.register(
            "wire_direct_calls",
            "Wire protocol calls served straight from their frames, past the router",
            self.wire_direct_calls.clone(),
        );
        registry.register("wal_syncs", "Batches written and synced to the WAL", wal.syncs.clone());
        registry.register("wal_entries", "Raft entries appended to the WAL", wal.entries.clone());
        registry.register_with_unit(
            "wal_written",
            "Bytes written to WAL segments",
            Unit::Bytes,
            wal.bytes.clone(),
        );
        registry.register_with_unit(
            "wal_sync",
            "Time to write and fdatasync one batch to the WAL",
            Unit::Seconds,
            wal.sync_seconds.clone(),
        );
        self.register_gauges();
    }

    fn register_gauges(&mut self) {
        let registry = &mut self.registry;
        registry.register("sessions", "Live sessions", self.sessions.clone());
        registry.register("locks_held", "Locks held", self.locks_held.clone());
        registry.register(
            "lock_waiters",
            "Sessions waiting in lock queues",
            self.lock_waiters.clone(),
        );
        registry.register("locks_delayed", "Locks in a lock-delay", self.locks_delayed.clone());
        registry.register(
            "lock_queue_depth",
            "Waiters of the longest queues (at most 10 locks)",
            self.queue_depth.clone(),
        );
        registry.register(
            "raft_role",
            "1 for this node's current Raft role",
            self.raft_role.clone(),
        );
        registry.register("raft_term", "The current Raft term", self.raft_term.clone());
        registry.register(
            "raft_commit_index",
            "The last log index known committed",
            self.raft_commit_index.clone(),
        );
        registry.register(
            "raft_applied_index",
            "The last log index applied",
            self.raft_applied_index.clone(),
        );
        registry.register(
            "raft_last_log_index",
            "The last log index in this node's log",
            self.raft_last_log_index.clone(),
        );
        registry.register(
            "cluster_members",
            "Members of the cluster, voters and learners",
            self.cluster_members.clone(),
        );
        registry.register(
            "watch_streams",
            "Watch streams open on this node (bounded by --max-watch-streams)",
            self.watch_streams.clone(),
        );
        registry.register(
            "watched_sessions",
            "Sessions this node's watches follow in all (bounded by --max-watched-sessions)",
            self.watched_sessions.clone(),
        );
        registry.register(
            "clock_gaps",
            "Gaps this node's clock or process lost since it started (stalls, jumps)",
            self.clock_gaps.clone(),
        );
        registry.register(
            "clock_rate_factor",
            "The rate this leader's lock time runs at against its own clock, set from its peers' clocks (1: its own rate)",
            self.clock_rate_factor.clone(),
        );
        registry.register(
            "apply_rules_held_back",
            "1 while this leader writes entries under older apply rules than it knows (a member has not answered, or runs an older build)",
            self.apply_rules_held_back.clone(),
        );
    }

    /// Counts what applying one command did. Called with the state after the command, before
    /// anyone else sees it.
    pub fn applied(&self, applied: &Applied, state: &picket_core::StateMachine) {
        match &applied.result {
            Ok(picket_core::Response::SessionOpened { .. }) => {
                self.sessions_opened.inc();
            }
            Ok(_) => {}
            Err(refusal) => self.refused(refusal.code(), "applied"),
        }
        for event in &applied.events {
            self.event(event, state);
        }
    }

    fn event(&self, event: &Event, state: &picket_core::StateMachine) {
        match event {
            Event::Granted { name, .. } => {
                self.grants.get_or_create(&self.prefix(name)).inc();
                let released = self.released_at().remove(name);
                if let Some(released_at) = released {
                    self.handoff_seconds.observe(released_at.elapsed().as_secs_f64());
                }
            }
            Event::Released { name, cause, .. } => {
                let prefix = self.prefixes.label(name);
                let labels = PrefixCauseLabels { prefix, cause: cause.as_str().to_owned() };
                self.releases.get_or_create(&labels).inc();
                let lock = state.occupancy(name).unwrap_or_default();
                let ended_by_loss =
                    matches!(cause, ReleaseCause::SessionExpired | ReleaseCause::SessionRevoked);
                if ended_by_loss && lock.delayed {
                    self.lock_delays.get_or_create(&PrefixLabels { prefix: labels.prefix }).inc();
                }
                if lock.waiters > 0 || lock.held {
                    let mut released_at = self.released_at();
                    if released_at.len() < MAX_HANDOFFS_TRACKED {
                        released_at.insert(name.clone(), Instant::now());
                    }
                }
            }
            Event::Cancelled { name, cause, .. } => {
                let prefix = self.prefixes.label(name);
                let labels = PrefixCauseLabels { prefix, cause: cause.as_str().to_owned() };
                self.waits_cancelled.get_or_create(&labels).inc();
                if state.occupancy(name).is_none_or(|lock| lock.waiters == 0) {
                    self.released_at().remove(name);
                }
            }
            Event::SessionEnded { cause, .. } => {
                let labels = CauseLabels { cause: cause.as_str().to_owned() };
                self.sessions_ended.get_or_create(&labels).inc();
            }
            // Queueing shows in the queue gauges.
            _ => {}
        }
    }

    fn prefix(&self, name: &str) -> PrefixLabels {
        PrefixLabels { prefix: self.prefixes.label(name) }
    }

    fn released_at(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Instant>> {
        self.released_at.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The summary of the queues: `summarize()`'s, made now if the last one is older than
    /// [`QUEUE_SUMMARY_MAX_AGE`], else the last one.
    pub fn queue_summary(&self, summarize: impl FnOnce() -> QueueSummary) -> QueueSummary {
        let mut last = self.queues.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        match &*last {
            Some((made_at, summary)) if made_at.elapsed() < QUEUE_SUMMARY_MAX_AGE => {
                summary.clone()
            }
            _ => {
                let summary = summarize();
                *last = Some((Instant::now(), summary.clone()));
                summary
            }
        }
    }

    /// Counts a refused command by its stable code.
    pub fn refused(&self, code: picket_core::ErrorCode, stage: &str) {
        let labels = RefusalLabels { code: code.as_str().to_owned(), stage: stage.to_owned() };
        self.refusals.get_or_create(&labels).inc();
    }

    /// Records how long a waiting acquire waited for its grant.
    pub fn acquire_waited(&self, waited: Duration) {
        self.acquire_wait_seconds.observe(waited.as_secs_f64());
    }

    /// Records how many keepalives one tick renewed.
    pub fn tick_renewed(&self, keepalives: usize) {
        // A tick carries at most `MAX_RENEWALS_PER_TICK_CAP` (10^6) keepalives, exact in an f64.
        #[allow(clippy::cast_precision_loss)]
        self.keepalives_per_tick.observe(keepalives as f64);
    }

    /// Records a snapshot built and persisted.
    pub fn snapshot_built(&self, bytes: usize, took: Duration) {
        self.snapshot_bytes.set(i64::try_from(bytes).unwrap_or(i64::MAX));
        self.snapshot_build_seconds.observe(took.as_secs_f64());
    }

    /// Counts a change of leader.
    pub fn leader_changed(&self) {
        self.leader_changes.inc();
    }

    /// Counts a refusal of this node's limits by the state.
    pub fn limits_refused(&self) {
        self.limits_refused.inc();
    }

    /// Counts a wire protocol call served straight from its frame.
    pub fn note_direct_wire_call(&self) {
        self.wire_direct_calls.inc();
    }

    /// The text exposition of every metric, with the gauges set from `scrape`.
    #[must_use]
    pub fn render(&self, scrape: &Scrape) -> String {
        let gauge = |value: u64| i64::try_from(value).unwrap_or(i64::MAX);
        self.sessions.set(gauge(scrape.sessions as u64));
        self.locks_held.set(gauge(scrape.queues.held as u64));
        self.lock_waiters.set(gauge(scrape.queues.waiters as u64));
        self.locks_delayed.set(gauge(scrape.queues.delayed as u64));
        self.queue_depth.clear();
        for (lock, depth) in &scrape.queues.longest {
            self.queue_depth
                .get_or_create(&LockLabels { lock: lock.clone() })
                .set(gauge(*depth as u64));
        }
        self.raft_role.clear();
        self.raft_role.get_or_create(&RoleLabels { role: scrape.role.to_owned() }).set(1);
        self.raft_term.set(gauge(scrape.term));
        self.raft_commit_index.set(gauge(scrape.commit_index));
        self.raft_applied_index.set(gauge(scrape.applied_index));
        self.raft_last_log_index.set(gauge(scrape.last_log_index));
        self.cluster_members.set(gauge(scrape.members as u64));
        self.clock_gaps.set(gauge(scrape.clock_gaps));
        self.watch_streams.set(gauge(scrape.watch_streams as u64));
        self.watched_sessions.set(gauge(scrape.watched_sessions as u64));
        self.clock_rate_factor.set(scrape.clock_rate_factor);
        self.apply_rules_held_back.set(i64::from(scrape.apply_rules_held_back));
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry)
            .expect("writing to a String does not fail");
        text
    }
}

#[cfg(test)]
mod tests;
