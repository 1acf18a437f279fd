//! openraft's type configuration for Picket, and short names for the types it derives.
//!
//! This module and the storage, state machine and network modules are the only places that name
//! openraft types, so an openraft upgrade stays inside them.

use picket_core::Applied;
use serde::{Deserialize, Serialize};

/// A node's id in the cluster. Never reuse the id of a removed node for a node with an empty log.
pub type NodeId = u64;

/// What applying one log entry answers the proposer.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum EntryReply {
    /// The entry was a blank or membership entry: nothing for the lock service to say.
    None,
    /// The lock state machine's answer.
    Applied(Applied),
}

openraft::declare_raft_types!(
    /// Picket's Raft types: log entries carry [`picket_core::Input`]s.
    pub TypeConfig:
        D = picket_core::Input,
        R = EntryReply,
        NodeId = NodeId,
        Node = openraft::BasicNode,
);

/// The Raft handle of a node.
pub type Raft = openraft::Raft<TypeConfig, crate::state_machine::StateStore>;
pub type LogId = openraft::alias::LogIdOf<TypeConfig>;
pub type Entry = openraft::alias::EntryOf<TypeConfig>;
pub type Vote = openraft::alias::VoteOf<TypeConfig>;
pub type StoredMembership = openraft::alias::StoredMembershipOf<TypeConfig>;
pub type SnapshotMeta = openraft::alias::SnapshotMetaOf<TypeConfig>;
/// Snapshot data is the encoded state machine, in memory.
pub type Snapshot = openraft::alias::SnapshotOf<TypeConfig, Vec<u8>>;
