//! Picket's lock service: [`picket_core`]'s state machine replicated with openraft, stored in
//! redb, and served over gRPC and HTTP/JSON on one port.
//!
//! ```text
//!  gRPC (tonic) ─┐                     ┌─► log_store: redb log + vote, group commit
//!                ├─► node ─► openraft ─┤
//!  HTTP (axum) ──┘    ▲                └─► state_machine: picket-core + snapshots ─► hub
//!                     │                                                     (waiters, watches)
//!                  driver: the leader proposes Refresh, then Ticks carrying keepalives
//! ```
//!
//! Start a node with [`start`]; [`ServerConfig::single`] is a one-node cluster.

mod driver;
pub mod error;
pub mod grpc;
pub mod http;
mod hub;
mod log_store;
mod network;
pub mod node;
mod raft_types;
mod server;
mod state_machine;

pub use error::ServiceError;
pub use hub::WaitOutcome;
pub use log_store::WriterStats;
pub use node::{ClusterView, Grant, Node, WatchItem, WatchTarget};
pub use raft_types::NodeId;
pub use server::{DEFAULT_PORT, RaftTuning, ServerConfig, ServerHandle, StartError, start};
