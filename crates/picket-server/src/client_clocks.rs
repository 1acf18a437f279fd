//! The clocks of the clients that keep sessions alive, checked against the leader's (issue 21).
//!
//! What a client is promised is its TTL by its *own* clock: the Rust client counts on its
//! session for the TTL less 3 % after sending its last confirmed keepalive. A leader whose clock
//! runs slow keeps a silent session alive longer than that in real time, and one whose clock
//! runs fast expires it before its client has given up on it. On three or more voters the
//! peers' clocks correct the leader's ([`crate::rate`]); a single node has no peer, but it has
//! its clients' clocks.
//!
//! A keepalive may carry a reading of its client's clock (`clock_id`, `clock_ms`). The leader
//! pairs readings of one clock at least [`MIN_INTERVAL_MS`] apart with its own lock-time
//! readings at their arrival; the clock's rate against the leader's is the median of its last
//! three such ratios, and above 1 only as far as the two newest agree
//! ([`crate::rate::RatioWindow`]). Outside [`DEADBAND`], a session renewed by that clock's
//! keepalive is renewed so that its TTL and the expiry grace run on its client's clock (the
//! tick's `renew_for`, apply rules 5); a rate above 1, which shortens the session in the
//! leader's time, counts as slower by the deadband. The renewal delay (up to 500 ms until the
//! tick that carries the keepalive) stays on the leader's clock. How many clocks run at another
//! rate (of those read in the last minute) is shown as `client_clocks_off_rate` in
//! `GET /v1/cluster`.
//!
//! Trust: a clock is known by its principal and its id, so a client that lies about its clock
//! moves only its own principal's sessions (a client may already end those). A reading changes
//! no other session and never the leader's own time. Readings that are not finite non-negative
//! numbers are ignored, and at most [`MAX_CLIENT_CLOCKS`] clocks are remembered.
//!
//! What it cannot do: a session whose client went silent keeps the rate its clock had; a
//! leader's clock that turns slow after that is found only by peers' clocks.

use crate::rate::{DEADBAND, IMPLAUSIBLE_RATIO, MAX_FACTOR, RatioWindow};
use std::collections::HashMap;

/// The most client clocks the leader remembers; beyond it, the one read longest ago is
/// forgotten.
pub const MAX_CLIENT_CLOCKS: usize = 10_000;
/// Two readings of one clock closer than this (leader's clock) are not paired: a keepalive's
/// one-way delay varies by milliseconds, and over two seconds 20 ms of it is 1 %.
const MIN_INTERVAL_MS: u64 = 2_000;
/// A clock read within this long counts in [`ClientClocks::off_rate`].
const RECENT_MS: u64 = 60_000;

/// A reading of a client's clock, sent with its keepalive.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ClientReading {
    /// Names one clock of one client process; 0 is none.
    pub clock_id: u64,
    /// The clock's reading when the keepalive was sent, in milliseconds from any origin.
    pub clock_ms: f64,
}

impl ClientReading {
    /// The reading a request carries, if any: a zero `clock_id` is none.
    #[must_use]
    pub fn from_request(clock_id: u64, clock_ms: f64) -> Option<Self> {
        (clock_id != 0).then_some(Self { clock_id, clock_ms })
    }
}

/// See the module documentation.
#[derive(Debug, Default)]
pub struct ClientClocks {
    clocks: HashMap<(Option<String>, u64), ClientClock>,
}

#[derive(Debug)]
struct ClientClock {
    /// The reading the next interval starts from: the client's clock and the leader's.
    client_ms: f64,
    leader_ms: u64,
    window: RatioWindow,
    /// The leader's clock at the last reading, for forgetting the least recent clock.
    read_at_ms: u64,
    /// Whether its rate was last outside the deadband (a change is logged).
    off: bool,
}

