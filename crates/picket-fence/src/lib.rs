//! The resource side of Picket: a write lands only if its fencing token is current.
//!
//! A lock service can tell a client it holds a lock; only the resource can make that true. For
//! every guarded resource the fence keeps the lock it is bound to and the highest token it has
//! admitted, and it decides every write with one rule ([`rule::admit`], SPEC §2):
//!
//! - a token of another lock is refused (tokens of different locks cannot be compared);
//! - `token < highest`: **stale**, refused: a newer grant has reached the resource;
//! - `token > highest`: a newer grant, admitted; it becomes the highest;
//! - `token == highest`: the same grant writing again, admitted, unless it carries a `seq` that
//!   is not greater than the last admitted one (a replay); in **strict** mode refused, so each
//!   grant gets exactly one write.
//!
//! The decision and the write are one atomic step in every backend:
//!
//! - [`Guarded`]: a value behind a mutex, for a resource inside one process;
//! - [`FencedStore`]: a durable key-value table in redb, fence records in the same transaction;
//! - `postgres` (feature `postgres`): a SQL function called inside the caller's own transaction.
//!
//! With the `http` feature, [`http`] is a middleware for axum services: it reads the stamp
//! from headers, verifies advancing tokens with the lock service, and answers refusals with a
//! structured 409.
//!
//! [`rule`] reads no clock: the backends give it the time from their [`WallClock`] (it only
//! decides when idempotency keys are forgotten), so every decision can be replayed.
//!
//! A refusal is a [`Refusal`] naming the resource, its lock, the presented stamp and the highest
//! token, so the client can re-read the grant instead of guessing.

mod clock;
mod guarded;
#[cfg(feature = "http")]
pub mod http;
#[cfg(feature = "postgres")]
pub mod postgres;
mod refusal;
pub mod rule;
mod store;

pub use clock::WallClock;
pub use guarded::{Guarded, Written};
pub use refusal::{Refusal, RefusalReason};
pub use rule::{Admission, FenceRecord, Policy, Presented, RememberedWrite, Stamp};
pub use store::{
    FencedStore, MAX_KEY_BYTES, MAX_SCAN, MAX_VALUE_BYTES, ResourceGuard, StoreError, Unit,
    WriteError,
};
