//! Why a write was refused, in a form both programs and people can use.

use crate::rule::{FenceRecord, Stamp};
use serde::{Deserialize, Serialize};
use std::fmt;

/// A refused write. It names the resource, the lock the resource is bound to, the stamp that was
/// presented and the current highest token, so the client can re-read the grant instead of
/// guessing.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Refusal {
    /// The guarded resource.
    pub resource: String,
    /// The lock the resource is bound to.
    pub lock: String,
    /// The lock the presented token was granted for.
    pub presented_lock: String,
    /// What the writer presented.
    pub presented: Stamp,
    /// The highest token the resource has admitted or registered.
    pub highest_token: u64,
    /// Why.
    pub reason: RefusalReason,
}

/// The rule a refused write broke.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
#[non_exhaustive]
pub enum RefusalReason {
    /// A newer grant has reached the resource: this grant is superseded.
    Stale,
    /// The token belongs to another lock; tokens of different locks cannot be compared.
    WrongLock,
    /// The same grant wrote again with a `seq` that is not greater than the last one: a replay or
    /// a reordered retry.
    Replay {
        /// The highest `seq` admitted for this token.
        last_seq: u64,
    },
    /// Strict mode: this grant already had its one write.
    StrictRepeat,
    /// The idempotency key was used before with another stamp.
    IdempotencyKeyReused {
        /// The stamp it was first used with.
        original: Stamp,
    },
    /// The idempotency key is not remembered any more, and the write may be a retry of one
    /// already admitted under it (same grant, no `seq` to order them): refused, so it is never
    /// applied twice.
    IdempotencyWindowPassed,
    /// The idempotency key is empty or too long.
    InvalidIdempotencyKey,
    /// Token 0 is never issued.
    InvalidToken,
    /// The resource name is empty or too long.
    InvalidResource,
    /// Verify on advance: the lock service says this token is not the lock's current grant.
    NotCurrent {
        /// The current grant's token, if the lock is held.
        current_token: Option<u64>,
    },
    /// Verify on advance: the lock service could not be asked, so a token above the highest
    /// cannot be admitted yet.
    Unverified,
}

impl RefusalReason {
    /// A stable machine-readable code.
    #[must_use]
    pub fn code(&self) -> &'static str {
        match self {
            Self::Stale => "stale_token",
            Self::WrongLock => "wrong_lock",
            Self::Replay { .. } => "replayed_seq",
            Self::StrictRepeat => "strict_repeat",
            Self::IdempotencyKeyReused { .. } => "idempotency_key_reused",
            Self::IdempotencyWindowPassed => "idempotency_window_passed",
            Self::InvalidIdempotencyKey => "invalid_idempotency_key",
            Self::InvalidToken => "invalid_token",
            Self::InvalidResource => "invalid_resource",
            Self::NotCurrent { .. } => "not_current_grant",
            Self::Unverified => "unverified_token",
        }
    }
}

impl Refusal {
    pub(crate) fn new(
        resource: &str,
        record: &FenceRecord,
        presented_lock: &str,
        presented: Stamp,
        reason: RefusalReason,
    ) -> Self {
        Self {
            resource: resource.to_owned(),
            lock: record.lock.clone(),
            presented_lock: presented_lock.to_owned(),
            presented,
            highest_token: record.highest_token,
            reason,
        }
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let token = self.presented.token;
        let (resource, highest) = (&self.resource, self.highest_token);
        match self.reason {
            RefusalReason::Stale => write!(
                f,
                "write to {resource:?} refused: token {token} is stale, the resource has seen token {highest} of lock {:?}; your grant was superseded, re-acquire the lock and re-read before writing",
                self.lock
            ),
            RefusalReason::WrongLock => write!(
                f,
                "write to {resource:?} refused: it is guarded by lock {:?}, but the token {token} is from lock {:?}; acquire {:?} and use its sequencer",
                self.lock, self.presented_lock, self.lock
            ),
            RefusalReason::Replay { last_seq } => write!(
                f,
                "write to {resource:?} refused: token {token} already wrote seq {last_seq}, and seq {} is not greater; this is a replay or a reordered retry, send a higher seq for new writes",
                self.presented.seq.unwrap_or_default()
            ),
            RefusalReason::StrictRepeat => write!(
                f,
                "write to {resource:?} refused: the resource is strict and token {token} already had its one write; acquire the lock again for another write"
            ),
            RefusalReason::IdempotencyKeyReused { original } => write!(
                f,
                "write to {resource:?} refused: its idempotency key was first used with token {} seq {:?}; use a fresh key for a different write",
                original.token, original.seq
            ),
            RefusalReason::IdempotencyWindowPassed => write!(
                f,
                "write to {resource:?} refused: its idempotency key is not remembered (keys are kept for the resource's window), and a keyed write of token {token} without a seq was forgotten, so this may be a retry of a write already applied; if it is a new write, send it with a picket-seq higher than the last, or under a new grant"
            ),
            RefusalReason::InvalidIdempotencyKey => write!(
                f,
                "write to {resource:?} refused: the idempotency key must be 1 to {} bytes",
                crate::rule::MAX_IDEMPOTENCY_KEY_BYTES
            ),
            RefusalReason::InvalidToken if token == 0 => write!(
                f,
                "write to {resource:?} refused: token 0 is never issued; pass the sequencer Picket gave you"
            ),
            RefusalReason::InvalidToken => write!(
                f,
                "write to {resource:?} refused: token {token} is above what this fence stores (2^63 - 1 in PostgreSQL), and no grant comes near it; check where this sequencer came from"
            ),
            RefusalReason::InvalidResource => write!(
                f,
                "write refused: the resource name must be 1 to {} bytes",
                crate::rule::MAX_RESOURCE_BYTES
            ),
            RefusalReason::NotCurrent { current_token } => write!(
                f,
                "write to {resource:?} refused: token {token} is not the current grant of lock {:?} (current: {}); re-acquire the lock",
                self.lock,
                current_token.map_or_else(|| "none".to_owned(), |t| t.to_string())
            ),
            RefusalReason::Unverified => write!(
                f,
                "write to {resource:?} refused: token {token} is newer than any seen (highest {highest}) and the lock service could not confirm it; retry when the service is reachable"
            ),
        }
    }
}

impl std::error::Error for Refusal {}
