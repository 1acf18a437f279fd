"""Fixtures: a real ``picket serve`` (and ``picket kv serve``, and PostgreSQL) on free loopback
ports, started for a test and stopped after it."""

from __future__ import annotations

import contextlib
import os
import pathlib
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from typing import Iterator, List

import httpx
import pytest

REPO = pathlib.Path(__file__).resolve().parents[3]


def picket_bin() -> str:
    path = pathlib.Path(os.environ.get("PICKET_BIN", REPO / "target" / "debug" / "picket"))
    if not path.exists():
        pytest.fail(f"{path} is missing: build it with `cargo build -p picket` (scripts/test.sh does)")
    return str(path)


def _ephemeral_low() -> int:
    try:
        return int(pathlib.Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


# Ports handed out so far, from a start drawn once per process. A port the kernel picks (bind to
# port 0) lies in its ephemeral range, where any outgoing connection may be given it before the
# server binds it, or while a restarted server is down; these lie below that range instead.
_LOWEST_PORT = 10000
_next_port = [os.getpid() * 7919 % 4096]


def free_port() -> int:
    span = _ephemeral_low() - _LOWEST_PORT
    if span < 1000:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            return int(probe.getsockname()[1])
    for _ in range(span):
        port = _LOWEST_PORT + _next_port[0] % span
        _next_port[0] += 1
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise AssertionError(f"no free loopback port between {_LOWEST_PORT} and {_LOWEST_PORT + span}")


def wait_until(what: str, timeout_s: float, condition: "object") -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if callable(condition) and condition():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


class Process:
    """A child process that prints ``... listening on ADDR ...`` first."""

    def __init__(self, args: List[str]) -> None:
        self.log = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=self.log, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if "listening on " not in line:
            self.stop()
            self.log.seek(0)
            raise AssertionError(f"{' '.join(args)} did not start: {line!r} {self.log.read()}")
        self.addr = line.split("listening on ", 1)[1].split()[0]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


class Server(Process):
    def __init__(self, data_dir: pathlib.Path) -> None:
        super().__init__(
            [picket_bin(), "serve", "--listen", "127.0.0.1:0", "--data-dir", str(data_dir),
             "--wal-segment-bytes", "1048576"]
        )
        wait_until("the node to be ready", 20, self.ready)

    def ready(self) -> bool:
        try:
            return httpx.get(f"http://{self.addr}/readyz").status_code == 200
        except httpx.HTTPError:
            return False


@pytest.fixture
def server(tmp_path: pathlib.Path) -> Iterator[Server]:
    node = Server(tmp_path / "picket")
    yield node
    node.stop()


@pytest.fixture
def kv(server: Server, tmp_path: pathlib.Path) -> Iterator[Process]:
    """``picket kv serve`` guarding the prefix ``res/`` with the lock ``res``."""
    store = Process(
        [picket_bin(), "--endpoints", server.addr, "kv", "serve", "--listen", "127.0.0.1:0",
         "--data-dir", str(tmp_path / "kv"), "--guard", "res/=res"]
    )
    yield store
    store.stop()


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class Postgres:
    """A PostgreSQL server of its own (initdb in a temporary directory), as the Rust fence tests
    run it; as the ``postgres`` user when the tests run as root (initdb refuses root)."""

    def __init__(self, root: pathlib.Path) -> None:
        versions = sorted(pathlib.Path("/usr/lib/postgresql").glob("*/bin/initdb"))
        if not versions:
            pytest.fail("PostgreSQL's server binaries are missing: apt-get install postgresql (scripts/test.sh does)")
        self.bin = versions[-1].parent
        self.root = root
        self.as_postgres = os.geteuid() == 0
        if self.as_postgres:
            shutil.chown(root, "postgres", "postgres")
        self.port = free_port()
        self.data = root / "data"
        self.run("initdb", "-A", "trust", "-U", "postgres", "-D", str(self.data))
        options = f"-p {self.port} -k {root} -c listen_addresses=127.0.0.1"
        self.run("pg_ctl", "start", "-w", "-t", "60", "-D", str(self.data), "-l", str(root / "log"), "-o", options)
        self.dsn = f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres"

    def run(self, program: str, *args: str) -> None:
        command = [str(self.bin / program), *args]
        if self.as_postgres:
            command = ["runuser", "-u", "postgres", "--", *command]
        done = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if done.returncode != 0:
            raise AssertionError(f"{program} failed: {done.stderr}")

    def stop(self) -> None:
        self.run("pg_ctl", "stop", "-m", "fast", "-w", "-D", str(self.data))


@pytest.fixture(scope="session")
def postgres() -> Iterator[Postgres]:
    # Directly under /tmp: the postgres user must be able to reach it, and pytest's own
    # temporary directories are private to the user running the tests.
    root = pathlib.Path(tempfile.mkdtemp(prefix="picket-pg-"))
    server = Postgres(root)
    yield server
    server.stop()
    shutil.rmtree(root, ignore_errors=True)


class AnswerSwallowingProxy:
    """A TCP proxy to the server that, once ``swallow`` is set, forwards every request and drops
    every answer. The server sees no broken connection while it answers, so it undoes nothing
    itself: what a client gave up on stays done unless the client undoes it. Once ``cut`` is
    set, it drops the requests too: an outage."""

    def __init__(self, upstream: str) -> None:
        host, port = upstream.rsplit(":", 1)
        self.upstream = (host, int(port))
        self.swallow = threading.Event()
        self.cut = threading.Event()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.addr = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.sockets: List[socket.socket] = [self.listener]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                inbound, _ = self.listener.accept()
            except OSError:
                return
            outbound = socket.create_connection(self.upstream)
            self.sockets += [inbound, outbound]
            threading.Thread(target=self._pump, args=(inbound, outbound, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(outbound, inbound, True), daemon=True).start()

    def _pump(self, source: socket.socket, target: socket.socket, answers: bool) -> None:
        try:
            while True:
                data = source.recv(65536)
                if not data:
                    break
                if not (self.cut.is_set() or (answers and self.swallow.is_set())):
                    target.sendall(data)
        except OSError:
            pass
        with contextlib.suppress(OSError):
            target.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        for sock in self.sockets:
            with contextlib.suppress(OSError):
                sock.close()
