"""pytest fixtures: a live vLLM for CPU serving the tiny local model (the realvllm tier).

`make setup` installs vLLM into `.venv-vllm` (scripts/setup-vllm.sh) and builds the model into
`.tiny-model` (scripts/make_tiny_model.py). Without them the tier skips, except under CI
(`CI` set), where a missing part is a failure: CI installs every part itself.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.support.prometheus import free_port, wait_until

ROOT = Path(__file__).resolve().parents[2]
VLLM_BIN = ROOT / ".venv-vllm" / "bin" / "vllm"
TINY_MODEL = ROOT / ".tiny-model"
# The served name of the tiny model; the metrics capture in tests/data was taken with it too.
TINY_MODEL_NAME = "tiny-qwen3"
# About 20-30 s on an idle 2-core machine; generous, because CI shares those cores with the suite.
STARTUP_DEADLINE_S = 240.0
STOP_DEADLINE_S = 30.0


def http_get(url: str, timeout: float = 10.0) -> str:
    """GET a URL and return the body as text; raises on any non-2xx answer."""
    response = requests.get(url, timeout=timeout)
    response.raise_for_status()
    return response.text


def http_post_json(url: str, payload: dict[str, Any], timeout: float = 60.0) -> Any:
    """POST a JSON body and return the decoded JSON answer; raises on any non-2xx answer."""
    response = requests.post(url, json=payload, timeout=timeout)
    response.raise_for_status()
    return response.json()


def _tail(log: Path, lines: int = 40) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])


def _healthy(base_url: str) -> bool:
    try:
        return requests.get(f"{base_url}/health", timeout=2.0).ok
    except requests.RequestException:
        return False


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def _stop(process: subprocess.Popen[bytes]) -> None:
    """Stop vLLM and its children (engine core, worker, resource tracker), which share its process group.

    SIGTERM goes to the API server alone: it shuts its children down and frees their shared memory
    in /dev/shm, which a signal to the whole group would leak. SIGKILL only for what outlives that.
    """
    pgid = process.pid
    process.terminate()
    try:
        process.wait(timeout=STOP_DEADLINE_S)
        wait_until(lambda: not _group_alive(pgid), STOP_DEADLINE_S, "vLLM's children to exit")
    finally:
        if _group_alive(pgid):
            os.killpg(pgid, signal.SIGKILL)
            process.wait(timeout=10)


def _missing_parts() -> list[str]:
    missing = []
    if not VLLM_BIN.exists():
        missing.append(f"{VLLM_BIN.relative_to(ROOT)} (scripts/setup-vllm.sh)")
    if not (TINY_MODEL / "config.json").exists():
        missing.append(f"{TINY_MODEL.relative_to(ROOT)} (scripts/make_tiny_model.py)")
    return missing


@pytest.fixture(scope="session")
def live_vllm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A `vllm serve` of the tiny model on a free loopback port; yields its base URL.

    Ready means `/health` answers. The server and its children are stopped at the end of the session.
    """
    missing = _missing_parts()
    if missing:
        reason = f"real vLLM is not set up: missing {', '.join(missing)}; run `make setup`"
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)

    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    log = tmp_path_factory.mktemp("vllm") / "serve.log"
    env = {
        **os.environ,
        "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB; the default would take a large share of host memory
        "HF_HUB_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
    }
    command = [
        str(VLLM_BIN),
        "serve",
        str(TINY_MODEL),
        "--served-model-name",
        TINY_MODEL_NAME,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--max-model-len",
        "512",
        "--enforce-eager",
    ]
    with log.open("wb") as out:
        process = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT, start_new_session=True
        )

    def ready() -> bool:
        if process.poll() is not None:
            pytest.fail(f"vllm serve exited with {process.returncode} before it was healthy; log:\n{_tail(log)}")
        return _healthy(base_url)

    try:
        wait_until(ready, STARTUP_DEADLINE_S, f"vllm serve /health on {base_url} (log: {log})", poll=0.5)
        yield base_url
    finally:
        _stop(process)
