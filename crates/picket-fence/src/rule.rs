//! The admission rule: the one decision every backend makes, written once.
//!
//! A backend reads a resource's [`FenceRecord`], calls [`admit`] (or [`register`] or
//! [`check_read`]), and, only if the rule admits, writes the new record and the data in the same
//! atomic step: under one mutex, in one transaction, or in one conditional update.

mod presented;

pub use presented::{Presented, Stamp};

use crate::refusal::{Refusal, RefusalReason};
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;

/// How many idempotency keys a resource remembers unless its policy says otherwise: the last 32
/// keyed writes admitted.
pub const DEFAULT_REMEMBERED_KEYS: usize = 32;
/// The most keys a policy may ask a resource to remember: every write rewrites the record.
pub const MAX_REMEMBERED_KEYS: usize = 1_024;
/// How long a resource remembers an idempotency key unless its policy says otherwise: a day, as
/// payment APIs keep theirs.
pub const DEFAULT_REMEMBER_KEYS_FOR_MS: u64 = 24 * 60 * 60 * 1_000;
/// The longest a policy may ask a resource to remember a key: 30 days.
pub const MAX_REMEMBER_KEYS_FOR_MS: u64 = 30 * 24 * 60 * 60 * 1_000;

/// Longest idempotency key, in bytes.
pub const MAX_IDEMPOTENCY_KEY_BYTES: usize = 128;
/// Longest resource name, in bytes.
pub const MAX_RESOURCE_BYTES: usize = 512;

/// How a resource is guarded: the lock it belongs to, whether it is strict, and how many
/// idempotency keys it remembers and for how long.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Policy {
    /// The only lock whose tokens this resource accepts.
    pub lock: String,
    /// Strict mode: each grant gets exactly one admitted write (the seeds' `token <= max`
    /// refusal taken literally).
    pub strict: bool,
    /// How many keyed writes the resource remembers (1 to [`MAX_REMEMBERED_KEYS`]): the count
    /// bounds the record.
    #[serde(default = "default_remembered_keys")]
    pub remembered_keys: usize,
    /// How long, in milliseconds, the resource remembers a keyed write (1 to
    /// [`MAX_REMEMBER_KEYS_FOR_MS`]), by the `now_ms` its backend gives [`admit`]. A key is
    /// forgotten at whichever of the count and the time comes first.
    #[serde(default = "default_remember_keys_for_ms")]
    pub remember_keys_for_ms: u64,
}

fn default_remembered_keys() -> usize {
    DEFAULT_REMEMBERED_KEYS
}

fn default_remember_keys_for_ms() -> u64 {
    DEFAULT_REMEMBER_KEYS_FOR_MS
}

impl Policy {
    /// A non-strict policy binding a resource to `lock`.
    #[must_use]
    pub fn new(lock: impl Into<String>) -> Self {
        Self {
            lock: lock.into(),
            strict: false,
            remembered_keys: DEFAULT_REMEMBERED_KEYS,
            remember_keys_for_ms: DEFAULT_REMEMBER_KEYS_FOR_MS,
        }
    }

    /// The same policy remembering the last `count` keyed writes (clamped to 1 to
    /// [`MAX_REMEMBERED_KEYS`]).
    #[must_use]
    pub fn remembering_keys(mut self, count: usize) -> Self {
        self.remembered_keys = count.clamp(1, MAX_REMEMBERED_KEYS);
        self
    }

    /// The same policy remembering each keyed write for `ms` milliseconds (clamped to 1 to
    /// [`MAX_REMEMBER_KEYS_FOR_MS`]).
    #[must_use]
    pub fn remembering_keys_for_ms(mut self, ms: u64) -> Self {
        self.remember_keys_for_ms = ms.clamp(1, MAX_REMEMBER_KEYS_FOR_MS);
        self
    }

    /// The same policy in strict mode.
    #[must_use]
    pub fn strict(mut self) -> Self {
        self.strict = true;
        self
    }
}

