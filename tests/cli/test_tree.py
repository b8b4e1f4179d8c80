"""``kvoffload get NAME``: the tree of a policy, its Deployments, their ReplicaSets and pods, rendered from objects
shaped as the API server serves them (the policy is a capture of a real run, tests/data/status/canary.json)."""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from kvoffload.cli import tree
from kvoffload.cli.main import main
from tests.support.status_fixtures import load

NOW = datetime(2026, 12, 1, 11, 0, 0, tzinfo=UTC)
Obj = dict[str, Any]


def stamp(ago: timedelta) -> str:
    return (NOW - ago).strftime("%Y-%m-%dT%H:%M:%SZ")


def owner(obj: Obj) -> list[Obj]:
    meta = obj["metadata"]
    return [
        {"apiVersion": "apps/v1", "kind": obj["kind"], "name": meta["name"], "uid": meta["uid"], "controller": True}
    ]


def deployment(name: str, level: str, config: str, *, replicas: int, ready: int, policy: Obj) -> Obj:
    return {
        "kind": "Deployment",
        "metadata": {
            "name": name,
            "namespace": "default",
            "uid": f"uid-{name}",
            "creationTimestamp": stamp(timedelta(minutes=5)),
            "labels": {"kvoffload.io/policy": "climb", "kvoffload.io/level": level, "kvoffload.io/config-hash": config},
            "ownerReferences": [{"kind": "KVOffloadPolicy", "name": "climb", "uid": policy["metadata"]["uid"]}],
        },
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"kvoffload.io/level": level}}},
        "status": {"readyReplicas": ready, "updatedReplicas": replicas, "availableReplicas": ready},
    }


def replicaset(name: str, of: Obj, revision: int, *, replicas: int, ready: int) -> Obj:
    return {
        "kind": "ReplicaSet",
        "metadata": {
            "name": name,
            "uid": f"uid-{name}",
            "creationTimestamp": stamp(timedelta(minutes=revision)),
            "annotations": {"deployment.kubernetes.io/revision": str(revision)},
            "labels": dict(of["metadata"]["labels"]),
            "ownerReferences": owner(of),
        },
        "spec": {"replicas": replicas},
        "status": {"readyReplicas": ready},
    }


def pod(name: str, of: Obj, *, ready: bool, restarts: int = 0, waiting: str | None = None, oom: bool = False) -> Obj:
    state: Obj = {"waiting": {"reason": waiting}} if waiting else {"running": {}}
    container: Obj = {"name": "vllm", "ready": ready, "restartCount": restarts, "state": state}
    if oom:
        container["lastState"] = {"terminated": {"reason": "OOMKilled", "exitCode": 137}}
    return {
        "kind": "Pod",
        "metadata": {
            "name": name,
            "uid": f"uid-{name}",
            "creationTimestamp": stamp(timedelta(seconds=90)),
            "labels": {"kvoffload.io/config-hash": of["metadata"]["labels"]["kvoffload.io/config-hash"]},
            "ownerReferences": owner(of),
        },
        "spec": {"nodeName": "gpu-node-1", "containers": [{"name": "vllm"}]},
        "status": {
            "phase": "Running",
            "podIP": "10.0.0.7",
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
            "containerStatuses": [container],
        },
    }


def canary_tree() -> tree.Tree:
    """The captured canary policy (stable gpu-only 2/2 at 3fea9bdd89, canary cpu 1/1 at ee5dd7e9c4) with its
    Deployments, an old ReplicaSet scaled down beside the stable's new one, a canary pod OOM-killed once, and a
    Deployment of a level the status no longer names."""
    policy = load("canary")
    policy["metadata"]["creationTimestamp"] = stamp(timedelta(minutes=6))
    policy["status"]["lastAnalysis"]["time"] = (NOW - timedelta(seconds=12)).isoformat()
    stable = deployment("climb-gpu-only", "gpu-only", "3fea9bdd89", replicas=2, ready=2, policy=policy)
    canary = deployment("climb-cpu", "cpu", "ee5dd7e9c4", replicas=1, ready=0, policy=policy)
    old = deployment("climb-nvme", "nvme", "0000000000", replicas=0, ready=0, policy=policy)
    stable_new = replicaset("climb-gpu-only-7d9", stable, 2, replicas=2, ready=2)
    stable_old = replicaset("climb-gpu-only-5c4", stable, 1, replicas=0, ready=0)
    canary_rs = replicaset("climb-cpu-6b8", canary, 1, replicas=1, ready=0)
    pods = [
        pod("climb-gpu-only-7d9-b", stable_new, ready=True),
        pod("climb-gpu-only-7d9-a", stable_new, ready=True),
        pod("climb-cpu-6b8-x", canary_rs, ready=False, restarts=1, waiting="CrashLoopBackOff", oom=True),
    ]
    # Out of order on purpose: the tree sorts (roles, revisions, names).
    return tree.Tree(policy, (old, canary, stable), (stable_old, canary_rs, stable_new), tuple(pods))


