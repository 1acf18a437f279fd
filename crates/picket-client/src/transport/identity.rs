//! Which cluster the client belongs to, and the check of each new connection against it.
//!
//! Session ids are revisions, so two clusters hand out the same ids: a client whose endpoints
//! mix the nodes of two clusters (a host reused, a copied configuration) would keep another
//! cluster's session alive with its keepalives, and release or acquire in its name. So every
//! connection the client opens first asks the node which cluster it belongs to, and the client
//! keeps to one: the one its configuration names, else the first named one a connection finds.
//! A node of another cluster is not used. The one exception is a cluster restored from a backup
//! of the client's (`picket serve --restore`): a restore starts a new epoch of revisions, so
//! none of its sessions has the id of one the client opened after the backup, and those it
//! kept are the client's own. The client follows it, and from then on keeps to it, but only
//! once no node of its own cluster it knows of can be reached: a copy restored from a backup
//! while the cluster it came from runs on (a staging copy of production, in a copied
//! configuration) does not draw the client away from it.

use crate::error::ClientError;
use std::collections::HashMap;
use std::sync::Mutex;

/// The cluster a client keeps to, once known.
#[derive(Debug)]
pub(super) struct Identity {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    known: Option<Known>,
    /// The endpoints the client was given: whether its cluster is gone is judged by these (a
    /// leader a node named may be an alias of one of them, or a node that moved away).
    configured: Vec<String>,
    /// Bumped each time the client follows a restore: a connection checked under an earlier
    /// generation leads to the cluster before, and is not used again.
    generation: u64,
    /// The endpoints found to be nodes of the kept cluster, and whether the last attempt to
    /// connect to each reached it.
    own: HashMap<String, bool>,
}

#[derive(Clone, Debug)]
struct Known {
    cluster_id: String,
    /// How the client came to keep to it, for the error that names it.
    learned: Learned,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Learned {
    /// From [`crate::ClientConfig::cluster_id`].
    Given,
    /// The first named cluster a connection found.
    FirstReached,
    /// Restored from the one the client kept to before.
    Restored,
}

/// What a node's answer means for the connection to it.
#[derive(Debug)]
pub(super) enum Verdict {
    /// Use it: the client's cluster, or, while the client keeps to none, a node that does not
    /// know its cluster's id (a cluster not named yet, or of an older build).
    Same,
    /// Do not use it for now: the client keeps to a cluster, and the node does not know its
    /// own cluster's id yet (it is starting and has not replayed its log, or it belongs to a
    /// cluster not named yet). Such a node cannot serve a write or a read yet anyway, and a
    /// connection to it would not be checked again once it knows.
    Unknown,
    /// Use it, and keep to its cluster from now on: the first named cluster found.
    Learned,
    /// Use it, and keep to its cluster from now on: a restore of the client's cluster. The
    /// connections to the nodes of the cluster before may be dropped.
    Followed,
    /// Do not use it: the node belongs to another cluster (or to a restore of the client's,
    /// while a node of the client's own may still answer).
    Other(ClientError),
}

impl State {
    /// Whether the client reached its own cluster, and can reach none of its configured nodes
    /// now (or, when none of those was found in it, none of the others).
    fn own_gone(&self) -> bool {
        let configured = |endpoint: &&String| self.configured.contains(endpoint);
        let mut reached = self.own.iter().filter(|(endpoint, _)| configured(endpoint)).peekable();
        if reached.peek().is_some() {
            return reached.all(|(_, reached)| !reached);
        }
        !self.own.is_empty() && self.own.values().all(|reached| !reached)
    }
}

impl Identity {
    /// An identity that keeps to `cluster_id` if given, else to the first one found, among
    /// the `configured` endpoints.
    pub(super) fn new(cluster_id: Option<String>, configured: Vec<String>) -> Self {
        let known = cluster_id.map(|cluster_id| Known { cluster_id, learned: Learned::Given });
        Self { state: Mutex::new(State { known, configured, ..State::default() }) }
    }

    /// The cluster the client keeps to, if it knows one yet.
    pub(super) fn cluster_id(&self) -> Option<String> {
        self.lock().known.as_ref().map(|known| known.cluster_id.clone())
    }

    /// How many restores the client has followed: a connection judged under an earlier count
    /// leads to the cluster before.
    pub(super) fn generation(&self) -> u64 {
        self.lock().generation
    }

    /// Notes that nothing could be reached at `endpoint` (no TCP connection could be made):
    /// if it is a node of the kept cluster, that cluster may be gone.
    pub(super) fn unreachable(&self, endpoint: &str) {
        if let Some(reached) = self.lock().own.get_mut(endpoint) {
            *reached = false;
        }
    }

