//! Linearizability of the guarded lock's history against a fenced mutex with sessions.
//!
//! The model: a lock that is free or held under one token, and the largest token granted so
//! far. Of the history it uses what is certain:
//!
//! - an acquire acknowledged with token `t` took effect at one instant between its invocation
//!   and its acknowledgement; `t` exceeds every token granted before that instant, and the
//!   lock is held under `t` from then on;
//! - a release acknowledged as having ended its grant (`Released::Now`) took effect at one
//!   instant in its interval, while the lock was held under its token, and freed it;
//! - a second acknowledgement of the same grant (an acquire answered `already_held`) took
//!   effect while the lock was held under its token.
//!
//! Sessions end on their own (expiry, revocation, an abandon), and those ends are not in the
//! history, so the lock may become free at any instant: a grant needs only a larger token, not
//! a free lock. Refused operations changed nothing; an operation whose outcome is unknown is
//! left out, since whatever it did, an end of a session could have done too (an unknown
//! acquire may have made a grant nobody saw, which only ever holds the lock, and holding
//! explains no acknowledgement the history has).
//!
//! A Porcupine- or Knossos-style search tries orders of the operations; here the order is not
//! a choice: tokens only grow, so grants take effect in token order, and every other operation
//! on a grant sits between that grant and the next one. What is left is whether one instant
//! can be picked inside each operation's interval along that chain, each after the one before:
//! picking each as early as its interval and the one before allow is never worse for what
//! follows, so one pass decides it exactly. No bound is needed and the answer is never
//! unknown: the search space is a single chain.

use super::history::{Op, Phase};
use std::collections::BTreeMap;

/// An operation the model uses: its interval on the shared clock and what it did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Certain {
    /// The client process.
    pub process: u32,
    /// When it was sent.
    pub invoked_ns: u64,
    /// When its acknowledgement came.
    pub ended_ns: u64,
    /// What it did.
    pub effect: Effect,
}

/// What an acknowledged operation did to the lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Effect {
    /// Granted the lock under this token.
    Grant(u64),
    /// Found the lock held under this token (a second acknowledgement of the grant).
    Held(u64),
    /// Ended the grant of this token.
    Release(u64),
}

impl Effect {
    fn token(self) -> u64 {
        match self {
            Self::Grant(token) | Self::Held(token) | Self::Release(token) => token,
        }
    }

    /// Where it sits among the operations on its grant: the grant, then what found it held,
    /// then its release.
    fn rank(self) -> u8 {
        match self {
            Self::Grant(_) => 0,
            Self::Held(_) => 1,
            Self::Release(_) => 2,
        }
    }
}

/// The operations of the history the model uses, from (process, op, invoked, ended, phase).
/// The first acknowledgement of a token is its grant; any later one found it held.
#[must_use]
pub fn certain_operations<'a>(
    ops: impl Iterator<Item = (u32, &'a Op, u64, u64, &'a Phase)>,
) -> Vec<Certain> {
    let mut acquired: Vec<(u32, u64, u64, u64)> = Vec::new();
    let mut certain = Vec::new();
    for (process, op, invoked_ns, ended_ns, phase) in ops {
        match (op, phase) {
            (Op::Acquire, Phase::Ok { token: Some(token), .. }) => {
                acquired.push((process, invoked_ns, ended_ns, *token));
            }
            (Op::Release { token }, Phase::Ok { .. }) => certain.push(Certain {
                process,
                invoked_ns,
                ended_ns,
                effect: Effect::Release(*token),
            }),
            _ => {}
        }
    }
    acquired.sort_by_key(|&(_, _, ended_ns, token)| (token, ended_ns));
    let mut granted: BTreeMap<u64, ()> = BTreeMap::new();
    for (process, invoked_ns, ended_ns, token) in acquired {
        let effect = if granted.insert(token, ()).is_none() {
            Effect::Grant(token)
        } else {
            Effect::Held(token)
        };
        certain.push(Certain { process, invoked_ns, ended_ns, effect });
    }
    certain
}

/// Why a history is not linearizable: the first operation no instant can be picked for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NotLinearizable {
    /// The operation.
    pub operation: Certain,
    /// The operation before it on the chain, which took effect no earlier than `after_ns`.
    pub after: Certain,
    /// The earliest instant the operation before it can have taken effect.
    pub after_ns: u64,
}

impl NotLinearizable {
    /// A sentence for the run's summary, with times in ms from `start_ns`.
    #[must_use]
    pub fn describe(&self, start_ns: u64) -> String {
        let ms = |ns: u64| ns.saturating_sub(start_ns) / 1_000_000;
        let what = |certain: &Certain| match certain.effect {
            Effect::Grant(token) => format!("the grant of token {token}"),
            Effect::Held(token) => format!("an acquire answered already held with token {token}"),
            Effect::Release(token) => format!("the release of token {token}"),
        };
        format!(
            "not linearizable: {} (process {}, sent at {} ms, acknowledged at {} ms) must take effect after {} (process {}), which cannot have taken effect before {} ms",
            what(&self.operation),
            self.operation.process,
            ms(self.operation.invoked_ns),
            ms(self.operation.ended_ns),
            what(&self.after),
            self.after.process,
            ms(self.after_ns),
        )
    }
}

