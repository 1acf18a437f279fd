//! Which apply rules this node knows, and which a leader writes its entries under, so that a
//! cluster can be upgraded one node at a time.
//!
//! Every log entry carries the version of the apply rules it was written under
//! ([`picket_core::Input::rules`]), and a node that meets a version it does not know stops
//! rather than apply it differently from the others. So a leader must not write a version some
//! voter does not know: during a rolling upgrade, the upgraded leader keeps writing the old
//! version until every member runs a build that knows the new one. Each member (learners too:
//! they apply every entry) says which version it knows in its answer to the leader's clock
//! readings ([`crate::rate`], every 100 ms); the leader writes the newest version every member
//! has said it knows in its leadership, never below the newest its state has accepted (entries
//! already in the log under it bind the cluster anyway), and never above its own. A member
//! that has not answered yet in this leadership (down, or slower than the readings' 200 ms)
//! holds the cluster to that floor.

use crate::raft_types::NodeId;
use picket_core::APPLY_RULES;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

/// How long a leader writes below the rules it knows before it warns: a rolling upgrade
/// restarts one node at a time, each back within seconds, so half a minute is no longer an
/// upgrade in progress but a member that is down, too far away, or still on an older build.
pub const HELD_BACK_WARN_AFTER: Duration = Duration::from_secs(30);
/// While it lasts, the warning is repeated this often.
pub const HELD_BACK_WARN_EVERY: Duration = Duration::from_secs(600);

/// The newest apply rules this process knows: [`APPLY_RULES`], unless a test build was told to
/// act as an older build.
static KNOWN: AtomicU32 = AtomicU32::new(APPLY_RULES);

/// The newest apply rules this node knows: what it tells a leader, and above which it refuses
/// entries.
#[must_use]
pub fn known_apply_rules() -> u32 {
    KNOWN.load(Ordering::Relaxed)
}

/// Makes this process act as a build that knows apply rules up to `rules` only (at most
/// [`APPLY_RULES`]), for rolling-upgrade tests. Only test builds (`picket-server`'s `mutations`
/// feature) do; any other build changes nothing and returns false.
#[must_use]
pub fn act_as_a_build_that_knows_apply_rules_up_to(rules: u32) -> bool {
    if !cfg!(feature = "mutations") {
        return false;
    }
    KNOWN.store(rules.min(APPLY_RULES), Ordering::Relaxed);
    true
}

/// The apply rules a leader writes under: the newest that every member (voters and learners)
/// knows (the leader, which knows `known`, among them; a member that has not said yet counts
/// as knowing none), but never below `newest_accepted`, the newest version its state has
/// accepted, and never above `known`.
#[must_use]
pub fn writing_rules(
    known: u32,
    newest_accepted: u32,
    leader: NodeId,
    members: &BTreeSet<NodeId>,
    reported: &BTreeMap<NodeId, u32>,
) -> u32 {
    let every_member_knows = members
        .iter()
        .map(|member| if *member == leader { Some(known) } else { reported.get(member).copied() })
        .try_fold(known, |newest, member_knows| Some(newest.min(member_knows?)))
        .unwrap_or(0);
    every_member_knows.max(newest_accepted).min(known)
}

/// The members (other than `leader`) that keep a leader below `known`: each with the rules it
/// said it knows, or `None` when it has not said in this leadership.
#[must_use]
pub fn holding_back(
    known: u32,
    leader: NodeId,
    members: &BTreeSet<NodeId>,
    reported: &BTreeMap<NodeId, u32>,
) -> Vec<(NodeId, Option<u32>)> {
    members
        .iter()
        .filter(|member| **member != leader)
        .map(|member| (*member, reported.get(member).copied()))
        .filter(|(_, said)| said.is_none_or(|said| said < known))
        .collect()
}

/// Whether a leader has been held below the rules it knows for long enough to say so. Pure:
/// the time is an input (`now` since any fixed origin).
#[derive(Debug, Default)]
pub struct HeldBack {
    /// Since when the leader writes below what it knows, if it does.
    since: Option<Duration>,
    /// When it last warned in this stretch.
    warned_at: Option<Duration>,
}

