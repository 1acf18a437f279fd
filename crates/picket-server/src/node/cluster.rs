//! The cluster as a node sees it, and membership changes.

use super::{Node, not_leader};
use crate::error::ServiceError;
use crate::network::LastingRefusal;
use crate::raft_types::{Member, NodeId};
use openraft::ServerState;
use openraft::async_runtime::WatchReceiver;
use openraft::error::{ClientWriteError, RaftError};
use std::collections::{BTreeMap, BTreeSet};

/// One member as a node sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemberView {
    /// Its node id.
    pub node_id: NodeId,
    /// Where clients reach it.
    pub addr: String,
    /// Where peers reach it, if it serves them on a port of its own.
    pub peer_addr: Option<String>,
    /// A voter, or else a learner.
    pub voter: bool,
}

/// Membership and leadership as one node sees them.
#[derive(Clone, Debug, PartialEq)]
pub struct ClusterView {
    /// Every member.
    pub members: Vec<MemberView>,
    /// The sets of voters a quorum must be found in: one, or two while a membership change is
    /// under way (joint consensus, old and new), each sorted.
    pub voter_sets: Vec<Vec<NodeId>>,
    /// The leader, if known.
    pub leader_id: Option<NodeId>,
    /// The leader's address, if known.
    pub leader_addr: Option<String>,
    /// This node.
    pub node_id: NodeId,
    /// This node's role: leader, follower, candidate, learner or shutdown.
    pub role: &'static str,
    /// The current Raft term.
    pub term: u64,
    /// The last log index this node knows committed.
    pub commit_index: u64,
    /// The lock state's revision on this node.
    pub applied_revision: u64,
    /// The last log index applied on this node.
    pub applied_log_index: u64,
    /// The last log index covered by this node's snapshot, 0 if none.
    pub snapshot_log_index: u64,
    /// The last log index this node has purged from its log, 0 if none.
    pub purged_log_index: u64,
    /// How many times this node saw its clock or its process lose time (a stall or a jump)
    /// since it started; see [`crate::clock`].
    pub clock_gaps_total: u64,
    /// The factor this node's clock runs at against its source: 1 unless, as leader, its peers
    /// found its clock fast or slow against theirs (see [`crate::rate`]).
    pub clock_rate_factor: f64,
    /// As leader, each voter's clock rate against this node's clock, once known (see
    /// [`crate::rate`]); empty on a follower.
    pub peer_clock_rates: BTreeMap<NodeId, f64>,
    /// How many clients' clocks, read with their keepalives in the last minute, run at another
    /// rate than this node's (see [`crate::client_clocks`]). Many on a single node: check its clock.
    pub client_clocks_off_rate: usize,
    /// The apply rules this node writes entries under while it leads: the newest every voter
    /// knows (see [`crate::apply_rules`]). Below [`picket_core::APPLY_RULES`] during a rolling
    /// upgrade, until every voter runs the new build.
    pub apply_rules: u32,
    /// The newest apply rules of any entry this node's state has accepted.
    pub newest_applied_rules: u32,
    /// The limits this node's state enforces: the last ones a leader wrote into it
    /// ([`crate::ServerLimits::replicated`]), or the defaults.
    pub limits: picket_core::Limits,
    /// As leader, why the state refuses the limits this node's flags set, while it does (it
    /// holds more than they allow); the leader asks again every few seconds.
    pub limits_refused: Option<String>,
    /// The restore this node's data directory holds (`DIGEST.eEPOCH.keep|end`), if any.
    pub restore: Option<String>,
    /// Raft messages this node refused because their sender was restored otherwise, or holds
    /// a state of an older restore epoch.
    pub other_restore_refused_total: u64,
    /// The cluster's id (32 hexadecimal digits), once its first leader under apply rules 7 has
    /// named it; every node of one cluster shows the same.
    pub cluster_id: Option<String>,
    /// The id of the named cluster this one was restored from, if it was restored from a
    /// backup (see [`picket_core::StateMachine::restored_from_cluster_id`]).
    pub restored_from_cluster_id: Option<String>,
    /// Raft messages this node refused because their sender belongs to another cluster.
    pub other_cluster_refused_total: u64,
    /// The peers this node waits to hear from before it forms a new cluster from `--peers`:
    /// it forms none until every peer has answered and none holds a log.
    pub waiting_for_peers: Vec<NodeId>,
}

