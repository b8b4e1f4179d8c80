"""The operator's HTTP endpoint: ``/metrics``, and the probes the chart points the kubelet at.

- ``/healthz`` (liveness) answers 200 while the event loop keeps beating. It is served from a
  thread of its own, so a wedged loop (a blocking call, a deadlock) is seen and the pod restarted,
  which a probe answered by the loop itself could only time out on.
- ``/readyz`` (readiness) answers 200 once this replica does its part: the leader once kopf has
  started, a standby once it waits for the Lease (serving the admission webhook, when there is one).
  A standby is ready, because it is what a rolling update of the operator must wait for.

Both bodies say the role (``leader``, ``standby``, ``starting``), for a person with curl.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterable
from enum import StrEnum
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer

BEAT_INTERVAL_S = 1.0
STALE_AFTER_S = 30.0
"""A loop that has not beaten for this long is taken as wedged. The longest step the loop takes without
yielding is a status patch or a Prometheus answer's parse, well under a second at 1,000 policies."""


class Role(StrEnum):
    STARTING = "starting"
    STANDBY = "standby"
    LEADER = "leader"


class Health:
    """What the probes answer; the operator sets the role and readiness, :meth:`beat` keeps it alive."""

    def __init__(self, stale_after: float = STALE_AFTER_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.stale_after = stale_after
        self._clock = clock
        self._last_beat = clock()
        self.role = Role.STARTING
        self.ready = False

    def set(self, role: Role, *, ready: bool) -> None:
        self.role, self.ready = role, ready

    def mark_beat(self) -> None:
        self._last_beat = self._clock()

    async def beat(self) -> None:
        """Run for as long as the operator does (a task on its loop)."""
        while True:
            self.mark_beat()
            await asyncio.sleep(BEAT_INTERVAL_S)

    def liveness(self) -> tuple[bool, str]:
        silent = self._clock() - self._last_beat
        if silent > self.stale_after:
            return False, f"{self.role}: the event loop has not run for {silent:.0f} s"
        return True, f"{self.role}: alive"

    def readiness(self) -> tuple[bool, str]:
        return self.ready, f"{self.role}: {'ready' if self.ready else 'not ready'}"


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # probes every few seconds: no access log
        pass


def serve(port: int, registry: CollectorRegistry, health: Health | None = None, addr: str = "0.0.0.0") -> Any:
    """Serve ``/metrics`` (and with ``health``, ``/healthz`` and ``/readyz``) on ``port`` in a daemon thread;
    returns the server (``shutdown()`` stops it)."""
    metrics = make_wsgi_app(registry)

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        probe = {"/healthz": Health.liveness, "/readyz": Health.readiness}.get(environ.get("PATH_INFO", ""))
        if probe is None or health is None:
            return metrics(environ, start_response)  # type: ignore[no-any-return]
        ok, text = probe(health)
        start_response("200 OK" if ok else "503 Service Unavailable", [("Content-Type", "text/plain")])
        return [f"{text}\n".encode()]

    server = make_server(addr, port, app, ThreadingWSGIServer, handler_class=_QuietHandler)
    threading.Thread(target=server.serve_forever, name="metrics-endpoint", daemon=True).start()
    return server


__all__ = ("Health", "Role", "serve")
