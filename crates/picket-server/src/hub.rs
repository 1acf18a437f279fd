//! Fan-out of applied events: to acquires waiting in this node, and to watch streams.
//!
//! Every node applies every committed command, so every node can answer its own waiting
//! acquires and watches, whichever node the command was proposed on.
//!
//! Watchers are indexed by what they watch (a session, a lock, a prefix), so an event costs
//! only the watchers it concerns: a cluster where every client watches its own session does not
//! wake every watch on every command. Delivery never blocks the apply path: a watcher whose
//! buffer is full is cut off and told it fell behind.

use crate::error::ServiceError;
use crate::limits::{Budget, ServerLimit, ServerLimits};
use picket_core::{Event, RequestId, SessionId, StateMachine, WaitEnd};
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use tokio::sync::{OwnedSemaphorePermit, mpsc, oneshot};

/// What a watch follows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Watched {
    /// One lock.
    Lock(String),
    /// Every lock whose name starts with this.
    Prefix(String),
    /// Everything that happens to one session.
    Session(SessionId),
    /// Everything that happens to any of these sessions, in one stream.
    Sessions(Vec<SessionId>),
    /// Only the losses of these sessions (see [`Event::is_loss`]), in one stream.
    SessionLosses(Vec<SessionId>),
}

impl Watched {
    /// The same watch with each of its sessions named once. A set that names a session twice
    /// registered the stream twice under it: the stream got each of that session's events
    /// twice, and one request of 10,000 copies of one id took 10,000 places in the fan-out.
    pub(crate) fn each_session_once(self) -> Self {
        self.map_set(|mut sessions| {
            sessions.sort_unstable();
            sessions.dedup();
            sessions
        })
    }

    /// The same watch without the sessions of its set that `machine` shows ended (an id at or
    /// below its revision that names no live session: ids are revisions, never reused), but
    /// one, so that the stream stays open. An ended session has no further event; a client
    /// that registers its closed sessions again (the Rust client does, on every reconnect and
    /// merge of its streams) would otherwise leave an entry for each in the hub. A session
    /// newer than `machine` (this node has not applied its opening yet) stays.
    pub(crate) fn without_ended(self, machine: &StateMachine) -> Self {
        self.map_set(|sessions| {
            let first = sessions.first().copied();
            let mut live: Vec<SessionId> =
                sessions.into_iter().filter(|session| !has_ended(machine, *session)).collect();
            if live.is_empty() {
                live.extend(first);
            }
            live
        })
    }

    /// How many places under `--max-watched-sessions` the watch holds: one per session it
    /// follows.
    fn sessions_followed(&self) -> usize {
        match self {
            Self::Session(_) => 1,
            Self::Sessions(sessions) | Self::SessionLosses(sessions) => sessions.len(),
            Self::Lock(_) | Self::Prefix(_) => 0,
        }
    }

    /// The same watch with `change` applied to its set of sessions, if it watches a set.
    fn map_set(self, change: impl FnOnce(Vec<SessionId>) -> Vec<SessionId>) -> Self {
        match self {
            Self::Sessions(sessions) => Self::Sessions(change(sessions)),
            Self::SessionLosses(sessions) => Self::SessionLosses(change(sessions)),
            other => other,
        }
    }
}

/// Whether `session` ended by `machine`'s state: its id (the revision that opened it) is not
/// past the state, and no live session has it.
fn has_ended(machine: &StateMachine, session: SessionId) -> bool {
    session.0 <= machine.revision() && machine.session_lease(session).is_none()
}

/// An item delivered to a watcher.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Delivery {
    /// Something happened, at `revision`.
    Event {
        /// The revision of the command that caused it.
        revision: u64,
        /// What happened.
        event: Event,
    },
    /// The state was replaced by a snapshot: events in between are unknown; re-read.
    Resync {
        /// The revision of the new state.
        revision: u64,
    },
}

/// The receiving end of a watch. When it ends, [`Subscription::fell_behind`] says whether it
/// was cut off for not keeping up. Dropping it gives its places under `--max-watched-sessions`
/// back at once; its entries are swept later, all closed ones at a time.
#[derive(Debug)]
pub struct Subscription {
    /// Deliveries, in order.
    pub receiver: mpsc::Receiver<Delivery>,
    stream: Arc<StreamState>,
    /// What it follows: each session of a set once.
    target: Watched,
    watchers: Weak<Mutex<Watchers>>,
}

