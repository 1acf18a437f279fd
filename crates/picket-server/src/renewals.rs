//! Keepalives the leader acknowledged and has not yet written: they ride in its next tick.
//!
//! The promise: a session whose keepalive the leader acknowledged at its clock reading `t` is
//! not expired by any tick before `t` + TTL. Two rules keep it.
//!
//! - A keepalive and the leader's taking of a batch each read the clock inside the same lock,
//!   so their readings are ordered. A keepalive noted before a batch is taken rides in that
//!   tick, which renews it from the tick's reading (at least `t`). A keepalive noted after was
//!   read at `t` >= the tick's reading, and the tick expires by its own reading only.
//! - A keepalive is acknowledged at once only if its session is alive at `t` by the applied
//!   state. Otherwise (its deadline passed and no tick has run since) it waits until a tick
//!   that carries it has been applied, and is then answered by whether its session still exists
//!   (the tick renews before it expires, so only a close or a revocation meanwhile ends it).
//! - A keepalive is also noted the moment it arrives, before the leader confirms its lease
//!   (which may wait for a heartbeat round): a tick taken meanwhile carries it, so a keepalive
//!   the node already received is never expired by the tick it was waiting behind. A node that
//!   does not lead notes nothing (it refuses the keepalive).
//! - A tick never carries only part of the pending keepalives: if more are pending than one tick
//!   may renew, the leader writes a `Refresh` instead, which renews every session.
//!
//! A keepalive that carries a reading of its client's clock is also checked against the
//! leader's clock ([`crate::client_clocks`]); where the client's runs slower, its session is
//! renewed for its TTL by the client's clock (the tick's `renew_for`), so "a TTL" above is
//! measured on the client's clock for it. The lease is computed when the batch is taken, with
//! the peer-rate factor in force then. Where one session is noted twice before its tick, the
//! longer of its two leases counts. A `Refresh` renews each session for the lease its last
//! renewal gave it (apply rules 6), not for this batch's, so the sessions it took that are owed
//! a longer lease and still live are noted again for the next tick.

use crate::client_clocks::{ClientClocks, ClientReading, ClockLease};
use crate::clock::{Clock, GapWatch};
use picket_core::{Command, SessionId, SessionLease};
use std::collections::BTreeMap;
use std::sync::Mutex;
use tokio::sync::{Notify, watch};

/// Most keepalives the leader holds before it writes a tick early.
pub const RENEWAL_FLUSH_THRESHOLD: usize = 50_000;
/// Longest a keepalive waits for its tick, by the leader's clock. A session is renewed from its
/// tick's reading, so this bounds how long past its client's promise (TTL after the keepalive)
/// a session can live: this plus the expiry grace, one second in all.
pub const MAX_RENEWAL_DELAY_MS: u64 = 500;

/// See the module documentation.
#[derive(Debug)]
pub struct Renewals {
    pending: Mutex<Pending>,
    /// Wakes the leader's driver: many keepalives are pending, or one waits for a tick.
    wake: Notify,
    /// The number of the last batch whose tick (or refresh) was applied.
    written: watch::Sender<u64>,
}

#[derive(Debug)]
struct Pending {
    /// Each session to renew, with what its lease by its client's clock needs (`None`: its
    /// TTL).
    sessions: BTreeMap<SessionId, Option<ClockLease>>,
    /// The clocks of the clients that sent keepalives.
    clocks: ClientClocks,
    /// The number the next batch taken will have; the first is 1, as 0 reads "none written".
    batch: u64,
    /// A keepalive waits for the next tick.
    urgent: bool,
    /// The clock reading when the oldest pending keepalive was noted.
    oldest_ms: Option<u64>,
    /// The next batch must be a `Refresh`: a batch taken after a gap failed to be written, and
    /// the gap was already taken from the watch.
    gap_owed: bool,
}

