"""The operator's Helm chart (charts/kvoffload), through the real Helm v4 SDK.

Lint; the values schema refuses bad values; every manifest of each kind of install passes
kubernetes-validate (strict); the CRD in the chart is the generated one; a namespaced install
grants Roles only; the container runs as non-root on a read-only root filesystem; and the
chart's RBAC grants every request the real operator makes, started with the chart's own
arguments against the emulated API server, and nothing that it does not make.
"""

from __future__ import annotations

import base64
import os
import re
import socket
import subprocess
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import helm_python as helm
import jsonschema
import kubernetes_validate
import pytest
import yaml
from cryptography import x509

from kvoffload.api.conventions import API_GROUP, API_VERSION, FINALIZER, KIND, PEERING_NAME
from kvoffload.api.crd import template_crd_manifest
from kvoffload.cli.run import run
from kvoffload.controller import admission
from kvoffload.controller.gateway import PLURALS, PolicyRef
from kvoffload.controller.health import Health
from kvoffload.controller.metrics import OperatorMetrics
from tests.support import paths
from tests.support.kube import EmulatedCluster, kvoffload_run, policy_manifest, wait_for

REPO = paths.ROOT
CHART = REPO / "charts" / "kvoffload"
CRD_FILE = "kvoffloadpolicies.kvoffload.io.yaml"
RELEASE, NAMESPACE = "kvo", "kvoffload-system"
K8S_VERSION = "1.33"
WATCHED = ["llm-a", "llm-b"]

Obj = dict[str, Any]
Grant = tuple[str, str, str]  # (apiGroup, resource[/subresource], verb)

# The ServiceMonitor fields the chart renders, as monitoring.coreos.com/v1 defines them
# (prometheus-operator, monitoring.coreos.com_servicemonitors.yaml): anything else is refused,
# so this schema must grow with the template.
SERVICE_MONITOR_SCHEMA: Obj = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "ServiceMonitor"},
        "metadata": {
            "type": "object",
            "required": ["name", "namespace"],
            "additionalProperties": False,
            "properties": {
                "name": {"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"},
                "namespace": {"type": "string"},
                "labels": {"type": "object", "additionalProperties": {"type": "string"}},
            },
        },
        "spec": {
            "type": "object",
            "required": ["selector", "endpoints"],
            "additionalProperties": False,
            "properties": {
                "selector": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {"matchLabels": {"type": "object", "additionalProperties": {"type": "string"}}},
                },
                "endpoints": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "properties": {
                            "port": {"type": "string"},
                            "path": {"type": "string"},
                            "honorLabels": {"type": "boolean"},
                            "interval": {
                                "type": "string",
                                "pattern": r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?"
                                r"(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$",
                            },
                        },
                    },
                },
            },
        },
    },
}

PROM_DURATION = r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"
STRING_MAP: Obj = {"type": "object", "additionalProperties": {"type": "string"}}

# The PrometheusRule fields the chart renders, as monitoring.coreos.com/v1 defines them
# (prometheus-operator, monitoring.coreos.com_prometheusrules.yaml); anything else is refused.
PROMETHEUS_RULE_SCHEMA: Obj = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "PrometheusRule"},
        "metadata": SERVICE_MONITOR_SCHEMA["properties"]["metadata"],
        "spec": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "groups": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["name", "rules"],
                        "additionalProperties": False,
                        "properties": {
                            "name": {"type": "string", "minLength": 1},
                            "interval": {"type": "string", "pattern": PROM_DURATION},
                            "rules": {
                                "type": "array",
                                "items": {
                                    "type": "object",
                                    "required": ["expr"],
                                    "additionalProperties": False,
                                    "properties": {
                                        "alert": {"type": "string"},
                                        "record": {"type": "string"},
                                        "expr": {"type": "string", "minLength": 1},
                                        "for": {"type": "string", "pattern": PROM_DURATION},
                                        "labels": STRING_MAP,
                                        "annotations": STRING_MAP,
                                    },
                                },
                            },
                        },
                    },
                },
            },
        },
    },
}