/// Most members (voters and learners) a cluster may have.
pub const MAX_MEMBERS: usize = 32;

/// Longest member address.
pub const MAX_MEMBER_ADDR_BYTES: usize = 256;

impl Node {
    /// Membership and leadership as this node sees them.
    #[must_use]
    pub fn cluster(&self) -> ClusterView {
        let metrics = self.raft.metrics().borrow_watched().clone();
        let membership = metrics.membership_config.membership();
        let voters: BTreeSet<NodeId> = membership.voter_ids().collect();
        let voter_sets = membership
            .get_joint_config()
            .iter()
            .map(|voters| voters.iter().copied().collect())
            .collect();
        let members: Vec<MemberView> = membership
            .nodes()
            .map(|(id, node)| MemberView {
                node_id: *id,
                addr: node.addr.clone(),
                peer_addr: node.peer_addr.clone(),
                voter: voters.contains(id),
            })
            .collect();
        // A leader outside the membership is a removed one that still names itself (its last
        // vote stays, and nobody replicates to it any more): it leads nothing.
        let leader_id =
            metrics.current_leader.filter(|leader| membership.get_node(leader).is_some());
        let leader_addr =
            leader_id.and_then(|leader| membership.get_node(&leader).map(|node| node.addr.clone()));
        let role = role_name(metrics.state);
        let (applied_revision, applied_log_index, newest_applied_rules, limits, restored_from) =
            self.read_local(|state| {
                let applied_log_index = state.last_applied.map_or(0, |log_id| log_id.index());
                let machine = &state.machine;
                let limits = machine.limits().clone();
                let restored_from = machine.restored_from_cluster_id().map(str::to_owned);
                let rules = machine.newest_apply_rules();
                (machine.revision(), applied_log_index, rules, limits, restored_from)
            });
        ClusterView {
            members,
            voter_sets,
            leader_id,
            leader_addr,
            node_id: self.id,
            role,
            term: metrics.current_term,
            commit_index: metrics.local_committed.map_or(0, |log_id| log_id.index()),
            applied_revision,
            applied_log_index,
            snapshot_log_index: metrics.snapshot.map_or(0, |log_id| log_id.index()),
            purged_log_index: metrics.purged.map_or(0, |log_id| log_id.index()),
            clock_gaps_total: self.gaps.gaps_total(),
            clock_rate_factor: self.clock.rate_factor(),
            peer_clock_rates: self
                .peer_clock_rates
                .lock()
                .map(|rates| rates.clone())
                .unwrap_or_default(),
            client_clocks_off_rate: self.renewals.client_clocks_off_rate(&self.clock),
            apply_rules: self.writing_rules(),
            newest_applied_rules,
            limits,
            limits_refused: (role == "leader").then(|| self.limits_refused()).flatten(),
            restore: self.restore.as_deref().map(str::to_owned),
            other_restore_refused_total: self.restore_refusals(),
            cluster_id: self.cluster_id().map(|cluster_id| cluster_id.to_string()),
            restored_from_cluster_id: restored_from,
            other_cluster_refused_total: self
                .other_clusters_refused
                .load(std::sync::atomic::Ordering::Relaxed),
            waiting_for_peers: self.waiting_for_peers(),
        }
    }

    /// Refuses a request that expects (`expected`, from `picket-expect-cluster`) another cluster
    /// than this node's, or than the one it was restored from when the request is `following`
    /// its cluster to a restore (`picket-follow-restore`): session ids of two clusters coincide,
    /// so the request could act on another client's session. A node that does not know its
    /// cluster's id yet (not named, or its log not replayed so far) cannot tell, and refuses it
    /// as unavailable, for the client to try another node or again shortly.
    ///
    /// # Errors
    /// [`ServiceError::OtherCluster`]; [`ServiceError::Unavailable`] on a node that does not
    /// know its cluster's id.
    pub fn check_expected_cluster(
        &self,
        expected: &[u8],
        following: bool,
    ) -> Result<(), ServiceError> {
        let Some(own) = self.cluster_id() else {
            return Err(ServiceError::Unavailable(
                "this node does not know its cluster's id yet (it is starting or catching up, or the cluster is not named), so it cannot tell whether it belongs to the cluster the request expects".to_owned(),
            ));
        };
        if expected == own.as_bytes() {
            return Ok(());
        }
        let origin =
            || self.read_local(|state| state.machine.restored_from_cluster_id().map(str::to_owned));
        if following && origin().is_some_and(|origin| origin.as_bytes() == expected) {
            return Ok(());
        }
        Err(ServiceError::OtherCluster {
            own: own.to_string(),
            expected: String::from_utf8_lossy(expected).chars().take(64).collect(),
        })
    }