/// What the leader takes for one tick.
#[derive(Debug)]
pub struct Batch {
    /// Its number: keepalives waiting for it are answered once it is written.
    pub number: u64,
    /// The clock reading the tick is stamped with, taken inside the lock.
    pub stamp_ms: u64,
    /// The sessions to renew, each with what its lease by its client's clock needs (`None`:
    /// its TTL).
    pub sessions: Vec<(SessionId, Option<ClockLease>)>,
    /// The factor the leader's lock time ran at (against its clock's source) when it was
    /// taken: client clocks' rates are divided by it.
    pub factor: f64,
    /// Write a `Refresh` instead of a tick: after a gap, or for more keepalives than one tick
    /// may renew.
    pub refresh: bool,
    /// A gap (a stall or a clock jump) was seen since the last batch.
    pub after_gap: bool,
}

/// How a noted keepalive is answered.
#[derive(Debug, PartialEq, Eq)]
pub enum Noted {
    /// The session is alive: answer now, with its TTL.
    Alive {
        /// The session's TTL.
        ttl_ms: u64,
    },
    /// The session is past its deadline on the applied state: answer once batch `n` is written.
    AfterBatch(u64),
    /// No such session.
    Unknown,
}

impl Default for Renewals {
    fn default() -> Self {
        let pending = Pending {
            sessions: BTreeMap::new(),
            clocks: ClientClocks::default(),
            batch: 1,
            urgent: false,
            oldest_ms: None,
            gap_owed: false,
        };
        Self { pending: Mutex::new(pending), wake: Notify::new(), written: watch::Sender::new(0) }
    }
}

impl Pending {
    /// Notes `session` with `by_clock`; where it is noted already, the longer lease counts.
    fn keep_longer(&mut self, session: SessionId, by_clock: Option<ClockLease>) {
        let entry = self.sessions.entry(session).or_insert(by_clock);
        *entry = ClockLease::longer(*entry, by_clock);
    }

    /// Notes again the sessions of a batch taken at `stamp_ms`.
    fn requeue(&mut self, sessions: Vec<(SessionId, Option<ClockLease>)>, stamp_ms: u64) {
        for (session, by_clock) in sessions {
            self.keep_longer(session, by_clock);
        }
        self.oldest_ms = Some(self.oldest_ms.map_or(stamp_ms, |ms| ms.min(stamp_ms)));
    }
}

impl Renewals {
    fn lock(&self) -> std::sync::MutexGuard<'_, Pending> {
        self.pending.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Notes keepalives the moment they arrive, before they are answered: the next tick carries
    /// them whatever happens to their answer. `leases` looks the sessions up in the applied state;
    /// unknown ones (and those `principal` cannot see, which `leases` leaves out) are not
    /// noted. `reading` is the client's clock, sent by `principal`'s client, recorded only with
    /// a session that is noted; returns that clock's rate against the node's clock source once
    /// known (see [`crate::client_clocks`]), for [`Renewals::note`].
    pub fn note_arrival(
        &self,
        clock: &Clock,
        sessions: &[SessionId],
        (principal, reading): (Option<&str>, Option<ClientReading>),
        leases: impl FnOnce(&[SessionId]) -> Vec<Option<SessionLease>>,
    ) -> Option<f64> {
        let mut pending = self.lock();
        let now_ms = clock.now_ms();
        let known: Vec<(SessionId, SessionLease)> = sessions
            .iter()
            .zip(leases(sessions))
            .filter_map(|(session, lease)| Some((*session, lease?)))
            .collect();
        let reading = reading.filter(|_| !known.is_empty());
        let client_rate = reading.and_then(|reading| {
            pending.clocks.record(principal, reading, (clock.source_ms(), clock.rate_factor()))
        });
        // Noted with its lease by its client's clock, so a batch taken before `note` runs (or
        // a failed one given back) does not renew it for less.
        for (session, lease) in known {
            pending.keep_longer(session, ClockLease::of(&lease, client_rate));
        }
        if !pending.sessions.is_empty() && pending.oldest_ms.is_none() {
            pending.oldest_ms = Some(now_ms);
        }
        client_rate
    }

