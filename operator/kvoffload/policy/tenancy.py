"""What a policy author may ask for: a policy grants no more than the cluster admin allowed.

Whoever may create a KVOffloadPolicy gets engine pods made by the operator's identity, and Prometheus
queries sent by it. :class:`Tenancy` holds what the admin allows (the operator's flags, the chart's
``tenancy`` values); :func:`check_tenancy` judges a parsed policy against it, with every refusal naming its
field. The operator (status ``Invalid``), its admission webhook and ``kvoffload plan``/``render`` all run it,
so a refusal reads the same everywhere. docs/security.md is the threat model this enforces.
"""

from __future__ import annotations

import fnmatch
import ipaddress
import posixpath
import socket
from dataclasses import dataclass

from urllib3.exceptions import LocationParseError
from urllib3.util import parse_url

from kvoffload.api.baseurl import base_url_problem
from kvoffload.api.errors import FieldError
from kvoffload.api.quantity import format_duration, parse_duration
from kvoffload.api.types import KVOffloadPolicy
from kvoffload.engines import ENGINES, engine_for, option_dest
from kvoffload.policy.workload import WHERE, adopted_container

# Hosts that name the node or the cloud's metadata service whatever they resolve to.
_METADATA_HOSTS = frozenset(
    {
        "localhost",
        "metadata",
        "metadata.google.internal",
        "metadata.azure.internal",
        "metadata.tencentyun.com",
        "api.metadata.cloud.ibm.com",
        "metadata.platformequinix.com",
    }
)
_METADATA_ADDRESSES = frozenset(
    {
        ipaddress.ip_address("100.100.100.200"),  # Alibaba Cloud
        ipaddress.ip_address("192.0.0.192"),  # Oracle Cloud's older one
    }
)
"""Metadata services outside the link-local range (169.254.169.254 and AWS's fd00:ec2::254 are inside the ranges
:func:`private_host` refuses)."""
_UNIQUE_LOCAL = ipaddress.ip_network("fc00::/7")
_DEFAULT_PORTS = {"http": 80, "https": 443}


@dataclass(frozen=True)
class SinkGrant:
    """A notification sink of the operator's, and the namespaces (shell patterns) whose policies may name it."""

    name: str
    namespaces: tuple[str, ...] = ("*",)

    def grants(self, namespace: str) -> bool:
        return matches_any(namespace, self.namespaces)


