"""The asyncio twin of :mod:`picket.client`: the same sessions and locks, kept alive by tasks.

>>> async with picket.AsyncClient(["127.0.0.1:7687"]) as client:
...     async with client.lock("jobs/report", ttl=10, wait=30) as grant:
...         await write(data, sequencer=grant.sequencer)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import urllib.parse
import weakref
from typing import Any, AsyncIterator, Awaitable, Callable, Dict, List, Optional, Sequence, Set, Tuple, Union

import httpx

from . import _common
from ._common import Sequencer, lease_clock, lock_path, ms, open_path
from ._transport import AsyncTransport, Cert, Json, Verify
from .client import MAX_ACQUIRE_RETRIES, fence_refusal
from .errors import NotHeld, OutcomeUnknown, PicketError, SessionLost, TokenMismatch, UnknownSession

AsyncOnLost = Callable[["AsyncGrant", str], Union[None, Awaitable[None]]]

_log = logging.getLogger("picket")


async def _logged(work: Awaitable[None], name: str) -> None:
    try:
        await work
    except Exception:  # noqa: BLE001
        _log.exception("on_lost callback for %s raised", name)


class _LeaseEvent(asyncio.Event):
    """``lost``: an :class:`asyncio.Event` whose ``is_set()`` is also true once the session's lease
    ran out by this client's clock (:class:`~picket._common.LeaseCheck`), before the task
    that watches the deadline has set it. ``wait()`` is the event's own."""

    def __init__(self, over: Callable[[], bool]) -> None:
        super().__init__()
        self._lease = _common.LeaseCheck(over)

    def is_set(self) -> bool:
        return super().is_set() or self._lease.over()

    def is_set_now(self) -> bool:
        """Whether the event is set, without the check."""
        return super().is_set()


class AsyncGrant:
    """A lock held under ``token``; ``lost`` is an :class:`asyncio.Event` set the moment the
    grant is known to be over."""

    def __init__(
        self, session: "AsyncSession", name: str, token: int, sequencer: str, on_lost: Optional[AsyncOnLost]
    ) -> None:
        self.session = session
        self.name = name
        self.token = token
        self.sequencer = sequencer
        self.lost = _LeaseEvent(session._lease_over)
        self.lost_reason: Optional[str] = None
        self._on_lost = on_lost
        self._released = False

    def _mark_lost(self, reason: str, token: Optional[int] = None) -> None:
        """Marks the grant lost once; ``token`` (from an event) must be this grant's."""
        if (token is not None and token != self.token) or self.lost.is_set_now() or self._released:
            return
        self.lost_reason = reason
        self.lost.set()
        if self._on_lost is None:
            return
        try:
            result = self._on_lost(self, reason)
        except Exception:  # noqa: BLE001 - a callback's failure must not stop loss detection
            _log.exception("on_lost callback for %s raised", self.name)
            return
        if asyncio.iscoroutine(result):
            self.session._spawn(_logged(result, self.name))

    async def release(self) -> None:
        """Releases the grant; releasing a grant that was already lost does nothing. Another
        grant of the same lock in this session (an acquire answered ``already_held``) is the
        same grant: it is lost with this one (``grant_ended``)."""
        if self._released:
            return
        self._released = True
        self.session._forget(self)
        if self.lost.is_set_now():
            return
        body = {"name": self.name, "session_id": self.session.id, "token": self.token}
        try:
            # Safe to send again: a retry whose first attempt did release finds the lock free
            # or held under another token, which is what this release leaves behind anyway.
            await self.session.client.transport.call("POST", "/v1/locks/release", body, safe=True)
        except (NotHeld, TokenMismatch, UnknownSession):
            pass
        self.session._grant_lost(self.name, _common.GRANT_ENDED, self.token)

    async def __aenter__(self) -> "AsyncGrant":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.release()

    def __repr__(self) -> str:
        return f"AsyncGrant({self.name!r}, token={self.token}, lost={self.lost.is_set()})"


