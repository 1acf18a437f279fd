//! Picket's lock state machine: sessions with leases, exclusive locks with FIFO queues, and
//! fencing tokens.
//!
//! The crate is pure and deterministic. [`StateMachine::apply`] takes an [`Input`] (a
//! [`Command`] and the proposer's clock reading) and returns an [`Applied`]: the response and
//! the [`Event`]s for watchers. It never reads a clock, never does I/O and never draws a random
//! number, so every replica that applies the same inputs in the same order holds the same state,
//! byte for byte ([`StateMachine::snapshot`]).
//!
//! ```
//! use picket_core::{Command, Input, Limits, RequestId, Response, StateMachine, Wait};
//!
//! let mut machine = StateMachine::new(Limits::default());
//! let open = |now_ms| Input::new(now_ms, Command::OpenSession { ttl_ms: 2_000, lock_delay_ms: 0, owner: None });
//! let Ok(Response::SessionOpened { session: a, .. }) = machine.apply(&open(0)).result else { panic!() };
//! let Ok(Response::SessionOpened { session: b, .. }) = machine.apply(&open(0)).result else { panic!() };
//!
//! // A takes the lock; B queues behind it.
//! let acquire = |session| Command::Acquire {
//!     session,
//!     name: "report".into(),
//!     wait: Wait::Forever,
//!     request: RequestId(1),
//!     attempt: 0,
//! };
//! let first = machine.apply(&Input::new(10, acquire(a)));
//! let Ok(Response::Granted { token: token_a, .. }) = first.result else { panic!() };
//! machine.apply(&Input::new(20, acquire(b)));
//!
//! // A stops keeping its session alive; a tick past its deadline (2,000) and the expiry grace
//! // (500 ms) expires it and grants B.
//! machine.apply(&Input::new(2_600, Command::Tick { renew: vec![b], renew_for: vec![] }));
//! let holder = machine.lock("report").unwrap().holder.unwrap();
//! assert_eq!(holder.session, b);
//! assert!(holder.token > token_a);
//! ```

mod command;
mod error;
mod error_code;
mod limits;
mod machine;
mod name;
mod outcome;
mod query;
mod record;
pub mod seal;
mod sequencer;
mod types;

pub use command::{APPLY_RULES, CLUSTER_ID_HEX_DIGITS, Command, Input, is_cluster_id};
pub use error::{CommandError, NameError};
pub use error_code::ErrorCode;
pub use limits::{
    DEFAULT_SESSION_EXPIRY_GRACE_MS, InvalidLimits, Limits, MAX_NAME_BYTES_CAP, MAX_OWNER_BYTES,
    MAX_RENEWALS_PER_TICK_CAP,
};
pub use machine::{BrokenInvariant, RESTORE_EPOCH_SHIFT, RestoreError, StateMachine};
pub use name::validate_name;
pub use outcome::{Applied, Event, Response, WaitEnd};
pub use query::{
    CheckOutcome, HolderInfo, LockInfo, Occupancy, QueueSummary, SessionInfo, SessionLease,
};
pub use seal::{SealError, SequencerKeys, SequencerSigner, VerifyError};
pub use sequencer::{
    MAX_CLUSTER_ID_BYTES, MAX_SEQUENCER_BYTES, NAME_ESCAPES, Seal, Sequencer, SequencerError,
    decode_escaped, is_valid_cluster_id,
};
pub use types::{CancelCause, ReleaseCause, RequestId, SessionEnd, SessionId, Wait};
