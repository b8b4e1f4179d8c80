"""A real Prometheus (the ``prometheus`` binary) on loopback, for ``kvoffload demo`` and the tests.

It scrapes every second and discovers targets through ``file_sd_configs``; each
target carries the labels the rendered PodMonitor would give its series
(``namespace``, ``pod``, ``kvoffload_io_policy``, ``kvoffload_io_level``, ``kvoffload_io_config_hash``), so
queries run against the same label layout as in a cluster.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import requests
import yaml

PROMETHEUS_BIN = os.environ.get("KVOFFLOAD_PROMETHEUS_BIN", "/usr/bin/prometheus")
SCRAPE_INTERVAL_S = 1.0

T = TypeVar("T")


class PrometheusError(RuntimeError):
    """Prometheus did not start, or what was waited for did not show up in time."""


def wait_until(check: Callable[[], T | None], deadline: float, what: str, poll: float = 0.2) -> T:
    """Poll ``check`` until it returns something truthy; raise PrometheusError naming ``what`` after ``deadline`` s."""
    end = time.monotonic() + deadline
    while True:
        last = check()
        if last:
            return last
        if time.monotonic() >= end:
            raise PrometheusError(f"timed out after {deadline:.0f}s waiting for {what} (last: {last!r})")
        time.sleep(poll)  # a poll interval, not synchronisation: the condition above is what we wait on


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


_SAFE_KEY = re.compile(r"[^A-Za-z0-9_.-]")


@dataclass
class PrometheusServer:
    """A running Prometheus on 127.0.0.1 with a 1 s scrape interval and file-based discovery."""

    workdir: Path
    scrape_interval: float = SCRAPE_INTERVAL_S
    port: int = 0
    process: subprocess.Popen[bytes] | None = None
    config: dict[str, Any] | None = None
    """The configuration to run instead of the file-discovery one (the Prometheus Operator's, adapted)."""
    _files: int = field(default=0)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log(self) -> str:
        path = self.workdir / "prometheus.log"
        return path.read_text(errors="replace") if path.exists() else ""

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self, deadline: float = 30.0, *, port: int | None = None) -> None:
        """Start and wait until ready; on a free port, or on ``port`` (to come back where clients expect it).

        Raises PrometheusError with the log's tail when it does not become ready.
        """
        (self.workdir / "sd").mkdir(parents=True, exist_ok=True)
        interval = f"{round(self.scrape_interval * 1000)}ms"
        config = self.config or {
            "global": {"scrape_interval": interval, "evaluation_interval": interval, "scrape_timeout": interval},
            "scrape_configs": [
                {
                    "job_name": "engines",
                    "file_sd_configs": [{"files": [self.sd_glob], "refresh_interval": "1s"}],
                }
            ],
        }
        self._write_config(config)
        for _attempt in range(3):  # a free port can be taken between probing and binding
            self.port = port or free_port()
            log = (self.workdir / "prometheus.log").open("ab")
            self.process = subprocess.Popen(
                [
                    PROMETHEUS_BIN,
                    f"--config.file={self.workdir / 'prometheus.yml'}",
                    f"--storage.tsdb.path={self.workdir / 'data'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                    "--storage.tsdb.retention.time=1h",
                    "--web.enable-lifecycle",  # POST /-/reload, when the Prometheus Operator's configuration changes
                    "--log.level=warn",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
            log.close()
            if self._wait_ready(deadline):
                return
            self.stop()
        raise PrometheusError(f"Prometheus did not become ready:\n{self.log[-3000:]}")

    @property
    def sd_glob(self) -> str:
        """The files of the file-based discovery (``add_targets``, ``set_target``)."""
        return str(self.workdir / "sd" / "*.json")

    def _write_config(self, config: dict[str, Any]) -> None:
        path = self.workdir / "prometheus.yml"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(yaml.safe_dump(config))
        tmp.rename(path)

    def use_config(self, config: dict[str, Any]) -> None:
        """Run ``config`` from now on: written, and reloaded when running (kept for a later :meth:`start`).

        Raises PrometheusError when Prometheus refuses it."""
        self.config = config
        self._write_config(config)
        if not self.running:
            return
        try:
            answer = requests.post(f"{self.url}/-/reload", timeout=10)
        except requests.RequestException as exc:
            raise PrometheusError(f"Prometheus did not reload: {exc}") from exc
        if answer.status_code != 200:
            raise PrometheusError(f"Prometheus refused the configuration: {answer.text.strip()}")

    def _wait_ready(self, deadline: float) -> bool:
        end = time.monotonic() + deadline
        while time.monotonic() < end:
            assert self.process is not None
            if self.process.poll() is not None:
                return False
            try:
                if requests.get(f"{self.url}/-/ready", timeout=1).status_code == 200:
                    return True
            except requests.RequestException:
                pass
            time.sleep(0.05)  # poll interval
        return False

    def _write_sd(self, final: Path, groups: list[dict[str, Any]]) -> None:
        tmp = final.with_suffix(".tmp")
        tmp.write_text(json.dumps(groups))
        tmp.rename(final)  # atomic: Prometheus never reads half a file

    def add_targets(self, address_labels: Sequence[tuple[str, Mapping[str, str]]]) -> None:
        """Scrape these ``host:port`` targets, each with its target labels (become series labels)."""
        groups = [{"targets": [address], "labels": dict(labels)} for address, labels in address_labels]
        self._files += 1
        self._write_sd(self.workdir / "sd" / f"targets-{self._files}.json", groups)

    def add_engine(
        self,
        address: str,
        *,
        policy: str,
        level: str,
        config_hash: str,
        namespace: str = "llm",
        pod: str | None = None,
    ) -> None:
        """One engine as the PodMonitor would label it."""
        labels = {
            "namespace": namespace,
            "pod": pod or f"{policy}-{level}-{address.rsplit(':', 1)[-1]}",
            "kvoffload_io_policy": policy,
            "kvoffload_io_level": level,
            "kvoffload_io_config_hash": config_hash,
        }
        self.add_targets([(address, labels)])

    def set_target(self, key: str, address: str, labels: Mapping[str, str]) -> None:
        """Scrape ``address`` under a name (e.g. ``namespace/pod``), replacing what that name had."""
        (self.workdir / "sd").mkdir(parents=True, exist_ok=True)
        self._write_sd(self._target_file(key), [{"targets": [address], "labels": dict(labels)}])

    def remove_target(self, key: str) -> None:
        """Stop scraping what :meth:`set_target` added under ``key`` (no error if it is not there)."""
        self._target_file(key).unlink(missing_ok=True)

    def _target_file(self, key: str) -> Path:
        return self.workdir / "sd" / f"target-{_SAFE_KEY.sub('_', key)}.json"

    def query(self, expr: str) -> list[dict[str, Any]]:
        answer = requests.get(f"{self.url}/api/v1/query", params={"query": expr}, timeout=5)
        answer.raise_for_status()
        return list(answer.json()["data"]["result"])

    def wait_for_series(
        self,
        expr: str,
        deadline: float = 30.0,
        count: int = 1,
        check: Callable[[list[dict[str, Any]]], bool] | None = None,
    ) -> list[dict[str, Any]]:
        """Wait until ``expr`` answers with at least ``count`` series (and ``check`` holds); return them."""

        def ready() -> list[dict[str, Any]] | None:
            try:
                result = self.query(expr)
            except requests.RequestException:
                return None
            ok = len(result) >= count and (check is None or check(result))
            return result if ok else None

        return wait_until(ready, deadline, f"{count} series of {expr}")

    def wait_for_targets_up(self, count: int, deadline: float = 30.0) -> None:
        """Wait until ``count`` targets have been scraped successfully."""
        self.wait_for_series("up == 1", deadline, count=count)

    def stop(self) -> None:
        """Stop Prometheus (tests use it to make Prometheus unreachable)."""
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


__all__ = ("PROMETHEUS_BIN", "SCRAPE_INTERVAL_S", "PrometheusError", "PrometheusServer", "free_port", "wait_until")
