"""Helm v4's own kstatus watcher (``install --wait=watcher``) through helm-python-sdk, against an API server.

``helm_python.Config.install`` does not expose two options the lab's emulated API server needs
switched off, so :func:`install_and_wait` passes the same options JSON to the library's
``helm_install`` itself: ``disable_openapi_validation`` (the emulator serves no OpenAPI document)
and ``server_side_apply: false`` (it does not emulate server-side apply). The wait is Helm's own:
the kstatus status watcher of the Helm v4 SDK bundled in the wheel, with its watch, its
aggregation and its message. Releases are kept in memory, not in Secrets.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import helm_python as helm
from helm_python import _native

from tests.support.paths import DATA

POLICY_CHART = DATA / "helm" / "policy-chart"
"""A chart holding one KVOffloadPolicy: ``values.policy`` is the whole object."""


@dataclass(frozen=True)
class WaitResult:
    ok: bool
    seconds: float
    message: str

    @property
    def kstatus(self) -> str:
        """Current when the install came back; else the status Helm's error names (Failed, InProgress, ...)."""
        if self.ok:
            return "Current"
        found = re.search(r"status: (\w+)", self.message)
        return found.group(1) if found else f"error: {self.message}"


def install_and_wait(
    kubeconfig: Path, release: str, values: dict[str, Any], *, timeout: int, namespace: str = "default"
) -> WaitResult:
    """``helm install RELEASE tests/data/helm/policy-chart --wait=watcher --timeout Ns`` (blocking)."""
    options = {
        "namespace": namespace,
        "timeout_seconds": timeout,
        "wait": "watcher",
        "disable_openapi_validation": True,
        "server_side_apply": False,
    }
    started = time.monotonic()
    with helm.Config(kubeconfig_path=str(kubeconfig), namespace=namespace, storage_driver="memory") as config:
        try:
            _native.call_string(
                "helm_install",
                config._raw(),
                _native.HANDLE(0),  # no cancellation context
                _native.HANDLE(0),  # no loaded chart: the path below
                str(POLICY_CHART),
                release,
                json.dumps(values),
                json.dumps(options),
            )
        except helm.HelmError as exc:
            return WaitResult(False, time.monotonic() - started, str(exc))
    return WaitResult(True, time.monotonic() - started, "")