impl Subscription {
    /// True when the hub cut the watch off because its buffer was full.
    #[must_use]
    pub fn fell_behind(&self) -> bool {
        self.stream.lagged.load(Ordering::Relaxed)
    }

    /// What the watch follows: each session of a set once.
    #[must_use]
    pub fn target(&self) -> &Watched {
        &self.target
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        // Closed first, so that a sweep run below takes this stream's entries too.
        self.receiver.close();
        // A watch of a lock or prefix has one entry and no place.
        let entries = self.stream.give_back_all().max(1);
        if let Some(watchers) = self.watchers.upgrade() {
            // Its keys are where the sweep looks for its entries.
            let target = std::mem::replace(&mut self.target, Watched::Sessions(Vec::new()));
            lock(&watchers).closed(entries, target);
        }
    }
}

/// Most deliveries a watch buffers before it is cut off.
pub const WATCH_BUFFER: usize = 1_024;

/// Fewest entries of closed streams that start a sweep. A sweep starts once at least half of
/// all entries are of closed streams, so that it costs a constant per closed entry however many
/// there are, amortized. It looks only under the keys closed streams were registered under,
/// and it is done in steps ([`SWEEP_STEP_ENTRIES`]), one with each later call into the fan-out
/// (a watch, a close, a publish of events), so that no call pauses applying for a pass over
/// every entry: one pass over a million entries was 0.25–0.29 s (BENCHMARKS.md, `sweep_pause`
/// in the tests). A step takes whole keys, so a key holding most entries (many watches of one
/// lock) is still looked at whole; a snapshot's resync still passes over every entry.
/// Dropping a stream's entries one key at a time, at once, instead cost every entry under each
/// of its keys on every close: 200 streams of the same 10,000 sessions made one stream's close
/// cost 2,000,000 steps (found in review); a sweep looks under each key once.
const MIN_SWEEP_ENTRIES: usize = 256;

/// Entries one step of a sweep looks at, at least (a step takes whole keys, and a close looks
/// at as many entries as it closed): about half a millisecond at 0.25 µs an entry.
const SWEEP_STEP_ENTRIES: usize = 2_048;

/// What every entry of one watch stream shares.
#[derive(Debug)]
struct StreamState {
    /// Set once the stream is cut off for a full buffer.
    lagged: AtomicBool,
    /// Its places under `--max-watched-sessions`, one for each of its entries under a session.
    /// An ended session's entry gives its place back, unless it is the stream's last; the
    /// rest come back together when the subscription is dropped (`None` from then on).
    places: Mutex<Option<OwnedSemaphorePermit>>,
}

impl StreamState {
    /// Gives back the place of one of the stream's entries under a session, unless it is the
    /// last (dropping that one would close the stream) or the stream has ended: true if it
    /// did, and the entry is to go.
    fn give_back_one(&self) -> bool {
        let mut places = lock(&self.places);
        match places.as_mut() {
            Some(held) if held.num_permits() > 1 => {
                drop(held.split(1));
                true
            }
            _ => false,
        }
    }

    /// Gives back every place the stream holds; returns how many (one per entry under a
    /// session it still has).
    fn give_back_all(&self) -> usize {
        lock(&self.places).take().map_or(0, |held| held.num_permits())
    }
}

#[derive(Debug)]
struct Watcher {
    sender: mpsc::Sender<Delivery>,
    stream: Arc<StreamState>,
    /// Offered only events that are losses (and every resync and end).
    losses_only: bool,
}

impl Watcher {
    /// Delivers without waiting; false when the watcher must be dropped (gone or too slow).
    fn offer(&self, delivery: &Delivery) -> bool {
        // Cut off under another of its sessions: this entry goes too.
        if self.stream.lagged.load(Ordering::Relaxed) {
            return false;
        }
        // Checked before the delivery is copied: most events skip a losses-only watcher.
        if self.losses_only
            && let Delivery::Event { event, .. } = delivery
            && !event.is_loss()
        {
            return !self.sender.is_closed();
        }
        match self.sender.try_send(delivery.clone()) {
            Ok(()) => true,
            Err(mpsc::error::TrySendError::Full(_)) => {
                self.stream.lagged.store(true, Ordering::Relaxed);
                false
            }
            Err(mpsc::error::TrySendError::Closed(_)) => false,
        }
    }

