"""Argo CD's verdict on a Deployment a policy took over (``spec.workloadRef``), from Argo CD's own code.

``tools/argocd-diff`` is built from Argo CD v3.2.11 (the Go module proxy serves it; ``tools/argocd-diff/build.sh``,
run by ``make kube``, or here when its stamp is stale). It answers Synced or OutOfSync with the settings, tracking
and diff calls of Argo CD's application controller (``CompareAppState``), and gives what a sync with
``RespectIgnoreDifferences=true`` applies (``normalizeTargetResources``).

On the real control plane (marker ``kube``), examples/workloads/deployment.yaml is applied as Argo CD's default,
client-side sync applies it (``kubectl apply`` of the manifest with Argo CD's tracking annotation), then taken over
as the operator takes it over: scaled to 0 through ``/scale`` and annotated with the replicas it ran and the policy
that took it (field manager ``kvoffload``). Then, with the ``ignoreDifferences`` of
examples/workloads/argocd-application.yaml (the ones docs/workloads.md gives), the Deployment is Synced, and
without them OutOfSync; a sync with ``RespectIgnoreDifferences=true`` keeps it at 0 and keeps the annotations, and
a sync without it scales it back up. The syncs run ``kubectl apply`` and ``kubectl replace``, the commands whose
code Argo CD's sync runs (gitops-engine's ``ApplyResource`` and, under ``Replace=true``, ``ReplaceResource``).
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from kvoffload.api.conventions import ANNOTATION_ORIGINAL_REPLICAS, ANNOTATION_TAKEN_BY
from kvoffload.api.status import WorkloadStatus
from kvoffload.controller.gateway import FIELD_MANAGER, PolicyRef
from kvoffload.controller.takeover import RELEASED, holding
from kvoffload_lab.controlplane import default_bin_dir
from tests.support.controlplane import Kube, unavailable, wait_for
from tests.support.paths import EXAMPLES, ROOT

pytestmark = [pytest.mark.kube, pytest.mark.timeout(900)]  # a cold build of argocd-diff: about 6 min on 2 cores

WORKLOADS = EXAMPLES / "workloads"
BUILD = ROOT / "tools" / "argocd-diff" / "build.sh"
POLICY = "qwen3-chat"
"""examples/workloads/policy.yaml's name."""


def go_command() -> str | None:
    """go on PATH, else where the Go tarball installs it (as tools/argocd-diff/build.sh looks)."""
    found = shutil.which("go")
    if found is None and os.access("/usr/local/go/bin/go", os.X_OK):
        found = "/usr/local/go/bin/go"
    return found


@pytest.fixture(scope="module")
def argocd_diff() -> Path:
    """The argocd-diff binary in .kube-bin (or $KVOFFLOAD_KUBE_BIN), built or brought up to date first."""
    if go_command() is None:
        unavailable("no go command: tools/argocd-diff/build.sh builds Argo CD's diff from the Go module proxy")
    out = default_bin_dir()
    result = subprocess.run(
        [str(BUILD), str(out)], capture_output=True, text=True, timeout=1500, check=False
    )  # cold: a few minutes on 2 cores
    if result.returncode != 0:
        pytest.fail(f"{BUILD} exited {result.returncode}:\n{result.stdout}{result.stderr}")
    return out / "argocd-diff"


def documents(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((WORKLOADS / name).read_text()) if d]


def one(name: str, kind: str) -> dict[str, Any]:
    (found,) = [d for d in documents(name) if d["kind"] == kind]
    return found


APPLICATION = one("argocd-application.yaml", "Application")
GIT_DEPLOYMENT = one("deployment.yaml", "Deployment")
DOCUMENTED_IGNORES: list[dict[str, Any]] = APPLICATION["spec"]["ignoreDifferences"]


def pointer(annotation: str) -> str:
    """The JSON pointer (RFC 6901) of an annotation: ``/`` in the key written ``~1``."""
    return "/metadata/annotations/" + annotation.replace("~", "~0").replace("/", "~1")


def with_pointers(pointers: list[str]) -> list[dict[str, Any]]:
    """The documented rule for the Deployment with only ``pointers``."""
    (rule,) = DOCUMENTED_IGNORES
    return [{**rule, "jsonPointers": pointers}]


class ArgoCD:
    """Argo CD's view of one Application's resources, from the argocd-diff binary."""

    def __init__(self, binary: Path, app: dict[str, Any]) -> None:
        self.binary = binary
        self.app = {"name": app["metadata"]["name"], "destinationNamespace": app["spec"]["destination"]["namespace"]}

    def compare(self, config: dict[str, Any], live: dict[str, Any], ignores: list[dict[str, Any]]) -> dict[str, Any]:
        request = {"config": config, "live": live, "ignoreDifferences": ignores, "app": self.app}
        result = subprocess.run(
            [str(self.binary)], input=json.dumps(request), capture_output=True, text=True, timeout=60, check=False
        )
        assert result.returncode == 0, result.stderr
        answer: dict[str, Any] = json.loads(result.stdout)
        return answer

    def sync_status(self, config: dict[str, Any], live: dict[str, Any], ignores: list[dict[str, Any]]) -> str:
        status: str = self.compare(config, live, ignores)["sync"]
        return status