@dataclass(frozen=True)
class Tenancy:
    """What the cluster admin lets a policy ask for. The defaults are the safe ones: no hostPath, any image,
    no Prometheus at a private address of the node or the cloud."""

    host_path_roots: tuple[str, ...] = ()
    """Node paths under which a hostPath tier may live; empty: no hostPath tier at all."""
    image_patterns: tuple[str, ...] = ()
    """Engine images allowed, as shell patterns over the image without its tag or digest
    (``registry.example.com/llm/*``, ``docker.io/vllm/vllm-openai``); empty: any image."""
    prometheus_url: str | None = None
    """The operator's own Prometheus (``--prometheus-url``): every policy is queried there, spec.prometheus.url
    is not used."""
    prometheus_url_prefixes: tuple[str, ...] = ()
    """The URLs a policy's spec.prometheus.url may name (scheme, host, port and a leading path); empty: any URL
    but the node's and the metadata service's, and then only without the operator's token."""
    private_prometheus: bool = False
    """Policies may name a Prometheus at the node's own, link-local or metadata addresses: a lab on one
    machine, where everything is on 127.0.0.1; never a shared cluster."""
    operator_token: bool = False
    """The operator holds a Prometheus token of its own (``--prometheus-token-secret``), which it sends to every
    policy's Prometheus that names no token of its own."""
    service_accounts: tuple[str, ...] = ()
    """ServiceAccounts a policy's engine pods may run as (``spec.podTemplate.serviceAccountName``), besides the
    namespace's default: an account can carry cloud credentials (workload identity) and pull secrets."""
    priority_classes: tuple[str, ...] = ()
    """PriorityClasses a policy may name: a high one preempts other teams' pods off scarce GPUs."""
    runtime_classes: tuple[str, ...] = ()
    """RuntimeClasses a policy may name: the runtime decides the pod's isolation."""
    secret_volumes: tuple[str, ...] = ()
    """Secrets (shell patterns over the name) a policy's spec.podTemplate.volumes[].secret may mount; empty: none.
    The operator cannot read a Secret's type at admission, so this is the only guard against mounting another
    ServiceAccount's token Secret (type kubernetes.io/service-account-token): never allow such names."""
    keyless_tolerations: bool = False
    """Tolerations without a key (``operator: Exists`` alone tolerates every taint: control-plane nodes, other
    teams' dedicated GPUs) in spec.gpu.tolerations and spec.podTemplate.tolerations."""
    pod_annotations: tuple[str, ...] = ()
    """Shell patterns over the keys of mesh annotations and labels (:data:`MESH_KEY_PREFIXES`) that a policy's
    spec.podTemplate.metadata may set anyway; empty: none."""
    code_options: tuple[str, ...] = ()
    """Code-loading engine options spec.model.extraArgs may set (``--trust-remote-code``, ``--worker-cls``...: each
    engine's ``code_options``), as flags or dests; empty: none. Each runs code the image allow-list does not vouch
    for: the model repository's, or whatever module the policy names."""
    min_analysis_interval: float = 0.0
    """Seconds: the shortest spec.analysis.interval a policy may ask for (``--min-analysis-interval``). It is the
    PodMonitor's scrape interval and how often the operator queries Prometheus for the policy."""
    min_analysis_window: float = 0.0
    """Seconds: the shortest spec.analysis.window (``--min-analysis-window``): the range every query reads."""
    notification_sinks: tuple[SinkGrant, ...] | None = None
    """The notification sinks the operator has (``--notifications-config``), each with the namespaces whose
    policies may name it in spec.notifications.sinks; None where they are not known (``kvoffload plan``): not
    judged."""

    def problems(self) -> list[str]:
        """What makes these settings unsafe to run with; empty when they are sound."""
        found: list[str] = []
        if self.operator_token and self.prometheus_url is None and not self.prometheus_url_prefixes:
            found.append(
                "an operator token needs --prometheus-url or at least one --prometheus-allowed-url: "
                "otherwise any policy could send it anywhere"
            )
        for root in self.host_path_roots:
            if not root.startswith("/") or ".." in root.split("/") or posixpath.normpath(root) == "/":
                found.append(f"--allowed-host-path {root!r}: give an absolute node path below /, without '..'")
        for prefix in self.prometheus_url_prefixes:
            problem = base_url_problem(prefix)
            if problem is not None:
                found.append(f"--prometheus-allowed-url {prefix!r}: {problem}")
        known = {dest for engine in ENGINES.values() for dest in engine.code_options}
        for option in self.code_options:
            if option_dest(option) not in known:
                found.append(f"--allowed-code-option {option!r}: no engine has such a code-loading option")
        return found


DEFAULT_TENANCY = Tenancy()


def check_tenancy(policy: KVOffloadPolicy, tenancy: Tenancy = DEFAULT_TENANCY) -> list[FieldError]:
    """Everything in ``policy`` that asks for more than ``tenancy`` allows; empty when it may run."""
    spec = policy.spec
    errors = [
        FieldError(f"spec.model.extraArgs[{p.index}]", p.message)
        for p in engine_for(spec).judge_extra_args(spec.model.extra_args, allowed=tenancy.code_options)
    ]
    image, where = spec.image, "spec.model.image" if spec.model.image is not None else "spec.workloadRef"
    if tenancy.image_patterns and image is not None and not image_allowed(image, tenancy.image_patterns):
        errors.append(
            FieldError(
                where,
                f"{repository(image)} is not among the images this cluster allows "
                f"({', '.join(tenancy.image_patterns)})",
            )
        )
    for i, tier in enumerate(spec.offload.secondary_tiers):
        host = tier.volume.host_path
        if host is not None:
            problem = host_path_problem(host.path, tenancy.host_path_roots)
            if problem:
                errors.append(FieldError(f"spec.offload.secondaryTiers[{i}].volume.hostPath.path", problem))
    problem = prometheus_url_problem(
        spec.prometheus.url, tenancy, own_token=spec.prometheus.bearer_token_secret is not None
    )
    if problem:
        errors.append(FieldError("spec.prometheus.url", problem))
    errors += notification_sink_problems(policy, tenancy)
    errors += analysis_floor_problems(policy, tenancy)
    errors += pod_reach_problems(policy, tenancy)
    errors += adopted_pod_problems(policy, tenancy)
    overlay = spec.pod_template
    if overlay is not None:
        for i, volume in enumerate(overlay.volumes):
            if volume.host_path is not None:
                problem = host_path_problem(volume.host_path.path, tenancy.host_path_roots)
                if problem:
                    errors.append(FieldError(f"spec.podTemplate.volumes[{i}].hostPath.path", problem))
        for field, name, allowed, value in (
            ("serviceAccountName", "ServiceAccount", tenancy.service_accounts, overlay.service_account_name),
            ("priorityClassName", "PriorityClass", tenancy.priority_classes, overlay.priority_class_name),
            ("runtimeClassName", "RuntimeClass", tenancy.runtime_classes, overlay.runtime_class_name),
        ):
            if value is None or value in allowed or (field == "serviceAccountName" and value == "default"):
                continue
            listed = f"({', '.join(allowed)})" if allowed else "(none is)"
            errors.append(
                FieldError(
                    f"spec.podTemplate.{field}",
                    f"{value} is not a {name} this cluster lets policies name {listed}; a cluster admin allows "
                    "them with the chart's tenancy values",
                )
            )
    return errors


