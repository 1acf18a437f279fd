//! Errors the client returns.

use picket_proto::{ERROR_CODE_KEY, HOLDER_TOKEN_KEY, LEADER_KEY};
use thiserror::Error;
use tonic::{Code, Status};

/// Why a client call failed.
#[derive(Clone, Debug, Error)]
#[non_exhaustive]
pub enum ClientError {
    /// No endpoint answered.
    #[error(
        "no Picket server at {endpoints}: start one with `picket serve`, or pass the right --endpoints ({detail})"
    )]
    Unreachable {
        /// The endpoints tried.
        endpoints: String,
        /// The last transport error.
        detail: String,
    },
    /// The service refused the request. `code` is the stable code (see the README's error
    /// table); `message` says what to do.
    #[error("{message}")]
    Service {
        /// The stable code, e.g. `lock_busy`.
        code: String,
        /// The service's sentence.
        message: String,
        /// The current holder's token, when the lock is taken.
        holder_token: Option<u64>,
    },
    /// A write may or may not have been applied; read the state before retrying.
    #[error("the outcome is unknown ({0}): read the state before retrying")]
    OutcomeUnknown(String),
    /// The session is gone (expired, revoked, closed, or not confirmed within its TTL).
    #[error("the session is lost ({0:?}): open a new session")]
    SessionLost(LostReason),
    /// A caller-supplied argument is invalid before anything was sent.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
}

impl ClientError {
    /// The stable service code, if the service refused the request.
    #[must_use]
    pub fn code(&self) -> Option<&str> {
        match self {
            Self::Service { code, .. } => Some(code),
            _ => None,
        }
    }

    /// The current holder's token, for a refusal about a taken lock.
    #[must_use]
    pub fn holder_token(&self) -> Option<u64> {
        match self {
            Self::Service { holder_token, .. } => *holder_token,
            _ => None,
        }
    }
}

/// How a failed attempt should be handled.
#[derive(Debug)]
pub(crate) enum Failure {
    /// Go to this leader (or look for one when `None`) and try again: nothing was applied.
    NotLeader(Option<String>),
    /// The cluster is electing or lost quorum: wait, try again. Nothing was applied.
    Unavailable(String),
    /// The connection failed before the request was sent: nothing was applied.
    Unsent(String),
    /// The connection failed after the request may have been sent.
    Broken(String),
    /// A final answer.
    Final(ClientError),
}

fn metadata(status: &Status, key: &str) -> Option<String> {
    status.metadata().get(key).and_then(|value| value.to_str().ok()).map(str::to_owned)
}

pub(crate) fn classify(status: &Status) -> Failure {
    let Some(code) = metadata(status, ERROR_CODE_KEY) else {
        return transport_failure(status);
    };
    match code.as_str() {
        "not_leader" => Failure::NotLeader(metadata(status, LEADER_KEY)),
        "unavailable" | "stopped" => Failure::Unavailable(status.message().to_owned()),
        "outcome_unknown" => {
            Failure::Final(ClientError::OutcomeUnknown(status.message().to_owned()))
        }
        _ => Failure::Final(ClientError::Service {
            holder_token: metadata(status, HOLDER_TOKEN_KEY).and_then(|token| token.parse().ok()),
            code,
            message: status.message().to_owned(),
        }),
    }
}

fn transport_failure(status: &Status) -> Failure {
    let message = format!("{}: {}", status.code(), status.message());
    // The connection marks what certainly never left this process (no connection, or one that
    // closed before the request was written); any call may be sent again after that. Nothing
    // else is known not to have reached the server.
    if status.code() == Code::Unavailable && picket_proto::connection::was_not_sent(status) {
        return Failure::Unsent(message);
    }
    // Refused by the client itself before sending (a request over its size limit): sending it
    // again would only be refused again.
    if status.code() == Code::InvalidArgument {
        return Failure::Final(ClientError::InvalidArgument(status.message().to_owned()));
    }
    Failure::Broken(message)
}

/// Why a session (and with it every grant it held) is lost.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LostReason {
    /// The service expired it: it was not kept alive in time.
    Expired,
    /// An operator revoked it.
    Revoked,
    /// It was closed.
    Closed,
    /// The client could not confirm it within its TTL (the service may still count it alive,
    /// but nothing guarantees that any more).
    Unconfirmed,
    /// This one grant ended while the session lives on (released elsewhere).
    GrantEnded,
}

#[cfg(test)]
mod tests {
    use super::*;
    use picket_proto::connection::not_sent_status;

    #[test]
    fn only_what_the_connection_marks_as_not_sent_is_unsent() {
        let refused = not_sent_status("cannot connect to 127.0.0.1:1");
        assert!(matches!(classify(&refused), Failure::Unsent(_)));
        let closed = not_sent_status("the connection closed (eof)");
        assert!(matches!(classify(&closed), Failure::Unsent(_)));
        // The words alone, as a server could send them, are not the mark.
        let spoken = Status::unavailable("not sent: the connection closed (eof)");
        assert!(matches!(classify(&spoken), Failure::Broken(_)));
    }

    /// Regression: any UNAVAILABLE transport error that mentioned "connect" (as in "connection
    /// reset") counted as never sent, so a call that is not safe to repeat could be repeated.
    #[test]
    fn regression_a_reset_connection_is_not_taken_for_an_unsent_request() {
        let reset = Status::unavailable("h2 protocol error: connection reset by peer");
        assert!(matches!(classify(&reset), Failure::Broken(_)));
        let refused_stream = Status::unavailable("h2 protocol error: refused stream");
        assert!(matches!(classify(&refused_stream), Failure::Broken(_)));
    }

    #[test]
    fn a_request_refused_by_the_client_itself_is_final() {
        let too_large = Status::invalid_argument("the request is larger than 16 bytes");
        assert!(matches!(classify(&too_large), Failure::Final(ClientError::InvalidArgument(_))));
    }

    #[test]
    fn a_follower_names_the_leader() {
        let mut status = Status::unavailable("not the leader");
        status.metadata_mut().insert(ERROR_CODE_KEY, "not_leader".parse().unwrap());
        status.metadata_mut().insert(LEADER_KEY, "127.0.0.1:7001".parse().unwrap());
        assert!(
            matches!(classify(&status), Failure::NotLeader(Some(leader)) if leader == "127.0.0.1:7001")
        );
    }
}