# The kinds of install a user picks between; each must render valid manifests.
INSTALLS: dict[str, Obj] = {
    "defaults": {},
    "namespaced": {"watchNamespaces": WATCHED},
    "peering-cluster-wide": {"peering": {"enabled": True}},
    "peering-namespaced": {"peering": {"enabled": True}, "watchNamespaces": WATCHED},
    "everything-set": {
        "metrics": {"serviceMonitor": {"enabled": True, "interval": "15s", "labels": {"release": "prom"}}},
        "prometheusRule": {"enabled": True, "labels": {"release": "prom"}},
        "grafanaDashboard": {"enabled": True, "annotations": {"grafana_folder": "LLM serving"}},
        "prometheusUrl": "http://prometheus.monitoring:9090",
        "verbose": True,
        "imagePullSecrets": [{"name": "registry"}],
        "serviceAccount": {"annotations": {"eks.amazonaws.com/role-arn": "arn:aws:iam::1:role/kvo"}},
        "podAnnotations": {"example.com/team": "inference"},
        "podLabels": {"example.com/tier": "control"},
        "commonLabels": {"team": "inference"},
        "priorityClassName": "platform-critical",
        "topologySpreadConstraints": [
            {"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "ScheduleAnyway"}
        ],
        "pdb": {"maxUnavailable": "50%"},
        "logFormat": "json",
        "extraEnv": [{"name": "HTTPS_PROXY", "value": "http://proxy.internal:3128"}],
        "extraVolumes": [{"name": "corp-ca", "configMap": {"name": "corp-ca"}}],
        "extraVolumeMounts": [{"name": "corp-ca", "mountPath": "/etc/ssl/corp", "readOnly": True}],
        "nodeSelector": {"kubernetes.io/os": "linux"},
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "ops", "effect": "NoSchedule"}],
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {"matchExpressions": [{"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]}]}
                    ]
                }
            }
        },
    },
    "metrics-off": {"metrics": {"enabled": False}},
    "tenancy": {
        "prometheusAuth": {"tokenSecret": {"name": "prom-token", "key": "token"}, "policySecrets": []},
        "tenancy": {
            "hostPathRoots": ["/mnt/nvme0", "/mnt/nvme1"],
            "allowedImages": ["docker.io/vllm/vllm-openai", "registry.example.com/llm/*"],
            "prometheusAllowedUrls": ["https://prometheus.monitoring:9090/"],
            "prometheusAllowPrivate": False,
            "allowedServiceAccounts": ["llm-engine"],
            "allowedPriorityClasses": ["llm-high", "llm-low"],
            "allowedRuntimeClasses": ["nvidia"],
            "allowedSecretVolumes": ["model-config-*"],
            "allowKeylessTolerations": True,
            "allowedPodAnnotations": ["sidecar.istio.io/inject"],
            "allowedCodeOptions": ["--trust-remote-code", "worker_extension_cls"],
        },
    },
    "webhook": {"webhook": {"enabled": True}},
    "webhook-without-metrics": {"webhook": {"enabled": True, "port": 8443}, "metrics": {"enabled": False}},
}


@pytest.fixture(scope="module")
def chart() -> Iterable[helm.Chart]:
    with helm.Chart.load(CHART) as loaded:
        yield loaded


def render(chart: helm.Chart, values: Obj | None = None) -> list[Obj]:
    """The objects an install with ``values`` would create (hooks included), in template order."""
    rendered = chart.render(values or {}, name=RELEASE, namespace=NAMESPACE)
    return [
        obj
        for path, text in sorted(rendered.items())
        if path.endswith(".yaml")
        for obj in yaml.safe_load_all(text)
        if obj
    ]


def only(objs: list[Obj], kind: str) -> Obj:
    matches = [obj for obj in objs if obj["kind"] == kind]
    assert len(matches) == 1, f"expected one {kind}, got {len(matches)}"
    return matches[0]


