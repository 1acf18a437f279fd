//! Picket's gRPC API, generated from `proto/picket.proto`.
//!
//! - [`v1::picket_client`] / [`v1::picket_server`]: the client service (sessions, locks, reads,
//!   watches, membership).
//! - [`v1::raft_client`] / [`v1::raft_server`]: node-to-node Raft traffic. Its messages carry
//!   openraft's own serialized requests, so the transport never has to mirror openraft's types.
//!
//! Beside them: [`connection`], the connection the Rust client and the peers use (HTTP/2, or
//! the same calls in Picket's own framing, [`wire`], where [`connection::Connection`]'s hot
//! unary calls, such as [`connection::Connection::acquire`], skip tonic's client stack);
//! [`http1`], the HTTP/1.1 client for the JSON API and fenced resources; [`tls`].
//!
//! Errors travel as a gRPC status whose message is meant for people, plus metadata for programs:
//! [`ERROR_CODE_KEY`] (the stable code), and where they apply [`LEADER_KEY`] and
//! [`HOLDER_TOKEN_KEY`].

pub mod connection;
pub mod http1;
pub mod tls;
mod unary;
pub mod wire;
mod wire_client;

/// The generated types of package `picket.v1`.
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod v1 {
    tonic::include_proto!("picket.v1");
}

/// Largest Raft message a node sends or takes, and largest answer to one it reads, in bytes:
/// bounds what a peer can make a node allocate (an `InstallSnapshot` carries the whole state).
pub const MAX_RAFT_MESSAGE_BYTES: usize = 256 << 20;
/// Most sessions one batched keepalive (`KeepAliveMany`, `POST /v1/sessions/keepalive`) may
/// name. Part of the wire contract: the server refuses more, the client never sends more.
pub const MAX_KEEPALIVE_BATCH: usize = 10_000;

/// Most sessions one watch stream may follow. The server refuses more; the client splits its
/// sessions over several streams below it.
pub const MAX_WATCHED_SESSIONS: usize = 10_000;

/// Metadata key of an error's stable code, e.g. `lock_busy`.
pub const ERROR_CODE_KEY: &str = "picket-error-code";
/// Metadata key of the leader's address when a follower refuses a request.
pub const LEADER_KEY: &str = "picket-leader";
/// Metadata key of the current holder's token when a lock is busy.
pub const HOLDER_TOKEN_KEY: &str = "picket-holder-token";
/// Metadata key of an error's outcome: `not_applied` (nothing changed, retrying is safe) or
/// `unknown` (it may have been applied: read the state before retrying).
pub const OUTCOME_KEY: &str = "picket-outcome";
/// Header (HTTP) or metadata key (gRPC) naming the cluster a request expects: a node of another
/// cluster refuses it (`other_cluster`) before anything else.
pub const EXPECT_CLUSTER_KEY: &str = "picket-expect-cluster";
/// Header or metadata key that lets a node of a cluster restored from the expected one take the
/// request: its client follows its cluster to the restore.
pub const FOLLOW_RESTORE_KEY: &str = "picket-follow-restore";
/// Header on every HTTP answer of a node whose cluster is named: the cluster's id.
pub const CLUSTER_ID_KEY: &str = "picket-cluster-id";
