"""The chart through a real OCI registry: ``helm package``, ``helm push``, then ``helm install`` from ``oci://``.

The registry is the CNCF distribution registry (tests/support/registry.py), built from its Go module by
``tools/registry/build.sh``, served on 127.0.0.1 over plain HTTP behind htpasswd basic auth. Helm is the Helm v4
SDK through helm-python-sdk: ``package``, ``RegistryClient.login``/``push``/``tags``, and ``Config.install`` of an
``oci://`` reference with the logged-in client bound. The install lands on a real kube-apiserver (marker
``kube``) of this module's own: the chart installs the cluster-wide CRDs, which the session's plane already
has from ``kubectl apply`` with no Helm ownership, so an install there would be refused.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import helm_python as helm
import pytest
import requests
import yaml

from tests.support.controlplane import Kube, own_kube
from tests.support.paths import ROOT
from tests.support.registry import Registry, registry_binary, serve
from tests.support.registry import version as registry_version

pytestmark = [pytest.mark.kube, pytest.mark.timeout(900)]  # a cold build of the registry: about 6.5 min on 2 cores

CHART = ROOT / "charts" / "kvoffload"
RELEASE, NAMESPACE = "kvo", "kvoffload-system"
VALUES: dict[str, Any] = {"replicas": 0}  # no kubelet runs the operator's pod here; only the objects matter
CRDS = {"kvoffloadpolicies.kvoffload.io", "kvoffloadanalysistemplates.kvoffload.io"}
REPOSITORY = "charts"
# The media types Helm gives a chart in an OCI registry (helm.sh/helm/v4/pkg/registry/constants.go).
HELM_CONFIG = "application/vnd.cncf.helm.config.v1+json"
HELM_CHART_LAYER = "application/vnd.cncf.helm.chart.content.v1.tar+gzip"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"


def chart_version() -> str:
    version: str = yaml.safe_load((CHART / "Chart.yaml").read_text())["version"]
    return version


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    binary = registry_binary()
    with serve(binary, tmp_path_factory.mktemp("registry")) as started:
        print(f"\nregistry at {started.url}: {registry_version(binary)}")
        yield started


@pytest.fixture(scope="module")
def kube(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kube]:
    with own_kube(tmp_path_factory.mktemp("oci-plane")) as kube:
        yield kube


def manifest(registry: Registry, name: str, reference: str) -> dict[str, Any]:
    """The stored manifest, read through the registry's own API (not through Helm)."""
    answer = requests.get(
        f"{registry.url}/v2/{REPOSITORY}/{name}/manifests/{reference}",
        auth=(registry.username, registry.password),
        headers={"Accept": OCI_MANIFEST},
        timeout=10,
    )
    assert answer.status_code == 200, f"{answer.status_code}: {answer.text}"
    parsed: dict[str, Any] = answer.json()
    return parsed


def test_the_chart_pushed_to_a_real_oci_registry_installs_from_oci_on_the_real_api_server(
    registry: Registry, kube: Kube, tmp_path: Path
) -> None:
    version = chart_version()
    archive = Path(helm.package(CHART, destination=tmp_path))
    remote = f"oci://{registry.host}/{REPOSITORY}"
    reference = f"{remote}/kvoffload"

    with helm.RegistryClient(plain_http=True, credentials_file=tmp_path / "registry-credentials.json") as client:
        # The registry is private: no push before `helm registry login`, nor with a wrong password.
        with pytest.raises(helm.HelmRegistryError, match="basic credential not found"):
            client.push(archive, remote)
        with pytest.raises(helm.HelmRegistryError, match="response status code 401"):
            client.login(registry.host, registry.username, "not-the-password", plain_http=True)
        client.login(registry.host, registry.username, registry.password, plain_http=True)

        client.push(archive, remote)
        assert client.tags(reference) == [version]
        descriptor = client.resolve(f"{reference}:{version}")
        print(f"\nhelm push {archive.name} {remote}: {reference}:{version} is {descriptor['digest']}")

        # What the registry stores is a Helm chart artifact whose one layer is the packaged archive, byte for byte.
        stored = manifest(registry, "kvoffload", version)
        assert stored["config"]["mediaType"] == HELM_CONFIG
        (layer,) = stored["layers"]
        assert layer["mediaType"] == HELM_CHART_LAYER
        assert layer["digest"] == "sha256:" + hashlib.sha256(archive.read_bytes()).hexdigest()
        assert layer["size"] == archive.stat().st_size
        assert descriptor["media_type"] == OCI_MANIFEST

        with helm.Config(kubeconfig_path=str(kube.kubeconfig), namespace=NAMESPACE) as config:
            config.set_registry_client(client)
            # A version the registry does not hold is refused: the install really asks the registry.
            with pytest.raises(helm.HelmError, match=r"charts/kvoffload:9\.9\.9: not found"):
                config.install(
                    reference, RELEASE, VALUES, chart_version="9.9.9", plain_http=True, create_namespace=True
                )
            before = len(registry.served())
            installed = config.install(
                reference, RELEASE, VALUES, chart_version=version, plain_http=True, create_namespace=True
            )
            status = config.status(RELEASE)
            config.set_registry_client(None)
    # The install itself downloaded the chart's layer, as the logged-in user: the chart came from the registry.
    fetched = [s for s in registry.served()[before:] if s.method == "GET" and s.status == 200]
    assert (f"/v2/{REPOSITORY}/kvoffload/blobs/{layer['digest']}", registry.username) in [
        (s.path, s.user) for s in fetched
    ]
    print(f"helm install {RELEASE} {reference} --version {version}: {status['status']}, revision {status['revision']}")

    assert status["status"] == installed["status"] == "deployed"
    assert (status["chart_name"], status["chart_version"], status["revision"]) == ("kvoffload", version, 1)

    # The release record and the objects are on the API server, owned by the release that came from the registry.
    record = kube.get("secret", f"sh.helm.release.v1.{RELEASE}.v1", "-n", NAMESPACE)
    assert record["metadata"]["labels"]["status"] == "deployed"
    for name in sorted(CRDS):
        crd = kube.get("crd", name)
        assert crd["metadata"]["annotations"]["meta.helm.sh/release-name"] == RELEASE, name
        assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep", name
    deployment = kube.get("deployment", f"{RELEASE}-kvoffload", "-n", NAMESPACE)
    assert deployment["metadata"]["annotations"]["meta.helm.sh/release-name"] == RELEASE
    assert deployment["metadata"]["labels"]["helm.sh/chart"] == f"kvoffload-{version}"
    assert deployment["spec"]["replicas"] == 0
