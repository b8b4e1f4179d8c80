"""End to end on the real kube-apiserver: ``kvoffload run`` with ``--notifications-config`` tells a real local HTTP
receiver of a real transition (a person's pause) and of a spec it judges invalid, each once.

Prometheus is not there (the baseline stays Inconclusive), which changes neither transition.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes.client
import kubernetes.config
import pytest
import yaml

from kvoffload.api.conventions import API_GROUP, API_VERSION, KIND, PAUSE, PLURAL
from kvoffload_lab.controlplane import ControlPlane
from tests.controller.test_operator_kopf import quick_spec
from tests.support.receiver import Receiver

pytestmark = pytest.mark.kube

NS = "default"


@contextlib.contextmanager
def kvoffload_run(kubeconfig: Path, *args: str) -> Iterator[subprocess.Popen[bytes]]:
    """``kvoffload run ARGS`` as the image runs it, against ``kubeconfig``; stopped with SIGTERM at the end."""
    process = subprocess.Popen(
        [sys.executable, "-c", "from kvoffload.cli.main import main; main()", "run", *args],
        env={**os.environ, "KUBECONFIG": str(kubeconfig)},
    )
    try:
        yield process
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def policy(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": f"{API_GROUP}/{API_VERSION}", "kind": KIND, "metadata": {"name": name}, "spec": spec}


def wait_until(check: Any, what: str, timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (found := check()):
        assert time.monotonic() < deadline, f"no {what} within {timeout}s"
        time.sleep(0.2)  # polls another process (the API server), with a deadline
    return found


def test_the_operator_tells_a_real_pause_and_an_invalid_spec_to_a_real_receiver(
    real_cluster: ControlPlane, tmp_path: Path
) -> None:
    told = {"notifications": {"sinks": ["team"]}}
    with (
        Receiver() as receiver,
        kubernetes.config.new_client_from_config(config_file=str(real_cluster.kubeconfig)) as api,
    ):
        config = tmp_path / "notifications.yaml"
        config.write_text(yaml.safe_dump({"sinks": [{"name": "team", "url": receiver.url, "backoffSeconds": 0.2}]}))
        custom = kubernetes.client.CustomObjectsApi(api)

        def status(name: str) -> dict[str, Any]:
            body = custom.get_namespaced_custom_object(API_GROUP, API_VERSION, NS, PLURAL, name)
            return dict(body.get("status") or {})

        with kvoffload_run(
            real_cluster.kubeconfig,
            "-A",
            "--standalone",
            "--metrics-port",
            "0",
            "--prometheus-allow-private",
            "--notifications-config",
            str(config),
        ):
            spec = {**quick_spec(prometheus="http://127.0.0.1:9"), **told}  # nothing listens: Inconclusive
            custom.create_namespaced_custom_object(API_GROUP, API_VERSION, NS, PLURAL, policy("chat", spec))
            wait_until(lambda: status("chat").get("phase") == "Baseline", "baseline")
            patch = {"metadata": {"annotations": {PAUSE: "now"}}}
            custom.patch_namespaced_custom_object(API_GROUP, API_VERSION, NS, PLURAL, "chat", patch)
            (paused,) = receiver.wait_for(1, timeout=60)

            broken = {**spec, "gpu": {"class": "nvidia-nonexistent"}}  # the schema takes it; the catalog does not
            custom.create_namespaced_custom_object(API_GROUP, API_VERSION, NS, PLURAL, policy("broken", broken))
            _, invalid = receiver.wait_for(2, timeout=60)
            for _ in range(3):  # three more analyses of the paused policy, each written: nothing more to tell
                seen = status("chat")["lastAnalysis"]["time"]
                wait_until(lambda seen=seen: status("chat")["lastAnalysis"]["time"] != seen, "another analysis")
            history = status("chat")["history"]
            assert status("chat")["phase"] == "Paused"

    assert (paused["event"], paused["policy"], paused["reason"]) == (
        "Paused",
        {"namespace": NS, "name": "chat"},
        "Paused",
    )
    assert paused["time"] == next(h["time"] for h in history if h["decision"] == "Pause")
    assert (invalid["event"], invalid["policy"]["name"], invalid["phase"]) == ("Invalid", "broken", "Invalid")
    assert "spec.gpu.class" in invalid["message"]
    assert len(receiver.bodies) == 2  # the operator ran on, and told neither again


def test_the_real_api_server_refuses_a_repeated_sink(real_cluster: ControlPlane) -> None:
    # x-kubernetes-list-type: set, the schema's twin of the model's check.
    spec = {**quick_spec(), "notifications": {"sinks": ["team", "team"]}}
    with kubernetes.config.new_client_from_config(config_file=str(real_cluster.kubeconfig)) as api:
        custom = kubernetes.client.CustomObjectsApi(api)
        with pytest.raises(kubernetes.client.ApiException) as refused:
            custom.create_namespaced_custom_object(API_GROUP, API_VERSION, NS, PLURAL, policy("twice", spec))
    assert refused.value.status == 422
    assert "spec.notifications.sinks[1]: Duplicate value" in str(refused.value.body)
