"""Errors: one class per stable code of the server, each with the server's own sentence."""

from __future__ import annotations

from typing import Any, Dict, Optional, Type


class PicketError(Exception):
    """A request to Picket failed.

    ``code`` is the server's stable code (``lock_busy``, ``not_leader``, ...), ``message`` its
    sentence (what went wrong and what to do), ``outcome`` whether the request changed anything:
    ``not_applied`` (retrying is safe) or ``unknown`` (read the state before retrying).
    """

    def __init__(
        self,
        message: str,
        *,
        code: str = "client_error",
        outcome: str = "not_applied",
        status: Optional[int] = None,
        body: Optional[Dict[str, Any]] = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.outcome = outcome
        self.status = status
        self.body: Dict[str, Any] = body or {}


class BadRequest(PicketError):
    """The request is malformed or out of range; nothing changed."""


class Unauthenticated(PicketError):
    """The node requires credentials: pass ``token=``."""


class PermissionDenied(PicketError):
    """The principal's roles do not cover this."""


class UnknownSession(PicketError):
    """The session expired, was closed or revoked: open a new one."""


class LockBusy(PicketError):
    """Another session holds the lock. ``holder_token`` is its token."""

    @property
    def holder_token(self) -> Optional[int]:
        token = self.body.get("holder_token")
        return int(token) if token is not None else None


class LockDelayed(PicketError):
    """The lock is in its lock-delay after its holder's session ended."""


class WaitTimedOut(LockBusy):
    """The bounded wait ran out before the lock was granted."""


class WaitEnded(PicketError):
    """The wait ended without a grant (the session ended, or the wait was cancelled)."""


class NotHeld(PicketError):
    """The session does not hold the lock (any more)."""


class TokenMismatch(PicketError):
    """The token is not the session's current grant of the lock."""


class NotWaiting(PicketError):
    """The session does not wait for the lock (cancel of a wait that ended)."""


class AlreadyWaiting(PicketError):
    """The session already waits for the lock under another request."""


class NothingToAbandon(PicketError):
    """The request to abandon made no wait or grant (servers before request_abandoned existed)."""


class RequestAbandoned(PicketError):
    """An attempt of an acquire request arrived after the request was abandoned: nothing done."""


class NotFound(PicketError):
    """No such path on the server: a client and server of different versions?"""


class NotLeader(PicketError):
    """The node is not the leader; ``leader`` names it when known (the client follows it)."""

    @property
    def leader(self) -> Optional[str]:
        leader = self.body.get("leader")
        return str(leader) if leader else None


class Exhausted(PicketError):
    """A bound of the service is full (sessions, locks, waiters, watch streams...)."""


class Unavailable(PicketError):
    """No leader or no quorum now; nothing was applied. Retry shortly."""


class OutcomeUnknown(PicketError):
    """The request may or may not have been applied: read the state before retrying."""


class OtherCluster(PicketError):
    """The node belongs to another cluster than the client's (the one given as ``cluster_id``,
    or the first named one it reached): it refused the request, which changed nothing. The
    client's endpoints name nodes of two clusters; give it only the nodes of one."""


class VotersNotAnswering(PicketError):
    """A voter's removal was refused: a majority of the voters now, or of those left, has not
    answered the leader within a leader lease, and the change would stop every write until they
    did. Nothing was changed: bring the voters named back, then retry. (This client makes no
    membership changes; the class is here for the code's sake, as with any HTTP caller.)"""


class SessionLost(PicketError):
    """The session is gone: expired, revoked, closed, or silent past its TTL by this client's clock."""


class FenceRefused(PicketError):
    """A fenced resource refused a write or a registration.

    ``lock``, ``presented_token`` and ``highest_token`` say which grant and what the resource has
    seen; ``reason`` is the fence's (``stale_token``, ``wrong_lock``, ``replayed_seq``, ...).
    """

    def __init__(
        self,
        message: str,
        *,
        reason: str,
        lock: str,
        presented_token: int,
        highest_token: Optional[int],
    ) -> None:
        super().__init__(message, code=reason)
        self.reason = reason
        self.lock = lock
        self.presented_token = presented_token
        self.highest_token = highest_token


class StaleToken(FenceRefused):
    """The resource has seen a newer token of the lock: this grant was superseded. Re-acquire
    the lock and re-read before writing."""


_BY_CODE: Dict[str, Type[PicketError]] = {
    "bad_request": BadRequest,
    "invalid_name": BadRequest,
    "ttl_out_of_range": BadRequest,
    "lock_delay_out_of_range": BadRequest,
    "wait_out_of_range": BadRequest,
    "invalid_owner": BadRequest,
    "too_many_renewals": BadRequest,
    "body_too_large": BadRequest,
    "unauthenticated": Unauthenticated,
    "permission_denied": PermissionDenied,
    "unknown_session": UnknownSession,
    "lock_busy": LockBusy,
    "lock_delayed": LockDelayed,
    "wait_timed_out": WaitTimedOut,
    "wait_ended": WaitEnded,
    "not_held": NotHeld,
    "token_mismatch": TokenMismatch,
    "not_waiting": NotWaiting,
    "already_waiting": AlreadyWaiting,
    "nothing_to_abandon": NothingToAbandon,
    "request_abandoned": RequestAbandoned,
    "not_found": NotFound,
    "not_leader": NotLeader,
    "too_many_sessions": Exhausted,
    "too_many_locks": Exhausted,
    "too_many_locks_for_session": Exhausted,
    "too_many_waiters": Exhausted,
    "too_many_watch_streams": Exhausted,
    "too_many_watched_sessions": Exhausted,
    "too_many_pending_acquires": Exhausted,
    "too_many_request_bodies": Exhausted,
    "too_many_backups": Exhausted,
    "unavailable": Unavailable,
    "outcome_unknown": OutcomeUnknown,
    "stopped": OutcomeUnknown,
    "wait_untracked": OutcomeUnknown,
    "other_cluster": OtherCluster,
    "voters_not_answering": VotersNotAnswering,
}


def from_response(status: int, body: Dict[str, Any]) -> PicketError:
    """The error a server's answer stands for."""
    code = str(body.get("code", f"http_{status}"))
    message = str(body.get("message", f"the server answered {status}"))
    outcome = str(body.get("outcome", "unknown" if status >= 500 else "not_applied"))
    cls = _BY_CODE.get(code, PicketError)
    return cls(message, code=code, outcome=outcome, status=status, body=body)
