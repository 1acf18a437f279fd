//! Errors a client of the service can see, with their stable codes and transport mappings.

use crate::raft_types::NodeId;
use picket_core::{CancelCause, CommandError, ErrorCode};
use thiserror::Error;

/// Why a request to the lock service failed.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum ServiceError {
    /// The state machine refused the command; nothing changed.
    #[error(transparent)]
    Command(#[from] CommandError),
    /// This node is not the leader.
    #[error("this node is not the leader{}: send the request to the leader", leader_suffix(.leader_id, .leader_addr))]
    NotLeader {
        /// The leader's id, if known.
        leader_id: Option<NodeId>,
        /// The leader's address, if known.
        leader_addr: Option<String>,
    },
    /// A bounded wait ran out before the lock was granted.
    #[error("timed out waiting for lock {name:?}{}: retry, or wait longer", holder_suffix(*.holder_token))]
    WaitTimedOut {
        /// The lock.
        name: String,
        /// The current holder's token, if the lock is held.
        holder_token: Option<u64>,
    },
    /// The wait ended without a grant for another reason.
    #[error("the wait for lock {name:?} ended without a grant ({}): {}", cause.as_str(), cancel_advice(*.cause))]
    WaitEnded {
        /// The lock.
        name: String,
        /// Why.
        cause: CancelCause,
    },
    /// The node stopped following this wait before it ended (it is shutting down): the wait
    /// is abandoned.
    #[error(
        "this node stopped following the wait for lock {name:?} (it is shutting down), so the wait was abandoned: acquire again"
    )]
    WaitUntracked {
        /// The lock.
        name: String,
    },
    /// The cluster cannot serve the request now (no quorum, election in progress).
    #[error("the cluster cannot serve this now ({0}): retry shortly")]
    Unavailable(String),
    /// A write may or may not have been applied (its leader lost leadership mid-way).
    #[error("the outcome is unknown ({0}): read the state before retrying")]
    OutcomeUnknown(String),
    /// The request itself is malformed.
    #[error("bad request: {0}")]
    BadRequest(String),
    /// The node is shutting down or its consensus engine stopped.
    #[error("this node has stopped serving ({0}): use another node")]
    Stopped(String),
    /// The request carries no valid credentials, and this node requires them.
    #[error("not authenticated: {0}")]
    Unauthenticated(String),
    /// The caller is authenticated but may not do this.
    #[error("permission denied: {0}")]
    PermissionDenied(String),
    /// The request expects another cluster than this node's.
    #[error(
        "this node belongs to cluster {own}, not to cluster {expected}, which the request expects: the client's endpoints name nodes of two clusters; give it only the nodes of one"
    )]
    OtherCluster {
        /// This node's cluster.
        own: String,
        /// The cluster the request expects.
        expected: String,
    },
    /// A voter's removal refused because a majority of the voters now, or of those left, has not
    /// answered the leader within a leader lease: made, it would stop every write until they do.
    #[error("the membership change was refused: {0}")]
    VotersNotAnswering(String),
    /// One of this node's own bounds is full.
    #[error("this node already has {max} {}: retry later, or use another node", .limit.what())]
    Exhausted {
        /// Which bound.
        limit: crate::limits::ServerLimit,
        /// Its value.
        max: usize,
    },
}

fn leader_suffix(leader_id: &Option<NodeId>, leader_addr: &Option<String>) -> String {
    match (leader_id, leader_addr) {
        (Some(id), Some(addr)) => format!("; the leader is node {id} at {addr}"),
        (Some(id), None) => format!("; the leader is node {id}"),
        _ => "; no leader is known yet, retry shortly".to_owned(),
    }
}

fn holder_suffix(holder_token: Option<u64>) -> String {
    holder_token.map_or_else(String::new, |token| format!(" (held under token {token})"))
}

fn cancel_advice(cause: CancelCause) -> &'static str {
    match cause {
        CancelCause::SessionExpired | CancelCause::SessionClosed | CancelCause::SessionRevoked => {
            "the session is gone, open a new one"
        }
        _ => "acquire again if you still need the lock",
    }
}

