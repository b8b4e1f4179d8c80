"""The provider's connection to a Prometheus behind TLS, basic auth and a tenant header (issue 23).

The TLS and basic auth cases run against the real Prometheus (Debian's 2.42) started with ``--web.config.file``:
a throwaway CA signs its certificate for 127.0.0.1 only, and one user's bcrypt hash guards it. The header cases
run against a local HTTP server that records what it receives.
"""

from __future__ import annotations

import base64
import json
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import bcrypt
import pytest
import requests
import yaml
from click.testing import CliRunner

from kvoffload.analysis.measurements import Measurements
from kvoffload.analysis.prometheus import PrometheusProvider
from kvoffload.analysis.promhttp import Connection
from kvoffload.cli.main import main
from tests.support.certificates import serving_certificate
from tests.support.prometheus import PROMETHEUS_BIN, free_port, require_prometheus, synthetic_target, wait_until

pytestmark = pytest.mark.prometheus

USER, PASSWORD = "kvoffload", "correct horse battery staple"
EMPTY_VECTOR = b'{"status":"success","data":{"resultType":"vector","result":[]}}'


@dataclass(frozen=True)
class SecuredPrometheus:
    port: int
    ca_file: Path
    password_file: Path
    wrong_password_file: Path

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    @property
    def url_by_another_name(self) -> str:
        """The same server under a name its certificate does not carry (it names 127.0.0.1 only)."""
        return f"https://localhost:{self.port}"


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecuredPrometheus]:
    """The real Prometheus serving HTTPS with a throwaway CA's certificate, and basic auth for one user."""
    require_prometheus()
    work = tmp_path_factory.mktemp("secured-prometheus")
    tls = serving_certificate(work / "tls")
    ca_file = work / "ca.crt"
    ca_file.write_bytes(tls.ca_pem)
    (work / "web.yml").write_text(
        yaml.safe_dump(
            {
                "tls_server_config": {"cert_file": str(tls.certfile), "key_file": str(tls.keyfile)},
                # Cost 4, bcrypt's least: Prometheus checks the hash on every request.
                "basic_auth_users": {USER: bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(4)).decode()},
            }
        )
    )
    (work / "prometheus.yml").write_text(yaml.safe_dump({"global": {"scrape_interval": "1s"}}))
    password_file, wrong_password_file = work / "password", work / "wrong-password"
    password_file.write_text(PASSWORD + "\n")  # as `echo` writes it: the line end is not part of the password
    wrong_password_file.write_text("incorrect horse")
    port = free_port()
    with (work / "prometheus.log").open("ab") as log:
        process = subprocess.Popen(
            [
                PROMETHEUS_BIN,
                f"--config.file={work / 'prometheus.yml'}",
                f"--web.config.file={work / 'web.yml'}",
                f"--storage.tsdb.path={work / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--log.level=warn",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    server = SecuredPrometheus(port, ca_file, password_file, wrong_password_file)

    def ready() -> bool:
        if process.poll() is not None:
            pytest.fail(f"Prometheus exited:\n{(work / 'prometheus.log').read_text()[-3000:]}")
        try:
            answer = requests.get(f"{server.url}/-/ready", verify=str(ca_file), auth=(USER, PASSWORD), timeout=1)
        except requests.RequestException:
            return False
        return answer.status_code == 200

    try:
        wait_until(ready, 30, "the TLS Prometheus to be ready")
        yield server
    finally:
        process.terminate()
        process.wait(10)


def measure(url: str, connection: Connection, **kwargs: object) -> Measurements:
    provider = PrometheusProvider(url, connection=connection, retries=0, timeout=5, **kwargs)  # type: ignore[arg-type]
    try:
        return provider.measure([synthetic_target("llm", "chat", "10s")])[("llm", "chat")]
    finally:
        provider.close()


def test_queries_succeed_with_the_ca_and_the_right_password(secured: SecuredPrometheus) -> None:
    connection = Connection(username=USER, password_file=secured.password_file, ca_file=secured.ca_file)
    result = measure(secured.url, connection)
    assert result.error is None
    assert result.stable is not None  # answered: the fleet has no series, so the sample is empty


@pytest.mark.parametrize(
    ("case", "password", "expected"),
    [
        ("a wrong password", "wrong", "Prometheus refused the credentials (HTTP 401)"),
        ("no credentials", None, "Prometheus refused the credentials (HTTP 401)"),
    ],
)
def test_a_wrong_or_missing_password_is_refused_with_a_clear_message(
    secured: SecuredPrometheus, case: str, password: str | None, expected: str
) -> None:
    password_file = {"wrong": secured.wrong_password_file, None: None}[password]
    connection = Connection(
        username=USER if password_file else None, password_file=password_file, ca_file=secured.ca_file
    )
    result = measure(secured.url, connection)
    assert result.error is not None, case
    assert result.error.startswith(expected), result.error


def test_without_the_ca_the_certificate_is_not_accepted(secured: SecuredPrometheus) -> None:
    result = measure(secured.url, Connection(username=USER, password_file=secured.password_file))
    assert result.error is not None
    assert result.error.startswith("Prometheus's TLS certificate was not accepted: "), result.error
    assert "unable to get local issuer certificate" in result.error


def test_a_certificate_for_another_name_is_not_accepted_even_with_the_ca(secured: SecuredPrometheus) -> None:
    connection = Connection(username=USER, password_file=secured.password_file, ca_file=secured.ca_file)
    result = measure(secured.url_by_another_name, connection)
    assert result.error is not None
    assert result.error.startswith("Prometheus's TLS certificate was not accepted: "), result.error
    assert "mismatch" in result.error
    assert "localhost" in result.error


def test_skipping_verification_works_only_when_opted_in(secured: SecuredPrometheus) -> None:
    without = measure(secured.url_by_another_name, Connection(username=USER, password_file=secured.password_file))
    opted_in = measure(
        secured.url_by_another_name,
        Connection(username=USER, password_file=secured.password_file, insecure_skip_verify=True),
    )
    assert without.error is not None
    assert "not accepted" in without.error
    assert opted_in.error is None


def test_a_bearer_token_replaces_basic_auth_so_prometheus_refuses_it(secured: SecuredPrometheus) -> None:
    """Both would be the Authorization header: the token wins, and this Prometheus knows no token."""
    connection = Connection(username=USER, password_file=secured.password_file, ca_file=secured.ca_file)
    result = measure(secured.url, connection, bearer_token="a-token")
    assert result.error is not None
    assert "HTTP 401" in result.error


POLICY = """\
apiVersion: kvoffload.io/v1alpha1
kind: KVOffloadPolicy
metadata: {name: chat, namespace: llm}
spec:
  model: {name: Qwen/Qwen3-0.6B, image: "vllm/vllm-openai:v0.32.0", maxModelLen: 2048}
  gpu: {class: nvidia-h100-80gb}
  replicas: 2
  resources: {baseMemory: 8Gi}
  offload: {cpu: 512Mi}
"""


@pytest.mark.parametrize(
    ("case", "extra", "expected"),
    [
        ("the CA and the password", [], "verdict: Inconclusive"),
        ("a wrong password", ["--prometheus-password-file", "WRONG"], "Prometheus refused the credentials (HTTP 401)"),
        ("no CA", ["--prometheus-ca-file", None], "Prometheus's TLS certificate was not accepted"),
    ],
)
def test_kvoffload_analyze_takes_the_same_options_and_says_what_went_wrong(
    secured: SecuredPrometheus, tmp_path: Path, case: str, extra: list[str | None], expected: str
) -> None:
    policy = tmp_path / "chat.yaml"
    policy.write_text(POLICY)
    options = {
        "--prometheus-ca-file": str(secured.ca_file),
        "--prometheus-username": USER,
        "--prometheus-password-file": str(secured.password_file),
    }
    for name, value in zip(extra[::2], extra[1::2], strict=True):
        if value is None:
            del options[name]
        else:
            options[name] = str(secured.wrong_password_file) if value == "WRONG" else value
    args = ["analyze", str(policy), "--prometheus", secured.url, *(x for kv in options.items() for x in kv)]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 3, (case, result.output)  # Inconclusive: no engines, or no answer
    assert expected in result.output, result.output
    if not extra:  # answered: inconclusive for want of engines, not of measurements
        assert "no measurements" not in result.output, result.output
    assert "Traceback" not in result.output


def test_kvoffload_analyze_warns_when_verification_is_skipped(secured: SecuredPrometheus, tmp_path: Path) -> None:
    policy = tmp_path / "chat.yaml"
    policy.write_text(POLICY)
    args = ["analyze", str(policy), "--prometheus", secured.url_by_another_name, "--insecure-skip-tls-verify"]
    args += ["--prometheus-username", USER, "--prometheus-password-file", str(secured.password_file)]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 3, result.output
    assert "WARNING: Prometheus's TLS certificate will not be verified" in result.output
    assert "verdict: Inconclusive" in result.output
    assert "no measurements" not in result.output


# --- headers, against a server that records them ---------------------------------------------------------


class _Recorder(BaseHTTPRequestHandler):
    seen: list[dict[str, str]]

    def do_GET(self) -> None:
        type(self).seen.append(dict(self.headers))
        body = b'{"status":"success","data":[]}' if "/label/" in self.path else EMPTY_VECTOR
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def recorder() -> Iterator[tuple[str, list[dict[str, str]]]]:
    """A local HTTP server answering empty results; yields its URL and the headers of every request."""
    seen: list[dict[str, str]] = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), type("Recorder", (_Recorder,), {"seen": seen}))
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def test_every_query_carries_the_tenant_header_and_basic_auth(
    recorder: tuple[str, list[dict[str, str]]], tmp_path: Path
) -> None:
    url, seen = recorder
    password = tmp_path / "password"
    password.write_text("first")
    connection = Connection(
        headers=(("X-Scope-OrgID", "team-a"), ("X-Extra", "1")), username="reader", password_file=password
    )
    provider = PrometheusProvider(url, connection=connection)
    provider.present_metric_names()
    provider.measure([synthetic_target("llm", "chat", "10s")])
    password.write_text("rotated")  # a rotated Secret is read again at the next batch
    provider.measure([synthetic_target("llm", "chat", "10s")])

    assert len(seen) == provider.queries
    assert {(h["X-Scope-OrgID"], h["X-Extra"]) for h in seen} == {("team-a", "1")}
    assert {h["Authorization"] for h in seen} == {basic("reader", "first"), basic("reader", "rotated")}