    /// Where peers reach member `id` (its peer port, or its client port without one), if it
    /// is in this node's membership.
    pub(crate) fn peer_addr_of(&self, id: NodeId) -> Option<String> {
        let metrics = self.raft.metrics();
        let metrics = metrics.borrow_watched();
        let member = metrics.membership_config.membership().get_node(&id);
        member.map(|member| member.peer_addr().to_owned())
    }

    /// Adds a node as a voter: first as a learner until it has caught up, then as a voter.
    /// Clients reach it at `addr`; peers at `peer_addr` if it serves them on a port of its own
    /// (`--peer-listen`), else at `addr`.
    ///
    /// # Errors
    /// On a follower, or when the membership change fails.
    pub async fn add_member(
        &self,
        node_id: NodeId,
        addr: String,
        peer_addr: Option<String>,
    ) -> Result<ClusterView, ServiceError> {
        // Every membership entry lists every member: bounded, so no request can grow one past
        // what the log takes.
        let usable = |addr: &str| {
            !addr.is_empty()
                && addr.len() <= MAX_MEMBER_ADDR_BYTES
                && !addr.chars().any(char::is_control)
        };
        if !usable(&addr) || !peer_addr.as_deref().is_none_or(usable) {
            return Err(ServiceError::BadRequest(format!(
                "a member's address and peer address are 1 to {MAX_MEMBER_ADDR_BYTES} printable \
                 bytes each, as host:port"
            )));
        }
        // Without a port it could never be reached, and the add would only time out.
        let has_port = |addr: &str| {
            addr.rsplit_once(':')
                .and_then(|(_, port)| port.parse::<u16>().ok())
                .is_some_and(|port| port > 0)
        };
        if !has_port(&addr) || !peer_addr.as_deref().is_none_or(has_port) {
            return Err(ServiceError::BadRequest(format!(
                "a member's address and peer address are host:port, with a port; got {addr}{}",
                peer_addr.as_deref().map(|peer| format!(" and {peer}")).unwrap_or_default()
            )));
        }
        // A node refuses to start under these ids; added, it would never join.
        if node_id == 0 || node_id == crate::backup::RESTORE_LEADER {
            return Err(ServiceError::BadRequest(format!(
                "node id {node_id} is reserved; choose a node id between 1 and {}",
                crate::backup::RESTORE_LEADER - 1
            )));
        }
        // A peer address that is the client address means one port, as `Member` records it.
        let peer_addr = peer_addr.filter(|peer_addr| *peer_addr != addr);
        // Only the leader checks an add against the members: a follower's view may be behind
        // (a member removed a moment ago still listed at the address its replacement takes),
        // and its 400 told the client not to retry where the leader would have added the node.
        if !self.is_leader() {
            return Err(self.refused_as_not_leader());
        }
        // One change at a time on this node: two adds of one id with other addresses, checked
        // together, would both pass the check below, and openraft keeps the first addresses
        // and reports success to both.
        let one_at_a_time = self.one_change_at_a_time().await?;
        // Leadership may have moved during the wait for the turn.
        if !self.is_leader() {
            return Err(self.refused_as_not_leader());
        }
        // openraft adds a learner with a change that keeps every node: on a membership an
        // earlier leader left joint it would end the change but keep the voters it removed as
        // learners, replicated to and holding the apply rules back. End it first, as removing,
        // before the checks below read the members (a removed voter's address is free).
        if self.membership_is_joint_and_committed() {
            end_joint_membership(&self.raft, self.id).await?;
        }
        let members = self.cluster().members;
        if let Some(existing) = members.iter().find(|member| member.node_id == node_id)
            && (existing.addr != addr || existing.peer_addr != peer_addr)
        {
            // openraft would keep the old addresses and report success.
            let peers = existing.peer_addr.as_deref().unwrap_or(&existing.addr);
            return Err(ServiceError::BadRequest(format!(
                "node {node_id} is already a member, at {} (peers reach it at {peers}); a \
                 member's addresses cannot change: remove it and add the new node under a new id",
                existing.addr
            )));
        }
        // Already a voter at these addresses: an add asked again (a retry) has nothing to do.
        // Waiting for the node to acknowledge a learner entry would hold the retry for the whole
        // wait while that voter is down. Only a leader that has confirmed it with a quorum says
        // so, and only of a committed membership with one set of voters.
        if members.iter().any(|member| member.node_id == node_id)
            && self.is_settled_voter(node_id).await?
        {
            return Ok(self.cluster());
        }
        // Another member's address: its messages would reach that member, which refuses them
        // as meant for another node, and the add would only time out.
        let reaches = |member: &MemberView, at: &str| {
            member.addr == at || member.peer_addr.as_deref() == Some(at)
        };
        let wanted = [Some(addr.as_str()), peer_addr.as_deref()];
        if let Some(other) = members.iter().find(|member| {
            member.node_id != node_id && wanted.iter().flatten().any(|at| reaches(member, at))
        }) {
            return Err(ServiceError::BadRequest(format!(
                "node {} already listens at that address; give node {node_id} its own",
                other.node_id
            )));
        }
        if members.len() >= MAX_MEMBERS && !members.iter().any(|member| member.node_id == node_id) {
            return Err(ServiceError::BadRequest(format!(
                "the cluster already has {MAX_MEMBERS} members, its limit; remove one first"
            )));
        }
        let member = Member::with_peer_addr(addr, peer_addr);
        let peers = member.peer_addr().to_owned();
        self.refuse_a_node_that_cannot_join(node_id, &peers).await?;
        let caught_up = tokio::time::timeout(LEARNER_CATCH_UP, async {
            let added = self.raft.add_learner(node_id, member, true).await?;
            Ok(self.learner_reached(node_id, added.log_id.index()).await)
        });
        let Ok(added) = caught_up.await else {
            return Err(ServiceError::OutcomeUnknown(format!(
                "node {node_id} has not joined as a caught-up learner within {} s (peers reach it \
                 at {peers}): either its learner entry has not committed (no quorum) or it has \
                 not caught up with the log; as a learner it counts for no quorum. Check that it runs with \
                 --join and is reachable there, then add it again to make it a voter, or remove \
                 it",
                LEARNER_CATCH_UP.as_secs()
            )));
        };
        if !added.map_err(membership_error)? {
            // Leadership moved while waiting: a new leader could not know the node was never
            // reached. The node stays a learner; the add is asked again of the leader.
            return Err(self.refused_as_not_leader());
        }
        let voters: BTreeSet<NodeId> = [node_id].into();
        self.change_membership(openraft::ChangeMembers::AddVoterIds(voters), one_at_a_time).await?;
        Ok(self.cluster())
    }

