//! Acquire requests this node has handed to Raft and not yet seen applied.
//!
//! A leader refuses a command before the log when its applied state refuses it (see
//! `Node::refusal_before_log`), except where an entry still in flight could change the answer.
//! For a retried acquire (attempt above 0) that entry is an earlier attempt of the same request:
//! a retry refused as `lock_busy` while its first attempt is about to be granted would tell the
//! caller it holds nothing, and leave the grant to nobody. So the leader keeps, per session and
//! request, the proposals it has not seen applied, and sends a retry to the log only while one
//! of them may still be ahead of it there.
//!
//! A proposal whose caller went away before the answer (its connection broke, which is exactly
//! when clients retry) may or may not be in the log; its Raft message, if sent, was sent before
//! the caller went away. Raft takes messages in the order they were sent and applies entries in
//! log order, so such a proposal is known applied (or gone for good) once any write that was
//! *numbered after it went away* has been applied. Every write takes a number just before it is
//! handed to Raft, and the registry remembers the highest number seen applied.

use picket_core::{RequestId, SessionId};
use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

/// An acquire request: the session that sent it and the request's id within the session.
pub(crate) type RequestKey = (SessionId, RequestId);

/// Most proposals whose outcome is unsure the registry keeps one by one; beyond it, every
/// request counts as possibly in flight until the write after the last of them is applied.
const MAX_UNSURE: usize = 10_000;

/// See the module documentation.
#[derive(Debug, Default)]
pub(crate) struct InFlight {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// The number the last write handed to Raft took (0: none yet).
    last_write: u64,
    /// The highest number of a write seen applied (0: none yet; numbers start at 1).
    applied_write: u64,
    /// Proposals whose caller is still waiting for their answer, by request.
    proposing: HashMap<RequestKey, usize>,
    /// Proposals handed over whose caller went away or got an error: each with the number the
    /// next write took when it went away. Each is settled once a write numbered at least that
    /// is applied.
    unsure: VecDeque<(u64, RequestKey)>,
    unsure_by_key: HashMap<RequestKey, usize>,
    /// Past [`MAX_UNSURE`]: every request counts as unsure until a write numbered at least this
    /// is applied.
    all_unsure_until: Option<u64>,
}

impl State {
    fn maybe_in_flight(&self, key: RequestKey) -> bool {
        self.all_unsure_until.is_some()
            || self.proposing.contains_key(&key)
            || self.unsure_by_key.contains_key(&key)
    }

    fn settle(&mut self) {
        let applied = self.applied_write;
        if self.all_unsure_until.is_some_and(|until| until <= applied) {
            self.all_unsure_until = None;
        }
        while let Some(&(mark, key)) = self.unsure.front() {
            if mark > applied {
                break;
            }
            self.unsure.pop_front();
            decrement(&mut self.unsure_by_key, key);
        }
    }

    fn make_unsure(&mut self, key: RequestKey) {
        // Only a write numbered after this moment is known to follow it in the log.
        let mark = self.last_write + 1;
        if self.unsure.len() >= MAX_UNSURE {
            self.all_unsure_until = Some(mark);
            return;
        }
        self.unsure.push_back((mark, key));
        *self.unsure_by_key.entry(key).or_default() += 1;
    }
}

fn decrement(counts: &mut HashMap<RequestKey, usize>, key: RequestKey) {
    if let Some(count) = counts.get_mut(&key) {
        *count -= 1;
        if *count == 0 {
            counts.remove(&key);
        }
    }
}

impl InFlight {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Starts a proposal of the acquire request `key` (or of a command that is no acquire, for
    /// `None`). Returns whether an earlier proposal of the same request may still be in flight,
    /// and the proposal's record, which must see [`Proposal::handed_over`] before the write and
    /// [`Proposal::applied`] once it is applied; dropped otherwise, it counts as unsure.
    pub(crate) fn begin(&self, key: Option<RequestKey>) -> (bool, Proposal<'_>) {
        let earlier = key.is_some_and(|key| {
            let mut state = self.lock();
            let earlier = state.maybe_in_flight(key);
            *state.proposing.entry(key).or_default() += 1;
            earlier
        });
        (earlier, Proposal { registry: self, key, number: None, applied: false })
    }
}

/// One proposal's record in the registry; see [`InFlight::begin`].
#[derive(Debug)]
pub(crate) struct Proposal<'a> {
    registry: &'a InFlight,
    key: Option<RequestKey>,
    number: Option<u64>,
    applied: bool,
}

