//! The node's clock, and the watch that notices when the clock or the process loses time.
//!
//! Picket's time is the leader's monotonic clock (`CLOCK_MONOTONIC` through `Instant`), read in
//! milliseconds since the node started. Only the leader's readings enter the log, stamped on
//! commands; a new leader starts its readings with a `Refresh`. The clock may misbehave: a
//! virtual machine's clock can jump, a process can be stopped or starved for seconds while
//! keepalives wait unread in its sockets. [`GapWatch`] notices both as a gap between two
//! readings that should have been a pulse apart, and the leader then refreshes every session
//! instead of expiring the ones it could not hear from (see `driver`).
//!
//! For fault tests the clock can be scripted ([`ClockSource::Scripted`]): a file holds a rate and
//! a total jump, and the clock follows them from real elapsed time. Only the lock state's time
//! is scripted; Raft's timers keep the real clock, as they would with a misbehaving clock that
//! only Picket's code reads.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;
use tokio::time::Instant;

/// How often the pulse reads the clock.
pub const PULSE: Duration = Duration::from_millis(100);
/// A gap: two readings further apart than this (or going back by more than this), while the
/// pulse should have read the clock every [`PULSE`]. It is the same bound as the state's
/// session expiry grace, so a keepalive that reached the node before a session's deadline was
/// read before its grace ran out, or a gap was seen.
pub const GAP: Duration = Duration::from_millis(picket_core::DEFAULT_SESSION_EXPIRY_GRACE_MS);
/// How often a scripted clock rereads its file.
const SCRIPT_REREAD: Duration = Duration::from_millis(10);

/// Where a node's clock comes from.
#[derive(Clone, Debug, Default, PartialEq)]
#[non_exhaustive]
pub enum ClockSource {
    /// The monotonic clock. Always, outside tests.
    #[default]
    Monotonic,
    /// A clock driven by a file, for fault tests: the file holds `rate=R jump_ms=J`, and the
    /// clock runs at `R` times real time plus a total jump of `J` ms (negative goes back). The
    /// file is reread every 10 ms; a missing or unreadable file leaves the clock as it was.
    Scripted(PathBuf),
}

/// A node's clock in milliseconds since the node started.
///
/// The reading is the source's (monotonic or scripted) times a rate factor, 1 unless the
/// leader's peers found its clock running fast or slow against theirs (see [`crate::rate`]).
/// A change of factor applies from the moment it is made, so the reading never jumps.
#[derive(Debug)]
pub struct Clock {
    origin: Instant,
    script: Option<Mutex<Script>>,
    correction: Mutex<Correction>,
}

/// The reading as a line through one point: `anchor_ms + (source - source_anchor_ms) * factor`.
#[derive(Debug)]
struct Correction {
    source_anchor_ms: f64,
    anchor_ms: f64,
    factor: f64,
}

impl Correction {
    fn reading_ms(&self, source_ms: f64) -> f64 {
        self.anchor_ms + (source_ms - self.source_anchor_ms) * self.factor
    }

    /// Runs at `factor` from `source_ms` on, continuing from the reading there.
    fn rebase(&mut self, source_ms: f64, factor: f64) {
        self.anchor_ms = self.reading_ms(source_ms);
        self.source_anchor_ms = source_ms;
        self.factor = factor;
    }
}

impl Clock {
    /// A clock from `source`.
    #[must_use]
    pub fn new(source: &ClockSource) -> Self {
        let origin = Instant::now();
        let script = match source {
            ClockSource::Monotonic => None,
            ClockSource::Scripted(path) => Some(Mutex::new(Script::new(path.clone(), origin))),
        };
        let correction =
            Mutex::new(Correction { source_anchor_ms: 0.0, anchor_ms: 0.0, factor: 1.0 });
        Self { origin, script, correction }
    }

    /// Milliseconds since the node started, by this clock.
    #[must_use]
    pub fn now_ms(&self) -> u64 {
        let correction = lock(&self.correction);
        // The source is read under the correction's lock, so a reading taken while the factor
        // changes cannot fall before the new anchor: the clock never goes back.
        let reading = correction.reading_ms(self.source_ms());
        // Truncation is what a millisecond clock does; the value is never negative.
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let reading = reading.max(0.0) as u64;
        reading
    }

    /// The source's reading in milliseconds since the node started, without the rate factor:
    /// what this node tells a leader that compares its clock with its peers'.
    #[must_use]
    pub fn source_ms(&self) -> f64 {
        match &self.script {
            None => self.origin.elapsed().as_secs_f64() * 1_000.0,
            Some(script) => lock(script).now_ms(),
        }
    }

