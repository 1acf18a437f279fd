"""The asyncio twin against a real ``picket serve``: each behaviour of the blocking client."""

from __future__ import annotations

import asyncio
import gc
import time
from typing import List, Tuple

import httpx
import pytest

import picket
from conftest import AnswerSwallowingProxy, Server, free_port, wait_until

pytestmark = pytest.mark.anyio


async def test_lock_and_unlock(server: Server) -> None:
    async with picket.AsyncClient([server.addr]) as client:
        async with client.lock("jobs/report", ttl=5, wait=5) as grant:
            assert grant.sequencer == f"p1.{grant.token}.jobs/report"
            assert (await client.check(grant.sequencer))["status"] == "current"
        assert (await client.lock_info("jobs/report"))["holder"] is None
        with pytest.raises(picket.LockBusy):
            async with client.lock("held", ttl=5):
                async with client.try_lock("held", ttl=5):
                    pass


async def test_a_session_nobody_holds_any_more_is_ended_and_its_locks_freed(server: Server) -> None:
    """As the blocking client's: a session collected without ``close`` is ended, and its lock
    freed, long before its TTL; its tasks end."""
    async with picket.AsyncClient([server.addr]) as client:
        session = await client.session(ttl=60)
        grant = await session.lock("forgotten")
        tasks = list(session._tasks)
        assert (await client.lock_info("forgotten"))["holder"] is not None
        del session, grant
        for _ in range(500):
            # Collected again on each look: a task may have held the session for a moment.
            gc.collect()
            if (await client.lock_info("forgotten"))["holder"] is None and all(task.done() for task in tasks):
                break
            await asyncio.sleep(0.02)
        assert (await client.lock_info("forgotten"))["holder"] is None
        assert all(task.done() for task in tasks)
        # A session still held is kept alive past its TTL: its tasks still renew it.
        kept = await client.session(ttl=2)
        async with await kept.lock("kept"):
            gc.collect()
            await asyncio.sleep(3)
            assert not kept.lost.is_set()
            assert (await client.lock_info("kept"))["holder"] is not None
        await kept.close()


async def test_an_abandon_outlasts_an_outage_longer_than_the_clients_timeout(server: Server) -> None:
    """As the blocking client's: the abandon of an acquire the node granted, given up on while
    the client was cut off for longer than its timeout, is tried again and lands once the link
    is back, freeing the lock long before the session's 60 s TTL."""
    proxy = AnswerSwallowingProxy(server.addr)
    try:
        async with picket.AsyncClient([server.addr]) as direct, picket.AsyncClient(
            [proxy.addr], timeout=0.3
        ) as client:

            async def holder() -> object:
                return (await direct.lock_info("outlasted"))["holder"]

            for attempt in range(5):
                try:
                    session = await client.session(ttl=60)
                    break
                except picket.OutcomeUnknown:
                    if attempt == 4:
                        raise
            proxy.swallow.set()
            trying = asyncio.ensure_future(session.try_lock("outlasted"))
            for _ in range(1000):
                if await holder() is not None:
                    break
                await asyncio.sleep(0.01)
            assert await holder() is not None, "the acquire never reached the node"
            proxy.cut.set()
            with pytest.raises(picket.OutcomeUnknown):
                await trying
            # The outage: five times the client's timeout, so the abandon's first round fails.
            await asyncio.sleep(1.5)
            assert await holder() is not None, "nothing reached the node during the outage"
            proxy.cut.clear()
            proxy.swallow.clear()
            for _ in range(1000):
                if await holder() is None:
                    break
                await asyncio.sleep(0.01)
            assert await holder() is None, "the given-up grant is still held"
    finally:
        proxy.close()


async def test_the_abandons_task_of_a_client_dropped_without_close_ends() -> None:
    """A client dropped without ``close`` while the cluster cannot be reached: its abandons'
    task used to keep trying, and its connections, for up to an hour."""
    dropped = picket.AsyncClient([f"127.0.0.1:{free_port()}"], timeout=0.2)
    sender = dropped._abandons
    sender.add({"name": "x", "session_id": 1, "request_id": 1, "attempt": 0})
    task = sender._task
    assert task is not None and not task.done()
    del dropped
    gc.collect()
    done, _ = await asyncio.wait({task}, timeout=10)
    assert task in done, "timed out after 10 s waiting for the dropped client's abandons task to end"