    /// Whether the entry is of a stream that ended or was cut off.
    fn is_gone(&self) -> bool {
        self.sender.is_closed() || self.stream.lagged.load(Ordering::Relaxed)
    }
}

#[derive(Debug, Default)]
struct Watchers {
    /// Entries held, of open and closed streams: every removal is subtracted, so that the
    /// sweep's rule bounds them (an upper bound that only grew between sweeps let entries of
    /// closed streams pile up, found in review).
    entries: usize,
    /// Entries of streams closed since the last sweep started.
    closed_entries: usize,
    /// The closed streams whose entries are to be swept, and the sweep under way.
    sweep: SweepQueue,
    /// The most entries one step of a sweep looked at, and all they looked at (tests only).
    #[cfg(test)]
    longest_step: usize,
    #[cfg(test)]
    looked_at_in_sweeps: usize,
    by_session: HashMap<SessionId, Keyed>,
    by_lock: HashMap<String, Keyed>,
    /// Prefix watches, by prefix. A lock event finds its prefixes' watchers by looking up the
    /// prefixes of its name, or by checking each watched prefix when there are fewer of those.
    by_prefix: HashMap<String, Keyed>,
}

/// Drops, from the watchers of one ended session, the entries of streams that still follow
/// another session (a stream's last entry keeps its channel, and so the stream, open), and
/// those of streams that ended.
/// Returns how many went.
fn forget_from_sets(watchers: &mut Vec<Watcher>) -> usize {
    retain(watchers, |watcher| !watcher.is_gone() && !watcher.stream.give_back_one())
}

/// Keeps the watchers `keep` says to; returns how many went, for [`Watchers::entries`].
fn retain(watchers: &mut Vec<Watcher>, keep: impl FnMut(&Watcher) -> bool) -> usize {
    let before = watchers.len();
    watchers.retain(keep);
    before - watchers.len()
}

/// Offers to the watchers under `key` and forgets the key when none is left; returns how many
/// watchers went.
fn offer_key<K: std::hash::Hash + Eq>(
    map: &mut HashMap<K, Keyed>,
    key: &K,
    delivery: &Delivery,
) -> usize {
    let Some(watchers) = map.get_mut(key) else { return 0 };
    let gone = retain(watchers, |watcher| watcher.offer(delivery));
    if watchers.is_empty() {
        map.remove(key);
    }
    gone
}

/// The watchers under one key of [`Watchers`]' maps.
#[derive(Debug, Default)]
struct Keyed {
    watchers: Vec<Watcher>,
    /// The last sweep that looked under this key (0: none), so that a sweep looks under a key
    /// once however many closed streams were registered under it.
    swept_by: u64,
}

impl std::ops::Deref for Keyed {
    type Target = Vec<Watcher>;

    fn deref(&self) -> &Vec<Watcher> {
        &self.watchers
    }
}

impl std::ops::DerefMut for Keyed {
    fn deref_mut(&mut self) -> &mut Vec<Watcher> {
        &mut self.watchers
    }
}

/// Where a closed stream's entries are: a key of one of [`Watchers`]' maps.
enum SweepKey<'a> {
    Session(SessionId),
    Lock(&'a String),
    Prefix(&'a String),
}

/// What a stream registered as `target` holds entries under: its `at`-th key, if it has one.
fn sweep_key_of(target: &Watched, at: usize) -> Option<SweepKey<'_>> {
    match target {
        Watched::Session(session) => (at == 0).then_some(SweepKey::Session(*session)),
        Watched::Sessions(sessions) | Watched::SessionLosses(sessions) => {
            sessions.get(at).map(|session| SweepKey::Session(*session))
        }
        Watched::Lock(name) => (at == 0).then_some(SweepKey::Lock(name)),
        Watched::Prefix(prefix) => (at == 0).then_some(SweepKey::Prefix(prefix)),
    }
}

/// The closed streams whose entries are yet to be swept, oldest first, and where the sweep
/// under way stands among them. Streams, not keys, are queued: a queue of a million keys
/// would itself pause applying each time it grew.
#[derive(Debug, Default)]
struct SweepQueue {
    closed: VecDeque<Watched>,
    /// Closed streams at the front that the sweep under way has yet to finish (none: no sweep
    /// is under way). A stream closed after a sweep started waits for the next, so that a key
    /// with many live entries is not looked under again for every stream closed under it.
    round_streams: usize,
    /// The keys of the front stream the sweep has taken.
    keys_taken: usize,
    /// The number of the sweep under way, or of the last (see [`Keyed::swept_by`]).
    round: u64,
}

