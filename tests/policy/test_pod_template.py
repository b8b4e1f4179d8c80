"""spec.podTemplate: merged under what the operator manages, every overreach refused naming its field."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from pydantic import ValidationError

from kvoffload.api.conventions import LABEL_CONFIG_HASH, LABEL_POLICY
from kvoffload.api.types import KVOffloadPolicy
from kvoffload.policy.engine_config import config_hash
from kvoffload.policy.ladder import build_ladder
from kvoffload.policy.render import render_deployment, render_pod_monitor
from kvoffload.policy.renderable import check_renderable
from kvoffload.policy.tenancy import Tenancy, check_tenancy
from tests.policy.render_policies import sglang_policy

BASE: dict[str, Any] = {
    "apiVersion": "kvoffload.io/v1alpha1",
    "kind": "KVOffloadPolicy",
    "metadata": {"name": "chat", "namespace": "llm"},
    "spec": {
        "model": {"name": "Qwen/Qwen3-8B", "image": "vllm/vllm-openai:v0.32.0", "maxModelLen": 8192},
        "gpu": {"class": "nvidia-l40s"},
        "replicas": 2,
        "resources": {"baseMemory": "24Gi"},
        "offload": {
            "cpu": "32Gi",
            "secondaryTiers": [{"name": "nvme", "size": "100Gi", "path": "/mnt/kv", "volume": {"emptyDir": {}}}],
        },
    },
}
GATED = {
    "metadata": {"labels": {"team": "search"}, "annotations": {"example.com/owner": "search"}},
    "env": [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf-token", "key": "token"}}}],
    "envFrom": [{"prefix": "APP_", "configMapRef": {"name": "app"}}],
    "volumes": [{"name": "models", "persistentVolumeClaim": {"claimName": "model-cache", "readOnly": True}}],
    "volumeMounts": [{"name": "models", "mountPath": "/models", "readOnly": True}],
    "imagePullSecrets": [{"name": "pull"}],
    "tolerations": [{"key": "team", "operator": "Equal", "value": "search", "effect": "NoSchedule"}],
    "affinity": {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}]
            }
        }
    },
    "topologySpreadConstraints": [
        {"maxSkew": 1, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "ScheduleAnyway"}
    ],
    "priorityClassName": "llm-high",
    "serviceAccountName": "llm-engine",
}
# Key-less tolerations too, so that a toleration the API server would refuse is refused for that alone.
ALLOWING = Tenancy(service_accounts=("llm-engine",), priority_classes=("llm-high",), keyless_tolerations=True)


def policy(overlay: dict[str, Any] | None = None, **spec: Any) -> KVOffloadPolicy:
    obj = copy.deepcopy(BASE)
    obj["spec"].update(spec)
    if overlay is not None:
        obj["spec"]["podTemplate"] = overlay
    return KVOffloadPolicy.model_validate(obj)


def pod_of(p: KVOffloadPolicy, index: int = -1) -> dict[str, Any]:
    level = build_ladder(p.spec)[index]
    template: dict[str, Any] = render_deployment(p, level, 1)["spec"]["template"]
    return template


def paths(p: KVOffloadPolicy, tenancy: Tenancy = ALLOWING) -> list[str]:
    return [e.path for e in (*check_renderable(p), *check_tenancy(p, tenancy))]


# --- merged under the operator ------------------------------------------------------------------------


def test_a_policy_without_an_overlay_renders_and_hashes_as_before() -> None:
    bare, empty = policy(), policy({})
    for level in build_ladder(bare.spec):
        assert config_hash(bare, level) == config_hash(empty, level)
        assert render_deployment(bare, level, 1) == render_deployment(empty, level, 1)


def test_the_overlay_reaches_the_pod_under_what_the_operator_manages() -> None:
    plain, gated = pod_of(policy()), pod_of(policy(GATED))
    engine, bare_engine = gated["spec"]["containers"][0], plain["spec"]["containers"][0]
    assert engine["env"][-1] == GATED["env"][0]
    assert engine["envFrom"] == GATED["envFrom"]
    assert engine["volumeMounts"] == [*bare_engine["volumeMounts"], GATED["volumeMounts"][0]]
    assert gated["spec"]["volumes"] == [*plain["spec"]["volumes"], GATED["volumes"][0]]
    assert gated["spec"]["tolerations"] == [*plain["spec"]["tolerations"], GATED["tolerations"][0]]
    for field in ("imagePullSecrets", "affinity", "topologySpreadConstraints"):
        assert gated["spec"][field] == GATED[field]
    assert (gated["spec"]["priorityClassName"], gated["spec"]["serviceAccountName"]) == ("llm-high", "llm-engine")
    assert gated["metadata"]["labels"] == {"team": "search", **plain["metadata"]["labels"]} | {
        LABEL_CONFIG_HASH: gated["metadata"]["labels"][LABEL_CONFIG_HASH]
    }
    assert gated["metadata"]["annotations"]["example.com/owner"] == "search"
    # What the operator manages is the operator's, whatever the overlay adds.
    for field in ("resources", "securityContext", "args", "command", "image"):
        assert engine[field] == bare_engine[field]
    for field in ("securityContext", "automountServiceAccountToken", "nodeSelector"):
        assert gated["spec"][field] == plain["spec"][field]


def test_the_overlay_changes_the_config_hash_so_the_pods_roll() -> None:
    plain, gated = policy(), policy(GATED)
    level = build_ladder(plain.spec)[-1]
    assert config_hash(plain, level) != config_hash(gated, level)


def test_monitor_labels_go_under_the_operators_own() -> None:
    p = policy(prometheus={"monitorLabels": {"release": "mine", "team": "search"}})
    labels = render_pod_monitor(p, {"release": "kube-prometheus-stack", "cluster": "a"})["metadata"]["labels"]
    assert (labels["release"], labels["team"], labels["cluster"]) == ("mine", "search", "a")
    assert labels[LABEL_POLICY] == "chat"
    refused = policy(prometheus={"monitorLabels": {"bad key": "x"}})
    assert paths(refused) == ["spec.prometheus.monitorLabels['bad key']"]


# --- refused, naming the field ------------------------------------------------------------------------

ANTI_OTHER_TEAM = {
    "labelSelector": {"matchLabels": {"app": "x"}},
    "namespaces": ["llm", "team-b"],
    "topologyKey": "kubernetes.io/hostname",
}

REFUSED = [
    ({"metadata": {"labels": {LABEL_POLICY: "other"}}}, f"spec.podTemplate.metadata.labels['{LABEL_POLICY}']"),
    (
        {"metadata": {"labels": {"app.kubernetes.io/name": "x"}}},
        "spec.podTemplate.metadata.labels['app.kubernetes.io/name']",
    ),
    ({"metadata": {"labels": {"ok": "not a value"}}}, "spec.podTemplate.metadata.labels['ok']"),
    ({"volumes": [{"name": "dshm", "emptyDir": {}}]}, "spec.podTemplate.volumes[0].name"),
    ({"volumes": [{"name": "engine-config", "emptyDir": {}}]}, "spec.podTemplate.volumes[0].name"),
    (
        {
            "volumes": [{"name": "v", "emptyDir": {}}],
            "volumeMounts": [{"name": "v", "mountPath": "/etc/kvoffload/engine"}],
        },
        "spec.podTemplate.volumeMounts[0].mountPath",
    ),
    ({"volumes": [{"name": "kv-nvme", "emptyDir": {}}]}, "spec.podTemplate.volumes[0].name"),
    ({"volumes": [{"name": "ram", "emptyDir": {"medium": "Memory"}}]}, "spec.podTemplate.volumes[0].emptyDir.medium"),
    ({"volumeMounts": [{"name": "nowhere", "mountPath": "/data"}]}, "spec.podTemplate.volumeMounts[0].name"),
    (
        {"volumes": [{"name": "v", "emptyDir": {}}], "volumeMounts": [{"name": "v", "mountPath": "/dev/shm"}]},
        "spec.podTemplate.volumeMounts[0].mountPath",
    ),
    (
        {"volumes": [{"name": "v", "emptyDir": {}}], "volumeMounts": [{"name": "v", "mountPath": "/mnt/kv/x"}]},
        "spec.podTemplate.volumeMounts[0].mountPath",
    ),
    (
        {"volumes": [{"name": "v", "emptyDir": {}}], "volumeMounts": [{"name": "v", "mountPath": "/mnt"}]},
        "spec.podTemplate.volumeMounts[0].mountPath",
    ),
    (
        {"volumes": [{"name": "v", "emptyDir": {}}], "volumeMounts": [{"name": "v", "mountPath": "/etc"}]},
        "spec.podTemplate.volumeMounts[0].mountPath",
    ),
    ({"env": [{"name": "HF_TOKEN", "value": "x"}]}, "spec.podTemplate.env[0].name"),  # set in spec.model.env too
    (
        {
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "In"}]}]
                    }
                }
            }
        },
        "spec.podTemplate.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0]"
        ".matchExpressions[0].values",
    ),
    (
        {"topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "a b", "whenUnsatisfiable": "DoNotSchedule"}]},
        "spec.podTemplate.topologySpreadConstraints[0].topologyKey",
    ),
    ({"tolerations": [{"operator": "Equal", "value": "x"}]}, "spec.podTemplate.tolerations[0].operator"),
    ({"serviceAccountName": "kvoffload"}, "spec.podTemplate.serviceAccountName"),
    ({"priorityClassName": "system-cluster-critical"}, "spec.podTemplate.priorityClassName"),
    ({"runtimeClassName": "unconfined"}, "spec.podTemplate.runtimeClassName"),
    ({"volumes": [{"name": "host", "hostPath": {"path": "/var/run"}}]}, "spec.podTemplate.volumes[0].hostPath.path"),
    # Issue 33: another namespace's pods, named outright (the policy is in llm).
    (
        {"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [ANTI_OTHER_TEAM]}}},
        "spec.podTemplate.affinity.podAntiAffinity.requiredDuringSchedulingIgnoredDuringExecution[0].namespaces[1]",
    ),
    (
        {
            "affinity": {
                "podAffinity": {
                    "preferredDuringSchedulingIgnoredDuringExecution": [
                        {"weight": 1, "podAffinityTerm": {**ANTI_OTHER_TEAM, "namespaces": ["kube-system"]}}
                    ]
                }
            }
        },
        "spec.podTemplate.affinity.podAffinity.preferredDuringSchedulingIgnoredDuringExecution[0].podAffinityTerm"
        ".namespaces[0]",
    ),
]


@pytest.mark.parametrize(("overlay", "path"), REFUSED, ids=[p for _, p in REFUSED])
def test_an_overreach_is_refused_naming_its_field(overlay: dict[str, Any], path: str) -> None:
    model = {"env": [{"name": "HF_TOKEN", "value": "y"}]} if path == "spec.podTemplate.env[0].name" else {}
    p = policy(overlay, model={**BASE["spec"]["model"], **model})
    assert paths(p) == [path]


SCHEMA_REFUSED = [
    {"securityContext": {"privileged": True}},
    {"containers": [{"name": "sidecar", "image": "x"}]},
    {"hostNetwork": True},
    {"volumes": [{"name": "t", "projected": {"sources": [{"serviceAccountToken": {"path": "t"}}]}}]},
    {"volumes": [{"name": "v"}]},
    {"volumeMounts": [{"name": "v", "mountPath": "/d", "mountPropagation": "Bidirectional"}]},
    {"env": [{"name": "LD_PRELOAD", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]},
    {"env": [{"name": "A", "value": "x", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]},
    {"env": [{"name": "A", "valueFrom": {"fieldRef": {"fieldPath": "spec.containers"}}}]},
    {"envFrom": [{"secretRef": {"name": "s"}}]},  # no prefix: its keys could be LD_PRELOAD
    {"envFrom": [{"prefix": "PYTHON", "secretRef": {"name": "s"}}]},
    {"volumes": [{"name": "v", "secret": {"secretName": "s", "items": [{"key": "k", "path": "../x"}]}}]},
    # Issue 33: the security profile, container by container (AppArmor, and seccomp, which the pod-level prefix
    # missed); an empty namespaceSelector is every namespace.
    {"metadata": {"annotations": {"container.apparmor.security.beta.kubernetes.io/vllm": "unconfined"}}},
    {"metadata": {"annotations": {"container.seccomp.security.alpha.kubernetes.io/vllm": "unconfined"}}},
    {
        "affinity": {
            "podAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": [
                    {"namespaceSelector": {}, "topologyKey": "kubernetes.io/hostname"}
                ]
            }
        }
    },
]


@pytest.mark.parametrize("overlay", SCHEMA_REFUSED, ids=[str(o)[:60] for o in SCHEMA_REFUSED])
def test_what_the_overlay_does_not_offer_is_refused_by_the_models(overlay: dict[str, Any]) -> None:
    with pytest.raises(ValidationError) as caught:
        policy(overlay)
    assert all(str(error["loc"][1]) == "podTemplate" for error in caught.value.errors()), caught.value


def test_the_admin_allows_what_a_policy_may_name() -> None:
    p = policy(GATED)
    assert paths(p) == []
    assert paths(p, Tenancy()) == ["spec.podTemplate.serviceAccountName", "spec.podTemplate.priorityClassName"]
    assert paths(policy({"serviceAccountName": "default"}), Tenancy()) == []
    host = policy({"volumes": [{"name": "h", "hostPath": {"path": "/models/cache"}}]})
    assert paths(host, Tenancy(host_path_roots=("/models",))) == []


def memory_limit_env(container: str) -> dict[str, Any]:
    """An overlay variable holding the engine container's memory limit (the downward API)."""
    ref = {"resource": "limits.memory", "containerName": container}
    return {"env": [{"name": "MEMORY_LIMIT", "valueFrom": {"resourceFieldRef": ref}}]}