    /// Judges the node at `endpoint` by the cluster id it reported (`found`, empty when its
    /// cluster is not named or it does not know the name yet) and the id of the cluster its
    /// own was restored from (`restored_from`, empty when none), and keeps to a new cluster
    /// when the verdict says so.
    pub(super) fn judge(&self, endpoint: &str, found: &str, restored_from: &str) -> Verdict {
        let mut state = self.lock();
        let state = &mut *state;
        if found.is_empty() {
            return if state.known.is_some() { Verdict::Unknown } else { Verdict::Same };
        }
        let Some(kept) = state.known.as_ref() else {
            state.known =
                Some(Known { cluster_id: found.to_owned(), learned: Learned::FirstReached });
            state.own.insert(endpoint.to_owned(), true);
            return Verdict::Learned;
        };
        if kept.cluster_id == found {
            state.own.insert(endpoint.to_owned(), true);
            return Verdict::Same;
        }
        if let Some(reached) = state.own.get_mut(endpoint) {
            // Another cluster where the client's was: restored in place, or the address reused.
            *reached = false;
        }
        let restore_of_kept = kept.cluster_id == restored_from;
        if restore_of_kept && state.own_gone() {
            state.known = Some(Known { cluster_id: found.to_owned(), learned: Learned::Restored });
            state.generation += 1;
            state.own.clear();
            state.own.insert(endpoint.to_owned(), true);
            return Verdict::Followed;
        }
        let how = match kept.learned {
            Learned::Given => "this client was given",
            Learned::FirstReached => "this client reached first",
            Learned::Restored => "this client followed to a restore",
        };
        let restore = if restore_of_kept {
            " (restored from a backup of it, followed only once no node of the client's cluster can be reached)"
        } else {
            ""
        };
        Verdict::Other(ClientError::OtherCluster {
            endpoint: endpoint.to_owned(),
            found: format!("{found}{restore}"),
            expected: format!("{}, the one {how}", kept.cluster_id),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    impl PartialEq for Verdict {
        fn eq(&self, other: &Self) -> bool {
            std::mem::discriminant(self) == std::mem::discriminant(other)
        }
    }

    const A: &str = "0123456789abcdef0123456789abcdef";
    const B: &str = "fedcba9876543210fedcba9876543210";
    const C: &str = "00000000000000000000000000000001";

    fn configured() -> Vec<String> {
        ["a:1", "a:2", "b:1", "c:1"].map(str::to_owned).to_vec()
    }

    fn refused(verdict: Verdict) -> String {
        match verdict {
            Verdict::Other(error) => error.to_string(),
            other => panic!("used a node of another cluster: {other:?}"),
        }
    }

    #[test]
    fn the_first_named_cluster_found_is_kept_to() {
        let identity = Identity::new(None, configured());
        assert_eq!(identity.judge("a:1", "", ""), Verdict::Same, "a cluster not named yet");
        assert_eq!(identity.cluster_id(), None);
        assert_eq!(identity.judge("a:1", A, ""), Verdict::Learned);
        assert_eq!(identity.judge("a:2", A, ""), Verdict::Same);
        assert_eq!(identity.judge("a:3", "", ""), Verdict::Unknown, "a node not told it yet");
        let error = refused(identity.judge("b:1", B, ""));
        assert!(error.contains(&format!("belongs to cluster {B}")), "{error}");
        assert!(error.contains(&format!("{A}, the one this client reached first")), "{error}");
        assert_eq!(identity.cluster_id().as_deref(), Some(A), "a refusal changes nothing");
    }

    #[test]
    fn a_given_cluster_is_kept_to_from_the_start() {
        let identity = Identity::new(Some(B.to_owned()), configured());
        let error = refused(identity.judge("a:1", A, ""));
        assert!(error.contains("the one this client was given"), "{error}");
        assert_eq!(identity.judge("b:1", B, ""), Verdict::Same);
    }

    /// A restore of the kept cluster is followed once no node of that cluster can be reached
    /// (not while one may still answer); the cluster before is then another cluster, so the
    /// client does not go back and forth between the two.
    #[test]
    fn a_restore_of_the_kept_cluster_is_followed_once_its_nodes_are_gone() {
        let given = Identity::new(Some(A.to_owned()), configured());
        refused(given.judge("b:1", B, A));
        assert_eq!(given.cluster_id().as_deref(), Some(A), "not before it reached its own");
        let identity = Identity::new(None, configured());
        assert_eq!(identity.judge("a:1", A, ""), Verdict::Learned);
        assert_eq!(identity.judge("a:2", A, ""), Verdict::Same);
        identity.unreachable("a:1");
        let error = refused(identity.judge("b:1", B, A));
        assert!(error.contains("followed only once no node of the client's cluster"), "{error}");
        identity.unreachable("a:2");
        identity.unreachable("b:1");
        assert_eq!(identity.generation(), 0);
        assert_eq!(identity.judge("b:1", B, A), Verdict::Followed);
        assert_eq!((identity.cluster_id().as_deref(), identity.generation()), (Some(B), 1));
        let error = refused(identity.judge("a:1", A, ""));
        assert!(error.contains("followed to a restore"), "{error}");
        refused(identity.judge("c:1", C, A));
        identity.unreachable("b:1");
        assert_eq!(identity.judge("c:1", C, B), Verdict::Followed, "a restore of the restore");
        assert_eq!(identity.generation(), 2);
    }

    /// A restore onto the same addresses: each node of the client's cluster now answers for
    /// the restore, which is followed once the last of them has. A leader name outside the
    /// configured endpoints (an alias, or a node since gone) does not hold the follow back.
    #[test]
    fn a_restore_in_place_is_followed_once_every_configured_node_is_of_it() {
        let identity = Identity::new(None, configured());
        assert_eq!(identity.judge("a:1", A, ""), Verdict::Learned);
        assert_eq!(identity.judge("a:2", A, ""), Verdict::Same);
        assert_eq!(identity.judge("leader-alias:1", A, ""), Verdict::Same);
        refused(identity.judge("a:1", B, A));
        assert_eq!(identity.judge("a:2", B, A), Verdict::Followed);
        assert_eq!(identity.cluster_id().as_deref(), Some(B));
    }
}