class AsyncSession:
    """A lease kept alive every TTL/3 by a task; ``lost`` is set at once when the service ends
    the session and, by this client's clock, after the TTL less 3 % without a confirmed
    keepalive."""

    def __init__(self, client: "AsyncClient", session_id: int, ttl_s: float, opened_at: float) -> None:
        self.client = client
        self.id = session_id
        self.ttl = ttl_s
        self.lost = _LeaseEvent(self._lease_over)
        self.lost_reason: Optional[str] = None
        #: The grants held, by lock: two when an acquire of a lock the session holds was
        #: answered ``already_held`` (the same grant, told to both).
        self._grants: Dict[str, List[AsyncGrant]] = {}
        #: The newest grant of each lock that ended while no grant object held it, for one
        #: made from an answer still on its way (``_common.remember_ended``).
        self._ended_grants: Dict[str, Tuple[int, str]] = {}
        #: As in the blocking client: once seen to run out, the lease stays so.
        self._lease_ran_out = False
        #: Whether a recheck task runs, and whether another was asked for meanwhile.
        self._rechecking = False
        self._recheck_again = False
        self._closing = asyncio.Event()
        # The lease counts from when the request that opened it was sent, not from its answer.
        self._confirmed_at = opened_at
        self._watching = asyncio.Event()
        self._tasks: List["asyncio.Task[Any]"] = []
        # The tasks hold the session weakly, so that a session nobody holds any more (never
        # closed) is collected and its finalizer ends it (``_end_forgotten``).
        this = weakref.ref(self)
        self._tasks.append(asyncio.ensure_future(_keep_alive(this)))
        self._tasks.append(asyncio.ensure_future(_watch(this)))
        self._finalizer = weakref.finalize(
            self,
            _end_forgotten,
            asyncio.get_running_loop(),
            self._tasks,
            client.transport,
            session_id,
            (self._closing, self.lost),
        )
        # At interpreter exit a session left open expires by its TTL, as before.
        self._finalizer.atexit = False

    async def _started(self) -> "AsyncSession":
        """Waits briefly for the watch stream: a loss is heard at once only once it is open."""
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._watching.wait(), min(2.0, self.ttl / _common.KEEPALIVE_DIVISOR))
        return self

    def _spawn(self, work: Awaitable[Any]) -> None:
        # Forgotten once done: a long-lived session whose grants' ``on_lost`` callbacks ran
        # kept a task for each (found in review).
        task = asyncio.ensure_future(work)
        self._tasks.append(task)
        # The list, not the session: a bound method here held the session while it ran.
        tasks = self._tasks

        def forget(done: "asyncio.Future[Any]") -> None:
            with contextlib.suppress(ValueError):
                tasks.remove(done)  # type: ignore[arg-type]

        task.add_done_callback(forget)

    async def lock(
        self,
        name: str,
        *,
        wait: Optional[float] = None,
        on_lost: Optional[AsyncOnLost] = None,
        fence: Sequence[str] = (),
    ) -> AsyncGrant:
        """Acquires ``name``, waiting at most ``wait`` seconds (``None``: until granted), and
        registers the grant with each ``fence`` URL before returning."""
        grant = await self._acquire(name, ms(wait), on_lost)
        for url in fence:
            try:
                await register(self.client, url, grant)
            except BaseException:
                await grant.release()
                raise
        return grant

    async def try_lock(
        self, name: str, *, on_lost: Optional[AsyncOnLost] = None, fence: Sequence[str] = ()
    ) -> AsyncGrant:
        """Acquires ``name`` only if it is free now; raises :class:`~picket.errors.LockBusy`."""
        return await self.lock(name, wait=0, on_lost=on_lost, fence=fence)

    async def _acquire(self, name: str, wait_ms: Optional[int], on_lost: Optional[AsyncOnLost]) -> AsyncGrant:
        if self.lost.is_set():
            raise SessionLost(f"session {self.id} is lost ({self.lost_reason}): open a new session", code="session_lost")
        attempts = _common.AcquireAttempts(name, self.id, wait_ms)
        budget = self.client.timeout + (wait_ms / 1000 if wait_ms is not None else 365 * 86400.0)
        for retry in range(MAX_ACQUIRE_RETRIES + 1):
            try:
                answer = await self.client.transport.call(
                    "POST", "/v1/locks/acquire", attempts.next_body, safe=False, timeout_s=budget
                )
            except OutcomeUnknown:
                # The same request id under the next attempt: the service applies it once.
                if retry == MAX_ACQUIRE_RETRIES:
                    self._abandon(attempts)
                    raise
                continue
            except PicketError as error:
                if attempts.may_have_left_something(error):
                    self._abandon(attempts)
                raise
            except BaseException:
                # The caller gave up (cancelled) while this attempt's answer may be on its way.
                self._abandon(attempts)
                raise
            grant = AsyncGrant(self, name, int(answer["token"]), str(answer["sequencer"]), on_lost)
            self._grants.setdefault(name, []).append(grant)
            ended = _common.ended_reason(self._ended_grants, name, grant.token)
            if self.lost.is_set():
                grant._mark_lost(self.lost_reason or "session_lost")
            elif ended is not None:
                # Released by another grant of it, or ended otherwise, while this answer was on
                # its way.
                grant._mark_lost(ended)
            return grant
        raise AssertionError("unreachable")

    def _abandon(self, attempts: _common.AcquireAttempts) -> None:
        """Undoes, in the background, what an acquire given up on may have done: its wait, or
        a grant nobody here knows of (which would otherwise stay with the session while it
        lives). Every attempt made is covered, and one arriving later is refused."""
        body = attempts.abandon_body()
        if body is not None:
            self.client._abandons.add(body)

    def _forget(self, grant: AsyncGrant) -> None:
        grants = self._grants.get(grant.name, [])
        if grant in grants:
            grants.remove(grant)
        if not grants:
            self._grants.pop(grant.name, None)

    def _held(self) -> List[AsyncGrant]:
        return [grant for grants in self._grants.values() for grant in grants]

    def _mark_lost(self, reason: str) -> None:
        if self.lost.is_set_now():
            return
        self.lost_reason = reason
        self.lost.set()
        for grant in self._held():
            grant._mark_lost(reason)

    def _grant_lost(self, name: str, reason: str, token: Optional[int]) -> None:
        grants = [grant for grant in self._grants.get(name, ()) if token is None or grant.token == token]
        if token is not None:
            _common.remember_ended(self._ended_grants, name, token, reason)
        for grant in grants:
            grant._mark_lost(reason, token)

    def _ended(self) -> bool:
        return self._closing.is_set() or self.lost.is_set_now()

    def _lease_over(self) -> bool:
        """As :meth:`picket.client.Session._lease_over`."""
        if not self._lease_ran_out:
            self._lease_ran_out = lease_clock() >= self._lease_deadline()
        return self._lease_ran_out

    def _confirmed(self, sent_at: float) -> None:
        """As :meth:`picket.client.Session._confirmed`."""
        if self._lease_over():
            self._mark_lost("silent")
        else:
            self._confirmed_at = max(self._confirmed_at, sent_at)

    def _lease_deadline(self) -> float:
        """When the lease is over by this client's clock, as confirmed so far."""
        return self._confirmed_at + self.ttl * (1 - _common.LEASE_MARGIN)

    async def _send_keepalive(self) -> Optional[float]:
        """Sends one keepalive: when it was sent, or ``None`` when the session is over."""
        period = self.ttl / _common.KEEPALIVE_DIVISOR
        sent_at = lease_clock()
        # Each attempt carries a reading taken as it is sent; the lease counts from before.
        path = lambda: _common.keepalive_path(self.id, lease_clock())  # noqa: E731
        # A keepalive in flight must not outlast the lease: the loss is noticed on time.
        remaining = self._lease_deadline() - sent_at
        if remaining <= 0:
            self._mark_lost("silent")
            return None
        budget = min(period, remaining)
        try:
            await asyncio.wait_for(self.client.transport.call("POST", path, {}, safe=True, timeout_s=budget), budget)
            self._confirmed(sent_at)
        except UnknownSession:
            self._mark_lost("expired")
            return None
        except Exception:  # noqa: BLE001 - the deadline decides; keep trying
            pass
        return sent_at

    def _held_tokens(self) -> Set[Tuple[str, int]]:
        return {(grant.name, grant.token) for grant in self._held()}

    async def _probe(self, held: Optional[Set[Tuple[str, int]]] = None) -> None:
        """As :meth:`picket.client.Session._probe`: whether the session still lives, and
        whether each grant ``held`` when the stream opened is still held under its token."""
        held = self._held_tokens() if held is None else held
        try:
            await self.keepalive()
        except UnknownSession:
            self._mark_lost("ended")
            return
        except PicketError:
            return
        for name, token in sorted(held):
            try:
                info = await self.client.lock_info(name)
            except PicketError:
                continue
            if not _common.still_held(info, self.id, token):
                self._grant_lost(name, _common.GRANT_ENDED, token)

    def _recheck_aside(self, held: Set[Tuple[str, int]]) -> None:
        """As :meth:`picket.client.Session._recheck_aside`, in a task."""
        if self._rechecking:
            self._recheck_again = True
            return
        self._rechecking = True

        async def recheck() -> None:
            checking = held
            try:
                while True:
                    try:
                        await self._probe(checking)
                    except Exception:  # noqa: BLE001 - a recheck that failed must not stop the next
                        _log.debug("rechecking session %s failed", self.id, exc_info=True)
                    if not self._recheck_again:
                        return
                    self._recheck_again = False
                    checking = self._held_tokens()
            finally:
                self._rechecking = False

        self._spawn(recheck())

    def _on_event(self, event: Dict[str, Any]) -> None:
        if event.get("kind") == "resync":
            self._recheck_aside(self._held_tokens())
            return
        reason = _common.loss_of(event)
        if reason is None:
            return
        if event.get("kind") == "session_ended":
            self._mark_lost(reason)
        else:
            token = event.get("token")
            self._grant_lost(str(event.get("name")), reason, int(token) if token is not None else None)

    async def keepalive(self) -> None:
        """Sends a keepalive now (the background task sends them anyway)."""
        sent_at = lease_clock()
        await self.client.transport.call(
            "POST", lambda: _common.keepalive_path(self.id, lease_clock()), {}, safe=True
        )
        self._confirmed(sent_at)

    async def close(self) -> None:
        """Releases what the session holds and ends it."""
        if self._closing.is_set():
            return
        self._finalizer.detach()
        self._closing.set()
        for grant in self._held():
            grant._released = True
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if not self.lost.is_set_now():
            with contextlib.suppress(UnknownSession):
                await self.client.transport.call("DELETE", f"/v1/sessions/{self.id}", safe=True)
            self._mark_lost("closed")
        elif self.lost_reason == "silent":
            # Lost by this client's clock alone: it may still live at the service, with its
            # locks. Ended there too, at best (it expires by its TTL anyway).
            with contextlib.suppress(PicketError):
                await self.client.transport.call("DELETE", f"/v1/sessions/{self.id}", safe=True)

    async def __aenter__(self) -> "AsyncSession":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class _AsyncAbandonSender:
    """Sends a client's abandons (``_common.AbandonQueue``) one at a time from a task of its
    own, started when one is queued and ended when none is left, or soon after the client
    closes or is collected."""

    def __init__(self, transport: AsyncTransport) -> None:
        self._transport = transport
        self._queue = _common.AbandonQueue()
        # Made with each task, in its event loop (an Event is bound to one loop).
        self._wake: Optional[asyncio.Event] = None
        self._task: Optional["asyncio.Task[None]"] = None
        self._closed = False
        # Set when the client was collected without ``close`` (see the blocking client's
        # ``_AbandonSender``): the task ends at its next turn.
        self._orphaned = False

    def orphan(self) -> None:
        """The client is gone: the task ends at its next turn (within a retry pause, or once a
        call on its way ends). Safe from a finalizer, on any thread: it only sets a flag."""
        self._orphaned = True

    def add(self, body: Json) -> None:
        if self._closed:
            return
        self._queue.add(body, time.monotonic())
        loop = asyncio.get_running_loop()
        if self._wake is None or self._task is None or self._task.done() or self._task.get_loop() is not loop:
            # A task, with its own Event, for this loop; a task on a loop that was closed never
            # ends, so another loop's abandons get one of their own.
            self._wake = asyncio.Event()
            self._task = asyncio.ensure_future(self._run(self._wake))
        self._wake.set()

    def close(self) -> None:
        self._closed = True
        self._queue.clear()
        if self._task is not None:
            self._task.cancel()

    async def _run(self, wake: asyncio.Event) -> None:
        while not (self._closed or self._orphaned):
            taken = self._queue.take(time.monotonic())
            if taken is None:
                return
            if not isinstance(taken, _common.Abandon):
                wake.clear()
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(wake.wait(), taken)
                continue
            error: Optional[BaseException] = None
            try:
                await self._transport.call("POST", "/v1/locks/abandon", taken.body, safe=True)
            except Exception as failure:  # noqa: BLE001 - settled below, whatever it was
                error = failure
            if not self._closed:
                self._queue.settle(taken, error, time.monotonic())


