"""Faults for end-to-end scenarios: a control plane whose etcd and kube-apiserver can be restarted, and proxies
that stand between the operator and what it talks to, so a test can make them slow, failing or conflicting.

- :class:`RestartablePlane`: :class:`kvoffload_lab.controlplane.ControlPlane` with :meth:`RestartablePlane.restart`,
  which stops one component (SIGTERM, or SIGKILL as a crash) and starts it again with the same arguments, ports
  and data directory, then waits until it (and the API server, for etcd) answers healthy again.
- :class:`PrometheusProxy`: plain HTTP on 127.0.0.1 in front of a real Prometheus, switched at will between
  passing through, answering after a delay, and answering with an HTTP error.
- :class:`ApiServerProxy`: HTTPS on 127.0.0.1 in front of kube-apiserver (a serving certificate from the
  cluster's CA, the admin's client certificate upstream), streaming every answer (watches included), which can
  answer 409 Conflict to a policy's status writes. Its :attr:`ApiServerProxy.kubeconfig` is the admin's,
  pointed at it.
- :class:`BlackHole`: a TCP port that accepts connections and never answers: a hung webhook.

Each proxy runs in the test's event loop; every decision it takes is counted, so a test can wait on what the
proxy saw rather than on time.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import re
import signal
import ssl
import subprocess
import time
import urllib.request
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from kvoffload_lab.cluster.kubeapi import tls_context
from kvoffload_lab.controlplane import HOST, ControlPlane, ControlPlaneError, free_port

BODY_READ_S = 30.0
"""How long a proxy here waits for a client's request body."""
_HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "transfer-encoding", "content-length", "host", "upgrade", "te", "trailer"}
)


def _forwardable(headers: Any) -> dict[str, str]:
    return {k: v for k, v in headers.items() if k.lower() not in _HOP_BY_HOP}


# --- the control plane ------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Restart:
    """How one restart went, in seconds from the moment the component was told to stop."""

    component: str
    stopped_s: float
    """Until the old process had exited."""
    healthy_s: float
    """Until the new process answered healthy."""
    api_ready_s: float
    """Until kube-apiserver answered ``/readyz`` ok again (for etcd: the API server over the new etcd)."""
    began: float
    """``time.monotonic()`` when it was told to stop."""
    ready_at: float
    """``time.monotonic()`` once the API server was ready again."""


class RestartablePlane(ControlPlane):
    """A control plane whose etcd and kube-apiserver a test can restart (blocking: call it in a thread)."""

    def restart(self, component: str, *, kill: bool = False, grace: float = 5.0, timeout: float = 120.0) -> Restart:
        """Stop ``component`` (SIGTERM, then SIGKILL after ``grace`` seconds, as a kubelet stops a static pod; or
        SIGKILL at once: a crash) and start it again with the very same command line (ports, certificates, etcd's
        data directory), its log appended to; return once it and the API server answer healthy.

        kube-apiserver closes its port at SIGTERM but waits up to 60 s for its open connections (the watches of
        clients that never hang up) before it exits; the grace period cuts that short."""
        if component not in ("etcd", "kube-apiserver"):
            raise ValueError(f"restart etcd or kube-apiserver, not {component}")
        # ControlPlane keeps its processes to itself; a subclass may reach them.
        process = next((p for p in self._processes if p.name == component), None)
        if process is None:
            raise ControlPlaneError(f"{component} is not running")
        argv = [str(arg) for arg in process.popen.args]  # type: ignore[union-attr]
        began = time.monotonic()
        if kill:
            process.popen.send_signal(signal.SIGKILL)
        else:
            process.popen.terminate()
        try:
            process.popen.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            process.popen.send_signal(signal.SIGKILL)
            process.popen.wait(timeout=30)
        stopped = time.monotonic()
        with process.log.open("ab") as out:
            process.popen = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
        process.started = time.monotonic()
        if component == "etcd":
            url = next(a.split("=", 1)[1] for a in argv if a.startswith("--listen-client-urls="))
            self._wait(process, lambda: '"health":"true"' in (_get(f"{url}/health") or ""))
        healthy = time.monotonic()
        tls = ssl.create_default_context(cafile=str(self.ca_file))
        tls.load_cert_chain(str(self.client_cert), str(self.client_key))
        apiserver = next(p for p in self._processes if p.name == "kube-apiserver")
        deadline = time.monotonic() + timeout
        while _get(f"{self.server}/readyz", tls) != "ok":
            if apiserver.popen.poll() is not None:
                raise ControlPlaneError(f"kube-apiserver exited with {apiserver.popen.returncode} after the restart")
            if time.monotonic() > deadline:
                raise ControlPlaneError(f"kube-apiserver not ready {timeout:.0f} s after {component} restarted")
            time.sleep(0.1)  # polling another process's health endpoint
        ready = time.monotonic()
        if component == "kube-apiserver":
            healthy = ready
        return Restart(component, stopped - began, healthy - began, ready - began, began, ready)