/// What a fence keeps, durably, for one resource.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FenceRecord {
    /// The lock this resource is bound to. Fixed when the record is created.
    pub lock: String,
    /// Strict mode, fixed when the record is created.
    pub strict: bool,
    /// The highest token admitted or registered.
    pub highest_token: u64,
    /// The highest `seq` admitted under `highest_token`, if any write carried one.
    pub last_seq: Option<u64>,
    /// In strict mode: true once the grant of `highest_token` has had its one write. A token
    /// registered on acquire has not.
    pub spent: bool,
    /// Recently admitted writes that carried an idempotency key, oldest first.
    #[serde(default)]
    pub remembered: VecDeque<RememberedWrite>,
    /// The keys a record written before `remembered` existed holds: read, never written, and
    /// moved into `remembered` on the next admission (see [`FenceRecord::upgrade`]).
    #[serde(default, rename = "recent_keys", skip_serializing)]
    pub legacy_keys: VecDeque<(String, Stamp)>,
    /// The newest token of which a keyed write *without* a `seq` was forgotten (0 if none). A
    /// keyed write of that token without a `seq` whose key is not remembered may be a retry of
    /// it, and nothing else tells them apart: it is refused, never applied a second time.
    #[serde(default)]
    pub forgotten_unsequenced_token: u64,
}

/// An admitted write that carried an idempotency key.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RememberedWrite {
    /// Its idempotency key.
    pub key: String,
    /// Its stamp.
    pub stamp: Stamp,
    /// What it did, if the writer said ([`Presented::with_request`]).
    pub request_digest: Option<String>,
    /// When it was admitted, by the backend's `now_ms` (milliseconds since the Unix epoch).
    /// Absent in a record written before keys were remembered for a time: such a key's time
    /// starts at the record's next admission.
    #[serde(default)]
    pub admitted_at_ms: Option<u64>,
}

impl FenceRecord {
    /// Moves the keys of a record written by an earlier version into `remembered`, without a
    /// request digest (a retry of them is judged by key and stamp, as it was then), and starts
    /// the time of keys remembered before keys had one at `now_ms`.
    fn upgrade(&mut self, now_ms: u64) {
        for (key, stamp) in std::mem::take(&mut self.legacy_keys) {
            self.remembered.push_back(RememberedWrite {
                key,
                stamp,
                request_digest: None,
                admitted_at_ms: None,
            });
        }
        for write in &mut self.remembered {
            write.admitted_at_ms.get_or_insert(now_ms);
        }
    }

    /// Forgets the oldest keyed writes beyond the policy's count, and those remembered for the
    /// policy's time by `now_ms`.
    ///
    /// Keys are forgotten oldest first. After the backend's clock stepped back, a key admitted
    /// before the step can sit behind a younger one and is kept until that one goes: remembering
    /// a key longer only answers a late retry with its original outcome, and the count still
    /// bounds the record.
    fn forget_keys(&mut self, policy: &Policy, now_ms: u64) {
        let count = policy.remembered_keys.clamp(1, MAX_REMEMBERED_KEYS);
        let window_ms = policy.remember_keys_for_ms.clamp(1, MAX_REMEMBER_KEYS_FOR_MS);
        while let Some(oldest) = self.remembered.front() {
            let expired = oldest
                .admitted_at_ms
                .is_some_and(|admitted_ms| now_ms.saturating_sub(admitted_ms) >= window_ms);
            if self.remembered.len() <= count && !expired {
                break;
            }
            let forgotten = self.remembered.pop_front().expect("the oldest is there");
            if forgotten.stamp.seq.is_none() {
                self.forgotten_unsequenced_token =
                    self.forgotten_unsequenced_token.max(forgotten.stamp.token);
            }
        }
    }
}

impl FenceRecord {
    /// The record of a resource nothing has been admitted to yet.
    #[must_use]
    pub fn empty(policy: &Policy) -> Self {
        Self {
            lock: policy.lock.clone(),
            strict: policy.strict,
            highest_token: 0,
            last_seq: None,
            spent: false,
            remembered: VecDeque::new(),
            legacy_keys: VecDeque::new(),
            forgotten_unsequenced_token: 0,
        }
    }
}

/// How a write was admitted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Admission {
    /// A newer grant: its token is now the highest.
    Advanced {
        /// The highest token before, 0 if none.
        previous_token: u64,
    },
    /// The current grant writing again.
    Same,
    /// A retry of a write already admitted with the same stamp and idempotency key: report the
    /// original success and do not apply the write again.
    Duplicate,
}

impl Admission {
    /// False for a duplicate, whose write must not be applied a second time.
    #[must_use]
    pub fn should_apply(self) -> bool {
        !matches!(self, Self::Duplicate)
    }
}