    /// Records a reading of a client's clock that came without a keepalive (with the open of a
    /// session of `principal`'s), which arrived at `arrived_ms` of the clock's source (see
    /// [`crate::client_clocks`]).
    pub fn note_reading(
        &self,
        clock: &Clock,
        principal: Option<&str>,
        reading: ClientReading,
        arrived_ms: f64,
    ) {
        let mut pending = self.lock();
        pending.clocks.record_open(principal, reading, (arrived_ms, clock.rate_factor()));
    }

    /// Notes keepalives of `sessions` as they are answered, reading the clock inside the lock;
    /// `leases` looks the sessions up in the applied state, all under one read. `client_rate`
    /// is the rate of their client's clock against the node's clock source
    /// ([`Renewals::note_arrival`]): where it is slower than the lock time, they are renewed for
    /// their TTL by that clock. Returns how to answer each, in order.
    pub fn note(
        &self,
        clock: &Clock,
        sessions: &[SessionId],
        client_rate: Option<f64>,
        leases: impl FnOnce(&[SessionId]) -> Vec<Option<SessionLease>>,
    ) -> Vec<Noted> {
        let mut pending = self.lock();
        let now_ms = clock.now_ms();
        let batch = pending.batch;
        let answers: Vec<Noted> = sessions
            .iter()
            .zip(leases(sessions))
            .map(|(session, lease)| {
                let Some(lease) = lease else { return Noted::Unknown };
                pending.keep_longer(*session, ClockLease::of(&lease, client_rate));
                if lease.alive_until_ms >= now_ms {
                    Noted::Alive { ttl_ms: lease.ttl_ms }
                } else {
                    Noted::AfterBatch(batch)
                }
            })
            .collect();
        if !pending.sessions.is_empty() && pending.oldest_ms.is_none() {
            pending.oldest_ms = Some(now_ms);
        }
        let waits = answers.iter().any(|answer| matches!(answer, Noted::AfterBatch(_)));
        pending.urgent |= waits;
        let many = pending.sessions.len() >= RENEWAL_FLUSH_THRESHOLD;
        drop(pending);
        if waits || many {
            self.wake.notify_one();
        }
        answers
    }

    /// Takes every pending keepalive for a tick stamped with a reading taken inside the lock.
    /// The batch must be written as a `Refresh` (`refresh` is set) after a gap in the clock, or
    /// when more keepalives are pending than one tick may renew (`max`, the state's limit):
    /// a tick that renewed only some of them could expire the others.
    pub fn take(&self, clock: &Clock, gaps: &GapWatch, max: usize) -> Batch {
        let mut pending = self.lock();
        let stamp_ms = clock.now_ms();
        gaps.observe(stamp_ms);
        let after_gap = gaps.take_gap() | std::mem::take(&mut pending.gap_owed);
        let number = pending.batch;
        pending.batch += 1;
        pending.oldest_ms = None;
        pending.urgent = false;
        let too_many = pending.sessions.len() > max;
        let sessions = std::mem::take(&mut pending.sessions).into_iter().collect();
        let factor = clock.rate_factor();
        Batch { number, stamp_ms, sessions, factor, refresh: after_gap || too_many, after_gap }
    }

    /// Gives back the keepalives of a batch whose tick failed; they ride in the next one, and
    /// the next batch is a `Refresh` if this one followed a gap.
    pub fn give_back(&self, batch: Batch) {
        let mut pending = self.lock();
        if batch.after_gap {
            // The gap was taken from the watch with this batch: a plain tick in its place could
            // expire sessions whose keepalives sat unread through it.
            pending.gap_owed = true;
            pending.urgent = true;
        }
        if batch.sessions.is_empty() {
            return;
        }
        pending.requeue(batch.sessions, batch.stamp_ms);
        // Keepalives may be waiting for this batch: the next tick is due at once.
        pending.urgent = true;
    }

