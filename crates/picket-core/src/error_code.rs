//! The stable codes of Picket's API.
//!
//! Every refusal a node sends carries one: on gRPC in the `picket-error-code` metadata, over
//! HTTP as the body's `code`. Servers make them from this enum and the Rust client parses them
//! back into it, so both sides share one vocabulary that the compiler checks; the strings are
//! what other clients match on, and they never change (the README's error table lists them).

/// A stable code of Picket's API. Codes a newer server sends that this build does not know
/// parse to `None` ([`ErrorCode::from_wire`]); callers then have the message to go on.
///
/// A new variant takes its row in `WIRE` at the same place; one added last must also be named
/// in the table test's count of variants.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorCode {
    // Refusals of the state machine (`CommandError`).
    /// The session does not exist (expired, closed, revoked, or never opened).
    UnknownSession,
    /// The lock name is not valid.
    InvalidName,
    /// The session TTL is out of range.
    TtlOutOfRange,
    /// The lock-delay is out of range.
    LockDelayOutOfRange,
    /// The wait is longer than the longest allowed.
    WaitOutOfRange,
    /// The session's owner is not valid.
    InvalidOwner,
    /// The caller may not do this (another principal's session, or a role without the right).
    PermissionDenied,
    /// The cluster holds as many sessions as it may.
    TooManySessions,
    /// The cluster holds as many locks as it may.
    TooManyLocks,
    /// The session holds or waits for as many locks as it may.
    TooManyLocksForSession,
    /// The lock has as many waiters as it may.
    TooManyWaiters,
    /// The lock is held by another session (a try).
    LockBusy,
    /// The lock is free but within its lock-delay after a holder was lost.
    LockDelayed,
    /// The session does not hold the lock.
    NotHeld,
    /// The lock is held under another token.
    TokenMismatch,
    /// The session does not wait for the lock.
    NotWaiting,
    /// The session already waits for the lock under another request.
    AlreadyWaiting,
    /// This attempt of the request was already abandoned.
    RequestAbandoned,
    /// An abandon found nothing of its request (nodes of an earlier build only).
    NothingToAbandon,
    /// The log asks for apply rules this build does not know.
    UnknownApplyRules,
    /// A tick carried more renewals than one tick may.
    TooManyRenewals,
    /// Every revision has been used (a damaged snapshot): the state accepts no command.
    RevisionsExhausted,
    /// The leader's new limits were refused (never sent to clients: the leader only logs it).
    LimitsRefused,
    /// An entry's command needs newer apply rules than it was written under (never sent to
    /// clients: only the leader writes such commands, and it waits for the rules).
    OlderApplyRules,
    /// The leader's naming of the cluster was refused: the state is named already, or the name
    /// is malformed (never sent to clients: only the leader writes it, and only the first
    /// naming counts).
    ClusterNameRefused,
    // Refusals of the node.
    /// This node does not lead; the leader's address comes with it when known.
    NotLeader,
    /// A bounded wait ended without the lock.
    WaitTimedOut,
    /// A wait ended without the lock for another reason (cancelled, session gone).
    WaitEnded,
    /// The node lost track of the wait (it stopped leading): its outcome is unknown.
    WaitUntracked,
    /// No leader can serve now (an election, no quorum): retry later.
    Unavailable,
    /// The request may or may not have been applied: read the state before retrying.
    OutcomeUnknown,
    /// The request is malformed.
    BadRequest,
    /// The node is shutting down.
    Stopped,
    /// The request carries no valid credentials.
    Unauthenticated,
    /// The node has as many watch streams open as it may.
    TooManyWatchStreams,
    /// The node's watches already follow as many sessions as it may.
    TooManyWatchedSessions,
    /// The node has as many acquires in flight as it may.
    TooManyPendingAcquires,
    /// A Raft message sent to the client port of a node that serves peers on a port of its own.
    PeerPortElsewhere,
    /// A client request sent to a node's peer port.
    PeerPort,
    /// No such HTTP endpoint.
    NotFound,
    /// The HTTP endpoint does not take this method.
    MethodNotAllowed,
    /// The request body is over its limit.
    BodyTooLarge,
    /// A browser request from another site, refused.
    CrossSiteRequest,
    /// The request expects another cluster than the node's (`picket-expect-cluster`).
    OtherCluster,
    // Made by the Rust client, never sent by a node.
    /// A backup stream ended before its last chunk.
    BackupIncomplete,
    /// A new grant could not be registered with a fence, so it was released.
    FenceRegistrationFailed,
    /// The node is already reading as many bytes of request bodies as it may.
    TooManyRequestBodies,
    /// The node is already taking a backup (one at a time).
    TooManyBackups,
    /// A voter's removal was refused: a majority of the voters now, or of those left, has not
    /// answered the leader within a leader lease. Bring them back, then retry.
    VotersNotAnswering,
}