def container(objs: list[Obj]) -> Obj:
    containers: list[Obj] = only(objs, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return containers[0]


def grants(role: Obj) -> set[Grant]:
    """Every (apiGroup, resource, verb) a Role or ClusterRole grants, refusing wildcards."""
    granted = set()
    for rule in role["rules"]:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                for verb in rule["verbs"]:
                    assert "*" not in (group, resource, verb), f"{role['kind']} grants a wildcard: {rule}"
                    granted.add((group, resource, verb))
    return granted


# --- lint and schema -----------------------------------------------------------------------


def test_the_chart_lints_without_warnings() -> None:
    report = helm.lint(CHART, strict=True, namespace=NAMESPACE, kube_version="v1.30.0")
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


@pytest.mark.parametrize(
    ("values", "complaint"),
    [
        ({"replicas": "two"}, "/replicas"),
        # Without leader election every replica would reconcile.
        ({"replicas": 2, "leaderElection": {"enabled": False, "leaseDuration": 8}}, "/replicas"),
        ({"replicas": -1}, "/replicas"),
        ({"leaderElection": {"enabled": True, "leaseDuration": 1}}, "/leaderElection/leaseDuration"),
        ({"replica": 1}, "'replica' not allowed"),
        ({"image": {"digest": "sha256:0"}}, "/image/digest"),
        ({"image": {"registry": "quay.io"}}, "'registry' not allowed"),
        ({"image": {"pullPolicy": "Sometimes"}}, "/image/pullPolicy"),
        # A Role is created per namespace: globs would need cluster-wide rights.
        ({"watchNamespaces": ["llm-*"]}, "/watchNamespaces/0"),
        ({"metrics": {"port": 0}}, "/metrics/port"),
        ({"seriesLabels": {"policy": "kvoffload.io/policy"}}, "/seriesLabels/policy"),
        ({"peering": {"enabled": "yes"}}, "/peering/enabled"),
    ],
)
def test_bad_values_are_refused_naming_the_key(chart: helm.Chart, values: Obj, complaint: str) -> None:
    with pytest.raises(helm.HelmValuesError, match=re.escape(complaint)):
        chart.validate_schema(values)
    with pytest.raises(helm.HelmValuesError, match=re.escape(complaint)):
        chart.render(values, name=RELEASE, namespace=NAMESPACE)


@pytest.mark.parametrize("install", INSTALLS)
def test_the_values_of_each_install_pass_the_schema(chart: helm.Chart, install: str) -> None:
    chart.validate_schema(INSTALLS[install])


# --- rendered manifests --------------------------------------------------------------------


@pytest.mark.parametrize("install", INSTALLS)
def test_every_manifest_of_each_install_passes_the_real_validators(chart: helm.Chart, install: str) -> None:
    objs = render(chart, INSTALLS[install])
    crds = {
        (obj["spec"]["group"], obj["spec"]["names"]["kind"]): obj["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
        for obj in objs
        if obj["kind"] == "CustomResourceDefinition"
    }
    for obj in objs:
        if obj["kind"] == "ServiceMonitor":  # not a kind kubernetes-validate knows
            jsonschema.validate(obj, SERVICE_MONITOR_SCHEMA)
        elif obj["kind"] == "PrometheusRule":  # nor this one
            jsonschema.validate(obj, PROMETHEUS_RULE_SCHEMA)
        elif obj["apiVersion"].startswith("kopf.dev/"):  # against the peering CRD the chart installs
            jsonschema.validate(obj, crds[("kopf.dev", obj["kind"])])
        else:
            kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    assert {"ServiceAccount", "Deployment"} <= {obj["kind"] for obj in objs}


def generated_crd() -> Obj:
    crd: Obj = yaml.safe_load((REPO / "crds" / CRD_FILE).read_text())
    return crd


def policy_crd(objs: list[Obj]) -> Obj:
    (crd,) = (obj for obj in objs if obj["kind"] == "CustomResourceDefinition" and obj["spec"]["names"]["kind"] == KIND)
    return crd


def test_the_chart_carries_the_generated_crd_verbatim_and_renders_it_as_a_kept_template(chart: helm.Chart) -> None:
    # One source: `kvoffload crd` writes crds/ (a test fails when they drift); the chart holds a copy in files/.
    assert (CHART / "files" / CRD_FILE).read_text() == (REPO / "crds" / CRD_FILE).read_text(), (
        f"charts/kvoffload/files/{CRD_FILE} drifted: cp crds/{CRD_FILE} charts/kvoffload/files/"
    )
    # Not in the chart's crds/, which Helm installs once and never upgrades (new status fields would be pruned).
    assert not (CHART / "crds").exists()
    assert chart.crds == []
    crd = policy_crd(render(chart))
    # fromYaml/toYaml in the template writes 1.0 as 1: the same JSON number, so equal here as in the API server.
    assert crd["spec"] == generated_crd()["spec"]
    assert crd["metadata"]["name"] == generated_crd()["metadata"]["name"]
    # Kept on `helm uninstall` and by Argo CD's prune: deleting the CRD would delete every policy in the cluster.
    assert crd["metadata"]["annotations"] == {
        "helm.sh/resource-policy": "keep",
        "argocd.argoproj.io/sync-options": "Delete=false,Prune=false",
    }
    assert crd["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm"


def test_the_crd_can_be_left_to_whoever_manages_it_apart(chart: helm.Chart) -> None:
    objs = render(chart, {"crds": {"install": False}})
    assert [obj for obj in objs if obj["kind"] == "CustomResourceDefinition"] == []
    assert only(objs, "Deployment")  # the operator itself still installs
    with pytest.raises(helm.HelmValuesError, match=re.escape("/crds/install")):
        chart.validate_schema({"crds": {"install": "no"}})
    with pytest.raises(helm.HelmValuesError, match=re.escape("'keep' not allowed")):
        chart.validate_schema({"crds": {"install": True, "keep": False}})


def test_helm_package_makes_an_artifact_that_lints_strict_and_renders_the_same(
    chart: helm.Chart, tmp_path: Path
) -> None:
    archive = Path(helm.package(CHART, destination=tmp_path))
    assert archive.name == "kvoffload-0.1.0.tgz"
    report = helm.lint(archive, strict=True, namespace=NAMESPACE, kube_version="v1.30.0")
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] >= 2] == []
    with helm.Chart.load(archive) as packaged:
        assert packaged.crds == []
        assert policy_crd(render(packaged))["spec"] == generated_crd()["spec"]
        assert render(packaged, INSTALLS["peering-namespaced"]) == render(chart, INSTALLS["peering-namespaced"])
        assert render(packaged, INSTALLS["everything-set"]) == render(chart, INSTALLS["everything-set"])


# --- helm test ----------------------------------------------------------------------------------


def test_the_helm_test_hook_asks_the_operator_through_its_service_in_the_operators_image(chart: helm.Chart) -> None:
    objs = render(chart)
    pod = only(objs, "Pod")
    service = only(objs, "Service")
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    # A failed pod stays for `kubectl logs`; a passed one goes.
    assert pod["metadata"]["annotations"]["helm.sh/hook-delete-policy"] == "before-hook-creation,hook-succeeded"
    (probe,) = pod["spec"]["containers"]
    assert probe["image"] == container(objs)["image"]
    assert probe["command"] == ["python", "-c", (CHART / "files" / "test-endpoint.py").read_text()]
    url = f"http://{service['metadata']['name']}.{NAMESPACE}.svc:{service['spec']['ports'][0]['port']}"
    assert probe["env"] == [{"name": "KVOFFLOAD_URL", "value": url}]
    # The Service must not send the operator's scrapes to the test pod.
    selector = service["spec"]["selector"].items()
    assert not selector <= pod["metadata"]["labels"].items()
    assert selector <= only(objs, "Deployment")["spec"]["template"]["metadata"]["labels"].items()
    assert pod["spec"]["securityContext"] == only(objs, "Deployment")["spec"]["template"]["spec"]["securityContext"]
    assert probe["securityContext"] == container(objs)["securityContext"]
    assert pod["spec"]["automountServiceAccountToken"] is False
    assert pod["spec"]["restartPolicy"] == "Never"


def test_without_the_metrics_endpoint_there_is_nothing_for_helm_test_to_ask(chart: helm.Chart) -> None:
    assert not [obj for obj in render(chart, INSTALLS["metrics-off"]) if obj["kind"] == "Pod"]


@pytest.mark.parametrize(
    ("stale", "answers"),
    [(False, "/metrics: # HELP kvoffload_"), (True, "HTTP Error 503")],
    ids=["alive", "wedged"],
)
def test_the_helm_test_script_passes_on_the_operators_real_endpoint_and_fails_on_a_wedged_loop(
    chart: helm.Chart, stale: bool, answers: str
) -> None:
    """No kubelet runs the hook's pod here, so its exact command runs against the operator's real endpoint
    (controller/metrics.py, as `kvoffload run --metrics-port` serves it), the Service's URL swapped for it."""
    (probe,) = only(render(chart), "Pod")["spec"]["containers"]
    now = [0.0]
    health = Health(stale_after=30, clock=lambda: now[0])
    port = free_port()
    server = OperatorMetrics().serve(port, health, addr="127.0.0.1")
    try:
        now[0] = 31.0 if stale else 1.0
        ran = subprocess.run(
            [sys.executable, *probe["command"][1:]],
            env={**os.environ, "KVOFFLOAD_URL": f"http://127.0.0.1:{port}"},
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    finally:
        server.shutdown()
        server.server_close()
    assert (ran.returncode == 0) is not stale, ran.stderr
    assert answers in ran.stdout + ran.stderr


def test_a_default_install_watches_every_namespace_standalone_through_a_cluster_role(chart: helm.Chart) -> None:
    objs = render(chart)
    assert container(objs)["args"] == [
        "--all-namespaces",
        "--standalone",
        "--leader-elect",
        f"--lease={NAMESPACE}/kvo-kvoffload-leader",
        "--lease-duration=8",
        "--metrics-port=8080",
        "--policy-label=kvoffload_io_policy",
        "--level-label=kvoffload_io_level",
        "--config-hash-label=kvoffload_io_config_hash",
        "--min-analysis-interval=10s",
        "--min-analysis-window=1m",
    ]
    assert container(objs)["image"] == "ghcr.io/kvoffload/kvoffload:0.1.0"  # the appVersion
    deployment = only(objs, "Deployment")
    # Two replicas, one leading: a new pod is a ready standby before an old one goes.
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    spread = deployment["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
    assert spread["preferredDuringSchedulingIgnoredDuringExecution"][0]["podAffinityTerm"]["labelSelector"] == {
        "matchLabels": deployment["spec"]["selector"]["matchLabels"]
    }
    (lease_role,) = (obj for obj in objs if obj["kind"] == "Role")
    assert lease_role["metadata"]["namespace"] == NAMESPACE
    assert lease_role["rules"] == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "resourceNames": ["kvo-kvoffload-leader"],
            "verbs": ["get", "update"],
        },
    ]
    binding = only(objs, "ClusterRoleBinding")
    account = only(objs, "ServiceAccount")["metadata"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account["name"], "namespace": NAMESPACE}]
    assert binding["roleRef"]["name"] == only(objs, "ClusterRole")["metadata"]["name"]
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == account["name"]
    assert not [obj for obj in objs if obj["kind"] == "ServiceMonitor"]


