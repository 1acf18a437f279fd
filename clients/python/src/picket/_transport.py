"""HTTP/JSON transport: a list of endpoints, the leader followed on ``not_leader``, and retries
of only what is safe to retry.

A request that never left (the connection was refused) is retried on the next endpoint, whatever
it is; a request whose answer was lost is retried only if ``safe`` (reads, keepalives, and
acquires, which carry a request id and an attempt number so that the server applies them once);
otherwise it raises :class:`~picket.errors.OutcomeUnknown`. ``unavailable`` (no leader yet) is
retried until the deadline.
"""

from __future__ import annotations

import ssl
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import httpx

from .errors import NotLeader, OutcomeUnknown, PicketError, Unavailable, from_response

Json = Dict[str, Any]

#: A request's path, or a function that gives it afresh for each attempt (a path that carries a
#: reading of the client's clock must carry one taken as that attempt is sent: a retry that
#: resent an earlier reading would make the clock look faster than it is).
Path = Union[str, Callable[[], str]]
Verify = Union[bool, str]
#: A client certificate and its key (PEM files), for nodes that take certificates.
Cert = Optional[Tuple[str, str]]

#: Pause between attempts while the cluster has no leader.
RETRY_PAUSE_S = 0.1


def _path_now(path: Path) -> str:
    return path if isinstance(path, str) else path()


def normalize(endpoint: str) -> str:
    """``host:port`` or a URL, as a base URL without a trailing slash."""
    endpoint = endpoint.strip().rstrip("/")
    if "://" not in endpoint:
        endpoint = "http://" + endpoint
    return endpoint


class _Endpoints:
    """Which endpoint to try next: the known leader first, then each in turn."""

    def __init__(self, endpoints: Sequence[str]) -> None:
        if not endpoints:
            raise ValueError("give at least one endpoint, e.g. ['127.0.0.1:7687']")
        self.all: List[str] = [normalize(endpoint) for endpoint in endpoints]
        self.configured = len(self.all)
        self.current = 0

    def url(self) -> str:
        return self.all[self.current]

    def next(self) -> None:
        self.current = (self.current + 1) % len(self.all)

    def follow(self, leader: Optional[str]) -> None:
        if not leader:
            self.next()
            return
        scheme = self.all[0].split("://", 1)[0]
        url = normalize(leader if "://" in leader else f"{scheme}://{leader}")
        if url not in self.all:
            # The configured endpoints and the last leader named: every name was kept for the
            # client's life, so moved nodes, or a node naming aliases of itself, made the list
            # (and each failover's round through it) grow without bound (found in review).
            # One slice assignment: the list never looks shorter to another thread's `url()`.
            self.all[self.configured :] = [url]
        try:
            self.current = self.all.index(url)
        except ValueError:
            # Another thread named another leader in between (the sync client's threads
            # share this list): this one's wins.
            self.all[self.configured :] = [url]
            self.current = self.configured


def tls(verify: Verify, cert: Cert) -> Union[bool, ssl.SSLContext]:
    """What httpx takes as ``verify``: the default, or a context that trusts ``verify`` (a CA
    bundle) and presents ``cert``."""
    if cert is None and not isinstance(verify, str):
        return verify
    context = ssl.create_default_context(cafile=verify if isinstance(verify, str) else None)
    if verify is False:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if cert is not None:
        context.load_cert_chain(cert[0], cert[1])
    return context


def _headers(token: Optional[str]) -> Dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


class _Attempts:
    """The retry rule, shared by the sync and async transports."""

    def __init__(self, endpoints: _Endpoints, timeout_s: float) -> None:
        self.endpoints = endpoints
        self.deadline = time.monotonic() + timeout_s
        self.last: Optional[BaseException] = None

    def expired(self) -> bool:
        return time.monotonic() >= self.deadline

    def unsent(self, error: BaseException) -> None:
        self.last = error
        self.endpoints.next()

    def answered(self, response: httpx.Response) -> Optional[Json]:
        """The body on success; ``None`` to try again; raises a final error."""
        try:
            body: Json = response.json()
        except ValueError:
            body = {"code": f"http_{response.status_code}", "message": response.text[:200]}
        if response.is_success:
            return body
        error = from_response(response.status_code, body)
        if isinstance(error, NotLeader):
            self.last = error
            self.endpoints.follow(error.leader)
            return None
        if isinstance(error, Unavailable):
            # This node cannot serve now (cut off from a quorum, catching up, just elected):
            # another endpoint may reach the leader, as after a ``not_leader`` naming none.
            self.last = error
            self.endpoints.next()
            return None
        raise error

    def give_up(self, path: str) -> PicketError:
        if isinstance(self.last, PicketError):
            return self.last
        return Unavailable(
            f"no Picket server answered {path} at {', '.join(self.endpoints.all)}: "
            f"start one with `picket serve`, or pass the right endpoints ({self.last})",
            code="unreachable",
        )