impl ClientClocks {
    /// Records `reading`, sent by a client of `principal` (`None` without authentication) and
    /// received at `leader_ms` of the leader's lock time. Returns the clock's rate against the
    /// leader's (its milliseconds per one of the leader's) where it is known and outside the
    /// deadband: a session this keepalive renews lives its TTL divided by it.
    pub fn record(
        &mut self,
        principal: Option<&str>,
        reading: ClientReading,
        leader_ms: u64,
    ) -> Option<f64> {
        if reading.clock_id == 0 || !reading.clock_ms.is_finite() || reading.clock_ms < 0.0 {
            return None;
        }
        let key = (principal.map(str::to_owned), reading.clock_id);
        if !self.clocks.contains_key(&key) && self.clocks.len() >= MAX_CLIENT_CLOCKS {
            self.forget_least_recent();
        }
        let clock = self.clocks.entry(key).or_insert_with(|| ClientClock {
            client_ms: reading.clock_ms,
            leader_ms,
            window: RatioWindow::default(),
            read_at_ms: leader_ms,
            off: false,
        });
        clock.read_at_ms = leader_ms;
        clock.observe(reading.clock_ms, leader_ms);
        let rate = clock.window.rate().filter(|rate| (rate - 1.0).abs() > DEADBAND);
        if rate.is_some() != clock.off {
            clock.off = rate.is_some();
            log_change(principal, reading.clock_id, rate);
        }
        // A rate above 1 shortens leases in the leader's time, and one known only within 1 %
        // could end a session before its client gives up on it: it counts as slower by the
        // deadband (the client's 3 % margin covers the rest).
        rate.map(|rate| {
            let rate = if rate > 1.0 { (rate / (1.0 + DEADBAND)).max(1.0) } else { rate };
            rate.clamp(1.0 / MAX_FACTOR, MAX_FACTOR)
        })
    }

    /// How many clocks read in the last [`RECENT_MS`] before `now_ms` (the leader's lock
    /// time) run at another rate than the leader's: a client that went away says nothing now.
    #[must_use]
    pub fn off_rate(&self, now_ms: u64) -> usize {
        let recent = |clock: &&ClientClock| now_ms.saturating_sub(clock.read_at_ms) <= RECENT_MS;
        self.clocks.values().filter(recent).filter(|clock| clock.off).count()
    }

    /// How many clocks are remembered.
    #[must_use]
    pub fn len(&self) -> usize {
        self.clocks.len()
    }

    /// Whether no clock is remembered.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.clocks.is_empty()
    }

    fn forget_least_recent(&mut self) {
        let oldest = self.clocks.iter().min_by_key(|(_, clock)| clock.read_at_ms);
        if let Some(key) = oldest.map(|(key, _)| key.clone()) {
            self.clocks.remove(&key);
        }
    }
}

impl ClientClock {
    fn observe(&mut self, client_ms: f64, leader_ms: u64) {
        let Some(ours_ms) = leader_ms.checked_sub(self.leader_ms) else { return };
        if ours_ms < MIN_INTERVAL_MS {
            return;
        }
        #[allow(clippy::cast_precision_loss)] // Milliseconds of a leader's life fit in 2^52.
        let ratio = (client_ms - self.client_ms) / ours_ms as f64;
        // Beyond it the client restarted (its clock counts from a new origin) or its clock
        // jumped: only this interval is meaningless.
        if (1.0 / IMPLAUSIBLE_RATIO..=IMPLAUSIBLE_RATIO).contains(&ratio) {
            self.window.push(ratio);
        }
        self.client_ms = client_ms;
        self.leader_ms = leader_ms;
    }
}

