//! What can be applied to the state machine.

use crate::limits::Limits;
use crate::types::{RequestId, SessionId, Wait};
use serde::{Deserialize, Serialize};
use std::fmt;

/// One entry of the replicated log: a command and the proposer's clock reading.
///
/// `now_ms` is read by the leader from its monotonic clock when it proposes the command. The
/// state machine never reads a clock of its own, so every replica that applies the same inputs
/// reaches the same state.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Input {
    /// The proposer's clock, in milliseconds. Only differences between readings of one leader
    /// matter; [`Command::Refresh`] starts a new leader's readings.
    pub now_ms: u64,
    /// What to do.
    pub command: Command,
    /// The principal that sent it, when the service authenticates clients and the sender is
    /// not an admin: a command that uses a session is refused unless this principal opened it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub principal: Option<String>,
    /// The version of the apply rules the proposer wrote this entry under; the state machine
    /// applies it under the same rules, so a log replayed by a later build reaches the state
    /// the build that wrote it reached. Entries from before versions existed read as 0.
    #[serde(default)]
    pub rules: u32,
}

/// The newest version of the apply rules this build knows, and the one it writes. What each
/// version changed:
///
/// - 0: every entry written before versions existed.
/// - 1: an abandon that finds nothing to undo is accepted rather than refused
///   (`nothing_to_abandon`), and every accepted abandon is remembered by its session, so an
///   attempt of an abandoned request that reaches the log later is refused
///   (`request_abandoned`) instead of granted to a caller that is gone.
/// - 2: a grant belongs to every request of its session that was told of it: the one that
///   produced it and each one answered `already_held` since (at most four in all). Abandoning
///   one of them releases the grant only when it is the last; before, only the producing
///   request counted, so its late abandon (from a node whose connection broke, or the
///   client's own after the client stopped waiting for it) released a grant that a later
///   request's caller had been told it holds.
/// - 3: a retry of an acquire request whose wait ended without a grant (it timed out, or was
///   cancelled) gets the answer the wait ended with (`wait_timed_out`, `wait_ended`), where
///   before it started a second wait; each session remembers its last eight such requests. A
///   retry of a request that still waits joins that wait with its deadline unchanged, where
///   before it restarted the wait in full.
/// - 4: [`Command::SetLimits`] exists: the leader writes the limits its operator configured
///   into the state, so every replica enforces them from the same entry on.
/// - 5: a [`Command::Tick`] may renew a session for less or more than its TTL of the state's
///   clock (`renew_for`), where its client's clock runs at a different rate from the leader's,
///   so the session lives its TTL by its client's clock (the leader only ever asks for more;
///   the state holds any lease to between a quarter of the TTL and four times it). Under older
///   rules a tick with `renew_for` is refused (`older_apply_rules`). Rules 4 never had
///   `renew_for`; the refusal was added with rules 5, and no log written under rules 4 holds
///   one.
/// - 6: a session remembers the lease its last renewal gave it where that was longer than its
///   TTL, and a [`Command::Refresh`] renews it for that lease, where before it renewed every
///   session for its TTL: a refresh (after a gap, for an over-full batch, or by a new leader)
///   cut the lease a fast leader had lengthened for a client whose clock runs slower, and a
///   quiet session could end before its client gave up on it.
/// - 7: [`Command::NameCluster`] exists: a leader whose state has no cluster id writes a random
///   one, which every replica then holds for good; each node sends it with its Raft messages
///   and refuses those of a node that holds another (a node of another cluster, or a data
///   directory of another cluster, pointed at this one). A restored state starts without one.
///
/// A node that finds an entry under a version it does not know must stop rather than apply it
/// differently from the nodes that do.
pub const APPLY_RULES: u32 = 7;

impl Input {
    /// `command` stamped `now_ms` under this build's apply rules, sent by nobody in particular
    /// (an admin, or a service that authenticates no one).
    #[must_use]
    pub fn new(now_ms: u64, command: Command) -> Self {
        Self { now_ms, command, principal: None, rules: APPLY_RULES }
    }

    /// The same input, written under apply rules `rules` (see [`Input::rules`]).
    #[must_use]
    pub fn under_rules(self, rules: u32) -> Self {
        Self { rules, ..self }
    }

    /// The same input, sent by `principal` (see [`Input::principal`]).
    #[must_use]
    pub fn sent_by(self, principal: Option<String>) -> Self {
        Self { principal, ..self }
    }
}

