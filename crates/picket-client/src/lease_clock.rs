//! The clock a client measures its lease by.
//!
//! Tokio's timers and `Instant` read `CLOCK_MONOTONIC`, which stops while the machine is
//! suspended. A laptop or a virtual machine suspended for an hour would wake up with its
//! monotonic clock a few seconds on from the last confirmed keepalive and believe its session
//! and grants still good, while the service expired them long ago. On Linux the lease is
//! therefore measured on `CLOCK_BOOTTIME`, which counts the suspension; elsewhere on the
//! monotonic clock. The keepalive loop still sleeps on tokio's timers (a timer per session is
//! all it can afford with many sessions), and checks the lease on this clock whenever it wakes,
//! at most a third of the TTL after the machine does; `Session::lost_reason` and
//! `Guard::lost_reason` check it on every call, so code that checks before it acts sees the loss
//! at once.

use std::time::Duration;

/// The clock's reading: time since some fixed point, including any suspension on Linux.
#[cfg(target_os = "linux")]
pub(crate) fn now() -> Duration {
    let reading = rustix::time::clock_gettime(rustix::time::ClockId::Boottime);
    let seconds = u64::try_from(reading.tv_sec).unwrap_or(0);
    let nanos = u32::try_from(reading.tv_nsec).unwrap_or(0);
    Duration::new(seconds, nanos)
}

/// The clock's reading: time since this process first read it.
#[cfg(not(target_os = "linux"))]
pub(crate) fn now() -> Duration {
    static ORIGIN: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    ORIGIN.get_or_init(std::time::Instant::now).elapsed()
}

/// A random nonzero number naming this process's lease clock to the service: each keepalive
/// carries it with a reading of the clock, so the leader can tell whether the two clocks run at
/// the same rate and, where they do not, keep the session alive for its TTL by this clock (the
/// one the lease is counted on here).
pub(crate) fn clock_id() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    static ID: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *ID.get_or_init(|| {
        let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
        hasher.write_u32(std::process::id());
        hasher.finish().max(1)
    })
}

/// When a session's lease runs out on this clock, in nanoseconds of its reading; kept in an
/// atomic so a check on any thread needs no lock.
#[derive(Debug)]
pub(crate) struct LeaseEnd {
    end_ns: std::sync::atomic::AtomicU64,
}

impl LeaseEnd {
    /// A lease running out at `end`.
    pub(crate) fn new(end: Duration) -> Self {
        Self { end_ns: std::sync::atomic::AtomicU64::new(as_ns(end)) }
    }

    /// Moves the end to `end`, never back.
    pub(crate) fn extend_to(&self, end: Duration) {
        self.end_ns.fetch_max(as_ns(end), std::sync::atomic::Ordering::AcqRel);
    }

    /// How long the lease has left at reading `now`; zero once it ran out.
    pub(crate) fn remaining(&self, now: Duration) -> Duration {
        let end_ns = self.end_ns.load(std::sync::atomic::Ordering::Acquire);
        Duration::from_nanos(end_ns.saturating_sub(as_ns(now)))
    }

    /// Whether the lease ran out at reading `now`.
    pub(crate) fn ran_out(&self, now: Duration) -> bool {
        as_ns(now) >= self.end_ns.load(std::sync::atomic::Ordering::Acquire)
    }
}

fn as_ns(reading: Duration) -> u64 {
    u64::try_from(reading.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_clock_runs_forward() {
        let first = now();
        std::thread::sleep(Duration::from_millis(5));
        assert!(now() >= first + Duration::from_millis(5));
    }

    #[test]
    fn a_lease_runs_out_at_its_end_and_only_moves_forward() {
        let lease = LeaseEnd::new(Duration::from_secs(10));
        assert!(!lease.ran_out(Duration::from_millis(9_999)));
        assert!(lease.ran_out(Duration::from_secs(10)));
        lease.extend_to(Duration::from_secs(12));
        assert!(!lease.ran_out(Duration::from_secs(11)));
        lease.extend_to(Duration::from_secs(11));
        assert!(!lease.ran_out(Duration::from_millis(11_500)), "an older end does not shorten it");
        assert_eq!(lease.remaining(Duration::from_secs(9)), Duration::from_secs(3));
        assert_eq!(lease.remaining(Duration::from_secs(13)), Duration::ZERO);
    }
}
