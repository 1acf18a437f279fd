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

/// A cluster member's addresses, as the membership in the log records them.
///
/// Clients reach a member at `addr`. Peers reach it at `peer_addr` when it serves Raft on a port
/// of its own (`--peer-listen`), else at `addr` too. Without a peer address a member serializes
/// exactly as openraft's `BasicNode` did (`{"addr": ...}`), so logs and snapshots written before
/// the peer port existed read the same.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    /// Where clients reach the member: gRPC and HTTP/JSON.
    pub addr: String,
    /// Where peers reach the member's Raft service, if not at `addr`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer_addr: Option<String>,
}

impl Member {
    /// A member that serves clients and peers on one port.
    #[must_use]
    pub fn new(addr: impl Into<String>) -> Self {
        Self { addr: addr.into(), peer_addr: None }
    }

    /// A member that serves peers on a port of its own; `peer_addr` `None`, or the same as
    /// `addr`, means one port.
    #[must_use]
    pub fn with_peer_addr(addr: impl Into<String>, peer_addr: Option<String>) -> Self {
        let addr = addr.into();
        let peer_addr = peer_addr.filter(|peer_addr| *peer_addr != addr);
        Self { addr, peer_addr }
    }

    /// Where peers send this member Raft messages.
    #[must_use]
    pub fn peer_addr(&self) -> &str {
        self.peer_addr.as_deref().unwrap_or(&self.addr)
    }
}

impl std::fmt::Display for Member {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.peer_addr {
            Some(peer_addr) => write!(f, "{} (peers: {peer_addr})", self.addr),
            None => write!(f, "{}", self.addr),
        }
    }
}

openraft::declare_raft_types!(
    /// Picket's Raft types: log entries carry [`picket_core::Input`]s.
    pub TypeConfig:
        D = picket_core::Input,
        R = EntryReply,
        NodeId = NodeId,
        Node = Member,
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

#[cfg(test)]
mod tests {
    use super::Member;

    /// Logs and snapshots written before members had peer addresses hold openraft's
    /// `BasicNode`; they must read as a one-port member, and a one-port member must write the
    /// same bytes, so nodes of both builds agree on what a membership entry says.
    #[test]
    fn a_one_port_member_reads_and_writes_as_a_basic_node_did() {
        let old = serde_json::to_string(&openraft::BasicNode { addr: "127.0.0.1:7687".into() })
            .expect("serializes");
        let member: Member = serde_json::from_str(&old).expect("an old member reads");
        assert_eq!(member, Member::new("127.0.0.1:7687"));
        assert_eq!(serde_json::to_string(&member).expect("serializes"), old);
        assert_eq!(member.peer_addr(), "127.0.0.1:7687");
        let split = Member::with_peer_addr("127.0.0.1:7687", Some("127.0.0.1:7688".into()));
        let bytes = serde_json::to_string(&split).expect("serializes");
        assert_eq!(serde_json::from_str::<Member>(&bytes).expect("reads"), split);
        assert_eq!(split.peer_addr(), "127.0.0.1:7688");
    }
}
