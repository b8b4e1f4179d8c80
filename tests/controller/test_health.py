"""The operator's probes (``controller/health.py``): liveness from the loop's beat, readiness from its role."""

from __future__ import annotations

import urllib.error
import urllib.request

from prometheus_client import CollectorRegistry, Counter

from kvoffload.controller.health import Health, Role, serve
from kvoffload_lab.promserver import free_port


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_liveness_fails_once_the_loop_has_not_beaten_for_the_stale_time() -> None:
    clock = Clock()
    health = Health(stale_after=30, clock=clock)
    clock.now += 29
    assert health.liveness() == (True, "starting: alive")
    clock.now += 2
    assert health.liveness() == (False, "starting: the event loop has not run for 31 s")
    health.mark_beat()
    assert health.liveness()[0]


def get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_the_endpoint_serves_metrics_and_both_probes() -> None:
    registry = CollectorRegistry()
    Counter("kvoffload_things", "things", registry=registry).inc(3)
    clock = Clock()
    health = Health(stale_after=30, clock=clock)
    port = free_port()
    server = serve(port, registry, health, addr="127.0.0.1")
    try:
        status, text = get(port, "/metrics")
        assert status == 200
        assert "kvoffload_things_total 3.0" in text
        assert get(port, "/readyz") == (503, "starting: not ready\n")
        health.set(Role.STANDBY, ready=True)
        assert get(port, "/readyz") == (200, "standby: ready\n")
        assert get(port, "/healthz") == (200, "standby: alive\n")
        clock.now += 60  # the loop wedged: the server's own thread still answers, and says so
        assert get(port, "/healthz") == (503, "standby: the event loop has not run for 60 s\n")
        health.set(Role.LEADER, ready=True)
        assert get(port, "/readyz") == (200, "leader: ready\n")
    finally:
        server.shutdown()
