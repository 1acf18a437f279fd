"""The blocking client against a real ``picket serve``."""

from __future__ import annotations

import builtins
import gc
import json
import socket
import ssl
import threading
import time
from typing import List, Tuple

import httpx
import pytest

import picket
from conftest import AnswerSwallowingProxy, Server, free_port, wait_until


def holder(server: Server, name: str) -> object:
    return httpx.get(f"http://{server.addr}/v1/locks/{name}").json()["holder"]


def test_lock_and_unlock(server: Server) -> None:
    with picket.Client([server.addr]) as client:
        with client.lock("jobs/report", ttl=5, wait=5) as grant:
            assert grant.token > 0
            assert grant.sequencer == f"p1.{grant.token}.jobs/report"
            assert client.check(grant.sequencer)["status"] == "current"
            assert holder(server, "jobs/report")["token"] == grant.token
            assert not grant.lost.is_set()
        assert holder(server, "jobs/report") is None
        assert client.check(grant.sequencer)["status"] == "superseded"


def test_try_lock_on_a_held_lock_raises_lock_busy_with_the_holders_token(server: Server) -> None:
    with picket.Client([server.addr]) as client:
        with client.lock("busy", ttl=5) as grant:
            with pytest.raises(picket.LockBusy) as busy:
                with client.try_lock("busy", ttl=5):
                    pass
            assert busy.value.holder_token == grant.token
            assert busy.value.code == "lock_busy"
            assert busy.value.outcome == "not_applied"


def test_waiters_are_granted_in_fifo_order_with_growing_tokens(server: Server) -> None:
    client = picket.Client([server.addr])
    first = client.session(ttl=10)
    held = first.lock("queue")
    order: List[Tuple[str, int]] = []

    def wait_for(name: str) -> None:
        with client.session(ttl=10) as session:
            with session.lock("queue", wait=20) as grant:
                order.append((name, grant.token))

    waiters = []
    for position, name in enumerate(["second", "third"]):
        thread = threading.Thread(target=wait_for, args=(name,))
        thread.start()
        waiters.append(thread)
        wait_until(f"{name} to queue", 10, lambda: len(client.lock_info("queue")["waiters"]) == position + 1)
    held.release()
    for thread in waiters:
        thread.join(20)
    first.close()
    assert [name for name, _ in order] == ["second", "third"]
    assert held.token < order[0][1] < order[1][1]
    client.close()


def test_lost_is_set_at_once_when_the_server_revokes_the_session(server: Server) -> None:
    losses: List[str] = []
    with picket.Client([server.addr]) as client:
        session = client.session(ttl=30)
        grant = session.lock("revoked", on_lost=lambda grant, reason: losses.append(reason))
        client.revoke(session.id)
        assert session.lost.wait(3), "revocation reaches the session at once, not after its TTL"
        assert grant.lost.is_set()
        assert losses == ["session_revoked"] or losses == ["revoked"], losses
        with pytest.raises(picket.SessionLost):
            session.lock("again")
        grant.release()
        session.close()


def test_lost_is_set_within_the_ttl_when_the_server_stops(server: Server) -> None:
    with picket.Client([server.addr], timeout=1) as client:
        session = client.session(ttl=4)
        # When the client judged the lease lost, read where it decides (the callback), not
        # when this test's thread got round to looking: a loaded machine may wake it late.
        # The session's `lost` is set before its grants' callbacks run: wait for the callback.
        lost_at: List[float] = []
        called = threading.Event()

        def on_lost(grant: picket.Grant, reason: str) -> None:
            lost_at.append(time.monotonic())
            called.set()

        grant = session.lock("silent", on_lost=on_lost)
        # The lease counts from the send of the last confirmed keepalive: TTL less 3 % after it.
        sent_at = time.monotonic()
        session.keepalive()
        server.stop()
        assert called.wait(6)
        lost_after = lost_at[0] - sent_at
        assert 3.0 < lost_after < 4.0, f"the client counted on its lease for {lost_after:.2f} s (TTL 4 s)"
        assert session.lost_reason == "silent"
        assert grant.lost.is_set()
        session.close()


def test_a_grant_is_released_when_its_block_raises(server: Server) -> None:
    with picket.Client([server.addr]) as client:
        with pytest.raises(RuntimeError):
            with client.lock("raises", ttl=5):
                raise RuntimeError("the work failed")
        assert holder(server, "raises") is None


def test_fence_on_acquire_and_the_sequencer_on_http_writes(server: Server, kv: "object") -> None:
    store = f"http://{kv.addr}"  # type: ignore[attr-defined]
    with picket.Client([server.addr]) as client:
        with client.lock("res", ttl=5) as old:
            pass
        with client.lock("res", ttl=5, fence=[f"{store}/fence/res/"]) as grant:
            with httpx.Client(auth=picket.fence.SequencerAuth(grant)) as http:
                assert http.put(f"{store}/kv/res/x", content=b"new").status_code == 200
            stale = httpx.put(f"{store}/kv/res/x", content=b"old", headers=picket.fence.headers(old))
            assert stale.status_code == 409
            assert stale.json()["code"] == "stale_token"
            assert stale.json()["highest_token"] == grant.token


