"""The admin's Prometheus headers and basic auth go where the operator's token goes, and nowhere else.

Two local HTTP servers record every request: the admin's Prometheus (the one allowed URL) and a tenant's own
host. The controller builds its providers as ``kvoffload run`` does (``handlers.run_operator``'s factory).
"""

from __future__ import annotations

import base64
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from click.testing import CliRunner

from kvoffload.analysis.hub import MeasurementHub, PrometheusSource
from kvoffload.analysis.prometheus import PrometheusProvider
from kvoffload.analysis.promhttp import Connection
from kvoffload.cli.main import main
from kvoffload.controller.reconcile import Controller
from kvoffload.controller.settings import ControllerSettings
from kvoffload.policy.tenancy import Tenancy
from tests.controller.test_controller import Clock, chat_spec, create_policy, policy_body, status_of
from tests.support.kube import EmulatedCluster

pytestmark = pytest.mark.e2e


class _Recorder(BaseHTTPRequestHandler):
    seen: list[dict[str, str]]

    def do_GET(self) -> None:
        type(self).seen.append(dict(self.headers))
        body = (
            b'{"status":"success","data":[]}'
            if "/label/" in self.path
            else b'{"status":"success","data":{"resultType":"vector","result":[]}}'
        )
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def _serve() -> tuple[ThreadingHTTPServer, str, list[dict[str, str]]]:
    seen: list[dict[str, str]] = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), type("Recorder", (_Recorder,), {"seen": seen}))
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}", seen


@pytest.fixture
def two_hosts() -> Iterator[tuple[tuple[str, list[dict[str, str]]], tuple[str, list[dict[str, str]]]]]:
    """(the admin's Prometheus, a tenant's own host): each its URL and the headers it received."""
    admins, admins_url, admins_seen = _serve()
    tenants, tenants_url, tenants_seen = _serve()
    try:
        yield (admins_url, admins_seen), (tenants_url, tenants_seen)
    finally:
        admins.shutdown()
        tenants.shutdown()


async def test_the_tenant_header_and_basic_auth_go_only_to_the_admins_prometheus(
    kube: EmulatedCluster,
    two_hosts: tuple[tuple[str, list[dict[str, str]]], tuple[str, list[dict[str, str]]]],
    tmp_path: Path,
) -> None:
    (admins_url, admins_seen), (tenants_url, tenants_seen) = two_hosts
    password = tmp_path / "password"
    password.write_text("s3cret")
    connection = Connection(headers=(("X-Scope-OrgID", "platform"),), username="kvoffload", password_file=password)
    settings = ControllerSettings(
        prometheus_connection=connection,
        # 127.0.0.1 is private: the lab's leave, so that only the allow-list decides here.
        tenancy=Tenancy(prometheus_url_prefixes=(admins_url,), private_prometheus=True),
    )

    def provider_for(source: PrometheusSource) -> PrometheusProvider:
        return PrometheusProvider(source.url, bearer_token=source.bearer_token, connection=source.connection)

    clock = Clock()
    controller = Controller(kube.gateway(), MeasurementHub(provider_for, gather_window=0.0), settings, clock=clock)
    ours, theirs = chat_spec(), chat_spec()
    ours["prometheus"]["url"] = admins_url
    # The tenant names their own host, hoping for the operator's X-Scope-OrgID and password.
    theirs["prometheus"]["url"] = tenants_url
    await create_policy(kube, "chat", ours)
    await create_policy(kube, "theirs", theirs)
    for _ in range(2):
        await controller.reconcile(policy_body(kube, "chat"))
        await controller.reconcile(policy_body(kube, "theirs"))
        clock.advance(1)

    expected = "Basic " + base64.b64encode(b"kvoffload:s3cret").decode()
    assert admins_seen
    assert {(h.get("X-Scope-OrgID"), h.get("Authorization")) for h in admins_seen} == {("platform", expected)}
    assert tenants_seen == []
    (invalid,) = [c for c in status_of(kube, "theirs")["conditions"] if c["type"] == "Invalid"]
    assert invalid["status"] == "True"
    assert invalid["message"].startswith("spec.prometheus.url: is not under a Prometheus URL this cluster allows")


def test_headers_and_basic_auth_count_as_the_operators_credentials_for_the_startup_check() -> None:
    """``kvoffload run`` refuses to start when its credentials could go to any policy's URL."""
    alone = ControllerSettings(prometheus_connection=Connection(headers=(("X-Scope-OrgID", "platform"),)))
    fixed = ControllerSettings(
        prometheus_url="https://mimir.example/prometheus",
        prometheus_connection=Connection(headers=(("X-Scope-OrgID", "platform"),)),
    )
    assert any("needs --prometheus-url" in p for p in alone.judged_tenancy.problems())
    assert fixed.judged_tenancy.problems() == []
    assert ControllerSettings().judged_tenancy.problems() == []


def test_kvoffload_run_refuses_to_start_with_headers_that_could_go_anywhere() -> None:
    result = CliRunner().invoke(main, ["run", "-A", "--prometheus-header", "X-Scope-OrgID=platform"])
    assert result.exit_code == 2, result.output
    assert "need --prometheus-url or at least one --prometheus-allowed-url" in result.output