/// A client's clock leaving or returning to the leader's rate is worth a line: either clock
/// may be the wrong one.
fn log_change(principal: Option<&str>, clock_id: u64, rate: Option<f64>) {
    match rate {
        Some(rate) => tracing::warn!(
            principal,
            clock_id,
            rate,
            "a client's clock runs at {rate:.2} times this leader's clock: the sessions it keeps \
             alive now live their TTL by the client's clock. If many clients say so, check this \
             machine's clock (NTP, the virtual machine's clock source); if one does, check the \
             client's."
        ),
        None => {
            tracing::info!(principal, clock_id, "a client's clock runs at the leader's rate again")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `count` keepalives of clock `id` every `every_ms` of the leader's clock, the
    /// client's clock running at `rate` against it; returns the last answer.
    fn feed(
        clocks: &mut ClientClocks,
        principal: Option<&str>,
        id: u64,
        rate: f64,
        (start_ms, every_ms, count): (u64, u64, u64),
    ) -> Option<f64> {
        let mut answer = None;
        for step in 0..count {
            let leader_ms = start_ms + step * every_ms;
            #[allow(clippy::cast_precision_loss)]
            let clock_ms = 7_000.0 + leader_ms as f64 * rate;
            answer = clocks.record(principal, ClientReading { clock_id: id, clock_ms }, leader_ms);
        }
        answer
    }

    #[test]
    fn a_client_clock_twice_as_fast_as_the_leaders_halves_its_sessions_leases() {
        let mut clocks = ClientClocks::default();
        assert_eq!(feed(&mut clocks, None, 9, 2.0, (1_000, 1_000, 4)), None, "one interval");
        let rate = feed(&mut clocks, None, 9, 2.0, (4_000, 1_000, 6)).expect("three intervals");
        assert!((rate - 2.0 / 1.02).abs() < 1e-9, "counted slower by the deadband: {rate}");
        assert_eq!(clocks.off_rate(9_000), 1);
        assert_eq!(clocks.off_rate(9_000 + RECENT_MS + 1), 0, "not read for a minute");
        let slow = feed(&mut clocks, None, 10, 0.5, (1_000, 700, 40)).expect("a slow client");
        assert!((slow - 0.5).abs() < 1e-9, "{slow}");
        assert_eq!(feed(&mut clocks, None, 11, 1.01, (1_000, 700, 40)), None, "drift");
    }

    /// A clock is its principal's: another principal's readings under the same id (a lie, or a
    /// coincidence) start a clock of their own and move nothing of the first one's.
    #[test]
    fn a_clock_is_known_by_its_principal_and_id() {
        let mut clocks = ClientClocks::default();
        assert_eq!(feed(&mut clocks, Some("alice"), 5, 1.0, (1_000, 2_000, 6)), None);
        let liar = feed(&mut clocks, Some("mallory"), 5, 4.0, (1_000, 2_000, 6));
        assert!(liar.is_some_and(|rate| (rate - 4.0 / 1.02).abs() < 1e-9), "{liar:?}");
        assert_eq!(feed(&mut clocks, Some("alice"), 5, 1.0, (13_000, 2_000, 2)), None);
        assert_eq!(clocks.len(), 2);
    }

    /// Readings that are not numbers, a client's restart (its clock from a new origin) and
    /// readings too close together give no ratio; past [`MAX_CLIENT_CLOCKS`] the least recent
    /// clock is forgotten.
    #[test]
    fn bad_readings_restarts_and_too_many_clocks_are_bounded() {
        let mut clocks = ClientClocks::default();
        for clock_ms in [f64::NAN, f64::INFINITY, -1.0] {
            assert_eq!(clocks.record(None, ClientReading { clock_id: 1, clock_ms }, 5), None);
        }
        assert!(clocks.is_empty(), "nothing remembered of readings that are not numbers");
        assert_eq!(ClientReading::from_request(0, 12.0), None, "clock id 0 is no reading");
        feed(&mut clocks, None, 2, 1.0, (1_000, 2_000, 4));
        // The client restarts: its clock reads near 0 again. One interval is implausible and
        // dropped; the rate stays at 1.
        assert_eq!(clocks.record(None, ClientReading { clock_id: 2, clock_ms: 3.0 }, 9_000), None);
        for id in 0..=MAX_CLIENT_CLOCKS as u64 {
            clocks.record(None, ClientReading { clock_id: id + 100, clock_ms: 1.0 }, 10_000 + id);
        }
        assert_eq!(clocks.len(), MAX_CLIENT_CLOCKS);
        assert!(!clocks.clocks.contains_key(&(None, 2)), "the least recent clock went first");
    }
}