@pytest.mark.parametrize(("engine", "container"), [("vllm", "vllm"), ("sglang", "sglang")])
def test_a_resource_reference_names_each_engines_own_container(engine: str, container: str) -> None:
    p = (
        policy(memory_limit_env(container))
        if engine == "vllm"
        else sglang_policy(podTemplate=memory_limit_env(container))
    )
    assert check_renderable(p) == []
    (engine_container,) = pod_of(p)["spec"]["containers"]
    assert engine_container["name"] == container
    (env,) = [e for e in engine_container["env"] if e["name"] == "MEMORY_LIMIT"]
    assert env["valueFrom"]["resourceFieldRef"]["containerName"] == container


def test_a_resource_reference_to_another_engines_container_is_refused_naming_it() -> None:
    # Issue 33: the name was pinned to vllm, so an SGLang pod's reference could not resolve.
    (error,) = check_renderable(sglang_policy(podTemplate=memory_limit_env("vllm")))
    assert error.path == "spec.podTemplate.env[0].valueFrom.resourceFieldRef.containerName"
    assert "SGLang runs in 'sglang'" in error.message


# --- what only the admin may allow (issue 33) ----------------------------------------------------------

TOKEN_VOLUME = {"volumes": [{"name": "t", "secret": {"secretName": "builder-token-x7k2p"}}]}
KEYLESS = {"tolerations": [{"operator": "Exists"}]}
MESH_OPT_OUT = {
    "metadata": {
        "annotations": {"sidecar.istio.io/inject": "false", "example.com/owner": "search"},
        "labels": {"istio.io/dataplane-mode": "none"},
    }
}


