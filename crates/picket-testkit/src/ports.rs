//! Loopback ports for servers whose address must be known before they start (a cluster's peer
//! list, a node restarted on the address it had).
//!
//! Asking the kernel for port 0 and closing the socket again is not enough: the port goes back to
//! the ephemeral range, and any outgoing connection on the machine (a test's client, a node's
//! peer link) may be given it before the server binds it. A CI run failed exactly so (`Address
//! already in use` starting a cluster node). The ports handed out here lie below the kernel's
//! ephemeral range, which it never gives to outgoing connections, and a cursor shared by the
//! whole process never hands out the same port twice while the range lasts.

use std::net::TcpListener;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};

/// The kernel's ephemeral range when `/proc` does not say (Linux's default).
const DEFAULT_EPHEMERAL_RANGE: (u16, u16) = (32_768, 60_999);

/// The lowest port handed out: above the well-known and the commonly registered service ports.
const LOWEST_PORT: u16 = 10_000;

/// Fewest ports the range outside the ephemeral one must hold to be used at all.
const MIN_RANGE_PORTS: u32 = 1_000;

/// Ports handed out so far by this process (each run of ports counts its length).
static HANDED_OUT: AtomicU32 = AtomicU32::new(0);

/// Where in the range this process starts handing out ports.
static START_OFFSET: OnceLock<u32> = OnceLock::new();

/// A loopback port that is free now and that no outgoing connection will be given.
///
/// # Panics
/// When no port can be bound.
#[must_use]
pub fn free_port() -> u16 {
    free_ports_in_a_row(1)
}

/// The first of `count` consecutive loopback ports, each free now and outside the ephemeral
/// range (a script that numbers its nodes' ports in a row needs them so).
///
/// # Panics
/// When `count` is 0, or no such run of ports can be bound.
#[must_use]
pub fn free_ports_in_a_row(count: u16) -> u16 {
    try_free_ports_in_a_row(count).unwrap_or_else(|error| panic!("{error}"))
}

/// Like [`free_ports_in_a_row`], for programs that report the failure instead of panicking.
///
/// # Errors
/// When `count` is 0, or no such run of ports can be bound.
pub fn try_free_ports_in_a_row(count: u16) -> std::io::Result<u16> {
    if count == 0 {
        return Err(std::io::Error::other("ask for at least one port"));
    }
    let Some((lowest, span)) = unclaimed_range() else {
        if count > 1 {
            return Err(std::io::Error::other(format!(
                "no port range outside the ephemeral one for {count} ports in a row; widen the \
                 room below net.ipv4.ip_local_port_range"
            )));
        }
        return Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port());
    };
    let count = u32::from(count);
    let start = *START_OFFSET.get_or_init(|| random_offset(span));
    for _ in 0..span / count {
        let offset = start.wrapping_add(HANDED_OUT.fetch_add(count, Ordering::Relaxed)) % span;
        if offset + count > span {
            continue;
        }
        let first = lowest + u16::try_from(offset).expect("an offset within the port range");
        let last = first + u16::try_from(count - 1).expect("a count within the port range");
        if (first..=last).all(bindable) {
            return Ok(first);
        }
    }
    Err(std::io::Error::new(
        std::io::ErrorKind::AddrInUse,
        format!(
            "no {count} free loopback ports in a row between {lowest} and {}",
            u32::from(lowest) + span - 1
        ),
    ))
}

/// The ports below the ephemeral range from [`LOWEST_PORT`] (or above it, where below is too
/// small), as its lowest port and its size; `None` when neither side has room.
fn unclaimed_range() -> Option<(u16, u32)> {
    let (ephemeral_low, ephemeral_high) = ephemeral_range();
    let below = u32::from(ephemeral_low).saturating_sub(u32::from(LOWEST_PORT));
    if below >= MIN_RANGE_PORTS {
        return Some((LOWEST_PORT, below));
    }
    let above = u32::from(u16::MAX) - u32::from(ephemeral_high);
    (above >= MIN_RANGE_PORTS).then(|| (ephemeral_high + 1, above))
}

fn ephemeral_range() -> (u16, u16) {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|text| {
            let mut bounds = text.split_whitespace().map(str::parse::<u16>);
            Some((bounds.next()?.ok()?, bounds.next()?.ok()?))
        })
        .filter(|(low, high)| low <= high)
        .unwrap_or(DEFAULT_EPHEMERAL_RANGE)
}

/// An offset into a range of `span` ports, from the process id and the time, so that two test
/// processes running at once start far apart.
fn random_offset(span: u32) -> u32 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.subsec_nanos());
    (std::process::id().wrapping_mul(7_919) ^ nanos) % span
}

fn bindable(port: u16) -> bool {
    TcpListener::bind(("127.0.0.1", port)).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn ports_lie_outside_the_ephemeral_range_and_are_never_handed_out_twice() {
        let (ephemeral_low, ephemeral_high) = ephemeral_range();
        let mut seen = HashSet::new();
        for _ in 0..200 {
            let port = free_port();
            assert!(
                !(ephemeral_low..=ephemeral_high).contains(&port),
                "{port} is in the ephemeral range {ephemeral_low}-{ephemeral_high}"
            );
            assert!(seen.insert(port), "{port} was handed out twice");
        }
    }

    #[test]
    fn a_run_of_ports_is_consecutive_and_bindable() {
        let first = free_ports_in_a_row(3);
        let listeners: Vec<TcpListener> = (first..first + 3)
            .map(|port| TcpListener::bind(("127.0.0.1", port)).expect("a port of the run binds"))
            .collect();
        assert_eq!(listeners.len(), 3);
        assert!(try_free_ports_in_a_row(0).is_err(), "a run of no ports is refused");
    }
}
