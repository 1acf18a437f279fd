"""HTTP/JSON transport: a list of endpoints, the leader followed on ``not_leader``, and retries
of only what is safe to retry.

A request that never left (the connection was refused) is retried on the next endpoint, whatever
it is; a request whose answer was lost is retried only if ``safe`` (reads, keepalives, and
acquires, which carry a request id and an attempt number so that the server applies them once);
otherwise it raises :class:`~picket.errors.OutcomeUnknown`. ``unavailable`` (no leader yet) is
retried until the deadline.
"""

from __future__ import annotations

import asyncio
import ssl
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import httpx

from ._common import nothing_reached
from .errors import NotLeader, OtherCluster, OutcomeUnknown, PicketError, Unavailable, from_response

Json = Dict[str, Any]

#: A request's path, or a function that gives it afresh for each attempt (a path that carries a
#: reading of the client's clock must carry one taken as that attempt is sent: a retry that
#: resent an earlier reading would make the clock look faster than it is).
Path = Union[str, Callable[[], str]]
#: A request's JSON body, or a function that gives it afresh for each attempt (an acquire
#: numbers its attempts: the service abandons an attempt it answered ``unavailable``, and
#: refuses that attempt's number from then on).
Body = Union[Json, Callable[[], Json], None]
Verify = Union[bool, str]
#: A client certificate and its key (PEM files), for nodes that take certificates.
Cert = Optional[Tuple[str, str]]

#: Pause between attempts while the cluster has no leader.
RETRY_PAUSE_S = 0.1

#: The header on a node's answers that names its cluster, once the cluster is named.
CLUSTER_ID_HEADER = "picket-cluster-id"
#: The header that names the cluster a request expects: a node of another one refuses it.
EXPECT_CLUSTER_HEADER = "picket-expect-cluster"
#: The header that lets a cluster restored from the expected one take the request.
FOLLOW_RESTORE_HEADER = "picket-follow-restore"
#: How long a node found to know no cluster id is not asked again before a request.
UNNAMED_PROBE_PAUSE_S = 1.0


def _path_now(path: Path) -> str:
    return path if isinstance(path, str) else path()


def _body_now(body: Body) -> Optional[Json]:
    return body() if callable(body) else body


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


