//! What the client's read calls return: the core's types where the core has one, and small
//! structs of the client's own where the wire carries more than the core's (a holder's
//! sequencer, signed when the cluster signs grants).

use crate::error::ClientError;
use crate::guard::grant_sequencer;
use picket_core::{CheckOutcome, SessionId};
use picket_proto::v1;

/// A lock as the service holds it ([`crate::Client::lock_info`], [`crate::Client::locks`]).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockState {
    /// The lock.
    pub name: String,
    /// The current grant, if anyone holds the lock.
    pub holder: Option<Holder>,
    /// The sessions waiting for it, head first.
    pub waiters: Vec<SessionId>,
    /// A lock-delay is in force: a holder was lost, and nobody can take the lock until it ends.
    pub delayed: bool,
}

/// The current grant of a lock.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Holder {
    /// The holding session.
    pub session: SessionId,
    /// The grant's token.
    pub token: u64,
    /// The grant's sequencer, as the service issued it.
    pub sequencer: picket_core::Sequencer,
}

impl LockState {
    /// The holding session, if anyone holds the lock.
    #[must_use]
    pub fn holder_session(&self) -> Option<SessionId> {
        self.holder.as_ref().map(|holder| holder.session)
    }

    /// The current grant's token, if anyone holds the lock.
    #[must_use]
    pub fn token(&self) -> Option<u64> {
        self.holder.as_ref().map(|holder| holder.token)
    }
}

impl From<v1::LockInfo> for LockState {
    fn from(info: v1::LockInfo) -> Self {
        // Session 0 is never a session: the wire's "nobody holds it".
        let holder = (info.holder_session_id != 0).then(|| Holder {
            session: SessionId(info.holder_session_id),
            token: info.token,
            sequencer: grant_sequencer(&info.name, info.token, &info.sequencer),
        });
        Self {
            holder,
            waiters: info.waiters.into_iter().map(SessionId).collect(),
            delayed: info.delayed,
            name: info.name,
        }
    }
}

/// A live session as the service holds it ([`crate::Client::sessions`]).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct SessionSummary {
    /// The session.
    pub session: SessionId,
    /// Its TTL.
    pub ttl_ms: u64,
    /// Its lock-delay.
    pub lock_delay_ms: u64,
    /// The locks it holds.
    pub held: Vec<String>,
    /// The locks it waits for.
    pub waiting: Vec<String>,
}

impl From<v1::SessionInfo> for SessionSummary {
    fn from(info: v1::SessionInfo) -> Self {
        Self {
            session: SessionId(info.session_id),
            ttl_ms: info.ttl_ms,
            lock_delay_ms: info.lock_delay_ms,
            held: info.held,
            waiting: info.waiting,
        }
    }
}

/// A grant made in a session another process keeps alive ([`crate::Client::acquire_in`]).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Grant {
    /// The lock.
    pub name: String,
    /// The grant's token.
    pub token: u64,
    /// The grant's sequencer, as the service issued it.
    pub sequencer: picket_core::Sequencer,
    /// The session held the lock already: this is the grant it had, not a new one.
    pub already_held: bool,
}

impl Grant {
    pub(crate) fn of(name: &str, granted: &v1::AcquireResponse) -> Self {
        Self {
            name: name.to_owned(),
            token: granted.token,
            sequencer: grant_sequencer(name, granted.token, &granted.sequencer),
            already_held: granted.already_held,
        }
    }
}

/// The core's check outcome from the wire: the typed status, or the status's name from a node
/// built before the typed field.
pub(crate) fn check_outcome(answer: &v1::CheckResponse) -> Result<CheckOutcome, ClientError> {
    let current_token = (answer.current_token > 0).then_some(answer.current_token);
    let status = v1::CheckStatus::try_from(answer.check_status).ok();
    let outcome = match (status, answer.status.as_str()) {
        (Some(v1::CheckStatus::Current), _) | (Some(v1::CheckStatus::Unspecified), "current") => {
            // A node built before `holder_session_id` says 0: the holder is not known then.
            CheckOutcome::Current { session: SessionId(answer.holder_session_id) }
        }
        (Some(v1::CheckStatus::Superseded), _)
        | (Some(v1::CheckStatus::Unspecified), "superseded") => {
            CheckOutcome::Superseded { current_token }
        }
        (Some(v1::CheckStatus::UnknownLock), _)
        | (Some(v1::CheckStatus::Unspecified), "unknown_lock") => CheckOutcome::UnknownLock,
        _ => {
            return Err(ClientError::UnknownRefusal {
                code: answer.status.clone(),
                message: format!(
                    "the service answered the check with a status this client does not know ({}, {}): upgrade the client",
                    answer.check_status, answer.status
                ),
            });
        }
    };
    Ok(outcome)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_check_is_read_from_the_typed_status_and_from_an_older_nodes_name() {
        let typed = v1::CheckResponse {
            status: "current".into(),
            current_token: 7,
            holder_session_id: 3,
            check_status: v1::CheckStatus::Current.into(),
        };
        assert_eq!(check_outcome(&typed).unwrap(), CheckOutcome::Current { session: SessionId(3) });
        let older = v1::CheckResponse {
            status: "superseded".into(),
            current_token: 9,
            ..v1::CheckResponse::default()
        };
        let superseded = CheckOutcome::Superseded { current_token: Some(9) };
        assert_eq!(check_outcome(&older).unwrap(), superseded);
        let free = v1::CheckResponse {
            status: "superseded".into(),
            check_status: v1::CheckStatus::Superseded.into(),
            ..v1::CheckResponse::default()
        };
        let nobody = CheckOutcome::Superseded { current_token: None };
        assert_eq!(check_outcome(&free).unwrap(), nobody);
        let newer = v1::CheckResponse {
            status: "revoked".into(),
            check_status: 9,
            ..v1::CheckResponse::default()
        };
        assert!(check_outcome(&newer).unwrap_err().to_string().contains("upgrade the client"));
    }

    #[test]
    fn nobody_holds_a_lock_whose_holder_is_session_zero() {
        let free = v1::LockInfo { name: "x".into(), waiters: vec![4], ..v1::LockInfo::default() };
        let state = LockState::from(free);
        assert_eq!((state.holder, state.waiters), (None, vec![SessionId(4)]));
        let held = v1::LockInfo {
            name: "x".into(),
            holder_session_id: 2,
            token: 5,
            ..v1::LockInfo::default()
        };
        let state = LockState::from(held);
        assert_eq!((state.holder_session(), state.token()), (Some(SessionId(2)), Some(5)));
        assert_eq!(state.holder.unwrap().sequencer.to_string(), "p1.5.x");
    }
}
