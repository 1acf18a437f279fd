"""Picket: a distributed lock service whose locks are enforced at the resource by fencing tokens.

A grant's ``token`` only ever grows; carry its ``sequencer`` on every write, and let the
resource refuse older tokens in the same atomic step as the write (:mod:`picket.fence`).
"""

from . import fence
from ._common import Sequencer
from .aio import AsyncClient, AsyncGrant, AsyncSession
from .client import Client, Grant, Session
from .errors import (
    AlreadyWaiting,
    BadRequest,
    Exhausted,
    FenceRefused,
    LockBusy,
    LockDelayed,
    NotFound,
    NotHeld,
    NotLeader,
    NothingToAbandon,
    NotWaiting,
    OtherCluster,
    OutcomeUnknown,
    PermissionDenied,
    PicketError,
    RequestAbandoned,
    SessionLost,
    StaleToken,
    TokenMismatch,
    Unauthenticated,
    Unavailable,
    UnknownSession,
    VotersNotAnswering,
    WaitEnded,
    WaitTimedOut,
)

__all__ = [
    "AlreadyWaiting",
    "AsyncClient",
    "AsyncGrant",
    "AsyncSession",
    "BadRequest",
    "Client",
    "Exhausted",
    "FenceRefused",
    "Grant",
    "LockBusy",
    "LockDelayed",
    "NotFound",
    "NotHeld",
    "NotLeader",
    "NothingToAbandon",
    "NotWaiting",
    "OtherCluster",
    "OutcomeUnknown",
    "PermissionDenied",
    "PicketError",
    "RequestAbandoned",
    "Sequencer",
    "Session",
    "SessionLost",
    "StaleToken",
    "TokenMismatch",
    "Unauthenticated",
    "Unavailable",
    "UnknownSession",
    "VotersNotAnswering",
    "WaitEnded",
    "WaitTimedOut",
    "fence",
]
