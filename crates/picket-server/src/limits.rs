//! Bounds on what one node holds for its clients, beside the replicated `picket_core::Limits`.
//!
//! The core's limits bound the lock state and are the same on every replica. These bound a
//! node's own resources: they may differ from node to node, and refusing for them changes no
//! state. A request over a bound gets 429 (gRPC `RESOURCE_EXHAUSTED`) with a code naming it.

use picket_core::ErrorCode;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// A node's own bounds. See the fields for the defaults.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerLimits {
    /// Most watch streams open on this node at once (default 10,000). Each holds a buffer of
    /// events and a place in the fan-out of every applied command.
    pub max_watch_streams: usize,
    /// Most places this node's watches of sessions hold in all (default 2,000,000): a watch of
    /// one session holds one, a watch of a set one for each session it names (each counted
    /// once) that has not ended, or one if every session of the set has. A session's place
    /// comes back when it ends, unless it is the last its stream follows, and every place of a
    /// stream when the node drops the stream (one that fell behind, at its next read or when
    /// its connection closes). One stream
    /// may follow 10,000 sessions, so without this bound `max_watch_streams` such streams
    /// could hold 10⁸ places in the fan-out of applied commands, gigabytes of memory (found in
    /// review). Keep it well above `max_sessions`: the Rust client follows each of its
    /// sessions, and for a moment twice while it merges its streams.
    pub max_watched_sessions: usize,
    /// Most acquire requests in flight on this node at once, waiting ones included (default
    /// 100,000). Each holds a registration for its outcome until it is answered; one whose
    /// caller went away before its answer, or whose outcome is unknown, holds its place until
    /// its abandonment ends (at most about 30 s), so callers that give up at once cannot pile
    /// abandonments up without bound. While no leader can commit, acquires retried that often
    /// may find the bound full (429) rather than get 503.
    pub max_pending_acquires: usize,
    /// Most connections open on this node's client port at once (default 10,000), peers'
    /// included unless they have a port of their own (`ServerConfig::peer_listen`). Past it the
    /// node stops accepting until one closes; see `listener.rs`.
    pub max_connections: usize,
    /// Most connections open on this node's client port at once from one IP address (default
    /// 1,000): past it, a further connection from that address is closed as soon as it is
    /// accepted, so one client host cannot take every place of `max_connections`.
    pub max_connections_per_ip: usize,
    /// Most connections open on this node's peer port at once, when it has one (default 256).
    /// A peer holds a few (replication, votes, clock readings); clients never count here, so a
    /// flood of clients cannot keep a peer from reaching this node.
    pub max_peer_connections: usize,
    /// How long a connection may stay open with no request or stream open (default 5 min);
    /// then it is closed gracefully. Bounds in time the place an idle connection holds.
    pub idle_connection_timeout: Duration,
    /// Largest HTTP request body this node reads (default 64 KiB); a larger one gets 413
    /// `body_too_large`.
    pub max_http_body_bytes: usize,
    /// Largest gRPC request message this node decodes (default 128 KiB); a larger one gets
    /// `RESOURCE_EXHAUSTED`.
    pub max_grpc_message_bytes: usize,
    /// Most bytes of request bodies this node reads at once, over all its connections
    /// (default 64 MiB). Each HTTP/JSON or gRPC request whose body has not arrived with its
    /// headers takes what its body may hold (its `Content-Length` up to
    /// `max_http_body_bytes`, or a gRPC message's bound `max_grpc_message_bytes`, for which
    /// the decoder reserves a message's declared length) until its body has been read; past
    /// the bound a request gets 429 `too_many_request_bodies`. A request's body normally
    /// arrives with it and is read at once, so only bodies still on their way hold places:
    /// the bound keeps clients that declare bodies and then trickle them (each for at most
    /// the body deadline, 10 s) from holding more memory than this, whatever the connections
    /// and streams they open. One client host (an IPv4 address or an IPv6 /64) may hold a
    /// quarter of it, so must fit a body of each bound: a node refuses to start with less
    /// than four times the larger of `max_grpc_message_bytes` + 5 and `max_http_body_bytes`.
    pub max_body_bytes_in_flight: usize,
    /// Most streams (requests and watch streams) open at once on one HTTP/2 connection
    /// (default 200); a client past it waits for one to end.
    pub max_streams_per_connection: u32,
    /// The limits of the lock state this node sets (none by default). Unlike the bounds above
    /// they are replicated: while it leads, this node writes them into the state (a
    /// `SetLimits` entry), and every replica enforces what the state holds. A node that sets
    /// none leaves the state's limits as they are; nodes that set different ones change them
    /// with every change of leader, so give every node the same.
    pub replicated: LimitOverrides,
}