class _Cluster:
    """The cluster the client keeps to: the one given, else the first named one that answered.

    Session ids of two clusters coincide, so a client whose endpoints name nodes of two clusters
    would keep alive, release or acquire in another client's session. Every request carries the
    id once known (``picket-expect-cluster``), and a named node of another cluster refuses it
    (``other_cluster``) before anything else. Until the client knows its cluster, it asks a node
    first (``GET /healthz``, whose answer names the node's cluster) before sending it anything
    that could change state, one probe at a time, so that no request goes out unchecked once a
    cluster is named. A cluster restored from a backup of the client's (its sessions may go on
    there) is followed the same way: a probe that says ``picket-follow-restore``, sent only once
    no configured node of the client's own cluster can be reached, so that a copy restored while
    the cluster it came from runs on (a staging copy of production) does not draw the client
    away."""

    def __init__(self, cluster_id: Optional[str], headers: httpx.Headers, endpoints: _Endpoints) -> None:
        self.headers = headers
        self.endpoints = endpoints
        self.id: Optional[str] = None
        #: The endpoints found to be nodes of the kept cluster, and whether the last attempt
        #: to reach each did.
        self.own: Dict[str, bool] = {}
        #: Endpoints whose node knew no cluster id, and until when they are not asked again.
        self.unnamed_until: Dict[str, float] = {}
        #: One probe at a time (the sync client's threads share the transport).
        self.lock = threading.Lock()
        if cluster_id:
            self._keep(cluster_id)

    def _keep(self, cluster_id: str) -> None:
        self.id = cluster_id
        self.own.clear()
        self.headers[EXPECT_CLUSTER_HEADER] = cluster_id

    def unreachable(self, url: str, error: BaseException) -> None:
        """Notes that no connection to ``url`` could be made (``error``). Only nothing being
        there counts (:func:`~picket._common.nothing_reached`): a failed TLS handshake says
        something listens, perhaps a node of the client's cluster whose certificate the client
        does not trust, and a restore must not draw the client away from it."""
        if url in self.own and nothing_reached(url, error):
            self.own[url] = False

    def _own_gone(self) -> bool:
        configured = set(self.endpoints.all[: self.endpoints.configured])
        reached = [ok for url, ok in self.own.items() if url in configured] or list(self.own.values())
        return bool(reached) and not any(reached)

    def probe_headers(self, url: str) -> Optional[Dict[str, str]]:
        """The headers of a probe to send ``url`` before a request, or ``None`` when none is
        due: the client does not know its cluster yet (and the node was not found unnamed a
        moment ago), or it may follow a restore of it."""
        if self.id is None:
            return {} if time.monotonic() >= self.unnamed_until.get(url, 0.0) else None
        return {FOLLOW_RESTORE_HEADER: "1"} if self._own_gone() else None

    def stream_headers(self) -> Dict[str, str]:
        """What a request on a client of its own (a watch stream) says: the cluster the client
        keeps to now, which may have changed since that client was made."""
        return {EXPECT_CLUSTER_HEADER: self.id} if self.id else {}

    def observe(self, url: str, response: httpx.Response) -> None:
        """Learns from an answer at ``url`` (a probe's, or a request's) the client's cluster,
        or a restore of it, to keep to."""
        named = response.headers.get(CLUSTER_ID_HEADER)
        if not named:
            if self.id is None:
                self.unnamed_until[url] = time.monotonic() + UNNAMED_PROBE_PAUSE_S
            return
        if named == self.id:
            self.own[url] = True
            return
        if url in self.own:
            # Another cluster where the client's was: restored in place, or the address reused.
            self.own[url] = False
        if response.status_code == 412:
            return
        expected = response.request.headers.get(EXPECT_CLUSTER_HEADER)
        following = response.request.headers.get(FOLLOW_RESTORE_HEADER)
        if (self.id is None and expected is None) or (following and expected == self.id):
            # The first named cluster that answered, or a restore of the client's that took a
            # probe expecting it.
            self._keep(named)
            self.own[url] = True


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

    def __init__(self, endpoints: _Endpoints, cluster: _Cluster, timeout_s: float) -> None:
        self.endpoints = endpoints
        self.cluster = cluster
        self.deadline = time.monotonic() + timeout_s
        self.last: Optional[BaseException] = None
        self.others = 0
        #: Whether a node of the client's own cluster answered (not a node of another).
        self.reached = False

    def expired(self) -> bool:
        return time.monotonic() >= self.deadline

    def unsent(self, error: BaseException, unreachable: Optional[str] = None) -> None:
        """Notes a request that never left (to the endpoint ``unreachable``, when no connection
        to it could be made)."""
        if unreachable:
            self.cluster.unreachable(unreachable, error)
        self.last = error
        self.endpoints.next()

    def answered(self, response: httpx.Response, url: str = "") -> Optional[Json]:
        """The body of ``response`` (from the endpoint ``url``) on success; ``None`` to try
        again; raises a final error."""
        self.cluster.observe(url, response)
        try:
            body: Json = response.json()
        except ValueError:
            body = {"code": f"http_{response.status_code}", "message": response.text[:200]}
        if response.is_success:
            return body
        error = from_response(response.status_code, body)
        if not isinstance(error, OtherCluster):
            self.reached = True
        if isinstance(error, NotLeader):
            self.last = error
            self.endpoints.follow(error.leader)
            return None
        if isinstance(error, OtherCluster):
            # Another endpoint may be of the client's cluster; once each was tried three times
            # over and none of the client's answered, say so now rather than at the deadline.
            self.last = error
            self.others += 1
            if not self.reached and self.others >= 3 * len(self.endpoints.all):
                raise error
            self.endpoints.next()
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


