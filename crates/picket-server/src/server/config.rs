//! How a node is set up: its configuration, the Raft tuning it runs with, and why it may fail
//! to start.

use crate::clock::ClockSource;
use crate::limits::ServerLimits;
use crate::raft_types::{Member, NodeId};
use crate::tls::TlsFiles;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use thiserror::Error;

/// The cluster id signed sequencers carry unless `--cluster-id` says otherwise.
pub const DEFAULT_CLUSTER_ID: &str = "picket";

/// The default client and peer port.
pub const DEFAULT_PORT: u16 = 7687;

/// Raft timing and log compaction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RaftTuning {
    /// Leader heartbeat period.
    pub heartbeat_ms: u64,
    /// Shortest election timeout.
    pub election_timeout_min_ms: u64,
    /// Longest election timeout.
    pub election_timeout_max_ms: u64,
    /// Build a snapshot after this many log entries since the last one, or after an eighth of
    /// the state's sessions and locks when that is more (`snapshot_cadence`).
    pub snapshot_every_entries: u64,
    /// Entries kept in the log behind a snapshot, for followers that are only a little behind.
    pub keep_entries_after_snapshot: u64,
    /// The space allocated up front for each segment of the log's write-ahead log, between
    /// [`MIN_WAL_SEGMENT_BYTES`] and [`MAX_WAL_SEGMENT_BYTES`]. A segment grows past it only
    /// to hold a checkpoint of the live log.
    pub wal_segment_bytes: u64,
}

/// The smallest WAL segment accepted.
pub const MIN_WAL_SEGMENT_BYTES: u64 = 64 * 1024;

/// The largest WAL segment accepted.
pub const MAX_WAL_SEGMENT_BYTES: u64 = 1024 * 1024 * 1024;

impl Default for RaftTuning {
    fn default() -> Self {
        Self {
            heartbeat_ms: 100,
            election_timeout_min_ms: 500,
            election_timeout_max_ms: 1_000,
            snapshot_every_entries: 20_000,
            keep_entries_after_snapshot: 1_000,
            wal_segment_bytes: crate::wal::SEGMENT_BYTES,
        }
    }
}

/// How to run one node.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// This node's id. Never reuse the id of a removed node.
    pub node_id: NodeId,
    /// Where to listen for clients and peers.
    pub listen: SocketAddr,
    /// The address clients (and peers, without `peer_listen`) use to reach this node; defaults
    /// to the bound address.
    pub advertise: Option<String>,
    /// Serve peers' Raft traffic on this address instead of `listen`, with its own connection
    /// bound (`ServerLimits::max_peer_connections`); `listen` then serves clients only. `None`:
    /// one port for both.
    pub peer_listen: Option<SocketAddr>,
    /// The address peers use to reach `peer_listen`; defaults to the bound peer address.
    pub peer_advertise: Option<String>,
    /// Where the log, the vote and snapshots live.
    pub data_dir: PathBuf,
    /// The initial voters, id to addresses, this node included. Empty: a one-node cluster.
    pub peers: BTreeMap<NodeId, Member>,
    /// Start without forming a cluster, waiting to be added as a member by the leader.
    pub join: bool,
    /// Raft timing and compaction.
    pub tuning: RaftTuning,
    /// Where the lock state's time comes from: the monotonic clock, or a script in fault tests.
    pub clock: ClockSource,
    /// This node's own bounds (watch streams, acquires in flight).
    pub limits: ServerLimits,
    /// TLS on the port and toward peers; `None` serves plaintext.
    pub tls: Option<TlsFiles>,
    /// The principals and their roles (see [`crate::auth`]); `None` lets anyone who reaches the
    /// port do anything.
    pub auth_file: Option<PathBuf>,
    /// Sign every grant's sequencer with this Ed25519 key (PEM PKCS#8), so resources can verify
    /// sequencers with the public key alone; `None` issues unsigned `p1.` sequencers.
    pub signing_key: Option<PathBuf>,
    /// The cluster's id, inside every signed sequencer: a resource trusts one cluster's grants.
    pub cluster_id: String,
    /// Restore the lock state from this backup (`picket snapshot save`) into an empty data
    /// directory, as the start of a new restore epoch (see [`crate::backup`]). A restart with
    /// the same backup keeps what the node did since.
    pub restore: Option<PathBuf>,
    /// How to restore (`restore` set): keep the backup's sessions, start above a token.
    pub restore_options: crate::backup::RestoreOptions,
    /// The `prefix` label values of lock-level metrics (see [`crate::metrics`]); empty: each
    /// name's first path segment, bounded.
    pub metrics_prefixes: Vec<String>,
    /// Serve plaintext on an address other than loopback. Without it such a node refuses to
    /// start: anyone who can reach the port could then act as any client or as a peer.
    pub insecure_plaintext: bool,
    /// Serve clients without credentials (TLS, no auth file) on an address other than
    /// loopback. Without it such a node refuses to start: anyone whose client trusts the CA
    /// could end, keep alive or release any session's locks.
    pub insecure_anonymous_clients: bool,
}

impl ServerConfig {
    /// A one-node configuration with data in `data_dir`, listening on `listen`.
    #[must_use]
    pub fn single(data_dir: impl Into<PathBuf>, listen: SocketAddr) -> Self {
        Self {
            node_id: 1,
            listen,
            advertise: None,
            peer_listen: None,
            peer_advertise: None,
            data_dir: data_dir.into(),
            peers: BTreeMap::new(),
            join: false,
            tuning: RaftTuning::default(),
            clock: ClockSource::Monotonic,
            limits: ServerLimits::default(),
            tls: None,
            auth_file: None,
            signing_key: None,
            cluster_id: DEFAULT_CLUSTER_ID.to_owned(),
            restore: None,
            restore_options: crate::backup::RestoreOptions::default(),
            metrics_prefixes: Vec::new(),
            insecure_plaintext: false,
            insecure_anonymous_clients: false,
        }
    }
}

/// Why a node could not start.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum StartError {
    /// The data directory is unusable.
    #[error("cannot use data directory {path}: {source}")]
    DataDir {
        /// The directory.
        path: PathBuf,
        /// What failed.
        source: std::io::Error,
    },
    /// The data directory belongs to another node.
    #[error(
        "data directory {path} belongs to node {found}, not node {configured}: point --data-dir at this node's own directory"
    )]
    WrongNode {
        /// The directory.
        path: PathBuf,
        /// The node id stored there.
        found: NodeId,
        /// The node id configured.
        configured: NodeId,
    },
    /// The configuration is inconsistent.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// The listen address cannot be bound.
    #[error(
        "cannot listen on {addr}: {source}; is another server using the port? Choose another with --listen"
    )]
    Listen {
        /// The address.
        addr: SocketAddr,
        /// What failed.
        source: std::io::Error,
    },
    /// Raft could not start.
    #[error("the consensus engine could not start: {0}")]
    Raft(String),
    /// The backup could not be restored.
    #[error(transparent)]
    Restore(#[from] crate::backup::BackupError),
}
