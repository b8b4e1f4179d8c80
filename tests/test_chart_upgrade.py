"""Releases of the chart on the real API server: the CRD upgrades with the chart and outlives it.

A real ``helm install`` of an older chart whose CRD lacks one status field (``tiersSummary``), on
kube-apiserver v1.37 (``.kube-bin``): the API server prunes that field from a status write. A real
``helm upgrade`` to this chart then updates the CRD, and the same write is kept. ``helm uninstall``
keeps the CRD (``helm.sh/resource-policy: keep``) and so the policies in it. Two older layouts:

- ``crds-dir``: the CRD in the chart's ``crds/``, as 0.1.0 shipped it. Helm created it with no
  release's ownership labels, so a plain upgrade refuses it; ``helm upgrade --take-ownership`` adopts it;
- ``template``: the CRD already a template, as from now on; a plain upgrade suffices.

These tests start a control plane of their own rather than share the session's: they create, adopt
and delete the cluster-wide CRD that every other real-server test relies on.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import helm_python as helm
import pytest
import yaml
from helm_python import _native

from kvoffload.api.conventions import API_GROUP, PLURAL
from tests.support import paths
from tests.support.controlplane import Kube, own_kube, wait_for

CHART = paths.ROOT / "charts" / "kvoffload"
CRD_FILE = "kvoffloadpolicies.kvoffload.io.yaml"
CRD_NAME = f"{PLURAL}.{API_GROUP}"
NEW_FIELD = "tiersSummary"
"""A status field the older chart's CRD lacks."""
RELEASE, NAMESPACE, POLICY_NAMESPACE = "kvo", "kvoffload-system", "llm"
VALUES: dict[str, Any] = {"replicas": 0}  # no kubelet runs the operator's pod here; only the objects matter

pytestmark = pytest.mark.kube


@pytest.fixture(scope="module")
def kube(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kube]:
    with own_kube(tmp_path_factory.mktemp("upgrade-plane")) as kube:
        yield kube


@pytest.fixture
def clean(kube: Kube) -> Iterator[Kube]:
    """No release and no CRD before and after each test."""
    yield kube
    with helm.Config(kubeconfig_path=str(kube.kubeconfig), namespace=NAMESPACE) as config:
        for release in (RELEASE, "second"):
            config.uninstall(release, ignore_not_found=True)
    kube.kubectl("delete", "crd", CRD_NAME, "--ignore-not-found", "--wait=true")


def older_chart(layout: str, into: Path) -> Path:
    """This chart with a CRD that lacks ``status.tiersSummary``, laid out as ``layout``."""
    chart = into / "kvoffload"
    shutil.copytree(CHART, chart)
    crd = yaml.safe_load((chart / "files" / CRD_FILE).read_text())
    status = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]
    del status["properties"][NEW_FIELD]
    if layout == "crds-dir":
        (chart / "templates" / "crd.yaml").unlink()
        (chart / "files" / CRD_FILE).unlink()
        (chart / "crds").mkdir()
        (chart / "crds" / CRD_FILE).write_text(yaml.safe_dump(crd))
    else:
        (chart / "files" / CRD_FILE).write_text(yaml.safe_dump(crd))
    return chart


def upgrade(kube: Kube, chart: Path, *, take_ownership: bool = False) -> None:
    """``helm upgrade RELEASE CHART [--take-ownership]``: helm-python-sdk's ``upgrade`` lacks the flag, so the
    Helm SDK's own upgrade is called with it, as ``Config.upgrade`` calls it without."""
    options = {"namespace": NAMESPACE, "take_ownership": take_ownership}
    with helm.Config(kubeconfig_path=str(kube.kubeconfig), namespace=NAMESPACE) as config:
        _native.call_string(
            "helm_upgrade",
            config._raw(),
            _native.HANDLE(0),  # no cancellation context
            _native.HANDLE(0),  # no loaded chart: the path below
            str(chart),
            RELEASE,
            json.dumps(VALUES),
            json.dumps(options),
        )


def policy() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((paths.EXAMPLES / "qwen3-0.6b-cpu.yaml").read_text())
    doc["metadata"] = {"name": "chat", "namespace": POLICY_NAMESPACE}
    return doc


def write_status(kube: Kube, fields: dict[str, Any]) -> dict[str, Any]:
    """Merge ``fields`` into the policy's status through the status subresource; the status as stored."""
    kube.kubectl(
        "patch", "kvoffloadpolicy", "chat", "-n", POLICY_NAMESPACE, "--subresource=status",
        "--type=merge", "-p", json.dumps({"status": fields}),
    )  # fmt: skip
    stored: dict[str, Any] = kube.get("kvoffloadpolicy", "chat", "-n", POLICY_NAMESPACE)["status"]
    return stored


def served(kube: Kube) -> bool:
    return kube.run("get", "kvoffloadpolicies", "-A").returncode == 0


def new_field_kept(kube: Kube, attempt: list[int]) -> dict[str, Any] | None:
    """The stored status once a write of the new field survives (the API server swaps schemas shortly after
    the CRD changes)."""
    attempt[0] += 1
    stored = write_status(kube, {NEW_FIELD: "cpu", "message": f"after the upgrade, write {attempt[0]}"})
    return stored if NEW_FIELD in stored else None


