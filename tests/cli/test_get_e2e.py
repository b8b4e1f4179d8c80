"""The real operator (``kvoffload run --log-format json -v``) on the real kube-apiserver, once for this module:
``kvoffload get`` (and ``kubectl kvoffload get``) shows the Deployment it wrote, the ReplicaSet the real
kube-controller-manager made of it and that ReplicaSet's pods; and every line the operator wrote to stderr, kopf's
and the operator's own, is one JSON object with a level and a message.

A second policy meets a Deployment of its name that someone else owns, so the operator's own logger warns (the
NotOwned refusal) and the JSON log has lines of both kopf's loggers and the operator's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from kvoffload.api.conventions import API_GROUP, API_VERSION, KIND
from tests.support.controlplane import Kube, wait_for
from tests.support.status_fixtures import load

pytestmark = pytest.mark.kube

KVOFFLOAD = [sys.executable, "-c", "from kvoffload.cli.main import main; main()"]


def policy(name: str, namespace: str) -> dict[str, Any]:
    spec = load("canary")["spec"]
    spec["prometheus"] = {"url": "http://127.0.0.1:9"}  # nothing answers: the analysis is Inconclusive, no matter
    meta = {"name": name, "namespace": namespace}
    return {"apiVersion": f"{API_GROUP}/{API_VERSION}", "kind": KIND, "metadata": meta, "spec": spec}


def someone_elses(name: str, namespace: str) -> dict[str, Any]:
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace, "labels": {"team": "other"}},
        "spec": {
            "replicas": 0,
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": {"containers": [{"name": "c", "image": "busybox"}]}},
        },
    }


@dataclass(frozen=True)
class Run:
    namespace: str
    table: str
    wide: str
    document: dict[str, Any]
    as_plugin: subprocess.CompletedProcess[str]
    log: list[str]


def run_cli(kube: Kube, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KUBECONFIG": str(kube.kubeconfig)}
    return subprocess.run([*KVOFFLOAD, *args], env=env, capture_output=True, text=True, timeout=60, check=False)


@pytest.fixture(scope="module")
def operated(kube_crd: Kube, tmp_path_factory: pytest.TempPathFactory) -> Run:
    kube = kube_crd
    namespace = kube.namespace("get")
    kube.kubectl("apply", "-f", "-", stdin=json.dumps(someone_elses("theirs-gpu-only", namespace)))
    for name in ("chat", "theirs"):
        kube.kubectl("apply", "-f", "-", stdin=json.dumps(policy(name, namespace)))
    log = tmp_path_factory.mktemp("operator") / "stderr.log"
    env = {**os.environ, "KUBECONFIG": str(kube.kubeconfig)}
    env.pop("KUBERNETES_SERVICE_HOST", None)
    args = ["run", "-n", namespace, "--standalone", "--metrics-port", "0", "--prometheus-allow-private", "-v"]
    with log.open("wb") as err:
        operator = subprocess.Popen(
            [*KVOFFLOAD, *args, "--log-format", "json"], stdout=subprocess.DEVNULL, stderr=err, env=env
        )
    try:

        def tree_with_pods() -> dict[str, Any] | None:
            done = run_cli(kube, "get", "chat", "-n", namespace, "-o", "json")
            if done.returncode != 0:
                return None
            doc: dict[str, Any] = json.loads(done.stdout)
            sets = [rs for d in doc["deployments"] for rs in d["replicaSets"]]
            return doc if sets and sum(len(rs["pods"]) for rs in sets) == 2 else None

        wait_for(lambda: operator.poll() is not None or tree_with_pods(), "the stable Deployment's two pods", 120)
        assert operator.poll() is None, f"the operator exited {operator.returncode}:\n{log.read_text()[-3000:]}"
        wait_for(lambda: "theirs-gpu-only" in log.read_text(), "the operator's NotOwned warning", 60)
        document = tree_with_pods()
        assert document is not None
        table = run_cli(kube, "get", "chat", "-n", namespace)
        wide = run_cli(kube, "get", "chat", "-n", namespace, "-o", "wide")
        assert table.returncode == wide.returncode == 0, table.stderr + wide.stderr
        # kubectl runs the kubectl-kvoffload beside this Python (the console script pip installs) from $PATH.
        plugin_env = {**env, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"}
        as_plugin = subprocess.run(
            [kube.kubectl_path, "kvoffload", "get", "chat", "-n", namespace],
            env=plugin_env, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
    finally:
        operator.terminate()
        try:
            operator.wait(20)
        except subprocess.TimeoutExpired:
            operator.kill()
            operator.wait()
    return Run(namespace, table.stdout, wide.stdout, document, as_plugin, log.read_text().splitlines())


def name_column(text: str) -> list[str]:
    """The tree's NAME cells (branches drawn) of ``kvoffload get``'s table, below its header."""
    lines = text.splitlines()
    header = lines.index("") + 1
    width = lines[header].index("KIND")
    return [line[:width].rstrip() for line in lines[header + 1 :]]


def test_get_lists_the_deployment_the_operator_wrote_its_replicaset_and_its_pods(operated: Run) -> None:
    doc = operated.document
    assert doc["policy"]["name"] == "chat"
    assert doc["policy"]["namespace"] == operated.namespace
    assert doc["policy"]["phase"] in {"Baseline", "Paused"}  # no Prometheus answers: it cannot climb
    (stable,) = doc["deployments"]
    assert (stable["name"], stable["role"], stable["level"], stable["replicas"]) == (
        "chat-gpu-only",
        "stable",
        "gpu-only",
        2,
    )
    (replicaset,) = stable["replicaSets"]  # made by kube-controller-manager, owned by the Deployment
    assert replicaset["name"].startswith("chat-gpu-only-")
    assert replicaset["revision"] == 1
    assert [p["name"].rpartition("-")[0] for p in replicaset["pods"]] == [replicaset["name"]] * 2
    assert all(p["restarts"] == 0 and p["readyContainers"].endswith("/1") for p in replicaset["pods"])  # one engine


def test_the_table_draws_the_same_tree_and_wide_adds_the_columns(operated: Run) -> None:
    assert operated.table.splitlines()[0] == "Name:          chat"
    names = name_column(operated.table)
    (replicaset,) = operated.document["deployments"][0]["replicaSets"]
    pods = [p["name"] for p in replicaset["pods"]]
    assert names == [
        "⟳ chat",
        "└──# chat-gpu-only",
        f"   └──⧉ {replicaset['name']}",
        f"      ├──□ {pods[0]}",
        f"      └──□ {pods[1]}",
    ]
    header = operated.wide.splitlines()[operated.wide.splitlines().index("") + 1]
    assert header.split() == ["NAME", "KIND", "STATUS", "AGE", "INFO", "NODE", "IP", "CONFIG"]


def test_kubectl_kvoffload_get_prints_the_same_tree(operated: Run) -> None:
    assert operated.as_plugin.returncode == 0, operated.as_plugin.stderr
    assert operated.as_plugin.stdout.splitlines()[:2] == operated.table.splitlines()[:2]  # name, namespace
    assert name_column(operated.as_plugin.stdout) == name_column(operated.table)


def test_every_line_the_operator_logged_is_json_with_a_level_and_a_message(operated: Run) -> None:
    assert len(operated.log) > 10
    records = []
    for number, line in enumerate(operated.log, 1):
        try:
            record = json.loads(line)
        except ValueError:
            pytest.fail(f"stderr line {number} is not JSON: {line[:300]}")
        assert isinstance(record, dict)
        assert {"time", "level", "logger", "message"} <= record.keys(), line[:300]
        records.append(record)
    loggers = {r["logger"].split(".")[0] for r in records}
    assert {"kopf", "kvoffload"} <= loggers, loggers
    ours = [r for r in records if r["logger"].startswith("kvoffload") and "theirs-gpu-only" in r["message"]]
    assert any(r["level"] == "WARNING" and "will not adopt" in r["message"] for r in ours), ours
    assert {r["level"] for r in records} <= {"DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"}
    # kopf's per-object records keep the object they are about.
    assert any((r.get("object") or {}).get("name") == "chat" for r in records)
