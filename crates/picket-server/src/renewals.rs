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
//!   that carries it has been applied, and is then answered by whether the session survived.

use crate::clock::{Clock, GapWatch};
use picket_core::{SessionId, SessionLease};
use std::collections::BTreeSet;
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
    sessions: BTreeSet<SessionId>,
    /// The number the next batch taken will have; the first is 1, as 0 reads "none written".
    batch: u64,
    /// A keepalive waits for the next tick.
    urgent: bool,
    /// The clock reading when the oldest pending keepalive was noted.
    oldest_ms: Option<u64>,
}

/// What the leader takes for one tick.
#[derive(Debug)]
pub struct Batch {
    /// Its number: keepalives waiting for it are answered once it is written.
    pub number: u64,
    /// The clock reading the tick is stamped with, taken inside the lock.
    pub stamp_ms: u64,
    /// The sessions to renew.
    pub sessions: Vec<SessionId>,
    /// A gap (a stall or a clock jump) was seen since the last batch: refresh, do not expire.
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
        let pending =
            Pending { sessions: BTreeSet::new(), batch: 1, urgent: false, oldest_ms: None };
        Self { pending: Mutex::new(pending), wake: Notify::new(), written: watch::Sender::new(0) }
    }
}

impl Renewals {
    fn lock(&self) -> std::sync::MutexGuard<'_, Pending> {
        self.pending.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Notes keepalives of `sessions`, reading the clock inside the lock; `lease` looks a session
    /// up in the applied state. Returns how to answer each, in order.
    pub fn note(
        &self,
        clock: &Clock,
        sessions: &[SessionId],
        lease: impl Fn(SessionId) -> Option<SessionLease>,
    ) -> Vec<Noted> {
        let mut pending = self.lock();
        let now_ms = clock.now_ms();
        let batch = pending.batch;
        let answers: Vec<Noted> = sessions
            .iter()
            .map(|session| {
                let Some(lease) = lease(*session) else { return Noted::Unknown };
                pending.sessions.insert(*session);
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

    /// Takes at most `max` pending keepalives (the state's renewals-per-tick limit) for a tick
    /// stamped with a reading taken inside the lock, and whether a gap was seen since the last
    /// batch. Keepalives beyond `max` stay for the next tick, which is then due at once.
    pub fn take(&self, clock: &Clock, gaps: &GapWatch, max: usize) -> Batch {
        let mut pending = self.lock();
        let stamp_ms = clock.now_ms();
        gaps.observe(stamp_ms);
        let after_gap = gaps.take_gap();
        let number = pending.batch;
        pending.batch += 1;
        let sessions: Vec<SessionId> = if pending.sessions.len() <= max {
            pending.oldest_ms = None;
            pending.urgent = false;
            std::mem::take(&mut pending.sessions).into_iter().collect()
        } else {
            // The rest keep their place and make the next tick due at once.
            pending.urgent = true;
            let rest = match pending.sessions.iter().nth(max).copied() {
                Some(first_left) => pending.sessions.split_off(&first_left),
                None => BTreeSet::new(),
            };
            std::mem::replace(&mut pending.sessions, rest).into_iter().collect()
        };
        Batch { number, stamp_ms, sessions, after_gap }
    }

    /// Gives back the keepalives of a batch whose tick failed; they ride in the next one.
    pub fn give_back(&self, batch: Batch) {
        if batch.sessions.is_empty() {
            return;
        }
        let mut pending = self.lock();
        pending.sessions.extend(batch.sessions);
        pending.oldest_ms =
            Some(pending.oldest_ms.map_or(batch.stamp_ms, |ms| ms.min(batch.stamp_ms)));
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ClockSource;

    fn lease(alive_until_ms: u64) -> Option<SessionLease> {
        Some(SessionLease { ttl_ms: 5_000, deadline_ms: alive_until_ms, alive_until_ms })
    }

    #[test]
    fn a_live_session_is_answered_at_once_an_overdue_one_after_the_next_batch() {
        let renewals = Renewals::default();
        let clock = Clock::new(&ClockSource::Monotonic);
        let noted = renewals.note(&clock, &[SessionId(1), SessionId(3)], |session| {
            (session == SessionId(1)).then_some(()).and(lease(u64::MAX))
        });
        assert_eq!(noted, vec![Noted::Alive { ttl_ms: 5_000 }, Noted::Unknown]);
        // Alive until reading 0 is overdue once the clock has moved; the first batch is 1.
        std::thread::sleep(std::time::Duration::from_millis(2));
        let overdue = renewals.note(&clock, &[SessionId(2)], |_| lease(0));
        assert_eq!(overdue, vec![Noted::AfterBatch(1)]);
        assert_eq!(renewals.tick_due_ms(), Some(0), "an overdue keepalive makes a tick due now");
        let batch = renewals.take(&clock, &GapWatch::default(), 10);
        assert_eq!(batch.number, 1);
        assert_eq!(batch.sessions, vec![SessionId(1), SessionId(2)], "unknown ones are not kept");
        assert_eq!(renewals.tick_due_ms(), None);
    }

    #[test]
    fn a_batch_takes_at_most_the_limit_and_the_rest_is_due_at_once() {
        let renewals = Renewals::default();
        let clock = Clock::new(&ClockSource::Monotonic);
        let sessions: Vec<SessionId> = (1..=5).map(SessionId).collect();
        renewals.note(&clock, &sessions, |_| lease(u64::MAX));
        let due_ms = renewals.tick_due_ms().expect("a tick is due");
        assert!(due_ms >= MAX_RENEWAL_DELAY_MS, "the oldest keepalive waits at most 500 ms");
        let first = renewals.take(&clock, &GapWatch::default(), 3);
        assert_eq!(first.sessions, vec![SessionId(1), SessionId(2), SessionId(3)]);
        assert_eq!(renewals.tick_due_ms(), Some(0));
        let second = renewals.take(&clock, &GapWatch::default(), 3);
        assert_eq!(second.sessions, vec![SessionId(4), SessionId(5)]);
        assert_eq!(second.number, first.number + 1);
    }

    #[tokio::test]
    async fn a_failed_batch_is_given_back_and_waiters_hear_only_a_written_one() {
        let renewals = Renewals::default();
        let clock = Clock::new(&ClockSource::Monotonic);
        renewals.note(&clock, &[SessionId(7)], |_| lease(u64::MAX));
        let batch = renewals.take(&clock, &GapWatch::default(), 10);
        let number = batch.number;
        renewals.give_back(batch);
        let again = renewals.take(&clock, &GapWatch::default(), 10);
        assert_eq!(again.sessions, vec![SessionId(7)], "the failed tick's keepalive rides again");
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

    #[test]
    fn a_gap_seen_before_a_batch_turns_it_into_a_refresh() {
        let renewals = Renewals::default();
        let clock = Clock::new(&ClockSource::Monotonic);
        let gaps = GapWatch::default();
        gaps.observe(0);
        gaps.observe(10_000);
        assert!(renewals.take(&clock, &gaps, 10).after_gap);
        assert!(!renewals.take(&clock, &gaps, 10).after_gap, "the gap is taken once");
    }
}
