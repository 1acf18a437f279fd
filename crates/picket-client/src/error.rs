//! Errors the client returns.

pub use picket_core::ErrorCode;
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
        /// The stable code, e.g. [`ErrorCode::LockBusy`].
        code: ErrorCode,
        /// The service's sentence.
        message: String,
        /// The current holder's token, when the lock is taken.
        holder_token: Option<u64>,
    },
    /// The service refused the request with a code this build does not know (a newer
    /// server's); `message` says what to do.
    #[error("{message} ({code})")]
    UnknownRefusal {
        /// The code as the service sent it.
        code: String,
        /// The service's sentence.
        message: String,
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
    /// The endpoints reached belong to another cluster than the client's (the one it was given,
    /// or the first it reached); nothing was sent to them. Session ids of two clusters
    /// coincide, so a call there could keep alive or release another client's session.
    #[error(
        "the node at {endpoint} belongs to cluster {found}, not to cluster {expected}: the endpoints name nodes of two clusters; give only the nodes of one (`picket members` on a node shows its cluster id), or the cluster's id (`picket --expect-cluster`, `ClientConfig::cluster_id`)"
    )]
    OtherCluster {
        /// The endpoint of the node of the other cluster.
        endpoint: String,
        /// The other cluster's id.
        found: String,
        /// The client's cluster, and how the client came to keep to it.
        expected: String,
    },
}

impl ClientError {
    /// The stable service code, if the service refused the request with one this build knows.
    #[must_use]
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            Self::Service { code, .. } => Some(*code),
            _ => None,
        }
    }

    /// Whether the service refused the request with `code`.
    #[must_use]
    pub fn is(&self, code: ErrorCode) -> bool {
        self.code() == Some(code)
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
    /// The node belongs to another cluster than the client's: nothing was sent to it.
    OtherCluster(ClientError),
    /// A final answer.
    Final(ClientError),
}

fn metadata(status: &Status, key: &str) -> Option<String> {
    status.metadata().get(key).and_then(|value| value.to_str().ok()).map(str::to_owned)
}

pub(crate) fn classify(status: &Status) -> Failure {
    let Some(wire_code) = metadata(status, ERROR_CODE_KEY) else {
        return transport_failure(status);
    };
    let Some(code) = ErrorCode::from_wire(&wire_code) else {
        return Failure::Final(ClientError::UnknownRefusal {
            code: wire_code,
            message: status.message().to_owned(),
        });
    };
    match code {
        ErrorCode::NotLeader => Failure::NotLeader(metadata(status, LEADER_KEY)),
        ErrorCode::Unavailable => Failure::Unavailable(status.message().to_owned()),
        // The node stopped serving with the request perhaps written to its log (its
        // consensus engine failed under it): the outcome is unknown, as when the connection
        // broke after the request was sent. Only a call safe to repeat is sent again.
        ErrorCode::Stopped => Failure::Broken(format!("the node stopped: {}", status.message())),
        ErrorCode::OutcomeUnknown => {
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
    /// The service ended it without being asked: it expired (it was not kept alive in time),
    /// or it ended while no event could reach the client, which then learns only that the
    /// service no longer knows it (a keepalive refused, or the recheck after a broken watch
    /// stream or a resync).
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

    /// `stopped` is answered with outcome `unknown` (the request may be in the node's log):
    /// sent again only when the call is safe to repeat, as a broken connection is. It was
    /// taken for `unavailable`, which applied nothing, so a session could be opened twice.
    #[test]
    fn a_node_that_stopped_under_a_request_leaves_its_outcome_unknown() {
        let mut stopped = Status::unavailable("this node has stopped serving");
        stopped.metadata_mut().insert(ERROR_CODE_KEY, "stopped".parse().unwrap());
        assert!(matches!(classify(&stopped), Failure::Broken(_)));
        let mut electing = Status::unavailable("no leader yet");
        electing.metadata_mut().insert(ERROR_CODE_KEY, "unavailable".parse().unwrap());
        assert!(matches!(classify(&electing), Failure::Unavailable(_)));
    }

    #[test]
    fn a_refusal_reads_back_as_its_typed_code_and_an_unknown_one_keeps_its_words() {
        let mut busy = Status::failed_precondition("lock \"a\" is held by another session");
        busy.metadata_mut().insert(ERROR_CODE_KEY, "lock_busy".parse().unwrap());
        busy.metadata_mut().insert(HOLDER_TOKEN_KEY, "7".parse().unwrap());
        let Failure::Final(error) = classify(&busy) else { panic!("a refusal is final") };
        assert!(error.is(ErrorCode::LockBusy), "{error:?}");
        assert_eq!(error.holder_token(), Some(7));

        let mut newer = Status::failed_precondition("a refusal from a newer server");
        newer.metadata_mut().insert(ERROR_CODE_KEY, "quota_exceeded".parse().unwrap());
        let Failure::Final(error) = classify(&newer) else { panic!("a refusal is final") };
        assert_eq!(error.code(), None);
        assert!(
            matches!(&error, ClientError::UnknownRefusal { code, .. } if code == "quota_exceeded")
        );
        assert!(error.to_string().contains("quota_exceeded"), "{error}");
    }
}
