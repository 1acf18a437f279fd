"""What the sync and async clients share: clocks, sequencers, names of causes."""

from __future__ import annotations

import collections
import logging
import random
import time
import urllib.parse
import weakref
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

from .errors import NotLeader, NothingToAbandon, OutcomeUnknown, Unavailable, UnknownSession

_log = logging.getLogger("picket")

#: A session counts on itself for its TTL less this share after its last confirmed keepalive,
#: so that a clock running up to 1 % fast, and the time the keepalive took to arrive, cannot
#: make it believe in a lease the server already ended (the same margin as the Rust client).
LEASE_MARGIN = 0.03

#: Keepalives go out every TTL / KEEPALIVE_DIVISOR.
KEEPALIVE_DIVISOR = 3

#: How long a watch stream waits for a byte before it reconnects (the server sends a comment
#: every 15 s).
WATCH_READ_TIMEOUT_S = 30.0
#: How long a session that the check after a watch stream opened found gone waits for the stream
#: to say why (the end may have come after the stream opened, and its event be on its way)
#: before it is marked lost for no known reason, ``ended``. Without the wait, a revocation
#: right after the stream opened could be reported as ``ended`` instead of ``session_revoked``.
ENDED_GRACE_S = 0.5


def lease_clock() -> float:
    """Seconds on a clock that keeps counting while the machine sleeps (``CLOCK_BOOTTIME`` on
    Linux), so a suspended laptop does not wake up believing in a lease that ran out."""
    boottime = getattr(time, "CLOCK_BOOTTIME", None)
    if boottime is not None:
        return time.clock_gettime(boottime)
    return time.monotonic()


#: A random nonzero number naming this process's lease clock to the service (see
#: ``keepalive_path``).
CLOCK_ID = random.SystemRandom().randint(1, (1 << 63) - 1)


def keepalive_path(session_id: int, sent_at: float) -> str:
    """The keepalive path of a session, with a reading of the lease clock taken when it is sent
    (``sent_at``, seconds): where the leader's clock runs at another rate than this one, the
    service keeps the session alive for its TTL by this clock, the one its lease is counted on
    here."""
    return f"/v1/sessions/{session_id}/keepalive?clock_id={CLOCK_ID}&clock_ms={sent_at * 1000.0:.3f}"


def open_path(sent_at: float) -> str:
    """The path that opens a session, with a reading of the lease clock taken when it is sent
    (``sent_at``, seconds), so the service can pair this client's first keepalive with it."""
    return f"/v1/sessions?clock_id={CLOCK_ID}&clock_ms={sent_at * 1000.0:.3f}"


def new_request_id() -> int:
    """A fresh request id for an acquire: positive, 63 bits."""
    return random.SystemRandom().randint(1, (1 << 63) - 1)


def lock_path(name: str) -> str:
    """The path of a lock: its name as it is, other bytes percent-encoded."""
    return "/v1/locks/" + urllib.parse.quote(name, safe="/-._~")


def ms(seconds: Optional[float]) -> Optional[int]:
    return None if seconds is None else max(0, int(round(seconds * 1000)))


@dataclass(frozen=True)
class Sequencer:
    """A grant as a resource sees it: its lock and token (``p1.<token>.<lock>``, or a signed
    ``p2.<token>.<session>.<cluster>.<key>.<signature>.<lock>``)."""

    text: str
    token: int
    lock: str

    @staticmethod
    def parse(text: str) -> "Sequencer":
        parts = text.split(".", 6)
        try:
            if parts[0] == "p1" and len(parts) >= 3:
                token, lock = int(parts[1]), text.split(".", 2)[2]
            elif parts[0] == "p2" and len(parts) == 7:
                token, lock = int(parts[1]), parts[6]
            else:
                raise ValueError(text)
        except ValueError as error:
            raise ValueError(f"{text!r} is not a Picket sequencer") from error
        if token <= 0 or not lock:
            raise ValueError(f"{text!r} is not a Picket sequencer")
        return Sequencer(text, token, lock)

    def __str__(self) -> str:
        return self.text


def loss_of(event: Dict[str, Any]) -> Optional[str]:
    """The reason a losses-only watch event names: a session's end, or a grant ended by
    anything but its holder's release."""
    kind = event.get("kind")
    if kind == "session_ended":
        return str(event.get("cause", "ended"))
    if kind == "released" and event.get("cause") != "released":
        return str(event.get("cause", "lost"))
    return None


#: The longest server-sent event a watch takes (characters). A watch event is a few hundred;
#: past this the stream is dropped and opened again.
MAX_SSE_EVENT_CHARS = 1 << 20


class SseEvents:
    """The server-sent events of one stream, fed its text as it comes.

    Text is joined only when an event is complete, so a stream that trickles in costs time in
    proportion to its length; and an event longer than :data:`MAX_SSE_EVENT_CHARS` raises
    ``ValueError`` instead of growing the buffer without bound (the buffer was joined and
    searched whole on every chunk, and had no bound: found in review)."""

    def __init__(self) -> None:
        self._parts: List[str] = []
        self._size = 0
        self._last = ""

    def feed(self, text: str) -> List[Dict[str, Any]]:
        """The events ``text`` completes (their JSON data)."""
        if not text:
            return []
        ends_event = "\n\n" in text or (self._last == "\n" and text.startswith("\n"))
        self._last = text[-1]
        self._parts.append(text)
        self._size += len(text)
        if not ends_event:
            self._check()
            return []
        events, rest = sse_events("".join(self._parts))
        self._parts = [rest] if rest else []
        self._size = len(rest)
        self._check()
        return events

    def _check(self) -> None:
        if self._size > MAX_SSE_EVENT_CHARS:
            raise ValueError(f"a server-sent event longer than {MAX_SSE_EVENT_CHARS} characters")