def _lost_answer(path: str, error: BaseException) -> OutcomeUnknown:
    return OutcomeUnknown(
        f"the answer to {path} was lost ({error}): read the state before retrying",
        code="outcome_unknown",
        outcome="unknown",
    )


class Transport:
    """Blocking transport over :class:`httpx.Client`."""

    def __init__(
        self,
        endpoints: Sequence[str],
        *,
        token: Optional[str] = None,
        timeout_s: float = 10.0,
        verify: Verify = True,
        cert: Cert = None,
    ) -> None:
        self.endpoints = _Endpoints(endpoints)
        self.timeout_s = timeout_s
        self.token = token
        self.verify = verify
        self.tls = tls(verify, cert)
        self.http = httpx.Client(timeout=timeout_s, verify=self.tls, headers=_headers(token))

    def call(
        self,
        method: str,
        path: Path,
        body: Optional[Json] = None,
        *,
        safe: bool,
        timeout_s: Optional[float] = None,
    ) -> Json:
        attempts = _Attempts(self.endpoints, timeout_s or self.timeout_s)
        shown = ""
        while not attempts.expired():
            shown = _path_now(path)
            url = self.endpoints.url() + shown
            try:
                response = self.http.request(method, url, json=body, timeout=timeout_s or self.timeout_s)
            except (httpx.ConnectError, httpx.ConnectTimeout) as error:
                attempts.unsent(error)
                time.sleep(RETRY_PAUSE_S / 4)
                continue
            except httpx.TransportError as error:
                if not safe:
                    raise _lost_answer(shown, error) from error
                attempts.unsent(error)
                continue
            answer = attempts.answered(response)
            if answer is not None:
                return answer
            time.sleep(RETRY_PAUSE_S)
        raise attempts.give_up(shown or _path_now(path))

    def close(self) -> None:
        self.http.close()


class AsyncTransport:
    """The same rules over :class:`httpx.AsyncClient`."""

    def __init__(
        self,
        endpoints: Sequence[str],
        *,
        token: Optional[str] = None,
        timeout_s: float = 10.0,
        verify: Verify = True,
        cert: Cert = None,
    ) -> None:
        self.endpoints = _Endpoints(endpoints)
        self.timeout_s = timeout_s
        self.token = token
        self.verify = verify
        self.tls = tls(verify, cert)
        self.http = httpx.AsyncClient(timeout=timeout_s, verify=self.tls, headers=_headers(token))

    async def call(
        self,
        method: str,
        path: Path,
        body: Optional[Json] = None,
        *,
        safe: bool,
        timeout_s: Optional[float] = None,
    ) -> Json:
        import asyncio

        attempts = _Attempts(self.endpoints, timeout_s or self.timeout_s)
        shown = ""
        while not attempts.expired():
            shown = _path_now(path)
            url = self.endpoints.url() + shown
            try:
                response = await self.http.request(
                    method, url, json=body, timeout=timeout_s or self.timeout_s
                )
            except (httpx.ConnectError, httpx.ConnectTimeout) as error:
                attempts.unsent(error)
                await asyncio.sleep(RETRY_PAUSE_S / 4)
                continue
            except httpx.TransportError as error:
                if not safe:
                    raise _lost_answer(shown, error) from error
                attempts.unsent(error)
                continue
            answer = attempts.answered(response)
            if answer is not None:
                return answer
            await asyncio.sleep(RETRY_PAUSE_S)
        raise attempts.give_up(shown or _path_now(path))

    async def close(self) -> None:
        await self.http.aclose()