@pytest.fixture(scope="module")
def argocd(argocd_diff: Path) -> ArgoCD:
    return ArgoCD(argocd_diff, APPLICATION)


# --- offline: the documented rules are the ones the operator needs -----------------------------------------------


def test_the_documented_rules_name_the_example_deployment_and_the_operators_annotations() -> None:
    (rule,) = DOCUMENTED_IGNORES
    meta = GIT_DEPLOYMENT["metadata"]
    assert (rule["group"], rule["kind"]) == ("apps", "Deployment")
    assert (rule["name"], rule["namespace"]) == (meta["name"], meta["namespace"])
    assert rule["jsonPointers"] == [
        "/spec/replicas",
        pointer(ANNOTATION_ORIGINAL_REPLICAS),
        pointer(ANNOTATION_TAKEN_BY),
    ]
    assert "RespectIgnoreDifferences=true" in APPLICATION["spec"]["syncPolicy"]["syncOptions"]


def test_docs_give_the_same_rules_as_the_example() -> None:
    text = (ROOT / "docs" / "workloads.md").read_text()
    for line in ("/spec/replicas", pointer(ANNOTATION_ORIGINAL_REPLICAS), pointer(ANNOTATION_TAKEN_BY)):
        assert line in text
    assert "RespectIgnoreDifferences=true" in text


# --- on the real control plane -------------------------------------------------------------------------------------


@pytest.fixture
def synced(control_plane: Kube, argocd: ArgoCD) -> Iterator[tuple[Kube, dict[str, Any]]]:
    """The example Deployment as an Argo CD sync leaves it, then deleted. Returns the plane and the config Argo CD
    compares (Git's manifest with its tracking annotation)."""
    meta = GIT_DEPLOYMENT["metadata"]
    control_plane.ensure_namespace(meta["namespace"])
    config = argocd.compare(GIT_DEPLOYMENT, GIT_DEPLOYMENT, [])["config"]
    assert config["metadata"]["annotations"]["argocd.argoproj.io/tracking-id"] == (
        f"{APPLICATION['metadata']['name']}:apps/Deployment:{meta['namespace']}/{meta['name']}"
    )
    control_plane.kubectl("apply", "-f", "-", stdin=json.dumps(config))
    try:
        yield control_plane, config
    finally:
        control_plane.run("delete", "deployment", meta["name"], "-n", meta["namespace"], "--wait=false")


def live_of(kube: Kube) -> dict[str, Any]:
    meta = GIT_DEPLOYMENT["metadata"]
    live: dict[str, Any] = kube.get("deployment", meta["name"], "-n", meta["namespace"])
    return live


def operator_patch(kube: Kube, replicas: int, annotations: dict[str, str | None]) -> dict[str, Any]:
    """The merge patch ``KubernetesGateway.scale_workload`` sends (replicas and the operator's annotations, None
    removing one), as field manager kvoffload; the Deployment as it is then."""
    meta = GIT_DEPLOYMENT["metadata"]
    body = {"metadata": {"annotations": annotations}, "spec": {"replicas": replicas}}
    kube.kubectl(
        "patch", "deployment", meta["name"], "-n", meta["namespace"], f"--field-manager={FIELD_MANAGER}",
        "--type=merge", "-p", json.dumps(body),
    )  # fmt: skip
    return live_of(kube)


def held(replicas: int) -> WorkloadStatus:
    meta = GIT_DEPLOYMENT["metadata"]
    return WorkloadStatus(
        name=meta["name"], template_digest="-", original_replicas=GIT_DEPLOYMENT["spec"]["replicas"], replicas=replicas
    )


def take_over(kube: Kube) -> dict[str, Any]:
    """What the operator does to the Deployment once its own engines serve: scale it to 0, annotated with the
    replicas it ran and the policy that holds it (``controller/takeover.py``'s ``hand_over``)."""
    ref = PolicyRef(GIT_DEPLOYMENT["metadata"]["namespace"], POLICY, "uid")
    return operator_patch(kube, 0, dict(holding(ref, held(0))))


def test_a_fresh_sync_is_synced_whatever_the_deployment_controller_adds(
    synced: tuple[Kube, dict[str, Any]], argocd: ArgoCD
) -> None:
    kube, config = synced
    wait_for(
        lambda: "deployment.kubernetes.io/revision" in live_of(kube)["metadata"].get("annotations", {}),
        "the Deployment controller's revision annotation",
    )
    live = live_of(kube)
    assert live["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"]
    assert argocd.sync_status(config, live, []) == "Synced"
    assert argocd.sync_status(config, live, DOCUMENTED_IGNORES) == "Synced"


