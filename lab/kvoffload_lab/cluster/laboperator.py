"""The lab's operator: ``kvoffload run`` as a process of its own, pointed at a lab cluster of either API.

A separate process, so a test can SIGKILL it and start it again; it reads the cluster through ``$KUBECONFIG`` and gets
SIGTERM if its parent dies. The lab's leave (:data:`LAB_TENANCY`) lets policies name the lab's Prometheus on
127.0.0.1, and every PodMonitor it writes carries :data:`LAB_MONITOR_LABELS`, which the lab's Prometheus selects.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from kvoffload.policy.tenancy import Tenancy
from kvoffload_lab.cluster.labcluster import LabCluster
from kvoffload_lab.cluster.podengine import CLI, set_parent_death_signal
from kvoffload_lab.processes import end_process_async
from kvoffload_lab.promoperator import LAB_RELEASE, RELEASE_LABEL

LAB_TENANCY = Tenancy(private_prometheus=True)
"""What the lab's operator allows a policy (:func:`operator_command`): its Prometheus on 127.0.0.1."""


LAB_MONITOR_LABELS: Mapping[str, str] = {RELEASE_LABEL: LAB_RELEASE}
"""The labels the lab's operator gives every PodMonitor (``--monitor-label``): what the lab's Prometheus selects."""


def operator_command(
    *,
    standalone: bool = True,
    namespaces: Sequence[str] | None = None,
    metrics_port: int = 0,
    monitor_labels: Mapping[str, str] = LAB_MONITOR_LABELS,
) -> list[str]:
    """The ``kvoffload run`` command line (this interpreter), all namespaces unless some are given.

    The operator's own metrics endpoint is off by default (``metrics_port=0``), so several
    local clusters can run side by side. Policies may name the lab's Prometheus on 127.0.0.1
    (``--prometheus-allow-private``): everything of a lab is on this machine. Every PodMonitor
    carries ``monitor_labels`` (by default ``release: kvoffload-lab``, which the lab's Prometheus
    selects on the real control plane, as kube-prometheus-stack's does).
    """
    command = [*CLI, "run", "--prometheus-allow-private"]
    command += [arg for key, value in monitor_labels.items() for arg in ("--monitor-label", f"{key}={value}")]
    command += [arg for namespace in namespaces for arg in ("-n", namespace)] if namespaces else ["-A"]
    if standalone:
        command.append("--standalone")
    command += ["--metrics-port", str(metrics_port)]
    return command


def start_operator(
    cluster: LabCluster,
    *,
    standalone: bool = True,
    namespaces: Sequence[str] | None = None,
    env: Mapping[str, str] | None = None,
    log_path: Path | None = None,
    extra_args: Sequence[str] = (),
    metrics_port: int = 0,
    monitor_labels: Mapping[str, str] = LAB_MONITOR_LABELS,
) -> subprocess.Popen[bytes]:
    """Run ``kvoffload run -A --standalone`` against the cluster (``$KUBECONFIG``) and return the process;
    ``-n`` for each of ``namespaces``, by default the cluster's :attr:`LabCluster.operator_namespaces`.

    Its output goes to ``log_path`` (default ``<workdir>/operator.log``, appended). The caller
    stops it (:func:`stop_operator`) or kills it; it also gets SIGTERM if the caller dies.
    """
    path = log_path or cluster.workdir / "operator.log"
    with path.open("ab") as out:
        return subprocess.Popen(
            [
                *operator_command(
                    standalone=standalone,
                    namespaces=namespaces if namespaces is not None else cluster.operator_namespaces,
                    metrics_port=metrics_port,
                    monitor_labels=monitor_labels,
                ),
                *extra_args,
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "KUBECONFIG": str(cluster.kubeconfig), "PYTHONUNBUFFERED": "1", **(env or {})},
            preexec_fn=set_parent_death_signal if sys.platform == "linux" else None,
        )


async def stop_operator(process: subprocess.Popen[bytes], grace: float = 10.0) -> int:
    """SIGTERM, then SIGKILL after ``grace`` seconds; returns the exit status."""
    return await end_process_async(process, name="the operator", grace=grace)


@contextlib.asynccontextmanager
async def running_operator(cluster: LabCluster, **kwargs: Any) -> AsyncIterator[subprocess.Popen[bytes]]:
    """:func:`start_operator` for the length of a ``with`` block."""
    process = start_operator(cluster, **kwargs)
    try:
        yield process
    finally:
        await stop_operator(process)
