"""The chart's HA knobs and escape hatches (issue 36), through the real Helm v4 SDK, as Argo Rollouts' and Flagger's
charts offer them: a PodDisruptionBudget (on by default with two replicas), topologySpreadConstraints,
priorityClassName, podLabels/podAnnotations, commonLabels on every object, extraArgs/extraEnv/extraVolumes/
extraVolumeMounts, the image by digest and the JSON log flag; and the values README generated from the schema.

Every manifest rendered with the documented values passes kubernetes-validate (strict); the schema refuses a
wrong type naming the key.
"""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from collections.abc import Iterable
from pathlib import Path
from types import ModuleType
from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest
import yaml

from kvoffload.cli.run import run
from tests.support import paths
from tests.support.controlplane import Kube, wait_for

CHART = paths.ROOT / "charts" / "kvoffload"
RELEASE, NAMESPACE = "kvo", "kvoffload-system"
K8S_VERSION = "1.33"
DIGEST = "sha256:4f53cda18c2baa0c0354bb5f9a3ecbe5ed12ab4d8e11ba873c2f11161202b945"

Obj = dict[str, Any]

# The values documented in values.yaml's comments, all at once (webhook and monitors on too, so that every kind
# of object the chart can render shows commonLabels).
DOCUMENTED: Obj = {
    "image": {"tag": "9.9.9", "digest": DIGEST},
    "pdb": {"minAvailable": 1},
    "topologySpreadConstraints": [
        {"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "ScheduleAnyway"},
        {
            "maxSkew": 1,
            "topologyKey": "kubernetes.io/hostname",
            "whenUnsatisfiable": "DoNotSchedule",
            "labelSelector": {"matchLabels": {"app.kubernetes.io/instance": RELEASE}},
        },
    ],
    "priorityClassName": "platform-critical",
    "commonLabels": {"team": "inference", "cost-center": "llm-platform"},
    "podLabels": {"example.com/tier": "control"},
    "podAnnotations": {"example.com/owner": "inference"},
    "extraArgs": ["--some-new-flag=value"],
    "extraEnv": [
        {"name": "HTTPS_PROXY", "value": "http://proxy.internal:3128"},
        {"name": "TEAM", "valueFrom": {"configMapKeyRef": {"name": "team", "key": "name"}}},
    ],
    "extraVolumes": [{"name": "corp-ca", "configMap": {"name": "corp-ca"}}],
    "extraVolumeMounts": [{"name": "corp-ca", "mountPath": "/etc/ssl/corp", "readOnly": True}],
    "logFormat": "json",
    "webhook": {"enabled": True, "certManager": {"enabled": True}},
    "peering": {"enabled": True},
    "grafanaDashboard": {"enabled": True},
    "metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "prom"}}},
    "prometheusRule": {"enabled": True},
    "notifications": {"sinks": [{"name": "ops", "url": "http://receiver.ops:8080/hook"}]},
}
CHART_LABELS = {"helm.sh/chart", "app.kubernetes.io/instance", "app.kubernetes.io/managed-by"}


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


def of_kind(objs: list[Obj], kind: str) -> list[Obj]:
    return [obj for obj in objs if obj["kind"] == kind]


def only(objs: list[Obj], kind: str) -> Obj:
    (match,) = of_kind(objs, kind)
    return match


def operator_container(objs: list[Obj]) -> Obj:
    containers: list[Obj] = only(objs, "Deployment")["spec"]["template"]["spec"]["containers"]
    (container,) = containers
    assert container["name"] == "operator"
    return container


# --- the PodDisruptionBudget ------------------------------------------------------------------------------------


def test_the_default_two_replicas_get_a_budget_that_lets_one_go_at_a_time(chart: helm.Chart) -> None:
    objs = render(chart)
    deployment = only(objs, "Deployment")
    assert deployment["spec"]["replicas"] == 2
    pdb = only(objs, "PodDisruptionBudget")
    assert pdb["apiVersion"] == "policy/v1"
    assert pdb["spec"]["maxUnavailable"] == 1
    assert "minAvailable" not in pdb["spec"]
    # It guards exactly the operator's pods: the Deployment's selector, which its pods carry.
    assert pdb["spec"]["selector"] == deployment["spec"]["selector"]
    assert (
        pdb["spec"]["selector"]["matchLabels"].items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    )
    # A crash-looping standby never blocks a drain.
    assert pdb["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
    kubernetes_validate.validate(pdb, K8S_VERSION, strict=True)


@pytest.mark.parametrize(
    "values",
    [
        {"replicas": 1},
        {"replicas": 0},
        {"replicas": 1, "leaderElection": {"enabled": False, "leaseDuration": 8}},
        {"pdb": {"enabled": False}},
    ],
    ids=["one-replica", "stopped", "no-election", "disabled"],
)
def test_no_budget_with_fewer_than_two_replicas_or_when_disabled(chart: helm.Chart, values: Obj) -> None:
    # With one replica minAvailable 1 would block every drain, and maxUnavailable 1 would guard nothing.
    assert of_kind(render(chart, values), "PodDisruptionBudget") == []


@pytest.mark.parametrize(
    ("pdb", "spec"),
    [
        ({"minAvailable": 2}, {"minAvailable": 2}),
        ({"maxUnavailable": "50%"}, {"maxUnavailable": "50%"}),
        ({"minAvailable": 0}, {"minAvailable": 0}),
        ({"unhealthyPodEvictionPolicy": "IfHealthyBudget"}, {"maxUnavailable": 1}),
    ],
)
def test_the_budget_takes_min_available_or_max_unavailable(chart: helm.Chart, pdb: Obj, spec: Obj) -> None:
    budget = only(render(chart, {"replicas": 3, "pdb": pdb}), "PodDisruptionBudget")
    assert {key: budget["spec"][key] for key in ("minAvailable", "maxUnavailable") if key in budget["spec"]} == spec
    assert budget["spec"]["unhealthyPodEvictionPolicy"] == pdb.get("unhealthyPodEvictionPolicy", "AlwaysAllow")
    kubernetes_validate.validate(budget, K8S_VERSION, strict=True)


# --- the documented values --------------------------------------------------------------------------------------


def test_the_documented_values_pass_the_schema_and_every_manifest_the_real_validators(chart: helm.Chart) -> None:
    chart.validate_schema(DOCUMENTED)
    objs = render(chart, DOCUMENTED)
    for obj in objs:
        if obj["apiVersion"].startswith(("monitoring.coreos.com/", "cert-manager.io/", "kopf.dev/")):
            continue  # kinds kubernetes-validate does not know; tests/test_chart.py checks them against their schemas
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    assert {"PodDisruptionBudget", "Deployment", "Pod"} <= {obj["kind"] for obj in objs}


@pytest.mark.parametrize(
    "values",
    [
        DOCUMENTED,
        # the webhook's certificate made by the chart (a Secret) rather than by cert-manager; namespaced RBAC
        DOCUMENTED | {"webhook": {"enabled": True}, "watchNamespaces": ["llm-a"]},
    ],
    ids=["cert-manager", "generated-certificate"],
)
def test_common_labels_reach_every_object(chart: helm.Chart, values: Obj) -> None:
    objs = render(chart, values)
    common = values["commonLabels"].items()
    unlabelled = [
        f"{obj['kind']}/{obj['metadata']['name']}" for obj in objs if not common <= obj["metadata"]["labels"].items()
    ]
    assert unlabelled == []
    assert len(objs) >= 20  # the CRDs, RBAC, webhook, monitors, dashboard, PDB, Deployment, test pod...


def test_common_labels_enter_no_selector(chart: helm.Chart) -> None:
    objs = render(chart, DOCUMENTED)
    common = DOCUMENTED["commonLabels"].items()
    deployment = only(objs, "Deployment")
    assert common <= deployment["spec"]["template"]["metadata"]["labels"].items()
    # A selector never takes them: changing them on upgrade must not orphan the pods (a Deployment's selector is
    # immutable) nor point the Services elsewhere.
    selector = {"app.kubernetes.io/name": "kvoffload", "app.kubernetes.io/instance": RELEASE}
    assert deployment["spec"]["selector"] == {"matchLabels": selector}
    assert only(objs, "PodDisruptionBudget")["spec"]["selector"] == {"matchLabels": selector}
    assert {obj["metadata"]["name"]: obj["spec"]["selector"] for obj in of_kind(objs, "Service")} == {
        "kvo-kvoffload-metrics": selector,
        "kvo-kvoffload-webhook": selector,
    }
    # Labels of an object's own sit beside them, each key written once.
    monitor = only(objs, "ServiceMonitor")["metadata"]["labels"]
    assert monitor["release"] == "prom"
    assert monitor["team"] == "inference"
    # cert-manager's Secret carries them too (the webhook's certificate, through secretTemplate).
    templates = [
        obj["spec"]["secretTemplate"] for obj in of_kind(objs, "Certificate") if "secretTemplate" in obj["spec"]
    ]
    assert templates
    for template in templates:
        assert common <= template["labels"].items()


def test_pod_labels_annotations_and_priority_reach_the_operator_and_the_test_pod(chart: helm.Chart) -> None:
    objs = render(chart, DOCUMENTED)
    template = only(objs, "Deployment")["spec"]["template"]
    test_pod = only(objs, "Pod")
    for metadata, spec in ((template["metadata"], template["spec"]), (test_pod["metadata"], test_pod["spec"])):
        assert metadata["labels"]["example.com/tier"] == "control"
        assert metadata["labels"]["team"] == "inference"
        assert metadata["labels"].keys() >= CHART_LABELS
        assert metadata["annotations"]["example.com/owner"] == "inference"
        assert spec["priorityClassName"] == "platform-critical"
    # The chart's own annotations stay: the sinks' checksum on the operator, the hook on the test pod.
    assert "checksum/notifications" in template["metadata"]["annotations"]
    assert test_pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    # The metrics Service must still not select the test pod.
    service = next(obj for obj in of_kind(objs, "Service") if obj["metadata"]["name"].endswith("-metrics"))
    assert not service["spec"]["selector"].items() <= test_pod["metadata"]["labels"].items()


def test_spread_constraints_pass_through_and_default_their_selector_to_the_operators_pods(chart: helm.Chart) -> None:
    objs = render(chart, DOCUMENTED)
    deployment = only(objs, "Deployment")
    zone, host = deployment["spec"]["template"]["spec"]["topologySpreadConstraints"]
    assert zone == {**DOCUMENTED["topologySpreadConstraints"][0], "labelSelector": deployment["spec"]["selector"]}
    assert host == DOCUMENTED["topologySpreadConstraints"][1]  # a selector given is kept as given
    # The preferred anti-affinity by hostname stays beside them (no affinity was given).
    assert "podAntiAffinity" in deployment["spec"]["template"]["spec"]["affinity"]


def test_no_spread_constraints_by_default(chart: helm.Chart) -> None:
    # As in Argo Rollouts' and Flagger's charts: none unless given; the anti-affinity spreads two replicas.
    spec = only(render(chart), "Deployment")["spec"]["template"]["spec"]
    assert "topologySpreadConstraints" not in spec
    assert "priorityClassName" not in spec


def test_extra_args_env_and_volumes_come_after_the_charts_own(chart: helm.Chart) -> None:
    extras = ("extraArgs", "extraEnv", "extraVolumes", "extraVolumeMounts")
    without = render(chart, {key: value for key, value in DOCUMENTED.items() if key not in extras})
    objs = render(chart, DOCUMENTED)
    own, container = operator_container(without), operator_container(objs)
    assert container["args"] == [*own["args"], *DOCUMENTED["extraArgs"]]
    assert "--log-format=json" in own["args"]
    assert container["env"] == [*own["env"], *DOCUMENTED["extraEnv"]]
    assert container["volumeMounts"] == [*own["volumeMounts"], *DOCUMENTED["extraVolumeMounts"]]
    volumes = only(objs, "Deployment")["spec"]["template"]["spec"]["volumes"]
    assert volumes == [*only(without, "Deployment")["spec"]["template"]["spec"]["volumes"], *DOCUMENTED["extraVolumes"]]
    assert {mount["name"] for mount in container["volumeMounts"]} <= {volume["name"] for volume in volumes}


def test_an_extra_arg_that_yaml_would_retype_stays_a_string(chart: helm.Chart) -> None:
    args = operator_container(render(chart, {"extraArgs": ["true", "--x=1: 2", "0755"]}))["args"]
    assert args[-3:] == ["true", "--x=1: 2", "0755"]


def test_a_digest_pins_the_image_and_the_tag_is_ignored(chart: helm.Chart) -> None:
    objs = render(chart, DOCUMENTED)
    reference = f"ghcr.io/kvoffload/kvoffload@{DIGEST}"
    assert operator_container(objs)["image"] == reference
    (probe,) = only(objs, "Pod")["spec"]["containers"]
    assert probe["image"] == reference  # helm test runs the very same image
    assert (
        operator_container(render(chart, {"image": {"tag": "9.9.9"}}))["image"] == "ghcr.io/kvoffload/kvoffload:9.9.9"
    )


def test_text_logs_render_no_flag_and_json_logs_parse_as_a_kvoffload_run_option(chart: helm.Chart) -> None:
    assert not [arg for arg in operator_container(render(chart))["args"] if arg.startswith("--log-format")]
    args = operator_container(render(chart, {"logFormat": "json"}))["args"]
    assert "--log-format=json" in args
    with run.make_context("run", list(args)) as context:
        assert context.params["log_format"] == "json"


# --- the schema -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "complaint"),
    [
        ({"pdb": {"enabled": "yes"}}, "/pdb/enabled"),
        ({"pdb": {"minAvailable": "one"}}, "/pdb/minAvailable"),
        ({"pdb": {"maxUnavailable": -1}}, "/pdb/maxUnavailable"),
        ({"pdb": {"minAvailable": 1, "maxUnavailable": 1}}, "at '/pdb': 'not' failed"),
        ({"pdb": {"unhealthyPodEvictionPolicy": "Never"}}, "/pdb/unhealthyPodEvictionPolicy"),
        ({"pdb": {"minAvailable": 1, "labels": {}}}, "'labels' not allowed"),
        ({"topologySpreadConstraints": {"maxSkew": 1}}, "/topologySpreadConstraints"),
        (
            {"topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "Sometimes"}]},
            "/topologySpreadConstraints/0/whenUnsatisfiable",
        ),
        ({"topologySpreadConstraints": [{"maxSkew": 1, "whenUnsatisfiable": "DoNotSchedule"}]}, "'topologyKey'"),
        (
            {"topologySpreadConstraints": [{"maxSkew": 0, "topologyKey": "z", "whenUnsatisfiable": "DoNotSchedule"}]},
            "/topologySpreadConstraints/0/maxSkew",
        ),
        ({"priorityClassName": "Bad_Name"}, "/priorityClassName"),
        ({"podLabels": {"team": 3}}, "/podLabels/team"),
        ({"podLabels": {"app.kubernetes.io/instance": "other"}}, "/podLabels"),
        ({"commonLabels": {"app.kubernetes.io/name": "other"}}, "/commonLabels"),
        ({"commonLabels": {"team": "x" * 64}}, "/commonLabels/team"),
        ({"podAnnotations": {"a": 1}}, "/podAnnotations/a"),
        ({"extraArgs": "--verbose"}, "/extraArgs"),
        ({"extraArgs": [1]}, "/extraArgs/0"),
        ({"extraEnv": [{"value": "x"}]}, "/extraEnv/0"),
        ({"extraEnv": [{"name": "A", "value": 1}]}, "/extraEnv/0/value"),
        ({"extraEnv": [{"name": "A", "value": "x", "valueFrom": {}}]}, "at '/extraEnv/0': 'not' failed"),
        ({"extraVolumes": [{"configMap": {"name": "x"}}]}, "/extraVolumes/0"),
        ({"extraVolumeMounts": [{"name": "x", "mountPath": "etc"}]}, "/extraVolumeMounts/0/mountPath"),
        ({"extraVolumeMounts": [{"name": "x", "mountPath": "/x", "readonly": True}]}, "'readonly' not allowed"),
        ({"image": {"digest": "latest"}}, "/image/digest"),
        ({"image": {"digest": "sha256:abc"}}, "/image/digest"),
        ({"logFormat": "yaml"}, "/logFormat"),
        ({"logFormat": True}, "/logFormat"),
    ],
)
def test_bad_knob_values_are_refused_naming_the_key(chart: helm.Chart, values: Obj, complaint: str) -> None:
    with pytest.raises(helm.HelmValuesError, match=re.escape(complaint)):
        chart.validate_schema(values)
    with pytest.raises(helm.HelmValuesError, match=re.escape(complaint)):
        chart.render(values, name=RELEASE, namespace=NAMESPACE)


# --- the values README ------------------------------------------------------------------------------------------


def chart_readme() -> ModuleType:
    """scripts/chart_readme.py, loaded as a module (scripts/ is not a package)."""
    spec = importlib.util.spec_from_file_location("chart_readme", paths.ROOT / "scripts" / "chart_readme.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_the_committed_values_readme_is_what_the_script_writes() -> None:
    script = chart_readme()
    assert (CHART / "README.md").read_text() == script.generate(CHART), (
        "charts/kvoffload/README.md is stale: run python scripts/chart_readme.py"
    )


def test_the_readme_lists_every_key_of_values_yaml_with_its_default() -> None:
    readme = (CHART / "README.md").read_text()
    rows = {
        match["key"]: match["default"]
        for match in re.finditer(r"^\| `(?P<key>[^`]+)` \| .*? \| (?P<default>`.*?`|) \| ", readme, re.MULTILINE)
    }

    def keys(values: object, prefix: str = "") -> Iterable[tuple[str, object]]:
        if isinstance(values, dict) and values and prefix.rstrip(".") not in rows:
            for name, value in values.items():
                yield from keys(value, f"{prefix}{name}.")
        else:
            yield prefix.rstrip("."), values

    values = yaml.safe_load((CHART / "values.yaml").read_text())
    for key, default in keys(values):
        if default == {} and any(row.startswith(f"{key}.") for row in rows):
            continue  # an object empty by default whose keys have rows of their own (webhook.certManager.issuerRef)
        assert key in rows, f"{key} of values.yaml has no row in the README"
        assert rows[key] == f"`{json.dumps(default, separators=(', ', ': '))}`", key
    for key in ("pdb.enabled", "topologySpreadConstraints", "commonLabels", "extraVolumeMounts", "image.digest"):
        assert key in rows


def test_a_key_without_a_description_stops_the_script(tmp_path: Path) -> None:
    script = chart_readme()
    schema = json.loads((CHART / "values.schema.json").read_text())
    schema["properties"]["pdb"]["properties"]["newKnob"] = {"type": "boolean"}
    (tmp_path / "values.schema.json").write_text(json.dumps(schema))
    (tmp_path / "values.yaml").write_text((CHART / "values.yaml").read_text())
    with pytest.raises(script.UndocumentedKeys) as raised:
        script.generate(tmp_path)
    assert raised.value.keys == ["pdb.newKnob"]


# --- on the real API server -------------------------------------------------------------------------------------

# What a Kyverno "require-labels" rule does, as the API server's own ValidatingAdmissionPolicy (no Kyverno can run
# here): in a namespace labelled for it, every Deployment, Pod, Service, ServiceAccount, PDB, Role and RoleBinding
# created or updated must carry a team label. Helm's release Secret is left out, as such rules leave it.
TEAM_RULE = "require-team-label"
TEAM_RULE_SELECTOR = {"kvoffload.io/test-require-team-label": "true"}
TEAM_POLICY: Obj = {
    "apiVersion": "admissionregistration.k8s.io/v1",
    "kind": "ValidatingAdmissionPolicy",
    "metadata": {"name": TEAM_RULE},
    "spec": {
        "failurePolicy": "Fail",
        "matchConstraints": {
            "namespaceSelector": {"matchLabels": TEAM_RULE_SELECTOR},
            "resourceRules": [
                {
                    "apiGroups": [group],
                    "apiVersions": ["*"],
                    "operations": ["CREATE", "UPDATE"],
                    "resources": resources,
                    "scope": "Namespaced",
                }
                for group, resources in (
                    ("", ["pods", "services", "serviceaccounts", "configmaps"]),
                    ("apps", ["deployments", "replicasets"]),
                    ("policy", ["poddisruptionbudgets"]),
                    ("rbac.authorization.k8s.io", ["roles", "rolebindings"]),
                )
            ],
        },
        "validations": [
            {
                "expression": "has(object.metadata.labels) && 'team' in object.metadata.labels",
                "message": "every object needs a team label",
            }
        ],
    },
}
TEAM_BINDING: Obj = {
    "apiVersion": "admissionregistration.k8s.io/v1",
    "kind": "ValidatingAdmissionPolicyBinding",
    "metadata": {"name": TEAM_RULE},
    "spec": {
        "policyName": TEAM_RULE,
        "validationActions": ["Deny"],
        "matchResources": {"namespaceSelector": {"matchLabels": TEAM_RULE_SELECTOR}},
    },
}


@pytest.mark.kube
def test_a_team_label_rule_refuses_the_install_until_common_labels_meet_it_and_the_budget_covers_the_pods(
    control_plane: Kube,
) -> None:
    """On kube-apiserver with its Deployment and ReplicaSet controllers (no kubelet: the pods stay Pending)."""
    kube = control_plane
    namespace = kube.namespace("knobs")
    kube.kubectl("label", "namespace", namespace, *(f"{key}={value}" for key, value in TEAM_RULE_SELECTOR.items()))
    release = "kvk"
    values: Obj = {
        "crds": {"install": False},  # the session's CRDs belong to others
        "watchNamespaces": [namespace],  # namespaced: its Role falls under the rule too
        "replicas": 2,
        "topologySpreadConstraints": DOCUMENTED["topologySpreadConstraints"][:1],
        "podLabels": DOCUMENTED["podLabels"],
    }
    try:
        kube.kubectl("apply", "-f", "-", stdin=json.dumps(TEAM_POLICY))
        kube.kubectl("apply", "-f", "-", stdin=json.dumps(TEAM_BINDING))
        with helm.Config(kubeconfig_path=str(kube.kubeconfig), namespace=namespace) as config:

            def refused() -> str | None:
                # The policy takes effect once the API server has loaded it: until then an install goes through.
                try:
                    config.install(str(CHART), release, values)
                except helm.HelmError as exc:
                    return str(exc)
                config.uninstall(release)
                return None

            refusal = wait_for(refused, "the team-label rule to refuse the install")
            assert "every object needs a team label" in refusal
            config.uninstall(release, ignore_not_found=True)
            config.install(str(CHART), release, values | {"commonLabels": {"team": "inference"}})

        pdb = kube.get("poddisruptionbudget", f"{release}-kvoffload", "-n", namespace)
        assert pdb["spec"]["maxUnavailable"] == 1
        assert pdb["metadata"]["labels"]["team"] == "inference"
        # The API server, asked with the budget's own selector, lists exactly the operator's two pods (made by the
        # ReplicaSet controller and admitted by the rule). The lab's controller manager runs no disruption
        # controller, so the budget's status is not computed here.
        selector = ",".join(f"{key}={value}" for key, value in pdb["spec"]["selector"]["matchLabels"].items())

        def selected() -> list[Obj] | None:
            items: list[Obj] = kube.get("pods", "-n", namespace, "-l", selector)["items"]
            return items if len(items) == 2 else None

        pods = wait_for(selected, "the ReplicaSet controller to make the two pods the budget selects")
        owners = {pod["metadata"]["ownerReferences"][0]["name"] for pod in pods}
        (replica_set,) = kube.get("replicasets", "-n", namespace)["items"]
        assert owners == {replica_set["metadata"]["name"]}
        for pod in pods:
            assert pod["metadata"]["labels"]["team"] == "inference"
            assert pod["metadata"]["labels"]["example.com/tier"] == "control"
            (spread,) = pod["spec"]["topologySpreadConstraints"]
            assert spread["topologyKey"] == "topology.kubernetes.io/zone"
    finally:
        with helm.Config(kubeconfig_path=str(kube.kubeconfig), namespace=namespace) as config:
            config.uninstall(release, ignore_not_found=True)
        kube.run("delete", f"validatingadmissionpolicybinding/{TEAM_RULE}", f"validatingadmissionpolicy/{TEAM_RULE}")
        kube.run("delete", "namespace", namespace, "--wait=false")