def adopted_pod_problems(policy: KVOffloadPolicy, tenancy: Tenancy) -> list[FieldError]:
    """What the admin does not allow in a referenced Deployment's pod (spec.workloadRef), once read: code-loading
    options of its engine container, and hostPath volumes. Its image is judged as spec.model.image is; the rest of
    the pod is the team's own, which it already runs."""
    workload = policy.spec.workload
    if workload is None:
        return []
    container = adopted_container(workload)
    found = [
        FieldError(WHERE, f"Deployment {workload.name}: {problem}")
        for problem in engine_for(policy.spec).code_problems(container, allowed=tenancy.code_options)
    ]
    for volume in (workload.template.get("spec") or {}).get("volumes") or []:
        host = volume.get("hostPath")
        if isinstance(host, dict) and (
            problem := host_path_problem(str(host.get("path", "")), tenancy.host_path_roots)
        ):
            found.append(
                FieldError(WHERE, f"Deployment {workload.name}: volume {volume.get('name')!r} is a hostPath: {problem}")
            )
    return found


def notification_sink_problems(policy: KVOffloadPolicy, tenancy: Tenancy) -> list[FieldError]:
    """Each sink the policy names that the operator does not have, or does not grant the policy's namespace: a
    policy only ever names the admin's sinks, never a URL, so it cannot have the operator POST where it likes,
    nor post into another team's channel."""
    chosen = policy.spec.notifications
    if chosen is None or tenancy.notification_sinks is None:
        return []
    namespace = policy.metadata.namespace
    granted = tuple(g.name for g in tenancy.notification_sinks if g.grants(namespace))
    listed = ", ".join(granted) if granted else "none"
    problems = []
    for i, name in enumerate(chosen.sinks):
        if name in granted:
            continue
        if any(g.name == name for g in tenancy.notification_sinks):
            why = f"the notification sink {name} is not granted to namespace {namespace} (it may name: {listed})"
        else:
            why = f"{name} is not a notification sink this operator has (namespace {namespace} may name: {listed})"
        problems.append(
            FieldError(
                f"spec.notifications.sinks[{i}]",
                f"{why}; a cluster admin adds sinks, and the namespaces each serves, with the chart's "
                "notifications.sinks values",
            )
        )
    return problems


def analysis_floor_problems(policy: KVOffloadPolicy, tenancy: Tenancy) -> list[FieldError]:
    """spec.analysis.interval and window shorter than the admin's floors: each costs the Prometheus the
    policies share (a scrape of every engine, a query per cycle)."""
    analysis = policy.spec.analysis
    found = []
    for field, value, floor, flag in (
        ("interval", analysis.interval, tenancy.min_analysis_interval, "--min-analysis-interval"),
        ("window", analysis.window, tenancy.min_analysis_window, "--min-analysis-window"),
    ):
        if parse_duration(value) < floor:
            found.append(
                FieldError(
                    f"spec.analysis.{field}",
                    f"{value} is shorter than the {format_duration(floor)} this cluster allows ({flag})",
                )
            )
    return found


# --- the pod's reach: Secret volumes, key-less tolerations, service mesh keys (issue 33) ---------------------

