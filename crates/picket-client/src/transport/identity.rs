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
//! kept are the client's own. The client follows it, and from then on keeps to it.

use crate::error::ClientError;
use std::sync::Mutex;

/// The cluster a client keeps to, once known.
#[derive(Debug)]
pub(super) struct Identity {
    known: Mutex<Option<Known>>,
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
    /// Use it: the client's cluster, or a node that does not know its cluster's id yet.
    Same,
    /// Use it, and keep to its cluster from now on: the first named cluster found.
    Learned,
    /// Use it, and keep to its cluster from now on: a restore of the client's cluster. The
    /// connections to the nodes of the cluster before may be dropped.
    Followed,
    /// Do not use it: the node belongs to another cluster.
    Other(ClientError),
}

impl Identity {
    /// An identity that keeps to `cluster_id` if given, else to the first one found.
    pub(super) fn new(cluster_id: Option<String>) -> Self {
        let known = cluster_id.map(|cluster_id| Known { cluster_id, learned: Learned::Given });
        Self { known: Mutex::new(known) }
    }

    /// The cluster the client keeps to, if it knows one yet.
    pub(super) fn cluster_id(&self) -> Option<String> {
        self.lock().as_ref().map(|known| known.cluster_id.clone())
    }

    /// Judges the node at `endpoint` by the cluster id it reported (`found`, empty when its
    /// cluster is not named or it does not know the name yet) and the id of the cluster its
    /// own was restored from (`restored_from`, empty when none), and keeps to a new cluster
    /// when the verdict says so.
    pub(super) fn judge(&self, endpoint: &str, found: &str, restored_from: &str) -> Verdict {
        let mut known = self.lock();
        if found.is_empty() {
            return Verdict::Same;
        }
        let Some(kept) = known.as_ref() else {
            *known = Some(Known { cluster_id: found.to_owned(), learned: Learned::FirstReached });
            return Verdict::Learned;
        };
        if kept.cluster_id == found {
            return Verdict::Same;
        }
        if kept.cluster_id == restored_from {
            *known = Some(Known { cluster_id: found.to_owned(), learned: Learned::Restored });
            return Verdict::Followed;
        }
        let how = match kept.learned {
            Learned::Given => "this client was given",
            Learned::FirstReached => "this client reached first",
            Learned::Restored => "this client followed to a restore",
        };
        Verdict::Other(ClientError::OtherCluster {
            endpoint: endpoint.to_owned(),
            found: found.to_owned(),
            expected: format!("{}, the one {how}", kept.cluster_id),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Known>> {
        self.known.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
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

    fn refused(verdict: Verdict) -> String {
        match verdict {
            Verdict::Other(error) => error.to_string(),
            other => panic!("used a node of another cluster: {other:?}"),
        }
    }

    #[test]
    fn the_first_named_cluster_found_is_kept_to() {
        let identity = Identity::new(None);
        assert_eq!(identity.judge("a:1", "", ""), Verdict::Same, "a cluster not named yet");
        assert_eq!(identity.cluster_id(), None);
        assert_eq!(identity.judge("a:1", A, ""), Verdict::Learned);
        assert_eq!(identity.judge("a:2", A, ""), Verdict::Same);
        assert_eq!(identity.judge("a:3", "", ""), Verdict::Same, "a node not told the name yet");
        let error = refused(identity.judge("b:1", B, ""));
        assert!(error.contains(&format!("belongs to cluster {B}")), "{error}");
        assert!(error.contains(&format!("{A}, the one this client reached first")), "{error}");
        assert_eq!(identity.cluster_id().as_deref(), Some(A), "a refusal changes nothing");
    }

    #[test]
    fn a_given_cluster_is_kept_to_from_the_start() {
        let identity = Identity::new(Some(B.to_owned()));
        let error = refused(identity.judge("a:1", A, ""));
        assert!(error.contains("the one this client was given"), "{error}");
        assert_eq!(identity.judge("b:1", B, ""), Verdict::Same);
    }

    /// A restore of the client's cluster is followed, once; the cluster before is then
    /// another cluster, so the client does not go back and forth between the two.
    #[test]
    fn a_restore_of_the_kept_cluster_is_followed_and_the_one_before_left() {
        let identity = Identity::new(None);
        assert_eq!(identity.judge("a:1", A, ""), Verdict::Learned);
        assert_eq!(identity.judge("b:1", B, A), Verdict::Followed);
        assert_eq!(identity.cluster_id().as_deref(), Some(B));
        let error = refused(identity.judge("a:1", A, ""));
        assert!(error.contains("followed to a restore"), "{error}");
        refused(identity.judge("c:1", C, A));
        assert_eq!(identity.judge("c:1", C, B), Verdict::Followed, "a restore of the restore");
    }
}