async def _keep_alive(this: "weakref.ref[AsyncSession]") -> None:
    """Sends a keepalive every TTL/3 and marks the session lost once its lease is over by this
    client's clock, until it ends or is collected. Holds the session only while it sends."""
    while True:
        session = this()
        if session is None or session._ended():
            return
        closing = session._closing
        period = session.ttl / _common.KEEPALIVE_DIVISOR
        sent_at = await session._send_keepalive()
        deadline = session._lease_deadline()
        del session
        if sent_at is None:
            return
        while not closing.is_set():
            now = lease_clock()
            if now >= deadline:
                session = this()
                if session is not None:
                    session._mark_lost("silent")
                return
            # Not longer than a moment at once: a sleep stops while the machine is suspended,
            # and the lease does not.
            pause = min(deadline - now, max(0.0, sent_at + period - now), _common.LEASE_CHECK_MAX_S)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(closing.wait(), pause)
            if closing.is_set():
                return
            if lease_clock() >= sent_at + period:
                break


async def _watch(this: "weakref.ref[AsyncSession]") -> None:
    """Follows the session's losses (``losses_only``). Holds the session only while it handles
    what arrived, never while it waits."""
    session = this()
    if session is None:
        return
    transport, closing, lost, watching = session.client.transport, session._closing, session.lost, session._watching
    query = {"session_id": str(session.id), "losses_only": "true"}
    del session
    timeout = httpx.Timeout(10.0, read=_common.WATCH_READ_TIMEOUT_S)
    async with httpx.AsyncClient(timeout=timeout, verify=transport.tls, headers=transport.http.headers) as http:
        while not closing.is_set() and not lost.is_set():
            try:
                url = transport.endpoints.url() + "/v1/watch"
                cluster = transport.cluster.stream_headers()
                async with http.stream("GET", url, params=query, headers=cluster) as response:
                    if response.status_code != 200:
                        transport.endpoints.next()
                        await asyncio.sleep(0.5)
                        continue
                    # Whatever ended while the stream was not open is not replayed: ask, of the
                    # grants held now (later ones are the stream's).
                    session = this()
                    if session is None:
                        return
                    held = session._held_tokens()
                    watching.set()
                    session._recheck_aside(held)
                    del session
                    sse = _common.SseEvents()
                    async for text in response.aiter_text():
                        if not _common.hand_over(this, sse, text):
                            return
            except Exception:  # noqa: BLE001 - reconnect, whatever broke the stream
                transport.endpoints.next()
                await asyncio.sleep(0.5)