impl SweepQueue {
    /// Starts a sweep of every stream queued now.
    fn start(&mut self) {
        self.round_streams = self.closed.len();
        self.round += 1;
    }

    fn running(&self) -> bool {
        self.round_streams > 0
    }
}

/// Drops the entries of ended streams under `key`, and the key once none is left, unless this
/// sweep (`round`) already looked under it: how many entries it looked at, and how many went.
fn sweep_key<K: std::hash::Hash + Eq>(
    map: &mut HashMap<K, Keyed>,
    key: &K,
    round: u64,
) -> (usize, usize) {
    let Some(keyed) = map.get_mut(key) else { return (0, 0) };
    if keyed.swept_by == round {
        return (0, 0);
    }
    keyed.swept_by = round;
    let looked_at = keyed.len();
    let gone = retain(keyed, |watcher| !watcher.is_gone());
    if keyed.is_empty() {
        map.remove(key);
    }
    (looked_at, gone)
}

impl Watchers {
    fn deliver(&mut self, revision: u64, event: &Event) {
        if self.by_session.is_empty() && self.by_lock.is_empty() && self.by_prefix.is_empty() {
            return;
        }
        let delivery = Delivery::Event { revision, event: event.clone() };
        let gone = offer_key(&mut self.by_session, &event.session(), &delivery);
        self.went(gone);
        if let Event::SessionEnded { session, .. } = event {
            self.forget_ended(*session);
        }
        if let Some(name) = event.lock_name() {
            let gone = offer_key(&mut self.by_lock, &name.to_owned(), &delivery);
            self.went(gone);
            if !self.by_prefix.is_empty() {
                self.deliver_to_prefixes(name, &delivery);
            }
        }
    }

    /// Offers `delivery` to the watchers of every prefix of `name`. With fewer watched prefixes
    /// than `name` has bytes it checks each prefix; otherwise it looks up each prefix of `name`
    /// (at character boundaries). Either way an event costs at most the smaller of the two, never
    /// a scan of many watchers' prefixes for every command.
    fn deliver_to_prefixes(&mut self, name: &str, delivery: &Delivery) {
        let matching: Vec<String> = if self.by_prefix.len() <= name.len() {
            self.by_prefix
                .keys()
                .filter(|prefix| name.starts_with(prefix.as_str()))
                .cloned()
                .collect()
        } else {
            (0..=name.len())
                .filter(|end| name.is_char_boundary(*end))
                .map(|end| &name[..end])
                .filter(|prefix| self.by_prefix.contains_key(*prefix))
                .map(str::to_owned)
                .collect()
        };
        for prefix in matching {
            let gone = offer_key(&mut self.by_prefix, &prefix, delivery);
            self.went(gone);
        }
    }

    /// Offers `delivery` to every stream once. A watch of a set is registered under each of
    /// its sessions, and was offered a resync as many times (found with the test of
    /// `forget_all_ended`); a stream is known by its shared state.
    fn deliver_everywhere(&mut self, delivery: &Delivery) {
        let mut offered: HashSet<*const StreamState> = HashSet::new();
        let mut gone = 0;
        for watchers in self
            .by_session
            .values_mut()
            .chain(self.by_lock.values_mut())
            .chain(self.by_prefix.values_mut())
        {
            gone += retain(watchers, |watcher| {
                if offered.insert(Arc::as_ptr(&watcher.stream)) {
                    watcher.offer(delivery)
                } else {
                    !watcher.is_gone()
                }
            });
        }
        self.went(gone);
    }

    /// Drops the entries of an ended session from the watches of sets that follow other
    /// sessions too. A client's long-lived stream keeps the sessions it closed (the Rust
    /// client's does), so without this the hub held an entry for every session such a stream
    /// ever followed, for as long as it lived.
    fn forget_ended(&mut self, session: SessionId) {
        let Some(watchers) = self.by_session.get_mut(&session) else { return };
        let gone = forget_from_sets(watchers);
        if watchers.is_empty() {
            self.by_session.remove(&session);
        }
        self.went(gone);
    }

    /// [`Watchers::forget_ended`] for every session `machine` shows ended: after a snapshot,
    /// whose gap no `SessionEnded` crossed.
    fn forget_all_ended(&mut self, machine: &StateMachine) {
        let mut gone = 0;
        for (session, watchers) in &mut self.by_session {
            if has_ended(machine, *session) {
                gone += forget_from_sets(watchers);
            }
        }
        self.forget_empty();
        self.went(gone);
    }