def open_despite_short_timeouts(client: picket.Client) -> picket.Session:
    """A session (60 s TTL) of a client whose timeout is short. An open is not retried once
    sent; a loaded machine that answers one later than the timeout would fail the test before
    it begins, so it tries again (a session given up on holds nothing and expires)."""
    for attempt in range(5):
        try:
            return client.session(ttl=60)
        except picket.OutcomeUnknown:
            if attempt == 4:
                raise
    raise AssertionError("unreachable")


def test_an_acquire_given_up_unanswered_is_abandoned_and_leaves_no_ghost_holder(server: Server) -> None:
    """The node grants the acquire, but no answer reaches the client, which gives up after its
    retries (``OutcomeUnknown``). The session lives on (its keepalives still reach the node), so
    the grant would stay with it, known to nobody, until it ends. The client abandons the request
    it gave up on, and the lock is free again."""
    proxy = AnswerSwallowingProxy(server.addr)
    try:
        with picket.Client([proxy.addr], timeout=0.3) as client:
            session = open_despite_short_timeouts(client)
            proxy.swallow.set()
            with pytest.raises(picket.OutcomeUnknown):
                session.try_lock("unanswered")
            wait_until("the given-up grant to be abandoned", 10, lambda: holder(server, "unanswered") is None)
            proxy.swallow.clear()
    finally:
        proxy.close()


def test_a_node_that_cannot_serve_is_passed_over_for_the_next_endpoint() -> None:
    """A node that answers ``unavailable`` (cut off from a quorum, catching up) may not be the
    only one: the next attempt goes to the next endpoint, as after a ``not_leader`` naming no
    leader. It used to go to the same node again until the client's timeout ran out."""
    from picket._transport import _Attempts, _Cluster, _Endpoints

    endpoints = _Endpoints(["127.0.0.1:1", "127.0.0.1:2"])
    attempts = _Attempts(endpoints, _Cluster(None, httpx.Headers(), endpoints), 1.0)
    cut_off = httpx.Response(503, json={"code": "unavailable", "message": "no quorum"})
    assert attempts.answered(cut_off) is None, "tried again"
    assert endpoints.url() == "http://127.0.0.1:2"
    no_leader = httpx.Response(421, json={"code": "not_leader", "message": "no leader is known"})
    assert attempts.answered(no_leader) is None
    assert endpoints.url() == "http://127.0.0.1:1", "and round again"


def test_abandons_waiting_are_bounded_and_tried_again_only_while_they_may_land() -> None:
    """The queue's rules, without a server: new abandons go first, one that got no answer is due
    again after the pause, one answered, refused or tried for too long is done, and past the
    bound the least recently tried is dropped before any new one."""
    from picket import _common

    queue = _common.AbandonQueue()
    queue.add({"name": "a"}, now=0.0)
    a = queue.take(0.0)
    assert isinstance(a, _common.Abandon) and a.body["name"] == "a"
    assert queue.settle(a, picket.Unavailable("no leader", code="unavailable"), now=1.0)
    assert queue.take(1.0) == pytest.approx(_common.ABANDON_RETRY_PAUSE_S), "due after the pause"
    queue.add({"name": "b"}, now=2.0)
    b = queue.take(2.0)
    assert isinstance(b, _common.Abandon) and b.body["name"] == "b", "a new one goes first"
    assert not queue.settle(b, None, now=2.0)
    assert queue.take(2.0) is a
    followers = picket.NotLeader("no leader known", code="not_leader")
    assert queue.settle(a, followers, now=3.0), "followers that know of no leader are no answer"
    assert queue.take(4.0) is a
    assert not queue.settle(a, picket.UnknownSession("gone", code="unknown_session"), now=4.0)
    assert queue.take(4.0) is None, "a refusal ends it"
    queue.add({"name": "old"}, now=0.0)
    old = queue.take(0.0)
    assert isinstance(old, _common.Abandon)
    lost = picket.OutcomeUnknown("lost", code="outcome_unknown")
    assert not queue.settle(old, lost, now=_common.ABANDON_PERSISTS_FOR_S), "tried for too long"
    queue.add({"name": "tried"}, now=0.0)
    tried = queue.take(0.0)
    assert isinstance(tried, _common.Abandon)
    for n in range(_common.MAX_PENDING_ABANDONS - 1):
        assert queue.add({"name": n}, now=0.0) is None
    assert queue.settle(tried, lost, now=1.0)
    dropped = queue.add({"name": "one too many"}, now=1.0)
    assert dropped is tried, "the one tried before goes first"
    dropped = queue.add({"name": "two too many"}, now=1.0)
    assert dropped is not None and dropped.body["name"] == 0, "then the oldest new one"
    assert len(queue) == _common.MAX_PENDING_ABANDONS