MESH_KEY_PREFIXES = (
    "sidecar.istio.io/",  # inject: false leaves the mesh; userVolume/proxyImage shape the injected container
    "traffic.sidecar.istio.io/",  # ports and CIDRs the proxy does not intercept: egress past the mesh's policy
    "proxy.istio.io/",
    "istio.io/",  # the label istio.io/dataplane-mode: none leaves ambient mode; istio.io/rev another control plane
    "linkerd.io/",
    "config.linkerd.io/",  # skip-inbound-ports, skip-outbound-ports
    "config.alpha.linkerd.io/",
    "kuma.io/",  # sidecar-injection
    "consul.hashicorp.com/",  # connect-inject
    "openservicemesh.io/",  # sidecar-injection
)
"""Pod annotation and label keys of the service meshes: where a mesh enforces mTLS and authorization or egress
policy, a pod that opts out of it (or out of its interception) escapes that policy. Refused unless the admin
allows the key (``--allowed-pod-annotation``)."""


def pod_reach_problems(policy: KVOffloadPolicy, tenancy: Tenancy) -> list[FieldError]:
    """Secret volumes of Secrets the admin did not list, tolerations without a key, and mesh annotations and
    labels the admin did not allow."""
    spec = policy.spec
    overlay = spec.pod_template
    found: list[FieldError] = []
    tolerations = [("spec.gpu.tolerations", i, t) for i, t in enumerate(spec.gpu.tolerations)]
    if overlay is not None:
        tolerations += [("spec.podTemplate.tolerations", i, t) for i, t in enumerate(overlay.tolerations)]
    if not tenancy.keyless_tolerations:
        found += [
            FieldError(
                f"{where}[{i}].key",
                "a toleration without a key tolerates every taint (control-plane nodes, other teams' dedicated "
                "nodes); name the taint's key, or ask a cluster admin for --allow-keyless-tolerations",
            )
            for where, i, t in tolerations
            if not t.key
        ]
    if overlay is None:
        return found
    for kind, keys in (("labels", overlay.metadata.labels), ("annotations", overlay.metadata.annotations)):
        for key in keys:
            if key.startswith(MESH_KEY_PREFIXES) and not matches_any(key, tenancy.pod_annotations):
                found.append(
                    FieldError(
                        f"spec.podTemplate.metadata.{kind}[{key!r}]",
                        f"{key} configures the service mesh, whose policy a pod could escape by it; a cluster admin "
                        "allows such keys with the chart's tenancy.allowedPodAnnotations",
                    )
                )
    for i, volume in enumerate(overlay.volumes):
        secret = volume.secret
        if secret is not None and not matches_any(secret.secret_name, tenancy.secret_volumes):
            listed = f"({', '.join(tenancy.secret_volumes)})" if tenancy.secret_volumes else "(none is)"
            found.append(
                FieldError(
                    f"spec.podTemplate.volumes[{i}].secret.secretName",
                    f"{secret.secret_name} is not a Secret this cluster lets policies mount {listed}: it could "
                    "hold another ServiceAccount's token; a cluster admin allows Secrets by name with the chart's "
                    "tenancy.allowedSecretVolumes",
                )
            )
    return found


# --- images ----------------------------------------------------------------------------


def repository(image: str) -> str:
    """The image without tag or digest, with Docker Hub's implied parts: ``vllm/vllm-openai:v0.32.0`` ->
    ``docker.io/vllm/vllm-openai``."""
    name = image.partition("@")[0]
    slash = name.rfind("/")
    colon = name.rfind(":")
    if colon > slash:
        name = name[:colon]
    first, _, rest = name.partition("/")
    if not rest or ("." not in first and ":" not in first and first != "localhost"):
        name = "docker.io/" + (name if rest else "library/" + name)
    return name


def image_allowed(image: str, patterns: tuple[str, ...]) -> bool:
    """Whether ``image``'s repository matches one of the admin's ``patterns`` (shell patterns)."""
    return matches_any(repository(image), patterns)


def matches_any(name: str, patterns: tuple[str, ...]) -> bool:
    """Whether ``name`` matches one of the admin's shell ``patterns`` (case-sensitive, as Kubernetes names are)."""
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns)


# --- hostPath ----------------------------------------------------------------------------