def test_taken_over_it_stays_synced_with_the_documented_rules_and_is_out_of_sync_without(
    synced: tuple[Kube, dict[str, Any]], argocd: ArgoCD
) -> None:
    kube, config = synced
    live = take_over(kube)
    assert live["spec"]["replicas"] == 0
    annotations = live["metadata"]["annotations"]
    assert annotations[ANNOTATION_ORIGINAL_REPLICAS] == str(GIT_DEPLOYMENT["spec"]["replicas"])
    assert annotations[ANNOTATION_TAKEN_BY] == POLICY

    assert argocd.sync_status(config, live, DOCUMENTED_IGNORES) == "Synced"
    without = argocd.compare(config, live, [])
    assert without["sync"] == "OutOfSync"
    # The difference Argo CD shows is the replica count: Git's 4 against the live 0.
    assert without["predictedLive"]["spec"]["replicas"] == GIT_DEPLOYMENT["spec"]["replicas"]
    assert without["normalizedLive"]["spec"]["replicas"] == 0
    # The replicas decide it: the annotations the operator adds are not in Git, and Argo CD's three-way diff
    # leaves out fields that neither Git nor the last applied configuration has.
    assert argocd.sync_status(config, live, with_pointers(["/spec/replicas"])) == "Synced"
    annotations_only = [pointer(ANNOTATION_ORIGINAL_REPLICAS), pointer(ANNOTATION_TAKEN_BY)]
    assert argocd.sync_status(config, live, with_pointers(annotations_only)) == "OutOfSync"


def test_a_sync_that_respects_the_rules_keeps_it_scaled_down_and_one_that_does_not_scales_it_up(
    synced: tuple[Kube, dict[str, Any]], argocd: ArgoCD
) -> None:
    kube, config = synced
    live = take_over(kube)
    operator_annotations = {
        k: live["metadata"]["annotations"][k] for k in (ANNOTATION_ORIGINAL_REPLICAS, ANNOTATION_TAKEN_BY)
    }

    # RespectIgnoreDifferences=true: the sync applies Git's manifest with the live values of the ignored fields.
    target = argocd.compare(config, live, DOCUMENTED_IGNORES)["respectIgnoreDifferencesTarget"]
    assert target["spec"]["replicas"] == 0
    kube.kubectl("apply", "-f", "-", stdin=json.dumps(target))
    after = live_of(kube)
    assert after["spec"]["replicas"] == 0
    assert {k: after["metadata"]["annotations"].get(k) for k in operator_annotations} == operator_annotations
    assert argocd.sync_status(config, after, DOCUMENTED_IGNORES) == "Synced"

    # Replace=true puts the whole object: only the annotation pointers keep the operator's record on it.
    documented = argocd.compare(config, after, DOCUMENTED_IGNORES)["respectIgnoreDifferencesTarget"]
    kube.kubectl("replace", "-f", "-", stdin=json.dumps(strip_status(documented)))
    replaced = live_of(kube)
    assert replaced["spec"]["replicas"] == 0
    assert {k: replaced["metadata"]["annotations"].get(k) for k in operator_annotations} == operator_annotations
    replicas_only = argocd.compare(config, replaced, with_pointers(["/spec/replicas"]))
    kube.kubectl("replace", "-f", "-", stdin=json.dumps(strip_status(replicas_only["respectIgnoreDifferencesTarget"])))
    dropped = live_of(kube)
    assert dropped["spec"]["replicas"] == 0
    assert not set(operator_annotations) & set(dropped["metadata"].get("annotations", {}))

    # Without the option a sync applies Git as it is: the Deployment runs its 4 replicas again beside the
    # operator's engines.
    kube.kubectl("apply", "-f", "-", stdin=json.dumps(config))
    assert live_of(kube)["spec"]["replicas"] == GIT_DEPLOYMENT["spec"]["replicas"]


def test_handed_back_it_is_synced_without_any_rule(synced: tuple[Kube, dict[str, Any]], argocd: ArgoCD) -> None:
    kube, config = synced
    take_over(kube)
    # The hand-back (controller/takeover.py): the recorded count back first, then, once Ready, the annotations off.
    original = GIT_DEPLOYMENT["spec"]["replicas"]
    operator_patch(
        kube, original, dict(holding(PolicyRef(config["metadata"]["namespace"], POLICY, "uid"), held(original)))
    )
    released = operator_patch(kube, original, dict(RELEASED))
    assert not {ANNOTATION_ORIGINAL_REPLICAS, ANNOTATION_TAKEN_BY} & set(released["metadata"]["annotations"])
    assert argocd.sync_status(config, released, []) == "Synced"
    assert argocd.sync_status(config, released, DOCUMENTED_IGNORES) == "Synced"


def strip_status(obj: dict[str, Any]) -> dict[str, Any]:
    """The object without status, which a replace of the main resource ignores anyway."""
    out = copy.deepcopy(obj)
    out.pop("status", None)
    return out