    /// Waits until node `node_id` has acknowledged the log up to index `through` (the entry that
    /// made it a learner): true then, false once this node no longer leads. openraft's own wait for a learner
    /// counts one as caught up when the leader's log is within its lag threshold (5,000
    /// entries) of what the learner matched, even if it matched nothing: on a young cluster a
    /// node that was never reached (not started, a wrong address, another cluster's node) was
    /// made a voter at once, and counted in every quorum from then on.
    async fn learner_reached(&self, node_id: NodeId, through: u64) -> bool {
        let mut metrics = self.raft.metrics();
        loop {
            {
                let current = metrics.borrow_watched();
                let Some(replication) = current.replication.as_ref() else {
                    return false;
                };
                let matched = replication.get(&node_id).copied().flatten();
                if matched.is_some_and(|matched| matched.index() >= through) {
                    return true;
                }
            }
            if metrics.changed().await.is_err() {
                return false;
            }
        }
    }

    /// Refuses to add node `node_id` at `peers` when the node there refuses this cluster's
    /// messages for good: it holds another cluster's state, or it is another node (its id
    /// mistyped in the add, or in its own `--node-id`). Otherwise the add would only time out
    /// after [`LEARNER_CATCH_UP`], leaving a learner that never catches up. Asked of the node
    /// itself (a clock reading, which it refuses as it would Raft's messages); a node that does
    /// not answer yet is added as before.
    async fn refuse_a_node_that_cannot_join(
        &self,
        node_id: NodeId,
        peers: &str,
    ) -> Result<(), ServiceError> {
        let (tls, cell) = (self.to_peers().cloned(), self.cluster_id_cell());
        let mut probe = crate::network::ClockProbe::new(node_id, peers.to_owned(), tls, cell);
        let own = self.cluster_id();
        match probe.lasting_refusal(NODE_PROBE).await {
            Some(LastingRefusal::OtherCluster(theirs)) => Err(ServiceError::BadRequest(format!(
                "node {node_id} at {peers} belongs to another cluster ({theirs}; this one is \
                 {}): its data directory holds that cluster's state. Start it on an empty data \
                 directory with --join, then add it again",
                own.as_deref().unwrap_or("not named yet")
            ))),
            Some(LastingRefusal::OtherNode(theirs)) => Err(ServiceError::BadRequest(format!(
                "the node at {peers} is node {theirs}, not node {node_id}. If node {theirs} was \
                 removed, stop it and start node {node_id} there (--node-id {node_id} --join, \
                 an empty data directory), then add it again; if the id was mistyped, add it as \
                 node {theirs}"
            ))),
            Some(LastingRefusal::NewerEpoch(theirs)) => Err(ServiceError::BadRequest(format!(
                "node {node_id} at {peers} holds a state of restore epoch {theirs}, newer than \
                 this cluster's ({}): it was restored from a backup, and refuses the messages of \
                 a cluster of an older epoch. Start it on an empty data directory with --join, \
                 then add it again",
                self.cluster_id_cell().restore_epoch()
            ))),
            None => Ok(()),
        }
    }