def test_without_leader_election_one_replica_runs_and_is_replaced_not_doubled(chart: helm.Chart) -> None:
    objs = render(chart, {"replicas": 1, "leaderElection": {"enabled": False, "leaseDuration": 8}})
    deployment = only(objs, "Deployment")
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}  # never two operators at once
    assert not any(arg.startswith("--lease") or arg == "--leader-elect" for arg in container(objs)["args"])
    assert not [obj for obj in objs if obj["kind"] in ("Role", "RoleBinding")]
    assert "affinity" not in deployment["spec"]["template"]["spec"]


def test_a_namespaced_install_grants_a_role_in_each_namespace_and_nothing_cluster_wide(chart: helm.Chart) -> None:
    objs = render(chart, {"watchNamespaces": WATCHED})
    assert container(objs)["args"][:3] == ["--namespace=llm-a", "--namespace=llm-b", "--standalone"]
    # Cluster-wide, only the read of the cluster-scoped KVOffloadAnalysisTemplates.
    cluster_wide = [obj for obj in objs if obj["kind"].startswith("Cluster")]
    assert sorted(obj["kind"] for obj in cluster_wide) == ["ClusterRole", "ClusterRoleBinding"]
    assert grants(only(objs, "ClusterRole")) == TEMPLATES
    watched = [obj for obj in objs if not obj["metadata"]["name"].endswith("-leader-election")]
    roles = {obj["metadata"]["namespace"]: obj for obj in watched if obj["kind"] == "Role"}
    bindings = {obj["metadata"]["namespace"]: obj for obj in watched if obj["kind"] == "RoleBinding"}
    assert sorted(roles) == sorted(bindings) == WATCHED
    account = only(objs, "ServiceAccount")["metadata"]["name"]
    for namespace in WATCHED:
        assert bindings[namespace]["subjects"] == [{"kind": "ServiceAccount", "name": account, "namespace": NAMESPACE}]
        assert bindings[namespace]["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "Role",
            "name": roles[namespace]["metadata"]["name"],
        }