/// The lock state's limits a node sets; `None` leaves the state's own.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LimitOverrides {
    /// `Limits::max_sessions`.
    pub max_sessions: Option<usize>,
    /// `Limits::max_locks`.
    pub max_locks: Option<usize>,
    /// `Limits::max_locks_per_session`.
    pub max_locks_per_session: Option<usize>,
    /// `Limits::max_waiters_per_lock`.
    pub max_waiters_per_lock: Option<usize>,
    /// `Limits::max_renewals_per_tick`.
    pub max_renewals_per_tick: Option<usize>,
    /// `Limits::max_name_bytes`.
    pub max_name_bytes: Option<usize>,
    /// `Limits::min_ttl_ms`.
    pub min_ttl_ms: Option<u64>,
    /// `Limits::max_ttl_ms`.
    pub max_ttl_ms: Option<u64>,
    /// `Limits::max_lock_delay_ms`.
    pub max_lock_delay_ms: Option<u64>,
    /// `Limits::max_wait_ms`.
    pub max_wait_ms: Option<u64>,
    /// `Limits::max_list`.
    pub max_list: Option<usize>,
}

impl LimitOverrides {
    /// `limits` with the ones set here replaced.
    #[must_use]
    pub fn applied_to(&self, limits: &picket_core::Limits) -> picket_core::Limits {
        picket_core::Limits {
            max_sessions: self.max_sessions.unwrap_or(limits.max_sessions),
            max_locks: self.max_locks.unwrap_or(limits.max_locks),
            max_locks_per_session: self
                .max_locks_per_session
                .unwrap_or(limits.max_locks_per_session),
            max_waiters_per_lock: self.max_waiters_per_lock.unwrap_or(limits.max_waiters_per_lock),
            max_renewals_per_tick: self
                .max_renewals_per_tick
                .unwrap_or(limits.max_renewals_per_tick),
            max_name_bytes: self.max_name_bytes.unwrap_or(limits.max_name_bytes),
            min_ttl_ms: self.min_ttl_ms.unwrap_or(limits.min_ttl_ms),
            max_ttl_ms: self.max_ttl_ms.unwrap_or(limits.max_ttl_ms),
            max_lock_delay_ms: self.max_lock_delay_ms.unwrap_or(limits.max_lock_delay_ms),
            max_wait_ms: self.max_wait_ms.unwrap_or(limits.max_wait_ms),
            max_list: self.max_list.unwrap_or(limits.max_list),
            ..limits.clone()
        }
    }
}

impl ServerLimits {
    /// The largest `max_connections` a node takes, far above what one process's open files
    /// allow (the accept loop counts places in a `u32`).
    pub const MOST_CONNECTIONS: usize = 1 << 20;
    /// [`Self::MOST_CONNECTIONS`] for a flag's parser.
    pub const MOST_CONNECTIONS_BOUND: u64 = 1 << 20;
    /// The smallest request bound a node takes: every request the API defines with a name of
    /// the default length fits well within it.
    pub const LEAST_REQUEST_BYTES: u64 = 4 * 1024;
    /// The largest request bound a node takes (the log's entries stay far below their own
    /// bound whatever a request holds, since the limits bound every command).
    pub const MOST_REQUEST_BYTES: u64 = 16 * 1024 * 1024;
    /// The least `max_body_bytes_in_flight` a node takes.
    pub const LEAST_BODY_BYTES_IN_FLIGHT: u64 = 64 * 1024;
    /// The most `max_body_bytes_in_flight` a node takes (1 TiB, far above any memory it has).
    pub const MOST_BODY_BYTES_IN_FLIGHT: u64 = 1 << 40;
    /// The most streams per connection a node takes.
    pub const MOST_STREAMS_PER_CONNECTION: u64 = 10_000;
    /// The most places for watched sessions a node takes (far above any memory it would have
    /// for them).
    pub const MOST_WATCHED_SESSIONS: u64 = 1 << 30;
}

