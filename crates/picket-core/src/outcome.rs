//! What applying a command produces: a response for the proposer and events for watchers.

use crate::error::CommandError;
use crate::types::{CancelCause, ReleaseCause, SessionEnd, SessionId};
use serde::{Deserialize, Serialize};

/// The result of applying one [`crate::Input`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Applied {
    /// The state's revision after the command. A refused command leaves it unchanged; an
    /// accepted one advances it by exactly one.
    pub revision: u64,
    /// The answer to the proposer.
    pub result: Result<Response, CommandError>,
    /// What changed, in the order it happened, for watchers and for waiting acquires. Empty
    /// when the command was refused.
    pub events: Vec<Event>,
}

/// The answer to an accepted command.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
#[non_exhaustive]
pub enum Response {
    /// A session was opened.
    SessionOpened {
        /// Its id.
        session: SessionId,
        /// Its TTL.
        ttl_ms: u64,
        /// When it expires without a keepalive, on the state machine's clock.
        deadline_ms: u64,
    },
    /// A session got a full TTL.
    KeptAlive {
        /// The session.
        session: SessionId,
        /// Its new deadline.
        deadline_ms: u64,
    },
    /// A session was closed or revoked.
    SessionEnded {
        /// The session.
        session: SessionId,
    },
    /// The lock is held by the session under `token`.
    Granted {
        /// The lock.
        name: String,
        /// The token of the grant.
        token: u64,
        /// True when the session already held the lock: this is the same grant, not a new one.
        already_held: bool,
    },
    /// The session waits in the lock's queue.
    Queued {
        /// The lock.
        name: String,
        /// How many waiters are ahead, 0 for the head of the queue.
        position: usize,
    },
    /// The lock was released.
    Released {
        /// The lock.
        name: String,
    },
    /// The wait was cancelled.
    Cancelled {
        /// The lock.
        name: String,
    },
    /// An abandoned request was undone.
    Abandoned {
        /// The lock.
        name: String,
        /// The token of the grant released, or `None` when a wait was cancelled.
        released_token: Option<u64>,
    },
    /// A tick was applied.
    Ticked,
    /// Every session, wait and lock-delay got its full duration again.
    Refreshed,
    /// The state enforces new limits from now on.
    LimitsSet,
    /// The cluster is named (or was named so already).
    ClusterNamed,
}

/// How a session's wait in a lock's queue ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
#[non_exhaustive]
pub enum WaitEnd {
    /// The waiter now holds the lock.
    Granted {
        /// The grant's token.
        token: u64,
    },
    /// The waiter left the queue without a grant.
    Cancelled {
        /// Why.
        cause: CancelCause,
    },
}

/// A change a watcher can see.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
#[non_exhaustive]
pub enum Event {
    /// A session now holds a lock.
    Granted {
        /// The lock.
        name: String,
        /// The new holder.
        session: SessionId,
        /// The grant's token.
        token: u64,
    },
    /// A grant ended.
    Released {
        /// The lock.
        name: String,
        /// The former holder.
        session: SessionId,
        /// The ended grant's token.
        token: u64,
        /// Why it ended.
        cause: ReleaseCause,
    },
    /// A session joined a lock's queue.
    Queued {
        /// The lock.
        name: String,
        /// The waiter.
        session: SessionId,
        /// Waiters ahead of it.
        position: usize,
    },
    /// A waiter left a lock's queue without a grant.
    Cancelled {
        /// The lock.
        name: String,
        /// The waiter.
        session: SessionId,
        /// Why.
        cause: CancelCause,
    },
    /// A session ended; its grants and waits ended just before, each with its own event.
    SessionEnded {
        /// The session.
        session: SessionId,
        /// How.
        cause: SessionEnd,
    },
}

impl Event {
    /// The lock this event is about, if any.
    #[must_use]
    pub fn lock_name(&self) -> Option<&str> {
        match self {
            Self::Granted { name, .. }
            | Self::Released { name, .. }
            | Self::Queued { name, .. }
            | Self::Cancelled { name, .. } => Some(name),
            Self::SessionEnded { .. } => None,
        }
    }