@pytest.mark.parametrize(
    ("watch", "peering_kind", "role_kind", "peering_resource"),
    [
        ([], "ClusterKopfPeering", "ClusterRole", "clusterkopfpeerings"),
        (WATCHED, "KopfPeering", "Role", "kopfpeerings"),
    ],
)
def test_peering_drops_standalone_and_creates_the_peering_object_the_operator_looks_for(
    chart: helm.Chart, watch: list[str], peering_kind: str, role_kind: str, peering_resource: str
) -> None:
    objs = render(chart, {"peering": {"enabled": True}, "watchNamespaces": watch})
    assert "--standalone" not in container(objs)["args"]
    peerings = [obj for obj in objs if obj["kind"] == peering_kind]
    assert [p["metadata"]["name"] for p in peerings] == [PEERING_NAME] * max(1, len(watch))
    assert sorted(p["metadata"].get("namespace", "") for p in peerings) == (watch or [""])
    # A hook: Helm installs it only after the peering CRDs exist.
    assert {p["metadata"]["annotations"]["helm.sh/hook"] for p in peerings} == {"post-install,post-upgrade"}
    for role in (obj for obj in objs if obj["kind"] == role_kind and not obj["metadata"]["name"].endswith("-election")):
        assert {("kopf.dev", peering_resource, verb) for verb in ("list", "watch", "patch")} <= grants(role)
    crds = [obj["metadata"]["name"] for obj in objs if obj["kind"] == "CustomResourceDefinition"]
    assert crds == [
        "kvoffloadanalysistemplates.kvoffload.io",
        "kvoffloadpolicies.kvoffload.io",
        "clusterkopfpeerings.kopf.dev",
        "kopfpeerings.kopf.dev",
    ]


def test_peering_crds_can_be_left_to_another_release(chart: helm.Chart) -> None:
    objs = render(chart, {"peering": {"enabled": True, "installCRDs": False}})
    assert [obj["metadata"]["name"] for obj in objs if obj["kind"] == "CustomResourceDefinition"] == [
        "kvoffloadanalysistemplates.kvoffload.io",
        "kvoffloadpolicies.kvoffload.io",
    ]
    assert only(objs, "ClusterKopfPeering")["metadata"]["name"] == PEERING_NAME


def test_the_values_reach_the_operator_flags_and_the_pod(chart: helm.Chart) -> None:
    values = INSTALLS["everything-set"] | {"seriesLabels": {"policy": "policy", "level": "tier", "configHash": "build"}}
    objs = render(chart, values)
    args = container(objs)["args"]
    assert "--prometheus-url=http://prometheus.monitoring:9090" in args
    assert "--verbose" in args
    assert {"--policy-label=policy", "--level-label=tier", "--config-hash-label=build"} <= set(args)
    pod = only(objs, "Deployment")["spec"]["template"]
    assert pod["metadata"]["annotations"] == values["podAnnotations"]
    assert pod["spec"]["nodeSelector"] == values["nodeSelector"]
    assert pod["spec"]["tolerations"] == values["tolerations"]
    assert pod["spec"]["affinity"] == values["affinity"]
    assert pod["spec"]["imagePullSecrets"] == values["imagePullSecrets"]
    assert only(objs, "ServiceAccount")["metadata"]["annotations"] == values["serviceAccount"]["annotations"]
    monitor, service = only(objs, "ServiceMonitor"), only(objs, "Service")
    assert monitor["metadata"]["labels"]["release"] == "prom"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["endpoints"][0]["port"] == service["spec"]["ports"][0]["name"]
    # The operator's series name the policy's namespace in policy_namespace: no need to honor their labels, so a
    # Prometheus with overrideHonorLabels reads them the same (tests/observability/test_operator_scrape.py).
    assert "honorLabels" not in monitor["spec"]["endpoints"][0]
    assert only(objs, "PrometheusRule")["metadata"]["labels"]["release"] == "prom"


@pytest.mark.parametrize("install", INSTALLS)
def test_the_arguments_of_each_install_parse_as_kvoffload_run_options(chart: helm.Chart, install: str) -> None:
    values = chart.merge_values(INSTALLS[install])
    with run.make_context("run", list(container(render(chart, INSTALLS[install]))["args"])) as context:
        params = context.params
    assert params["namespaces"] == tuple(values["watchNamespaces"])
    assert params["all_namespaces"] is not bool(values["watchNamespaces"])
    assert params["standalone"] is not values["peering"]["enabled"]
    assert params["metrics_port"] == (values["metrics"]["port"] if values["metrics"]["enabled"] else 0)
    assert (params["policy_label"], params["level_label"], params["config_hash_label"]) == (
        values["seriesLabels"]["policy"],
        values["seriesLabels"]["level"],
        values["seriesLabels"]["configHash"],
    )
    assert params["prometheus_url"] == (values["prometheusUrl"] or None)
    assert params["verbose"] is values["verbose"]
    assert params["log_format"] == values["logFormat"]
    assert params["webhook_port"] == (values["webhook"]["port"] if values["webhook"]["enabled"] else 0)
    tenancy = values["tenancy"]
    assert params["allowed_host_paths"] == tuple(tenancy["hostPathRoots"])
    assert params["allowed_images"] == tuple(tenancy["allowedImages"])
    assert params["prometheus_allowed_urls"] == tuple(tenancy["prometheusAllowedUrls"])
    assert params["prometheus_allow_private"] is tenancy["prometheusAllowPrivate"]
    assert params["allowed_service_accounts"] == tuple(tenancy["allowedServiceAccounts"])
    assert params["allowed_priority_classes"] == tuple(tenancy["allowedPriorityClasses"])
    assert params["allowed_runtime_classes"] == tuple(tenancy["allowedRuntimeClasses"])
    assert params["allowed_secret_volumes"] == tuple(tenancy["allowedSecretVolumes"])
    assert params["allow_keyless_tolerations"] is tenancy["allowKeylessTolerations"]
    assert params["allowed_pod_annotations"] == tuple(tenancy["allowedPodAnnotations"])
    assert params["allowed_code_options"] == tuple(tenancy["allowedCodeOptions"])