impl Proposal<'_> {
    /// Numbers the write: called just before it is handed to Raft.
    pub(crate) fn handed_over(&mut self) {
        let mut state = self.registry.lock();
        state.last_write += 1;
        self.number = Some(state.last_write);
    }

    /// Records that the write was applied: every write handed over before it was too.
    pub(crate) fn applied(mut self) {
        self.applied = true;
    }
}

impl Drop for Proposal<'_> {
    fn drop(&mut self) {
        let mut state = self.registry.lock();
        if let Some(key) = self.key {
            decrement(&mut state.proposing, key);
            // A proposal never handed over is not in the log.
            if !self.applied && self.number.is_some() {
                state.make_unsure(key);
            }
        }
        if let (true, Some(number)) = (self.applied, self.number) {
            state.applied_write = state.applied_write.max(number);
        }
        state.settle();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: RequestKey = (SessionId(7), RequestId(3));
    const OTHER: RequestKey = (SessionId(7), RequestId(4));

    fn applied_write(registry: &InFlight, key: Option<RequestKey>) {
        let (_, mut proposal) = registry.begin(key);
        proposal.handed_over();
        proposal.applied();
    }

    #[test]
    fn a_retry_while_its_first_attempt_waits_for_the_log_is_in_flight_after_it_is_not() {
        let registry = InFlight::default();
        let (earlier, mut first) = registry.begin(Some(KEY));
        assert!(!earlier, "nothing was proposed before the first attempt");
        first.handed_over();
        assert!(registry.begin(Some(KEY)).0, "the first attempt is still on its way");
        assert!(!registry.begin(Some(OTHER)).0, "another request is not held up by it");
        first.applied();
        assert!(!registry.begin(Some(KEY)).0, "applied, it is in the state the retry is read on");
    }

    #[test]
    fn a_proposal_whose_caller_went_away_is_unsure_until_a_later_write_is_applied() {
        let registry = InFlight::default();
        let (_, mut gone) = registry.begin(Some(KEY));
        gone.handed_over();
        // A write handed over before the caller went away proves nothing about its order.
        let (_, mut before) = registry.begin(None);
        before.handed_over();
        drop(gone);
        before.applied();
        assert!(registry.begin(Some(KEY)).0, "it may still be in the log after that write");
        applied_write(&registry, None);
        assert!(!registry.begin(Some(KEY)).0, "a write numbered after it went away was applied");
    }

    #[test]
    fn a_write_that_failed_leaves_its_request_unsure_too() {
        let registry = InFlight::default();
        let (_, mut failed) = registry.begin(Some(KEY));
        failed.handed_over();
        drop(failed);
        assert!(registry.begin(Some(KEY)).0);
        applied_write(&registry, Some(OTHER));
        assert!(!registry.begin(Some(KEY)).0);
    }

    #[test]
    fn past_the_bound_every_request_is_unsure_until_the_next_write_is_applied() {
        let registry = InFlight::default();
        for request in 0..=MAX_UNSURE as u64 {
            let (_, mut gone) = registry.begin(Some((SessionId(1), RequestId(request))));
            gone.handed_over();
        }
        assert_eq!(registry.lock().unsure.len(), MAX_UNSURE, "the list stays bounded");
        assert!(registry.begin(Some(OTHER)).0, "past the bound no request can be told apart");
        applied_write(&registry, None);
        assert!(!registry.begin(Some(OTHER)).0);
        assert!(registry.lock().unsure.is_empty() && registry.lock().unsure_by_key.is_empty());
    }
}
