"""The real Prometheus Operator in the lab: it reads the PodMonitors and writes the scrape configuration.

``scripts/build-prometheus-operator.sh`` builds it from the Go module pinned in
``tools/prometheus-operator`` into ``.kube-bin`` (beside the control plane), with the release's own
CRDs (``monitoring.coreos.com``) in ``.kube-bin/prometheus-operator-crds``. The lab runs it out of
cluster against its kube-apiserver, with one ``Prometheus`` resource whose ``podMonitorSelector``
requires ``release: kvoffload-lab`` (kube-prometheus-stack's convention). What it generates, the
``prometheus.yaml.gz`` key of the Secret ``prometheus-<name>``, is what Debian's Prometheus runs
(:class:`ConfigSync`), reloaded whenever the Secret changes.

What is adapted, because this Prometheus is Debian's and runs outside the cluster (:func:`adapt_config`):
``$(SHARD)`` and ``$(POD_NAME)`` are substituted as the config reloader in the Prometheus pod would (shard 0);
Debian builds it without Kubernetes discovery, so each ``kubernetes_sd_configs`` entry (role pod)
becomes a ``file_sd_configs`` file that the lab writes from the API server's pods with exactly the
``__meta_kubernetes_*`` labels Prometheus' pod discovery gives (:func:`pod_targets`); every relabelling
the Prometheus Operator generated is kept as it is. A ``lab`` job with file-based discovery is
appended for the lab's own targets that no PodMonitor covers (e.g. the operator's metrics in a test).

The StatefulSet the Prometheus Operator makes for the resource never runs: the lab's
kube-controller-manager runs no StatefulSet controller, so no pod is made from it, and the kubelet
stand-in runs only pods bound to the lab's GPU Nodes.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import functools
import gzip
import json
import logging
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from kvoffload_lab.cluster.kubeapi import KubeAPI, KubeAPIError, Obj
from kvoffload_lab.cluster.podengine import set_parent_death_signal
from kvoffload_lab.controlplane import ControlPlane, default_bin_dir, free_port
from kvoffload_lab.promserver import PROMETHEUS_BIN, PrometheusServer

log = logging.getLogger("kvoffload.promoperator")

BINARY = "prometheus-operator"
CRD_DIR = "prometheus-operator-crds"
MONITORING_GROUP = "monitoring.coreos.com"
RELEASE_LABEL = "release"
LAB_RELEASE = "kvoffload-lab"
"""The release label the lab's Prometheus selects PodMonitors by, as kube-prometheus-stack's does."""
MONITOR_LABEL_ARG = f"{RELEASE_LABEL}={LAB_RELEASE}"
"""``kvoffload run --monitor-label`` value that makes a policy's PodMonitor selected by the lab's Prometheus."""
PROMETHEUS_NAME = "lab"
CONFIG_KEY = "prometheus.yaml.gz"
"""The key of the generated configuration in its Secret (``ConfigFilename`` in pkg/prometheus/common.go)."""


class PrometheusOperatorError(RuntimeError):
    """The Prometheus Operator is missing, did not start, or wrote no configuration in time."""


def binary_path(bin_dir: Path | None = None) -> Path:
    return (bin_dir if bin_dir is not None else default_bin_dir()) / BINARY


def crd_files(bin_dir: Path | None = None) -> list[Path]:
    """The release's CRD files, as the build copied them from the module."""
    folder = (bin_dir if bin_dir is not None else default_bin_dir()) / CRD_DIR
    return sorted(folder.glob(f"{MONITORING_GROUP}_*.yaml"))


def missing(bin_dir: Path | None = None) -> list[str]:
    """What of the build is not there (the binary, the CRDs)."""
    gone = [] if os.access(binary_path(bin_dir), os.X_OK) else [BINARY]
    return gone + ([] if crd_files(bin_dir) else [CRD_DIR])


def build_script() -> Path:
    return Path(__file__).resolve().parents[2] / "scripts" / "build-prometheus-operator.sh"