impl HeldBack {
    /// Records whether the leader writes below what it knows at `now`. Returns how long it has
    /// been held back when it is time to warn: once after [`HELD_BACK_WARN_AFTER`], then every
    /// [`HELD_BACK_WARN_EVERY`].
    pub fn observe(&mut self, now: Duration, held_back: bool) -> Option<Duration> {
        if !held_back {
            *self = Self::default();
            return None;
        }
        let since = *self.since.get_or_insert(now);
        let held_for = now.saturating_sub(since);
        let due = match self.warned_at {
            None => held_for >= HELD_BACK_WARN_AFTER,
            Some(warned_at) => now.saturating_sub(warned_at) >= HELD_BACK_WARN_EVERY,
        };
        if due {
            self.warned_at = Some(now);
        }
        due.then_some(held_for)
    }

    /// Whether the last observation found the leader held back.
    #[must_use]
    pub fn is_held_back(&self) -> bool {
        self.since.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn voters(ids: &[NodeId]) -> BTreeSet<NodeId> {
        ids.iter().copied().collect()
    }

    #[test]
    fn a_leader_writes_the_newest_rules_every_member_knows() {
        let all = voters(&[1, 2, 3]);
        let upgraded: BTreeMap<NodeId, u32> = [(2, 1), (3, 1)].into();
        assert_eq!(writing_rules(1, 0, 1, &all, &upgraded), 1);
        let one_old: BTreeMap<NodeId, u32> = [(2, 1), (3, 0)].into();
        assert_eq!(writing_rules(1, 0, 1, &all, &one_old), 0, "node 3 knows only version 0");
        let one_silent: BTreeMap<NodeId, u32> = [(2, 1)].into();
        assert_eq!(writing_rules(1, 0, 1, &all, &one_silent), 0, "node 3 has not said");
        assert_eq!(writing_rules(1, 0, 1, &voters(&[1]), &BTreeMap::new()), 1, "alone");
        let with_learner = voters(&[1, 2, 3, 4]);
        assert_eq!(writing_rules(1, 0, 1, &with_learner, &upgraded), 0, "learner 4 has not said");
    }

    #[test]
    fn a_leader_never_writes_below_what_its_state_accepted_nor_above_what_it_knows() {
        let all = voters(&[1, 2, 3]);
        assert_eq!(writing_rules(1, 1, 1, &all, &BTreeMap::new()), 1, "a new leader");
        let newer: BTreeMap<NodeId, u32> = [(2, 7), (3, 7)].into();
        assert_eq!(writing_rules(1, 0, 1, &all, &newer), 1, "peers newer than the leader");
    }

    #[test]
    fn the_members_holding_a_leader_back_are_the_silent_and_the_older() {
        let all = voters(&[1, 2, 3, 4]);
        let reported: BTreeMap<NodeId, u32> = [(2, 1), (3, 0)].into();
        assert_eq!(holding_back(1, 1, &all, &reported), vec![(3, Some(0)), (4, None)]);
        assert!(holding_back(0, 1, &all, &reported).iter().all(|(id, _)| *id == 4));
    }

    #[test]
    fn a_leader_held_back_warns_after_half_a_minute_then_every_ten() {
        let mut held = HeldBack::default();
        let at = Duration::from_secs;
        assert_eq!(held.observe(at(100), true), None, "an upgrade in progress");
        assert_eq!(held.observe(at(129), true), None);
        assert_eq!(held.observe(at(130), true), Some(at(30)));
        assert_eq!(held.observe(at(131), true), None, "said once");
        assert_eq!(held.observe(at(730), true), Some(at(630)), "and again ten minutes later");
        assert!(held.is_held_back());
        assert_eq!(held.observe(at(731), false), None);
        assert!(!held.is_held_back());
        assert_eq!(held.observe(at(732), true), None, "a new stretch starts over");
    }
}
