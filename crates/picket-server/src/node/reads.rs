//! Reads on a node: locks, sessions, sequencer checks, backups and metrics.

use super::Node;
use super::cluster::role_name;
use crate::error::ServiceError;
use openraft::async_runtime::WatchReceiver;
use picket_core::{CheckOutcome, CommandError, LockInfo, Sequencer, SessionId, SessionInfo};
use std::sync::Arc;

impl Node {
    /// The state of one lock (linearizable). A lock nobody holds or waits for is reported free.
    ///
    /// # Errors
    /// An invalid name; cluster failures.
    pub async fn lock(&self, name: &str) -> Result<LockInfo, ServiceError> {
        self.lock_at(name).await.map(|(info, _)| info)
    }

    /// [`Node::lock`] with the revision it was read at. A lock nobody holds, awaits or is
    /// delayed on keeps no record (the state stays bounded), so its last token is not known;
    /// every token it ever had is at most this revision, and any later grant's is above it.
    ///
    /// # Errors
    /// As [`Node::lock`].
    pub async fn lock_at(&self, name: &str) -> Result<(LockInfo, u64), ServiceError> {
        let limits = self.read_local(|state| state.machine.limits().clone());
        picket_core::validate_name(name, &limits).map_err(CommandError::InvalidName)?;
        let (info, revision) = self
            .read_linearizable(|state| (state.machine.lock(name), state.machine.revision()))
            .await?;
        let info = info.unwrap_or(LockInfo {
            name: name.to_owned(),
            holder: None,
            waiters: Vec::new(),
            delayed_until_ms: None,
        });
        Ok((info, revision))
    }

    /// Locks by prefix (linearizable).
    ///
    /// # Errors
    /// Cluster failures.
    pub async fn locks(
        &self,
        prefix: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<LockInfo>, ServiceError> {
        self.read_linearizable(|state| state.machine.locks(prefix, after, limit)).await
    }

    /// Sessions (linearizable), only those `owner` opened when given.
    ///
    /// # Errors
    /// Cluster failures.
    pub async fn sessions(
        &self,
        owner: Option<&str>,
        after: Option<SessionId>,
        limit: usize,
    ) -> Result<Vec<SessionInfo>, ServiceError> {
        self.read_linearizable(|state| state.machine.sessions_of(owner, after, limit)).await
    }

    /// Whether a sequencer names its lock's current grant (linearizable), and the sequencer's
    /// token.
    ///
    /// # Errors
    /// A malformed sequencer; cluster failures.
    pub async fn check(&self, sequencer: &str) -> Result<(CheckOutcome, u64), ServiceError> {
        let sequencer = Sequencer::parse(sequencer)
            .map_err(|error| ServiceError::BadRequest(error.to_string()))?;
        // A signed sequencer is checked against its signature too, where this node holds the key
        // that made it: one with an altered session (or anything else) is no grant at all.
        if let Some(Err(error)) =
            self.signer.as_ref().and_then(|signer| signer.verify_own(&sequencer))
        {
            return Err(ServiceError::BadRequest(error.to_string()));
        }
        let outcome = self.read_linearizable(|state| state.machine.check(&sequencer)).await?;
        Ok((outcome, sequencer.token))
    }

    /// A backup of the lock state (see [`crate::backup`]): linearizable, so it holds every
    /// grant any client was told of before the call.
    ///
    /// # Errors
    /// On a follower ([`ServiceError::NotLeader`]), when no quorum answers, and while another
    /// backup is being taken on this node ([`ServiceError::Exhausted`], `too_many_backups`).
    pub async fn backup(&self) -> Result<Vec<u8>, ServiceError> {
        let taken_unix_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |since| u64::try_from(since.as_millis()).unwrap_or(u64::MAX));
        let node_id = self.id;
        // Any state from the barrier on holds every grant told before the call. It is copied
        // and encoded away from the runtime's threads and the encoding away from the lock, as
        // a snapshot is: a worker encoding a million sessions held up every task behind it, and
        // the lock held up every apply (found in review).
        // One at a time: each holds a copy of the state and its encoding, twice the state's
        // size, and a caller that gave up (its timeout) cannot stop one under way, so callers
        // retrying a slow backup piled up copies (found in an audit).
        let Ok(one_at_a_time) = self.backups.clone().try_lock_owned() else {
            // Not `unavailable`, which clients retry at once, elsewhere, and then report as no
            // leader (found in review).
            return Err(ServiceError::Exhausted {
                limit: crate::limits::ServerLimit::Backups,
                max: 1,
            });
        };
        self.read_linearizable(|_| ()).await?;
        let store = self.store.clone();
        tokio::task::spawn_blocking(move || {
            // Held to the end of the encoding, which goes on when the caller goes away.
            let _one_at_a_time = one_at_a_time;
            let (snapshot_meta, machine) = store.copy();
            let meta = crate::backup::BackupMeta {
                revision: machine.revision(),
                log_index: snapshot_meta.last_log_id.map_or(0, |log_id| log_id.index()),
                node_id,
                taken_unix_ms,
                sessions: machine.session_count(),
                locks: machine.lock_count(),
            };
            crate::backup::encode(&meta, &machine.snapshot())
        })
        .await
        .map_err(|error| ServiceError::Stopped(format!("the backup's encoding failed: {error}")))
    }

    /// This node's metrics.
    #[must_use]
    pub fn metrics(&self) -> &Arc<crate::metrics::Metrics> {
        self.store.metrics()
    }

    /// Every metric in the Prometheus text format, with the gauges read now.
    #[must_use]
    pub fn render_metrics(&self) -> String {
        let raft = self.raft.metrics().borrow_watched().clone();
        let queues = self.metrics().queue_summary(|| {
            self.read_local(|state| state.machine.queue_summary(crate::metrics::QUEUE_DEPTH_TOP))
        });
        let sessions = self.read_local(|state| state.machine.session_count());
        let scrape = crate::metrics::Scrape {
            sessions,
            queues,
            role: role_name(raft.state),
            term: raft.current_term,
            commit_index: raft.local_committed.map_or(0, |log_id| log_id.index()),
            applied_index: raft.last_applied.map_or(0, |log_id| log_id.index()),
            last_log_index: raft.last_log_index.unwrap_or(0),
            members: raft.membership_config.membership().nodes().count(),
            clock_gaps: self.gaps.gaps_total(),
            clock_rate_factor: self.clock.rate_factor(),
            apply_rules_held_back: raft.current_leader == Some(self.id)
                && self.writing_rules() < crate::apply_rules::known_apply_rules(),
            watch_streams: self.watch_streams.taken(),
            watched_sessions: self.hub().watched_sessions(),
        };
        self.metrics().render(&scrape)
    }
}

#[cfg(test)]
mod tests {
    /// Found in an audit: backups ran side by side, each holding a copy of the state and its
    /// encoding, and a caller retrying a slow one started another copy each time. One at a
    /// time now; a second while one is taken is answered `too_many_backups`.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn backups_are_taken_one_at_a_time() {
        let dir = tempfile::tempdir().unwrap();
        let handle = super::super::ready_single_node(dir.path()).await;
        let node = handle.node().clone();
        let under_way = node.backups.clone().try_lock_owned().expect("no backup yet");
        let refused = node.backup().await.expect_err("one at a time");
        assert_eq!(refused.code(), picket_core::ErrorCode::TooManyBackups);
        assert!(refused.to_string().contains("backup under way"), "{refused}");
        drop(under_way);
        assert!(!node.backup().await.expect("a backup").is_empty());
        handle.shutdown().await;
    }
}