@pytest.mark.parametrize(
    ("overlay", "refused"),
    [
        (TOKEN_VOLUME, ["spec.podTemplate.volumes[0].secret.secretName"]),
        (KEYLESS, ["spec.podTemplate.tolerations[0].key"]),
        (
            {"tolerations": [{"key": "", "operator": "Exists", "effect": "NoSchedule"}]},
            ["spec.podTemplate.tolerations[0].key"],
        ),
        (
            MESH_OPT_OUT,
            [
                "spec.podTemplate.metadata.labels['istio.io/dataplane-mode']",
                "spec.podTemplate.metadata.annotations['sidecar.istio.io/inject']",
            ],
        ),
        (
            {"metadata": {"annotations": {"linkerd.io/inject": "disabled"}}},
            ["spec.podTemplate.metadata.annotations['linkerd.io/inject']"],
        ),
        (
            {"metadata": {"annotations": {"kuma.io/sidecar-injection": "disabled"}}},
            ["spec.podTemplate.metadata.annotations['kuma.io/sidecar-injection']"],
        ),
    ],
    ids=["token-secret-volume", "keyless-exists", "empty-key-noschedule", "istio", "linkerd", "kuma"],
)
def test_by_default_the_pod_reaches_no_further_than_the_admin_allows(
    overlay: dict[str, Any], refused: list[str]
) -> None:
    assert paths(policy(overlay), Tenancy()) == refused