    /// Removes a node from the cluster.
    ///
    /// # Errors
    /// On a follower, or when the membership change fails.
    pub async fn remove_member(&self, node_id: NodeId) -> Result<ClusterView, ServiceError> {
        let one_at_a_time = self.one_change_at_a_time().await?;
        let ids: BTreeSet<NodeId> = [node_id].into();
        let member = self.cluster().members.into_iter().find(|member| member.node_id == node_id);
        // openraft writes an unchanged membership and reports success: a mistyped id looked
        // removed. Only the leader says so: a follower may not have seen a member added a moment
        // ago, and leaves the question to Raft, which names the leader.
        if member.is_none() && self.is_leader() {
            return Err(ServiceError::BadRequest(format!(
                "node {node_id} is not a member of this cluster (`picket members` lists them)"
            )));
        }
        // A learner (one whose add did not finish) is dropped as a node: removing it as a voter
        // would leave it in the membership, replicated to and holding the apply rules back.
        let learner = member.is_some_and(|member| !member.voter);
        if !learner {
            self.check_quorum_without(node_id).await?;
        }
        let change = if learner {
            openraft::ChangeMembers::RemoveNodes(ids)
        } else {
            openraft::ChangeMembers::RemoveVoters(ids)
        };
        self.change_membership(change, one_at_a_time).await?;
        Ok(self.cluster())
    }

