"""pytest fixtures: emulated vLLM engines (`kvoffload emulate`) as subprocesses on free loopback ports.

`start_engines(2, ["--kv-offloading-size", "0.5"])` starts two engines with the same flags;
`start_engines([[...], [...]])` starts one per argument list. Each waits for `/health` with a
deadline. The `engine_factory` fixture does the same and stops every engine it started at
teardown, so a failing test leaves no process behind.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

HOST = "127.0.0.1"
START_DEADLINE_S = 30.0
STOP_DEADLINE_S = 10.0
# The engine runs the package's own CLI with this interpreter (the venv the tests run in).
_CLI = [sys.executable, "-c", "from kvoffload.cli.main import main; main()", "emulate"]


@dataclass
class Engine:
    """One running emulated engine."""

    port: int
    args: list[str]
    process: subprocess.Popen[bytes]
    log: Path
    host: str = HOST
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def target(self) -> str:
        """``host:port``, as a Prometheus static target."""
        return f"{self.host}:{self.port}"

    def alive(self) -> bool:
        return self.process.poll() is None

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=2) as response:
                return bool(response.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def get(self, path: str) -> str:
        with urllib.request.urlopen(f"{self.url}{path}", timeout=10) as response:
            body: bytes = response.read()
        return body.decode()

    def post(self, path: str, payload: dict[str, Any], timeout: float = 30.0) -> Any:
        request = urllib.request.Request(
            f"{self.url}{path}",
            data=json.dumps(payload).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.load(response)

    def complete(self, prompt: list[int] | str, max_tokens: int = 2) -> Any:
        """One ``/v1/completions`` request; returns the decoded answer."""
        return self.post("/v1/completions", {"prompt": prompt, "max_tokens": max_tokens})

    def set_faults(self, **faults: Any) -> Any:
        """``POST /emulator/faults`` (times in seconds from now; ``clear=True`` resets)."""
        return self.post("/emulator/faults", faults)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after a deadline; waits for the process to be gone."""
        if self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=STOP_DEADLINE_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=STOP_DEADLINE_S)


def free_port() -> int:
    """A TCP port free on the loopback interface right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        port: int = s.getsockname()[1]
        return port


def spawn_engine(args: Sequence[str], log_dir: Path, *, port: int | None = None) -> Engine:
    """Start one engine without waiting for it."""
    port = port or free_port()
    log = log_dir / f"engine-{port}.log"
    # host/port last: a rendered command line carries its own --port, and the last one wins.
    argv = [*_CLI, *args, "--host", HOST, "--port", str(port)]
    with log.open("wb") as out:
        process = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"}
        )
    return Engine(port=port, args=list(args), process=process, log=log)


def wait_healthy(engines: Sequence[Engine], deadline_s: float = START_DEADLINE_S) -> None:
    """Wait until every engine answers ``/health`` 200; raises with the log tail on exit or timeout."""
    deadline = time.monotonic() + deadline_s
    pending = list(engines)
    while pending:
        for engine in list(pending):
            if not engine.alive():
                raise RuntimeError(f"engine on port {engine.port} exited:\n{engine.log_tail()}")
            if engine.healthy():
                pending.remove(engine)
        if pending and time.monotonic() > deadline:
            first = pending[0]
            raise TimeoutError(f"engine on port {first.port} not healthy in {deadline_s}s:\n{first.log_tail()}")
        if pending:
            time.sleep(0.05)  # polling interval of the condition wait above


def start_engines(
    n_or_specs: int | Sequence[Sequence[str]],
    args: Sequence[str] = (),
    *,
    log_dir: Path | None = None,
    deadline_s: float = START_DEADLINE_S,
) -> list[Engine]:
    """Start engines and wait until all are healthy.

    ``n_or_specs``: a count (each gets ``args``) or one argument list per engine
    (each gets ``args`` first, then its own). On failure every engine started is stopped.
    """
    specs = [list(args)] * n_or_specs if isinstance(n_or_specs, int) else [[*args, *s] for s in n_or_specs]
    directory = log_dir or Path(os.environ.get("TMPDIR", "/tmp"))
    engines: list[Engine] = []
    try:
        for spec in specs:
            engines.append(spawn_engine(spec, directory))
        wait_healthy(engines, deadline_s)
    except BaseException:
        stop_engines(engines)
        raise
    return engines


def stop_engines(engines: Sequence[Engine]) -> None:
    """Stop engines (all of them, even when one fails to stop)."""
    errors: list[BaseException] = []
    for engine in engines:
        try:
            engine.stop()
        except Exception as exc:  # keep stopping the others
            errors.append(exc)
    if errors:
        raise errors[0]


EngineFactory = Callable[..., list[Engine]]


@pytest.fixture
def engine_factory(tmp_path: Path) -> Iterator[EngineFactory]:
    """``engine_factory(n_or_specs, args=(), deadline_s=...)`` -> engines, all stopped at teardown."""
    started: list[Engine] = []

    def factory(
        n_or_specs: int | Sequence[Sequence[str]], args: Sequence[str] = (), *, deadline_s: float = START_DEADLINE_S
    ) -> list[Engine]:
        engines = start_engines(n_or_specs, args, log_dir=tmp_path, deadline_s=deadline_s)
        started.extend(engines)
        return engines

    yield factory
    stop_engines(started)