async def test_waiters_are_granted_in_fifo_order_with_growing_tokens(server: Server) -> None:
    async with picket.AsyncClient([server.addr]) as client:
        first = await client.session(ttl=10)
        held = await first.lock("queue")
        order: List[Tuple[str, int]] = []

        async def wait_for(name: str) -> None:
            async with await client.session(ttl=10) as session:
                async with await session.lock("queue", wait=20) as grant:
                    order.append((name, grant.token))

        waiters = []
        for position, name in enumerate(["second", "third"]):
            waiters.append(asyncio.ensure_future(wait_for(name)))
            for _ in range(500):
                if len((await client.lock_info("queue"))["waiters"]) == position + 1:
                    break
                await asyncio.sleep(0.02)
        await held.release()
        await asyncio.wait_for(asyncio.gather(*waiters), 20)
        await first.close()
        assert [name for name, _ in order] == ["second", "third"]
        assert held.token < order[0][1] < order[1][1]


async def test_lost_is_set_at_once_when_the_server_revokes_the_session(server: Server) -> None:
    losses: List[str] = []
    async with picket.AsyncClient([server.addr]) as client:
        session = await client.session(ttl=30)
        grant = await session.lock("revoked", on_lost=lambda grant, reason: losses.append(reason))
        await client.revoke(session.id)
        await asyncio.wait_for(session.lost.wait(), 3)
        assert grant.lost.is_set()
        assert losses == ["session_revoked"], losses
        with pytest.raises(picket.SessionLost):
            await session.lock("again")
        await session.close()


async def test_a_sessions_finished_callbacks_leave_no_task_behind(server: Server) -> None:
    """Found in review (2026-12-06): each coroutine ``on_lost`` ran in a task the session kept
    for as long as it lived."""
    ran: List[str] = []

    async def on_lost(grant: picket.AsyncGrant, reason: str) -> None:
        ran.append(grant.name)

    async with picket.AsyncClient([server.addr]) as client:
        session = await client.session(ttl=30)
        tasks_at_start = len(session._tasks)
        for n in range(5):
            await session.lock(f"callbacks/{n}", on_lost=on_lost)
        await client.revoke(session.id)
        await asyncio.wait_for(session.lost.wait(), 5)
        deadline = time.monotonic() + 5
        while len(ran) < 5 or len(session._tasks) > tasks_at_start:
            assert time.monotonic() < deadline, (ran, session._tasks)
            await asyncio.sleep(0.01)
        await session.close()


async def test_lost_is_set_within_the_ttl_when_the_server_stops(server: Server) -> None:
    async with picket.AsyncClient([server.addr], timeout=1) as client:
        session = await client.session(ttl=4)
        # When the client judged the lease lost, read where it decides (the callback), not
        # when this test's thread got round to looking: a loaded machine may wake it late.
        # The session's `lost` is set before its grants' callbacks run: wait for the callback.
        lost_at: List[float] = []
        called = asyncio.Event()

        def on_lost(grant: picket.AsyncGrant, reason: str) -> None:
            lost_at.append(time.monotonic())
            called.set()

        grant = await session.lock("silent", on_lost=on_lost)
        # The lease counts from the send of the last confirmed keepalive: TTL less 3 % after it.
        sent_at = time.monotonic()
        await session.keepalive()
        server.stop()
        await asyncio.wait_for(called.wait(), 6)
        lost_after = lost_at[0] - sent_at
        assert 3.0 < lost_after < 4.0, f"the client counted on its lease for {lost_after:.2f} s (TTL 4 s)"
        assert session.lost_reason == "silent"
        assert grant.lost.is_set()
        await session.close()


async def test_fence_on_acquire_over_http(server: Server, kv: "object") -> None:
    store = f"http://{kv.addr}"  # type: ignore[attr-defined]
    async with picket.AsyncClient([server.addr]) as client:
        async with client.lock("res", ttl=5) as old:
            pass
        async with client.lock("res", ttl=5, fence=[f"{store}/fence/res/"]) as grant:
            async with httpx.AsyncClient() as http:
                stale = await http.put(f"{store}/kv/res/x", content=b"old", headers=picket.fence.headers(old))
                assert stale.status_code == 409
                assert stale.json()["highest_token"] == grant.token