    /// On the leader, refuses to remove voter `removed` when it is the only voter (openraft
    /// refused that in its own words, which did not say what to do), or when the voters would
    /// have no majority answering it: the change goes through a joint configuration that needs a
    /// majority of each set of voters now and of those left, so a removal while another voter
    /// is down stopped every write until that voter came back, holding the membership lock
    /// meanwhile (found in an audit). A voter answers when it acknowledged the leader within a
    /// leader lease; a leader that has led for less than that has not had the time to hear from
    /// every voter, and waits out the rest of the lease before it judges (review: judged at once,
    /// a new leader refused for good a removal that a moment later would go through). Not
    /// leading, this node leaves the question to Raft, which names the leader.
    async fn check_quorum_without(&self, removed: NodeId) -> Result<(), ServiceError> {
        if let Some(led_for) = self.led_for()
            && let Some(rest) = self.leader_lease.checked_sub(led_for)
        {
            tokio::time::sleep(rest).await;
        }
        let metrics = self.raft.metrics().borrow_watched().clone();
        let Some(heartbeat) = metrics.heartbeat.as_ref() else { return Ok(()) };
        let answers = |id: &NodeId| {
            *id == self.id
                || heartbeat
                    .get(id)
                    .and_then(Option::as_ref)
                    .is_some_and(|at| openraft::Instant::elapsed(&**at) <= self.leader_lease)
        };
        let joint = metrics.membership_config.membership().get_joint_config();
        let sets: Vec<Vec<NodeId>> =
            joint.iter().map(|voters| voters.iter().copied().collect()).collect();
        // openraft makes the new voters from the last set of a joint configuration alone.
        let last = sets.last().cloned().unwrap_or_default();
        let remaining: Vec<NodeId> = last.iter().copied().filter(|id| *id != removed).collect();
        if remaining.is_empty() {
            return Err(ServiceError::BadRequest(format!(
                "node {removed} is this cluster's only voter, and a cluster needs one: add \
                 another node (`picket members add`), wait until it is a voter, then remove \
                 this one"
            )));
        }
        let has_majority = |voters: &[NodeId]| {
            voters.is_empty() || voters.iter().filter(|id| answers(id)).count() * 2 > voters.len()
        };
        if sets.iter().all(|voters| has_majority(voters)) && has_majority(&remaining) {
            return Ok(());
        }
        let mut silent: Vec<NodeId> =
            sets.iter().flatten().copied().filter(|id| !answers(id)).collect();
        silent.sort_unstable();
        silent.dedup();
        Err(ServiceError::VotersNotAnswering(format!(
            "removing node {removed} needs a majority of the voters {last:?} and of those left, \
             {remaining:?}, to answer, and {silent:?} have not answered the leader within {} ms: \
             the change would stop every write until they answer. Bring them back first, then \
             retry; if they are gone for good and too few voters are left to make a majority, \
             restore the cluster from a backup (README, \"Backup and restore\")",
            self.leader_lease.as_millis()
        )))
    }

    /// `not_leader`, naming the leader this node knows, if any.
    fn refused_as_not_leader(&self) -> ServiceError {
        let ClusterView { leader_id, leader_addr, .. } = self.cluster();
        ServiceError::NotLeader { leader_id, leader_addr }
    }

    /// Waits its turn to change the membership: at most [`MEMBERSHIP_CHANGE_WAIT`], as a change
    /// under way (one that cannot reach a quorum goes on until it does) may hold it for longer.
    async fn one_change_at_a_time(&self) -> Result<tokio::sync::OwnedMutexGuard<()>, ServiceError> {
        let turn = self.membership_changes.clone().lock_owned();
        tokio::time::timeout(MEMBERSHIP_CHANGE_WAIT, turn).await.map_err(|_| {
            ServiceError::Unavailable(format!(
                "another membership change on this node has not ended within {} s (it may lack \
                 a quorum); retry once it has. `picket members` shows where it stands",
                MEMBERSHIP_CHANGE_WAIT.as_secs()
            ))
        })
    }

    /// As leader, ends a membership change that an earlier leader left half done. openraft
    /// changes membership in two entries, a joint configuration (old and new voters) and, once
    /// it commits, the new voters alone, both written from the caller of the change on its
    /// leader; a leader that dies or loses leadership between them leaves the cluster joint, and
    /// the next one does not go on (openraft's documentation says so). Every quorum then needed
    /// both sets of voters until another change was made by hand, while the view listed the
    /// voters of both. Called from the leader's duties: a joint configuration that has
    /// committed, with no change of this node's own under way, is ended by the empty change,
    /// which openraft turns into the new voters alone, in a task of its own.
    pub(crate) fn finish_a_joint_membership(&self) {
        if !self.membership_is_joint_and_committed() {
            return;
        }
        let Ok(one_at_a_time) = self.membership_changes.clone().try_lock_owned() else {
            // A change of this node's own is under way, and it writes its second entry itself.
            return;
        };
        let (raft, node_id) = (self.raft.clone(), self.id);
        tokio::spawn(async move {
            if let Err(error) = end_joint_membership(&raft, node_id).await {
                tracing::debug!(%error, "ending a half-done membership change failed");
            }
            drop(one_at_a_time);
        });
    }