    /// Counts `entries` more of a closed stream registered as `target` (or as many as the keys
    /// it was registered under, if more: the sweep looks under each), and queues it for a
    /// sweep. The count may be high (some of those entries may have gone already), which only
    /// brings the sweep forward; each closed stream adds no more than it registered, so sweeps
    /// still cost a constant per registered entry. The close then takes a step of the sweep as
    /// long as that count, so a sweep keeps up with closes.
    fn closed(&mut self, entries: usize, target: Watched) {
        let counted = entries.max(target.sessions_followed());
        self.closed_entries += counted;
        self.sweep.closed.push_back(target);
        self.sweep_step(counted);
    }

    /// Starts a sweep of the closed streams queued now, if their entries are at least half of
    /// all (and at least [`MIN_SWEEP_ENTRIES`]): whether one is under way.
    fn sweep_if_due(&mut self) -> bool {
        if !self.sweep.running() && self.closed_entries >= MIN_SWEEP_ENTRIES.max(self.entries / 2) {
            self.sweep.start();
            self.closed_entries = 0;
        }
        self.sweep.running()
    }

    /// One step of a sweep (started here if one is due): drops the entries of streams that
    /// ended or were cut off under the keys of the streams it sweeps, whole keys at a time,
    /// until at least `budget` (and at least [`SWEEP_STEP_ENTRIES`]) entries were looked at or
    /// no sweep is due.
    fn sweep_step(&mut self, budget: usize) {
        let budget = budget.max(SWEEP_STEP_ENTRIES);
        let mut looked_at = 0;
        while looked_at < budget && self.sweep_if_due() {
            let front = self.sweep.closed.front().expect("a sweep's streams are queued");
            let Some(key) = sweep_key_of(front, self.sweep.keys_taken) else {
                self.sweep.closed.pop_front();
                self.sweep.round_streams -= 1;
                self.sweep.keys_taken = 0;
                continue;
            };
            self.sweep.keys_taken += 1;
            let round = self.sweep.round;
            let (looked, gone) = match key {
                SweepKey::Session(session) => sweep_key(&mut self.by_session, &session, round),
                SweepKey::Lock(name) => sweep_key(&mut self.by_lock, name, round),
                SweepKey::Prefix(prefix) => sweep_key(&mut self.by_prefix, prefix, round),
            };
            self.went(gone);
            // A key already looked under, or no longer held, still costs its look-up.
            looked_at += looked.max(1);
        }
        #[cfg(test)]
        {
            self.longest_step = self.longest_step.max(looked_at);
            self.looked_at_in_sweeps += looked_at;
        }
    }

    /// Counts `count` entries gone.
    fn went(&mut self, count: usize) {
        // Every entry removed was counted when registered (checked in the tests, which compare
        // the count with the entries held).
        debug_assert!(count <= self.entries, "{count} gone of {} counted", self.entries);
        self.entries = self.entries.saturating_sub(count);
    }

    fn forget_empty(&mut self) {
        self.by_session.retain(|_, watchers| !watchers.is_empty());
        self.by_lock.retain(|_, watchers| !watchers.is_empty());
        self.by_prefix.retain(|_, watchers| !watchers.is_empty());
    }
}

type WaiterKey = (SessionId, String);

/// One acquire request waiting on this node to hear how its session's wait for a lock ends.
#[derive(Debug)]
struct Registration {
    id: u64,
    request: RequestId,
    sender: oneshot::Sender<WaitEnd>,
    /// The revision at which this request's acquire was queued, once known. Only an outcome
    /// applied after it ends this request's wait: an earlier one ended an earlier wait of the
    /// same session for the same lock.
    queued_at: Option<u64>,
    /// Outcomes applied before the request knew where its acquire landed, kept until it does.
    early: Vec<(u64, WaitEnd)>,
}

/// Most outcomes a registration keeps before its acquire is applied. A session has one wait
/// per lock at a time, so only a handful of earlier waits can end in that gap.
const MAX_EARLY_OUTCOMES: usize = 8;