impl ServiceError {
    /// The stable code on the wire.
    #[must_use]
    pub fn code(&self) -> ErrorCode {
        match self {
            Self::Command(error) => error.code(),
            Self::NotLeader { .. } => ErrorCode::NotLeader,
            Self::WaitTimedOut { .. } => ErrorCode::WaitTimedOut,
            Self::WaitEnded { .. } => ErrorCode::WaitEnded,
            Self::WaitUntracked { .. } => ErrorCode::WaitUntracked,
            Self::Unavailable(_) => ErrorCode::Unavailable,
            Self::OutcomeUnknown(_) => ErrorCode::OutcomeUnknown,
            Self::BadRequest(_) => ErrorCode::BadRequest,
            Self::Stopped(_) => ErrorCode::Stopped,
            Self::Unauthenticated(_) => ErrorCode::Unauthenticated,
            Self::PermissionDenied(_) => ErrorCode::PermissionDenied,
            Self::OtherCluster { .. } => ErrorCode::OtherCluster,
            Self::Exhausted { limit, .. } => limit.code(),
            Self::VotersNotAnswering(_) => ErrorCode::VotersNotAnswering,
        }
    }

    /// Whether the request that failed changed anything: `not_applied` (it did not: retrying
    /// is safe) or `unknown` (it may have been applied: read the state before retrying).
    #[must_use]
    pub fn outcome(&self) -> &'static str {
        match self {
            Self::OutcomeUnknown(_) | Self::Stopped(_) | Self::WaitUntracked { .. } => "unknown",
            Self::Command(_)
            | Self::NotLeader { .. }
            | Self::WaitTimedOut { .. }
            | Self::WaitEnded { .. }
            | Self::Unavailable(_)
            | Self::BadRequest(_)
            | Self::Unauthenticated(_)
            | Self::PermissionDenied(_)
            | Self::OtherCluster { .. }
            | Self::Exhausted { .. }
            | Self::VotersNotAnswering(_) => "not_applied",
        }
    }

    /// The HTTP status that fits.
    #[must_use]
    pub fn http_status(&self) -> u16 {
        match self {
            Self::Command(error) => match error {
                CommandError::UnknownSession { .. } => 404,
                CommandError::NotOwner { .. } => 403,
                CommandError::LockBusy { .. }
                | CommandError::LockDelayed { .. }
                | CommandError::NotHeld { .. }
                | CommandError::TokenMismatch { .. }
                | CommandError::NotWaiting { .. }
                | CommandError::AlreadyWaiting { .. }
                | CommandError::NothingToAbandon { .. }
                | CommandError::RequestAbandoned { .. }
                | CommandError::WaitEnded { .. } => 409,
                // Never answered in practice: the node stops before applying such an entry.
                CommandError::UnknownApplyRules { .. } | CommandError::OlderApplyRules { .. } => {
                    500
                }
                // Only a damaged snapshot gets there; nothing the caller can change.
                CommandError::RevisionsExhausted { .. } => 500,
                CommandError::TooManySessions { .. }
                | CommandError::TooManyLocks { .. }
                | CommandError::TooManyLocksForSession { .. }
                | CommandError::TooManyWaiters { .. } => 429,
                _ => 400,
            },
            Self::WaitTimedOut { .. } | Self::WaitEnded { .. } | Self::VotersNotAnswering(_) => 409,
            Self::NotLeader { .. } => 421,
            Self::Unavailable(_)
            | Self::OutcomeUnknown(_)
            | Self::Stopped(_)
            | Self::WaitUntracked { .. } => 503,
            Self::BadRequest(_) => 400,
            Self::Unauthenticated(_) => 401,
            Self::PermissionDenied(_) => 403,
            Self::OtherCluster { .. } => 412,
            Self::Exhausted { .. } => 429,
        }
    }

    /// The gRPC status code that fits.
    #[must_use]
    pub fn grpc_code(&self) -> tonic::Code {
        match self.http_status() {
            404 => tonic::Code::NotFound,
            409 | 412 => tonic::Code::FailedPrecondition,
            429 => tonic::Code::ResourceExhausted,
            400 => tonic::Code::InvalidArgument,
            401 => tonic::Code::Unauthenticated,
            403 => tonic::Code::PermissionDenied,
            _ => tonic::Code::Unavailable,
        }
    }

    /// The current holder's token, where the error is about a taken lock.
    #[must_use]
    pub fn holder_token(&self) -> Option<u64> {
        match self {
            Self::Command(CommandError::LockBusy { holder_token, .. }) => Some(*holder_token),
            Self::Command(CommandError::NotHeld { holder_token, .. }) => *holder_token,
            Self::Command(CommandError::WaitEnded { holder_token, .. }) => *holder_token,
            Self::Command(CommandError::TokenMismatch { current_token, .. }) => {
                Some(*current_token)
            }
            Self::WaitTimedOut { holder_token, .. } => *holder_token,
            _ => None,
        }
    }

    /// The leader's address, where the error is about leadership.
    #[must_use]
    pub fn leader_addr(&self) -> Option<&str> {
        match self {
            Self::NotLeader { leader_addr, .. } => leader_addr.as_deref(),
            _ => None,
        }
    }
}
