//! The fence in PostgreSQL: a table and a function that any language can call inside its own
//! transaction, and a Rust helper that does so through tokio-postgres.
//!
//! ```sql
//! BEGIN;
//! SELECT admitted, reason, highest_token
//!   FROM picket_fence_admit('orders/', 'orders', false, 'orders', 34, NULL);
//! -- admitted: do the write in this same transaction, then COMMIT.
//! -- refused:  ROLLBACK (nothing was changed) and tell the client `reason`.
//! COMMIT;
//! ```
//!
//! The function locks the resource's row (`SELECT ... FOR UPDATE`), so concurrent writers to one
//! resource queue behind each other until the first commits: the check and the write are one
//! atomic step, and the highest token is durable when the transaction commits. Tokens are
//! PostgreSQL `bigint`: tokens above 2^63 − 1 are refused by the Rust helper before they reach the
//! database. Idempotency keys are not kept in PostgreSQL: a write that presents one is refused
//! ([`PgFenceError::KeysNotKept`]) rather than admitted again on a retry; use a unique key in
//! your own table, in the same transaction.
//!
//! **Signed sequencers are verified in the caller, not in SQL.** The function trusts the lock
//! name and token it is given. A caller that holds the lock service's public keys verifies the
//! sequencer first ([`admit_signed`], or [`Presented::verified`] then [`admit`]), so a forged
//! token never reaches the table; PostgreSQL has no Ed25519 of its own.

use crate::refusal::{Refusal, RefusalReason};
use crate::rule::{Admission, FenceRecord, Policy, Presented, Stamp};
use thiserror::Error;
use tokio_postgres::GenericClient;

/// The migration that installs the table and the functions. Idempotent: run it at every start.
pub const MIGRATION: &str = include_str!("picket_fence.sql");

/// Why a PostgreSQL fence call failed.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum PgFenceError {
    /// The fence refused; roll the transaction back.
    #[error(transparent)]
    Refused(Box<Refusal>),
    /// The database failed.
    #[error("the PostgreSQL fence failed: {}", database_detail(.0))]
    Database(#[from] tokio_postgres::Error),
    /// The sequencer's signature does not verify with the lock service's public keys.
    #[error("the sequencer was refused before the database: {0}")]
    BadSignature(#[from] picket_core::SealError),
    /// The sequencer is not one.
    #[error("the sequencer was refused before the database: {0}")]
    BadSequencer(#[from] picket_core::SequencerError),
    /// The write presented an idempotency key, which the PostgreSQL fence does not keep: a
    /// retry with the same key would be admitted and applied again, not answered with the
    /// first outcome as the other fences do. Refused rather than ignored.
    #[error(
        "the PostgreSQL fence keeps no idempotency keys, so a retry with this key would be applied twice: make the write idempotent in its own table (a unique key, in the same transaction) and present no key"
    )]
    KeysNotKept,
    /// A seq above PostgreSQL's `bigint` (2^63 − 1), which the fence cannot store. (A token
    /// above it is refused as `invalid_token`: no grant of the lock service comes near it.)
    #[error(
        "the {what} {value} is above 2^63 - 1, which the PostgreSQL fence cannot store; number the writes of a grant from a smaller seq"
    )]
    OutOfRange {
        /// `seq`.
        what: &'static str,
        /// The value presented.
        value: u64,
    },
    /// The function answered something this helper does not know (a newer migration?).
    #[error("the PostgreSQL fence answered {0:?}: run this version's MIGRATION")]
    Unexpected(String),
}

/// tokio-postgres prints a server error as just "db error"; the server's own words are in the
/// source.
fn database_detail(error: &tokio_postgres::Error) -> String {
    match error.as_db_error() {
        Some(db) => format!("{} ({})", db.message(), db.code().code()),
        None => error.to_string(),
    }
}

/// Installs (or updates) the fence's table and functions.
///
/// # Errors
/// When the database refuses the migration.
pub async fn migrate(client: &impl GenericClient) -> Result<(), PgFenceError> {
    client.batch_execute(MIGRATION).await?;
    Ok(())
}

