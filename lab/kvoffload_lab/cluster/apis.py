"""The lab cluster's APIs by name: :func:`lab_cluster` makes the
:class:`~kvoffload_lab.cluster.labcluster.LabCluster` of the one named.

Its own module, because it names both subclasses, and each of them imports the base.
"""

from __future__ import annotations

from pathlib import Path
from typing import Unpack

from kvoffload_lab.cluster.kubecluster import KubeCluster, KubeOptions
from kvoffload_lab.cluster.labcluster import ClusterSettings, LabCluster
from kvoffload_lab.cluster.localcluster import LocalCluster

API_NAMES = ("emulated", "kube")
"""The APIs a lab cluster runs on: ``emulated``, kmock's emulated API in the caller's event loop
(:class:`LocalCluster`), and ``kube``, kube-apiserver and its controllers (:class:`KubeCluster`)."""


def lab_cluster(
    api: str, workdir: Path | None = None, *, kube: KubeOptions | None = None, **settings: Unpack[ClusterSettings]
) -> LabCluster:
    """The lab cluster on ``api`` (one of :data:`API_NAMES`), not started yet: ``async with`` it.

    ``settings`` are both APIs' (:class:`LabCluster`'s). ``kube`` holds the settings only the real control
    plane has (:class:`KubeCluster`'s); the emulated API does without them: it has no control plane to build
    or share, no webhook, and prices every engine as the seed's laptop. Raises ValueError naming any other
    ``api``.
    """
    if api == "emulated":
        return LocalCluster(workdir, **settings)
    if api == "kube":
        return KubeCluster(workdir, **(kube or {}), **settings)
    raise ValueError(f"no lab cluster API {api!r}: the APIs are {', '.join(API_NAMES)}")


__all__ = ("API_NAMES", "lab_cluster")