def test_the_tree_shows_the_policy_then_stable_and_canary_with_their_replicasets_and_pods() -> None:
    lines = tree.render(canary_tree(), NOW)
    assert lines[:7] == [
        "Name:          climb",
        "Namespace:     default",
        "Phase:         Canary",
        "Level:         1 cpu (step canary)",
        "Ladder:        gpu-only ✓ → [cpu canary] → nvme",
        "Ready:         False (RolloutInProgress)",
        f"Message:       {load('canary')['status']['message']}",
    ]
    assert lines[7] == "Last verdict:  Inconclusive 12s ago: no canary requests seen in the window"
    assert lines[8] == ""
    rows = [line.rstrip() for line in lines[9:]]
    assert rows == [
        "NAME                             KIND             STATUS              AGE  INFO",
        "⟳ climb                          KVOffloadPolicy  Canary              6m   level 1 cpu",
        "├──# climb-gpu-only              Deployment       ✔ Healthy           5m   stable, level gpu-only, ready 2/2",
        "│  ├──⧉ climb-gpu-only-7d9       ReplicaSet       ✔ Healthy           2m   revision 2, ready 2/2",
        "│  │  ├──□ climb-gpu-only-7d9-a  Pod              ✔ Running           90s  ready 1/1, restarts 0",
        "│  │  └──□ climb-gpu-only-7d9-b  Pod              ✔ Running           90s  ready 1/1, restarts 0",
        "│  └──⧉ climb-gpu-only-5c4       ReplicaSet       • ScaledDown        60s  revision 1, ready 0/0",
        "├──# climb-cpu                   Deployment       ◌ Progressing       5m   canary, level cpu, ready 0/1",
        "│  └──⧉ climb-cpu-6b8            ReplicaSet       ◌ Progressing       60s  revision 1, ready 0/1",
        "│     └──□ climb-cpu-6b8-x       Pod              ✖ CrashLoopBackOff  90s  ready 0/1, restarts 1",
        "└──# climb-nvme                  Deployment       • ScaledDown        5m   not in status, level nvme, ready 0/0",  # noqa: E501
    ]


def test_wide_adds_node_ip_and_config_hash_and_keeps_the_rest() -> None:
    narrow, wide = tree.render(canary_tree(), NOW), tree.render(canary_tree(), NOW, wide=True)
    assert len(narrow) == len(wide)
    assert wide[9].split() == ["NAME", "KIND", "STATUS", "AGE", "INFO", "NODE", "IP", "CONFIG"]
    pod_row = next(line for line in wide if "climb-gpu-only-7d9-a" in line)
    assert pod_row.split()[-3:] == ["gpu-node-1", "10.0.0.7", "3fea9bdd89"]
    deployment_row = next(line for line in wide if "# climb-cpu " in line)
    assert deployment_row.split()[-3:] == ["-", "-", "ee5dd7e9c4"]
    for short, long in zip(narrow[9:], wide[9:], strict=True):
        assert long.startswith(short.rstrip()[: len(short.rstrip()) - 1])


