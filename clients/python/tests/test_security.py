"""TLS, bearer tokens and client certificates against a real ``picket serve`` that requires
them (``--tls-cert``, ``--peer-ca``, ``--tls-client-ca``, ``--auth-file``), with certificates
made by ``openssl`` as the main README's TLS section makes them."""

from __future__ import annotations

import pathlib
import subprocess
from typing import Iterator

import httpx
import pytest

import picket
from conftest import Process, picket_bin, wait_until

pytestmark = pytest.mark.anyio


class Secured:
    """A node that takes only TLS, and only the principals of its auth file."""

    def __init__(self, root: pathlib.Path) -> None:
        self.root = root
        for ca in ["peer", "client"]:
            self.openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                         "-days", "2", "-subj", f"/CN=picket {ca} CA", "-keyout", f"{ca}-ca-key.pem", "-out", f"{ca}-ca.pem")
        self.issue("node", "peer", "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n")
        self.issue("alice", "client", "subjectAltName=DNS:alice\nextendedKeyUsage=clientAuth\n")
        made = subprocess.run([picket_bin(), "auth", "token"], check=True, capture_output=True, text=True).stdout
        self.token = made.split("token: ", 1)[1].split()[0]
        digest_line = next(line for line in made.splitlines() if line.startswith("token_sha256"))
        (root / "auth.toml").write_text(
            f'[[principal]]\nname = "worker"\n{digest_line}\nlock = ["jobs/"]\n\n'
            '[[principal]]\nname = "alice"\ncertificate_names = ["alice"]\nlock = ["alice/"]\n'
        )
        self.process = Process([
            picket_bin(), "serve", "--listen", "127.0.0.1:0", "--data-dir", str(root / "data"),
            "--wal-segment-bytes", "1048576",
            "--tls-cert", str(root / "node.pem"), "--tls-key", str(root / "node-key.pem"),
            "--peer-ca", str(root / "peer-ca.pem"), "--tls-client-ca", str(root / "client-ca.pem"),
            "--auth-file", str(root / "auth.toml"),
        ])
        self.url = f"https://{self.process.addr}"
        self.ca = str(root / "peer-ca.pem")
        wait_until("the node to be ready", 20, self.ready)

    def openssl(self, *args: str) -> None:
        subprocess.run(["openssl", *args], check=True, cwd=self.root, capture_output=True)

    def issue(self, name: str, ca: str, extensions: str) -> None:
        self.openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                     "-subj", f"/CN={name}", "-keyout", f"{name}-key.pem", "-out", f"{name}.csr")
        (self.root / f"{name}.ext").write_text(extensions)
        self.openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}-ca.pem", "-CAkey", f"{ca}-ca-key.pem",
                     "-days", "2", "-extfile", f"{name}.ext", "-out", f"{name}.pem")

    def ready(self) -> bool:
        try:
            return httpx.get(f"{self.url}/readyz", verify=picket._transport.tls(self.ca, None)).status_code == 200
        except httpx.HTTPError:
            return False


@pytest.fixture
def secured(tmp_path: pathlib.Path) -> Iterator[Secured]:
    node = Secured(tmp_path)
    yield node
    node.process.stop()


def test_a_bearer_token_over_tls_takes_the_locks_its_role_covers(secured: Secured) -> None:
    with picket.Client([secured.url], token=secured.token, verify=secured.ca) as client:
        with client.lock("jobs/report", ttl=5) as grant:
            assert grant.token > 0
            assert client.check(grant.sequencer)["status"] == "current"
        with pytest.raises(picket.PermissionDenied):
            with client.lock("other/report", ttl=5):
                pass
    with picket.Client([secured.url], verify=secured.ca) as anonymous:
        with pytest.raises(picket.Unauthenticated):
            anonymous.session(ttl=5)


def test_a_client_certificate_names_its_principal(secured: Secured) -> None:
    root = secured.root
    alice = (str(root / "alice.pem"), str(root / "alice-key.pem"))
    with picket.Client([secured.url], verify=secured.ca, cert=alice) as client:
        with client.lock("alice/notes", ttl=5) as grant:
            assert grant.token > 0
        with pytest.raises(picket.PermissionDenied):
            with client.lock("jobs/report", ttl=5):
                pass


def test_a_node_whose_certificate_the_client_does_not_trust_is_refused(secured: Secured) -> None:
    with picket.Client([secured.url], token=secured.token, timeout=2) as client:
        with pytest.raises(picket.PicketError):
            client.session(ttl=5)


async def test_the_asyncio_client_speaks_tls_with_a_token(secured: Secured) -> None:
    async with picket.AsyncClient([secured.url], token=secured.token, verify=secured.ca) as client:
        async with client.lock("jobs/async", ttl=5) as grant:
            assert (await client.check(grant.sequencer))["status"] == "current"