OPERATOR_BUILD_LIMIT_S = 20 * 60.0
"""The build took about 1.5 minutes cold on 2 cores: one that runs for 20 is stuck."""


def ensure_built(bin_dir: Path | None = None, *, progress: Callable[[str], None] = print) -> None:
    """Build the Prometheus Operator unless it is there (about 1.5 min cold on 2 cores)."""
    if not missing(bin_dir):
        return
    script = build_script()
    if not script.is_file():
        raise PrometheusOperatorError(f"missing {', '.join(missing(bin_dir))} and no {script} to build them")
    progress(f"building the Prometheus Operator with {script}")
    target = [str(bin_dir)] if bin_dir is not None else []
    done = subprocess.run(
        [str(script), *target], capture_output=True, text=True, check=False, timeout=OPERATOR_BUILD_LIMIT_S
    )
    for line in (done.stdout + done.stderr).splitlines():
        progress(line)
    if done.returncode != 0 or missing(bin_dir):
        raise PrometheusOperatorError(f"{script} failed (status {done.returncode})")


def version(bin_dir: Path | None = None) -> str:
    """The built operator's version line (``prometheus-operator, version 0.85.0 ...``), or ``""``."""
    try:
        done = subprocess.run([str(binary_path(bin_dir)), "--version"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return (done.stdout or done.stderr).strip().splitlines()[0] if (done.stdout or done.stderr).strip() else ""


class _CRDLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
    """YAML 1.1 reads a bare ``=`` (an enum value in the CRDs) as the ``value`` tag; it is the string ``=``."""


_CRDLoader.add_constructor("tag:yaml.org,2002:value", lambda loader, node: loader.construct_scalar(node))


@functools.cache
def _load_crd(path: Path) -> Obj:
    loaded: Obj = yaml.load(path.read_text(), Loader=_CRDLoader)  # a safe loader, with one tag more
    return loaded


def crd_manifests(bin_dir: Path | None = None) -> list[Obj]:
    """The release's CRDs as objects (read once per process: they are 4 MB of YAML)."""
    return [copy.deepcopy(_load_crd(path)) for path in crd_files(bin_dir)]


def prometheus_version() -> str:
    """Debian's Prometheus version (``v2.42.0``): the resource names it, so the operator generates for it."""
    done = subprocess.run([PROMETHEUS_BIN, "--version"], capture_output=True, text=True, timeout=10, check=False)
    found = re.search(r"version (\d+\.\d+\.\d+)", done.stdout + done.stderr)
    return f"v{found.group(1)}" if found else "v2.42.0"


def prometheus_resource(
    namespace: str, *, scrape_interval: float, selector: Mapping[str, str], version_tag: str, all_namespaces: bool
) -> Obj:
    """The lab's ``Prometheus``: PodMonitors labelled ``selector`` (in the watched namespaces when
    ``all_namespaces``), scraped at ``scrape_interval`` unless a PodMonitor sets its own interval."""
    interval = f"{round(scrape_interval * 1000)}ms"
    spec: Obj = {
        "version": version_tag,
        "scrapeInterval": interval,
        "scrapeTimeout": interval,
        "evaluationInterval": interval,
        "podMonitorSelector": {"matchLabels": dict(selector)},
        # No external labels: the engines' series keep exactly the labels the analysis reads.
        "prometheusExternalLabelName": "",
        "replicaExternalLabelName": "",
    }
    if all_namespaces:
        spec["podMonitorNamespaceSelector"] = {}
    return {
        "apiVersion": f"{MONITORING_GROUP}/v1",
        "kind": "Prometheus",
        "metadata": {"name": PROMETHEUS_NAME, "namespace": namespace},
        "spec": spec,
    }


RELOADER_ENV = {"SHARD": "0", "POD_NAME": f"prometheus-{PROMETHEUS_NAME}-0"}
"""What prometheus-config-reloader substitutes for ``$(VAR)`` in the configuration, from the pod's environment
(``ShardEnvVar``, ``PodNameEnvVar`` in pkg/operator/config_reloader.go): shard 0 of a one-shard Prometheus."""
_ENV_REF = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def _expand_env(value: Any, env: Mapping[str, str]) -> Any:
    """``$(VAR)`` replaced as the config reloader's envsubst does; unknown names are left as they are."""
    if isinstance(value, str):
        return _ENV_REF.sub(lambda m: env.get(m.group(1), m.group(0)), value)
    if isinstance(value, list):
        return [_expand_env(v, env) for v in value]
    if isinstance(value, dict):
        return {k: _expand_env(v, env) for k, v in value.items()}
    return value


@dataclass(frozen=True)
class PodDiscovery:
    """One ``kubernetes_sd_configs`` entry of role pod, served by the lab through a file (see :func:`adapt_config`)."""

    file: Path
    namespaces: tuple[str, ...] | None
    """None: every namespace."""
    label_selector: str = ""
    field_selector: str = ""


def adapt_config(
    generated: Mapping[str, Any], *, sd_dir: Path, lab_sd_files: str | None
) -> tuple[Obj, list[PodDiscovery]]:
    """The generated configuration, made to run outside the cluster on Debian's Prometheus.

    Debian builds Prometheus without Kubernetes discovery (``kubernetes_sd_configs`` is an unknown
    field there), so each such entry becomes a ``file_sd_configs`` whose file the lab writes from the
    API server's pods, target for target and label for label as Prometheus' pod discovery would
    (:func:`pod_targets`). Every relabelling the Prometheus Operator generated stays as it is.
    """
    config: Obj = _expand_env(copy.deepcopy(dict(generated)), RELOADER_ENV)
    discoveries: list[PodDiscovery] = []
    for job in config.get("scrape_configs") or []:
        sds = job.pop("kubernetes_sd_configs", None) or []
        files = []
        for sd in sds:
            if sd.get("role") != "pod":
                raise PrometheusOperatorError(f"job {job.get('job_name')}: the lab discovers pods only, not {sd}")
            names = (sd.get("namespaces") or {}).get("names")
            selectors = [sel for sel in sd.get("selectors") or [] if sel.get("role") == "pod"]
            path = sd_dir / f"job-{len(discoveries)}.json"
            discoveries.append(
                PodDiscovery(
                    file=path,
                    namespaces=tuple(names) if names else None,
                    label_selector=",".join(str(sel["label"]) for sel in selectors if sel.get("label")),
                    field_selector=",".join(str(sel["field"]) for sel in selectors if sel.get("field")),
                )
            )
            files.append(str(path))
        if files:
            job["file_sd_configs"] = [{"files": files, "refresh_interval": "1s"}]
    if lab_sd_files is not None:
        jobs = list(config.get("scrape_configs") or [])
        jobs.append({"job_name": "lab", "file_sd_configs": [{"files": [lab_sd_files], "refresh_interval": "1s"}]})
        config["scrape_configs"] = jobs
    return config, discoveries


_META = "__meta_kubernetes_"
_INVALID_LABEL_CHARS = re.compile(r"[^a-zA-Z0-9_]")


def _sanitize(name: str) -> str:
    """Prometheus' ``strutil.SanitizeLabelName``."""
    return _INVALID_LABEL_CHARS.sub("_", name)


def pod_targets(pod: Mapping[str, Any]) -> list[Obj]:
    """The targets Prometheus' Kubernetes pod discovery makes of a pod (``discovery/kubernetes/pod.go``,
    ``buildPod``): one per container port, none while the pod has no IP; as file_sd target groups."""
    meta, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
    ip = status.get("podIP")
    if not ip:
        return []
    ready = next((c.get("status", "") for c in status.get("conditions") or [] if c.get("type") == "Ready"), "")
    common: dict[str, str] = {
        f"{_META}namespace": str(meta.get("namespace", "")),
        f"{_META}pod_name": str(meta.get("name", "")),
        f"{_META}pod_ip": str(ip),
        f"{_META}pod_ready": ready.lower() if ready else "unknown",
        f"{_META}pod_phase": str(status.get("phase", "")),
        f"{_META}pod_node_name": str(spec.get("nodeName", "")),
        f"{_META}pod_host_ip": str(status.get("hostIP", "")),
        f"{_META}pod_uid": str(meta.get("uid", "")),
    }
    for kind, values in (("label", meta.get("labels") or {}), ("annotation", meta.get("annotations") or {})):
        for key, value in values.items():
            common[f"{_META}pod_{kind}_{_sanitize(key)}"] = str(value)
            common[f"{_META}pod_{kind}present_{_sanitize(key)}"] = "true"
    owner = next((o for o in meta.get("ownerReferences") or [] if o.get("controller")), None)
    if owner is not None:
        common[f"{_META}pod_controller_kind"] = str(owner.get("kind", ""))
        common[f"{_META}pod_controller_name"] = str(owner.get("name", ""))
    groups: list[Obj] = []
    containers = [(c, False) for c in spec.get("containers") or []]
    containers += [(c, True) for c in spec.get("initContainers") or []]
    for container, init in containers:
        statuses = status.get("initContainerStatuses" if init else "containerStatuses") or []
        found: Obj = next((s for s in statuses if s.get("name") == container.get("name")), {})
        labels = {
            **common,
            f"{_META}pod_container_name": str(container.get("name", "")),
            f"{_META}pod_container_id": str(found.get("containerID", "")),
            f"{_META}pod_container_image": str(container.get("image", "")),
            f"{_META}pod_container_init": "true" if init else "false",
        }
        ports = container.get("ports") or []
        if not ports:
            groups.append({"targets": [str(ip)], "labels": labels})
        for port in ports:
            number = str(port.get("containerPort", ""))
            groups.append(
                {
                    "targets": [f"{ip}:{number}"],
                    "labels": {
                        **labels,
                        f"{_META}pod_container_port_number": number,
                        f"{_META}pod_container_port_name": str(port.get("name", "")),
                        f"{_META}pod_container_port_protocol": str(port.get("protocol", "TCP")),
                    },
                }
            )
    return groups


def decode_secret(secret: Mapping[str, Any]) -> Obj | None:
    """The configuration a ``prometheus-<name>`` Secret holds, or None when it holds none yet."""
    raw = (secret.get("data") or {}).get(CONFIG_KEY)
    if not raw:
        return None
    text = gzip.decompress(base64.b64decode(raw)).decode()
    loaded = yaml.safe_load(text)
    return loaded if isinstance(loaded, dict) else None


class PrometheusOperator:
    """``prometheus-operator`` as a subprocess against a control plane, out of cluster."""

    def __init__(self, plane: ControlPlane, workdir: Path, *, namespaces: Sequence[str] | None) -> None:
        self.plane = plane
        self.workdir = workdir
        self.namespaces = list(namespaces) if namespaces is not None else None
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def log(self) -> str:
        path = self.workdir / "prometheus-operator.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        argv = [
            str(binary_path()),
            f"--apiserver={self.plane.server}",
            f"--ca-file={self.plane.ca_file}",
            f"--cert-file={self.plane.client_cert}",
            f"--key-file={self.plane.client_key}",
            f"--web.listen-address=127.0.0.1:{free_port()}",
            "--log-level=info",
        ]
        if self.namespaces is not None:  # on a shared plane, only this lab's namespaces
            argv.append(f"--namespaces={','.join(self.namespaces)}")
        with (self.workdir / "prometheus-operator.log").open("ab") as out:
            self.process = subprocess.Popen(
                argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                preexec_fn=set_parent_death_signal if sys.platform == "linux" else None,
            )

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


class ConfigSync:
    """Keeps Prometheus running the configuration the Prometheus Operator generated: reads the Secret, adapts
    it (:func:`adapt_config`), writes it and has Prometheus reload when it changed; and writes the pod
    discovery files from the API server's pods."""

    def __init__(self, api: KubeAPI, prometheus: PrometheusServer, namespace: str) -> None:
        self.api = api
        self.prometheus = prometheus
        self.path = f"/api/v1/namespaces/{namespace}/secrets/prometheus-{PROMETHEUS_NAME}"
        self.sd_dir = prometheus.workdir / "kubernetes-sd"
        self.generated: Obj | None = None
        """The operator's configuration as last read (before adapting)."""
        self.discoveries: list[PodDiscovery] = []
        self.reloads = 0
        self._written: dict[Path, str] = {}
        self._task: asyncio.Task[None] | None = None

    async def sync_once(self) -> bool:
        """Read the Secret, apply what changed, refresh the discovery files. True once a configuration is in place."""
        secret = await self.api.get(self.path)
        generated = decode_secret(secret) if secret is not None else None
        if generated is not None and generated != self.generated:
            self.sd_dir.mkdir(parents=True, exist_ok=True)
            config, discoveries = adapt_config(generated, sd_dir=self.sd_dir, lab_sd_files=self.prometheus.sd_glob)
            self.discoveries = discoveries
            await self._discover()  # the files exist before Prometheus reads the configuration naming them
            await asyncio.to_thread(self.prometheus.use_config, config)
            self.generated = generated
            self.reloads += 1
            log.info("Prometheus runs the Prometheus Operator's configuration (%d jobs)", len(config["scrape_configs"]))
        elif self.generated is not None:
            await self._discover()
        return self.generated is not None

    async def _discover(self) -> None:
        for discovery in self.discoveries:
            params = {"labelSelector": discovery.label_selector, "fieldSelector": discovery.field_selector}
            params = {k: v for k, v in params.items() if v}
            pods: list[Obj] = []
            for namespace in discovery.namespaces or (None,):
                path = f"/api/v1/namespaces/{namespace}/pods" if namespace else "/api/v1/pods"
                pods += await self.api.items(path, params or None)
            text = json.dumps([group for pod in pods for group in pod_targets(pod)], sort_keys=True)
            if self._written.get(discovery.file) != text:
                tmp = discovery.file.with_suffix(".tmp")
                tmp.write_text(text)
                tmp.rename(discovery.file)  # atomic: Prometheus never reads half a file
                self._written[discovery.file] = text

    async def wait_first(self, deadline: float, operator: PrometheusOperator) -> None:
        end = time.monotonic() + deadline
        while not await self.sync_once():
            if operator.process is not None and operator.process.poll() is not None:
                raise PrometheusOperatorError(f"the Prometheus Operator exited:\n{operator.log[-3000:]}")
            if time.monotonic() > end:
                raise PrometheusOperatorError(
                    f"no configuration in {self.path} after {deadline:.0f} s:\n{operator.log[-3000:]}"
                )
            await asyncio.sleep(0.2)  # poll: the operator writes the Secret within a second or two

    def start(self, period: float = 0.5) -> None:
        async def loop() -> None:
            while True:
                try:
                    await self.sync_once()
                except (KubeAPIError, aiohttp.ClientError, OSError, TimeoutError) as exc:  # an API server restart
                    log.warning("Prometheus config sync: %s", exc)
                except Exception:
                    log.exception("Prometheus config sync failed")
                await asyncio.sleep(period)  # a poll keeps this simple; Prometheus' own discovery waits 5 s anyway

        self._task = asyncio.create_task(loop(), name="prometheus config sync")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None


__all__ = (
    "LAB_RELEASE",
    "MONITOR_LABEL_ARG",
    "RELEASE_LABEL",
    "ConfigSync",
    "PodDiscovery",
    "PrometheusOperator",
    "PrometheusOperatorError",
    "adapt_config",
    "crd_manifests",
    "decode_secret",
    "ensure_built",
    "missing",
    "pod_targets",
    "prometheus_resource",
    "version",
)
