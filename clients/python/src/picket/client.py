"""The blocking client: sessions kept alive by a background thread, locks as context managers.

>>> client = picket.Client(["127.0.0.1:7687"])
>>> with client.lock("jobs/report", ttl=10, wait=30) as grant:
...     write(data, sequencer=grant.sequencer)   # every write carries the sequencer
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
import urllib.parse
import weakref
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Set, Tuple

import httpx

from . import _common
from ._common import Sequencer, lease_clock, lock_path, ms, open_path
from ._transport import Cert, Json, Transport, Verify
from .errors import (
    FenceRefused,
    NotHeld,
    OutcomeUnknown,
    PicketError,
    SessionLost,
    TokenMismatch,
    UnknownSession,
)

OnLost = Callable[["Grant", str], None]

_log = logging.getLogger("picket")

#: Most retries of one acquire whose answer was lost (each under the same request id).
MAX_ACQUIRE_RETRIES = 5


class _LeaseEvent(threading.Event):
    """``lost``: an :class:`threading.Event` whose ``is_set()`` is also true once the session's lease
    ran out by this client's clock (:class:`~picket._common.LeaseCheck`), before the thread
    that watches the deadline has set it. ``wait()`` is the event's own."""

    def __init__(self, over: Callable[[], bool]) -> None:
        super().__init__()
        self._lease = _common.LeaseCheck(over)

    def is_set(self) -> bool:
        return super().is_set() or self._lease.over()

    def is_set_now(self) -> bool:
        """Whether the event is set, without the check."""
        return super().is_set()


class Grant:
    """A lock held under ``token``. ``sequencer`` goes with every write to a fenced resource;
    ``lost`` is set the moment the grant is known to be over (released by the service, the
    session revoked or expired, or silent past its TTL by this client's clock)."""

    def __init__(self, session: "Session", name: str, token: int, sequencer: str, on_lost: Optional[OnLost]) -> None:
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
        if token is not None and token != self.token:
            return
        with self.session._guard:
            if self.lost.is_set_now() or self._released:
                return
            self.lost_reason = reason
            self.lost.set()
        if self._on_lost is not None:
            try:
                self._on_lost(self, reason)
            except Exception:  # noqa: BLE001 - a callback's failure must not stop loss detection
                _log.exception("on_lost callback for %s raised", self.name)

    def release(self) -> None:
        """Releases the grant; the next waiter gets a greater token. Releasing a grant that
        was already lost does nothing. Another grant of the same lock in this session (an
        acquire answered ``already_held``) is the same grant: it is lost with this one
        (``grant_ended``), since the watch does not report a holder's own release."""
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
            self.session.client.transport.call("POST", "/v1/locks/release", body, safe=True)
        except (NotHeld, TokenMismatch, UnknownSession):
            pass
        self.session._grant_lost(self.name, _common.GRANT_ENDED, self.token)

    def __enter__(self) -> "Grant":
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __repr__(self) -> str:
        return f"Grant({self.name!r}, token={self.token}, lost={self.lost.is_set()})"


