//! The replication stream to one peer: openraft's AppendEntries requests, sent one at a time
//! as openraft's own sequential stream (`stream_append_sequential`) sends them, but that a
//! request carrying nothing but a new commit index waits a moment for the next request.
//!
//! When a commit advances and no new entry is there to carry it, openraft makes a request with
//! no entries to tell the follower the new commit index. Sent at once, it holds the stream for
//! a whole round trip, and the entry the next client call brings a moment later waits behind it
//! (the 2026-12-04 probe in BENCHMARKS.md: nearly one such request per entry at one client,
//! about 155 µs each). Here it waits up to [`COMMIT_ONLY_WAIT`] for the next request, which
//! carries the same commit index or a newer one (openraft reads it as it builds each request)
//! with the new entries, and is then not sent: one request instead of two, and no wait. With
//! nothing new within the wait it goes alone.
//!
//! Only a request whose previous log id the follower has confirmed on this stream waits: it
//! can then tell the follower nothing but the commit index. A probe, anything else, and every
//! request of a stream openraft opens for one request (its heartbeats, a commit sent on its
//! own) go at once. The request not sent gets no answer of its own: openraft matches answers
//! to its requests in flight by log id (`InflightAppendQueue::drain_acked` in openraft
//! 0.10.0-alpha.37), so the answer to the request after it acknowledges both, with the time
//! openraft built that request, no later than the follower was reached; the leader's lease is
//! never overstated. That matching is openraft's inner working, not its trait's promise (which
//! reads as one answer per request): check it again on any upgrade of openraft.

use super::PeerClient;
use crate::raft_types::{LogId, TypeConfig};
use futures_util::{Stream, StreamExt as _};
use openraft::RaftNetworkV2;
use openraft::base::BoxStream;
use openraft::error::RPCError;
use openraft::network::RPCOption;
use openraft::raft::{AppendEntriesRequest, AppendEntriesResponse, StreamAppendResult};
use std::time::Duration;

/// How long a request carrying only a new commit index waits for a request with entries to
/// carry it instead (tokio's timer rounds it up to its next millisecond tick, so 1 to 2 ms),
/// counted from the first such request: followers learn of a commit at most that much later.
/// The leader's own commits and its clients' answers do not wait for it.
pub(crate) const COMMIT_ONLY_WAIT: Duration = Duration::from_millis(1);

/// One answer of the stream, as openraft reads it.
pub(super) type StreamItem = Result<StreamAppendResult<TypeConfig>, RPCError<TypeConfig>>;

/// The stream's state between two requests.
struct Replication<'s, S> {
    network: &'s mut PeerClient,
    requests: Requests<S>,
    option: RPCOption,
    /// The last log id the follower confirmed on this stream, once it has confirmed one.
    confirmed: Option<Option<LogId>>,
}

/// Sends `input`'s requests to `network`'s peer one at a time, and yields the answers; see the
/// module's documentation for the requests that carry only a commit index.
pub(super) fn replicate<'s, S>(
    network: &'s mut PeerClient,
    input: S,
    option: RPCOption,
) -> BoxStream<'s, StreamItem>
where
    S: Stream<Item = AppendEntriesRequest<TypeConfig>> + Send + Unpin + 'static,
{
    let requests = Requests { input, ended: false };
    let state = Replication { network, requests, option, confirmed: None };
    Box::pin(futures_util::stream::unfold(Some(state), |state| async move {
        let mut state = state?;
        let request = state.requests.next(state.confirmed).await?;
        let prev = request.prev_log_id;
        let last = request.entries.last().map(|entry| entry.log_id).or(prev);
        let answer = state.network.append_entries(request, state.option.clone()).await;
        let response = match answer {
            Ok(response) => response,
            Err(error) => return Some((Err(error), None)),
        };
        // A partial success that stops short of the request's end stops the stream, as in
        // openraft's sequential stream: openraft starts another from what was confirmed.
        let whole = match &response {
            AppendEntriesResponse::PartialSuccess(matching) => *matching == last,
            _ => true,
        };
        let result = response.into_stream_result(prev, last);
        let go_on = match &result {
            Ok(matching) => {
                state.confirmed = Some(*matching);
                whole
            }
            Err(_) => false,
        };
        Some((Ok(result), go_on.then_some(state)))
    }))
}

/// openraft's requests, as they are to be sent.
struct Requests<S> {
    input: S,
    /// Whether openraft's requests have ended.
    ended: bool,
}

impl<S> Requests<S>
where
    S: Stream<Item = AppendEntriesRequest<TypeConfig>> + Unpin,
{
    /// The next request to send, `None` once openraft's requests have ended. A request that
    /// carries only a commit index after `confirmed` gives way to the next one if it comes
    /// within [`COMMIT_ONLY_WAIT`].
    async fn next(
        &mut self,
        confirmed: Option<Option<LogId>>,
    ) -> Option<AppendEntriesRequest<TypeConfig>> {
        if self.ended {
            return None;
        }
        let Some(mut request) = self.input.next().await else {
            self.ended = true;
            return None;
        };
        // One wait for a run of commit-only requests, so a commit index that keeps moving with
        // no entries for this follower is not held back longer than one wait.
        let deadline = tokio::time::Instant::now() + COMMIT_ONLY_WAIT;
        while carries_only_a_commit(&request, confirmed) {
            match tokio::time::timeout_at(deadline, self.input.next()).await {
                Ok(Some(next)) => request = next,
                Ok(None) => {
                    self.ended = true;
                    break;
                }
                Err(_) => break,
            }
        }
        Some(request)
    }
}