def test_an_operator_token_without_a_fixed_or_allowed_prometheus_is_refused_at_render(chart: helm.Chart) -> None:
    """Otherwise any policy author could name their own host as spec.prometheus.url and receive the token."""
    values = {"prometheusAuth": {"tokenSecret": {"name": "prom-token", "key": "token"}, "policySecrets": []}}
    with pytest.raises(helm.errors.HelmRenderError, match=r"tenancy\.prometheusAllowedUrls"):
        render(chart, values)
    render(chart, values | {"prometheusUrl": "http://prometheus.monitoring:9090"})


def test_the_webhook_is_registered_as_the_operator_builds_it_and_served_with_the_chart_certificate(
    chart: helm.Chart,
) -> None:
    objs = render(chart, {"webhook": {"enabled": True}})
    configuration, secret = only(objs, "ValidatingWebhookConfiguration"), only(objs, "Secret")
    service = next(obj for obj in objs if obj["kind"] == "Service" and obj["metadata"]["name"].endswith("-webhook"))
    (hook,) = configuration["webhooks"]
    ca = base64.b64decode(hook["clientConfig"]["caBundle"])
    expected = admission.validating_webhook_configuration(
        service={"namespace": NAMESPACE, "name": service["metadata"]["name"], "port": 443}, ca_bundle=ca
    )
    assert configuration["webhooks"] == expected["webhooks"]
    # The Service reaches the container's webhook port, where the operator serves with the Secret's files.
    pod = only(objs, "Deployment")["spec"]["template"]["spec"]
    args = container(objs)["args"]
    ports = {p["name"]: p["containerPort"] for p in container(objs)["ports"]}
    assert service["spec"]["ports"][0]["targetPort"] == "webhook"
    assert f"--webhook-port={ports['webhook']}" in args
    mount = next(m for m in container(objs)["volumeMounts"] if m["name"] == "webhook-tls")
    assert {
        "--webhook-cert=" + mount["mountPath"] + "/tls.crt",
        "--webhook-key=" + mount["mountPath"] + "/tls.key",
    } <= set(args)
    volume = next(v for v in pod["volumes"] if v["name"] == "webhook-tls")
    assert volume["secret"]["secretName"] == secret["metadata"]["name"]
    # The serving certificate names the Service and is signed by the CA the API server is given.
    cert = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["tls.crt"]))
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(x509.DNSName)
    assert f"{service['metadata']['name']}.{NAMESPACE}.svc" in names
    cert.verify_directly_issued_by(x509.load_pem_x509_certificate(ca))


def test_no_webhook_unless_asked(chart: helm.Chart) -> None:
    objs = render(chart)
    assert not [obj for obj in objs if obj["kind"] in ("ValidatingWebhookConfiguration", "Secret")]
    assert not [a for a in container(objs)["args"] if a.startswith("--webhook")]


def test_metrics_off_means_port_zero_and_no_service_or_probe(chart: helm.Chart) -> None:
    objs = render(chart, {"metrics": {"enabled": False, "serviceMonitor": {"enabled": True}}})
    assert "--metrics-port=0" in container(objs)["args"]
    assert "readinessProbe" not in container(objs)
    assert not [obj for obj in objs if obj["kind"] in ("Service", "ServiceMonitor")]