class Session:
    """A lease kept alive every TTL/3 by a background thread. ``lost`` (a
    :class:`threading.Event`) is set at once when the service ends the session (revocation,
    expiry) and, by this client's own clock, when no keepalive was confirmed for the TTL less 3 %."""

    def __init__(self, client: "Client", session_id: int, ttl_s: float, opened_at: float) -> None:
        self.client = client
        self.id = session_id
        self.ttl = ttl_s
        self._guard = threading.Lock()
        self.lost = _LeaseEvent(self._lease_over)
        self.lost_reason: Optional[str] = None
        #: The grants held, by lock: two when an acquire of a lock the session holds was
        #: answered ``already_held`` (the same grant, told to both).
        self._grants: Dict[str, List[Grant]] = {}
        #: The newest grant of each lock that ended while no grant object held it, for one
        #: made from an answer still on its way (``_common.remember_ended``).
        self._ended_grants: Dict[str, Tuple[int, str]] = {}
        #: Set once the lease was seen to run out by this client's clock: a keepalive confirmed
        #: after that does not bring it back (``lost`` never goes from set to unset).
        self._lease_ran_out = False
        #: Whether a recheck (``_probe``) runs on a thread of its own, and whether another was
        #: asked for meanwhile: ``resync`` events come as one recheck at a time.
        self._rechecking = False
        self._recheck_again = False
        self._closing = threading.Event()
        # The lease counts from when the request that opened it was sent, not from its answer.
        self._confirmed_at = opened_at
        self._renewed = threading.Event()
        transport = client.transport
        timeout = httpx.Timeout(10.0, read=_common.WATCH_READ_TIMEOUT_S)
        self._watch_http = httpx.Client(timeout=timeout, verify=transport.tls, headers=transport.http.headers)
        self._watching = threading.Event()
        # The threads hold the session weakly, so that a session nobody holds any more (never
        # closed) is collected and its finalizer ends it (``_Forgotten``), rather than the
        # threads keeping it and its locks alive for as long as the process lives.
        this = weakref.ref(self)
        self._threads = [
            threading.Thread(target=_keep_alive, args=(this,), name=f"picket-keepalive-{session_id}", daemon=True),
            threading.Thread(target=_watch, args=(this, self._watch_http), name=f"picket-watch-{session_id}", daemon=True),
            threading.Thread(target=_watch_deadline, args=(this,), name=f"picket-lease-{session_id}", daemon=True),
        ]
        _start_ender()
        forgotten = _Forgotten(transport, session_id, self._closing, self._renewed, self.lost, self._watch_http)
        self._finalizer = weakref.finalize(self, _ENDINGS.put, forgotten)
        # At interpreter exit a session left open expires by its TTL, as before.
        self._finalizer.atexit = False
        for thread in self._threads:
            thread.start()
        # A loss is heard at once only once the watch stream is open; wait for it briefly.
        self._watching.wait(min(2.0, ttl_s / _common.KEEPALIVE_DIVISOR))

    # Locks.

    def lock(
        self,
        name: str,
        *,
        wait: Optional[float] = None,
        on_lost: Optional[OnLost] = None,
        fence: Sequence[str] = (),
    ) -> Grant:
        """Acquires ``name``, waiting at most ``wait`` seconds (``None``: until granted). With
        ``fence``, registers the grant's token with each resource URL before returning (fence on
        acquire), so a superseded holder's writes are refused even before this one writes."""
        grant = self._acquire(name, ms(wait), on_lost)
        for url in fence:
            try:
                register(self.client, url, grant)
            except BaseException:
                grant.release()
                raise
        return grant

    def try_lock(self, name: str, *, on_lost: Optional[OnLost] = None, fence: Sequence[str] = ()) -> Grant:
        """Acquires ``name`` only if it is free now; raises :class:`~picket.errors.LockBusy`."""
        return self.lock(name, wait=0, on_lost=on_lost, fence=fence)

    def _acquire(self, name: str, wait_ms: Optional[int], on_lost: Optional[OnLost]) -> Grant:
        if self.lost.is_set():
            raise SessionLost(f"session {self.id} is lost ({self.lost_reason}): open a new session", code="session_lost")
        attempts = _common.AcquireAttempts(name, self.id, wait_ms)
        budget = self.client.timeout + (wait_ms / 1000 if wait_ms is not None else 365 * 86400.0)
        for retry in range(MAX_ACQUIRE_RETRIES + 1):
            try:
                answer = self.client.transport.call(
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
                # The caller gave up (an interrupt) while this attempt's answer may be on its way.
                self._abandon(attempts)
                raise
            grant = Grant(self, name, int(answer["token"]), str(answer["sequencer"]), on_lost)
            with self._guard:
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
        """Undoes, in the background, what an acquire given up on may have done: its wait, or a
        grant nobody here knows of (which would otherwise stay with the session while it lives).
        Every attempt made is covered, and one arriving later is refused."""
        body = attempts.abandon_body()
        if body is not None:
            self.client._abandons.add(body)

    def _forget(self, grant: Grant) -> None:
        with self._guard:
            grants = self._grants.get(grant.name, [])
            if grant in grants:
                grants.remove(grant)
            if not grants:
                self._grants.pop(grant.name, None)

    def _held(self) -> List[Grant]:
        with self._guard:
            return [grant for grants in self._grants.values() for grant in grants]

    # Liveness.

    def _mark_lost(self, reason: str) -> None:
        with self._guard:
            if self.lost.is_set_now():
                return
            self.lost_reason = reason
            self.lost.set()
            grants = [grant for grants in self._grants.values() for grant in grants]
        self._renewed.set()
        for grant in grants:
            grant._mark_lost(reason)

    def _grant_lost(self, name: str, reason: str, token: Optional[int]) -> None:
        with self._guard:
            grants = [grant for grant in self._grants.get(name, ()) if token is None or grant.token == token]
            if token is not None:
                _common.remember_ended(self._ended_grants, name, token, reason)
        for grant in grants:
            grant._mark_lost(reason, token)

    def _confirmed(self, sent_at: float) -> None:
        """A keepalive sent at ``sent_at`` was confirmed: the lease counts from then, unless it
        already ran out by this client's clock (then the session stays lost: whoever looked
        was told so)."""
        with self._guard:
            over = self._lease_over()
            if not over:
                self._confirmed_at = max(self._confirmed_at, sent_at)
        if over:
            self._mark_lost("silent")
        self._renewed.set()

    def _keepalive_round(self) -> float:
        """Sends one keepalive; how long to wait before the next (negative: stop)."""
        period = self.ttl / _common.KEEPALIVE_DIVISOR
        sent_at = lease_clock()
        # Each attempt carries a reading taken as it is sent; the lease counts from before.
        path = lambda: _common.keepalive_path(self.id, lease_clock())  # noqa: E731
        try:
            self.client.transport.call("POST", path, {}, safe=True, timeout_s=period)
            self._confirmed(sent_at)
        except UnknownSession:
            self._mark_lost("expired")
            return -1.0
        except Exception:  # noqa: BLE001 - the deadline thread decides; keep trying
            pass
        return max(0.0, sent_at + period - lease_clock())

    def _lease_remaining(self) -> float:
        """Seconds until the lease is over by this client's clock (marked lost once it is)."""
        with self._guard:
            deadline = self._confirmed_at + self.ttl * (1 - _common.LEASE_MARGIN)
        remaining = deadline - lease_clock()
        if remaining <= 0:
            self._mark_lost("silent")
        return remaining

    def _lease_over(self) -> bool:
        """Whether the lease ran out by this client's clock, as ``lost.is_set()`` asks: a
        process suspended past its lease knows it at once, before the thread that watches the
        deadline wakes and marks the session lost (and runs the callbacks). Once it has, it
        stays so."""
        if not self._lease_ran_out:
            self._lease_ran_out = lease_clock() >= self._confirmed_at + self.ttl * (1 - _common.LEASE_MARGIN)
        return self._lease_ran_out

    def _ended(self) -> bool:
        return self._closing.is_set() or self.lost.is_set_now()

    def _held_tokens(self) -> Set[Tuple[str, int]]:
        return {(grant.name, grant.token) for grant in self._held()}

    def _probe(self, held: Optional[Set[Tuple[str, int]]] = None) -> None:
        """Asks what the session's events may have said while nobody listened (the watch
        stream was not open, or the node installed a snapshot and said ``resync``): whether
        the session still lives, and whether each grant ``held`` when the stream opened (or
        the ``resync`` came; later ones are the stream's) is still held under its token. What
        is gone is marked lost at once, as the missed events would have: a guard is told the
        moment its grant is known to have ended (SPEC), even when the stream's own event, on its
        way if the end came after the stream opened, would have said better why. (This waited
        half a second for that event; found in review to go against "the moment".)"""
        held = self._held_tokens() if held is None else held
        try:
            self.keepalive()
        except UnknownSession:
            self._mark_lost("ended")
            return
        except PicketError:
            return
        for name, token in sorted(held):
            try:
                info = self.client.lock_info(name)
            except PicketError:
                continue
            if not _common.still_held(info, self.id, token):
                self._grant_lost(name, _common.GRANT_ENDED, token)

    def _recheck_aside(self, held: Set[Tuple[str, int]]) -> None:
        """Runs :meth:`_probe` of ``held`` on a thread of its own, so that the watch thread
        goes on reading events (the stream's own event may say why a grant ended); one at a
        time, and once more, of the grants held then, if asked for meanwhile."""
        with self._guard:
            if self._rechecking:
                self._recheck_again = True
                return
            self._rechecking = True

        def recheck() -> None:
            checking = held
            while True:
                try:
                    self._probe(checking)
                except Exception:  # noqa: BLE001 - a recheck that failed must not stop the next
                    _log.debug("rechecking session %s failed", self.id, exc_info=True)
                with self._guard:
                    again, self._recheck_again = self._recheck_again, False
                    self._rechecking = again
                if not again:
                    return
                checking = self._held_tokens()

        threading.Thread(target=recheck, name=f"picket-recheck-{self.id}", daemon=True).start()

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

    def keepalive(self) -> None:
        """Sends a keepalive now (the background thread sends them anyway)."""
        sent_at = lease_clock()
        self.client.transport.call(
            "POST", lambda: _common.keepalive_path(self.id, lease_clock()), {}, safe=True
        )
        self._confirmed(sent_at)

    def close(self) -> None:
        """Releases what the session holds and ends it."""
        if self._closing.is_set():
            return
        self._closing.set()
        for grant in self._held():
            grant._released = True
        self._finalizer.detach()
        self._watch_http.close()
        if not self.lost.is_set_now():
            try:
                self.client.transport.call("DELETE", f"/v1/sessions/{self.id}", safe=True)
            except UnknownSession:
                pass
            self._mark_lost("closed")
        elif self.lost_reason == "silent":
            # Lost by this client's clock alone: it may still live at the service, with its
            # locks. Ended there too, at best (it expires by its TTL anyway).
            try:
                self.client.transport.call("DELETE", f"/v1/sessions/{self.id}", safe=True)
            except PicketError:
                pass

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _AbandonSender:
    """Sends a client's abandons (``_common.AbandonQueue``) one at a time from a thread of its
    own, started when one is queued and ended when none is left, or soon after the client
    closes or is collected."""

    def __init__(self, transport: Transport) -> None:
        self._transport = transport
        self._queue = _common.AbandonQueue()
        self._wake = threading.Condition()
        self._running = False
        self._closed = False
        # Set, without the lock, when the client was collected without ``close``: a finalizer
        # may run in this sender's own thread while it holds ``_wake``. Every abandon left then
        # belongs to a session that was collected too, and that session's ending frees its
        # grants (or its TTL does), so the thread need not keep trying them, nor keep the
        # transport and its connections for up to an hour of an outage.
        self._orphaned = False

    def orphan(self) -> None:
        """The client is gone: the thread ends at its next turn (within a retry pause, or once
        a call on its way ends). Safe from a finalizer, on any thread."""
        self._orphaned = True

    def add(self, body: Json) -> None:
        with self._wake:
            if self._closed:
                return
            self._queue.add(body, time.monotonic())
            if not self._running:
                try:
                    threading.Thread(target=self._run, name="picket-abandons", daemon=True).start()
                    self._running = True
                except RuntimeError as error:  # no thread now (at interpreter shutdown, say)
                    _log.warning("could not start the thread that sends abandons: %s", error)
            self._wake.notify()

    def close(self) -> None:
        with self._wake:
            self._closed = True
            self._queue.clear()
            self._wake.notify()

    def _next(self) -> Optional[_common.Abandon]:
        """The next abandon to send, waiting for one due again; ``None`` ends the thread."""
        with self._wake:
            while True:
                gone = self._closed or self._orphaned
                taken = None if gone else self._queue.take(time.monotonic())
                if taken is None:
                    self._running = False
                    return None
                if isinstance(taken, _common.Abandon):
                    return taken
                self._wake.wait(taken)

    def _run(self) -> None:
        try:
            while True:
                abandon = self._next()
                if abandon is None:
                    return
                error: Optional[BaseException] = None
                try:
                    self._transport.call("POST", "/v1/locks/abandon", abandon.body, safe=True)
                except Exception as failure:  # noqa: BLE001 - settled below, whatever it was
                    error = failure
                with self._wake:
                    # A try cut short by the client's close is not a failure worth a warning.
                    if not self._closed:
                        self._queue.settle(abandon, error, time.monotonic())
        except BaseException:
            # Whatever escaped, the next abandon starts another thread rather than waiting for
            # this one.
            with self._wake:
                self._running = False
            raise


def _keep_alive(this: "weakref.ref[Session]") -> None:
    """Sends a keepalive every TTL/3 until the session ends or is collected; the lease deadline
    is watched by another thread, so a keepalive stuck in flight cannot delay the loss."""
    while True:
        session = this()
        if session is None or session._ended():
            return
        closing = session._closing
        pause = session._keepalive_round()
        del session
        if pause < 0:
            return
        closing.wait(pause)


def _watch_deadline(this: "weakref.ref[Session]") -> None:
    """Sets ``lost`` when no keepalive was confirmed for the TTL less 3 %, by this client's own
    clock."""
    while True:
        session = this()
        if session is None or session._ended():
            return
        renewed = session._renewed
        remaining = session._lease_remaining()
        del session
        if remaining <= 0:
            return
        renewed.wait(min(remaining, _common.LEASE_CHECK_MAX_S))
        renewed.clear()


def _watch(this: "weakref.ref[Session]", http: httpx.Client) -> None:
    """Follows the session's losses (``losses_only``): a revocation or a grant ended by the
    service reaches the session at once, not at the next keepalive. Holds the session only
    while it handles what arrived, never while it waits."""
    try:
        while True:
            session = this()
            if session is None or session._ended():
                return
            transport, closing, watching = session.client.transport, session._closing, session._watching
            query = {"session_id": str(session.id), "losses_only": "true"}
            del session
            try:
                url = transport.endpoints.url() + "/v1/watch"
                cluster = transport.cluster.stream_headers()
                with http.stream("GET", url, params=query, headers=cluster) as response:
                    if response.status_code != 200:
                        transport.endpoints.next()
                        closing.wait(0.5)
                        continue
                    # Whatever ended while the stream was not open is not replayed: ask, of the
                    # grants held now (later ones are the stream's).
                    session = this()
                    if session is None:
                        return
                    held = session._held_tokens()
                    watching.set()
                    # Here, before the stream is read: a read that has begun is not woken when
                    # `close` closes the watch's HTTP client, and the thread would outlive its
                    # session until the stream's next byte.
                    session._probe(held)
                    del session
                    sse = _common.SseEvents()
                    for text in response.iter_text():
                        if not _common.hand_over(this, sse, text):
                            return
            except Exception:  # noqa: BLE001 - reconnect, whatever broke the stream
                if closing.is_set():
                    return
                transport.endpoints.next()
                closing.wait(0.5)
    finally:
        http.close()


class _Forgotten:
    """What it takes to end a session collected without ``close``, without the session."""

    def __init__(
        self,
        transport: Transport,
        session_id: int,
        closing: threading.Event,
        renewed: threading.Event,
        lost: threading.Event,
        http: httpx.Client,
    ) -> None:
        self.transport = transport
        self.session_id = session_id
        self.closing = closing
        self.renewed = renewed
        self.lost = lost
        self.http = http

    def end(self) -> None:
        """Wakes the session's threads (on ``_closing`` and ``_renewed``, which they wait on)
        to find it gone, marks it lost, and asks the service to end it unless it was lost
        already. Best effort: should the request fail, the session expires by its TTL."""
        self.closing.set()
        self.renewed.set()
        self.http.close()
        if self.lost.is_set():
            return
        self.lost.set()
        try:
            self.transport.call("DELETE", f"/v1/sessions/{self.session_id}", safe=True)
        except Exception:  # noqa: BLE001 - it expires by its TTL anyway
            pass


#: Sessions collected without ``close``, to be ended by the ender thread. A finalizer runs
#: wherever the cycle collector does, possibly in one of the session's own threads while it
#: holds a lock the ending takes (an Event's, the HTTP pool's); ``SimpleQueue.put`` is safe
#: there, and the ending itself runs on a thread of its own.
_ENDINGS: "queue.SimpleQueue[_Forgotten]" = queue.SimpleQueue()
_ENDER_STARTED = threading.Lock()
_ender: List[threading.Thread] = []


def _start_ender() -> None:
    """Starts the thread that ends forgotten sessions, once per process."""
    with _ENDER_STARTED:
        if not _ender:
            thread = threading.Thread(target=_end_forgotten, name="picket-ender", daemon=True)
            thread.start()
            _ender.append(thread)


def _end_forgotten() -> None:
    while True:
        _ENDINGS.get().end()


class Client:
    """A Picket client over HTTP/JSON. ``endpoints`` are the nodes (``host:port``, or
    ``https://host:port`` for TLS); the client follows the leader. ``token`` is a bearer token for
    nodes with ``--auth-file``; ``verify`` the CA bundle that signed the nodes' certificates (the
    servers' ``--peer-ca``); ``cert`` a client certificate and key, for a principal named by its
    certificate. The client keeps to one cluster: ``cluster_id`` (``cluster id`` in ``picket
    members``), else the first named one that answers; a node of another refuses its requests
    (:class:`~picket.errors.OtherCluster`), and a cluster restored from a backup of it is
    followed. ``cluster_id`` is the one it keeps to, once known."""

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
        self.transport = Transport(
            endpoints, token=token, timeout_s=timeout, verify=verify, cert=cert, cluster_id=cluster_id
        )
        self._abandons = _AbandonSender(self.transport)
        # A client dropped without ``close`` does not keep its abandons' thread trying.
        weakref.finalize(self, self._abandons.orphan).atexit = False

    def session(self, ttl: float = 10.0, *, lock_delay: float = 0.0) -> Session:
        """Opens a session that lives ``ttl`` seconds past its last keepalive."""
        body = {"ttl_ms": ms(ttl), "lock_delay_ms": ms(lock_delay)}
        sent_at = lease_clock()
        opened = self.transport.call("POST", lambda: open_path(lease_clock()), body, safe=False)
        return Session(self, int(opened["session_id"]), int(opened["ttl_ms"]) / 1000, sent_at)

    @contextlib.contextmanager
    def lock(
        self,
        name: str,
        *,
        ttl: float = 10.0,
        wait: Optional[float] = None,
        lock_delay: float = 0.0,
        on_lost: Optional[OnLost] = None,
        fence: Sequence[str] = (),
    ) -> Iterator[Grant]:
        """A session of its own and a grant of ``name`` in it, both ended on exit."""
        with self.session(ttl, lock_delay=lock_delay) as session:
            with session.lock(name, wait=wait, on_lost=on_lost, fence=fence) as grant:
                yield grant

    @contextlib.contextmanager
    def try_lock(self, name: str, *, ttl: float = 10.0, on_lost: Optional[OnLost] = None) -> Iterator[Grant]:
        """Like :meth:`lock`, without waiting: raises :class:`~picket.errors.LockBusy`."""
        with self.lock(name, ttl=ttl, wait=0, on_lost=on_lost) as grant:
            yield grant

    def lock_info(self, name: str) -> Json:
        """The lock's holder, queue and lock-delay."""
        return self.transport.call("GET", lock_path(name), safe=True)

    def check(self, sequencer: str) -> Json:
        """Whether ``sequencer`` is its lock's current grant: ``{"status": "current" |
        "superseded" | "unknown_lock", "current_token"}``."""
        path = "/v1/check?sequencer=" + urllib.parse.quote(sequencer, safe="")
        return self.transport.call("GET", path, safe=True)

    def revoke(self, session_id: int) -> None:
        """Ends a session as an expiry would (admins, or its owner)."""
        self.transport.call("POST", f"/v1/sessions/{session_id}/revoke", {}, safe=True)

    @property
    def cluster_id(self) -> Optional[str]:
        """The id of the cluster this client keeps to; ``None`` until it has reached a named one."""
        return self.transport.cluster.id

    def close(self) -> None:
        self._abandons.close()
        self.transport.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def register(client: Client, url: str, grant: Grant) -> None:
    """Fence on acquire: tells the resource at ``url`` (e.g. ``picket kv``'s
    ``http://store/fence/prefix/``) the grant's token before any write."""
    # A plain request: the client's own default headers carry Picket's bearer token, which is
    # not the resource's business.
    headers = {"Picket-Sequencer": grant.sequencer}
    response = httpx.post(url, headers=headers, timeout=client.timeout)
    if response.is_success:
        return
    raise fence_refusal(response, Sequencer.parse(grant.sequencer))


def fence_refusal(response: httpx.Response, sequencer: Sequencer) -> FenceRefused:
    """The refusal a fenced HTTP resource answered, as a typed error."""
    from .errors import StaleToken

    try:
        body = response.json()
    except ValueError:
        body = {}
    reason = str(body.get("code", f"http_{response.status_code}"))
    highest = body.get("highest_token")
    cls = StaleToken if reason == "stale_token" else FenceRefused
    return cls(
        str(body.get("message", response.text[:200])),
        reason=reason,
        lock=str(body.get("lock", sequencer.lock)),
        presented_token=sequencer.token,
        highest_token=int(highest) if highest is not None else None,
    )
