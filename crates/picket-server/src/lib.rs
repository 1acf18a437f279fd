//! Picket's lock service: [`picket_core`]'s state machine replicated with openraft, its log in
//! Picket's own write-ahead log, and served over gRPC and HTTP/JSON on one port.
//!
//! ```text
//!  gRPC (tonic) ─┐                     ┌─► log_store: log + vote in the WAL, group commit
//!                ├─► node ─► openraft ─┤
//!  HTTP (axum) ──┘    ▲                └─► state_machine: picket-core + snapshots ─► hub
//!                     │                                                     (waiters, watches)
//!                  driver: the leader proposes Refresh, then Ticks carrying keepalives
//!                  (renewals), or a Refresh again after the clock lost time (clock)
//! ```
//!
//! Start a node with [`start`]; [`ServerConfig::single`] is a one-node cluster.

pub mod apply_rules;
pub mod auth;
pub mod backup;
pub mod client_clocks;
pub mod clock;
mod driver;
pub mod error;
mod framing;
pub mod grpc;
mod guarded;
pub mod http;
mod hub;
pub mod limits;
mod listener;
mod log_store;
pub mod metrics;
#[cfg(feature = "mutations")]
mod mutation;
mod network;
pub mod node;
mod raft_types;
mod rate;
mod reload;
mod renewals;
mod server;
mod snapshot_cadence;
mod state_machine;
pub mod tls;
mod wal;

/// Whether this build has the test storage faults and deliberate bugs (`picket-server`'s
/// `mutations` feature, which only test builds enable): the fault harness's power losses,
/// failing syncs and most mutations need them.
pub const TEST_FAULTS_COMPILED: bool = cfg!(feature = "mutations");

/// For the fault harness's power-loss faults: erases from a killed node's Raft log (in its data
/// directory) what a power cut would have lost, going by the synced end its flusher noted when
/// it ran with `PICKET_TEST_SYNCED_MARK` set (test builds only): all of what was written after
/// it but the first `keep_permille` thousandths (a disk may have written any prefix of it; a
/// cut inside a frame tears it). Returns the bytes erased, or `None` when the node noted no
/// synced end (its build has no test storage faults).
///
/// # Errors
/// When the log cannot be read or written.
pub fn erase_unsynced_log_writes(
    data_dir: &std::path::Path,
    keep_permille: u16,
) -> std::io::Result<Option<u64>> {
    wal::erase_unsynced(&data_dir.join(log_store::LOG_DIR), keep_permille)
}

pub use error::ServiceError;
pub use guarded::Guarded;
pub use limits::{ServerLimit, ServerLimits};
pub use log_store::{StoredEntry, WriterStats, read_entries};
pub use network::COMMITTED_ENTRY_LOST;
pub use node::{
    AcquireRequest, ClusterView, Grant, Node, NotReady, WatchItem, WatchStream, Watched,
};
pub use raft_types::{Member, NodeId};
pub use server::{
    DEFAULT_CLUSTER_ID, DEFAULT_PORT, MAX_WAL_SEGMENT_BYTES, MIN_WAL_SEGMENT_BYTES, RaftTuning,
    ServerConfig, ServerHandle, StartError, start,
};

#[cfg(test)]
mod storage_suite {
    //! openraft's storage conformance suite, run against the WAL log store and the state
    //! machine store as deployed.

    use crate::hub::Hub;
    use crate::log_store::LogStore;
    use crate::raft_types::TypeConfig;
    use crate::state_machine::StateStore;
    use openraft::StorageError;
    use openraft::testing::log::{StoreBuilder, Suite};
    use std::sync::Arc;

    struct Builder;

    impl StoreBuilder<TypeConfig, LogStore, StateStore, tempfile::TempDir> for Builder {
        async fn build(
            &self,
        ) -> Result<(tempfile::TempDir, LogStore, StateStore), StorageError<TypeConfig>> {
            let dir = tempfile::tempdir().expect("a temporary directory");
            let log =
                LogStore::open(dir.path(), crate::wal::SEGMENT_BYTES, None).expect("the log opens");
            let store = StateStore::open(
                dir.path(),
                picket_core::Limits::default(),
                Arc::default(),
                Arc::new(Hub::default()),
                Arc::default(),
            )
            .expect("the state opens");
            Ok((dir, log, store))
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn log_store_and_state_machine_pass_the_openraft_suite() {
        Suite::test_all(Builder).await.expect("the storage suite passes");
    }
}