def test_the_probes_ask_the_metrics_port_the_operator_serves(chart: helm.Chart) -> None:
    objs = render(chart, {"metrics": {"port": 9100}})
    main = container(objs)
    assert "--metrics-port=9100" in main["args"]
    assert main["ports"] == [{"name": "metrics", "containerPort": 9100, "protocol": "TCP"}]
    assert main["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert main["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    downward = {env["name"]: env["valueFrom"]["fieldRef"]["fieldPath"] for env in main["env"]}
    assert downward == {"POD_NAME": "metadata.name", "POD_NAMESPACE": "metadata.namespace"}
    assert only(objs, "Service")["spec"]["ports"][0]["port"] == 9100


def test_the_operator_runs_as_non_root_with_a_read_only_root_filesystem(chart: helm.Chart) -> None:
    objs = render(chart)
    pod = only(objs, "Deployment")["spec"]["template"]["spec"]["securityContext"]
    context = container(objs)["securityContext"]
    assert pod["runAsNonRoot"] is True
    assert context["runAsNonRoot"] is True
    assert pod["seccompProfile"] == {"type": "RuntimeDefault"}
    assert context["readOnlyRootFilesystem"] is True
    assert context["allowPrivilegeEscalation"] is False
    assert context["capabilities"] == {"drop": ["ALL"]}
    # The same user the image declares.
    user = re.search(r"^USER (\d+):(\d+)$", (REPO / "Dockerfile").read_text(), re.MULTILINE)
    assert user is not None
    assert (pod["runAsUser"], pod["runAsGroup"]) == (int(user[1]), int(user[2]))


# --- RBAC against what the operator really does -------------------------------------------

# kopf's watch of CRDs is cluster-scoped: a namespaced install does without it (kopf falls back to
# noticing CRD changes on restart), so its Roles grant everything else.
TEMPLATES = {(API_GROUP, "kvoffloadanalysistemplates", "get")}
CLUSTER_SCOPED = {("apiextensions.k8s.io", "customresourcedefinitions", verb) for verb in ("list", "watch")} | TEMPLATES


def rbac_verb(method: str, name: str | None, params: Mapping[str, str]) -> str:
    """The RBAC verb the API server checks for a request (Kubernetes' request-verb mapping)."""
    if method == "GET":
        return "watch" if params.get("watch") in ("true", "1") else "get" if name else "list"
    if method == "DELETE":
        return "delete" if name else "deletecollection"
    return {"POST": "create", "PUT": "update", "PATCH": "patch"}[method]


def requested(cluster: EmulatedCluster) -> set[Grant]:
    """(apiGroup, resource[/subresource], verb) of every resource request the emulator served."""
    seen = set()
    for request in cluster.emulator:
        if request.resource is None or not request.resource.plural:  # discovery: every user may
            continue
        resource = request.resource.plural + (f"/{request.subresource}" if request.subresource else "")
        group = request.resource.group or ""
        seen.add((group, resource, rbac_verb(request.method.value, request.name, request.params)))
        if request.headers.get("Content-Type", "").startswith("application/apply-patch"):
            # A server-side apply that creates the object needs create too (kube-apiserver v1.37
            # refuses it to a ServiceAccount that may only patch); the operator creates its children so.
            seen.add((group, resource, "create"))
    return seen


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


CHILDREN = (
    ("apps/v1", "Deployment", "chat-gpu-only"),
    ("v1", "Service", "chat"),
    ("monitoring.coreos.com/v1", "PodMonitor", "chat"),
)


async def exercise_the_operator(cluster: EmulatedCluster, args: list[str], peering: Obj | None) -> None:
    """Run the operator on a policy until it has written its children and status (and its keep-alive
    into ``peering``, if given), then call the gateway paths this scenario does not reach: updating
    and deleting children, reading references, repeating an Event."""
    namespace = "default"
    spec = {
        "model": {"name": "Qwen/Qwen3-0.6B", "image": "vllm/vllm-openai:v0.32.0", "maxModelLen": 4096},
        "gpu": {"class": "nvidia-l4"},
        "replicas": 2,
        "resources": {"baseMemory": "4Gi", "headroom": "1Gi"},
        "offload": {"cpu": "1Gi"},
        "rollout": {"baselineDuration": "2s", "stepDuration": "30s", "progressDeadline": "60s"},
        "analysis": {"interval": "1s", "window": "10s", "ttftP99": "500ms", "itlP99": "50ms", "minRequests": 5},
        "prometheus": {"url": "http://127.0.0.1:9"},  # nothing listens: Inconclusive, the baseline holds
    }
    policy_api = f"{API_GROUP}/{API_VERSION}"
    async with kvoffload_run(cluster, *args) as process:
        manifest = policy_manifest("chat", namespace, spec=spec)
        if peering is None:  # as an operator that ran kopf daemons left it; with peering they still run, and keep it
            manifest["metadata"]["finalizers"] = [FINALIZER]
        await cluster.emulator.create_object(manifest)

        def current() -> Obj:
            return cluster.emulator.read_object(policy_api, KIND, namespace, "chat") or {}

        await wait_for(lambda: (current().get("status") or {}).get("lastAnalysis"), "the operator's first analysis", 30)
        if peering is None:
            await wait_for(
                lambda: FINALIZER not in current()["metadata"].get("finalizers", []), "the old finalizer taken away", 10
            )
        if peering is not None:

            def keepalives() -> Obj:
                meta = peering["metadata"]
                peers = cluster.emulator.read_object(peering["apiVersion"], peering["kind"], None, meta["name"])
                return (peers or {}).get("status") or {}

            await wait_for(keepalives, "the operator's keep-alive in the peering object", 10)
        assert process.returncode is None

    gateway = cluster.gateway()
    body = cluster.emulator.read_object(policy_api, KIND, namespace, "chat")
    assert body is not None
    policy = PolicyRef.from_body(body)
    await cluster.emulator.create_object(
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": namespace}, "data": {"k": "v"}}
    )
    await cluster.emulator.create_object(
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s", "namespace": namespace}, "data": {"k": "dg=="}}
    )
    cluster.emulator.register_crd(template_crd_manifest())
    assert await gateway.read_analysis_template("platform-gates") is None
    assert await gateway.read_configmap(namespace, "c", "k") == "v"
    assert await gateway.read_secret(namespace, "s", "k") == "v"
    assert await gateway.emit_event(policy, "Normal", "Twice", "the same event, counted")
    assert await gateway.emit_event(policy, "Normal", "Twice", "the same event, counted")
    for api_version, kind, name in CHILDREN:
        child = cluster.emulator.read_object(api_version, kind, namespace, name)
        assert child is not None, f"the operator did not create {kind} {name}"
        await gateway.apply(child, policy)  # an update, as the next stage does
    # An engine that reads its options from a file (TensorRT-LLM) gets a ConfigMap per level, applied with its
    # Deployment and deleted with it.
    files = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "chat-cpu", "namespace": namespace}}
    await gateway.apply({**files, "data": {"extra-llm-api-options.yaml": "kv_cache_config: {}\n"}}, policy)
    assert await gateway.delete_owned("ConfigMap", "chat-cpu", policy)
    # The operator deletes only a canary Deployment; the garbage collector removes the rest with the policy.
    assert await gateway.delete_owned("Deployment", "chat-gpu-only", policy)