def test_a_key_less_toleration_of_the_gpu_is_refused_too() -> None:
    p = policy(gpu={"class": "nvidia-l40s", "tolerations": [{"operator": "Exists"}]})
    assert paths(p, Tenancy()) == ["spec.gpu.tolerations[0].key"]
    assert paths(p, Tenancy(keyless_tolerations=True)) == []


def test_the_admin_allows_secret_volumes_key_less_tolerations_and_mesh_keys() -> None:
    allowing = Tenancy(
        secret_volumes=("model-config-*",),
        keyless_tolerations=True,
        pod_annotations=("sidecar.istio.io/inject", "istio.io/*"),
    )
    config = {"volumes": [{"name": "c", "secret": {"secretName": "model-config-llama"}}]}
    for overlay in (config, KEYLESS, MESH_OPT_OUT):
        assert paths(policy(overlay), allowing) == [], overlay
    # The patterns are the admin's, whole: another Secret, another mesh key is still refused.
    assert paths(policy(TOKEN_VOLUME), allowing) == ["spec.podTemplate.volumes[0].secret.secretName"]
    linkerd = policy({"metadata": {"annotations": {"linkerd.io/inject": "disabled"}}})
    assert paths(linkerd, allowing) == ["spec.podTemplate.metadata.annotations['linkerd.io/inject']"]


def test_the_policys_own_namespace_may_be_named_in_a_pod_affinity_term() -> None:
    own = {**ANTI_OTHER_TEAM, "namespaces": ["llm"]}
    overlay = {"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [own]}}}
    assert paths(policy(overlay), Tenancy()) == []