    /// Whether this node's membership is a joint configuration (two sets of voters) that has
    /// committed: a change left half done, which no one else will end.
    fn membership_is_joint_and_committed(&self) -> bool {
        let (sets, committed) = self.membership_sets();
        sets.len() > 1 && committed
    }

    /// The sets of voters of this node's membership, and whether that membership has
    /// committed (this node applied the entry that holds it).
    fn membership_sets(&self) -> (Vec<BTreeSet<NodeId>>, bool) {
        let metrics = self.raft.metrics();
        let metrics = metrics.borrow_watched();
        let config = &metrics.membership_config;
        let committed = config.log_id().is_some_and(|at| metrics.last_applied >= Some(at));
        (config.membership().get_joint_config().clone(), committed)
    }

    /// Whether node `node_id` is a voter of a membership that has committed with one set of
    /// voters, as this node, the leader, confirms with a quorum: an add asked again of it has
    /// nothing to do. False on a node that no longer leads (the add then goes to Raft, which
    /// names the leader), and during a change (a removal of that node may be half done).
    async fn is_settled_voter(&self, node_id: NodeId) -> Result<bool, ServiceError> {
        if !self.is_leader() {
            return Ok(false);
        }
        self.read_linearizable(|_| ()).await?;
        let (sets, committed) = self.membership_sets();
        Ok(committed && sets.len() == 1 && sets[0].contains(&node_id))
    }

    /// The deliberate bug `membership_change_stops_at_joint` (tests only, see
    /// [`crate::mutation`]): a removal writes only its first entry, the joint configuration, as
    /// a leader that dies or loses leadership between the two entries leaves it.
    #[cfg(feature = "mutations")]
    async fn stop_at_joint(&self, removed: &BTreeSet<NodeId>) -> Result<(), ServiceError> {
        let observed = self.raft.metrics().borrow_watched().membership_config.clone();
        let old: BTreeSet<NodeId> = observed.membership().voter_ids().collect();
        let new: BTreeSet<NodeId> = old.difference(removed).copied().collect();
        let nodes: BTreeMap<NodeId, Member> =
            observed.membership().nodes().map(|(id, node)| (*id, node.clone())).collect();
        let joint = openraft::Membership::new(vec![old, new], nodes)
            .map_err(|error| ServiceError::BadRequest(error.to_string()))?;
        let written = self.raft.append_membership(joint, openraft::EntryPayload::Blank, []);
        written.await.map(drop).map_err(membership_error)
    }

    /// Makes `change` and waits, at most [`MEMBERSHIP_CHANGE_WAIT`], for it to commit: a
    /// change that cannot reach a quorum (of the old voters and of the new) waited for ever.
    /// The change itself goes on in a task of its own, holding `one_at_a_time` until it ends:
    /// openraft writes the joint configuration and, once it commits, the final one, from the
    /// caller's future, so a caller that stopped waiting would leave the cluster in joint
    /// consensus (found in review).
    async fn change_membership(
        &self,
        change: openraft::ChangeMembers<NodeId, Member>,
        one_at_a_time: tokio::sync::OwnedMutexGuard<()>,
    ) -> Result<(), ServiceError> {
        #[cfg(feature = "mutations")]
        if let openraft::ChangeMembers::RemoveVoters(removed) = &change
            && crate::mutation::is_on("membership_change_stops_at_joint")
        {
            return self.stop_at_joint(removed).await;
        }
        let raft = self.raft.clone();
        let changing = tokio::spawn(async move {
            let changed = raft.change_membership(change, false).await;
            drop(one_at_a_time);
            changed
        });
        match tokio::time::timeout(MEMBERSHIP_CHANGE_WAIT, changing).await {
            Ok(Ok(result)) => result.map(drop).map_err(membership_error),
            Ok(Err(failed)) => {
                Err(ServiceError::Stopped(format!("the membership change failed: {failed}")))
            }
            Err(_) => Err(ServiceError::OutcomeUnknown(format!(
                "the membership change has not committed within {} s: the cluster may lack a \
                 quorum of its old or new voters. It goes on, and ends once they answer; \
                 `picket members` shows where it stands",
                MEMBERSHIP_CHANGE_WAIT.as_secs()
            ))),
        }
    }
}

