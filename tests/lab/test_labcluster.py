"""One lab cluster interface over both APIs: the factory picks by name, the base holds the lifecycle.

Nothing here starts an API server: the clusters are made and not entered, and the lifecycle is shown on a
cluster whose start fails after it started one thing.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from pathlib import Path
from typing import Any, get_type_hints

import pytest

from kvoffload_lab.cluster.apis import API_NAMES, lab_cluster
from kvoffload_lab.cluster.kubecluster import KubeCluster, KubeOptions
from kvoffload_lab.cluster.kubeemu import Obj
from kvoffload_lab.cluster.labcluster import ClusterSettings, LabCluster
from kvoffload_lab.cluster.localcluster import LocalCluster


def keyword_parameters(cls: type[LabCluster]) -> set[str]:
    """The keyword-only parameters a class's own ``__init__`` declares."""
    parameters = inspect.signature(cls.__dict__["__init__"]).parameters.values()
    return {p.name for p in parameters if p.kind is inspect.Parameter.KEYWORD_ONLY}


@pytest.mark.parametrize(("api", "cls"), [("emulated", LocalCluster), ("kube", KubeCluster)])
def test_the_factory_makes_each_api_s_cluster_with_the_settings_given(
    api: str, cls: type[LabCluster], tmp_path: Path
) -> None:
    cluster = lab_cluster(api, tmp_path, engine_args=["--gpu-kv-blocks", "8"], namespaces=["team-a"], prometheus=False)
    assert type(cluster) is cls
    assert isinstance(cluster, LabCluster)
    assert (cluster.workdir, cluster.engine_args, cluster.namespace, cluster.with_prometheus) == (
        tmp_path,
        ["--gpu-kv-blocks", "8"],
        "team-a",
        False,
    )


def test_the_factory_makes_a_cluster_of_every_api_it_names(tmp_path: Path) -> None:
    assert [type(lab_cluster(api, tmp_path)) for api in API_NAMES] == [LocalCluster, KubeCluster]


def test_the_factory_hands_the_kube_options_to_the_real_control_plane_only(tmp_path: Path) -> None:
    kube = lab_cluster("kube", tmp_path, kube={"gpu_class_pricing": False, "webhook_port": 9443})
    assert isinstance(kube, KubeCluster)
    assert (kube.gpu_class_pricing, kube.webhook_port) == (False, 9443)
    assert isinstance(lab_cluster("emulated", tmp_path, kube={"gpu_class_pricing": False}), LocalCluster)


@pytest.mark.parametrize("api", ["real", "Kube", ""])
def test_the_factory_refuses_an_unknown_api_naming_it(api: str, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=f"no lab cluster API {api!r}: the APIs are emulated, kube"):
        lab_cluster(api, tmp_path)


def test_the_base_cannot_be_made() -> None:
    with pytest.raises(TypeError, match="abstract"):
        LabCluster()  # type: ignore[abstract]


def test_the_settings_by_keyword_are_the_base_s_and_the_kube_options_kube_cluster_s_own() -> None:
    # The factory hands both on by keyword: a setting added to a constructor alone would be out of its reach.
    assert set(get_type_hints(ClusterSettings)) == keyword_parameters(LabCluster)
    assert set(get_type_hints(KubeOptions)) == keyword_parameters(KubeCluster)


class FailingCluster(LabCluster):
    """A cluster whose start fails after starting one thing (which it records stopping)."""

    stopped = False

    url = kubeconfig = operator_namespaces = api_server_version = None  # type: ignore[assignment]

    async def _start(self) -> None:
        self._stack.callback(setattr, self, "stopped", True)
        (self.workdir / "engines").mkdir()
        raise RuntimeError("the API server did not come up")

    async def apply(self, obj: Mapping[str, Any]) -> Obj:
        raise NotImplementedError

    def get(self, api_version: str, kind: str, namespace: str | None, name: str) -> Obj | None:
        raise NotImplementedError

    async def list_items(self, path: str, selector: str = "") -> list[Obj]:
        raise NotImplementedError

    async def delete(self, api_version: str, kind: str, namespace: str | None, name: str) -> Obj:
        raise NotImplementedError


async def test_a_failed_start_stops_what_it_started_and_removes_its_own_workdir() -> None:
    cluster = FailingCluster()
    with pytest.raises(RuntimeError, match="did not come up"):
        async with cluster:
            pytest.fail("entered a cluster whose start failed")
    assert cluster.stopped
    assert not cluster.workdir.exists()


async def test_a_failed_start_keeps_a_workdir_it_was_given(tmp_path: Path) -> None:
    cluster = FailingCluster(tmp_path / "cluster")
    with pytest.raises(RuntimeError):
        async with cluster:
            pass
    assert cluster.stopped
    assert (tmp_path / "cluster" / "engines").is_dir()


def test_a_cluster_not_started_says_so() -> None:
    cluster = FailingCluster(Path("/nonexistent"))
    with pytest.raises(RuntimeError, match="the cluster is not running"):
        cluster.kubelet  # noqa: B018
    with pytest.raises(RuntimeError, match="the cluster runs without Prometheus"):
        cluster.prometheus  # noqa: B018
