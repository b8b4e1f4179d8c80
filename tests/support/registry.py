"""A real OCI registry for the tests: the CNCF distribution registry, built from its Go module.

``tools/registry/build.sh`` builds ``registry`` (``github.com/distribution/distribution/v3``, pinned in
``tools/registry/go.mod``) into ``.kube-bin`` (or ``$KVOFFLOAD_KUBE_BIN``); ``make kube`` runs it, and so does
:func:`registry_binary`, which is a no-op while the build's stamp matches. :func:`serve` starts it on a free
127.0.0.1 port over plain HTTP, storing blobs on the filesystem in a temporary folder, behind htpasswd basic
auth (one bcrypt user), as a private chart registry is.

Without a go command the tests that use it skip, except under ``$CI``, where they fail.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import time
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import bcrypt
import pytest
import requests
import yaml

from kvoffload_lab.controlplane import default_bin_dir
from tests.support.controlplane import unavailable
from tests.support.engines import free_port
from tests.support.paths import ROOT

BUILD = ROOT / "tools" / "registry" / "build.sh"
USER = "kvoffload-ci"
REALM = "kvoffload-test-registry"
START_DEADLINE_S = 30.0
STOP_DEADLINE_S = 10.0


@dataclass(frozen=True)
class Served:
    """One request the registry answered: ``user`` is the htpasswd user it authenticated, if any."""

    method: str
    path: str
    status: int
    user: str | None


@dataclass(frozen=True)
class Registry:
    """A started registry: ``host`` is ``127.0.0.1:PORT``, the form ``oci://`` references and logins take."""

    host: str
    username: str
    password: str
    storage: Path
    log: Path

    @property
    def url(self) -> str:
        return f"http://{self.host}"

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def served(self) -> list[Served]:
        """The requests that got past authentication and were answered so far, oldest first, from its JSON log
        (a refused login leaves only a warning there)."""
        answered = []
        for line in self.log_text().splitlines():
            try:
                entry = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line a library printed past the logger
            if isinstance(entry, dict) and entry.get("msg") in ("response completed", "response completed with error"):
                answered.append(
                    Served(
                        method=entry["http.request.method"],
                        path=urllib.parse.urlsplit(entry["http.request.uri"]).path,
                        status=int(entry["http.response.status"]),
                        user=entry.get("auth.user.name"),
                    )
                )
        return answered


def go_command() -> str | None:
    """go on PATH, else where the Go tarball installs it (as tools/registry/build.sh looks)."""
    found = shutil.which("go")
    if found is None and os.access("/usr/local/go/bin/go", os.X_OK):
        found = "/usr/local/go/bin/go"
    return found


def registry_binary() -> Path:
    """The registry binary in .kube-bin (or $KVOFFLOAD_KUBE_BIN), built or brought up to date first."""
    if go_command() is None:
        unavailable("no go command: tools/registry/build.sh builds the distribution registry from the Go module proxy")
    out = default_bin_dir()
    # Cold: about 6.5 min on 2 cores with the module cache filled; with the stamp matching, well under a second.
    result = subprocess.run([str(BUILD), str(out)], capture_output=True, text=True, timeout=1500, check=False)
    if result.returncode != 0:
        pytest.fail(f"{BUILD} exited {result.returncode}:\n{result.stdout}{result.stderr}")
    return out / "registry"


def version(binary: Path) -> str:
    """``registry --version``: the binary's path, module and version, as build.sh stamped them."""
    return subprocess.run(
        [str(binary), "--version"], capture_output=True, text=True, check=True, timeout=30
    ).stdout.strip()


def config(port: int, storage: Path, htpasswd: Path) -> dict[str, object]:
    """The registry's configuration (docs/content/about/configuration.md of the pinned release)."""
    return {
        "version": 0.1,
        # JSON, one object a line, so the tests read what was served (Registry.served) without lexing text; the
        # access log is off, as its lines are Apache's text format and repeat what these say.
        "log": {"level": "info", "formatter": "json", "accesslog": {"disabled": True}},
        "storage": {
            "filesystem": {"rootdirectory": str(storage)},
            "delete": {"enabled": True},
            # The purger wakes up on a timer and walks the storage: nothing to purge in a test's lifetime.
            "maintenance": {"uploadpurging": {"enabled": False}},
        },
        # A fixed secret: without one the registry makes a random one and warns that uploads cannot move
        # between instances, which is true and beside the point here.
        "http": {"addr": f"127.0.0.1:{port}", "secret": secrets.token_hex(16)},
        "auth": {"htpasswd": {"realm": REALM, "path": str(htpasswd)}},
    }


def _challenged(registry: Registry) -> bool:
    """Whether ``GET /v2/`` answers as an htpasswd-protected registry does: 401 with a Basic challenge."""
    try:
        answer = requests.get(f"{registry.url}/v2/", timeout=2)
    except requests.ConnectionError:
        return False
    return answer.status_code == 401 and answer.headers.get("WWW-Authenticate") == f'Basic realm="{REALM}"'


@contextmanager
def serve(binary: Path, workdir: Path) -> Iterator[Registry]:
    """Run ``registry serve`` on a free port until the block ends; fail the test if it does not come up."""
    workdir.mkdir(parents=True, exist_ok=True)
    password = secrets.token_urlsafe(18)
    htpasswd = workdir / "htpasswd"
    # The registry's htpasswd accepts bcrypt entries only. It checks the hash on every request: the lowest cost
    # keeps that to milliseconds (at the default, 12, it took 1-2 s a request on 2 busy cores).
    hashed = bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=4)).decode()
    htpasswd.write_text(f"{USER}:{hashed}\n")
    port = free_port()
    registry = Registry(
        host=f"127.0.0.1:{port}", username=USER, password=password, storage=workdir / "storage", log=workdir / "log"
    )
    config_file = workdir / "config.yml"
    config_file.write_text(yaml.safe_dump(config(port, registry.storage, htpasswd)))
    # No OpenTelemetry exporter: by default it sends traces to an OTLP collector on localhost, which is not there.
    env = {**os.environ, "OTEL_TRACES_EXPORTER": "none"}
    with registry.log.open("wb") as log:
        process = subprocess.Popen(
            [str(binary), "serve", str(config_file)], stdout=log, stderr=subprocess.STDOUT, env=env
        )
    try:
        deadline = time.monotonic() + START_DEADLINE_S
        while not _challenged(registry):
            if process.poll() is not None:
                pytest.fail(f"registry exited {process.returncode} before serving:\n{registry.log_text()}")
            if time.monotonic() > deadline:
                pytest.fail(f"registry not serving /v2/ after {START_DEADLINE_S:.0f} s:\n{registry.log_text()}")
            time.sleep(0.1)  # poll another process
        yield registry
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=STOP_DEADLINE_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=STOP_DEADLINE_S)


__all__ = ("Registry", "Served", "registry_binary", "serve", "version")