@pytest.mark.e2e
@pytest.mark.parametrize("peering", [False, True], ids=["standalone", "peering"])
async def test_the_chart_grants_exactly_what_the_real_operator_requests(kube: EmulatedCluster, peering: bool) -> None:
    chart = helm.Chart.load(CHART)
    try:
        # The policy's Prometheus is on 127.0.0.1, and it is analysed every second, as in a one-machine lab.
        tenancy = {"prometheusAllowPrivate": True, "minAnalysisInterval": "", "minAnalysisWindow": ""}
        lab = {"peering": {"enabled": peering}, "tenancy": tenancy}
        cluster_wide = render(chart, lab)
        namespaced = render(chart, {**lab, "watchNamespaces": WATCHED})
    finally:
        chart.close()
    peering_object = None
    if peering:  # the CRDs and the peering object as the chart installs them
        for crd in (
            obj
            for obj in cluster_wide
            if obj["kind"] == "CustomResourceDefinition" and obj["spec"]["group"] == "kopf.dev"
        ):
            kube.emulator.register_crd(crd)
        peering_object = await kube.emulator.create_object(only(cluster_wide, "ClusterKopfPeering"))
    port = free_port()
    args = [re.sub(r"^--metrics-port=\d+$", f"--metrics-port={port}", arg) for arg in container(cluster_wide)["args"]]
    await exercise_the_operator(kube, args, peering_object)
    used = requested(kube)

    # The scenario reached every kind the gateway knows, so the recording is the whole list.
    assert {(api.rpartition("/")[0], plural) for (api, _), plural in PLURALS.items()} <= {
        (group, resource) for group, resource, _ in used
    }
    # Secrets are read only for Prometheus bearer tokens, granted apart (prometheusAuth): see below. The
    # leader's Lease is in the operator's own namespace, granted apart too.
    assert grants(only(cluster_wide, "ClusterRole")) == used - SECRETS - LEASES
    assert used >= LEASES
    for install in (cluster_wide, namespaced):
        (election,) = (
            obj for obj in install if obj["metadata"]["name"].endswith("-leader-election") and obj["kind"] == "Role"
        )
        assert grants(election) == LEASES
    for role in (obj for obj in namespaced if obj["kind"] == "Role" and obj["metadata"]["name"].endswith("-kvoffload")):
        # The same, namespace by namespace (a namespaced operator peers through KopfPeerings).
        expected = {
            (g, r.replace("clusterkopfpeerings", "kopfpeerings"), v)
            for g, r, v in used - CLUSTER_SCOPED - SECRETS - LEASES
        }
        assert grants(role) == expected


SECRETS = {("", "secrets", "get")}
LEASES = {("coordination.k8s.io", "leases", verb) for verb in ("create", "get", "update")}


@pytest.mark.parametrize("watch", [[], WATCHED], ids=["cluster-wide", "namespaced"])
def test_secrets_are_granted_only_by_name_in_the_release_namespace_and_in_the_namespaces_listed(
    chart: helm.Chart, watch: list[str]
) -> None:
    values = {
        "watchNamespaces": watch,
        "prometheusAuth": {
            "tokenSecret": {"name": "prom-token", "key": "bearer"},
            "policySecrets": [{"namespace": "llm-a", "names": ["a-token"]}, {"namespace": "team-b"}],
        },
        "tenancy": {"prometheusAllowedUrls": ["https://prometheus.monitoring:9090"]},
    }
    objs = render(chart, values)
    secret_rules = {
        (obj["kind"], obj["metadata"].get("namespace"), json_rule)
        for obj in objs
        if obj["kind"] in ("Role", "ClusterRole")
        for rule in obj["rules"]
        if "secrets" in rule["resources"]
        for json_rule in [(tuple(rule["verbs"]), tuple(rule.get("resourceNames", ())))]
    }
    assert secret_rules == {
        ("Role", NAMESPACE, (("get",), ("prom-token",))),
        ("Role", "llm-a", (("get",), ("a-token",))),
        ("Role", "team-b", (("get",), ())),
    }
    roles = {(obj["metadata"]["namespace"], obj["metadata"]["name"]) for obj in objs if obj["kind"] == "Role"}
    bindings = [obj for obj in objs if obj["kind"] == "RoleBinding"]
    assert {(b["metadata"]["namespace"], b["roleRef"]["name"]) for b in bindings} == roles
    for binding in bindings:
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": f"{RELEASE}-kvoffload", "namespace": NAMESPACE}
        ]
    args = container(objs)["args"]
    assert f"--prometheus-token-secret={NAMESPACE}/prom-token" in args
    assert "--prometheus-token-key=bearer" in args


def test_no_secret_is_granted_by_default(chart: helm.Chart) -> None:
    for values in ({}, {"watchNamespaces": WATCHED}):
        objs = render(chart, values)
        assert not [
            rule
            for obj in objs
            if obj["kind"] in ("Role", "ClusterRole")
            for rule in obj["rules"]
            if "secrets" in rule["resources"]
        ]
        assert not [arg for arg in container(objs)["args"] if arg.startswith("--prometheus-token")]