def test_the_abandons_thread_ends_when_none_is_left_and_starts_again_for_the_next(server: Server) -> None:
    """One thread per client sends the abandons while any are left, and the thread of a client
    closed, or dropped without ``close``, ends even while the cluster cannot be reached."""
    with picket.Client([server.addr]) as client:
        sender = client._abandons
        for request_id in (1, 2):
            # The session does not exist: the node answers at once, and nothing is left.
            sender.add({"name": "x", "session_id": 1 << 40, "request_id": request_id, "attempt": 0})
            wait_until("the abandons thread to end", 10, lambda: not sender._running)
    unreachable = picket.Client([f"127.0.0.1:{free_port()}"], timeout=0.2)
    sender = unreachable._abandons
    sender.add({"name": "x", "session_id": 1, "request_id": 1, "attempt": 0})
    assert sender._running
    unreachable.close()
    wait_until("the closed client's abandons thread to end", 10, lambda: not sender._running)
    # Dropped without close, it used to keep trying, and its connections, for up to an hour.
    dropped = picket.Client([f"127.0.0.1:{free_port()}"], timeout=0.2)
    sender = dropped._abandons
    sender.add({"name": "x", "session_id": 1, "request_id": 1, "attempt": 0})
    assert sender._running
    del dropped
    gc.collect()
    wait_until("the dropped client's abandons thread to end", 10, lambda: not sender._running)


def test_an_abandon_outlasts_an_outage_longer_than_the_clients_timeout(server: Server) -> None:
    """The node granted the acquire, then the client was cut off from it for longer than its
    timeout, so the abandon's first round of retries failed too. It used to be given up then,
    leaving the grant with the session, known to nobody, while the session lived; now it is
    tried again, lands once the link is back, and frees the lock long before the 60 s TTL."""
    proxy = AnswerSwallowingProxy(server.addr)
    try:
        with picket.Client([proxy.addr], timeout=0.3) as client:
            session = open_despite_short_timeouts(client)
            proxy.swallow.set()
            outcome: List[BaseException] = []

            def give_up() -> None:
                try:
                    session.try_lock("outlasted")
                except BaseException as error:  # noqa: BLE001 - checked below
                    outcome.append(error)

            trying = threading.Thread(target=give_up)
            trying.start()
            wait_until("the acquire to reach the node", 10, lambda: holder(server, "outlasted") is not None)
            proxy.cut.set()
            trying.join(30)
            assert outcome and isinstance(outcome[0], picket.OutcomeUnknown), outcome
            # The outage: five times the client's timeout, so the abandon's first round fails.
            time.sleep(1.5)
            assert holder(server, "outlasted") is not None, "nothing reached the node during the outage"
            proxy.cut.clear()
            proxy.swallow.clear()
            wait_until("the given-up grant to be abandoned", 10, lambda: holder(server, "outlasted") is None)
    finally:
        proxy.close()


def test_a_closed_sessions_watch_thread_ends_at_once_even_when_the_service_is_cut_off(server: Server) -> None:
    """Closing a session ends its watch thread at once, even when its ``DELETE`` cannot reach
    the service and no byte will come on the stream: closing the watch's own HTTP client wakes
    the read. (Earlier notes said the thread waited for the stream's next byte; this shows it
    does not, and fails, after 5 s, when ``close`` leaves that client open.)"""
    proxy = AnswerSwallowingProxy(server.addr)
    try:
        with picket.Client([proxy.addr], timeout=0.3) as client:
            session = open_despite_short_timeouts(client)
            assert session._watching.wait(5), "the watch stream opened"
            watch = next(thread for thread in session._threads if thread.name.startswith("picket-watch"))
            proxy.cut.set()
            with pytest.raises(picket.Unavailable):
                session.close()
            watch.join(5)
            assert not watch.is_alive(), "the watch thread still waits for its stream's next byte"
    finally:
        proxy.close()


def test_a_session_nobody_holds_any_more_is_ended_and_its_locks_freed(server: Server) -> None:
    """The leftover noted since 2026-12-05: a session never closed lived, with its locks, as long
    as the process, for its threads held it. Now they hold it weakly, and a session collected
    without ``close`` is ended as ``close`` would end it, long before its TTL."""
    with picket.Client([server.addr]) as client:
        session = client.session(ttl=60)
        grant = session.lock("forgotten")
        threads = list(session._threads)
        assert holder(server, "forgotten") is not None
        del session, grant

        def freed() -> bool:
            # Collected again on each look: a thread may have held the session for a moment.
            gc.collect()
            return holder(server, "forgotten") is None

        wait_until("the forgotten session's lock to be free", 10, freed)
        wait_until("its threads to end", 10, lambda: not any(thread.is_alive() for thread in threads))
        # A session still held is kept alive past its TTL: its threads still renew it.
        kept = client.session(ttl=2)
        with kept.lock("kept"):
            gc.collect()
            time.sleep(3)
            assert not kept.lost.is_set()
            assert holder(server, "kept") is not None
        kept.close()


