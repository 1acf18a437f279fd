"""What the sync and async clients share: clocks, sequencers, names of causes."""

from __future__ import annotations

import collections
import errno
import logging
import random
import socket
import ssl
import string
import time
import urllib.parse
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional

import httpx

from .errors import NotLeader, NothingToAbandon, OtherCluster, OutcomeUnknown, Unavailable, UnknownSession

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
#: The longest a session's own check of its lease sleeps at once. A sleep is counted on a
#: clock that stops while the machine is suspended, the lease on one that does not: a machine
#: that wakes after its lease ran out notices within this, not a whole sleep later.
LEASE_CHECK_MAX_S = 1.0

#: The reason a grant is lost when it was found ended with no event to say how: another grant
#: of the same lock in the session (an acquire answered ``already_held``) was released, or the
#: check made when the watch stream opens again, or after a ``resync``, found the lock free or
#: held under another token.
GRANT_ENDED = "grant_ended"


class LeaseCheck:
    """What a session's (or grant's) ``lost`` event asks when the caller asks whether it is
    set: whether the lease ran out by this client's clock (``over``, a method of the session),
    so that the answer is right even before the thread or task that watches the deadline has
    woken (after the machine was suspended, say). The question runs no callback: that thread
    or task marks the session lost and runs them, within ``LEASE_CHECK_MAX_S``; the session
    only remembers that its lease ran out, so that a keepalive confirmed later does not bring
    it back. The
    method is held weakly: the finalizer that ends a session nobody holds keeps its ``lost``,
    which must not keep the session itself."""

    def __init__(self, over: Callable[[], bool]) -> None:
        self._over = weakref.WeakMethod(over)

    def over(self) -> bool:
        over = self._over()
        return over is not None and over()


#: For how many locks a session remembers the newest grant that ended while no grant object
#: held it (the answer to an acquire told ``already_held`` may arrive after the release or
#: the check that ended it), as the Rust client does.
ENDED_GRANTS_KEPT = 1024


def remember_ended(ended: Dict[str, "tuple[int, str]"], name: str, token: int, reason: str) -> None:
    """Records that grant ``token`` of ``name`` ended, and why: a grant object made from an
    answer still on its way (an acquire told ``already_held``) starts lost. Recorded whether
    or not a grant object held it, since another answer may be on its way either way."""
    newest = ended.pop(name, None)
    if newest is not None and newest[0] >= token:
        # The first report of an end says why best: a later one (a recheck's, a release's)
        # knows less. Put back last: the least recently ended lock is forgotten first.
        ended[name] = newest
        return
    if len(ended) >= ENDED_GRANTS_KEPT:
        # Forget the least recently ended lock's record: only an answer still on its way
        # needed it.
        ended.pop(next(iter(ended)))
    ended[name] = (token, reason)


def ended_reason(ended: Dict[str, "tuple[int, str]"], name: str, token: int) -> Optional[str]:
    """Why grant ``token`` of ``name`` ended, if it is known to have (:func:`remember_ended`)."""
    newest, reason = ended.get(name, (0, ""))
    return reason if token <= newest else None


def _timed_out_in(error: BaseException) -> Optional[str]:
    """Where a connect timeout of httpcore's came from: ``"tcp"`` when it came while the TCP
    connection was being made (``connect_tcp``, in both of its backends), ``"tls"`` during the
    TLS handshake (``start_tls``), ``None`` when its tracebacks do not say."""
    seen: List[BaseException] = []
    cause: Optional[BaseException] = error
    while cause is not None and len(seen) < 8:
        seen.append(cause)
        cause = cause.__cause__ or cause.__context__
    names = set()
    for each in seen:
        frame = each.__traceback__
        while frame is not None:
            names.add(frame.tb_frame.f_code.co_name)
            frame = frame.tb_next
    if "start_tls" in names:
        return "tls"
    if "connect_tcp" in names:
        return "tcp"
    return None


def nothing_reached(url: str, error: BaseException) -> bool:
    """Whether ``error``, met connecting to ``url``, says nothing is there: the connection was
    refused, the host is unreachable or unknown, or the TCP connection was not made in time. A
    failed TLS handshake, a reset, or a timeout during the handshake says something listens
    there, perhaps a node of the client's cluster: not a node gone."""
    if isinstance(error, httpx.ConnectTimeout):
        # Over HTTPS the timeout may have come during the TLS handshake: the tracebacks say
        # which step timed out, and one that does not say is not taken for a node gone.
        return not url.startswith("https://") or _timed_out_in(error) == "tcp"
    # A name with several addresses fails with one error for each, in a group (anyio's, under
    # the asyncio client): nothing is there only if nothing is at any of them.
    causes: List[BaseException] = [error]
    for _ in range(32):
        if not causes:
            return True
        cause = causes.pop()
        if isinstance(cause, ssl.SSLError):
            return False
        if isinstance(cause, (ConnectionRefusedError, socket.gaierror)):
            continue
        if isinstance(cause, OSError) and cause.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH):
            continue
        # An exception group, built in (3.11) or the backport anyio raises before it.
        group = getattr(cause, "exceptions", None)
        if isinstance(group, (list, tuple)) and group and all(isinstance(e, BaseException) for e in group):
            causes.extend(group)
            continue
        earlier = cause.__cause__ or cause.__context__
        if earlier is None:
            return False
        causes.append(earlier)
    return False



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