impl Command {
    /// The session this command acts in or on, for the commands a session's owner sends
    /// (revoking is an admin's, and carries no principal).
    #[must_use]
    pub fn session_used(&self) -> Option<SessionId> {
        match self {
            Self::KeepAlive { session }
            | Self::CloseSession { session }
            | Self::Acquire { session, .. }
            | Self::Abandon { session, .. }
            | Self::Cancel { session, .. }
            | Self::Release { session, .. } => Some(*session),
            _ => None,
        }
    }

    /// The oldest apply rules an entry of this command may be written under: a leader whose
    /// members do not all know them yet must not write it (an older build could not even read
    /// it), and the state machine refuses it under older rules.
    #[must_use]
    pub fn oldest_rules(&self) -> u32 {
        match self {
            Self::SetLimits { .. } => 4,
            Self::NameCluster { .. } => 7,
            Self::Tick { renew_for, .. } if !renew_for.is_empty() => 5,
            _ => 0,
        }
    }
}

/// A change to the lock state.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
#[non_exhaustive]
pub enum Command {
    /// Opens a session that lives `ttl_ms` past its last keepalive.
    OpenSession {
        /// How long the session lives without a keepalive.
        ttl_ms: u64,
        /// After this session expires or is revoked, its locks stay ungrantable this long.
        lock_delay_ms: u64,
        /// The principal that opens it, when the service authenticates its clients; only that
        /// principal (or an admin) may use the session. At most [`MAX_OWNER_BYTES`] bytes.
        ///
        /// [`MAX_OWNER_BYTES`]: crate::MAX_OWNER_BYTES
        #[serde(default, skip_serializing_if = "Option::is_none")]
        owner: Option<String>,
    },
    /// Gives one session a full TTL from now (under apply rules 6 it forgets a longer lease a
    /// tick's `renew_for` gave it).
    KeepAlive {
        /// The session.
        session: SessionId,
    },
    /// Ends a session at its client's request: its locks are released, its waits cancelled.
    CloseSession {
        /// The session.
        session: SessionId,
    },
    /// Ends a session at an operator's request, as an expiry would (lock-delay applies).
    RevokeSession {
        /// The session.
        session: SessionId,
    },
    /// Asks for a lock.
    Acquire {
        /// The session that will hold it.
        session: SessionId,
        /// The lock.
        name: String,
        /// Whether, and how long, to wait in the queue.
        wait: Wait,
        /// The request, unique within the session. A session waits for a lock under one
        /// request at a time; the same request asked again keeps its place. Entries written
        /// before request ids existed read as request 0.
        #[serde(default)]
        request: RequestId,
        /// Which attempt at the request this is: 0 for the first, one more for each retry. The
        /// grant or wait remembers the latest attempt that reached it, so the abandoning of an
        /// earlier attempt (its caller went away and retried) leaves the retry's answer alone.
        #[serde(default)]
        attempt: u32,
    },
    /// Undoes what one acquire request did, because its caller went away without hearing the
    /// answer: cancels the request's wait, or releases the grant the request produced. Never
    /// touches a wait or grant of another request, so it is safe to send when unsure what the
    /// request did.
    Abandon {
        /// The session that asked.
        session: SessionId,
        /// The lock.
        name: String,
        /// The abandoned request.
        request: RequestId,
        /// The abandoned attempt: nothing is undone if a later attempt of the request reached
        /// the grant or wait since.
        #[serde(default)]
        attempt: u32,
    },
    /// Leaves a lock's queue.
    Cancel {
        /// The waiting session.
        session: SessionId,
        /// The lock.
        name: String,
    },
    /// Gives a lock up; the token must be that of the session's current grant.
    Release {
        /// The holding session.
        session: SessionId,
        /// The lock.
        name: String,
        /// The token of the grant being released.
        token: u64,
    },
    /// Advances time: renews the listed sessions, then expires sessions past their deadline
    /// and its grace ([`crate::Limits::session_expiry_grace_ms`]), times out waits past theirs,
    /// and ends lock-delays that are over. Expiry goes by the tick's own `now_ms`, even when a
    /// command stamped later reached the log first; renewals by the state's clock.
    ///
    /// Keepalives reach the leader many times a second; it batches them into the next tick
    /// instead of writing one log entry each.
    Tick {
        /// Sessions that sent a keepalive since the last tick. Unknown ids are skipped: the
        /// session may have ended since. Under apply rules 6 each forgets a longer lease an
        /// earlier `renew_for` gave it.
        renew: Vec<SessionId>,
        /// Sessions that sent a keepalive since the last tick from a client whose clock runs at
        /// a different rate from the leader's (apply rules 5): each is renewed for the given
        /// milliseconds of the state's clock, its TTL measured on its client's clock, held to
        /// between a quarter of its TTL and four times it. Under older rules a tick that carries
        /// any is refused (`older_apply_rules`). Under rules 6 a session renewed for longer than
        /// its TTL remembers that lease for a later `Refresh`. Unknown ids are skipped.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        renew_for: Vec<(SessionId, u64)>,
    },
    /// Starts a new leader's clock: every session gets a full TTL (under apply rules 6, the
    /// longer lease its last renewal gave it, if any), every bounded wait its full wait and
    /// every lock-delay its full delay, measured from this command's `now_ms`.
    ///
    /// A new leader proposes this first, so no session can expire early because the new leader's
    /// clock reads differently from the old one's.
    Refresh,
    /// Replaces the limits every replica enforces (apply rules 4). The limits are part of the
    /// replicated state, so a node's limit flags reach it only through this command, written by
    /// the leader; every replica then refuses exactly the same commands. Refused when the limits
    /// contradict themselves, or when the state already holds more than they allow (more
    /// sessions, lock records, locks of one session or waiters of one lock): what exists stays,
    /// and the leader asks again once enough of it has gone.
    SetLimits {
        /// The new limits.
        limits: Limits,
    },
    /// Gives the cluster its id (apply rules 7), once: a leader whose state has none writes a
    /// random one. A state named already refuses any other id, so that of two leaders in turn
    /// that both found the state unnamed, the first naming to reach the log stands (its own
    /// id again is accepted, and changes nothing but the revision). Nodes tell the id with
    /// their Raft messages and refuse a peer's that carry another.
    NameCluster {
        /// [`CLUSTER_ID_HEX_DIGITS`] lowercase hexadecimal digits (128 random bits).
        cluster_id: String,
    },
}