def test_a_pod_oom_killed_and_not_ready_says_so_when_it_is_not_crash_looping() -> None:
    found = canary_tree()
    oom = copy.deepcopy(found.pods[2])
    oom["status"]["containerStatuses"][0]["state"] = {"running": {}}
    assert tree.pod_status(oom) == "✖ OOMKilled"
    oom["status"]["containerStatuses"][0]["state"] = {"waiting": {"reason": "ContainerCreating"}}
    oom["status"]["containerStatuses"][0].pop("lastState")
    assert tree.pod_status(oom) == "◌ ContainerCreating"
    oom["metadata"]["deletionTimestamp"] = stamp(timedelta(seconds=1))
    assert tree.pod_status(oom) == "◌ Terminating"


def test_the_document_nests_the_same_objects_for_json_and_yaml() -> None:
    doc = tree.document(canary_tree(), NOW)
    assert doc["policy"] | {"message": ""} == {
        "name": "climb",
        "namespace": "default",
        "phase": "Canary",
        "level": 1,
        "levelName": "cpu",
        "step": "canary",
        "ladder": "gpu-only ✓ → [cpu canary] → nvme",
        "ready": "False",
        "reason": "RolloutInProgress",
        "message": "",
        "lastVerdict": {
            "verdict": "Inconclusive",
            "time": "2026-12-01T10:59:48Z",
            "age": "12s",
            "message": "no canary requests seen in the window",
        },
        "age": "6m",
    }
    assert [(d["name"], d["role"], d["level"], d["ready"], d["replicas"]) for d in doc["deployments"]] == [
        ("climb-gpu-only", "stable", "gpu-only", 2, 2),
        ("climb-cpu", "canary", "cpu", 0, 1),
        ("climb-nvme", None, "nvme", 0, 0),
    ]
    stable_sets = doc["deployments"][0]["replicaSets"]
    assert [(r["name"], r["revision"], len(r["pods"])) for r in stable_sets] == [
        ("climb-gpu-only-7d9", 2, 2),
        ("climb-gpu-only-5c4", 1, 0),
    ]
    (crashing,) = doc["deployments"][1]["replicaSets"][0]["pods"]
    assert crashing == {
        "name": "climb-cpu-6b8-x",
        "phase": "Running",
        "status": "CrashLoopBackOff",
        "ready": False,
        "readyContainers": "0/1",
        "restarts": 1,
        "age": "90s",
        "node": "gpu-node-1",
        "ip": "10.0.0.7",
    }
    assert json.loads(json.dumps(doc)) == yaml.safe_load(yaml.safe_dump(doc))


def test_a_policy_the_operator_has_not_acted_on_shows_its_deployments_without_roles() -> None:
    found = canary_tree()
    pending = copy.deepcopy(dict(found.policy))
    pending.pop("status")
    lines = tree.render(tree.Tree(pending, found.deployments, found.replicasets, found.pods), NOW)
    assert "Phase:         Pending" in lines
    assert "Ready:         -" in lines
    assert "Last verdict:  none" in lines
    assert sum("not in status" in line for line in lines) == 3


def test_the_deployment_a_policy_took_over_is_shown_as_taken_over() -> None:
    found = canary_tree()
    theirs = deployment("chat", "-", "-", replicas=0, ready=0, policy=found.policy)
    theirs["metadata"]["labels"] = {"app": "chat"}
    taken = tree.Tree(found.policy, (*found.deployments, theirs), found.replicasets, found.pods, original="chat")
    assert tree.role(theirs, None, "chat") == tree.ORIGINAL
    rows = [line.split("  ")[0] for line in tree.render(taken, NOW) if "Deployment" in line]
    # After the roles the status names, before a Deployment it names in none.
    assert rows == ["├──# climb-gpu-only", "├──# climb-cpu", "├──# chat", "└──# climb-nvme"]
    (line,) = [line for line in tree.render(taken, NOW) if "├──# chat " in line]
    assert "taken-over, level -, ready 0/0" in line


def test_get_refuses_a_timeout_without_watch_before_any_request() -> None:
    result = CliRunner().invoke(main, ["get", "chat", "--timeout", "10s", "--kubeconfig", "/nonexistent"])
    assert result.exit_code == 2
    assert "--timeout needs --watch" in result.output


@pytest.mark.parametrize("output", ["table", "wide", "json", "yaml", "name"])
def test_get_offers_every_output_format(output: str) -> None:
    help_text = CliRunner().invoke(main, ["get", "--help"]).output
    assert output in help_text
