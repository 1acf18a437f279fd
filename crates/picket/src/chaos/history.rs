//! The history of a chaos run: every operation of every client as an invocation followed by its
//! completion (ok, fail or info), and every fault, on one clock shared by all processes.

use serde::{Deserialize, Serialize};

/// Nanoseconds on the machine's monotonic clock (`CLOCK_MONOTONIC`), which every process on
/// the machine reads alike, so events of different processes can be ordered in real time.
#[must_use]
pub fn now_ns() -> u64 {
    let time = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    let seconds = u64::try_from(time.tv_sec).unwrap_or(0);
    let nanos = u64::try_from(time.tv_nsec).unwrap_or(0);
    seconds.saturating_mul(1_000_000_000).saturating_add(nanos)
}

/// What a client did.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Op {
    /// Asked Picket for the lock.
    Acquire,
    /// Registered its new token with the store (fence on acquire).
    Register {
        /// The grant's token.
        token: u64,
    },
    /// Read the guarded list with its sequencer.
    Read {
        /// The grant's token.
        token: u64,
    },
    /// Wrote the list it read plus one new element.
    Write {
        /// The grant's token.
        token: u64,
        /// The element appended, unique in the run.
        element: String,
    },
    /// Released the lock.
    Release {
        /// The grant's token.
        token: u64,
    },
}

/// How an operation ended, or that it started.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Phase {
    /// It was sent.
    Invoke,
    /// It took effect.
    Ok {
        /// The token granted, for an acquire.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        token: Option<u64>,
        /// The session that holds the grant, for an acquire.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        session: Option<u64>,
        /// The value read, for a read.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        value: Option<String>,
    },
    /// It certainly did not take effect; `code` says why.
    Fail {
        /// The refusal's code.
        code: String,
    },
    /// Its outcome is unknown (a connection broke, a timeout).
    Info {
        /// What happened.
        detail: String,
    },
}

/// One line of the history.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    /// The client process, from 1; 0 is the nemesis.
    pub process: u32,
    /// When, on the shared monotonic clock.
    pub at_ns: u64,
    /// The operation (for the nemesis: none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub op: Option<Op>,
    /// Its phase (for the nemesis: none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<Phase>,
    /// For the nemesis: the fault, e.g. `leader_kill_quick node=2 down_ms=0`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fault: Option<String>,
    /// For a client: how long it counts on its session, reported each time a confirmed
    /// keepalive extends it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease: Option<Lease>,
}

/// A client's lease as the client counts on it: the session stays its own until `until_ns` (on
/// the shared clock), the TTL less the client's drift margin from the sending of its last
/// confirmed keepalive. Picket promises not to expire the session before then, so a lock the
/// session holds must not go to another session before then unless the holder released it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    /// The session.
    pub session: u64,
    /// The end of the lease, on the shared clock.
    pub until_ns: u64,
}

impl Event {
    /// A client's event now.
    #[must_use]
    pub fn client(process: u32, op: Op, phase: Phase) -> Self {
        Self {
            process,
            at_ns: now_ns(),
            op: Some(op),
            phase: Some(phase),
            fault: None,
            lease: None,
        }
    }

    /// A client's report of its lease now.
    #[must_use]
    pub fn lease(process: u32, lease: Lease) -> Self {
        Self { process, at_ns: now_ns(), op: None, phase: None, fault: None, lease: Some(lease) }
    }

    /// A fault now.
    #[must_use]
    pub fn fault(description: String) -> Self {
        Self {
            process: 0,
            at_ns: now_ns(),
            op: None,
            phase: None,
            fault: Some(description),
            lease: None,
        }
    }
}