@pytest.mark.parametrize("layout", ["crds-dir", "template"])
def test_helm_upgrade_brings_the_new_status_field_and_uninstall_keeps_the_crd_and_policies(
    clean: Kube, layout: str, tmp_path: Path
) -> None:
    kube = clean
    with helm.Config(kubeconfig_path=str(kube.kubeconfig), namespace=NAMESPACE) as config:
        config.install(str(older_chart(layout, tmp_path)), RELEASE, VALUES, create_namespace=True)
    wait_for(lambda: served(kube), "the older chart's CRD to be served")
    kube.ensure_namespace(POLICY_NAMESPACE)
    kube.kubectl("apply", "-f", "-", stdin=json.dumps(policy()))
    uid = kube.get("kvoffloadpolicy", "chat", "-n", POLICY_NAMESPACE)["metadata"]["uid"]

    before = write_status(kube, {NEW_FIELD: "cpu", "message": "before the upgrade"})
    assert before["message"] == "before the upgrade", "the status write itself went through"
    assert NEW_FIELD not in before, "the older CRD's structural schema prunes the field"

    if layout == "crds-dir":
        # Helm made the crds/ CRD without ownership labels: an upgrade that templates it must adopt it.
        with pytest.raises(helm.HelmError, match="invalid ownership metadata"):
            upgrade(kube, CHART)
        upgrade(kube, CHART, take_ownership=True)
    else:
        upgrade(kube, CHART)
    crd = kube.get("crd", CRD_NAME)
    assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert crd["metadata"]["annotations"]["meta.helm.sh/release-name"] == RELEASE
    attempts = [0]
    after = wait_for(lambda: new_field_kept(kube, attempts), "a status write to keep the upgraded CRD's new field", 30)
    assert after[NEW_FIELD] == "cpu"

    with helm.Config(kubeconfig_path=str(kube.kubeconfig), namespace=NAMESPACE) as config:
        assert [r["revision"] for r in config.history(RELEASE)] == [1, 2]
        config.uninstall(RELEASE)
    # The release is gone (its Deployment with it), the CRD and the policy, status and all, are not.
    gone = kube.run("get", "deployment", f"{RELEASE}-kvoffload", "-n", NAMESPACE)
    assert gone.returncode != 0
    assert "NotFound" in gone.stderr
    assert kube.get("crd", CRD_NAME)["metadata"]["name"] == CRD_NAME
    kept = kube.get("kvoffloadpolicy", "chat", "-n", POLICY_NAMESPACE)
    assert kept["metadata"]["uid"] == uid, "the same policy, never deleted with its CRD"
    assert kept["status"][NEW_FIELD] == "cpu"


def test_one_release_owns_the_crd_and_another_installs_without_it(clean: Kube) -> None:
    kube = clean
    with helm.Config(kubeconfig_path=str(kube.kubeconfig), namespace=NAMESPACE) as config:
        config.install(str(CHART), RELEASE, VALUES, create_namespace=True)
    with helm.Config(kubeconfig_path=str(kube.kubeconfig), namespace="team-b") as config:
        with pytest.raises(helm.HelmError, match=f'current value is "{RELEASE}"'):
            config.install(str(CHART), "second", VALUES, create_namespace=True)
        config.uninstall("second", ignore_not_found=True)
        config.install(str(CHART), "second", {**VALUES, "crds": {"install": False}}, create_namespace=True)
        config.uninstall("second")
    assert kube.get("crd", CRD_NAME)["metadata"]["annotations"]["meta.helm.sh/release-name"] == RELEASE


def test_the_helm_test_pod_is_admitted_under_pod_security_restricted(kube: Kube) -> None:
    """No kubelet runs it here; the real API server's Pod Security admission judges it as it would be created."""
    with helm.Chart.load(CHART) as chart:
        rendered = chart.render(VALUES, name=RELEASE, namespace="restricted-ns")
    (pod,) = (
        obj
        for obj in yaml.safe_load_all(rendered["kvoffload/templates/tests/test-endpoint.yaml"])
        if obj and obj["kind"] == "Pod"
    )
    namespace = {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": "restricted-ns", "labels": {"pod-security.kubernetes.io/enforce": "restricted"}},
    }
    kube.kubectl("apply", "-f", "-", stdin=json.dumps(namespace))
    created = kube.run("create", "--dry-run=server", "-o", "json", "-f", "-", stdin=json.dumps(pod))
    assert created.returncode == 0, created.stderr
    assert json.loads(created.stdout)["spec"]["containers"][0]["command"][:2] == ["python", "-c"]
    # The same pod with its securityContext taken away is refused: the check has teeth.
    loose = {**pod, "spec": {**pod["spec"], "securityContext": {}}}
    refused = kube.run("create", "--dry-run=server", "-f", "-", stdin=json.dumps(loose))
    assert refused.returncode != 0
    assert "violates PodSecurity" in refused.stderr