    /// Notes again, for the next tick, the sessions of `batch`, written as a `Refresh`, that
    /// its tick would have renewed for longer than their TTL and that `live` (a look-up in the
    /// applied state, made once, outside the lock) still finds: the refresh renewed them for the
    /// lease their last renewal gave them, not for this batch's. (Review of issue 21: without
    /// this, a fast leader expired them early again after every gap, election or over-full
    /// batch; queued with sessions that had ended, they could overfill every batch and keep the
    /// leader refreshing for ever.)
    pub fn after_refresh(
        &self,
        batch: &Batch,
        live: impl FnOnce(Vec<SessionId>) -> Vec<SessionId>,
    ) {
        let longer: BTreeMap<SessionId, Option<ClockLease>> = batch
            .sessions
            .iter()
            .filter(|(_, by_clock)| {
                by_clock.is_some_and(|by_clock| by_clock.lease_ms(batch.factor).is_some())
            })
            .copied()
            .collect();
        if longer.is_empty() {
            return;
        }
        let owed: Vec<(SessionId, Option<ClockLease>)> = live(longer.keys().copied().collect())
            .into_iter()
            .filter_map(|session| Some((session, *longer.get(&session)?)))
            .collect();
        if !owed.is_empty() {
            self.lock().requeue(owed, batch.stamp_ms);
        }
    }

    /// Records that the tick carrying batch `number` was applied, and answers the keepalives
    /// that waited for it.
    pub fn written(&self, number: u64) {
        self.written.send_if_modified(|written| {
            let newer = number > *written;
            if newer {
                *written = number;
            }
            newer
        });
    }

    /// Waits until batch `number` has been written.
    pub async fn wait_written(&self, number: u64) {
        let mut written = self.written.subscribe();
        // The sender lives as long as `self`, so the wait ends only when the batch is written.
        let _ = written.wait_for(|written| *written >= number).await;
    }

    /// When a tick should be written for the pending keepalives, whatever the state's deadlines
    /// say: now (0) if one waits for it or many are pending, [`MAX_RENEWAL_DELAY_MS`] after the
    /// oldest, or `None` if none is pending.
    pub fn tick_due_ms(&self) -> Option<u64> {
        let pending = self.lock();
        if pending.urgent || pending.sessions.len() >= RENEWAL_FLUSH_THRESHOLD {
            return Some(0);
        }
        pending.oldest_ms.map(|oldest_ms| oldest_ms.saturating_add(MAX_RENEWAL_DELAY_MS))
    }

    /// Woken when [`Renewals::tick_due_ms`] may have turned to now.
    pub fn wake(&self) -> &Notify {
        &self.wake
    }
}

impl Batch {
    /// How many sessions it renews.
    #[must_use]
    pub fn renewals(&self) -> usize {
        self.sessions.len()
    }

    /// The tick that renews it, written under apply rules `rules`: a session whose client's
    /// clock runs slower than the leader's lock time is renewed for its TTL by that clock
    /// (`renew_for`), every other for its TTL. Before rules 5 a tick cannot renew for a lease of
    /// its own (the state refuses it), and every session gets its TTL.
    #[must_use]
    pub fn tick(&self, rules: u32) -> Command {
        let mut renew = Vec::with_capacity(self.sessions.len());
        let mut renew_for = Vec::new();
        for (session, by_clock) in &self.sessions {
            let lease_ms = by_clock.and_then(|by_clock| by_clock.lease_ms(self.factor));
            match lease_ms {
                Some(lease_ms) if rules >= 5 => renew_for.push((*session, lease_ms)),
                _ => renew.push(*session),
            }
        }
        Command::Tick { renew, renew_for }
    }
}

impl Renewals {
    /// How many clients' clocks, read in the last minute, run at another rate than the
    /// leader's.
    #[must_use]
    pub fn client_clocks_off_rate(&self, clock: &Clock) -> usize {
        let pending = self.lock();
        pending.clocks.off_rate(clock.source_ms())
    }