def test_a_bearer_token_goes_instead_of_basic_auth_and_the_headers_still_go(
    recorder: tuple[str, list[dict[str, str]]], tmp_path: Path
) -> None:
    url, seen = recorder
    password = tmp_path / "password"
    password.write_text("pw")
    connection = Connection(headers=(("X-Scope-OrgID", "team-a"),), username="reader", password_file=password)
    provider = PrometheusProvider(url, bearer_token="tok", connection=connection)
    provider.measure([synthetic_target("llm", "chat", "10s")])
    assert seen
    assert {(h["Authorization"], h["X-Scope-OrgID"]) for h in seen} == {("Bearer tok", "team-a")}


@pytest.mark.parametrize(
    ("header", "problem"),
    [
        ("Authorization=Bearer x", "may not be set as an extra header"),
        ("Host=evil.test", "may not be set as an extra header"),
        ("X Scope=1", "is not an HTTP header name"),
        ("X-Scope-OrgID", "give NAME=VALUE"),
    ],
)
def test_a_header_that_cannot_go_is_refused_on_the_command_line(header: str, problem: str, tmp_path: Path) -> None:
    policy = tmp_path / "chat.yaml"
    policy.write_text(POLICY)
    result = CliRunner().invoke(
        main, ["analyze", str(policy), "--prometheus", "http://prometheus.test", "--prometheus-header", header]
    )
    assert result.exit_code == 2, result.output
    assert problem in result.output
    assert "Traceback" not in result.output


def test_kvoffload_analyze_sends_the_header(recorder: tuple[str, list[dict[str, str]]], tmp_path: Path) -> None:
    url, seen = recorder
    policy = tmp_path / "chat.yaml"
    policy.write_text(POLICY)
    result = CliRunner().invoke(
        main, ["analyze", str(policy), "--prometheus", url, "--prometheus-header", "X-Scope-OrgID=team-b", "-o", "json"]
    )
    assert result.exit_code == 3, result.output
    answer = json.loads(result.output)
    assert answer["verdict"] == "Inconclusive"
    assert "no measurements" not in answer["message"]
    assert seen
    assert {h.get("X-Scope-OrgID") for h in seen} == {"team-b"}


def test_the_operator_logs_a_warning_when_verification_is_off(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("WARNING", logger="kvoffload.analysis.prometheus"):
        PrometheusProvider("https://mimir.example", connection=Connection()).close()
        assert caplog.records == []
        PrometheusProvider("https://mimir.example", connection=Connection(insecure_skip_verify=True)).close()
    (record,) = caplog.records
    assert "TLS verification of Prometheus at https://mimir.example is OFF" in record.getMessage()