    /// The event's stable name on the wire (the watch event's `kind`).
    #[must_use]
    pub fn kind_name(&self) -> &'static str {
        match self {
            Self::Granted { .. } => "granted",
            Self::Released { .. } => "released",
            Self::Queued { .. } => "queued",
            Self::Cancelled { .. } => "cancelled",
            Self::SessionEnded { .. } => "session_ended",
        }
    }

    /// Why the grant, the wait or the session ended, by its stable name, for events that end
    /// something.
    #[must_use]
    pub fn cause_name(&self) -> Option<&'static str> {
        match self {
            Self::Released { cause, .. } => Some(cause.as_str()),
            Self::Cancelled { cause, .. } => Some(cause.as_str()),
            Self::SessionEnded { cause, .. } => Some(cause.as_str()),
            Self::Granted { .. } | Self::Queued { .. } => None,
        }
    }

    /// Whether this event takes from its session something it had, without the session asking:
    /// a grant ended by anything but the holder's own release (an expiry, a revocation, a close,
    /// an abandoned request), or the session itself ending. A client tells its holders of
    /// exactly these; grants, queueing and cancelled waits answer the session's own requests,
    /// and a wait cancelled because its session ended comes with that session's end.
    #[must_use]
    pub fn is_loss(&self) -> bool {
        match self {
            Self::Released { cause, .. } => *cause != ReleaseCause::Released,
            Self::SessionEnded { .. } => true,
            Self::Granted { .. } | Self::Queued { .. } | Self::Cancelled { .. } => false,
        }
    }

    /// How a wait ended, when this event ends one: the waiting session and lock, and the grant
    /// or the cancellation.
    #[must_use]
    pub fn wait_end(&self) -> Option<(SessionId, &str, WaitEnd)> {
        match self {
            Self::Granted { name, session, token } => {
                Some((*session, name, WaitEnd::Granted { token: *token }))
            }
            Self::Cancelled { name, session, cause } => {
                Some((*session, name, WaitEnd::Cancelled { cause: *cause }))
            }
            Self::Released { .. } | Self::Queued { .. } | Self::SessionEnded { .. } => None,
        }
    }

    /// The session this event is about.
    #[must_use]
    pub fn session(&self) -> SessionId {
        match self {
            Self::Granted { session, .. }
            | Self::Released { session, .. }
            | Self::Queued { session, .. }
            | Self::Cancelled { session, .. }
            | Self::SessionEnded { session, .. } => *session,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The one rule every client follows to tell a holder it lost its lock: only the holder's
    /// own release is not a loss; every other end of a grant, and every end of a session, is.
    #[test]
    fn a_loss_is_any_end_of_a_grant_or_session_but_the_holders_own_release() {
        let session = SessionId(1);
        for cause in ReleaseCause::ALL {
            let released = Event::Released { name: "x".into(), session, token: 3, cause };
            assert_eq!(released.is_loss(), cause != ReleaseCause::Released, "{cause:?}");
            assert_eq!(released.wait_end(), None);
        }
        for cause in SessionEnd::ALL {
            assert!(Event::SessionEnded { session, cause }.is_loss(), "{cause:?}");
        }
        for cause in CancelCause::ALL {
            let cancelled = Event::Cancelled { name: "x".into(), session, cause };
            assert!(!cancelled.is_loss(), "a wait's end answers the waiting request: {cause:?}");
            assert_eq!(cancelled.wait_end(), Some((session, "x", WaitEnd::Cancelled { cause })));
        }
        let granted = Event::Granted { name: "x".into(), session, token: 4 };
        assert!(!granted.is_loss());
        assert_eq!(granted.wait_end(), Some((session, "x", WaitEnd::Granted { token: 4 })));
        assert!(!Event::Queued { name: "x".into(), session, position: 0 }.is_loss());
    }
}