    /// Starts every client clock's ratios again: the leader's lock time changed its factor at
    /// `source_ms` of its clock's source (see [`crate::client_clocks`]).
    pub fn restart_client_clocks(&self, source_ms: f64) {
        self.lock().clocks.restart(source_ms);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ClockSource;

    fn lease(alive_until_ms: u64) -> Option<SessionLease> {
        let deadline_ms = alive_until_ms.saturating_sub(500);
        Some(SessionLease { ttl_ms: 5_000, deadline_ms, alive_until_ms })
    }

    #[test]
    fn a_live_session_is_answered_at_once_an_overdue_one_after_the_next_batch() {
        let renewals = Renewals::default();
        let clock = Clock::new(&ClockSource::Monotonic);
        let noted = renewals
            .note(&clock, &[SessionId(1), SessionId(3)], None, |_| vec![lease(u64::MAX), None]);
        assert_eq!(noted, vec![Noted::Alive { ttl_ms: 5_000 }, Noted::Unknown]);
        // Alive until reading 0 is overdue once the clock has moved; the first batch is 1.
        std::thread::sleep(std::time::Duration::from_millis(2));
        let overdue = renewals.note(&clock, &[SessionId(2)], None, |_| vec![lease(0)]);
        assert_eq!(overdue, vec![Noted::AfterBatch(1)]);
        assert_eq!(renewals.tick_due_ms(), Some(0), "an overdue keepalive makes a tick due now");
        let batch = renewals.take(&clock, &GapWatch::default(), 10);
        assert_eq!(batch.number, 1);
        assert_eq!(ids(&batch), vec![SessionId(1), SessionId(2)], "unknown ones are not kept");
        assert_eq!(renewals.tick_due_ms(), None);
    }

    #[test]
    fn more_keepalives_than_one_tick_may_renew_make_a_refresh_never_a_partial_tick() {
        let renewals = Renewals::default();
        let clock = Clock::new(&ClockSource::Monotonic);
        let sessions: Vec<SessionId> = (1..=5).map(SessionId).collect();
        renewals.note(&clock, &sessions, None, |sessions| vec![lease(u64::MAX); sessions.len()]);
        let due_ms = renewals.tick_due_ms().expect("a tick is due");
        assert!(due_ms >= MAX_RENEWAL_DELAY_MS, "the oldest keepalive waits at most 500 ms");
        let within = renewals.take(&clock, &GapWatch::default(), 5);
        assert!(!within.refresh);
        renewals.note(&clock, &sessions, None, |sessions| vec![lease(u64::MAX); sessions.len()]);
        let beyond = renewals.take(&clock, &GapWatch::default(), 4);
        assert!(beyond.refresh, "a tick may not renew some and expire the rest");
        assert_eq!(beyond.sessions.len(), 5);
        assert_eq!(renewals.tick_due_ms(), None);
    }

    #[test]
    fn a_keepalive_noted_on_arrival_rides_in_the_next_tick_unknown_ones_do_not() {
        let renewals = Renewals::default();
        let clock = Clock::new(&ClockSource::Monotonic);
        renewals.note_arrival(&clock, &[SessionId(1), SessionId(2)], (None, None), |_| {
            vec![lease(u64::MAX), None]
        });
        let batch = renewals.take(&clock, &GapWatch::default(), 10);
        assert_eq!(ids(&batch), vec![SessionId(1)]);
    }

    fn ids(batch: &Batch) -> Vec<SessionId> {
        batch.sessions.iter().map(|(session, _)| *session).collect()
    }

    /// Issue 13, point 4: a refused tick dropped the keepalives it carried (the driver's
    /// proposal returned Ok whatever the state machine said), so sessions whose keepalives were
    /// acknowledged expired at the next tick. The driver now gives a batch back unless its tick
    /// was applied and accepted (`driver::write`), and the next tick carries it.
    #[tokio::test]
    async fn a_refused_or_failed_tick_keeps_its_keepalives_for_the_next_one() {
        let renewals = Renewals::default();
        let clock = Clock::new(&ClockSource::Monotonic);
        renewals.note(&clock, &[SessionId(7)], None, |_| vec![lease(u64::MAX)]);
        let batch = renewals.take(&clock, &GapWatch::default(), 10);
        let number = batch.number;
        renewals.give_back(batch);
        assert_eq!(renewals.tick_due_ms(), Some(0), "a given-back batch is due again at once");
        let again = renewals.take(&clock, &GapWatch::default(), 10);
        assert_eq!(ids(&again), vec![SessionId(7)], "the failed tick's keepalive rides again");
        let waiting = renewals.wait_written(number);
        tokio::pin!(waiting);
        assert!(futures_now(&mut waiting).is_none(), "nothing written yet");
        renewals.written(again.number);
        assert!(futures_now(&mut waiting).is_some(), "a later batch covers an earlier one");
    }

    /// Polls a future once.
    fn futures_now<F: std::future::Future + Unpin>(future: &mut F) -> Option<F::Output> {
        let waker = std::task::Waker::noop();
        let mut context = std::task::Context::from_waker(waker);
        match std::pin::Pin::new(future).poll(&mut context) {
            std::task::Poll::Ready(output) => Some(output),
            std::task::Poll::Pending => None,
        }
    }

    /// Issue 21: a keepalive whose client's clock runs at half the leader's rate renews its
    /// session so that its TTL and grace run on the client's clock, counted slower by the 2 %
    /// deadband: (5,000 + 500) / (0.5 / 1.02) − 500 = 10,720 ms of the leader's clock. Noted
    /// twice before its tick, the longer lease counts; a tick written under rules older than 5
    /// renews every session for its TTL; a client's clock faster than the leader's shortens
    /// nothing; the factor in force when the batch is taken applies.
    #[test]
    fn a_client_clock_slower_than_the_leaders_renews_for_its_ttl_by_that_clock() {
        let renewals = Renewals::default();
        let clock = Clock::new(&ClockSource::Monotonic);
        renewals.note(&clock, &[SessionId(1)], Some(0.5), |_| vec![lease(u64::MAX)]);
        renewals.note(&clock, &[SessionId(2)], None, |_| vec![lease(u64::MAX)]);
        renewals.note(&clock, &[SessionId(3)], Some(2.0), |_| vec![lease(u64::MAX)]);
        let batch = renewals.take(&clock, &GapWatch::default(), 10);
        assert_eq!(batch.renewals(), 3);
        assert_eq!(
            batch.tick(5),
            Command::Tick {
                renew: vec![SessionId(2), SessionId(3)],
                renew_for: vec![(SessionId(1), 10_720)]
            }
        );
        assert_eq!(
            batch.tick(4),
            Command::Tick {
                renew: vec![SessionId(1), SessionId(2), SessionId(3)],
                renew_for: Vec::new()
            }
        );
        renewals.note(&clock, &[SessionId(1)], Some(0.5), |_| vec![lease(u64::MAX)]);
        renewals.note(&clock, &[SessionId(1)], None, |_| vec![lease(u64::MAX)]);
        renewals.note(&clock, &[SessionId(1)], Some(0.8), |_| vec![lease(u64::MAX)]);
        let twice = renewals.take(&clock, &GapWatch::default(), 10);
        assert_eq!(
            twice.tick(5),
            Command::Tick { renew: vec![], renew_for: vec![(SessionId(1), 10_720)] }
        );
        // The peers found this leader's clock twice as fast: its lock time already runs at the
        // client's rate.
        renewals.note(&clock, &[SessionId(1)], Some(0.5), |_| vec![lease(u64::MAX)]);
        clock.set_rate_factor(0.5);
        let corrected = renewals.take(&clock, &GapWatch::default(), 10);
        assert_eq!(
            corrected.tick(5),
            Command::Tick { renew: vec![SessionId(1)], renew_for: vec![] }
        );
    }

    /// Review of issue 21: a `Refresh` renews every session for the lease its last renewal gave
    /// it, not for the longer lease its batch owed it; on a fast leader that was the early
    /// expiry again. The sessions owed one ride in the next tick, and only those still live
    /// (driver::write filters them): ended ones could overfill every batch.
    #[test]
    fn a_refresh_notes_again_the_sessions_owed_a_longer_lease() {
        let renewals = Renewals::default();
        let clock = Clock::new(&ClockSource::Monotonic);
        let gaps = GapWatch::default();
        renewals.note(&clock, &[SessionId(1)], Some(0.5), |_| vec![lease(u64::MAX)]);
        renewals.note(&clock, &[SessionId(2)], None, |_| vec![lease(u64::MAX)]);
        renewals.note(&clock, &[SessionId(3)], Some(1.0), |_| vec![lease(u64::MAX)]);
        gaps.observe(0);
        gaps.observe(10_000);
        let refreshed = renewals.take(&clock, &gaps, 10);
        assert!(refreshed.refresh);
        let mut asked = Vec::new();
        renewals.after_refresh(&refreshed, |owed| {
            asked.clone_from(&owed);
            owed
        });
        assert_eq!(asked, [SessionId(1)], "only the session owed a longer lease is looked up");
        assert!(renewals.tick_due_ms().is_some(), "a tick is due for them");
        let next = renewals.take(&clock, &gaps, 10);
        assert_eq!(
            next.tick(5),
            Command::Tick { renew: vec![], renew_for: vec![(SessionId(1), 10_720)] }
        );
        // A session that ended meanwhile is not queued again.
        renewals.note(&clock, &[SessionId(1)], Some(0.5), |_| vec![lease(u64::MAX)]);
        gaps.observe(30_000);
        let ended = renewals.take(&clock, &gaps, 10);
        assert!(ended.refresh);
        renewals.after_refresh(&ended, |_| Vec::new());
        assert_eq!(renewals.tick_due_ms(), None, "nothing live is owed, nothing is due");
    }

    /// Review of issue 21: a keepalive noted on arrival was queued with no lease by its client's
    /// clock, and giving back a failed batch kept that placeholder over the batch's longer
    /// lease. It is now noted with its lease on arrival, and the longer one counts.
    #[test]
    fn a_failed_batch_given_back_keeps_the_longer_lease() {
        let renewals = Renewals::default();
        let clock = Clock::new(&ClockSource::Monotonic);
        renewals.note(&clock, &[SessionId(1)], Some(0.5), |_| vec![lease(u64::MAX)]);
        let failed = renewals.take(&clock, &GapWatch::default(), 10);
        renewals.note_arrival(&clock, &[SessionId(1)], (None, None), |_| vec![lease(u64::MAX)]);
        renewals.give_back(failed);
        let retried = renewals.take(&clock, &GapWatch::default(), 10);
        assert_eq!(
            retried.tick(5),
            Command::Tick { renew: vec![], renew_for: vec![(SessionId(1), 10_720)] }
        );
    }

    /// A clock read from a script file (rate 1, no jump yet), the file, and the directory that
    /// holds it (removed when dropped).
    fn scripted_clock() -> (tempfile::TempDir, std::path::PathBuf, Clock) {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let script = dir.path().join("clock");
        std::fs::write(&script, "rate=1 jump_ms=0").expect("written");
        let clock = Clock::new(&ClockSource::Scripted(script.clone()));
        (dir, script, clock)
    }

    /// Jumps the scripted clock 4 s forward, so that one interval gives a rate, and waits until
    /// the clock shows it.
    fn jump_4_s(script: &std::path::Path, clock: &Clock) {
        std::fs::write(script, "rate=1 jump_ms=4000").expect("written");
        while clock.source_ms() < 4_000.0 {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }

    /// Review of issue 21: a keepalive was noted on arrival without its lease by its client's
    /// clock, so a tick taken while the leader confirmed its lease renewed the session for the
    /// TTL only, and if the keepalive was then never answered (leadership lost) the longer
    /// lease never came. It is noted with that lease on arrival.
    #[test]
    fn a_keepalive_is_noted_with_its_client_clock_lease_on_arrival() {
        let (_dir, script, clock) = scripted_clock();
        let renewals = Renewals::default();
        let arrive = |clock_ms: f64| {
            let reading = Some(ClientReading { clock_id: 9, clock_ms });
            renewals
                .note_arrival(&clock, &[SessionId(1)], (None, reading), |_| vec![lease(u64::MAX)])
        };
        assert_eq!(arrive(0.0), None, "one reading is no rate yet");
        renewals.take(&clock, &GapWatch::default(), 10);
        // Four seconds of the node's clock pass while two pass on the client's.
        jump_4_s(&script, &clock);
        let rate = arrive(2_000.0).expect("a rate from one interval");
        assert!((rate - 0.5).abs() < 0.01, "{rate}");
        let taken_before_the_answer = renewals.take(&clock, &GapWatch::default(), 10);
        let Command::Tick { renew, renew_for } = taken_before_the_answer.tick(5) else {
            panic!("a tick")
        };
        assert!(renew.is_empty(), "{renew:?}");
        assert_eq!(renew_for.len(), 1);
        assert!((10_600..=10_800).contains(&renew_for[0].1), "{renew_for:?}");
    }

    /// Issue 21: a new client's first session was exposed to a fast leader's clock until two
    /// of its keepalives, at least 2 s apart, had been paired. A reading sent with the open is
    /// recorded, and the first keepalive pairs with it.
    #[test]
    fn a_reading_sent_with_an_open_pairs_with_the_first_keepalive() {
        let (_dir, script, clock) = scripted_clock();
        let renewals = Renewals::default();
        let opened = ClientReading { clock_id: 3, clock_ms: 0.0 };
        renewals.note_reading(&clock, Some("worker"), opened, clock.source_ms());
        jump_4_s(&script, &clock);
        let first_keepalive = Some(ClientReading { clock_id: 3, clock_ms: 2_000.0 });
        let rate = renewals
            .note_arrival(&clock, &[SessionId(1)], (Some("worker"), first_keepalive), |_| {
                vec![lease(u64::MAX)]
            })
            .expect("the first keepalive has a rate");
        assert!((rate - 0.5).abs() < 0.01, "{rate}");
        let other_principal = Some(ClientReading { clock_id: 3, clock_ms: 2_000.0 });
        let unpaired =
            renewals.note_arrival(&clock, &[SessionId(2)], (None, other_principal), |_| {
                vec![lease(u64::MAX)]
            });
        assert_eq!(unpaired, None, "a clock is known by its principal too");
    }

    /// Review of issue 21: a batch taken after a gap is written as a `Refresh`; when that
    /// failed, giving it back lost the gap (already taken from the watch), and the retry was a
    /// plain tick that could expire sessions whose keepalives sat unread through the stall.
    #[test]
    fn a_failed_refresh_after_a_gap_is_retried_as_a_refresh() {
        let renewals = Renewals::default();
        let clock = Clock::new(&ClockSource::Monotonic);
        let gaps = GapWatch::default();
        gaps.observe(0);
        gaps.observe(10_000);
        let failed = renewals.take(&clock, &gaps, 10);
        assert!(failed.after_gap && failed.sessions.is_empty());
        renewals.give_back(failed);
        assert_eq!(renewals.tick_due_ms(), Some(0), "the refresh is due again at once");
        let retried = renewals.take(&clock, &gaps, 10);
        assert!(retried.after_gap && retried.refresh);
        assert!(!renewals.take(&clock, &gaps, 10).refresh, "and owed once");
    }

    #[test]
    fn a_gap_seen_before_a_batch_turns_it_into_a_refresh() {
        let renewals = Renewals::default();
        let clock = Clock::new(&ClockSource::Monotonic);
        let gaps = GapWatch::default();
        gaps.observe(0);
        gaps.observe(10_000);
        let batch = renewals.take(&clock, &gaps, 10);
        assert!(batch.after_gap && batch.refresh);
        assert!(!renewals.take(&clock, &gaps, 10).refresh, "the gap is taken once");
    }
}
