//! Why the state machine refused a command.
//!
//! A refused command changes nothing: not the state, not the revision. Every variant names
//! what was wrong and, in its message, what the caller can do about it. [`CommandError::code`]
//! gives a stable machine-readable code that the APIs put on the wire.

use crate::error_code::ErrorCode;
use crate::types::{CancelCause, RequestId, SessionId};
use serde::{Deserialize, Serialize};
use thiserror::Error;

/// Why a lock name was refused.
#[derive(Clone, Debug, PartialEq, Eq, Error, Serialize, Deserialize)]
#[non_exhaustive]
pub enum NameError {
    /// The name has no characters.
    #[error("the lock name is empty: give the lock a name such as \"jobs/report\"")]
    Empty,
    /// The name is longer than the limit.
    #[error(
        "the lock name is {len_bytes} bytes long, over the limit of {max_bytes} bytes: use a shorter name"
    )]
    TooLong {
        /// Length of the refused name.
        len_bytes: usize,
        /// The limit.
        max_bytes: usize,
    },
    /// The name contains a control character.
    #[error(
        "the lock name contains a control character at byte {index_bytes}: use printable characters only"
    )]
    ControlCharacter {
        /// Where the first control character starts.
        index_bytes: usize,
    },
}

/// Why a command was refused. The state is unchanged after any of these.
#[derive(Clone, Debug, PartialEq, Eq, Error, Serialize, Deserialize)]
#[non_exhaustive]
pub enum CommandError {
    /// The session does not exist: it never did, it was closed, or it expired.
    #[error("session {session} does not exist (it expired or was closed): open a new session")]
    UnknownSession {
        /// The session named by the command.
        session: SessionId,
    },
    /// The lock name breaks a naming rule.
    #[error("invalid lock name: {0}")]
    InvalidName(NameError),
    /// The requested TTL is outside the allowed range.
    #[error(
        "a session TTL of {ttl_ms} ms is out of range: choose between {min_ttl_ms} and {max_ttl_ms} ms"
    )]
    TtlOutOfRange {
        /// The requested TTL.
        ttl_ms: u64,
        /// Shortest allowed.
        min_ttl_ms: u64,
        /// Longest allowed.
        max_ttl_ms: u64,
    },
    /// The requested lock-delay is longer than allowed.
    #[error(
        "a lock-delay of {lock_delay_ms} ms is too long: choose at most {max_lock_delay_ms} ms"
    )]
    LockDelayOutOfRange {
        /// The requested lock-delay.
        lock_delay_ms: u64,
        /// Longest allowed.
        max_lock_delay_ms: u64,
    },
    /// The requested wait is longer than allowed.
    #[error(
        "a wait of {wait_ms} ms is too long: wait at most {max_wait_ms} ms, or wait without a deadline"
    )]
    WaitOutOfRange {
        /// The requested wait.
        wait_ms: u64,
        /// Longest allowed.
        max_wait_ms: u64,
    },
    /// A session's owner is empty or too long.
    #[error(
        "a session owner's name of {owner_bytes} bytes is out of range: principals are named with 1 to {max_owner_bytes} bytes"
    )]
    InvalidOwner {
        /// The owner's length.
        owner_bytes: usize,
        /// The longest allowed.
        max_owner_bytes: usize,
    },
    /// The command's principal did not open the session it uses.
    #[error(
        "session {session} belongs to another principal: only the principal that opened it, or an admin, may use it"
    )]
    NotOwner {
        /// The session.
        session: SessionId,
    },
    /// The service already has as many sessions as it allows.
    #[error(
        "the service already has {max_sessions} sessions, its limit: close unused sessions or retry later"
    )]
    TooManySessions {
        /// The limit.
        max_sessions: usize,
    },
    /// The service already has as many lock records as it allows.
    #[error(
        "the service already has {max_locks} locks held, awaited or in lock-delay, its limit: release unused locks or retry later"
    )]
    TooManyLocks {
        /// The limit.
        max_locks: usize,
    },
    /// The session already holds or waits for as many locks as it may.
    #[error(
        "session {session} already holds or waits for {max_locks} locks, its limit: release some first"
    )]
    TooManyLocksForSession {
        /// The session.
        session: SessionId,
        /// The limit.
        max_locks: usize,
    },
    /// The lock's queue is full.
    #[error("lock {name:?} already has {max_waiters} waiters, its limit: retry later")]
    TooManyWaiters {
        /// The lock.
        name: String,
        /// The limit.
        max_waiters: usize,
    },
    /// A try-acquire found the lock held by another session.
    #[error(
        "lock {name:?} is held by another session with token {holder_token}: wait for it, or retry later"
    )]
    LockBusy {
        /// The lock.
        name: String,
        /// Token of the current grant.
        holder_token: u64,
    },
    /// A try-acquire found the lock free but inside its lock-delay after an expiry.
    #[error(
        "lock {name:?} is in its lock-delay after its holder's session ended, until {until_ms} ms: retry after that or wait"
    )]
    LockDelayed {
        /// The lock.
        name: String,
        /// When the delay ends, on the state machine's clock.
        until_ms: u64,
    },
    /// The session does not hold the lock it tried to release.
    #[error("session {session} does not hold lock {name:?}{}: it may have been released or lost with an expired session", holder_suffix(*.holder_token))]
    NotHeld {
        /// The lock.
        name: String,
        /// The session that tried.
        session: SessionId,
        /// Token of the current grant, if anyone holds the lock.
        holder_token: Option<u64>,
    },
    /// The session holds the lock, but under another token than the one presented.
    #[error(
        "lock {name:?} is held under token {current_token}, not {presented_token}: release with the token of the current grant"
    )]
    TokenMismatch {
        /// The lock.
        name: String,
        /// The token in the command.
        presented_token: u64,
        /// The token of the current grant.
        current_token: u64,
    },
    /// The session is not waiting for the lock it tried to cancel.
    #[error(
        "session {session} is not waiting for lock {name:?}: it may already have been granted it or timed out"
    )]
    NotWaiting {
        /// The lock.
        name: String,
        /// The session.
        session: SessionId,
    },
    /// The session already waits for the lock under another request.
    #[error(
        "session {session} already waits for lock {name:?} under request {waiting_request}: wait for that request's answer, cancel it, or retry it with its own request id"
    )]
    AlreadyWaiting {
        /// The lock.
        name: String,
        /// The session.
        session: SessionId,
        /// The request the session waits under.
        waiting_request: RequestId,
    },
    /// An attempt of an acquire request reached the log after the request was abandoned (its
    /// caller gave up on it or went away), so it does nothing.
    #[error(
        "request {request} of session {session} for lock {name:?} was abandoned before this attempt of it arrived: nothing was done; to ask for the lock again, send a new request"
    )]
    RequestAbandoned {
        /// The lock.
        name: String,
        /// The session.
        session: SessionId,
        /// The abandoned request.
        request: RequestId,
    },
    /// A retry of an acquire request whose wait already ended without a grant (apply rules 3):
    /// it gets the answer the wait ended with, not a second wait.
    #[error(
        "request {request} of session {session} for lock {name:?} already waited, and its wait ended ({}) without the lock: to ask for it again, send a new request",
        cause.as_str()
    )]
    WaitEnded {
        /// The lock.
        name: String,
        /// The session.
        session: SessionId,
        /// The request.
        request: RequestId,
        /// How the wait ended.
        cause: CancelCause,
        /// The token of the lock's current grant, if it is held: what the wait's own answer
        /// said when it timed out.
        holder_token: Option<u64>,
    },
    /// An abandon found nothing of its request: no wait and no grant. Only entries written
    /// under apply rules 0 are refused so; later ones are accepted and remembered.
    #[error(
        "session {session} neither waits for nor holds lock {name:?} under request {request}: nothing to undo"
    )]
    NothingToAbandon {
        /// The lock.
        name: String,
        /// The session.
        session: SessionId,
        /// The request.
        request: RequestId,
    },
    /// The entry was written under apply rules newer than this build knows.
    #[error(
        "this entry was written under apply rules {rules}, and this build knows up to {known}: run the same Picket version on every node"
    )]
    UnknownApplyRules {
        /// The entry's rules.
        rules: u32,
        /// The newest this build knows.
        known: u32,
    },
    /// Every revision has been used: no token above the last can be granted, so the state
    /// accepts no further command. No cluster counts that far (2^48 commands per restore epoch
    /// is 89 years at 100,000 a second); only a damaged or forged snapshot starts there.
    #[error(
        "every revision up to {revision} has been used, so no greater token can be granted: this state came from a damaged snapshot; restore a good backup into a new cluster"
    )]
    RevisionsExhausted {
        /// The revision reached.
        revision: u64,
    },
    /// A tick tried to renew more sessions than allowed.
    #[error("a tick tried to renew {count} sessions, over the limit of {max}: split the renewals")]
    TooManyRenewals {
        /// Renewals in the tick.
        count: usize,
        /// The limit.
        max: usize,
    },
    /// The command needs newer apply rules than its entry was written under: a leader must not
    /// write it until every member knows them (see [`crate::Command::oldest_rules`]).
    #[error(
        "this entry was written under apply rules {rules}, and its command needs {needs}: the leader waits until every member runs a build that knows them"
    )]
    OlderApplyRules {
        /// The entry's rules.
        rules: u32,
        /// The oldest rules its command may be written under.
        needs: u32,
    },
    /// New limits were refused: they contradict themselves, or the state holds more than they
    /// allow.
    #[error(
        "the new limits were refused ({reason}); the state keeps enforcing its current limits: fix the limit flags, or wait until enough has ended and the leader tries again"
    )]
    LimitsRefused {
        /// Which rule they break, or what in the state exceeds them.
        reason: String,
    },
    /// A naming of the cluster was refused: the state is named already under another name, or
    /// the name is not 32 lowercase hexadecimal digits.
    #[error(
        "the cluster cannot be named {proposed:?}: {reason}; only the first well-formed naming counts"
    )]
    ClusterNameRefused {
        /// The name the command carried.
        proposed: String,
        /// Why it was refused.
        reason: String,
    },
}