impl Default for ServerLimits {
    fn default() -> Self {
        Self {
            max_watch_streams: 10_000,
            max_watched_sessions: 2_000_000,
            max_pending_acquires: 100_000,
            max_connections: 10_000,
            max_connections_per_ip: 1_000,
            max_peer_connections: 256,
            idle_connection_timeout: Duration::from_secs(300),
            max_http_body_bytes: 64 * 1024,
            max_grpc_message_bytes: 128 * 1024,
            max_body_bytes_in_flight: 64 * 1024 * 1024,
            max_streams_per_connection: 200,
            replicated: LimitOverrides::default(),
        }
    }
}

/// Which of a node's bounds a request ran into.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ServerLimit {
    /// [`ServerLimits::max_watch_streams`].
    WatchStreams,
    /// [`ServerLimits::max_pending_acquires`].
    PendingAcquires,
    /// [`ServerLimits::max_watched_sessions`].
    WatchedSessions,
    /// [`ServerLimits::max_body_bytes_in_flight`].
    BodyBytesInFlight,
    /// One client host's share of [`ServerLimits::max_body_bytes_in_flight`].
    BodyBytesInFlightPerHost,
    /// Backups under way on a node: one at a time.
    Backups,
}

impl ServerLimit {
    /// The stable code on the wire.
    #[must_use]
    pub fn code(self) -> ErrorCode {
        match self {
            Self::WatchStreams => ErrorCode::TooManyWatchStreams,
            Self::PendingAcquires => ErrorCode::TooManyPendingAcquires,
            Self::WatchedSessions => ErrorCode::TooManyWatchedSessions,
            Self::BodyBytesInFlight | Self::BodyBytesInFlightPerHost => {
                ErrorCode::TooManyRequestBodies
            }
            Self::Backups => ErrorCode::TooManyBackups,
        }
    }

    /// What the bound is, for a person.
    #[must_use]
    pub fn what(self) -> &'static str {
        match self {
            Self::WatchStreams => "watch streams open on this node (--max-watch-streams)",
            Self::PendingAcquires => {
                "acquire requests in flight on this node (--max-pending-acquires)"
            }
            Self::WatchedSessions => "sessions followed by its watches (--max-watched-sessions)",
            Self::BodyBytesInFlight => {
                "bytes of request bodies on their way to it (--max-body-bytes-in-flight)"
            }
            Self::BodyBytesInFlightPerHost => {
                "bytes of request bodies on their way to it from this client's host (a quarter of \
                 --max-body-bytes-in-flight)"
            }
            Self::Backups => "backup under way (one at a time)",
        }
    }
}

/// Counts one kind of resource against its bound; a permit gives its place back when dropped.
#[derive(Debug)]
pub(crate) struct Budget {
    limit: ServerLimit,
    max: usize,
    permits: Arc<Semaphore>,
}

impl Budget {
    pub(crate) fn new(limit: ServerLimit, max: usize) -> Self {
        Self { limit, max, permits: Arc::new(Semaphore::new(max)) }
    }

    /// How many places are taken.
    pub(crate) fn taken(&self) -> usize {
        self.max.saturating_sub(self.permits.available_permits())
    }

    /// Takes a place, or says which bound is full.
    pub(crate) fn take(&self) -> Result<OwnedSemaphorePermit, crate::ServiceError> {
        self.take_many(1)
    }

    /// Takes `count` places at once, or none and says which bound is full.
    pub(crate) fn take_many(
        &self,
        count: u32,
    ) -> Result<OwnedSemaphorePermit, crate::ServiceError> {
        self.permits
            .clone()
            .try_acquire_many_owned(count)
            .map_err(|_| crate::ServiceError::Exhausted { limit: self.limit, max: self.max })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_budget_refuses_past_its_bound_and_takes_back_a_dropped_place() {
        let budget = Budget::new(ServerLimit::WatchStreams, 2);
        let first = budget.take().expect("a place");
        let _second = budget.take().expect("a place");
        let refused = budget.take().expect_err("full");
        assert_eq!(refused.code(), ErrorCode::TooManyWatchStreams);
        assert_eq!(refused.http_status(), 429);
        drop(first);
        assert!(budget.take().is_ok(), "a dropped permit frees its place");
    }
}
