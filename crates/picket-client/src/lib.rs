//! Rust client for Picket.
//!
//! ```no_run
//! # async fn example() -> Result<(), picket_client::ClientError> {
//! use std::time::Duration;
//!
//! // Any member will do; the client finds and follows the leader.
//! let client = picket_client::Client::connect(["127.0.0.1:7687"]).await?;
//! // A session kept alive in the background at a third of its TTL.
//! let session = client.session(Duration::from_secs(10)).await?;
//! let guard = session.lock("jobs/nightly-report").await?;
//! println!("holding token {} ({})", guard.token(), guard.sequencer());
//! tokio::select! {
//!     reason = guard.lost() => eprintln!("lost the lock: {reason:?}; stop writing"),
//!     () = tokio::time::sleep(Duration::from_secs(1)) => {
//!         // Do the work, sending guard.sequencer() with every write to a fenced resource.
//!     }
//! }
//! guard.release().await?;
//! # Ok(())
//! # }
//! ```
//!
//! Calls go to the leader (followed through `not_leader` refusals), retry across endpoints and
//! elections for [`ClientConfig::retry_for`], and never resend a call that is not safe to repeat
//! (opening a session) once it may have been sent: such a call fails with
//! [`ClientError::OutcomeUnknown`] instead.

mod client;
mod error;
mod guard;
mod info;
mod keepalive;
mod lease_clock;
mod session;
mod state;
mod transport;
mod watch;
mod watcher;

pub use client::{BackupChunks, Client};
pub use error::{ClientError, ErrorCode, LostReason};
pub use guard::{FenceRegistration, Guard, RegistrationError, Released};
pub use info::{Grant, Holder, LockState, SessionSummary};
pub use picket_core::{CheckOutcome, Sequencer, SessionId, Wait};
pub use picket_proto::connection::Protocol;
pub use picket_proto::tls::{ClientTls, TlsError};
pub use picket_proto::v1::watch_request::Target as WatchTarget;
pub use picket_proto::v1::{ClusterInfo, WatchEvent};
pub use session::Session;
pub use transport::ClientConfig;
pub use watch::{WatchStream, Watched, watched};
