"""Deleting the operator's Argo CD Application keeps the CRDs, and so every policy: Argo CD's own verdict.

``argocd-diff deletion`` (tools/argocd-diff, built from Argo CD v3.2.11's Go modules) answers which objects an
Application's deletion deletes, with the functions Argo CD's application controller runs
(``finalizeApplicationDeletion``: the managed objects, then ``shouldBeDeleted``, one sync wave at a time through
``FilterObjectsForDeletion``), and which objects a sync with pruning on deletes once Git no longer renders them
(gitops-engine's ``pruneObject``).

The managed objects are the chart as Argo CD renders it for examples/gitops/argocd/operator-application.yaml
(helm-python-sdk: Helm's own template engine), plus a KVOffloadPolicy committed to the same Application; a second
policy was applied with kubectl, outside any Application. Argo CD v3.2.11 never deletes a CRD with an Application
(``shouldBeDeleted`` skips every CRD), but its prune reads only ``Prune=false``, not Helm's keep policy: a CRD that
leaves the render (``crds.install: false``, another chart path) is pruned without the chart's annotation, and every
policy in the cluster with it. The last tests show that verdict, so these tests fail if the annotation goes.
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

import helm_python as helm
import pytest
import yaml

from kvoffload.api.conventions import KIND
from kvoffload_lab.controlplane import default_bin_dir
from tests.support.controlplane import unavailable
from tests.support.paths import EXAMPLES, ROOT

pytestmark = [pytest.mark.kube, pytest.mark.timeout(900)]  # a cold build of argocd-diff: about 6 min on 2 cores

Obj = dict[str, Any]
BUILD = ROOT / "tools" / "argocd-diff" / "build.sh"
APPLICATION: Obj = yaml.safe_load((EXAMPLES / "gitops" / "argocd" / "operator-application.yaml").read_text())
CRD = "CustomResourceDefinition"
SYNC_OPTIONS = "argocd.argoproj.io/sync-options"
KEEP = "helm.sh/resource-policy"


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
        unavailable("no go command: tools/argocd-diff/build.sh builds Argo CD's code from the Go module proxy")
    out = default_bin_dir()
    result = subprocess.run([str(BUILD), str(out)], capture_output=True, text=True, timeout=1500, check=False)
    if result.returncode != 0:
        pytest.fail(f"{BUILD} exited {result.returncode}:\n{result.stdout}{result.stderr}")
    return out / "argocd-diff"


@pytest.fixture(scope="module")
def chart() -> Iterator[helm.Chart]:
    with helm.Chart.load(ROOT / APPLICATION["spec"]["source"]["path"]) as loaded:
        yield loaded


def render(chart: helm.Chart, **values: Any) -> list[Obj]:
    """What Argo CD applies for the Application: its Helm values, release name and destination namespace.

    Helm test hooks are left out: Argo CD never creates them. gitops-engine's ``hook.IsHook`` takes them out of the
    managed resources, and its Helm hook types (``pkg/sync/hook/helm/type.go``) map only pre/post-install and
    pre/post-upgrade to a sync phase, so no phase runs ``test``.
    """
    source = APPLICATION["spec"]["source"]
    rendered = chart.render(
        {**source["helm"]["valuesObject"], **values},
        name=source["helm"]["releaseName"],
        namespace=APPLICATION["spec"]["destination"]["namespace"],
    )
    objs = [
        obj for path, text in sorted(rendered.items()) if path.endswith(".yaml") for obj in yaml.safe_load_all(text)
    ]
    return [obj for obj in objs if obj and "helm.sh/hook" not in obj["metadata"].get("annotations", {})]


def policy(name: str, **annotations: str) -> Obj:
    obj: Obj = yaml.safe_load((EXAMPLES / "gitops" / "base" / "policy.yaml").read_text())
    obj["metadata"] = {"name": name, "namespace": "llm-prod", **({"annotations": annotations} if annotations else {})}
    return obj


def ask(binary: Path, application: Obj, synced: list[Obj], live: list[Obj], rendered: list[Obj] | None = None) -> Obj:
    request: Obj = {"application": application, "synced": synced, "live": live}
    if rendered is not None:
        request["rendered"] = rendered
    result = subprocess.run(
        [str(binary), "deletion"], input=json.dumps(request), capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    answer: Obj = json.loads(result.stdout)
    return answer


def by_name(answer: Obj) -> dict[tuple[str, str], Obj]:
    return {(r["kind"], r["name"]): r for r in answer["resources"]}


def show(answer: Obj) -> None:
    print(f"\ncascade: {answer['cascade']}")
    for r in answer["resources"]:
        pruned = f"  pruned={r['pruned']} ({r['pruneMessage']})" if "pruned" in r else ""
        print(
            f"  {r['kind']:<26} {r['name']:<42} managed={r['managed']!s:<5} "
            f"deleted={r['deletedWithApplication']!s:<5} wave={r['deletionWave']}{pruned}"
        )


def test_the_chart_marks_both_crds_for_argo_cd_beside_helms_keep_policy(chart: helm.Chart) -> None:
    crds = [obj for obj in render(chart) if obj["kind"] == CRD]
    assert sorted(obj["metadata"]["name"] for obj in crds) == [
        "kvoffloadanalysistemplates.kvoffload.io",
        "kvoffloadpolicies.kvoffload.io",
    ]
    for crd in crds:
        assert crd["metadata"]["annotations"] == {KEEP: "keep", SYNC_OPTIONS: "Delete=false,Prune=false"}


def test_deleting_the_application_deletes_the_operator_and_its_policy_but_keeps_the_crds_and_other_policies(
    argocd_diff: Path, chart: helm.Chart
) -> None:
    objs = render(chart)
    answer = ask(argocd_diff, APPLICATION, synced=[*objs, policy("in-git")], live=[policy("by-kubectl")])
    show(answer)
    verdicts = by_name(answer)
    assert answer["cascade"], "the example's resources-finalizer makes a deletion cascade"
    deleted = {key for key, r in verdicts.items() if r["deletedWithApplication"]}
    operator = {(obj["kind"], obj["metadata"]["name"]) for obj in objs if obj["kind"] != CRD}
    assert deleted == operator | {(KIND, "in-git")}
    for crd in (obj for obj in objs if obj["kind"] == CRD):
        assert verdicts[CRD, crd["metadata"]["name"]]["managed"], "the CRDs belong to the Application"
    outside = verdicts[KIND, "by-kubectl"]
    assert not outside["managed"]
    assert not outside["deletedWithApplication"], "kept, and its CRD with it: so the policy stays"


def test_a_policy_committed_with_delete_false_outlives_the_application(argocd_diff: Path, chart: helm.Chart) -> None:
    kept = policy("in-git-kept", **{SYNC_OPTIONS: "Delete=false"})
    verdicts = by_name(ask(argocd_diff, APPLICATION, synced=[*render(chart), kept, policy("in-git")], live=[]))
    assert verdicts[KIND, "in-git-kept"]["managed"]
    assert not verdicts[KIND, "in-git-kept"]["deletedWithApplication"]
    assert verdicts[KIND, "in-git"]["deletedWithApplication"]


def test_deleting_the_application_without_its_finalizer_deletes_nothing(argocd_diff: Path, chart: helm.Chart) -> None:
    orphaning = copy.deepcopy(APPLICATION)
    del orphaning["metadata"]["finalizers"]
    answer = ask(argocd_diff, orphaning, synced=[*render(chart), policy("in-git")], live=[])
    assert not answer["cascade"]
    assert not [r for r in answer["resources"] if r["deletedWithApplication"]]


def without(objs: list[Obj], *keys: str) -> list[Obj]:
    """objs with the CRDs' annotations ``keys`` removed: the chart as it would be without them."""
    out = copy.deepcopy(objs)
    for obj in out:
        if obj["kind"] == CRD:
            for key in keys:
                obj["metadata"]["annotations"].pop(key)
    return out