/// Whether `request` tells the follower nothing but the commit index: no entries, after the log
/// id the follower `confirmed` on this stream.
fn carries_only_a_commit(
    request: &AppendEntriesRequest<TypeConfig>,
    confirmed: Option<Option<LogId>>,
) -> bool {
    request.entries.is_empty() && confirmed == Some(request.prev_log_id)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::raft_types::{Entry, Vote};
    use openraft::EntryPayload;
    use tokio::sync::mpsc;

    type Input = futures_util::stream::PollFn<
        Box<
            dyn FnMut(
                    &mut std::task::Context<'_>,
                ) -> std::task::Poll<Option<AppendEntriesRequest<TypeConfig>>>
                + Send
                + Unpin,
        >,
    >;

    fn log_id(index: u64) -> LogId {
        LogId::new(openraft::vote::leader_id_adv::LeaderId { term: 1, node_id: 1 }, index)
    }

    /// A request after `prev` with entries up to `last` (none when `last` is `prev`), carrying
    /// the commit index `commit`.
    fn request(prev: u64, last: u64, commit: u64) -> AppendEntriesRequest<TypeConfig> {
        AppendEntriesRequest {
            vote: Vote::new_committed(1, 1),
            prev_log_id: Some(log_id(prev)),
            leader_commit: Some(log_id(commit)),
            entries: (prev + 1..=last)
                .map(|index| Entry { log_id: log_id(index), payload: EntryPayload::Blank })
                .collect(),
        }
    }

    /// openraft's requests as a test sends them.
    fn requests() -> (mpsc::UnboundedSender<AppendEntriesRequest<TypeConfig>>, Requests<Input>) {
        let (send, mut receive) = mpsc::unbounded_channel();
        let input: Input = futures_util::stream::poll_fn(Box::new(move |cx| receive.poll_recv(cx)));
        (send, Requests { input, ended: false })
    }

    fn shape(request: &AppendEntriesRequest<TypeConfig>) -> (u64, usize, u64) {
        let index = |id: Option<LogId>| id.map_or(0, |id| id.index);
        (index(request.prev_log_id), request.entries.len(), index(request.leader_commit))
    }

    #[tokio::test(start_paused = true)]
    async fn a_commit_only_request_gives_way_to_the_next_request_within_the_wait() {
        let (send, mut requests) = requests();
        send.send(request(5, 5, 5)).unwrap();
        // Sent while the commit-only request waits.
        let next = tokio::spawn(async move {
            send.send(request(5, 7, 5)).unwrap();
            send
        });
        let sent = requests.next(Some(Some(log_id(5)))).await.unwrap();
        assert_eq!(shape(&sent), (5, 2, 5), "the entries carry the commit instead");
        drop(next.await.unwrap());
        assert!(requests.next(Some(Some(log_id(7)))).await.is_none(), "then the input ends");
    }

    #[tokio::test(start_paused = true)]
    async fn a_commit_only_request_goes_alone_when_nothing_follows_within_the_wait() {
        let (send, mut requests) = requests();
        send.send(request(5, 5, 5)).unwrap();
        let started = tokio::time::Instant::now();
        let sent = requests.next(Some(Some(log_id(5)))).await.unwrap();
        assert_eq!(shape(&sent), (5, 0, 5));
        assert!(started.elapsed() >= COMMIT_ONLY_WAIT, "sent once the wait is over");
        // The input ending during the wait sends the request too, and ends the stream.
        send.send(request(5, 5, 5)).unwrap();
        drop(send);
        let sent = requests.next(Some(Some(log_id(5)))).await.unwrap();
        assert_eq!(shape(&sent), (5, 0, 5));
        assert!(requests.next(Some(Some(log_id(5)))).await.is_none());
        assert!(requests.next(Some(Some(log_id(5)))).await.is_none(), "and stays ended");
    }

    #[tokio::test(start_paused = true)]
    async fn commit_only_requests_one_after_another_wait_once_in_all() {
        let (send, mut requests) = requests();
        send.send(request(5, 5, 5)).unwrap();
        let sending = tokio::spawn(async move { requests.next(Some(Some(log_id(5)))).await });
        tokio::task::yield_now().await;
        // A commit index that keeps moving with no entries: a request every 0.6 ms, each
        // within a wait of the one before it.
        for commit in 6..10 {
            tokio::time::advance(Duration::from_micros(600)).await;
            let _ = send.send(request(5, 5, commit));
            tokio::task::yield_now().await;
        }
        let sent = sending.await.unwrap().unwrap();
        assert_eq!(shape(&sent).1, 0, "no entries came");
        let commit = sent.leader_commit.unwrap().index;
        assert!(commit < 9, "sent while the commit still moved, carrying {commit}");
    }

    #[tokio::test(start_paused = true)]
    async fn requests_the_follower_may_need_go_at_once() {
        let (send, mut requests) = requests();
        let started = tokio::time::Instant::now();
        // Entries; a request after a log id not confirmed (a probe); any request before the
        // follower confirmed anything.
        for (request, confirmed) in [
            (request(5, 6, 5), Some(Some(log_id(5)))),
            (request(5, 5, 5), Some(Some(log_id(4)))),
            (request(5, 5, 5), Some(None)),
            (request(5, 5, 5), None),
        ] {
            let expected = shape(&request);
            send.send(request).unwrap();
            send.send(self::request(5, 9, 9)).unwrap();
            assert_eq!(shape(&requests.next(confirmed).await.unwrap()), expected);
            assert_eq!(shape(&requests.next(Some(Some(log_id(4)))).await.unwrap()), (5, 4, 9));
        }
        assert_eq!(started.elapsed(), Duration::ZERO, "no request waited");
    }
}
