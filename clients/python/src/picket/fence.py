"""Fencing at the resource: the admission rule in PostgreSQL, and the sequencer on HTTP calls.

PostgreSQL (``pip install picket[postgres]``, psycopg 3): run :func:`migrate` once (it is
idempotent), then call :func:`admit` *inside the transaction that writes*. It refuses a write
whose token is older than the newest the resource has admitted, in the same transaction as the
write, and raises :class:`~picket.errors.StaleToken` with both tokens::

    with conn.transaction():
        picket.fence.admit(conn, "accounts/42", grant.sequencer)
        conn.execute("UPDATE accounts SET balance = %s WHERE id = 42", (balance,))

The function trusts the sequencer it is given: a signed ``p2.`` sequencer must be verified
before it reaches the database (the Rust ``picket_fence::postgres::admit_signed`` does; this
module does not verify signatures yet).

HTTP resources: :class:`SequencerAuth` adds ``Picket-Sequencer`` to every request of an
``httpx`` client or a ``requests`` session; :func:`headers` gives the header for one call.
"""

from __future__ import annotations

from importlib import resources
from typing import TYPE_CHECKING, Any, Dict, Optional, Union

from ._common import Sequencer
from .errors import FenceRefused, StaleToken

if TYPE_CHECKING:
    import psycopg

    Executor = Union["psycopg.Connection[Any]", "psycopg.Cursor[Any]"]
    AsyncExecutor = Union["psycopg.AsyncConnection[Any]", "psycopg.AsyncCursor[Any]"]

#: The header fenced HTTP resources read.
SEQUENCER_HEADER = "Picket-Sequencer"


def migration() -> str:
    """The SQL that installs the fence's table and functions: the same text the Rust
    ``picket_fence::postgres::MIGRATION`` runs (a test keeps them identical)."""
    return resources.files("picket").joinpath("picket_fence.sql").read_text(encoding="utf-8")


def migrate(conn: "Executor") -> None:
    """Installs or updates the fence in the database of ``conn``. Idempotent."""
    conn.execute(migration().encode())


async def migrate_async(conn: "AsyncExecutor") -> None:
    """:func:`migrate` for psycopg's asyncio connections."""
    await conn.execute(migration().encode())


_ADMIT = "SELECT admitted, reason, highest_token FROM picket_fence_admit(%s, %s, %s, %s, %s, %s)"
_REGISTER = "SELECT admitted, reason, highest_token FROM picket_fence_register(%s, %s, %s, %s, %s)"


def _admit_params(
    resource: str, sequencer: Union[str, Sequencer], lock: Optional[str], strict: bool, seq: Optional[int]
) -> "tuple[Sequencer, tuple[Any, ...]]":
    parsed = sequencer if isinstance(sequencer, Sequencer) else Sequencer.parse(str(sequencer))
    return parsed, (resource, lock or parsed.lock, strict, parsed.lock, parsed.token, seq)


def _require_transaction(conn: Any, sequencer: Sequencer) -> None:
    """Refuses a connection in autocommit mode outside a transaction: there the function's row
    lock ends with its own statement, so the check and the caller's write would be two steps,
    and a writer admitted then paused could write after a newer token was admitted. (A
    connection without autocommit, psycopg's default, opens a transaction with the statement.)"""
    connection = getattr(conn, "connection", conn)
    if not getattr(connection, "autocommit", False):
        return
    status = getattr(getattr(connection, "info", None), "transaction_status", None)
    # Outside a transaction the status is IDLE (or ACTIVE, a command under way in pipeline
    # mode); inside one INTRANS, or INERROR after a failed statement (which fails this too).
    if getattr(status, "name", None) not in ("INTRANS", "INERROR"):
        raise FenceRefused(
            "picket.fence.admit needs a transaction: this connection is in autocommit mode and "
            "outside one, so the check and the write would not be one step; call it inside "
            "`with conn.transaction():` with the write",
            reason="no_transaction",
            lock=sequencer.lock,
            presented_token=sequencer.token,
            highest_token=None,
        )


def _decide(row: Optional["tuple[Any, ...]"], sequencer: Sequencer, resource: str) -> str:
    if row is None:
        raise FenceRefused(
            "the fence function answered nothing: run picket.fence.migrate()",
            reason="unexpected",
            lock=sequencer.lock,
            presented_token=sequencer.token,
            highest_token=None,
        )
    admitted, reason, highest = bool(row[0]), str(row[1]), int(row[2])
    if admitted:
        return reason
    message = (
        f"write to {resource!r} refused ({reason}): token {sequencer.token} of lock "
        f"{sequencer.lock!r}, the resource has seen token {highest}"
    )
    if reason == "stale_token":
        message += "; your grant was superseded, re-acquire the lock and re-read before writing"
        raise StaleToken(message, reason=reason, lock=sequencer.lock, presented_token=sequencer.token, highest_token=highest)
    raise FenceRefused(message, reason=reason, lock=sequencer.lock, presented_token=sequencer.token, highest_token=highest)


def admit(
    conn: "Executor",
    resource: str,
    sequencer: Union[str, Sequencer],
    *,
    lock: Optional[str] = None,
    strict: bool = False,
    seq: Optional[int] = None,
) -> str:
    """Admits a write to ``resource`` under ``sequencer`` in the caller's transaction, or
    raises :class:`~picket.errors.StaleToken` (a newer token was admitted) or
    :class:`~picket.errors.FenceRefused` (another reason); roll the transaction back then.
    ``lock`` is the lock that guards the resource (default: the sequencer's own); returns the
    admission: ``advanced`` (a newer token) or ``same``."""
    parsed, params = _admit_params(resource, sequencer, lock, strict, seq)
    _require_transaction(conn, parsed)
    row = conn.execute(_ADMIT, params).fetchone()
    return _decide(row, parsed, resource)


async def admit_async(
    conn: "AsyncExecutor",
    resource: str,
    sequencer: Union[str, Sequencer],
    *,
    lock: Optional[str] = None,
    strict: bool = False,
    seq: Optional[int] = None,
) -> str:
    """:func:`admit` for psycopg's asyncio connections."""
    parsed, params = _admit_params(resource, sequencer, lock, strict, seq)
    _require_transaction(conn, parsed)
    cursor = await conn.execute(_ADMIT, params)
    return _decide(await cursor.fetchone(), parsed, resource)


def register(
    conn: "Executor", resource: str, sequencer: Union[str, Sequencer], *, lock: Optional[str] = None, strict: bool = False
) -> None:
    """Fence on acquire: makes the grant's token the resource's highest before any write, so a
    superseded holder is refused even before the new holder writes."""
    parsed, params = _admit_params(resource, sequencer, lock, strict, None)
    _decide(conn.execute(_REGISTER, params[:5]).fetchone(), parsed, resource)


def headers(sequencer: Union[str, Sequencer, Any]) -> Dict[str, str]:
    """``{"Picket-Sequencer": ...}`` for a grant or a sequencer, to pass to one HTTP call."""
    return {SEQUENCER_HEADER: str(getattr(sequencer, "sequencer", sequencer))}


class SequencerAuth:
    """Adds the grant's sequencer to every request: ``httpx.Client(auth=SequencerAuth(grant))``
    or ``requests_session.auth = SequencerAuth(grant)``."""

    def __init__(self, grant: Any) -> None:
        self.sequencer = str(getattr(grant, "sequencer", grant))

    def __call__(self, request: Any) -> Any:
        request.headers[SEQUENCER_HEADER] = self.sequencer
        return request