#: Ends of sessions collected without ``close``, held until they are done.
_ENDING: Set["asyncio.Future[None]"] = set()


def _end_forgotten(
    loop: asyncio.AbstractEventLoop,
    tasks: List["asyncio.Task[Any]"],
    transport: AsyncTransport,
    session_id: int,
    events: Tuple[asyncio.Event, asyncio.Event],
) -> None:
    """Ends a session collected without ``close``: stops its tasks, marks it lost (``events``
    are its ``_closing`` and ``lost``) and asks the service to end it unless it was lost
    already, on its event loop (a finalizer runs wherever the collector does, and
    ``call_soon_threadsafe`` takes no lock the loop's thread may hold). Best effort: should
    the request fail, or the loop be gone, the session expires by its TTL."""
    closing, lost = events

    async def end() -> None:
        with contextlib.suppress(Exception):
            await transport.call("DELETE", f"/v1/sessions/{session_id}", safe=True)

    def stop() -> None:
        closing.set()
        for task in tasks:
            task.cancel()
        if lost.is_set():
            return
        lost.set()
        ending = asyncio.ensure_future(end())
        _ENDING.add(ending)
        ending.add_done_callback(_ENDING.discard)

    # A loop already closed has no tasks left to stop, nor a way to send the end.
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(stop)