/// Checks the inputs common to every call: resource name, lock binding and token.
fn check_common(
    resource: &str,
    record: &FenceRecord,
    presented_lock: &str,
    stamp: Stamp,
) -> Result<(), Refusal> {
    let refuse = |reason| Err(Refusal::new(resource, record, presented_lock, stamp, reason));
    if resource.is_empty() || resource.len() > MAX_RESOURCE_BYTES {
        return refuse(RefusalReason::InvalidResource);
    }
    if stamp.token == 0 {
        return refuse(RefusalReason::InvalidToken);
    }
    if presented_lock != record.lock {
        return refuse(RefusalReason::WrongLock);
    }
    Ok(())
}

/// Decides a write at `now_ms` (the backend's wall clock, milliseconds since the Unix epoch;
/// it only decides when idempotency keys are forgotten). On admission returns how, and the
/// record to store with the write; the caller must store both atomically or neither.
///
/// The rule reads no clock: time is an input, so the decision is the same whenever it is
/// replayed. A clock that jumps forward forgets keys early (a retry is then refused, never
/// applied twice); one that steps back keeps them longer.
///
/// # Errors
/// A [`Refusal`] when the write must not land; the record is then unchanged.
pub fn admit(
    resource: &str,
    current: Option<&FenceRecord>,
    policy: &Policy,
    presented: &Presented,
    now_ms: u64,
) -> Result<(Admission, FenceRecord), Refusal> {
    let mut record = current.cloned().unwrap_or_else(|| FenceRecord::empty(policy));
    let stamp = presented.stamp;
    check_common(resource, &record, &presented.lock, stamp)?;
    record.upgrade(now_ms);
    // Keys remembered for the policy's time are forgotten before the retry is judged. A policy
    // may also remember fewer keys than the record holds: it was written under another policy,
    // or the store was damaged or edited by hand.
    record.forget_keys(policy, now_ms);
    if let Some(key) = &presented.idempotency_key
        && let Some(duplicate) = judge_key(resource, &record, presented, key)?
    {
        return Ok((duplicate, record));
    }
    let admission = judge_stamp(resource, &mut record, presented)?;
    if let Some(key) = &presented.idempotency_key {
        record.remembered.push_back(RememberedWrite {
            key: key.clone(),
            stamp,
            request_digest: presented.request_digest.clone(),
            admitted_at_ms: Some(now_ms),
        });
        record.forget_keys(policy, now_ms);
    }
    assert!(record.highest_token >= stamp.token, "an admitted token is never above the highest");
    assert!(record.remembered.len() <= MAX_REMEMBERED_KEYS);
    Ok((admission, record))
}

/// The idempotency rule: `Some(Duplicate)` for a retry of a remembered write, `None` when the
/// key is new and the stamp rule decides.
fn judge_key(
    resource: &str,
    record: &FenceRecord,
    presented: &Presented,
    key: &str,
) -> Result<Option<Admission>, Refusal> {
    let stamp = presented.stamp;
    let refuse = |reason| Err(Refusal::new(resource, record, &presented.lock, stamp, reason));
    if key.is_empty() || key.len() > MAX_IDEMPOTENCY_KEY_BYTES {
        return refuse(RefusalReason::InvalidIdempotencyKey);
    }
    if let Some(seen) = record.remembered.iter().find(|seen| seen.key == key) {
        let same_request = match (&seen.request_digest, &presented.request_digest) {
            (Some(before), Some(now)) => before == now,
            // The first write said nothing of what it did (its writer never says, or it was
            // remembered by a version before digests, or by a service before the middleware
            // gave keyed writes one): the retry is taken at its word, as it was then, so a
            // retry across an upgrade gets its first outcome, not a refusal.
            (None, _) => true,
            // The first write said what it did and this one does not: it cannot be told the
            // same, and answering `Duplicate` would drop a different write unapplied (found in
            // review).
            (Some(_), None) => false,
        };
        if seen.stamp == stamp && same_request {
            return Ok(Some(Admission::Duplicate));
        }
        return refuse(RefusalReason::IdempotencyKeyReused { original: seen.stamp });
    }
    if stamp.seq.is_none()
        && stamp.token == record.highest_token
        && stamp.token == record.forgotten_unsequenced_token
    {
        return refuse(RefusalReason::IdempotencyWindowPassed);
    }
    Ok(None)
}

