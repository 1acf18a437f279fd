//! Acquire requests this node has handed to Raft and not yet seen applied.
//!
//! A leader refuses a command before the log when its applied state refuses it (see
//! `Node::refusal_before_log`), except where an entry still in flight could change the answer.
//! For a retried acquire (attempt above 0) that entry is an earlier attempt of the same request:
//! a retry refused as `lock_busy` while its first attempt is about to be granted would tell the
//! caller it holds nothing, and leave the grant to nobody. So the leader keeps, per session and
//! request, the proposals it has not seen applied; a retry waits (briefly) until every earlier
//! one is applied and then is decided on the state like any command, and goes to the log
//! undecided only if one may still be ahead of it there when the wait ends. (Unsure proposals
//! settle on writes proposed on this node, so on a node that stopped leading they stay unsure;
//! such a node passes every write on to Raft, which names the leader.)
//!
//! A proposal whose caller went away before the answer (its connection broke, which is exactly
//! when clients retry) may or may not be in the log; its Raft message, if sent, was sent before
//! the caller went away. Raft takes messages in the order they were sent and applies entries in
//! log order, so such a proposal is known applied (or gone for good) once any write that was
//! *numbered after it went away* has been applied. Every write takes a number just before it is
//! handed to Raft, and the registry remembers the highest number seen applied.

use picket_core::{RequestId, SessionId};
use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::Mutex;
use std::time::Duration;
use tokio::sync::Notify;

/// An acquire request: the session that sent it and the request's id within the session.
pub(crate) type RequestKey = (SessionId, RequestId);

/// Most proposals whose outcome is unsure the registry keeps one by one; beyond it, every
/// request counts as possibly in flight until the write after the last of them is applied.
const MAX_UNSURE: usize = 10_000;

/// See the module documentation.
#[derive(Debug, Default)]
pub(crate) struct InFlight {
    state: Mutex<State>,
    /// Woken whenever a proposal ends.
    ended: Notify,
}

#[derive(Debug, Default)]
struct State {
    /// The number the last write handed to Raft took (0: none yet).
    last_write: u64,
    /// The highest number of a write seen applied (0: none yet; numbers start at 1).
    applied_write: u64,
    /// The number the last proposal begun took.
    last_begun: u64,
    /// Proposals whose caller is still waiting for their answer, by request, each by the
    /// number it took when it began.
    proposing: HashMap<RequestKey, BTreeSet<u64>>,
    /// Proposals handed over whose caller went away or got an error: each with the number the
    /// next write took when it went away. Each is settled once a write numbered at least that
    /// is applied.
    unsure: VecDeque<(u64, RequestKey, u64)>,
    /// The same, by request, each by the number it took when it began.
    unsure_by_key: HashMap<RequestKey, BTreeSet<u64>>,
    /// Past [`MAX_UNSURE`]: every request counts as unsure until a write numbered at least this
    /// is applied.
    all_unsure_until: Option<u64>,
}

impl State {
    /// Whether a proposal of `key` begun before number `begun` may still be in flight.
    fn earlier_in_flight(&self, key: RequestKey, begun: u64) -> bool {
        let before = |numbers: &BTreeSet<u64>| numbers.range(..begun).next().is_some();
        self.all_unsure_until.is_some()
            || self.unsure_by_key.get(&key).is_some_and(before)
            || self.proposing.get(&key).is_some_and(before)
    }

    fn settle(&mut self) {
        let applied = self.applied_write;
        if self.all_unsure_until.is_some_and(|until| until <= applied) {
            self.all_unsure_until = None;
        }
        while let Some(&(mark, key, begun)) = self.unsure.front() {
            if mark > applied {
                break;
            }
            self.unsure.pop_front();
            remove(&mut self.unsure_by_key, key, begun);
        }
    }

    fn make_unsure(&mut self, key: RequestKey, begun: u64) {
        // Only a write numbered after this moment is known to follow it in the log.
        let mark = self.last_write + 1;
        if self.unsure.len() >= MAX_UNSURE {
            self.all_unsure_until = Some(mark);
            return;
        }
        self.unsure.push_back((mark, key, begun));
        self.unsure_by_key.entry(key).or_default().insert(begun);
    }
}

fn remove(numbers_by_key: &mut HashMap<RequestKey, BTreeSet<u64>>, key: RequestKey, begun: u64) {
    if let Some(numbers) = numbers_by_key.get_mut(&key) {
        numbers.remove(&begun);
        if numbers.is_empty() {
            numbers_by_key.remove(&key);
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
        let mut begun = 0;
        let earlier = key.is_some_and(|key| {
            let mut state = self.lock();
            state.last_begun += 1;
            begun = state.last_begun;
            state.proposing.entry(key).or_default().insert(begun);
            state.earlier_in_flight(key, begun)
        });
        (earlier, Proposal { registry: self, key, begun, number: None, applied: false })
    }
}

/// One proposal's record in the registry; see [`InFlight::begin`].
#[derive(Debug)]
pub(crate) struct Proposal<'a> {
    registry: &'a InFlight,
    key: Option<RequestKey>,
    /// The number it took when it began (acquires only).
    begun: u64,
    number: Option<u64>,
    applied: bool,
}