class AsyncClient:
    """The asyncio Picket client; the same arguments as :class:`picket.Client`."""

    def __init__(
        self,
        endpoints: Sequence[str] = ("127.0.0.1:7687",),
        *,
        token: Optional[str] = None,
        timeout: float = 10.0,
        verify: Verify = True,
        cert: Cert = None,
        cluster_id: Optional[str] = None,
    ) -> None:
        self.timeout = timeout
        self.transport = AsyncTransport(
            endpoints, token=token, timeout_s=timeout, verify=verify, cert=cert, cluster_id=cluster_id
        )
        self._abandons = _AsyncAbandonSender(self.transport)
        # A client dropped without ``close`` does not keep its abandons' task trying.
        weakref.finalize(self, self._abandons.orphan).atexit = False

    async def session(self, ttl: float = 10.0, *, lock_delay: float = 0.0) -> AsyncSession:
        """Opens a session that lives ``ttl`` seconds past its last keepalive."""
        body = {"ttl_ms": ms(ttl), "lock_delay_ms": ms(lock_delay)}
        sent_at = lease_clock()
        opened = await self.transport.call("POST", lambda: open_path(lease_clock()), body, safe=False)
        session = AsyncSession(self, int(opened["session_id"]), int(opened["ttl_ms"]) / 1000, sent_at)
        return await session._started()

    @contextlib.asynccontextmanager
    async def lock(
        self,
        name: str,
        *,
        ttl: float = 10.0,
        wait: Optional[float] = None,
        lock_delay: float = 0.0,
        on_lost: Optional[AsyncOnLost] = None,
        fence: Sequence[str] = (),
    ) -> AsyncIterator[AsyncGrant]:
        """A session of its own and a grant of ``name`` in it, both ended on exit."""
        async with await self.session(ttl, lock_delay=lock_delay) as session:
            async with await session.lock(name, wait=wait, on_lost=on_lost, fence=fence) as grant:
                yield grant

    @contextlib.asynccontextmanager
    async def try_lock(
        self, name: str, *, ttl: float = 10.0, on_lost: Optional[AsyncOnLost] = None
    ) -> AsyncIterator[AsyncGrant]:
        """Like :meth:`lock`, without waiting: raises :class:`~picket.errors.LockBusy`."""
        async with self.lock(name, ttl=ttl, wait=0, on_lost=on_lost) as grant:
            yield grant

    async def lock_info(self, name: str) -> Json:
        return await self.transport.call("GET", lock_path(name), safe=True)

    async def check(self, sequencer: str) -> Json:
        path = "/v1/check?sequencer=" + urllib.parse.quote(sequencer, safe="")
        return await self.transport.call("GET", path, safe=True)

    async def revoke(self, session_id: int) -> None:
        await self.transport.call("POST", f"/v1/sessions/{session_id}/revoke", {}, safe=True)

    @property
    def cluster_id(self) -> Optional[str]:
        """The id of the cluster this client keeps to; ``None`` until it has reached a named one."""
        return self.transport.cluster.id

    async def close(self) -> None:
        self._abandons.close()
        await self.transport.close()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


async def register(client: AsyncClient, url: str, grant: AsyncGrant) -> None:
    """Fence on acquire over HTTP, as :func:`picket.client.register`."""
    # A client of its own: the Picket client's default headers carry its bearer token.
    async with httpx.AsyncClient(timeout=client.timeout) as http:
        response = await http.post(url, headers={"Picket-Sequencer": grant.sequencer})
    if not response.is_success:
        raise fence_refusal(response, Sequencer.parse(grant.sequencer))