/// Every code with its wire string, in one place, so the two directions cannot disagree; in the
/// order the variants are declared, so `as_str` reads its row directly.
const WIRE: &[(ErrorCode, &str)] = &[
    (ErrorCode::UnknownSession, "unknown_session"),
    (ErrorCode::InvalidName, "invalid_name"),
    (ErrorCode::TtlOutOfRange, "ttl_out_of_range"),
    (ErrorCode::LockDelayOutOfRange, "lock_delay_out_of_range"),
    (ErrorCode::WaitOutOfRange, "wait_out_of_range"),
    (ErrorCode::InvalidOwner, "invalid_owner"),
    (ErrorCode::PermissionDenied, "permission_denied"),
    (ErrorCode::TooManySessions, "too_many_sessions"),
    (ErrorCode::TooManyLocks, "too_many_locks"),
    (ErrorCode::TooManyLocksForSession, "too_many_locks_for_session"),
    (ErrorCode::TooManyWaiters, "too_many_waiters"),
    (ErrorCode::LockBusy, "lock_busy"),
    (ErrorCode::LockDelayed, "lock_delayed"),
    (ErrorCode::NotHeld, "not_held"),
    (ErrorCode::TokenMismatch, "token_mismatch"),
    (ErrorCode::NotWaiting, "not_waiting"),
    (ErrorCode::AlreadyWaiting, "already_waiting"),
    (ErrorCode::RequestAbandoned, "request_abandoned"),
    (ErrorCode::NothingToAbandon, "nothing_to_abandon"),
    (ErrorCode::UnknownApplyRules, "unknown_apply_rules"),
    (ErrorCode::TooManyRenewals, "too_many_renewals"),
    (ErrorCode::RevisionsExhausted, "revisions_exhausted"),
    (ErrorCode::LimitsRefused, "limits_refused"),
    (ErrorCode::OlderApplyRules, "older_apply_rules"),
    (ErrorCode::ClusterNameRefused, "cluster_name_refused"),
    (ErrorCode::NotLeader, "not_leader"),
    (ErrorCode::WaitTimedOut, "wait_timed_out"),
    (ErrorCode::WaitEnded, "wait_ended"),
    (ErrorCode::WaitUntracked, "wait_untracked"),
    (ErrorCode::Unavailable, "unavailable"),
    (ErrorCode::OutcomeUnknown, "outcome_unknown"),
    (ErrorCode::BadRequest, "bad_request"),
    (ErrorCode::Stopped, "stopped"),
    (ErrorCode::Unauthenticated, "unauthenticated"),
    (ErrorCode::TooManyWatchStreams, "too_many_watch_streams"),
    (ErrorCode::TooManyWatchedSessions, "too_many_watched_sessions"),
    (ErrorCode::TooManyPendingAcquires, "too_many_pending_acquires"),
    (ErrorCode::PeerPortElsewhere, "peer_port_elsewhere"),
    (ErrorCode::PeerPort, "peer_port"),
    (ErrorCode::NotFound, "not_found"),
    (ErrorCode::MethodNotAllowed, "method_not_allowed"),
    (ErrorCode::BodyTooLarge, "body_too_large"),
    (ErrorCode::CrossSiteRequest, "cross_site_request"),
    (ErrorCode::OtherCluster, "other_cluster"),
    (ErrorCode::BackupIncomplete, "backup_incomplete"),
    (ErrorCode::FenceRegistrationFailed, "fence_registration_failed"),
    (ErrorCode::TooManyRequestBodies, "too_many_request_bodies"),
    (ErrorCode::TooManyBackups, "too_many_backups"),
    (ErrorCode::VotersNotAnswering, "voters_not_answering"),
];

impl ErrorCode {
    /// The code as it goes on the wire, e.g. `lock_busy`.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        // The table lists the variants in declaration order, so a variant's discriminant is
        // its row (checked by a test).
        WIRE[self as usize].1
    }

    /// The code a wire string names; `None` for a code this build does not know.
    #[must_use]
    pub fn from_wire(wire: &str) -> Option<Self> {
        WIRE.iter().find(|(_, known)| *known == wire).map(|(code, _)| *code)
    }
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every variant is in the table exactly once, at the row of its discriminant (where
    /// `as_str` reads it), and every wire string is distinct and snake_case, and reads back as
    /// its code.
    #[test]
    fn every_code_has_one_wire_string_that_reads_back() {
        let mut seen = std::collections::BTreeSet::new();
        for (row, (code, wire)) in WIRE.iter().enumerate() {
            assert_eq!(*code as usize, row, "{wire} is not at its variant's row");
            assert!(seen.insert(*wire), "{wire} twice");
            assert!(wire.bytes().all(|byte| byte.is_ascii_lowercase() || byte == b'_'), "{wire}");
            assert_eq!(ErrorCode::from_wire(wire), Some(*code));
            assert_eq!(code.as_str(), *wire);
        }
        // The last variant's discriminant is the count of variants: the table must hold each.
        let variants = ErrorCode::VotersNotAnswering as usize + 1;
        assert_eq!(WIRE.len(), variants, "a variant is missing from the table");
        assert_eq!(ErrorCode::from_wire("no_such_code"), None);
    }

    /// The README's error table is what users of other clients match on: every code is there.
    #[test]
    fn the_readme_lists_every_code() {
        let readme = include_str!("../../../README.md");
        for (_, wire) in WIRE {
            assert!(readme.contains(&format!("`{wire}`")), "the README does not list `{wire}`");
        }
    }
}
