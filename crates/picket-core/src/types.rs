//! Small value types shared by commands, responses and queries.

use serde::{Deserialize, Serialize};
use std::fmt;

/// Identifies a session. It is the revision at which the session was opened, so ids are unique
/// for the life of the state, never reused, and carry no randomness.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct SessionId(pub u64);

impl fmt::Display for SessionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// Identifies one acquire request within its session, chosen by the client (or by the server
/// for a client that sends none). A retried request carries the same id, so the state machine
/// can tell a retry from a second request, and an abandoned request can be undone without
/// touching a grant that another request of the same session produced.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct RequestId(pub u64);

impl fmt::Display for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// How long an acquire may wait for a lock that is taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Wait {
    /// Never wait: grant now or refuse with [`crate::CommandError::LockBusy`].
    Try,
    /// Wait in the queue at most this long, then time out.
    For {
        /// The longest wait.
        wait_ms: u64,
    },
    /// Wait in the queue until granted, cancelled or the session ends.
    Forever,
}

impl Wait {
    /// The wait a request's `wait_ms` field asks for: absent waits until granted, a number
    /// waits at most that many milliseconds, and 0 only tries (waiting no time is trying).
    #[must_use]
    pub fn from_wait_ms(wait_ms: Option<u64>) -> Self {
        wait_ms.map_or(Self::Forever, |wait_ms| Self::For { wait_ms }).normalized()
    }

    /// The `wait_ms` field that asks for this wait: the inverse of [`Wait::from_wait_ms`].
    #[must_use]
    pub fn wait_ms(self) -> Option<u64> {
        match self.normalized() {
            Self::Try => Some(0),
            Self::For { wait_ms } => Some(wait_ms),
            Self::Forever => None,
        }
    }

    /// The same wait with waiting zero milliseconds written as trying, the one form the state
    /// machine decides on.
    #[must_use]
    pub fn normalized(self) -> Self {
        if self == (Self::For { wait_ms: 0 }) { Self::Try } else { self }
    }
}

/// Why a holder's grant ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReleaseCause {
    /// The holder released it.
    Released,
    /// The holder closed its session.
    SessionClosed,
    /// The holder's session expired.
    SessionExpired,
    /// An operator revoked the holder's session.
    SessionRevoked,
    /// The request that produced the grant was abandoned: its caller went away before it heard
    /// the answer, so nobody would have known it held the lock.
    Abandoned,
}

/// Why a waiter left a queue without being granted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CancelCause {
    /// The waiter cancelled.
    Requested,
    /// Its bounded wait ran out.
    TimedOut,
    /// The waiter closed its session.
    SessionClosed,
    /// The waiter's session expired.
    SessionExpired,
    /// An operator revoked the waiter's session.
    SessionRevoked,
    /// The waiting request was abandoned: its caller went away.
    Abandoned,
}

/// How a session ended. Expiry and revocation apply the session's lock-delay; a close by the
/// session's own client does not, because that client knows it has stopped writing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SessionEnd {
    /// Its client closed it.
    Closed,
    /// It was not kept alive.
    Expired,
    /// An operator revoked it.
    Revoked,
}

impl ReleaseCause {
    /// The cause's stable name on the wire (the watch event's `cause`); the same as its JSON.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Released => "released",
            Self::SessionClosed => "session_closed",
            Self::SessionExpired => "session_expired",
            Self::SessionRevoked => "session_revoked",
            Self::Abandoned => "abandoned",
        }
    }

    /// Every cause, for tables and tests.
    pub const ALL: [Self; 5] = [
        Self::Released,
        Self::SessionClosed,
        Self::SessionExpired,
        Self::SessionRevoked,
        Self::Abandoned,
    ];
}

impl CancelCause {
    /// The cause's stable name on the wire (the watch event's `cause`); the same as its JSON.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Requested => "requested",
            Self::TimedOut => "timed_out",
            Self::SessionClosed => "session_closed",
            Self::SessionExpired => "session_expired",
            Self::SessionRevoked => "session_revoked",
            Self::Abandoned => "abandoned",
        }
    }

    /// Every cause, for tables and tests.
    pub const ALL: [Self; 6] = [
        Self::Requested,
        Self::TimedOut,
        Self::SessionClosed,
        Self::SessionExpired,
        Self::SessionRevoked,
        Self::Abandoned,
    ];
}

impl SessionEnd {
    /// The ending's stable name on the wire (the watch event's `cause`); the same as its JSON.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Closed => "closed",
            Self::Expired => "expired",
            Self::Revoked => "revoked",
        }
    }

    /// Every ending, for tables and tests.
    pub const ALL: [Self; 3] = [Self::Closed, Self::Expired, Self::Revoked];

    pub(crate) fn release_cause(self) -> ReleaseCause {
        match self {
            Self::Closed => ReleaseCause::SessionClosed,
            Self::Expired => ReleaseCause::SessionExpired,
            Self::Revoked => ReleaseCause::SessionRevoked,
        }
    }

    pub(crate) fn cancel_cause(self) -> CancelCause {
        match self {
            Self::Closed => CancelCause::SessionClosed,
            Self::Expired => CancelCause::SessionExpired,
            Self::Revoked => CancelCause::SessionRevoked,
        }
    }

    pub(crate) fn applies_lock_delay(self) -> bool {
        !matches!(self, Self::Closed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The wire's `wait_ms` and the core's `Wait` say the same thing both ways: absent waits
    /// for ever, 0 tries, anything else waits that long.
    #[test]
    fn a_wait_goes_to_the_wire_and_back_unchanged() {
        assert_eq!(Wait::from_wait_ms(None), Wait::Forever);
        assert_eq!(Wait::from_wait_ms(Some(0)), Wait::Try);
        assert_eq!(Wait::from_wait_ms(Some(250)), Wait::For { wait_ms: 250 });
        for wait in
            [Wait::Try, Wait::Forever, Wait::For { wait_ms: 1 }, Wait::For { wait_ms: u64::MAX }]
        {
            assert_eq!(Wait::from_wait_ms(wait.wait_ms()), wait);
        }
        assert_eq!(Wait::For { wait_ms: 0 }.wait_ms(), Some(0));
        assert_eq!(Wait::For { wait_ms: 0 }.normalized(), Wait::Try);
    }

    /// The wire names are the JSON names, so the HTTP and gRPC watches and a stored event
    /// spell a cause alike.
    #[test]
    fn every_cause_is_named_on_the_wire_as_in_its_json() {
        let json = |value: serde_json::Value| value.as_str().expect("a string").to_owned();
        for cause in ReleaseCause::ALL {
            assert_eq!(cause.as_str(), json(serde_json::to_value(cause).unwrap()));
        }
        for cause in CancelCause::ALL {
            assert_eq!(cause.as_str(), json(serde_json::to_value(cause).unwrap()));
        }
        for end in SessionEnd::ALL {
            assert_eq!(end.as_str(), json(serde_json::to_value(end).unwrap()));
        }
    }
}