impl Registration {
    /// Offers the outcome applied at `revision`; gives the registration back unless it was
    /// delivered.
    fn offer(mut self, revision: u64, outcome: WaitEnd) -> Option<Self> {
        match self.queued_at {
            Some(queued_at) if revision > queued_at => {
                let _ = self.sender.send(outcome);
                None
            }
            Some(_) => Some(self),
            None => {
                if self.early.len() < MAX_EARLY_OUTCOMES {
                    self.early.push((revision, outcome));
                }
                Some(self)
            }
        }
    }
}

/// The waiting acquires of this node, by session and lock. A session waits for a lock under one
/// request in the state machine, but more than one request may be on its way here: a retry of
/// the same request, or another request about to be refused. Each hears the outcome of the wait
/// its own acquire joined.
#[derive(Debug, Default)]
struct Waiters {
    next_id: u64,
    by_key: HashMap<WaiterKey, Vec<Registration>>,
}

impl Waiters {
    /// Offers each registration under `key` the outcome `end_of` gives for its request, as
    /// applied at `revision`; `None` leaves it waiting.
    fn offer(
        &mut self,
        key: &WaiterKey,
        revision: u64,
        end_of: impl Fn(RequestId) -> Option<WaitEnd>,
    ) {
        let Some(registrations) = self.by_key.remove(key) else { return };
        let kept: Vec<Registration> = registrations
            .into_iter()
            .filter_map(|registration| match end_of(registration.request) {
                Some(end) => registration.offer(revision, end),
                None => Some(registration),
            })
            .collect();
        if !kept.is_empty() {
            self.by_key.insert(key.clone(), kept);
        }
    }
}

/// Where applied events go.
#[derive(Debug)]
pub struct Hub {
    waiters: Mutex<Waiters>,
    watchers: Arc<Mutex<Watchers>>,
    /// A place for each entry under a session ([`ServerLimits::max_watched_sessions`]).
    watched_sessions: Budget,
}

