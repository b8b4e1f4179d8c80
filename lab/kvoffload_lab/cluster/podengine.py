"""One pod's engine: a ``kvoffload emulate`` process started from the container's command, and the status it shows."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from kvoffload.api.conventions import API_GROUP
from kvoffload_lab.cluster.kubeemu import Obj, now_rfc3339
from kvoffload_lab.processes import end_process_async, reaped

log = logging.getLogger("kvoffload.localcluster")

HOST = "127.0.0.1"
ANNOTATION_PORT = f"localcluster.{API_GROUP}/port"
"""Pod annotation: the loopback port its engine listens on (with its own address, the container's port)."""
CLI = (sys.executable, "-c", "from kvoffload.cli.main import main; main()")
"""``kvoffload`` run by this interpreter: the engines' command, and the operator's."""


class LocalClusterError(RuntimeError):
    """Something the local cluster cannot do (an unknown pod, a container it cannot run)."""


def emulate_argv(serve_args: Sequence[str], extra_args: Sequence[str], port: int, host: str = HOST) -> list[str]:
    """``kvoffload emulate`` with a container's options (``cluster/speakers.py``) and ``extra_args``, on
    ``host:port``."""
    return [*CLI, "emulate", *serve_args, *extra_args, "--host", host, "--port", str(port)]


def container_env(container: Mapping[str, Any], extra: Mapping[str, str]) -> dict[str, str]:
    """The engine's environment: this process's, the container's literal ``env`` values, then ``extra``."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.update({e["name"]: str(e["value"]) for e in container.get("env") or [] if "value" in e})
    env.update(extra)
    return env


def pod_key(pod: Mapping[str, Any]) -> str:
    return f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"


def set_parent_death_signal() -> None:
    """Linux: the engine gets SIGTERM when the process that started it dies, so none outlives a crash."""
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


@dataclasses.dataclass
class PodEngine:
    """The engine process behind one pod, and the container state the kubelet reports for it."""

    namespace: str
    pod: str
    deployment: str
    labels: dict[str, str]
    argv: list[str]
    env: dict[str, str]
    port: int
    log_path: Path
    metrics_path: str = "/metrics"
    """Where its engine serves Prometheus' text (the speaker's, as the PodMonitor of its engine says)."""
    process: subprocess.Popen[bytes] | None = None
    ready: bool = False
    opened: bool = False  # the port answered once since the last (re)start
    restart_count: int = 0
    last_terminated: Obj | None = None
    started_at: str = ""
    failed_probes: int = 0
    terminating: bool = False
    restart_at: float | None = None  # loop time of the next start after a crash (back-off)
    host: str = HOST
    """The pod's IP: 127.0.0.1 (told apart by port), or a loopback address of its own (any 127.x.y.z)."""

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.pod}"

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self) -> None:
        with self.log_path.open("ab") as out:
            self.process = subprocess.Popen(
                self.argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self.env,
                preexec_fn=set_parent_death_signal if sys.platform == "linux" else None,
            )
        self.started_at = now_rfc3339()
        self.ready = self.opened = False
        self.failed_probes = 0

    async def stop(self, grace: float = 5.0) -> None:
        """SIGTERM, then SIGKILL after ``grace`` seconds; returns once the process is gone."""
        process = self.process
        if process is None or process.poll() is not None:
            return
        await end_process_async(process, name=f"the engine of pod {self.key}", grace=grace)

    def terminated(self, *, reason: str) -> None:
        """Record a dead container (lastState, restartCount); it is not serving until restarted."""
        process = self.process
        code = process.returncode if process is not None and process.returncode is not None else -9
        self.last_terminated = {
            "reason": reason,
            "exitCode": 137 if reason == "OOMKilled" else (code if code >= 0 else 128 - code),
            "startedAt": self.started_at,
            "finishedAt": now_rfc3339(),
            "containerID": f"emulated://{process.pid if process else 0}",
        }
        self.restart_count += 1
        self.process = None
        self.ready = self.opened = False
        log.warning("pod %s: engine terminated (%s)", self.key, reason)

    async def oom_kill(self) -> None:
        """Kill the process as the kernel's OOM killer would; the container restarts at once."""
        assert self.process is not None
        self.process.kill()
        await reaped(self.process, name=f"the engine of pod {self.key}")
        self.terminated(reason="OOMKilled")
        self.start()  # the first restart is immediate

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def container_status(self, image: str, name: str = "vllm") -> Obj:
        state: Obj
        if self.alive():
            state = {"running": {"startedAt": self.started_at}}
        elif self.restart_count:
            state = {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off restarting failed container"}}
        else:
            state = {"waiting": {"reason": "ContainerCreating"}}
        status: Obj = {
            "name": name,
            "image": image,
            "imageID": image,
            "containerID": f"emulated://{self.process.pid if self.process else 0}",
            "ready": self.ready,
            "started": self.opened,
            "restartCount": self.restart_count,
            "state": state,
            "lastState": {"terminated": self.last_terminated} if self.last_terminated else {},
        }
        return status

    def pod_status(self, pod: Mapping[str, Any]) -> Obj:
        """The status of the pod this engine serves; a condition's transition time moves only when it changes."""
        containers = ((pod.get("spec") or {}).get("containers")) or [{}]
        image = str(containers[0].get("image", ""))
        name = str(containers[0].get("name", "vllm"))
        ready = "True" if self.ready else "False"
        before = pod.get("status") or {}
        previous = {c.get("type"): c for c in before.get("conditions") or []}

        def condition(type_: str, status: str) -> Obj:
            old = previous.get(type_) or {}
            kept = old.get("status") == status and old.get("lastTransitionTime")
            return {"type": type_, "status": status, "lastTransitionTime": kept or now_rfc3339()}

        return {
            "phase": "Running" if self.alive() or self.restart_count else "Pending",
            "hostIP": HOST,
            "podIP": self.host,
            "podIPs": [{"ip": self.host}],
            "startTime": before.get("startTime") or self.started_at,
            "qosClass": "Guaranteed",
            "conditions": [
                condition("PodScheduled", "True"),
                condition("Initialized", "True"),
                condition("ContainersReady", ready),
                condition("Ready", ready),
            ],
            "containerStatuses": [self.container_status(image, name)],
        }
