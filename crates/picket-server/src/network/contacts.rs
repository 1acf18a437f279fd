//! Whether a node has reached each of its peers, so that its log says once when a peer is
//! first reached, lost or back, instead of a warning per failed RPC.

use crate::raft_types::NodeId;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a peer that was reached must keep failing before the log warns that contact is lost.
/// One failed RPC is not a lost peer: on a busy machine a vote or an append can miss its deadline
/// while the peer is still starting (it preallocates its log) or while this node was descheduled,
/// and a warning for each would teach operators to ignore the warning that matters.
const LOST_AFTER: Duration = Duration::from_secs(3);

/// What this node last knew of one peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Contact {
    /// The last RPC was answered.
    Reached,
    /// Every RPC since `since` failed; `warned` once the log said the peer is lost.
    Failing { since: Instant, warned: bool },
}

/// Whether this node has reached each peer, so that the log says once when a peer is first
/// reached, lost or back, instead of a warning per failed RPC. openraft's own warnings (one per
/// failed vote or append, several a second while a peer is down, and on every clean first start
/// of a cluster while its nodes come up) are off by default (`picket serve --log`).
#[derive(Clone, Debug, Default)]
pub(super) struct Contacts(Arc<std::sync::Mutex<std::collections::BTreeMap<NodeId, Contact>>>);

/// What the log says about a peer after one RPC, decided by [`Contacts::note`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ContactNews {
    /// Nothing worth a line.
    None,
    /// The first RPC to a peer never reached before failed (info: peers start at different times).
    Waiting,
    /// A peer answered for the first time, or again after it was reported lost.
    Reached,
    /// A peer that was reached has failed every RPC for [`LOST_AFTER`] (warn).
    Lost,
}

impl Contacts {
    pub(super) fn note(&self, target: NodeId, addr: &str, failure: Option<&str>) {
        let news = self.judge(target, failure.is_none(), Instant::now());
        let detail = failure.unwrap_or_default();
        match news {
            ContactNews::Waiting => {
                tracing::info!(peer = target, addr, detail, "waiting for a peer to answer");
            }
            ContactNews::Lost => {
                tracing::warn!(peer = target, addr, detail, "lost contact with a peer");
            }
            ContactNews::Reached => tracing::info!(peer = target, addr, "reached a peer"),
            ContactNews::None => {}
        }
    }

    /// Records one RPC's outcome at `now` and says what, if anything, the log should say.
    fn judge(&self, target: NodeId, answered: bool, now: Instant) -> ContactNews {
        let mut contacts = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let before = contacts.get(&target).copied();
        let (after, news) = match (before, answered) {
            (None, true) => (Contact::Reached, ContactNews::Reached),
            // Never reached: the peer is still coming up; say so once, and never warn.
            (None, false) => (Contact::Failing { since: now, warned: true }, ContactNews::Waiting),
            (Some(Contact::Reached), true) => (Contact::Reached, ContactNews::None),
            (Some(Contact::Reached), false) => {
                (Contact::Failing { since: now, warned: false }, ContactNews::None)
            }
            (Some(Contact::Failing { warned, .. }), true) => {
                (Contact::Reached, if warned { ContactNews::Reached } else { ContactNews::None })
            }
            (Some(Contact::Failing { since, warned }), false) => {
                let lost = !warned && now.saturating_duration_since(since) >= LOST_AFTER;
                let news = if lost { ContactNews::Lost } else { ContactNews::None };
                (Contact::Failing { since, warned: warned || lost }, news)
            }
        };
        contacts.insert(target, after);
        news
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_missed_rpc_is_not_a_lost_peer() {
        // Regression: a clean first start warned "lost contact" when one vote missed its deadline
        // while the peer was still starting.
        let contacts = Contacts::default();
        let start = Instant::now();
        assert_eq!(contacts.judge(2, true, start), ContactNews::Reached);
        assert_eq!(contacts.judge(2, false, start), ContactNews::None);
        assert_eq!(contacts.judge(2, false, start + LOST_AFTER / 2), ContactNews::None);
        assert_eq!(contacts.judge(2, true, start + LOST_AFTER / 2), ContactNews::None);
        // The failing run starts again from the next failure.
        let later = start + LOST_AFTER * 2;
        assert_eq!(contacts.judge(2, false, later), ContactNews::None);
        assert_eq!(contacts.judge(2, false, later + LOST_AFTER / 2), ContactNews::None);
    }

    #[test]
    fn a_peer_failing_for_long_is_lost_once_and_reached_again_once() {
        let contacts = Contacts::default();
        let start = Instant::now();
        contacts.judge(3, true, start);
        contacts.judge(3, false, start);
        assert_eq!(contacts.judge(3, false, start + LOST_AFTER), ContactNews::Lost);
        assert_eq!(contacts.judge(3, false, start + LOST_AFTER * 3), ContactNews::None);
        assert_eq!(contacts.judge(3, true, start + LOST_AFTER * 4), ContactNews::Reached);
        assert_eq!(contacts.judge(3, true, start + LOST_AFTER * 5), ContactNews::None);
    }

    #[test]
    fn a_peer_never_reached_is_waited_for_and_never_lost() {
        let contacts = Contacts::default();
        let start = Instant::now();
        assert_eq!(contacts.judge(4, false, start), ContactNews::Waiting);
        assert_eq!(contacts.judge(4, false, start + LOST_AFTER * 10), ContactNews::None);
        assert_eq!(contacts.judge(4, true, start + LOST_AFTER * 11), ContactNews::Reached);
    }
}