/// `value` as PostgreSQL's `bigint`, or why not. (A seq past it was clamped to the bound, so
/// two such seqs read as one and the second was refused as a replay.)
fn to_bigint(what: &'static str, value: u64) -> Result<i64, PgFenceError> {
    i64::try_from(value).map_err(|_| PgFenceError::OutOfRange { what, value })
}

fn reason_from(code: &str, seq: Option<u64>) -> Option<RefusalReason> {
    Some(match code {
        "stale_token" => RefusalReason::Stale,
        "wrong_lock" => RefusalReason::WrongLock,
        "strict_repeat" => RefusalReason::StrictRepeat,
        "replayed_seq" => RefusalReason::Replay { last_seq: seq.unwrap_or_default() },
        "invalid_token" => RefusalReason::InvalidToken,
        "invalid_resource" => RefusalReason::InvalidResource,
        _ => return None,
    })
}

fn refusal(
    resource: &str,
    policy: &Policy,
    presented_lock: &str,
    stamp: Stamp,
    highest: i64,
    reason: RefusalReason,
) -> PgFenceError {
    let mut record = FenceRecord::empty(policy);
    record.highest_token = u64::try_from(highest).unwrap_or(0);
    PgFenceError::Refused(Box::new(Refusal::new(resource, &record, presented_lock, stamp, reason)))
}

/// Runs the admission rule for `presented` at `resource` inside the caller's `transaction`.
/// On `Ok`, perform the write in the same transaction and commit; on `Err(Refused)`, roll back.
///
/// It takes a transaction, not any client: the function's row lock is what makes the check
/// and the write one step, and outside a transaction it ends with the statement, so a writer
/// admitted and then paused could write after a newer token was admitted (found in review:
/// this took any `GenericClient`, an autocommit `Client` too).
///
/// # Errors
/// [`PgFenceError::Refused`] with the structured refusal; [`PgFenceError::OutOfRange`];
/// database failures.
pub async fn admit(
    transaction: &tokio_postgres::Transaction<'_>,
    resource: &str,
    policy: &Policy,
    presented: &Presented,
) -> Result<Admission, PgFenceError> {
    if presented.idempotency_key.is_some() {
        return Err(PgFenceError::KeysNotKept);
    }
    let stamp = presented.stamp;
    let Ok(token) = to_bigint("token", stamp.token) else {
        // A refusal like any other of a grant's, so that a caller answers it as one.
        return Err(refusal(
            resource,
            policy,
            &presented.lock,
            stamp,
            0,
            RefusalReason::InvalidToken,
        ));
    };
    let seq = stamp.seq.map(|seq| to_bigint("seq", seq)).transpose()?;
    let client = transaction;
    let row = client
        .query_one(
            "SELECT admitted, reason, highest_token FROM picket_fence_admit($1, $2, $3, $4, $5, $6)",
            &[&resource, &policy.lock, &policy.strict, &presented.lock, &token, &seq],
        )
        .await?;
    let (admitted, code, highest): (bool, String, i64) = (row.get(0), row.get(1), row.get(2));
    match (admitted, code.as_str()) {
        (true, "advanced") => {
            Ok(Admission::Advanced { previous_token: u64::try_from(highest).unwrap_or(0) })
        }
        (true, "same") => Ok(Admission::Same),
        (false, code) => {
            let last_seq =
                if code == "replayed_seq" { last_seq(client, resource).await? } else { None };
            let reason = reason_from(code, last_seq)
                .ok_or_else(|| PgFenceError::Unexpected(code.to_owned()))?;
            Err(refusal(resource, policy, &presented.lock, stamp, highest, reason))
        }
        (true, other) => Err(PgFenceError::Unexpected(other.to_owned())),
    }
}

/// [`admit`] for a signed sequencer string: parsed and verified with the lock service's
/// public keys first, so a forged or altered one is refused without touching the database.
///
/// # Errors
/// [`PgFenceError::BadSequencer`], [`PgFenceError::BadSignature`], and [`admit`]'s errors.
pub async fn admit_signed(
    transaction: &tokio_postgres::Transaction<'_>,
    resource: &str,
    policy: &Policy,
    sequencer: &str,
    keys: &picket_core::SequencerKeys,
) -> Result<Admission, PgFenceError> {
    let presented = verified(sequencer, keys)?;
    admit(transaction, resource, policy, &presented).await
}