impl Proposal<'_> {
    /// Waits, at most `timeout`, until no proposal of the same request begun before this one
    /// may still be in flight; returns whether none may. Proposals begun after this one are not
    /// waited for, so two retries never wait for each other.
    pub(crate) async fn wait_for_earlier(&self, timeout: Duration) -> bool {
        let Some(key) = self.key else { return true };
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let ended = self.registry.ended.notified();
            tokio::pin!(ended);
            // Registered before the look, so an end between the two still wakes it.
            ended.as_mut().enable();
            if !self.registry.lock().earlier_in_flight(key, self.begun) {
                return true;
            }
            if tokio::time::timeout_at(deadline, ended).await.is_err() {
                return false;
            }
        }
    }

    /// Numbers the write: called just before it is handed to Raft.
    pub(crate) fn handed_over(&mut self) {
        let mut state = self.registry.lock();
        state.last_write += 1;
        self.number = Some(state.last_write);
    }

    /// Records that the write was applied. (So was every write that reached Raft's channel
    /// before it: those numbered at or after an unsure proposal's mark did.)
    pub(crate) fn applied(mut self) {
        self.applied = true;
    }

    /// Records that Raft refused the write without appending it (this node does not lead): it
    /// is not in the log, so it leaves nothing unsure.
    pub(crate) fn not_appended(mut self) {
        self.number = None;
    }
}

impl Drop for Proposal<'_> {
    fn drop(&mut self) {
        let mut state = self.registry.lock();
        if let Some(key) = self.key {
            remove(&mut state.proposing, key, self.begun);
            // A proposal never handed over is not in the log.
            if !self.applied && self.number.is_some() {
                state.make_unsure(key, self.begun);
            }
        }
        if let (true, Some(number)) = (self.applied, self.number) {
            state.applied_write = state.applied_write.max(number);
        }
        state.settle();
        drop(state);
        self.registry.ended.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: RequestKey = (SessionId(7), RequestId(3));
    const OTHER: RequestKey = (SessionId(7), RequestId(4));

    /// A proposal of `key` handed to Raft whose caller went away (or whose write failed).
    fn handed_over_and_dropped(registry: &InFlight, key: RequestKey) {
        let (_, mut proposal) = registry.begin(Some(key));
        proposal.handed_over();
    }

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
        handed_over_and_dropped(&registry, KEY);
        assert!(registry.begin(Some(KEY)).0);
        applied_write(&registry, Some(OTHER));
        assert!(!registry.begin(Some(KEY)).0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_retry_waits_for_an_earlier_attempt_never_for_a_later_one() {
        let registry = InFlight::default();
        let (_, mut first) = registry.begin(Some(KEY));
        first.handed_over();
        let (earlier, retry) = registry.begin(Some(KEY));
        assert!(earlier);
        let (_, later) = registry.begin(Some(KEY));
        let waited = async { retry.wait_for_earlier(Duration::from_secs(1)).await };
        let applies = async {
            tokio::time::sleep(Duration::from_millis(10)).await;
            first.applied();
        };
        let (clear, ()) = tokio::join!(waited, applies);
        assert!(clear, "the first attempt applied; the later one, still open, is not waited for");
        drop(later);
    }

    #[test]
    fn a_later_attempt_whose_caller_went_away_does_not_hold_up_an_earlier_one() {
        let registry = InFlight::default();
        let (_, earlier) = registry.begin(Some(KEY));
        handed_over_and_dropped(&registry, KEY);
        assert!(!registry.lock().earlier_in_flight(KEY, earlier.begun));
        let (_, mut refused) = registry.begin(Some(OTHER));
        refused.handed_over();
        refused.not_appended();
        assert!(!registry.begin(Some(OTHER)).0, "a write Raft refused to append is not unsure");
    }

    #[tokio::test(start_paused = true)]
    async fn a_wait_for_an_attempt_whose_caller_went_away_ends_by_its_timeout_or_a_later_write() {
        let registry = InFlight::default();
        handed_over_and_dropped(&registry, KEY);
        let (_, retry) = registry.begin(Some(KEY));
        assert!(!retry.wait_for_earlier(Duration::from_millis(100)).await, "nothing was written");
        let waited = async { retry.wait_for_earlier(Duration::from_secs(1)).await };
        let written = async {
            tokio::time::sleep(Duration::from_millis(10)).await;
            applied_write(&registry, None);
        };
        let (clear, ()) = tokio::join!(waited, written);
        assert!(clear, "a write numbered after it went away was applied");
    }

    #[test]
    fn past_the_bound_every_request_is_unsure_until_the_next_write_is_applied() {
        let registry = InFlight::default();
        for request in 0..=MAX_UNSURE as u64 {
            handed_over_and_dropped(&registry, (SessionId(1), RequestId(request)));
        }
        assert_eq!(registry.lock().unsure.len(), MAX_UNSURE, "the list stays bounded");
        assert!(registry.begin(Some(OTHER)).0, "past the bound no request can be told apart");
        applied_write(&registry, None);
        assert!(!registry.begin(Some(OTHER)).0);
        assert!(registry.lock().unsure.is_empty() && registry.lock().unsure_by_key.is_empty());
    }
}