def test_a_forgotten_sessions_finalizer_run_where_its_thread_holds_a_lock_does_not_deadlock(server: Server) -> None:
    """helper-80's review: the cycle collector runs a finalizer in whatever thread it fires in,
    which may be one of the session's own, inside ``Event.wait`` with the Event's lock held.
    The first finalizer set that Event itself and hung the thread; now it only queues the
    session for the ender thread."""
    with picket.Client([server.addr]) as client:
        session = client.session(ttl=60)

        def collected_while_waiting() -> None:
            with session._closing._cond:  # type: ignore[attr-defined]
                session._finalizer()

        thread = threading.Thread(target=collected_while_waiting, daemon=True)
        thread.start()
        thread.join(5)
        assert not thread.is_alive(), "the finalizer deadlocked its thread"
        wait_until("the ender thread to mark the session lost", 10, session.lost.is_set)

        def ended() -> bool:
            try:
                session.keepalive()
            except picket.UnknownSession:
                return True
            return False

        # The ender thread marks it lost first, then asks the service to end it.
        wait_until("the service to end the session", 10, ended)


def test_each_attempt_of_an_open_carries_a_reading_of_the_clock_taken_as_it_is_sent(
    server: Server,
) -> None:
    """An open's path carries a reading of the client's lease clock, which the leader pairs
    with the session's first keepalive. A retry that resent the first attempt's reading would
    make the clock look faster than it is; each attempt takes its own (issue 21). The first
    endpoint refuses connections, so the open is sent twice."""
    refused = f"127.0.0.1:{free_port()}"
    urls: List[str] = []
    # Given its cluster, the client asks no node which cluster it is of before the open, so
    # the open itself meets the refused endpoint first.
    cluster = cluster_id_of(server)
    with picket.Client([refused, server.addr], timeout=10, cluster_id=cluster) as client:
        hooks = client.transport.http.event_hooks["request"]
        hooks.append(lambda request: urls.append(str(request.url)))
        session = client.session(ttl=5.0)
        session.close()
    opens = [url for url in urls if "/v1/sessions?" in url]
    assert len(opens) == 2, urls
    readings = [float(url.rsplit("clock_ms=", 1)[1]) for url in opens]
    assert readings[1] > readings[0], readings


def test_each_attempt_of_a_keepalive_carries_a_reading_of_the_clock_taken_as_it_is_sent(
    server: Server,
) -> None:
    """A keepalive's first attempt fails before it is sent (a refused connection, as the
    request hook raises it), so it is sent again: the second attempt carries a later reading
    of the lease clock than the first, not the first's again (issue 21)."""
    keepalives: List[str] = []
    failed: List[str] = []

    def fail_first_explicit(request: httpx.Request) -> None:
        url = str(request.url)
        if "/keepalive?" not in url:
            return
        keepalives.append(url)
        if armed and not failed:
            failed.append(url)
            raise httpx.ConnectError("refused by the test", request=request)

    armed = False
    with picket.Client([server.addr], timeout=10) as client:
        client.transport.http.event_hooks["request"].append(fail_first_explicit)
        # The TTL keeps the background thread's next keepalive 20 s away once its first is sent.
        session = client.session(ttl=60.0)
        wait_until("the background thread's first keepalive", 10, lambda: len(keepalives) >= 1)
        sent_before = len(keepalives)
        armed = True
        session.keepalive()
        session.close()
    attempts = keepalives[sent_before:]
    assert len(failed) == 1 and len(attempts) == 2, keepalives
    readings = [float(url.rsplit("clock_ms=", 1)[1]) for url in attempts]
    assert readings[1] > readings[0], readings


