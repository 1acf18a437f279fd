//! Audit lines of refusals, bounded: a caller's names are shown cut short, and refusals are
//! logged at most [`REFUSALS_PER_SECOND`] a second of each kind (callers who proved nothing,
//! and authenticated principals), the rest counted into the next line of the kind.
//!
//! Every refused authentication and every refused role logged a line, with the whole name the
//! request gave. Role checks come before a name's own bound is checked, so one request could
//! put a name of up to a request body's bound (128 KiB) into the log, and a client without
//! credentials could write lines as fast as it could send requests.

use std::fmt;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Most refusals logged in one second; the rest are counted.
pub(crate) const REFUSALS_PER_SECOND: u32 = 20;

/// Most bytes of a caller's name a refusal shows.
const SHOWN_NAME_BYTES: usize = 64;

/// A name a caller sent, shown quoted and cut to [`SHOWN_NAME_BYTES`] (at a character's
/// boundary), with its length when cut.
pub(crate) struct Shown<'a>(pub &'a str);

impl fmt::Display for Shown<'_> {
    fn fmt(&self, out: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = self.0;
        if name.len() <= SHOWN_NAME_BYTES {
            return write!(out, "{name:?}");
        }
        let cut = (0..=SHOWN_NAME_BYTES).rev().find(|at| name.is_char_boundary(*at)).unwrap_or(0);
        write!(out, "{:?}… ({} bytes in all)", &name[..cut], name.len())
    }
}

/// Counts refusals against [`REFUSALS_PER_SECOND`].
#[derive(Debug, Default)]
pub(crate) struct RefusalLog {
    window: Mutex<Window>,
}

#[derive(Debug, Default)]
struct Window {
    started: Option<Instant>,
    logged: u32,
    /// Refusals not logged since the last line.
    unlogged: u64,
}

impl RefusalLog {
    /// Whether a refusal at `now` is logged: `Some` with how many were not since the last
    /// one that was, `None` when this one is only counted.
    pub(crate) fn admit(&self, now: Instant) -> Option<u64> {
        let mut window = self.window.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let fresh = window
            .started
            .is_none_or(|started| now.saturating_duration_since(started) >= Duration::from_secs(1));
        if fresh {
            window.started = Some(now);
            window.logged = 0;
        }
        if window.logged >= REFUSALS_PER_SECOND {
            window.unlogged += 1;
            return None;
        }
        window.logged += 1;
        Some(std::mem::take(&mut window.unlogged))
    }
}

impl RefusalLog {
    const fn new() -> Self {
        Self { window: Mutex::new(Window { started: None, logged: 0, unlogged: 0 }) }
    }
}

/// Refusals of callers who proved nothing (refused authentications, Raft messages from
/// connections that are not a member's): anyone who reaches the port can cause them.
pub(crate) static UNPROVEN: RefusalLog = RefusalLog::new();

/// Refusals of authenticated principals (a role that does not cover what they asked), kept
/// apart so that a flood of the first kind does not hide them.
pub(crate) static PRINCIPALS: RefusalLog = RefusalLog::new();

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_name_is_shown_cut_with_its_length_and_a_short_one_whole() {
        assert_eq!(Shown("orders/42").to_string(), "\"orders/42\"");
        let long = "é".repeat(100);
        let shown = Shown(&long).to_string();
        assert!(shown.ends_with("… (200 bytes in all)"), "{shown}");
        assert_eq!(shown, format!("{:?}… (200 bytes in all)", "é".repeat(32)));
    }

    #[test]
    fn refusals_past_the_rate_are_counted_into_the_next_line() {
        let log = RefusalLog::default();
        let start = Instant::now();
        for _ in 0..REFUSALS_PER_SECOND {
            assert_eq!(log.admit(start), Some(0));
        }
        for _ in 0..5 {
            assert_eq!(log.admit(start + Duration::from_millis(999)), None);
        }
        assert_eq!(log.admit(start + Duration::from_secs(1)), Some(5), "told of the five");
        assert_eq!(log.admit(start + Duration::from_secs(1)), Some(0));
    }
}