/// A sequencer string, parsed and verified exactly as received.
fn verified(sequencer: &str, keys: &picket_core::SequencerKeys) -> Result<Presented, PgFenceError> {
    match keys.verify_text(sequencer) {
        Ok(sequencer) => Ok(Presented::from_sequencer(&sequencer)),
        Err(picket_core::VerifyError::Malformed(error)) => Err(PgFenceError::BadSequencer(error)),
        Err(picket_core::VerifyError::Seal(error)) => Err(PgFenceError::BadSignature(error)),
        Err(other) => Err(PgFenceError::Unexpected(other.to_string())),
    }
}

async fn last_seq(
    client: &impl GenericClient,
    resource: &str,
) -> Result<Option<u64>, PgFenceError> {
    let row = client
        .query_opt("SELECT last_seq FROM picket_fence WHERE resource = $1", &[&resource])
        .await?;
    Ok(row.and_then(|row| row.get::<_, Option<i64>>(0)).and_then(|seq| u64::try_from(seq).ok()))
}

/// [`register`] for a signed sequencer string (fence on acquire): parsed and verified with the
/// lock service's public keys first, so a forged huge token can never become the highest.
///
/// # Errors
/// [`PgFenceError::BadSequencer`], [`PgFenceError::BadSignature`], and [`register`]'s errors.
pub async fn register_signed(
    client: &impl GenericClient,
    resource: &str,
    policy: &Policy,
    sequencer: &str,
    keys: &picket_core::SequencerKeys,
) -> Result<(), PgFenceError> {
    let presented = verified(sequencer, keys)?;
    register(client, resource, policy, &presented.lock, presented.stamp.token).await
}

/// Fence on acquire: makes `token` the highest at `resource` unless a newer one was seen.
/// Commit the transaction afterwards. (Unlike [`admit`], this may run outside a transaction:
/// it is one statement, and no write of the caller's depends on it.)
///
/// # Errors
/// [`PgFenceError::Refused`] for a stale token or another lock; [`PgFenceError::OutOfRange`];
/// database failures.
pub async fn register(
    client: &impl GenericClient,
    resource: &str,
    policy: &Policy,
    lock: &str,
    token: u64,
) -> Result<(), PgFenceError> {
    let stamp = Stamp { token, seq: None };
    let Ok(token_bigint) = to_bigint("token", token) else {
        return Err(refusal(resource, policy, lock, stamp, 0, RefusalReason::InvalidToken));
    };
    let row = client
        .query_one(
            "SELECT admitted, reason, highest_token FROM picket_fence_register($1, $2, $3, $4, $5)",
            &[&resource, &policy.lock, &policy.strict, &lock, &token_bigint],
        )
        .await?;
    let (admitted, code, highest): (bool, String, i64) = (row.get(0), row.get(1), row.get(2));
    if admitted {
        return Ok(());
    }
    let reason = reason_from(&code, None).ok_or_else(|| PgFenceError::Unexpected(code.clone()))?;
    Err(refusal(resource, policy, lock, stamp, highest, reason))
}

/// The highest token recorded for `resource`, 0 if none.
///
/// # Errors
/// Database failures.
pub async fn highest_token(
    client: &impl GenericClient,
    resource: &str,
) -> Result<u64, PgFenceError> {
    let row = client
        .query_opt("SELECT highest_token FROM picket_fence WHERE resource = $1", &[&resource])
        .await?;
    Ok(row.map_or(0, |row| u64::try_from(row.get::<_, i64>(0)).unwrap_or(0)))
}

#[cfg(test)]
mod tests {
    /// The Python client ships the migration too (`picket.fence.migrate`): the same bytes, so
    /// a database fenced from Rust and from Python runs one function.
    #[test]
    fn the_python_client_ships_the_same_migration() {
        let python = include_str!("../../../clients/python/src/picket/picket_fence.sql");
        assert!(
            python == super::MIGRATION,
            "copy crates/picket-fence/src/picket_fence.sql to clients/python/src/picket/"
        );
    }
}