def _get(url: str, context: ssl.SSLContext | None = None) -> str | None:
    """The body of a 200 answer to GET ``url``; None for anything else."""
    handlers: list[urllib.request.BaseHandler] = [urllib.request.ProxyHandler({})]
    if context is not None:
        handlers.append(urllib.request.HTTPSHandler(context=context))
    try:
        with urllib.request.build_opener(*handlers).open(url, timeout=2) as response:
            body: bytes = response.read()
            return body.decode(errors="replace") if response.status == 200 else None
    except (OSError, ValueError):
        return None


# --- Prometheus -------------------------------------------------------------------------------------


class _Forwarder:
    """What the proxies share: an aiohttp server on a free loopback port, forwarding through one client session."""

    port: int
    _runner: web.AppRunner | None
    _session: aiohttp.ClientSession | None

    async def _serve(
        self, session: aiohttp.ClientSession, ssl_context: ssl.SSLContext | None = None, max_body: int = 1024**2
    ) -> None:
        self._session = session
        app = web.Application(client_max_size=max_body)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0, handler_cancellation=True)
        await self._runner.setup()
        self.port = free_port()
        await web.TCPSite(self._runner, HOST, self.port, ssl_context=ssl_context).start()

    async def __aexit__(self, *exc: object) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        raise NotImplementedError