def host_path_problem(path: str, roots: tuple[str, ...]) -> str | None:
    """Why a hostPath volume at ``path`` may not be mounted; None when it lies under an allowed root."""
    if not roots:
        return (
            "hostPath volumes are off in this cluster: a cluster admin allows them under listed node paths "
            "(chart value tenancy.hostPathRoots); use an emptyDir or a persistentVolumeClaim"
        )
    if ".." in path.split("/"):
        return "may not contain '..'"
    normal = posixpath.normpath(path)
    if any(normal == r.rstrip("/") or normal.startswith(r.rstrip("/") + "/") for r in roots):
        return None
    return f"{normal} is not under a node path this cluster allows for hostPath volumes ({', '.join(roots)})"


# --- Prometheus --------------------------------------------------------------------------


def _address(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """``host`` as an IP address when it is one, in any form the resolver accepts (``2852039166`` and
    ``0xa9.0xfe.0xa9.0xfe`` are 169.254.169.254 to it, as to the kernel)."""
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        pass
    try:
        return ipaddress.IPv4Address(socket.inet_aton(host))
    except OSError:
        return None


def private_host(host: str) -> bool:
    """Whether ``host`` names the node itself, a link-local or IPv6 unique-local address, or a cloud's metadata
    service."""
    host = host.lower().rstrip(".")
    if host in _METADATA_HOSTS or host.endswith(".localhost"):
        return True
    address = _address(host)
    if address is None:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    if isinstance(address, ipaddress.IPv6Address) and address in _UNIQUE_LOCAL:
        return True  # IPv6's private range, where AWS's metadata service answers (fd00:ec2::254)
    return (
        address.is_loopback
        or address.is_link_local
        or address.is_unspecified
        or address.is_multicast
        or address in _METADATA_ADDRESSES
    )


def _port(scheme: str, port: int | None) -> int:
    return port if port is not None else _DEFAULT_PORTS.get(scheme, 0)


def url_under(url: str, prefix: str) -> bool:
    """Whether ``url`` lies under ``prefix``: a base URL (``api/baseurl.py``) with the same scheme, host and port,
    whose path begins with the prefix's path segments, whole (``https://prom/a`` covers ``https://prom/a/b``, not
    ``/ab``). Both are read by urllib3's parser, as the operator's client reads them."""
    if base_url_problem(url) is not None:
        return False
    try:
        u, p = parse_url(url), parse_url(prefix)
    except LocationParseError:
        return False
    scheme = (u.scheme or "").lower()
    same = (
        scheme == (p.scheme or "").lower()
        and (u.host or "").lower() == (p.host or "").lower()
        and _port(scheme, u.port) == _port(scheme, p.port)
    )
    base = [segment for segment in (p.path or "").split("/") if segment]
    path = [segment for segment in (u.path or "").split("/") if segment]
    return same and path[: len(base)] == base


def prometheus_url_problem(url: str, tenancy: Tenancy, *, own_token: bool) -> str | None:
    """Why the operator may not query ``url`` for a policy; None when it may. ``own_token``: the policy names
    its own token Secret, so the operator's is not sent."""
    if tenancy.prometheus_url is not None:
        return None  # every policy is queried at the admin's Prometheus; the spec's URL is not used
    if tenancy.prometheus_url_prefixes:
        if any(url_under(url, prefix) for prefix in tenancy.prometheus_url_prefixes):
            return None
        return f"is not under a Prometheus URL this cluster allows ({', '.join(tenancy.prometheus_url_prefixes)})"
    if tenancy.operator_token and not own_token:
        return (
            "the operator sends its Prometheus token only to URLs a cluster admin allowed, and none is: "
            "name your own spec.prometheus.bearerTokenSecret, or ask for --prometheus-allowed-url"
        )
    problem = base_url_problem(url)
    if problem is not None:
        return problem
    host = (parse_url(url).host or "").strip("[]")  # an IPv6 address comes in brackets
    if private_host(host) and not tenancy.private_prometheus:
        return (
            f"{host} is the node itself, a link-local or unique-local address or a cloud metadata service, which no "
            "policy may name unless a cluster admin allowed it (--prometheus-allowed-url or --prometheus-allow-private)"
        )
    return None


__all__ = [
    "DEFAULT_TENANCY",
    "MESH_KEY_PREFIXES",
    "SinkGrant",
    "Tenancy",
    "adopted_pod_problems",
    "analysis_floor_problems",
    "check_tenancy",
    "host_path_problem",
    "image_allowed",
    "notification_sink_problems",
    "pod_reach_problems",
    "private_host",
    "prometheus_url_problem",
    "repository",
    "url_under",
]