/// How long adding a member waits for the new node to say whether it can join (it may hold
/// another cluster's state, or be another node).
const NODE_PROBE: std::time::Duration = std::time::Duration::from_secs(2);

/// How long a membership change waits to commit before it answers.
const MEMBERSHIP_CHANGE_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// How long adding a member waits for it to catch up with the log as a learner before it
/// answers; a node joining with a large log to receive may need longer, and is then added again.
const LEARNER_CATCH_UP: std::time::Duration = std::time::Duration::from_secs(60);

/// Ends a committed joint membership with openraft's empty change, which writes the newer set
/// of voters alone (and, not retaining, drops the voters of the older set only from the
/// members), waiting at most [`MEMBERSHIP_CHANGE_WAIT`]. One entry: dropped after the wait, it
/// stays proposed, and a leader that still finds the membership joint tries again.
async fn end_joint_membership(
    raft: &crate::raft_types::Raft,
    node_id: NodeId,
) -> Result<(), ServiceError> {
    let finished = openraft::ChangeMembers::AddVoterIds(BTreeSet::new());
    let change = raft.change_membership(finished, false);
    match tokio::time::timeout(MEMBERSHIP_CHANGE_WAIT, change).await {
        Ok(Ok(written)) => {
            let voters =
                written.membership().as_ref().map(|now| now.voter_ids().collect::<Vec<_>>());
            tracing::warn!(
                node = node_id,
                ?voters,
                "ended a membership change an earlier leader left half done"
            );
            Ok(())
        }
        Ok(Err(error)) => Err(membership_error(error)),
        Err(_) => Err(ServiceError::OutcomeUnknown(format!(
            "ending a membership change left half done has not committed within {} s (no \
             quorum of its voters yet)",
            MEMBERSHIP_CHANGE_WAIT.as_secs()
        ))),
    }
}

fn membership_error(
    error: RaftError<
        crate::raft_types::TypeConfig,
        ClientWriteError<crate::raft_types::TypeConfig>,
    >,
) -> ServiceError {
    match error {
        RaftError::APIError(ClientWriteError::ForwardToLeader(forward)) => not_leader(&forward),
        // Right after a failover the new leader may not have committed its predecessor's
        // change yet, and a learner's entry may still wait for a quorum: retrying is the
        // answer, which a 400 told clients not to do.
        RaftError::APIError(ClientWriteError::ChangeMembershipError(
            openraft::error::ChangeMembershipError::InProgress(in_progress),
        )) => ServiceError::Unavailable(format!(
            "another membership change has not committed yet ({in_progress}); retry once it has"
        )),
        // A leader that has not committed an entry of its own term yet: retrying is the answer.
        RaftError::APIError(ClientWriteError::ChangeMembershipError(
            openraft::error::ChangeMembershipError::UncommittedLeaderLog(uncommitted),
        )) => ServiceError::Unavailable(format!(
            "the leader has not settled yet ({uncommitted}); retry in a moment"
        )),
        RaftError::APIError(ClientWriteError::ChangeMembershipError(change)) => {
            ServiceError::BadRequest(change.to_string())
        }
        RaftError::APIError(other) => ServiceError::Unavailable(other.to_string()),
        RaftError::Fatal(fatal) => ServiceError::Stopped(fatal.to_string()),
    }
}

pub(super) fn role_name(state: ServerState) -> &'static str {
    match state {
        ServerState::Leader => "leader",
        ServerState::Follower => "follower",
        ServerState::Candidate => "candidate",
        ServerState::Learner => "learner",
        ServerState::Shutdown => "shutdown",
    }
}

#[cfg(test)]
mod tests {
    use crate::error::ServiceError;

    /// Found in an audit: removing a single node's only voter was refused by openraft in its
    /// own words, which did not say what to do.
    #[tokio::test]
    async fn removing_the_only_voter_is_refused_with_what_to_do() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let handle = super::super::ready_single_node(dir.path()).await;
        let refused = handle.node().remove_member(1).await.expect_err("refused");
        assert!(
            matches!(&refused, ServiceError::BadRequest(message) if message.contains("only voter")),
            "{refused:?}"
        );
        assert_eq!(handle.node().cluster().members.len(), 1, "still a member");
        handle.shutdown().await;
    }
}