/// How many lowercase hexadecimal digits a cluster id has ([`Command::NameCluster`]).
pub const CLUSTER_ID_HEX_DIGITS: usize = 32;

/// Whether `cluster_id` is a well-formed cluster id: exactly [`CLUSTER_ID_HEX_DIGITS`]
/// lowercase hexadecimal digits.
#[must_use]
pub fn is_cluster_id(cluster_id: &str) -> bool {
    cluster_id.len() == CLUSTER_ID_HEX_DIGITS
        && cluster_id.bytes().all(|byte| byte.is_ascii_digit() || (b'a'..=b'f').contains(&byte))
}

impl fmt::Display for Command {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::OpenSession { ttl_ms, lock_delay_ms, owner: None } => {
                write!(f, "open_session(ttl_ms={ttl_ms}, lock_delay_ms={lock_delay_ms})")
            }
            Self::OpenSession { ttl_ms, lock_delay_ms, owner: Some(owner) } => write!(
                f,
                "open_session(ttl_ms={ttl_ms}, lock_delay_ms={lock_delay_ms}, owner={owner:?})"
            ),
            Self::KeepAlive { session } => write!(f, "keep_alive({session})"),
            Self::CloseSession { session } => write!(f, "close_session({session})"),
            Self::RevokeSession { session } => write!(f, "revoke_session({session})"),
            Self::Acquire { session, name, wait, request, attempt } => {
                write!(f, "acquire({session}, {name:?}, {wait:?}, request={request}.{attempt})")
            }
            Self::Abandon { session, name, request, attempt } => {
                write!(f, "abandon({session}, {name:?}, request={request}.{attempt})")
            }
            Self::Cancel { session, name } => write!(f, "cancel({session}, {name:?})"),
            Self::Release { session, name, token } => {
                write!(f, "release({session}, {name:?}, token={token})")
            }
            Self::Tick { renew, renew_for } => {
                write!(f, "tick(renew={}, renew_for={})", renew.len(), renew_for.len())
            }
            Self::Refresh => write!(f, "refresh"),
            Self::SetLimits { .. } => write!(f, "set_limits"),
            Self::NameCluster { cluster_id } => write!(f, "name_cluster({cluster_id})"),
        }
    }
}

impl fmt::Display for Input {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "@{}ms {}", self.now_ms, self.command)?;
        match &self.principal {
            Some(principal) => write!(f, " by {principal:?}"),
            None => Ok(()),
        }
    }
}