    /// Makes the clock run at `factor` times its source from now on. A factor that is not a
    /// positive finite number is ignored (the caller bounds it; this is the last line).
    pub fn set_rate_factor(&self, factor: f64) {
        if !(factor.is_finite() && factor > 0.0) {
            tracing::warn!(factor, "ignoring a clock rate factor that is not a positive number");
            return;
        }
        let mut correction = lock(&self.correction);
        let source_ms = self.source_ms();
        correction.rebase(source_ms, factor);
    }

    /// The rate factor in use: 1 unless peers found this leader's clock fast or slow.
    #[must_use]
    pub fn rate_factor(&self) -> f64 {
        lock(&self.correction).factor
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A scripted clock's state: the reading at an anchor instant, and the rate since then.
#[derive(Debug)]
struct Script {
    path: PathBuf,
    anchor: Instant,
    anchor_ms: f64,
    rate: f64,
    jump_ms: i64,
    last_read: Option<Instant>,
}

impl Script {
    fn new(path: PathBuf, origin: Instant) -> Self {
        Self { path, anchor: origin, anchor_ms: 0.0, rate: 1.0, jump_ms: 0, last_read: None }
    }

    fn now_ms(&mut self) -> f64 {
        let now = Instant::now();
        if self.last_read.is_none_or(|read| now.duration_since(read) >= SCRIPT_REREAD) {
            self.last_read = Some(now);
            if let Some((rate, jump_ms)) = read_script(&self.path) {
                self.rebase(now, rate, jump_ms);
            }
        }
        let elapsed_ms = now.duration_since(self.anchor).as_secs_f64() * 1_000.0;
        (self.anchor_ms + elapsed_ms * self.rate).max(0.0)
    }

    /// Moves the anchor to `now` so a new rate applies from here on, and applies any new jump.
    fn rebase(&mut self, now: Instant, rate: f64, jump_ms: i64) {
        let elapsed_ms = now.duration_since(self.anchor).as_secs_f64() * 1_000.0;
        #[allow(clippy::cast_precision_loss)]
        let jumped_ms = (jump_ms - self.jump_ms) as f64;
        self.anchor_ms = (self.anchor_ms + elapsed_ms * self.rate + jumped_ms).max(0.0);
        self.anchor = now;
        self.rate = rate;
        self.jump_ms = jump_ms;
    }
}

/// Reads `rate=R jump_ms=J` (either may be missing); `None` when the file cannot be read or a
/// value is malformed.
fn read_script(path: &Path) -> Option<(f64, i64)> {
    let text = std::fs::read_to_string(path).ok()?;
    let mut rate = 1.0;
    let mut jump_ms = 0;
    for field in text.split_whitespace() {
        match field.split_once('=')? {
            ("rate", value) => rate = value.parse::<f64>().ok().filter(|r| *r >= 0.0)?,
            ("jump_ms", value) => jump_ms = value.parse().ok()?,
            _ => return None,
        }
    }
    Some((rate, jump_ms))
}

/// Notices gaps in the clock: see the module documentation.
#[derive(Debug, Default)]
pub struct GapWatch {
    state: Mutex<GapState>,
}

#[derive(Debug, Default)]
struct GapState {
    last_reading_ms: Option<u64>,
    /// A gap was seen since the leader last took [`GapWatch::take_gap`].
    pending: bool,
    gaps_total: u64,
}

impl GapWatch {
    /// Records a reading of the clock. Called by the pulse every [`PULSE`] and by the leader
    /// before each tick; returns whether the reading follows a gap.
    pub fn observe(&self, now_ms: u64) -> bool {
        let gap_ms = u64::try_from(GAP.as_millis()).unwrap_or(u64::MAX);
        let mut state = lock(&self.state);
        let gap = state.last_reading_ms.is_some_and(|last_ms| {
            now_ms.saturating_sub(last_ms) > gap_ms || last_ms.saturating_sub(now_ms) > gap_ms
        });
        if gap {
            let last_ms = state.last_reading_ms.unwrap_or_default();
            tracing::warn!(
                last_reading_ms = last_ms,
                now_ms,
                "the clock moved by {} ms between two readings meant to be {} ms apart: the \
                 process stalled or the clock jumped; the leader will refresh every session \
                 instead of expiring any on its next tick",
                i128::from(now_ms) - i128::from(last_ms),
                PULSE.as_millis()
            );
            state.pending = true;
            state.gaps_total += 1;
        }
        state.last_reading_ms = Some(now_ms);
        gap
    }

    /// Whether a gap was seen since the last call; clears it.
    pub fn take_gap(&self) -> bool {
        let mut state = lock(&self.state);
        std::mem::take(&mut state.pending)
    }

    /// Whether a gap was seen and not yet taken.
    pub fn gap_pending(&self) -> bool {
        lock(&self.state).pending
    }

    /// How many gaps this node has seen since it started.
    #[must_use]
    pub fn gaps_total(&self) -> u64 {
        lock(&self.state).gaps_total
    }
}

/// Reads the clock every [`PULSE`] until `shutdown` turns true, so a stall or a jump shows as a
/// gap between two readings. A gap wakes the leader's driver (`leader`), whose next entry is
/// then a `Refresh`, where it could otherwise sleep for half a second more. Safety does not
/// need it (no tick expires anyone before that refresh, however late), but written at once
/// it answers sooner the keepalives a forward jump made look overdue, and a dead session's
/// life is lengthened by the gap and no more.
pub async fn pulse(
    clock: &Clock,
    gaps: &GapWatch,
    leader: &tokio::sync::Notify,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    let mut interval = tokio::time::interval(PULSE);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = interval.tick() => {
                if gaps.observe(clock.now_ms()) {
                    leader.notify_one();
                }
            }
            _ = shutdown.changed() => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readings_a_pulse_apart_are_no_gap_but_a_stall_or_a_jump_either_way_is() {
        let gaps = GapWatch::default();
        assert!(!gaps.observe(1_000));
        assert!(!gaps.observe(1_100));
        assert!(!gaps.observe(1_600), "exactly the bound is still no gap");
        assert!(!gaps.take_gap());
        assert!(gaps.observe(2_101), "a reading past the bound follows a gap");
        assert!(gaps.observe(1_000), "so does a clock going back past the bound");
        assert!(gaps.take_gap());
        assert!(!gaps.take_gap(), "taking the gap clears it");
        assert_eq!(gaps.gaps_total(), 2);
    }

    #[test]
    fn a_script_reads_rate_and_jump_and_refuses_anything_else() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let path = dir.path().join("clock");
        std::fs::write(&path, "rate=1.5 jump_ms=-200\n").expect("written");
        assert_eq!(read_script(&path), Some((1.5, -200)));
        std::fs::write(&path, "jump_ms=8000").expect("written");
        assert_eq!(read_script(&path), Some((1.0, 8_000)));
        for bad in ["rate=fast", "speed=2", "rate=-1", "jump_ms"] {
            std::fs::write(&path, bad).expect("written");
            assert_eq!(read_script(&path), None, "{bad}");
        }
        assert_eq!(read_script(&dir.path().join("missing")), None);
    }

    #[test]
    fn a_new_rate_factor_applies_from_where_the_clock_was() {
        let mut correction = Correction { source_anchor_ms: 0.0, anchor_ms: 0.0, factor: 1.0 };
        assert!((correction.reading_ms(1_000.0) - 1_000.0).abs() < 1e-9);
        correction.rebase(1_000.0, 2.0);
        assert!((correction.reading_ms(1_000.0) - 1_000.0).abs() < 1e-9, "no jump at the change");
        assert!((correction.reading_ms(1_500.0) - 2_000.0).abs() < 1e-9, "twice as fast after");
        correction.rebase(1_500.0, 0.5);
        assert!((correction.reading_ms(2_500.0) - 2_500.0).abs() < 1e-9, "then half as fast");
    }

    #[test]
    fn a_scripted_clock_jumps_and_changes_rate_from_where_it_was() {
        let origin = Instant::now();
        let mut script = Script::new(PathBuf::from("unused"), origin);
        script.rebase(origin + Duration::from_millis(1_000), 2.0, 0);
        assert!((script.anchor_ms - 1_000.0).abs() < 1e-6, "rate 1 until the change");
        script.rebase(origin + Duration::from_millis(1_500), 2.0, 8_000);
        assert!((script.anchor_ms - 10_000.0).abs() < 1e-6, "1 s, then 0.5 s at rate 2, then +8 s");
        script.rebase(origin + Duration::from_millis(1_500), 2.0, -20_000);
        assert!(script.anchor_ms.abs() < 1e-6, "a jump back stops at zero");
    }
}