/// The stamp rule: stale, newer, or the same grant again (strict, or ordered by `seq`).
fn judge_stamp(
    resource: &str,
    record: &mut FenceRecord,
    presented: &Presented,
) -> Result<Admission, Refusal> {
    let stamp = presented.stamp;
    let refuse = |record: &FenceRecord, reason| {
        Err(Refusal::new(resource, record, &presented.lock, stamp, reason))
    };
    if stamp.token < record.highest_token {
        return refuse(record, RefusalReason::Stale);
    }
    if stamp.token > record.highest_token {
        let previous_token = record.highest_token;
        record.highest_token = stamp.token;
        record.last_seq = stamp.seq;
        record.spent = true;
        return Ok(Admission::Advanced { previous_token });
    }
    if record.strict {
        if record.spent {
            return refuse(record, RefusalReason::StrictRepeat);
        }
        record.spent = true;
        record.last_seq = stamp.seq;
        return Ok(Admission::Same);
    }
    if let (Some(seq), Some(last_seq)) = (stamp.seq, record.last_seq)
        && seq <= last_seq
    {
        return refuse(record, RefusalReason::Replay { last_seq });
    }
    record.last_seq = stamp.seq.or(record.last_seq);
    Ok(Admission::Same)
}

/// Decides one write that spans several resources at `now_ms` (see [`admit`]): admitted at all
/// of them or at none. Returns the overall admission and the new record of each resource, in
/// the order given.
///
/// A retry whose idempotency key any resource remembers with the same stamp is a duplicate as a
/// whole: nothing is applied and no record changes.
///
/// # Errors
/// The first [`Refusal`]; no record changes.
pub fn admit_all(
    resources: &[(&str, Option<&FenceRecord>, &Policy)],
    presented: &Presented,
    now_ms: u64,
) -> Result<(Admission, Vec<FenceRecord>), Refusal> {
    let mut records = Vec::with_capacity(resources.len());
    let mut overall = Admission::Same;
    for (resource, current, policy) in resources {
        let (admission, record) = admit(resource, *current, policy, presented, now_ms)?;
        overall = match (overall, admission) {
            (Admission::Duplicate, _) | (_, Admission::Duplicate) => Admission::Duplicate,
            (Admission::Advanced { previous_token }, _)
            | (_, Admission::Advanced { previous_token }) => Admission::Advanced { previous_token },
            (Admission::Same, Admission::Same) => Admission::Same,
        };
        records.push(record);
    }
    if overall == Admission::Duplicate {
        let unchanged = resources
            .iter()
            .map(|(_, current, policy)| {
                current.cloned().unwrap_or_else(|| FenceRecord::empty(policy))
            })
            .collect();
        return Ok((Admission::Duplicate, unchanged));
    }
    Ok((overall, records))
}

/// Fence on acquire: a new holder announces its token before it reads, so the previous holder's
/// writes stop landing at once. Registering a token that is already the highest changes nothing.
///
/// # Errors
/// A [`Refusal`] when the token is stale, zero, or of another lock.
pub fn register(
    resource: &str,
    current: Option<&FenceRecord>,
    policy: &Policy,
    lock: &str,
    token: u64,
) -> Result<FenceRecord, Refusal> {
    let mut record = current.cloned().unwrap_or_else(|| FenceRecord::empty(policy));
    let stamp = Stamp { token, seq: None };
    check_common(resource, &record, lock, stamp)?;
    if token < record.highest_token {
        return Err(Refusal::new(resource, &record, lock, stamp, RefusalReason::Stale));
    }
    if token > record.highest_token {
        record.highest_token = token;
        record.last_seq = None;
        record.spent = false;
    }
    Ok(record)
}

/// Checks a read's stamp: a reader whose grant was superseded is told so before it acts on what
/// it read. Reads change nothing.
///
/// # Errors
/// A [`Refusal`] when the token is stale, zero, or of another lock.
pub fn check_read(
    resource: &str,
    current: Option<&FenceRecord>,
    policy: &Policy,
    lock: &str,
    token: u64,
) -> Result<(), Refusal> {
    let empty;
    let record = match current {
        Some(record) => record,
        None => {
            empty = FenceRecord::empty(policy);
            &empty
        }
    };
    let stamp = Stamp { token, seq: None };
    check_common(resource, record, lock, stamp)?;
    if token < record.highest_token {
        return Err(Refusal::new(resource, record, lock, stamp, RefusalReason::Stale));
    }
    Ok(())
}

#[cfg(test)]
mod tests;
