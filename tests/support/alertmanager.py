"""pytest fixture: the real Alertmanager (Debian's ``prometheus-alertmanager``), started per test.

Like the Prometheus tier (tests/support/prometheus.py): the binary is Debian's, or ``$KVOFFLOAD_ALERTMANAGER_BIN``;
missing, the test skips on a workstation and fails under ``CI``. It listens on a free 127.0.0.1 port with a
minimal configuration (one receiver that sends nothing), its storage in the test's tmp dir, and clustering off
(else it would bind 0.0.0.0:9094 for gossip).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.receiver import free_port

ALERTMANAGER_BIN = os.environ.get("KVOFFLOAD_ALERTMANAGER_BIN", "/usr/bin/prometheus-alertmanager")
CONFIG: dict[str, Any] = {"route": {"receiver": "nowhere"}, "receivers": [{"name": "nowhere"}]}


class Alertmanager:
    """A running Alertmanager: ``url`` is its base URL, ``alerts()`` what its API v2 holds."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log(self) -> str:
        path = self.workdir / "alertmanager.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def start(self, deadline: float = 30.0) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        (self.workdir / "alertmanager.yml").write_text(yaml.safe_dump(CONFIG))
        for _attempt in range(3):  # a free port can be taken between probing and binding
            self.port = free_port()
            with (self.workdir / "alertmanager.log").open("ab") as log:
                self.process = subprocess.Popen(
                    [
                        ALERTMANAGER_BIN,
                        f"--config.file={self.workdir / 'alertmanager.yml'}",
                        f"--storage.path={self.workdir / 'data'}",
                        f"--web.listen-address=127.0.0.1:{self.port}",
                        "--cluster.listen-address=",
                        "--log.level=warn",
                    ],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            if self._wait_ready(deadline):
                return
            self.stop()
        pytest.fail(f"Alertmanager did not become ready:\n{self.log[-3000:]}")

    def _wait_ready(self, deadline: float) -> bool:
        until = time.monotonic() + deadline
        while time.monotonic() < until:
            assert self.process is not None
            if self.process.poll() is not None:
                return False
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as answer:
                    if answer.status == 200:
                        return True
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.1)
        return False

    def alerts(self) -> list[dict[str, Any]]:
        """``GET /api/v2/alerts``: every alert it holds, as its API returns them."""
        with urllib.request.urlopen(f"{self.url}/api/v2/alerts", timeout=5) as answer:
            found: list[dict[str, Any]] = json.load(answer)
        return found

    def version(self) -> str:
        """The version its ``/api/v2/status`` reports."""
        with urllib.request.urlopen(f"{self.url}/api/v2/status", timeout=5) as answer:
            return str(json.load(answer)["versionInfo"]["version"])

    def wait_for_alerts(self, count: int, deadline: float = 10.0) -> list[dict[str, Any]]:
        until = time.monotonic() + deadline
        while True:
            found = self.alerts()
            if len(found) >= count:
                return found
            if time.monotonic() > until:
                pytest.fail(f"Alertmanager holds {len(found)} alert(s), not {count}: {found}")
            time.sleep(0.1)

    def stop(self) -> None:
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        self.process = None


def require_alertmanager() -> None:
    """Skip without the binary on a workstation; fail in CI, where setup installs it."""
    if shutil.which(ALERTMANAGER_BIN) or Path(ALERTMANAGER_BIN).exists():
        return
    message = f"{ALERTMANAGER_BIN} not found (apt-get install prometheus-alertmanager)"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture
def alertmanager(tmp_path: Path) -> Iterator[Alertmanager]:
    """A fresh real Alertmanager for one test, stopped afterwards."""
    require_alertmanager()
    server = Alertmanager(tmp_path / "alertmanager")
    server.start()
    try:
        yield server
    finally:
        server.stop()


__all__ = ["ALERTMANAGER_BIN", "Alertmanager", "alertmanager", "require_alertmanager"]