@pytest.mark.parametrize(
    ("removed", "pruned"),
    [
        pytest.param((), False, id="as-shipped"),
        pytest.param((SYNC_OPTIONS,), True, id="helm-keep-alone"),
        pytest.param((SYNC_OPTIONS, KEEP), True, id="no-annotation"),
    ],
)
def test_a_crd_that_leaves_the_render_is_pruned_unless_it_carries_prune_false(
    argocd_diff: Path, chart: helm.Chart, removed: tuple[str, ...], pruned: bool
) -> None:
    # The Application's automated sync prunes; crds.install: false takes both CRDs out of what Git renders.
    assert APPLICATION["spec"]["syncPolicy"]["automated"]["prune"]
    live = without(render(chart), *removed)
    now = render(chart, crds={"install": False})
    answer = ask(argocd_diff, APPLICATION, synced=live, live=[], rendered=now)
    show(answer)
    crds = [r for r in answer["resources"] if r["kind"] == CRD]
    assert len(crds) == 2
    for crd in crds:
        assert crd["pruned"] is pruned, crd
        assert crd["pruneMessage"] == ("pruned (dry run)" if pruned else "ignored (no prune)")
        assert not crd["deletedWithApplication"], "Argo CD never deletes a CRD with an Application"
    assert not [r for r in answer["resources"] if r["kind"] != CRD and "pruned" in r], "the rest is still rendered"