def test_server_sent_events_are_read_across_chunks_and_bounded() -> None:
    """Found in review (2026-12-06): a watch joined and searched its whole buffer on every
    chunk and never bounded it, so a stream that trickled bytes without ending an event cost
    time quadratic in its length and memory without bound."""
    from picket._common import MAX_SSE_EVENT_CHARS, SseEvents

    sse = SseEvents()
    assert sse.feed('data: {"kind": "session_ended", "session_id": 7}\n') == []
    assert sse.feed("\n") == [{"kind": "session_ended", "session_id": 7}]
    text = 'data: {"a": 1}\n\ndata: {"b": 2}\n\ndata: {"c"'
    assert [event for char in text for event in sse.feed(char)] == [{"a": 1}, {"b": 2}]
    assert sse.feed(": 3}\n\n") == [{"c": 3}]
    endless = SseEvents()
    with pytest.raises(ValueError):
        for _ in range(MAX_SSE_EVENT_CHARS // 4096 + 2):
            endless.feed("x" * 4096)
    with pytest.raises(ValueError):
        SseEvents().feed('data: {"a": 1}\n\n' + "x" * (MAX_SSE_EVENT_CHARS + 1))
    many = SseEvents().feed('data: {"n": 1}\n\n' * 10_000)
    assert len(many) == 10_000


def test_leaders_named_by_nodes_are_kept_one_at_a_time() -> None:
    """Found in review (2026-12-06): every leader a node named was kept for the client's life."""
    from picket._transport import _Endpoints

    endpoints = _Endpoints(["127.0.0.1:1", "127.0.0.1:2"])
    for n in range(100):
        endpoints.follow(f"10.0.0.{n}:7687")
        assert endpoints.url() == f"http://10.0.0.{n}:7687"
    assert endpoints.all == ["http://127.0.0.1:1", "http://127.0.0.1:2", "http://10.0.0.99:7687"]
    endpoints.follow("127.0.0.1:2")
    assert endpoints.url() == "http://127.0.0.1:2"
    assert len(endpoints.all) == 3


def cluster_id_of(server: Server) -> str:
    named: List[str] = []

    def known() -> bool:
        named[:] = [httpx.get(f"http://{server.addr}/v1/cluster").json()["cluster_id"] or ""]
        return bool(named[0])

    wait_until("the cluster to be named", 20, known)
    return named[0]


def test_a_client_never_sends_a_call_to_a_node_of_another_cluster(tmp_path: "object") -> None:
    """Session ids of two clusters coincide. Alice's client reached cluster A first; once A is
    down, the only node it reaches is one of cluster B, which refuses its requests
    (``other_cluster``): a release naming B's session and grant, as a release of a session with
    the same id would, leaves B's grant standing."""
    import pathlib

    root = pathlib.Path(str(tmp_path))
    a, b = Server(root / "a"), Server(root / "b")
    try:
        a_id, b_id = cluster_id_of(a), cluster_id_of(b)
        with picket.Client([b.addr]) as bob, picket.Client([a.addr, b.addr], timeout=3) as alice:
            bobs = bob.session(ttl=60)
            held = bobs.lock("shared")
            alice.session(ttl=60)
            assert alice.cluster_id == a_id, "the first cluster that answered"
            a.stop()
            release = {"name": "shared", "session_id": bobs.id, "token": held.token}
            started = time.monotonic()
            with pytest.raises(picket.OtherCluster) as refused:
                alice.transport.call("POST", "/v1/locks/release", release, safe=True)
            assert time.monotonic() - started < 3, "said before the client's timeout"
            assert f"belongs to cluster {b_id}, not to cluster {a_id}" in str(refused.value)
            assert holder(b, "shared")["token"] == held.token, "B's grant stands"
            with picket.Client([b.addr], cluster_id=a_id, timeout=3) as given:
                with pytest.raises(picket.OtherCluster):
                    given.lock_info("shared")
            bobs.close()
    finally:
        a.stop()
        b.stop()


def test_a_client_follows_a_restore_of_its_cluster_once_its_own_is_gone() -> None:
    """Until it knows its cluster, the client asks a node first (a probe); it asks a restore of
    its cluster to take it (``picket-follow-restore``) only once no configured node of its own
    can be reached (refused connections, not failed TLS handshakes, or another cluster where its
    own was), and keeps to a restore that took that probe. An answer to a request that expected nothing, once the client
    keeps to a cluster, changes nothing."""
    from picket._transport import EXPECT_CLUSTER_HEADER, FOLLOW_RESTORE_HEADER, _Cluster, _Endpoints

    headers = httpx.Headers()
    endpoints = _Endpoints(["a:1", "a:2"])
    cluster = _Cluster(None, headers, endpoints)
    a, b, c = "a" * 32, "b" * 32, "c" * 32

    def answer(named: str, status: int = 200, **sent: str) -> httpx.Response:
        request = httpx.Request("GET", "http://node/healthz", headers=sent)
        return httpx.Response(status, headers={"picket-cluster-id": named}, request=request)

    assert cluster.probe_headers("http://a:1") == {}, "a probe before the first request"
    cluster.observe("http://a:1", answer(a))
    assert (cluster.id, headers[EXPECT_CLUSTER_HEADER]) == (a, a)
    assert cluster.probe_headers("http://a:1") is None, "no probe while its own cluster answers"
    cluster.observe("http://a:2", answer(a))
    cluster.observe("http://b:1", answer(b))
    assert cluster.id == a, "a request sent before the client knew its cluster"
    refused = httpx.ConnectError("[Errno 111] Connection refused")
    refused.__cause__ = ConnectionRefusedError(111, "Connection refused")
    untrusted = httpx.ConnectError("[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed")
    untrusted.__cause__ = ssl.SSLCertVerificationError("certificate verify failed")
    cluster.unreachable("http://a:1", refused)
    cluster.unreachable("http://a:2", untrusted)
    assert cluster.probe_headers("http://b:1") is None, "a:2 may still answer: something listens there"
    cluster.observe("http://a:2", answer(c, 412, **{EXPECT_CLUSTER_HEADER: a}))
    assert cluster.id == a, "refused: another cluster, where the client's was"
    assert cluster.probe_headers("http://c:1") == {FOLLOW_RESTORE_HEADER: "1"}
    cluster.observe("http://c:1", answer(c, **{EXPECT_CLUSTER_HEADER: a}))
    assert cluster.id == a, "not asked to follow"
    cluster.observe("http://c:1", answer(c, **{EXPECT_CLUSTER_HEADER: a, FOLLOW_RESTORE_HEADER: "1"}))
    assert (cluster.id, headers[EXPECT_CLUSTER_HEADER]) == (c, c), "a restore of it"
    assert cluster.probe_headers("http://c:1") is None, "the restored cluster answers"


def test_two_grants_of_one_lock_in_a_session_both_hear_of_its_end(server: Server) -> None:
    """An acquire of a lock the session holds is answered with the same grant. Each grant
    object hears of the grant's end: a revocation reaches both, and one's release ends the
    other (the watch does not report a holder's own release). The client kept one grant per
    lock name, so the first was never told."""
    with picket.Client([server.addr]) as client:
        session = client.session(ttl=30)
        first = session.lock("twice")
        second = session.lock("twice")
        assert first.token == second.token
        first.release()
        assert second.lost.wait(3) and second.lost_reason == "grant_ended"
        assert holder(server, "twice") is None

        third = session.lock("twice")
        fourth = session.lock("twice")
        client.revoke(session.id)
        assert third.lost.wait(3) and fourth.lost.wait(3), "the revocation reaches both"
        session.close()


def test_a_grant_ended_unseen_is_found_when_the_watch_opens_again_or_on_resync(server: Server) -> None:
    """What the watch stream missed (it was not open, or the node installed a snapshot and said
    ``resync``) is asked for: the session, and each grant's holder and token. A grant ended
    meanwhile is marked lost; one still held is not. Here another caller releases the grant with
    the session's id and token, which the watch reports as the holder's own release."""
    with picket.Client([server.addr]) as client:
        session = client.session(ttl=30)
        kept, ended = session.lock("recheck/kept"), session.lock("recheck/ended")
        release = {"name": "recheck/ended", "session_id": session.id, "token": ended.token}
        assert httpx.post(f"http://{server.addr}/v1/locks/release", json=release).status_code == 200
        session._on_event({"kind": "resync"})
        assert ended.lost.wait(3) and ended.lost_reason == "grant_ended", "checked aside"
        assert not kept.lost.is_set()

        again = session.lock("recheck/ended")
        release["token"] = again.token
        assert httpx.post(f"http://{server.addr}/v1/locks/release", json=release).status_code == 200
        session._probe()
        assert again.lost.wait(3) and again.lost_reason == "grant_ended"
        assert not kept.lost.is_set() and not session.lost.is_set()
        session.close()


def test_lost_reads_the_lease_clock_when_asked() -> None:
    """``lost.is_set()`` asks the lease clock itself: a process suspended past its lease knows
    it is lost as soon as it looks, not once the thread watching the deadline wakes (its sleep
    stops while the machine is suspended; the lease clock does not). Asking changes nothing:
    that thread marks the session lost and runs the callbacks."""
    from picket.client import _LeaseEvent

    class Lease:
        def __init__(self) -> None:
            self.over = False
            self.lost = _LeaseEvent(self.lease_over)

        def lease_over(self) -> bool:
            return self.over

    lease = Lease()
    assert not lease.lost.is_set()
    lease.over = True
    assert lease.lost.is_set(), "the lease clock is read when asked"
    assert not lease.lost.is_set_now(), "asking set nothing"
    collected = Lease()
    collected.over = True
    event = collected.lost
    del collected
    gc.collect()
    assert not event.is_set(), "the event does not keep its session alive, nor fail once it is gone"


def test_a_grant_whose_answer_arrives_after_its_release_is_lost_at_once(server: Server) -> None:
    """An acquire of a lock the session holds is answered with the same grant; when another
    grant object of it was released while that answer was on its way, the new one is lost from
    the start (the watch does not report a holder's own release)."""
    with picket.Client([server.addr]) as client:
        session = client.session(ttl=30)
        first = session.lock("late")
        # The second acquire's answer arrives only after the first grant's release.
        original = client.transport.call

        def answer_after_release(method: str, path: object, *args: object, **kwargs: object) -> object:
            answer = original(method, path, *args, **kwargs)  # type: ignore[arg-type]
            if path == "/v1/locks/acquire":
                first.release()
            return answer

        client.transport.call = answer_after_release  # type: ignore[method-assign]
        second = session.lock("late")
        client.transport.call = original  # type: ignore[method-assign]
        assert second.token == first.token
        assert second.lost.is_set() and second.lost_reason == "grant_ended"
        assert holder(server, "late") is None
        session.close()


def test_each_attempt_of_an_acquire_has_its_own_number_and_a_release_is_sent_again() -> None:
    """The service abandons an acquire attempt it answered ``unavailable`` and refuses that
    attempt's number from then on: the client's retry takes the next number (it sent the same
    one, which the abandon could refuse or release). A release whose answer was lost is sent
    again, and a retry that finds the lock no longer held under its token counts as done."""
    from picket._common import AcquireAttempts
    from picket._transport import Transport

    seen: List[Tuple[str, object]] = []

    def answer(request: httpx.Request) -> httpx.Response:
        named = {"picket-cluster-id": "a" * 32}
        if request.url.path == "/healthz":
            return httpx.Response(200, json={"status": "ok"}, headers=named)
        body = json.loads(request.content)
        seen.append((request.url.path, body.get("attempt", body.get("token"))))
        if request.url.path == "/v1/locks/acquire" and body["attempt"] == 0:
            return httpx.Response(503, json={"code": "unavailable", "message": "electing"}, headers=named)
        if request.url.path == "/v1/locks/acquire":
            return httpx.Response(200, json={"token": 9, "sequencer": "p1.9.x"}, headers=named)
        if len(seen) == 3:
            raise httpx.ReadError("the answer was lost", request=request)
        return httpx.Response(404, json={"code": "not_held", "message": "free"}, headers=named)

    transport = Transport(["node:1"], timeout_s=5)
    transport.http = httpx.Client(transport=httpx.MockTransport(answer), headers=transport.http.headers)
    attempts = AcquireAttempts("x", 5, wait_ms=None)
    granted = transport.call("POST", "/v1/locks/acquire", attempts.next_body, safe=False)
    assert granted["token"] == 9
    assert seen == [("/v1/locks/acquire", 0), ("/v1/locks/acquire", 1)]
    assert attempts.abandon_body() == {"name": "x", "session_id": 5, "request_id": attempts.request_id, "attempt": 1}
    assert attempts.may_have_left_something(picket.LockBusy("busy", code="lock_busy")), "after a retry"

    class Holder:
        id = 5
        client = type("C", (), {"transport": transport})()
        _guard = threading.Lock()
        ended: List[Tuple[str, str, int]] = []

        def _forget(self, grant: picket.Grant) -> None:
            pass

        def _grant_lost(self, name: str, reason: str, token: int) -> None:
            self.ended.append((name, reason, token))

        def _lease_over(self) -> bool:
            return False

    session = Holder()
    picket.Grant(session, "x", 9, "p1.9.x", None).release()  # type: ignore[arg-type]
    assert seen[2:] == [("/v1/locks/release", 9), ("/v1/locks/release", 9)], "sent again"
    assert session.ended == [("x", "grant_ended", 9)], "other grants of it are told"
    transport.close()


def test_a_lock_name_with_dot_segments_is_read_as_itself(server: Server) -> None:
    """``.`` and ``..`` are valid in a lock's name; an HTTP client folds such path segments
    away, so reading ``dots/./x`` read ``dots/x`` (and a recheck took a live grant for ended)."""
    with picket.Client([server.addr]) as client:
        with client.lock("dots/./x", ttl=30) as grant, client.lock("dots/..", ttl=30) as other:
            assert client.lock_info("dots/./x")["holder"]["token"] == grant.token
            assert client.lock_info("dots/..")["holder"]["token"] == other.token
            assert client.lock_info("dots/x")["holder"] is None


def test_only_nothing_at_an_endpoint_counts_as_a_node_gone() -> None:
    """Whether a failed connection says nothing is there (which may let the client follow a
    restore of its cluster): a refusal or an unknown host does; a failed TLS handshake or a
    reset does not (something listens); a connect timeout does over plain HTTP only (over
    HTTPS it may have come during the handshake)."""
    from picket._common import nothing_reached

    def failed(cause: BaseException) -> httpx.ConnectError:
        error = httpx.ConnectError(str(cause))
        error.__cause__ = cause
        return error

    assert nothing_reached("http://a:1", failed(ConnectionRefusedError(111, "refused")))
    assert nothing_reached("https://a:1", failed(socket.gaierror(-2, "Name or service not known")))
    assert not nothing_reached("https://a:1", failed(ssl.SSLCertVerificationError("verify failed")))
    assert not nothing_reached("http://a:1", failed(ConnectionResetError(104, "reset")))
    assert nothing_reached("http://a:1", httpx.ConnectTimeout("timed out"))
    # Over HTTPS only a timeout that says it came before the handshake (the next test).
    assert not nothing_reached("https://a:1", httpx.ConnectTimeout("timed out"))
    group = getattr(builtins, "ExceptionGroup", None)
    if group is not None:
        # anyio (the asyncio client) tries each address of a name and raises them all at once.
        def each(*causes: Exception) -> httpx.ConnectError:
            tried = OSError("All connection attempts failed")
            tried.__cause__ = group("attempts", list(causes))
            return failed(tried)

        refusals = each(ConnectionRefusedError(111, "refused"), ConnectionRefusedError(111, "refused"))
        assert nothing_reached("https://localhost:1", refusals)
        mixed = each(ConnectionRefusedError(111, "refused"), ssl.SSLError("handshake"))
        assert not nothing_reached("https://localhost:1", mixed)


def test_an_https_connect_timeout_is_a_node_gone_only_before_the_handshake() -> None:
    """Over HTTPS a connect timeout counted as something listening, whatever step timed out,
    so a client did not follow a restore past a host that had gone silent (the Rust client
    did). Now one that came while the TCP connection was being made (a listener whose backlog
    is full drops the SYN) counts as nothing there, and one during the TLS handshake (a
    listener that never speaks) does not; in the sync client and the asyncio one alike."""
    import asyncio

    from picket._common import nothing_reached

    full = socket.socket()
    full.bind(("127.0.0.1", 0))
    full.listen(0)
    fillers = []
    for _ in range(4):
        filler = socket.socket()
        filler.setblocking(False)
        try:
            filler.connect(full.getsockname())
        except BlockingIOError:
            pass
        fillers.append(filler)
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)
    timeout = httpx.Timeout(5, connect=0.3)
    cases = [(f"https://127.0.0.1:{full.getsockname()[1]}", True), (f"https://127.0.0.1:{silent.getsockname()[1]}", False)]
    try:
        for url, gone in cases:
            with pytest.raises(httpx.ConnectTimeout) as sync_error:
                httpx.get(url + "/v1/cluster", timeout=timeout, verify=False)
            assert nothing_reached(url, sync_error.value) is gone, url

            async def attempt(url: str) -> BaseException:
                async with httpx.AsyncClient(verify=False, timeout=timeout) as client:
                    try:
                        await client.get(url + "/v1/cluster")
                    except httpx.ConnectTimeout as error:
                        return error
                raise AssertionError("answered")

            assert nothing_reached(url, asyncio.run(attempt(url))) is gone, url
    finally:
        for each in [full, silent, *fillers]:
            each.close()