async def test_each_attempt_of_an_open_and_a_keepalive_carries_its_own_clock_reading(
    server: Server,
) -> None:
    """The async client, as the blocking one: an open whose first endpoint refuses
    connections, and a keepalive whose first attempt fails before it is sent, are each sent
    again with a later reading of the lease clock than their first attempt's (issue 21)."""
    refused = f"127.0.0.1:{free_port()}"
    urls: List[str] = []
    failed: List[str] = []
    armed = False

    async def record(request: httpx.Request) -> None:
        url = str(request.url)
        urls.append(url)
        if armed and "/keepalive?" in url and not failed:
            failed.append(url)
            raise httpx.ConnectError("refused by the test", request=request)

    def readings(part: str, urls: List[str]) -> List[float]:
        return [float(url.rsplit("clock_ms=", 1)[1]) for url in urls if part in url]

    # Given its cluster, the client asks no node which cluster it is of before the open, so
    # the open itself meets the refused endpoint first.
    wait_until("the cluster to be named", 20, lambda: named(server))
    cluster = httpx.get(f"http://{server.addr}/v1/cluster").json()["cluster_id"]
    async with picket.AsyncClient([refused, server.addr], timeout=10, cluster_id=cluster) as client:
        client.transport.http.event_hooks["request"].append(record)
        # The TTL keeps the background task's next keepalive 20 s away once its first is sent.
        session = await client.session(ttl=60.0)
        deadline = time.monotonic() + 10
        while not readings("/keepalive?", urls):
            assert time.monotonic() < deadline, "the background task sent no keepalive"
            await asyncio.sleep(0.02)
        sent_before = len(urls)
        armed = True
        await session.keepalive()
        await session.close()
    opens = readings("/v1/sessions?", urls)
    assert len(opens) == 2 and opens[1] > opens[0], urls
    keepalives = readings("/keepalive?", urls[sent_before:])
    # The failed attempt moves the client on to the refused endpoint, then back.
    assert len(failed) == 1 and len(keepalives) >= 2, urls
    assert keepalives == sorted(set(keepalives)), keepalives


def named(server: Server) -> bool:
    return bool(httpx.get(f"http://{server.addr}/v1/cluster").json()["cluster_id"])


async def test_a_client_never_sends_a_call_to_a_node_of_another_cluster(tmp_path: "object") -> None:
    """As the blocking client's test: once the first cluster reached is down, the only node left
    belongs to another cluster, which refuses a release naming its own session and grant."""
    import pathlib

    root = pathlib.Path(str(tmp_path))
    a, b = Server(root / "a"), Server(root / "b")
    try:
        for node in (a, b):
            wait_until("the cluster to be named", 20, lambda: named(node))
        opened = httpx.post(f"http://{b.addr}/v1/sessions", json={"ttl_ms": 60_000}).json()
        body = {"name": "shared", "session_id": opened["session_id"], "wait_ms": 0}
        token = httpx.post(f"http://{b.addr}/v1/locks/acquire", json=body).json()["token"]
        async with picket.AsyncClient([a.addr, b.addr], timeout=3) as alice:
            await alice.lock_info("mine")
            a_id = alice.cluster_id
            assert a_id is not None and a_id == httpx.get(f"http://{a.addr}/v1/cluster").json()["cluster_id"]
            a.stop()
            release = {"name": "shared", "session_id": opened["session_id"], "token": token}
            with pytest.raises(picket.OtherCluster) as refused:
                await alice.transport.call("POST", "/v1/locks/release", release, safe=True)
            assert f"not to cluster {a_id}" in str(refused.value)
        holder = httpx.get(f"http://{b.addr}/v1/locks/shared").json()["holder"]
        assert holder["token"] == token, "B's grant stands"
    finally:
        a.stop()
        b.stop()


async def test_two_grants_of_one_lock_in_a_session_both_hear_of_its_end(server: Server) -> None:
    """As in the blocking client: both grant objects of one grant hear of its end."""
    async with picket.AsyncClient([server.addr]) as client:
        session = await client.session(ttl=30)
        first = await session.lock("twice")
        second = await session.lock("twice")
        assert first.token == second.token
        await first.release()
        assert second.lost.is_set() and second.lost_reason == "grant_ended"
        assert (await client.lock_info("twice"))["holder"] is None

        third = await session.lock("twice")
        fourth = await session.lock("twice")
        await client.revoke(session.id)
        await asyncio.wait_for(asyncio.gather(third.lost.wait(), fourth.lost.wait()), 3)
        await session.close()


async def test_a_grant_ended_unseen_is_found_when_the_watch_opens_again_or_on_resync(server: Server) -> None:
    """As in the blocking client: what the watch stream missed is asked for."""
    async with picket.AsyncClient([server.addr]) as client:
        session = await client.session(ttl=30)
        kept, ended = await session.lock("recheck/kept"), await session.lock("recheck/ended")
        release = {"name": "recheck/ended", "session_id": session.id, "token": ended.token}
        async with httpx.AsyncClient() as http:
            assert (await http.post(f"http://{server.addr}/v1/locks/release", json=release)).status_code == 200
            session._on_event({"kind": "resync"})
            await asyncio.wait_for(ended.lost.wait(), 3)
            assert ended.lost_reason == "grant_ended" and not kept.lost.is_set()

            again = await session.lock("recheck/ended")
            release["token"] = again.token
            assert (await http.post(f"http://{server.addr}/v1/locks/release", json=release)).status_code == 200
        await session._probe()
        await asyncio.wait_for(again.lost.wait(), 3)
        assert again.lost_reason == "grant_ended"
        assert not kept.lost.is_set() and not session.lost.is_set()
        await session.close()
