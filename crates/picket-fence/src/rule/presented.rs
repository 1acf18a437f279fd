//! What a writer presents with a write: the stamp of its grant, and what makes a retry
//! recognisable (an idempotency key and a digest of the request).

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// What a writer presents with a write: its grant's token and, optionally, a sequence number
/// that orders writes made under one grant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Stamp {
    /// The grant's token.
    pub token: u64,
    /// Orders the writes of one grant; a repeated or lower `seq` is a replay.
    pub seq: Option<u64>,
}

/// A write's credentials: the lock its token belongs to, the stamp, and an optional idempotency
/// key that makes a retry return the original outcome.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Presented {
    /// The lock the token was granted for.
    pub lock: String,
    /// Token and sequence number.
    pub stamp: Stamp,
    /// Identifies this write across retries.
    pub idempotency_key: Option<String>,
    /// What the write does (SHA-256, hex), so a key reused for a different write is refused
    /// rather than answered as a duplicate. See [`Presented::with_request`].
    pub request_digest: Option<String>,
}

impl Presented {
    /// Credentials from a sequencer, with no `seq` and no idempotency key.
    #[must_use]
    pub fn from_sequencer(sequencer: &picket_core::Sequencer) -> Self {
        Self {
            lock: sequencer.name.clone(),
            stamp: Stamp { token: sequencer.token, seq: None },
            idempotency_key: None,
            request_digest: None,
        }
    }

    /// Credentials from a signed sequencer, once its signature verifies with the lock
    /// service's public keys: how a resource that holds those keys reads a sequencer, before
    /// any other rule and without asking the service.
    ///
    /// # Errors
    /// [`picket_core::SealError`]: unsigned, another cluster's, an unknown key, or a signature
    /// that does not match (forged or altered).
    pub fn verified(
        sequencer: &picket_core::Sequencer,
        keys: &picket_core::SequencerKeys,
    ) -> Result<Self, picket_core::SealError> {
        keys.verify(sequencer)?;
        Ok(Self::from_sequencer(sequencer))
    }

    /// Credentials of `lock`'s grant `token`, with no `seq` and no idempotency key.
    #[must_use]
    pub fn new(lock: impl Into<String>, token: u64) -> Self {
        Self {
            lock: lock.into(),
            stamp: Stamp { token, seq: None },
            idempotency_key: None,
            request_digest: None,
        }
    }

    /// Adds a sequence number.
    #[must_use]
    pub fn with_seq(mut self, seq: u64) -> Self {
        self.stamp.seq = Some(seq);
        self
    }

    /// Adds an idempotency key.
    #[must_use]
    pub fn with_idempotency_key(mut self, key: impl Into<String>) -> Self {
        self.idempotency_key = Some(key.into());
        self
    }

    /// Records what the write does, from its parts (method, resource, body, ...): a retry with
    /// the same key must do the same. Each part is length-prefixed, so parts cannot run into
    /// each other.
    #[must_use]
    pub fn with_request(mut self, parts: &[&[u8]]) -> Self {
        let mut digest = Sha256::new();
        for part in parts {
            digest.update((part.len() as u64).to_le_bytes());
            digest.update(part);
        }
        let hex: String = digest.finalize().iter().map(|byte| format!("{byte:02x}")).collect();
        self.request_digest = Some(hex);
        self
    }
}
