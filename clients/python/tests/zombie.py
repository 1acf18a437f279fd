"""A client that takes a lock, says so, and writes through the PostgreSQL fence when told to,
whatever happened in between: the test stops this process (SIGSTOP) past its TTL, as a GC pause
or a descheduled VM would, so the write it sends on waking is a zombie's.

Usage: python zombie.py ENDPOINT DSN sync|async
"""

from __future__ import annotations

import asyncio
import sys

import psycopg

import picket


def write(dsn: str, sequencer: str) -> None:
    try:
        with psycopg.connect(dsn) as conn:
            with conn.transaction():
                picket.fence.admit(conn, "accounts/1", sequencer)
                conn.execute("UPDATE accounts SET owner = 'zombie' WHERE id = 1")
        print("admitted", flush=True)
    except picket.StaleToken as refused:
        print("refused", refused.reason, refused.presented_token, refused.highest_token, flush=True)


def run_sync(endpoint: str, dsn: str) -> None:
    client = picket.Client([endpoint])
    session = client.session(ttl=1)
    grant = session.lock("accounts/1", wait=10)
    print("holding", grant.token, flush=True)
    sys.stdin.readline()
    write(dsn, grant.sequencer)


async def run_async(endpoint: str, dsn: str) -> None:
    client = picket.AsyncClient([endpoint])
    session = await client.session(ttl=1)
    grant = await session.lock("accounts/1", wait=10)
    print("holding", grant.token, flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    try:
        async with await psycopg.AsyncConnection.connect(dsn) as conn:
            async with conn.transaction():
                await picket.fence.admit_async(conn, "accounts/1", grant.sequencer)
                await conn.execute("UPDATE accounts SET owner = 'zombie' WHERE id = 1")
        print("admitted", flush=True)
    except picket.StaleToken as refused:
        print("refused", refused.reason, refused.presented_token, refused.highest_token, flush=True)


if __name__ == "__main__":
    endpoint, dsn, mode = sys.argv[1:4]
    if mode == "async":
        asyncio.run(run_async(endpoint, dsn))
    else:
        run_sync(endpoint, dsn)