class AcquireAttempts:
    """The attempts of one acquire: one request id, and a number for each attempt, in order.
    The service abandons an attempt it answered ``unavailable`` (its leader may have written it
    to the log) and from then on refuses that attempt's number, so each attempt, a retry of
    the transport's own included, takes a new one (as the Rust client does)."""

    def __init__(self, name: str, session_id: int, wait_ms: Optional[int]) -> None:
        self.name = name
        self.session_id = session_id
        self.request_id = new_request_id()
        self.wait_ms = wait_ms
        #: How many attempts were made so far (the next one's number).
        self.made = 0

    def next_body(self) -> Dict[str, Any]:
        """The body of the next attempt."""
        body: Dict[str, Any] = {
            "name": self.name,
            "session_id": self.session_id,
            "request_id": self.request_id,
            "attempt": self.made,
        }
        if self.wait_ms is not None:
            body["wait_ms"] = self.wait_ms
        self.made += 1
        return body

    def abandon_body(self) -> Optional[Dict[str, Any]]:
        """The abandon of every attempt made so far (``None`` when none was): a later one
        arriving is refused too."""
        if self.made == 0:
            return None
        return {
            "name": self.name,
            "session_id": self.session_id,
            "request_id": self.request_id,
            "attempt": self.made - 1,
        }

    def may_have_left_something(self, error: BaseException) -> bool:
        """Whether the acquire, ended by ``error``, may have left a wait or a grant that nobody
        here knows of: after a retry (an earlier attempt's answer was lost, and the last one's
        refusal does not show what it did), or when no answer came at all. Abandoning what did
        nothing changes nothing."""
        no_answer = isinstance(error, (OutcomeUnknown, Unavailable, OtherCluster))
        return self.made > 1 or (self.made == 1 and no_answer)


def still_held(info: Dict[str, Any], session_id: int, token: int) -> bool:
    """Whether a lock's state (``GET /v1/locks/{name}``) shows it held by ``session_id`` under
    ``token``."""
    holder = info.get("holder") or {}
    return bool(holder.get("session_id") == session_id and holder.get("token") == token)


def lock_path(name: str) -> str:
    """The path of a lock: its name as it is, other bytes percent-encoded, and the dots of a
    segment ``.`` or ``..`` too (valid in a lock's name: an HTTP client folds such segments
    away, so the request read another lock)."""
    segments = (urllib.parse.quote(segment, safe="-._~") for segment in name.split("/"))
    return "/v1/locks/" + "/".join(
        segment.replace(".", "%2E") if segment in (".", "..") else segment for segment in segments
    )


def ms(seconds: Optional[float]) -> Optional[int]:
    return None if seconds is None else max(0, int(round(seconds * 1000)))


def _decode_name(encoded: str) -> Optional[str]:
    """A sequencer's lock name, its escapes decoded (Picket escapes every byte of the name
    outside ``A-Za-z0-9-_.~/``), or ``None`` when it is malformed: a control character, a
    ``%`` not followed by two hexadecimal digits, or escapes that are not UTF-8. The same rule
    as the Rust ``picket_core::decode_escaped``, so both fences bind the same name."""
    for index, char in enumerate(encoded):
        if ord(char) < 0x20 or ord(char) == 0x7F:
            return None
        escaped = encoded[index + 1 : index + 3]
        if char == "%" and (len(escaped) != 2 or any(c not in string.hexdigits for c in escaped)):
            return None
    try:
        return urllib.parse.unquote(encoded, errors="strict")
    except UnicodeDecodeError:
        return None


@dataclass(frozen=True)
class Sequencer:
    """A grant as a resource sees it: its lock and token (``p1.<token>.<lock>``, or a signed
    ``p2.<token>.<session>.<cluster>.<key>.<signature>.<lock>``). ``lock`` is the lock's name,
    its escapes in the sequencer decoded."""

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
        name = _decode_name(lock)
        if token <= 0 or not name:
            raise ValueError(f"{text!r} is not a Picket sequencer")
        return Sequencer(text, token, name)

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