impl Default for Hub {
    fn default() -> Self {
        Self::new(ServerLimits::default().max_watched_sessions)
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A waiting acquire's registration with the hub: its outcome arrives on `outcome`.
#[derive(Debug)]
pub struct WaiterRegistration {
    /// Identifies the registration for [`Hub::forget_waiter`].
    pub id: u64,
    /// How the wait ended.
    pub outcome: oneshot::Receiver<WaitEnd>,
}

impl Hub {
    /// A hub whose watches follow at most `max_watched_sessions` sessions in all.
    #[must_use]
    pub fn new(max_watched_sessions: usize) -> Self {
        Self {
            waiters: Mutex::new(Waiters::default()),
            watchers: Arc::default(),
            watched_sessions: Budget::new(ServerLimit::WatchedSessions, max_watched_sessions),
        }
    }

    /// How many places under `--max-watched-sessions` this hub's watches hold.
    #[must_use]
    pub fn watched_sessions(&self) -> usize {
        self.watched_sessions.taken()
    }

    /// Registers `request`'s interest in how `session`'s wait for `name` ends. Register before
    /// proposing the acquire, so no outcome can be applied before somebody listens for it.
    pub fn register_waiter(
        &self,
        session: SessionId,
        name: &str,
        request: RequestId,
    ) -> WaiterRegistration {
        let (sender, outcome) = oneshot::channel();
        let mut waiters = lock(&self.waiters);
        waiters.next_id += 1;
        let id = waiters.next_id;
        let registration = Registration { id, request, sender, queued_at: None, early: Vec::new() };
        waiters.by_key.entry((session, name.to_owned())).or_default().push(registration);
        WaiterRegistration { id, outcome }
    }

    /// Tells registration `id` that its acquire was queued at `revision`: the first outcome
    /// applied after it is this request's. One that already arrived is delivered now.
    pub fn queued(&self, session: SessionId, name: &str, id: u64, revision: u64) {
        let mut waiters = lock(&self.waiters);
        let key = (session, name.to_owned());
        let Some(registrations) = waiters.by_key.get_mut(&key) else { return };
        let Some(position) = registrations.iter().position(|registration| registration.id == id)
        else {
            return;
        };
        let registration = &mut registrations[position];
        registration.queued_at = Some(revision);
        let early = std::mem::take(&mut registration.early);
        if let Some((_, outcome)) = early.into_iter().find(|(applied, _)| *applied > revision) {
            let registration = registrations.remove(position);
            let _ = registration.sender.send(outcome);
            if registrations.is_empty() {
                waiters.by_key.remove(&key);
            }
        }
    }

    /// Forgets registration `id` (its request has its answer, or its caller left). Returns
    /// whether another registration of the same request is still waiting here: a retry of the
    /// request that now speaks for it.
    pub fn forget_waiter(
        &self,
        session: SessionId,
        name: &str,
        request: RequestId,
        id: u64,
    ) -> bool {
        let mut waiters = lock(&self.waiters);
        let key = (session, name.to_owned());
        let Some(registrations) = waiters.by_key.get_mut(&key) else { return false };
        registrations.retain(|registration| registration.id != id);
        let retried = registrations.iter().any(|registration| registration.request == request);
        if registrations.is_empty() {
            waiters.by_key.remove(&key);
        }
        retried
    }

    /// Number of acquires registered as waiting on this node.
    #[must_use]
    pub fn waiting_acquires(&self) -> usize {
        lock(&self.waiters).by_key.values().map(Vec::len).sum()
    }

    /// Starts a watch of `target` from the next applied command on.
    ///
    /// # Errors
    /// [`ServiceError::Exhausted`] when the watches would follow more sessions than
    /// `--max-watched-sessions` allows.
    pub fn watch(&self, target: Watched) -> Result<Subscription, ServiceError> {
        let target = target.each_session_once();
        let followed = target.sessions_followed();
        // A set is bounded by `MAX_WATCHED_SESSIONS` where it enters; one beyond `u32` could
        // never fit the budget either.
        let count = u32::try_from(followed).unwrap_or(u32::MAX);
        let places = self.watched_sessions.take_many(count)?;
        let (sender, receiver) = mpsc::channel(WATCH_BUFFER);
        // A watch of a lock or prefix holds no place.
        let places = (followed > 0).then_some(places);
        let stream =
            Arc::new(StreamState { lagged: AtomicBool::new(false), places: places.into() });
        let losses_only = matches!(target, Watched::SessionLosses(_));
        let entry = || Watcher { sender: sender.clone(), stream: stream.clone(), losses_only };
        let mut watchers = lock(&self.watchers);
        watchers.sweep_step(followed);
        watchers.entries += match &target {
            Watched::Sessions(sessions) | Watched::SessionLosses(sessions) => sessions.len(),
            Watched::Session(_) | Watched::Lock(_) | Watched::Prefix(_) => 1,
        };
        match &target {
            Watched::Session(session) => {
                watchers.by_session.entry(*session).or_default().push(entry())
            }
            Watched::Lock(name) => watchers.by_lock.entry(name.clone()).or_default().push(entry()),
            Watched::Prefix(prefix) => {
                watchers.by_prefix.entry(prefix.clone()).or_default().push(entry());
            }
            Watched::Sessions(sessions) | Watched::SessionLosses(sessions) => {
                // One channel, registered under each session: the stream gets each event once,
                // since an event names one session.
                for session in sessions {
                    watchers.by_session.entry(*session).or_default().push(entry());
                }
            }
        }
        drop(watchers);
        Ok(Subscription { receiver, stream, target, watchers: Arc::downgrade(&self.watchers) })
    }

    /// Delivers the events of one applied command.
    pub fn publish(&self, revision: u64, events: &[Event]) {
        if !events.is_empty() {
            let mut waiters = lock(&self.waiters);
            for (session, name, end) in events.iter().filter_map(Event::wait_end) {
                waiters.offer(&(session, name.to_owned()), revision, |_| Some(end));
            }
            drop(waiters);
            let mut watchers = lock(&self.watchers);
            for event in events {
                watchers.deliver(revision, event);
            }
            watchers.sweep_step(events.len());
        }
    }

    /// The state jumped to `machine` (a snapshot was installed): settle every waiter from the new
    /// state and tell watchers to re-read.
    pub fn resync(&self, machine: &StateMachine) {
        let mut waiters = lock(&self.waiters);
        let keys: Vec<WaiterKey> = waiters.by_key.keys().cloned().collect();
        for key in keys {
            // Each request hears how its own wait stands: the core answers as it would answer
            // a retry of that request.
            waiters.offer(&key, machine.revision(), |request| {
                machine.wait_end(key.0, &key.1, request)
            });
        }
        drop(waiters);
        let revision = machine.revision();
        let mut watchers = lock(&self.watchers);
        watchers.deliver_everywhere(&Delivery::Resync { revision });
        watchers.forget_all_ended(machine);
    }
}

#[cfg(test)]
mod tests;