class _ProbeFailed(Exception):
    """A probe of a node's cluster broke after it was sent; the request was not."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


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
        cluster_id: Optional[str] = None,
    ) -> None:
        self.endpoints = _Endpoints(endpoints)
        self.timeout_s = timeout_s
        self.token = token
        self.verify = verify
        self.tls = tls(verify, cert)
        self.http = httpx.Client(timeout=timeout_s, verify=self.tls, headers=_headers(token))
        self.cluster = _Cluster(cluster_id, self.http.headers, self.endpoints)

    def call(
        self,
        method: str,
        path: Path,
        body: Body = None,
        *,
        safe: bool,
        timeout_s: Optional[float] = None,
    ) -> Json:
        attempts = _Attempts(self.endpoints, self.cluster, timeout_s or self.timeout_s)
        shown = ""
        while not attempts.expired():
            shown = _path_now(path)
            endpoint = self.endpoints.url()
            try:
                self._probe(endpoint)
                response = self.http.request(
                    method, endpoint + shown, json=_body_now(body), timeout=timeout_s or self.timeout_s
                )
            except (httpx.ConnectError, httpx.ConnectTimeout) as error:
                attempts.unsent(error, unreachable=endpoint)
                time.sleep(RETRY_PAUSE_S / 4)
                continue
            except _ProbeFailed as failed:
                # Only the probe was sent: the request itself may go elsewhere.
                attempts.unsent(failed.error)
                continue
            except httpx.TransportError as error:
                if not safe:
                    raise _lost_answer(shown, error) from error
                attempts.unsent(error)
                continue
            answer = attempts.answered(response, endpoint)
            if answer is not None:
                return answer
            time.sleep(RETRY_PAUSE_S)
        raise attempts.give_up(shown or _path_now(path))

    def _probe(self, endpoint: str) -> None:
        """Asks ``endpoint`` which cluster it belongs to before a request, when that is due
        (:meth:`_Cluster.probe_headers`), one probe at a time."""
        if self.cluster.probe_headers(endpoint) is None:
            return
        with self.cluster.lock:
            headers = self.cluster.probe_headers(endpoint)
            if headers is None:
                return
            try:
                response = self.http.get(endpoint + "/healthz", headers=headers, timeout=self.timeout_s)
            except (httpx.ConnectError, httpx.ConnectTimeout):
                raise
            except httpx.TransportError as error:
                raise _ProbeFailed(error) from error
            self.cluster.observe(endpoint, response)

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
        cluster_id: Optional[str] = None,
    ) -> None:
        self.endpoints = _Endpoints(endpoints)
        self.timeout_s = timeout_s
        self.token = token
        self.verify = verify
        self.tls = tls(verify, cert)
        self.http = httpx.AsyncClient(timeout=timeout_s, verify=self.tls, headers=_headers(token))
        self.cluster = _Cluster(cluster_id, self.http.headers, self.endpoints)
        self.probing = asyncio.Lock()

    async def call(
        self,
        method: str,
        path: Path,
        body: Body = None,
        *,
        safe: bool,
        timeout_s: Optional[float] = None,
    ) -> Json:
        import asyncio

        attempts = _Attempts(self.endpoints, self.cluster, timeout_s or self.timeout_s)
        shown = ""
        while not attempts.expired():
            shown = _path_now(path)
            endpoint = self.endpoints.url()
            try:
                await self._probe(endpoint)
                response = await self.http.request(
                    method, endpoint + shown, json=_body_now(body), timeout=timeout_s or self.timeout_s
                )
            except (httpx.ConnectError, httpx.ConnectTimeout) as error:
                attempts.unsent(error, unreachable=endpoint)
                await asyncio.sleep(RETRY_PAUSE_S / 4)
                continue
            except _ProbeFailed as failed:
                # Only the probe was sent: the request itself may go elsewhere.
                attempts.unsent(failed.error)
                continue
            except httpx.TransportError as error:
                if not safe:
                    raise _lost_answer(shown, error) from error
                attempts.unsent(error)
                continue
            answer = attempts.answered(response, endpoint)
            if answer is not None:
                return answer
            await asyncio.sleep(RETRY_PAUSE_S)
        raise attempts.give_up(shown or _path_now(path))

    async def _probe(self, endpoint: str) -> None:
        """As :meth:`Transport._probe`."""
        if self.cluster.probe_headers(endpoint) is None:
            return
        async with self.probing:
            headers = self.cluster.probe_headers(endpoint)
            if headers is None:
                return
            try:
                response = await self.http.get(endpoint + "/healthz", headers=headers, timeout=self.timeout_s)
            except (httpx.ConnectError, httpx.ConnectTimeout):
                raise
            except httpx.TransportError as error:
                raise _ProbeFailed(error) from error
            self.cluster.observe(endpoint, response)

    async def close(self) -> None:
        await self.http.aclose()