fn holder_suffix(holder_token: Option<u64>) -> String {
    match holder_token {
        Some(token) => format!(" (it is held under token {token})"),
        None => " (nobody holds it)".to_owned(),
    }
}

impl CommandError {
    /// A stable code for the wire: clients match on it, people read the message.
    #[must_use]
    pub fn code(&self) -> ErrorCode {
        match self {
            Self::UnknownSession { .. } => ErrorCode::UnknownSession,
            Self::InvalidName(_) => ErrorCode::InvalidName,
            Self::TtlOutOfRange { .. } => ErrorCode::TtlOutOfRange,
            Self::LockDelayOutOfRange { .. } => ErrorCode::LockDelayOutOfRange,
            Self::WaitOutOfRange { .. } => ErrorCode::WaitOutOfRange,
            Self::InvalidOwner { .. } => ErrorCode::InvalidOwner,
            Self::NotOwner { .. } => ErrorCode::PermissionDenied,
            Self::TooManySessions { .. } => ErrorCode::TooManySessions,
            Self::TooManyLocks { .. } => ErrorCode::TooManyLocks,
            Self::TooManyLocksForSession { .. } => ErrorCode::TooManyLocksForSession,
            Self::TooManyWaiters { .. } => ErrorCode::TooManyWaiters,
            Self::LockBusy { .. } => ErrorCode::LockBusy,
            Self::LockDelayed { .. } => ErrorCode::LockDelayed,
            Self::NotHeld { .. } => ErrorCode::NotHeld,
            Self::TokenMismatch { .. } => ErrorCode::TokenMismatch,
            Self::NotWaiting { .. } => ErrorCode::NotWaiting,
            Self::AlreadyWaiting { .. } => ErrorCode::AlreadyWaiting,
            Self::RequestAbandoned { .. } => ErrorCode::RequestAbandoned,
            Self::NothingToAbandon { .. } => ErrorCode::NothingToAbandon,
            Self::WaitEnded { cause: CancelCause::TimedOut, .. } => ErrorCode::WaitTimedOut,
            Self::WaitEnded { .. } => ErrorCode::WaitEnded,
            Self::UnknownApplyRules { .. } => ErrorCode::UnknownApplyRules,
            Self::TooManyRenewals { .. } => ErrorCode::TooManyRenewals,
            Self::RevisionsExhausted { .. } => ErrorCode::RevisionsExhausted,
            Self::LimitsRefused { .. } => ErrorCode::LimitsRefused,
            Self::OlderApplyRules { .. } => ErrorCode::OlderApplyRules,
            Self::ClusterNameRefused { .. } => ErrorCode::ClusterNameRefused,
        }
    }
}
