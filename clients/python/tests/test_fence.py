"""The seeds' canonical race with real processes and a real PostgreSQL: a Python client takes
the lock and is stopped (SIGSTOP) past its TTL; another takes over and writes through the fence;
the first wakes and writes with its old token, and the fence refuses it with both tokens."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import pathlib

import psycopg
import pytest

import picket
from conftest import Postgres, Server, wait_until

ZOMBIE = pathlib.Path(__file__).with_name("zombie.py")


def prepare(postgres: Postgres) -> None:
    with psycopg.connect(postgres.dsn, autocommit=True) as conn:
        picket.fence.migrate(conn)
        picket.fence.migrate(conn)  # idempotent
        conn.execute("DROP TABLE IF EXISTS accounts")
        conn.execute("CREATE TABLE accounts (id int PRIMARY KEY, owner text)")
        conn.execute("INSERT INTO accounts VALUES (1, 'nobody')")
        conn.execute("DELETE FROM picket_fence")


def owner(postgres: Postgres) -> str:
    with psycopg.connect(postgres.dsn) as conn:
        row = conn.execute("SELECT owner FROM accounts WHERE id = 1").fetchone()
        assert row is not None
        return str(row[0])


def start_zombie(server: Server, postgres: Postgres, mode: str) -> "tuple[subprocess.Popen[str], int]":
    env = dict(os.environ, PYTHONPATH=str(ZOMBIE.parent))
    zombie = subprocess.Popen(
        [sys.executable, str(ZOMBIE), server.addr, postgres.dsn, mode],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
    )
    assert zombie.stdout is not None
    holding = zombie.stdout.readline().split()
    assert holding[0] == "holding", holding
    return zombie, int(holding[1])


def wake_and_write(zombie: "subprocess.Popen[str]") -> "list[str]":
    os.kill(zombie.pid, signal.SIGCONT)
    assert zombie.stdin is not None and zombie.stdout is not None
    zombie.stdin.write("go\n")
    zombie.stdin.flush()
    answer = zombie.stdout.readline().split()
    zombie.wait(20)
    return answer


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_canonical_race_a_paused_python_process_is_refused_by_the_postgresql_fence(
    server: Server, postgres: Postgres, mode: str
) -> None:
    prepare(postgres)
    zombie, old_token = start_zombie(server, postgres, mode)
    os.kill(zombie.pid, signal.SIGSTOP)
    try:
        with picket.Client([server.addr]) as client:
            # The stopped client sends no keepalive: its session expires, the lock moves on.
            with client.lock("accounts/1", ttl=5, wait=15) as grant:
                assert grant.token > old_token
                with psycopg.connect(postgres.dsn) as conn:
                    with conn.transaction():
                        assert picket.fence.admit(conn, "accounts/1", grant.sequencer) == "advanced"
                        conn.execute("UPDATE accounts SET owner = 'current' WHERE id = 1")
                answer = wake_and_write(zombie)
                assert answer == ["refused", "stale_token", str(old_token), str(grant.token)], answer
    finally:
        if zombie.poll() is None:
            os.kill(zombie.pid, signal.SIGCONT)
            zombie.kill()
    assert owner(postgres) == "current"


@pytest.mark.anyio
async def test_the_async_fence_helpers_admit_and_refuse(server: Server, postgres: Postgres) -> None:
    prepare(postgres)
    async with picket.AsyncClient([server.addr]) as client:
        async with client.lock("accounts/1", ttl=5) as old:
            pass
        async with client.lock("accounts/1", ttl=5) as current:
            async with await psycopg.AsyncConnection.connect(postgres.dsn) as conn:
                async with conn.transaction():
                    assert await picket.fence.admit_async(conn, "accounts/1", current.sequencer) == "advanced"
                with pytest.raises(picket.StaleToken) as refused:
                    async with conn.transaction():
                        await picket.fence.admit_async(conn, "accounts/1", old.sequencer)
                assert (refused.value.presented_token, refused.value.highest_token) == (old.token, current.token)
                assert refused.value.lock == "accounts/1"


def test_fence_on_acquire_in_postgresql_refuses_the_old_holder_before_the_new_one_writes(
    server: Server, postgres: Postgres
) -> None:
    prepare(postgres)
    with picket.Client([server.addr]) as client:
        with client.lock("accounts/1", ttl=5) as old:
            pass
        with client.lock("accounts/1", ttl=5) as current:
            with psycopg.connect(postgres.dsn) as conn:
                with conn.transaction():
                    picket.fence.register(conn, "accounts/1", current.sequencer)
                with pytest.raises(picket.StaleToken):
                    with conn.transaction():
                        picket.fence.admit(conn, "accounts/1", old.sequencer)


def test_a_lock_name_with_escaped_characters_is_the_name_the_fence_binds(server: Server, postgres: Postgres) -> None:
    """A sequencer escapes the bytes of its lock's name outside ``A-Za-z0-9-_.~/``. The fence
    binds the name itself, as the Rust fence does: the escaped text used to be taken for the
    name, so a resource bound to ``tenant:42/orders`` refused every write as ``wrong_lock``."""
    name = "tenant:42/orders été"
    prepare(postgres)
    with picket.Client([server.addr]) as client:
        with client.lock(name, ttl=5) as grant:
            assert grant.sequencer == f"p1.{grant.token}.tenant%3A42/orders%20%C3%A9t%C3%A9"
            assert picket.Sequencer.parse(grant.sequencer).lock == name
            with psycopg.connect(postgres.dsn) as conn:
                with conn.transaction():
                    assert picket.fence.admit(conn, "orders", grant.sequencer, lock=name) == "advanced"
    for malformed in ["p1.7.a%2", "p1.7.a%zz", "p1.7.%FF", "p1.7.a\nb", "p1.7.%"]:
        with pytest.raises(ValueError):
            picket.Sequencer.parse(malformed)


def test_admit_refuses_an_autocommit_connection_outside_a_transaction(server: Server, postgres: Postgres) -> None:
    """Found in review: outside a transaction the fence function's row lock ends with its own
    statement, so an admitted writer that paused could write after a newer token was admitted.
    ``admit`` refuses an autocommit connection outside a transaction, and works inside one or
    on a connection without autocommit (psycopg opens a transaction with the statement)."""
    prepare(postgres)
    with picket.Client([server.addr]) as client:
        with client.lock("accounts/1", ttl=5) as grant:
            with psycopg.connect(postgres.dsn, autocommit=True) as conn:
                with pytest.raises(picket.FenceRefused) as refused:
                    picket.fence.admit(conn, "accounts/1", grant.sequencer)
                assert refused.value.reason == "no_transaction"
                assert "conn.transaction()" in str(refused.value)
                with conn.transaction():
                    assert picket.fence.admit(conn, "accounts/1", grant.sequencer) == "advanced"
            with psycopg.connect(postgres.dsn) as conn:
                assert picket.fence.admit(conn, "accounts/1", grant.sequencer) == "same"
                conn.commit()