/// Decides whether `operations` (of one lock) are linearizable: walks the chain of grants in
/// token order, each followed by the acknowledgements that found it held (in any order among
/// themselves) and then its release, and picks for each operation the earliest instant in its
/// interval after what it must follow.
///
/// # Errors
/// The first operation no instant can be picked for.
pub fn check(mut operations: Vec<Certain>) -> Result<(), NotLinearizable> {
    operations.sort_by_key(|op| (op.effect.token(), op.effect.rank(), op.invoked_ns));
    // What the next grant or release must follow, and the instant picked for it.
    let mut last: Option<(Certain, u64)> = None;
    // The grant that acknowledgements of it as held must follow, with its instant.
    let mut grant: Option<(Certain, u64)> = None;
    for operation in operations {
        let follows = match operation.effect {
            Effect::Held(_) => grant,
            Effect::Grant(_) | Effect::Release(_) => last,
        };
        let earliest_ns = follows.map_or(0, |(_, at_ns)| at_ns.saturating_add(1));
        let at_ns = operation.invoked_ns.max(earliest_ns);
        if at_ns > operation.ended_ns {
            let (after, after_ns) = follows.expect("nothing to follow leaves the interval whole");
            return Err(NotLinearizable { operation, after, after_ns });
        }
        match operation.effect {
            Effect::Grant(_) => {
                grant = Some((operation, at_ns));
                last = grant;
            }
            // The release follows the latest of them.
            Effect::Held(_) => {
                if last.is_none_or(|(_, last_ns)| at_ns > last_ns) {
                    last = Some((operation, at_ns));
                }
            }
            Effect::Release(_) => last = Some((operation, at_ns)),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(process: u32, invoked_ns: u64, ended_ns: u64, effect: Effect) -> Certain {
        Certain { process, invoked_ns, ended_ns, effect }
    }

    #[test]
    fn grants_and_releases_in_token_order_are_linearizable() {
        let history = vec![
            op(1, 0, 10, Effect::Grant(3)),
            op(1, 20, 30, Effect::Release(3)),
            op(2, 5, 40, Effect::Grant(5)),
            op(2, 45, 50, Effect::Release(5)),
        ];
        assert_eq!(check(history), Ok(()));
    }

    #[test]
    fn overlapping_operations_may_take_effect_in_either_order_of_sending() {
        // The grant of 7 was sent before 5 was acknowledged: it may have taken effect after.
        let history = vec![op(1, 10, 20, Effect::Grant(5)), op(2, 0, 30, Effect::Grant(7))];
        assert_eq!(check(history), Ok(()));
    }

    #[test]
    fn a_smaller_token_granted_after_a_larger_one_was_acknowledged_is_not_linearizable() {
        let history = vec![op(1, 0, 10, Effect::Grant(7)), op(2, 20, 30, Effect::Grant(5))];
        let broken = check(history).unwrap_err();
        assert_eq!(broken.operation.effect, Effect::Grant(7));
        assert_eq!(broken.after.effect, Effect::Grant(5));
    }

    /// The release of a grant that a later grant had replaced cannot have ended it: the
    /// service acknowledged a release of a lock held under another token.
    #[test]
    fn a_release_acknowledged_after_the_next_grant_is_not_linearizable() {
        let history = vec![
            op(1, 0, 10, Effect::Grant(3)),
            op(2, 15, 20, Effect::Grant(5)),
            op(1, 25, 30, Effect::Release(3)),
        ];
        let broken = check(history).unwrap_err();
        assert_eq!(broken.operation.effect, Effect::Grant(5));
        assert_eq!(broken.after.effect, Effect::Release(3));
        assert!(broken.describe(0).contains("not linearizable"), "{}", broken.describe(0));
    }

    #[test]
    fn a_release_before_its_own_grant_was_sent_is_not_linearizable() {
        let history = vec![op(1, 20, 30, Effect::Grant(3)), op(1, 0, 10, Effect::Release(3))];
        assert!(check(history).is_err());
    }

    #[test]
    fn acknowledgements_that_found_a_grant_held_may_overlap_but_precede_its_release() {
        let held = vec![
            op(1, 0, 10, Effect::Grant(3)),
            op(1, 12, 20, Effect::Held(3)),
            op(2, 11, 14, Effect::Held(3)),
            op(1, 21, 30, Effect::Release(3)),
        ];
        assert_eq!(check(held), Ok(()));
        let held_after_release = vec![
            op(1, 0, 10, Effect::Grant(3)),
            op(1, 11, 15, Effect::Release(3)),
            op(1, 20, 30, Effect::Held(3)),
        ];
        assert!(check(held_after_release).is_err());
    }

    #[test]
    fn only_certain_outcomes_are_used_and_a_repeated_token_is_found_held() {
        let ok = |token| Phase::Ok { token: Some(token), session: Some(1), value: None };
        let released = Phase::Ok { token: None, session: None, value: None };
        let unknown = Phase::Info { detail: "timeout".into() };
        let refused = Phase::Fail { code: "not_held".into() };
        let (acquire, release) = (Op::Acquire, Op::Release { token: 3 });
        let (first, again) = (ok(3), ok(3));
        let history = vec![
            (1, &acquire, 0, 10, &first),
            (1, &acquire, 11, 12, &again),
            (1, &acquire, 13, 14, &unknown),
            (1, &release, 15, 16, &refused),
            (1, &release, 17, 18, &released),
        ];
        let certain = certain_operations(history.into_iter());
        let effects: Vec<Effect> = certain.iter().map(|op| op.effect).collect();
        assert_eq!(effects, vec![Effect::Release(3), Effect::Grant(3), Effect::Held(3)]);
    }
}