def sse_events(buffer: str) -> "tuple[list[Dict[str, Any]], str]":
    """The complete server-sent events in ``buffer`` (their JSON data), and what is left."""
    import json

    events = []
    start = 0
    # Found in place and sliced once at the end: splitting off each event copied the rest.
    while (end := buffer.find("\n\n", start)) >= 0:
        block = buffer[start:end]
        start = end + 2
        data = "\n".join(line[5:].lstrip() for line in block.split("\n") if line.startswith("data:"))
        if data:
            events.append(json.loads(data))
    return events, buffer[start:]


def hand_over(this: "weakref.ref[Any]", sse: SseEvents, text: str) -> bool:
    """Hands the watch events completed by ``text`` to the session ``this`` refers to
    (``_on_event``), holding it only while it does: False once the session is gone."""
    for event in sse.feed(text):
        session = this()
        if session is None:
            return False
        session._on_event(event)
        del session
    return True


#: Most abandons of given-up acquires waiting per client; past it the least recently tried is
#: dropped, with a warning (a grant it would have taken stays until its session ends).
MAX_PENDING_ABANDONS = 1024

#: How long the abandon of a given-up acquire keeps trying to get through: the longest TTL a
#: node accepts by default. By then its session has expired unless its keepalives got through
#: all along while its abandons did not, which is beyond what a client can mend.
ABANDON_PERSISTS_FOR_S = 3600.0

#: The pause before an abandon that did not get through is tried again.
ABANDON_RETRY_PAUSE_S = 0.5


class Abandon:
    """One given-up acquire's abandon, waiting to be sent or sent again."""

    __slots__ = ("body", "give_up_at", "due_at")

    def __init__(self, body: Dict[str, Any], now: float) -> None:
        self.body = body
        self.give_up_at = now + ABANDON_PERSISTS_FOR_S
        self.due_at = now


class AbandonQueue:
    """The abandons of one client's given-up acquires: the rules, shared by the blocking and
    asyncio clients, which send them one at a time from a thread or a task of their own.

    An acquire given up without an answer may have left a wait or a grant at the service that
    nobody here knows of, and the session would hold it for as long as it lives. Its abandon
    is tried again while the cluster cannot be reached, for up to ``ABANDON_PERSISTS_FOR_S``:
    one round of retries used to be all, so an outage longer than the client's timeout left
    the grant with the session (the Rust client's rule since issue 14)."""

    def __init__(self) -> None:
        self.fresh: "collections.deque[Abandon]" = collections.deque()
        self.retrying: "collections.deque[Abandon]" = collections.deque()

    def __len__(self) -> int:
        return len(self.fresh) + len(self.retrying)

    def add(self, body: Dict[str, Any], now: float) -> Optional[Abandon]:
        """Queues an abandon; returns the one dropped to make room, if any, with a warning."""
        dropped = None
        if len(self) >= MAX_PENDING_ABANDONS:
            dropped = self.retrying.popleft() if self.retrying else self.fresh.popleft()
            _log.warning(
                "more than %d abandons of given-up acquires are waiting; dropped the least recently "
                "tried (of %r): a grant it may have produced stays until the session ends",
                MAX_PENDING_ABANDONS,
                dropped.body.get("name"),
            )
        self.fresh.append(Abandon(body, now))
        return dropped

    def take(self, now: float) -> "Abandon | float | None":
        """The abandon to send now (new ones first); else the seconds until one is due again;
        ``None`` when none is left."""
        if self.fresh:
            return self.fresh.popleft()
        if not self.retrying:
            return None
        if self.retrying[0].due_at <= now:
            return self.retrying.popleft()
        return self.retrying[0].due_at - now

    def settle(self, abandon: Abandon, error: Optional[BaseException], now: float) -> bool:
        """Puts ``abandon`` back, due after a pause, when it may still land: its try ended with
        no answer (``Unavailable``, ``OutcomeUnknown``, or ``NotLeader`` from followers that
        know of no leader) and it has not tried for too long. Says whether it did, and logs how
        the try ended: one that will not be tried again, with its grant perhaps left behind, as
        a warning."""
        name, request_id = abandon.body.get("name"), abandon.body.get("request_id")
        no_answer = isinstance(error, (Unavailable, OutcomeUnknown, NotLeader))
        if no_answer and now < abandon.give_up_at:
            _log.debug("the abandon of acquire %s of %r did not get through: %s", request_id, name, error)
            abandon.due_at = now + ABANDON_RETRY_PAUSE_S
            self.retrying.append(abandon)
            return True
        if error is None or isinstance(error, NothingToAbandon):
            _log.debug("abandoned acquire %s of %r", request_id, name)
        elif isinstance(error, UnknownSession):
            _log.debug("acquire %s of %r needs no abandon: its session has ended", request_id, name)
        else:
            _log.warning(
                "could not abandon acquire %s of %r (a grant it may have produced stays until the "
                "session ends): %s",
                request_id,
                name,
                error,
            )
        return False

    def clear(self) -> None:
        self.fresh.clear()
        self.retrying.clear()