class PrometheusProxy(_Forwarder):
    """A switchable HTTP proxy in front of Prometheus at ``upstream``, on 127.0.0.1.

    Modes: :meth:`pass_through`, :meth:`slow` (each answer after ``delay`` seconds) and :meth:`fail` (each
    request answered with an HTTP error, Prometheus not asked). :attr:`served` counts requests by the mode that
    answered them (``pass``, ``slow``, ``500``...)."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.port = 0
        self.served: Counter[str] = Counter()
        self._delay = 0.0
        self._status: int | None = None
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def mode(self) -> str:
        return str(self._status) if self._status is not None else "slow" if self._delay else "pass"

    def pass_through(self) -> None:
        self._delay, self._status = 0.0, None

    def slow(self, delay: float) -> None:
        self._delay, self._status = delay, None

    def fail(self, status: int) -> None:
        self._delay, self._status = 0.0, status

    async def __aenter__(self) -> PrometheusProxy:
        await self._serve(aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60), auto_decompress=False))
        return self

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        mode = self.mode
        self.served[mode] += 1
        if self._status is not None:
            body = {"status": "error", "errorType": "internal", "error": f"injected HTTP {self._status}"}
            return web.json_response(body, status=self._status)
        if self._delay:
            await asyncio.sleep(self._delay)  # the fault itself: a Prometheus that takes this long to answer
        assert self._session is not None
        async with asyncio.timeout(BODY_READ_S):
            data = await request.read()
        async with self._session.request(
            request.method, f"{self.upstream}{request.path_qs}", headers=_forwardable(request.headers), data=data
        ) as upstream:
            return web.Response(
                status=upstream.status,
                body=await upstream.read(),  # deadline: the session's total timeout
                headers=_forwardable(upstream.headers),
            )


# --- kube-apiserver ---------------------------------------------------------------------------------

STATUS_WRITE = re.compile(
    r"^/apis/kvoffload\.io/[^/]+/namespaces/(?P<ns>[^/]+)/kvoffloadpolicies/(?P<name>[^/]+)/status$"
)


def conflict_status(name: str) -> dict[str, Any]:
    """The Status body kube-apiserver answers a write at a stale resourceVersion with."""
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": (
            f'Operation cannot be fulfilled on kvoffloadpolicies.kvoffload.io "{name}": the object has been '
            "modified; please apply your changes to the latest version and try again"
        ),
        "reason": "Conflict",
        "details": {"name": name, "group": "kvoffload.io", "kind": "kvoffloadpolicies"},
        "code": 409,
    }


ConflictRule = Callable[[int], bool]
"""Given the number of the status write (1, 2, ...) since the rule was set: whether to answer it 409."""


class ApiServerProxy(_Forwarder):
    """HTTPS on 127.0.0.1 in front of the plane's kube-apiserver, for one client (the operator under test).

    Every request goes upstream as the admin and every answer comes back as it streams (watches included),
    except the policies' status writes (PATCH or PUT of ``.../kvoffloadpolicies/NAME/status``) that the
    :attr:`conflicts` rule picks: those are answered 409 Conflict without reaching the API server, after
    ``on_conflict`` ran (e.g. another writer bumping the policy). :attr:`status_writes` counts the status
    writes by outcome (``refused``, and the upstream HTTP status of the others)."""

    def __init__(self, plane: ControlPlane, folder: Path) -> None:
        self.plane = plane
        self.folder = folder
        self.port = 0
        self.conflicts: ConflictRule | None = None
        self.on_conflict: Callable[[str, str], Awaitable[None]] | None = None
        self.status_writes: Counter[str] = Counter()
        self._numbered = 0
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None

    @property
    def server(self) -> str:
        return f"https://{HOST}:{self.port}"

    @property
    def kubeconfig(self) -> Path:
        return self.folder / "proxied.kubeconfig"

    def refuse(self, rule: ConflictRule | None) -> None:
        """From now on, answer 409 to the status writes ``rule`` picks (None: to none)."""
        self.conflicts = rule
        self._numbered = 0

    async def __aenter__(self) -> ApiServerProxy:
        self.folder.mkdir(parents=True, exist_ok=True)
        cert, key = self.plane.issue_loopback_certificate(self.folder, "apiserver-proxy")
        serving = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        serving.load_cert_chain(str(cert), str(key))
        upstream_tls = tls_context(self.plane.ca_file, self.plane.client_cert, self.plane.client_key)
        session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=upstream_tls),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=None),
            auto_decompress=False,
        )
        await self._serve(session, serving, max_body=64 * 1024**2)
        config = json.loads(self.plane.kubeconfig.read_text())
        for cluster in config["clusters"]:
            cluster["cluster"]["server"] = self.server
        self.kubeconfig.touch(mode=0o600)
        self.kubeconfig.write_text(json.dumps(config))
        return self

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        async with asyncio.timeout(BODY_READ_S):
            body = await request.read()
        status_write = STATUS_WRITE.match(request.path) if request.method in ("PATCH", "PUT") else None
        if status_write is not None and self.conflicts is not None:
            self._numbered += 1
            if self.conflicts(self._numbered):
                self.status_writes["refused"] += 1
                if self.on_conflict is not None:
                    await self.on_conflict(status_write["ns"], status_write["name"])
                return web.json_response(conflict_status(status_write["name"]), status=409)
        assert self._session is not None
        async with self._session.request(
            request.method,
            f"{self.plane.server}{request.path_qs}",
            headers=_forwardable(request.headers),
            data=body or None,
        ) as upstream:
            if status_write is not None:
                self.status_writes[str(upstream.status)] += 1
            response = web.StreamResponse(status=upstream.status, headers=_forwardable(upstream.headers))
            await response.prepare(request)
            with contextlib.suppress(ConnectionResetError, aiohttp.ClientError):
                async for chunk in upstream.content.iter_any():  # a watch streams until either side ends it
                    await response.write(chunk)
                await response.write_eof()
            return response


# --- a hung webhook ---------------------------------------------------------------------------------


class BlackHole:
    """A TCP port on 127.0.0.1 that accepts connections and never says a word (a webhook pod that hangs).
    :attr:`accepted` counts the connections it swallowed."""

    def __init__(self) -> None:
        self.port = 0
        self.accepted = 0
        self._server: asyncio.Server | None = None
        self._held: list[asyncio.StreamWriter] = []

    async def __aenter__(self) -> BlackHole:
        self.port = free_port()
        self._server = await asyncio.start_server(self._swallow, HOST, self.port)
        return self

    async def __aexit__(self, *exc: object) -> None:
        for writer in self._held:
            writer.close()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _swallow(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        self._held.append(writer)


# --- the operator's own metrics ---------------------------------------------------------------------


def scrape_counters(port: int, name: str) -> dict[str, float]:
    """The samples of one counter family on the operator's metrics port (``kvoffload_decisions_total``), keyed by
    their label set as written (``decision="Promoted"``); empty when the port does not answer."""
    text = _get(f"http://{HOST}:{port}/metrics") or ""
    found: dict[str, float] = {}
    for line in text.splitlines():
        match = re.match(rf"^{re.escape(name)}(?:{{(?P<labels>[^}}]*)}})? (?P<value>\S+)$", line)
        if match:
            found[match["labels"] or ""] = float(match["value"])
    return found


__all__ = (
    "ApiServerProxy",
    "BlackHole",
    "PrometheusProxy",
    "Restart",
    "RestartablePlane",
    "conflict_status",
    "scrape_counters",
)
