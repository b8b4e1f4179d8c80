"""pytest fixture: the real Kubernetes control plane (:mod:`kvoffload_lab.controlplane`) with the project's CRD.

``real_cluster`` starts kube-apiserver v1.37.2, etcd and the controllers from ``.kube-bin`` (or
``$KVOFFLOAD_KUBE_BIN``; ``scripts/build-kube.sh`` builds them) once per test module, posts the
generated KVOffloadPolicy CRD and waits until it is Established. Without the binaries it skips,
except under ``$CI``, where it fails. Import it into a test module to use it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import Any

import kubernetes.client
import kubernetes.config
import pytest

from kvoffload.api.crd import CRD_NAME, crd_manifest
from kvoffload_lab.controlplane import ControlPlane, default_bin_dir, missing_binaries


@pytest.fixture(scope="module")
def real_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """kube-apiserver and friends from .kube-bin (or $KVOFFLOAD_KUBE_BIN) with the CRD established."""
    missing = missing_binaries()
    if missing:
        reason = f"no {', '.join(missing)} in {default_bin_dir()}: run scripts/build-kube.sh"
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
    with ControlPlane(workdir=tmp_path_factory.mktemp("controlplane")) as plane:
        with kubernetes.config.new_client_from_config(config_file=str(plane.kubeconfig)) as api:
            extensions = kubernetes.client.ApiextensionsV1Api(api)
            extensions.create_custom_resource_definition(crd_manifest())
            deadline = time.monotonic() + 60
            while not _established(extensions.read_custom_resource_definition(CRD_NAME).to_dict()):
                assert time.monotonic() < deadline, "the CRD was not Established in 60 s"
                time.sleep(0.2)  # poll the API server, another process
        yield plane


def _established(crd: dict[str, Any]) -> bool:
    conditions = (crd.get("status") or {}).get("conditions") or []
    return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)