def test_a_lease_seen_to_run_out_stays_lost_though_a_keepalive_gets_through(server: Server) -> None:
    """``lost.is_set()`` reads the lease clock: once it said the lease ran out (a process that
    was suspended past it, say), a keepalive confirmed after does not bring the session back,
    and the session is marked lost (``silent``) with its grants."""
    with picket.Client([server.addr]) as client:
        session = client.session(ttl=30)
        grant = session.lock("suspended")
        session._confirmed_at -= 60  # as after a suspension of a minute
        assert session.lost.is_set() and grant.lost.is_set(), "seen at once"
        session.keepalive()
        assert session.lost.is_set() and session.lost_reason == "silent"
        assert grant.lost.wait(3) and grant.lost_reason == "silent"
        # Still alive at the service, with its lock: closing ends it there.
        assert holder(server, "suspended") is not None
        session.close()
        assert holder(server, "suspended") is None


def test_an_ended_grant_is_remembered_by_its_first_report_and_the_oldest_lock_is_forgotten() -> None:
    """What a grant object made from an answer still on its way is told: the first report of
    its grant's end (the stream's reason, not a later recheck's ``grant_ended``); and when the
    record is full, the lock whose end is oldest is forgotten, not one just reported."""
    from picket._common import ENDED_GRANTS_KEPT, ended_reason, remember_ended

    ended: dict = {}
    remember_ended(ended, "jobs", 5, "session_revoked")
    remember_ended(ended, "jobs", 5, "grant_ended")
    assert ended_reason(ended, "jobs", 5) == "session_revoked"
    assert ended_reason(ended, "jobs", 6) is None, "a newer grant"
    for lock in range(ENDED_GRANTS_KEPT - 1):
        remember_ended(ended, f"lock-{lock}", 1, "grant_ended")
    remember_ended(ended, "jobs", 7, "abandoned")
    remember_ended(ended, "one-more", 1, "grant_ended")
    assert len(ended) == ENDED_GRANTS_KEPT
    assert ended_reason(ended, "jobs", 7) == "abandoned", "reported last, kept"
    assert ended_reason(ended, "lock-0", 1) is None, "the oldest, forgotten"
