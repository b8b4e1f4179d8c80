"""Every CEL rule in the CRD, evaluated by a real CEL interpreter against values it must take and refuse.

cel-python runs the rules; tests/support/cel_k8s.py adds the Kubernetes quantity
and list libraries it lacks. Each rule mirrors one pydantic validator, and the
mirror is checked too: for every case, the models refuse exactly what CEL refuses.
"""

from __future__ import annotations

import copy
import re
from decimal import Decimal
from typing import Any

import celpy
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from kvoffload.api.quantity import parse_quantity
from kvoffload.api.serving import KNOWN_ENGINES, RESERVED_LEVEL_NAMES
from kvoffload.api.types import KVOffloadPolicySpec
from kvoffload.engines import ENGINES
from kvoffload.engines.options import managed_flags
from kvoffload.engines.sglang import command as sglang
from kvoffload.engines.vllm import flags as vllm
from tests.support.cel_k8s import compile_rule, evaluate, every_rule, rule_failures
from tests.support.crd_admission import apply_defaults, openapi_schema

SPEC_SCHEMA = openapi_schema()["properties"]["spec"]

BASE_SPEC: dict[str, Any] = {
    "model": {"name": "Qwen/Qwen3-8B", "image": "vllm/vllm-openai:v0.32.0", "maxModelLen": 32768},
    "gpu": {"class": "nvidia-l40s"},
    "replicas": 4,
    "resources": {"baseMemory": "24Gi"},
    "offload": {"cpu": "32Gi"},
}


def spec(**changes: Any) -> dict[str, Any]:
    """The base spec with dotted-path changes, defaulted as the API server would before running rules."""
    out = copy.deepcopy(BASE_SPEC)
    for dotted, value in changes.items():
        node = out
        *parents, leaf = dotted.split("__")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    defaulted: dict[str, Any] = apply_defaults(SPEC_SCHEMA, out)
    return defaulted


def adopting(**changes: Any) -> dict[str, Any]:
    """A spec that takes over the Deployment ``vllm`` (spec.workloadRef) instead of naming model.image."""
    out = spec(**{"workloadRef": {"name": "vllm"}, **changes})
    del out["model"]["image"]
    return out


def tier(name: str = "nvme", **extra: Any) -> dict[str, Any]:
    return {"name": name, "size": "500Gi", "path": "/mnt/kv-cache", "volume": {"emptyDir": {}}, **extra}


def metric(name: str = "m", **extra: Any) -> dict[str, Any]:
    """A custom metric (spec.analysis.metrics[]) with a valid query; bounds as given."""
    return {"name": name, "query": "sum(x{ {{ selector }} })", **extra}


SECRET_KEY = {"secretKeyRef": {"name": "hf-token", "key": "token"}}


# message -> (values the rule takes, values it refuses); `self` is the node the rule sits on.
def engine_rule(title: str) -> str:
    return f"may not set a flag the operator manages ({title}'s"


CASES: dict[str, tuple[list[Any], list[Any]]] = {
    "must be greater than zero": (["32Gi", "1", 1, "0.5", "500m", "1e3", "+2Ki"], ["0", 0, "-1Gi", -5, "0.0", "-0.5"]),
    "must not be negative": (["0", 0, "4Gi", "1e-3"], ["-1", -1, "-4Gi", "-1m"]),
    # Kubernetes caps no exponent: 1e999999999 is a well-formed quantity the API server would store.
    "must be at most 1Pi": (["1Pi", "1024Ti", "1e15", 2**50], ["1025Ti", "2Pi", "1e16", "2e15"]),
    "must be at most 720h": (["720h", "30s", "719h59m"], ["721h", "600000h", "720h1s"]),
    "may not change what code the engine loads": (
        ["HF_TOKEN", "VLLM_LOGGING_LEVEL", "PYTHONUNBUFFERED", "OLD_PRELOAD"],
        [
            "LD_PRELOAD",
            "LD_LIBRARY_PATH",
            "PYTHONPATH",
            "GCONV_PATH",
            "NCCL_NET_PLUGIN",
            "VLLM_USE_SIMPLE_KV_OFFLOAD",
            "CUDA_INJECTION64_PATH",
            "NVTX_INJECTION64_PATH",
        ],
    ),
    # Not "1ns": cel-python keeps durations as timedelta (microseconds); Kubernetes' CEL keeps nanoseconds.
    "must be longer than zero": (["30s", "1500ms", "1h30m", "0.5s", "1us", "0m1s"], ["0s", "0m", "0h0m0s", "0.0s"]),
    "give either numKVHeads and headDim (MHA/GQA) or kvLoraRank and qkRopeHeadDim (MLA)": (
        [
            {"numLayers": 36, "numKVHeads": 8, "headDim": 128},
            {"numLayers": 61, "kvLoraRank": 512, "qkRopeHeadDim": 64},
        ],
        [
            {"numLayers": 36},
            {"numLayers": 36, "numKVHeads": 8},
            {"numLayers": 36, "numKVHeads": 8, "headDim": 128, "kvLoraRank": 512},
        ],
    ),
    # One rule per engine, on the spec: each applies its engine's managed spellings to its own policies only.
    engine_rule("vLLM"): (
        [spec(), spec(model__extraArgs=[])]
        + [spec(model__extraArgs=a) for a in (["--enable-prefix-caching"], ["--model-impl=vllm", "--portable"])]
        + [spec(model__extraArgs=["--max-num-seqs", "256"])]
        # SGLang's managed flags are not vLLM's, and vLLM's are not judged on an SGLang policy by this rule.
        + [spec(model__extraArgs=["--context-length=4096"]), spec(engine="sglang", model__extraArgs=["-tp=8"])],
        [spec(model__extraArgs=a) for a in (["--max-model-len=4096"], ["--enable-prefix-caching", "--port"])]
        + [spec(model__extraArgs=["--kv-transfer-config={}"])]
        # Spelt as vLLM's parser also reads them: underscores, a dotted JSON key, an alias, another long name.
        + [spec(model__extraArgs=a) for a in (["--max_model_len=131072"], ["-tp", "8"], ["--kv_offloading_size=500"])]
        + [spec(model__extraArgs=["-tp=8"]), spec(model__extraArgs=["--device-memory-utilization"])]
        + [spec(model__extraArgs=["--kv-transfer-config.kv_connector_extra_config.cpu_bytes_to_use=1"])]
        + [spec(model__extraArgs=[flag]) for flag in vllm.managed_flags()],
    ),
    engine_rule("SGLang"): (
        [
            spec(engine="sglang"),
            spec(engine="sglang", model__extraArgs=["--enable-mixed-chunk"]),
            spec(engine="sglang", model__extraArgs=["--max-running-requests", "64"]),
            spec(model__extraArgs=["--context-length=4096"]),
            spec(engine="sglang", model__extraArgs=["-tp=8"]),
        ],
        [spec(engine="sglang", model__extraArgs=a) for a in (["--context-length=4096"], ["--tp_size", "2"])]
        + [spec(engine="sglang", model__extraArgs=["--mem-fraction-static=0.5", "--hicache-size", "8"])]
        + [
            spec(engine="sglang", model__extraArgs=[flag])
            for flag in managed_flags(sglang.option_table(), sglang.MANAGED_DESTS)
        ],
    ),
    "set exactly one of emptyDir, persistentVolumeClaim or hostPath": (
        [{"emptyDir": {}}, {"persistentVolumeClaim": {"claimName": "kv"}}, {"hostPath": {"path": "/mnt/nvme"}}],
        [
            {},
            {"emptyDir": {}, "hostPath": {"path": "/mnt/nvme"}},
            {"emptyDir": {}, "persistentVolumeClaim": {"claimName": "kv"}},
        ],
    ),
    "storeThreshold applies only to a single CPU tier, without secondaryTiers": (
        [{"cpu": "32Gi", "storeThreshold": 2}, {"cpu": "32Gi", "secondaryTiers": [tier()]}, {"cpu": "32Gi"}],
        [
            {"cpu": "32Gi", "storeThreshold": 2, "secondaryTiers": [tier()]},
            {"cpu": "32Gi", "storeThreshold": 0, "secondaryTiers": [tier()]},
        ],
    ),
    "secondaryTiers names must be unique": (
        [[], [tier("nvme")], [tier("nvme"), tier("ssd")]],
        [[tier("nvme"), tier("nvme")], [tier("a"), tier("b"), tier("a")]],
    ),
    "secondaryTiers may not be named cpu, cpu-pilot, gpu-only: those name ladder levels": (
        [[tier("nvme")], [tier("cpu2"), tier("gpu")]],
        [[tier(name)] for name in sorted(RESERVED_LEVEL_NAMES)] + [[tier("nvme"), tier("cpu")]],
    ),
    "url: no . or .. path segment": (
        [{"url": "http://prom:9090"}, {"url": "https://prom/team-a/"}, {"url": "http://prom/a.b/..c/c.."}],
        [
            {"url": "http://prom/team-a/../team-b"},
            {"url": "http://prom/.."},
            {"url": "http://prom/./x"},
            {"url": "http://prom/a/."},
        ],
    ),
    "metric names must be unique": (
        [[], [metric("a", max=1)], [metric("a", max=1), metric("b", max=1)]],
        [[metric("a", max=1), metric("a", max=1)], [metric("a", max=1), metric("b", max=1), metric("a", max=1)]],
    ),
    "give min, max or both": (
        [metric(max=1.0), metric(min=0.5), metric(min=0.0, max=2.0)],
        [metric(), metric(dryRun=True)],
    ),
    "min must be at most max": (
        [metric(min=1.0, max=1.0), metric(max=1.0), metric(min=-1.0, max=0.0)],
        [metric(min=2.0, max=1.0)],
    ),
    "must rise strictly and end at 100": (
        [[100], [25, 50, 100], [1, 2, 3, 100], [99, 100]],
        [[50], [25, 50], [50, 25, 100], [50, 50, 100], [25, 100, 100], [100, 50], [10, 100, 50]],
    ),
    "gpu.count must equal model.tensorParallelSize (one engine spans its GPUs)": (
        [spec(), spec(gpu__count=4, model__tensorParallelSize=4)],
        [spec(gpu__count=2), spec(model__tensorParallelSize=4), spec(gpu__count=8, model__tensorParallelSize=4)],
    ),
    "rollout.pilotCpu must be smaller than offload.cpu": (
        [spec(), spec(rollout__pilotCpu="4Gi"), spec(rollout__pilotCpu="32767Mi"), spec(rollout__pilotCpu=1024)],
        [spec(rollout__pilotCpu="32Gi"), spec(rollout__pilotCpu="64Gi"), spec(rollout__pilotCpu="34359738368")],
    ),
    "rollout.canaryReplicas must be fewer than replicas when maxSurge is 0": (
        [spec(), spec(replicas=2), spec(replicas=1, rollout__maxSurge=1), spec(rollout__canaryReplicas=3)],
        [spec(replicas=1), spec(rollout__canaryReplicas=4), spec(replicas=2, rollout__canaryReplicas=5)],
    ),
    "set model.image or workloadRef, exactly one": (
        [spec(), adopting(), adopting(workloadRef={"name": "vllm", "container": "engine"})],
        [spec(workloadRef={"name": "vllm"}), {k: v for k, v in adopting().items() if k != "workloadRef"}],
    ),
    "with workloadRef, the referenced Deployment carries the pod, flags and environment": (
        [adopting(), spec(model__extraArgs=["--enforce-eager"])],
        [
            adopting(podTemplate={}),
            adopting(model__extraArgs=["--enforce-eager"]),
            adopting(model__env=[{"name": "A", "value": "b"}]),
        ],
    ),
    "set model.architecture or model.configMap, not both": (
        [spec(), spec(model__configMap={"name": "cfg"})],
        [
            spec(
                model__architecture={"numLayers": 36, "numKVHeads": 8, "headDim": 128},
                model__configMap={"name": "cfg"},
            )
        ],
    ),
    "rollout.preflight.promptTokens must be at most model.maxModelLen": (
        [
            spec(),  # no preflight: off
            spec(rollout__preflight={}),  # on, the prompt from the baseline
            spec(rollout__preflight={"promptTokens": 1480}),
            spec(rollout__preflight={"promptTokens": 32768}),  # exactly maxModelLen
        ],
        [spec(rollout__preflight={"promptTokens": 32769}), spec(rollout__preflight={"promptTokens": 10_000_000})],
    ),
    # spec.podTemplate: what may come from a Secret, a ConfigMap or the pod, and from where.
    "could complete into a variable that changes what code the engine loads": (
        ["APP_", "HF_", "MY", "OLD_LD_"],
        ["LD_", "LD_X", "L", "PYTHON", "PY", "V", "NCCL_", "B"],
    ),
    "set value or valueFrom, not both": (
        [
            {"name": "A", "value": "x"},
            {"name": "A", "valueFrom": SECRET_KEY},
            {"name": "A", "value": "", "valueFrom": SECRET_KEY},
        ],
        [{"name": "A", "value": "x", "valueFrom": SECRET_KEY}],
    ),
    "set exactly one of secretKeyRef, configMapKeyRef, fieldRef, resourceFieldRef": (
        [SECRET_KEY, {"fieldRef": {"fieldPath": "metadata.name"}}, {"resourceFieldRef": {"resource": "limits.memory"}}],
        [{}, {**SECRET_KEY, "configMapKeyRef": {"name": "c", "key": "k"}}],
    ),
    "set exactly one of configMapRef, secretRef": (
        [{"prefix": "A_", "secretRef": {"name": "s"}}, {"prefix": "A_", "configMapRef": {"name": "c"}}],
        [{"prefix": "A_"}, {"prefix": "A_", "secretRef": {"name": "s"}, "configMapRef": {"name": "c"}}],
    ),
    "set exactly one of emptyDir, secret, configMap, persistentVolumeClaim, hostPath": (
        [{"name": "v", "emptyDir": {}}, {"name": "v", "secret": {"secretName": "s"}}],
        [{"name": "v"}, {"name": "v", "emptyDir": {}, "secret": {"secretName": "s"}}],
    ),
    "may not contain '..'": (["a/b", "hf", "a..b", "x/.../y"], ["..", "a/../b", "../x", "a/.."]),
    "may not change the pod's security profile (AppArmor, seccomp annotations), which the operator sets": (
        [{}, {"example.com/owner": "search"}, {"apparmor.example.com/x": "y"}],
        [
            {"container.apparmor.security.beta.kubernetes.io/vllm": "unconfined"},
            {"seccomp.security.alpha.kubernetes.io/pod": "unconfined"},
            # Issue 33: the container-level seccomp annotation got past the pod-level prefix.
            {"container.seccomp.security.alpha.kubernetes.io/vllm": "unconfined"},
            {"a": "b", "container.seccomp.security.alpha.kubernetes.io/x": "localhost/p.json"},
        ],
    ),
    "tolerationSeconds needs effect NoExecute": (
        [
            {"key": "k", "operator": "Exists", "effect": "NoSchedule"},
            {"key": "k", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 30},
        ],
        [
            {"key": "k", "operator": "Exists", "effect": "NoSchedule", "tolerationSeconds": 2},
            {"key": "k", "operator": "Exists", "tolerationSeconds": 2},  # no effect: every effect
        ],
    ),
    "rollout.observe.selector is required when rollout.observeOnly is true": (
        [
            {},
            {"observeOnly": False},
            {"observeOnly": True, "observe": {"selector": {"matchLabels": {"app": "vllm"}}}},
            {"observeOnly": False, "observe": {"selector": {"matchLabels": {"app": "vllm"}}}},
        ],
        [{"observeOnly": True}],
    ),
}


# An engine with no hand-written cases above (a newly added one): its own managed spellings, refused on its policies
# alone (the same flags on a vLLM policy are vLLM's rule's to judge).
for _engine in ENGINES.values():
    CASES.setdefault(
        engine_rule(_engine.title),
        (
            [spec(engine=_engine.name), spec(model__extraArgs=list(_engine.managed_flags)[:1])],
            [spec(engine=_engine.name, model__extraArgs=[flag]) for flag in _engine.managed_flags],
        ),
    )

# Where each pod template rule sits, as a whole spec holding the value (for mirroring through the models).
POD_TEMPLATE_AT = {
    "could complete into a variable that changes what code the engine loads": lambda v: {
        "envFrom": [{"prefix": v, "secretRef": {"name": "s"}}]
    },
    "set value or valueFrom, not both": lambda v: {"env": [v]},
    "set exactly one of secretKeyRef, configMapKeyRef, fieldRef, resourceFieldRef": lambda v: {
        "env": [{"name": "A", "valueFrom": v}]
    },
    "set exactly one of configMapRef, secretRef": lambda v: {"envFrom": [v]},
    "set exactly one of emptyDir, secret, configMap, persistentVolumeClaim, hostPath": lambda v: {"volumes": [v]},
    "may not contain '..'": lambda v: {
        "volumes": [{"name": "v", "emptyDir": {}}],
        "volumeMounts": [{"name": "v", "mountPath": "/data", "subPath": v}],
    },
    "may not change the pod's security profile (AppArmor, seccomp annotations), which the operator sets": lambda v: {
        "metadata": {"annotations": v}
    },
    "tolerationSeconds needs effect NoExecute": lambda v: {"tolerations": [v]},
}


def rules_by_message() -> dict[str, str]:
    """Each distinct rule of the CRD, keyed by the start of its message. An engine whose managed spellings need
    more than one rule's pattern has several rules saying the same: they count as one, all of them holding."""
    found: dict[str, str] = {}
    for _, _, entry in every_rule(openapi_schema()):
        key = next((k for k in CASES if entry["message"].startswith(k)), entry["message"])
        if key in ENGINE_RULES and key in found and found[key] != entry["rule"]:
            found[key] = f"({found[key]}) && ({entry['rule']})"
            continue
        assert found.get(key, entry["rule"]) == entry["rule"], f"two different rules say {key!r}"
        found[key] = entry["rule"]
    return found


def test_every_rule_has_cases_and_every_case_a_rule() -> None:
    assert set(rules_by_message()) == set(CASES)


def test_every_rule_compiles() -> None:
    for _, _, entry in every_rule(openapi_schema()):
        compile_rule(entry["rule"])  # raises CELParseError


def test_every_rule_has_a_message_and_valid_field_path() -> None:
    for path, node, entry in every_rule(openapi_schema()):
        assert entry["message"], path
        target = node
        for part in entry.get("fieldPath", "").strip(".").split(".") if "fieldPath" in entry else []:
            assert part in target.get("properties", {}), f"{path}: fieldPath {entry['fieldPath']} is not a field"
            target = target["properties"][part]


CASE_PARAMS = [
    pytest.param(message, value, ok, id=f"{message[:40]}-{'takes' if ok else 'refuses'}-{i}")
    for message, (good, bad) in CASES.items()
    for ok, values in ((True, good), (False, bad))
    for i, value in enumerate(values)
]


@pytest.mark.parametrize(("message", "value", "ok"), CASE_PARAMS)
def test_rule_takes_or_refuses(message: str, value: Any, ok: bool) -> None:
    assert evaluate(rules_by_message()[message], value) == ok


# --- the models refuse what CEL refuses ---------------------------------------------

SPEC_LEVEL = [
    "gpu.count must equal model.tensorParallelSize (one engine spans its GPUs)",
    "rollout.pilotCpu must be smaller than offload.cpu",
    "rollout.canaryReplicas must be fewer than replicas when maxSurge is 0",
    "set model.architecture or model.configMap, not both",
    "set model.image or workloadRef, exactly one",
    "with workloadRef, the referenced Deployment carries the pod, flags and environment",
    "rollout.preflight.promptTokens must be at most model.maxModelLen",
]

# Mirrored by the engine's own judgment (the webhook's and the operator's), not by the models: api cannot ask an
# engine (test_every_managed_spelling_cel_refuses_is_refused_by_the_engine).
ENGINE_RULES = [engine_rule(engine.title) for engine in ENGINES.values()]


@pytest.mark.parametrize("message", SPEC_LEVEL)
def test_models_mirror_the_spec_level_rules(message: str) -> None:
    good, bad = CASES[message]
    for value in good:
        KVOffloadPolicySpec.model_validate(value)
    for value in bad:
        with pytest.raises(ValidationError, match=re.escape(message)):
            KVOffloadPolicySpec.model_validate(value)


def _spec_with(path: str, value: Any) -> dict[str, Any]:
    """The base spec with one nested node replaced, for mirroring node-level rules through the models."""
    out = spec()
    node: Any = out
    *parents, leaf = path.split(".")
    for part, after in zip(parents, [*parents[1:], leaf], strict=False):
        node = node[int(part)] if part.isdigit() else node.setdefault(part, [{}] if after.isdigit() else {})
    node[leaf] = value
    return out


NODE_LEVEL = {
    "must be greater than zero": "offload.cpu",
    "must not be negative": "resources.headroom",
    "must be at most 1Pi": "offload.cpu",
    "must be at most 720h": "rollout.progressDeadline",
    "may not change what code the engine loads": "model.env.0.name",
    "must be longer than zero": "analysis.window",
    "give either numKVHeads and headDim (MHA/GQA) or kvLoraRank and qkRopeHeadDim (MLA)": "model.architecture",
    "storeThreshold applies only to a single CPU tier, without secondaryTiers": "offload",
    "secondaryTiers names must be unique": "offload.secondaryTiers",
    "secondaryTiers may not be named cpu, cpu-pilot, gpu-only: those name ladder levels": "offload.secondaryTiers",
    "must rise strictly and end at 100": "rollout.promotionSteps",
    "rollout.observe.selector is required when rollout.observeOnly is true": "rollout",
    "metric names must be unique": "analysis.metrics",
    "url: no . or .. path segment": "prometheus",
}


@pytest.mark.parametrize("message", list(NODE_LEVEL))
def test_models_mirror_the_node_level_rules(message: str) -> None:
    good, bad = CASES[message]
    for value in good:
        KVOffloadPolicySpec.model_validate(_spec_with(NODE_LEVEL[message], value))
    for value in bad:
        with pytest.raises(ValidationError):
            KVOffloadPolicySpec.model_validate(_spec_with(NODE_LEVEL[message], value))


def test_tier_volume_rule_mirrors_the_model() -> None:
    good, bad = CASES["set exactly one of emptyDir, persistentVolumeClaim or hostPath"]
    for value in good:
        KVOffloadPolicySpec.model_validate(spec(offload__secondaryTiers=[tier(volume=value)]))
    for value in bad:
        with pytest.raises(ValidationError, match="set exactly one"):
            KVOffloadPolicySpec.model_validate(spec(offload__secondaryTiers=[tier(volume=value)]))


@pytest.mark.parametrize("message", list(POD_TEMPLATE_AT))
def test_pod_template_rules_mirror_the_models(message: str) -> None:
    good, bad = CASES[message]
    for value in good:
        KVOffloadPolicySpec.model_validate(spec(podTemplate=POD_TEMPLATE_AT[message](value)))
    for value in bad:
        with pytest.raises(ValidationError):
            KVOffloadPolicySpec.model_validate(spec(podTemplate=POD_TEMPLATE_AT[message](value)))


@pytest.mark.parametrize("message", ENGINE_RULES)
def test_every_managed_spelling_cel_refuses_is_refused_by_the_engine(message: str) -> None:
    # The CEL rule is the API server's quick check; the engine's walk over its option table must refuse at least
    # as much, with the item's own message (the models take the spec: they cannot ask an engine).
    good, bad = CASES[message]
    for value in bad:
        KVOffloadPolicySpec.model_validate(value)
        args = value["model"]["extraArgs"]
        refused = {p.index for p in ENGINES[value["engine"]].judge_extra_args(args)}
        assert refused, (value["engine"], args)
        assert all("which the operator manages" in p.message for p in ENGINES[value["engine"]].judge_extra_args(args))
    for value in good:
        KVOffloadPolicySpec.model_validate(value)


def test_each_engine_rule_is_its_engine_s_pattern() -> None:
    rules = rules_by_message()
    for name, engine in ENGINES.items():
        rule = rules[engine_rule(engine.title)]
        (known,) = (e for e in KNOWN_ENGINES if e.name == name)
        assert rule.count(f"self.engine != '{name}'") == len(known.managed_patterns)
        for pattern in known.managed_patterns:
            assert f"!a.matches('{pattern}')" in rule
    # SGLang's spellings need two patterns within the API server's cost budget: both hold.
    assert len(next(e for e in KNOWN_ENGINES if e.name == "sglang").managed_patterns) == 2


CUSTOM_METRIC_RULES = ["give min, max or both", "min must be at most max"]
"""Rules on one spec.analysis.metrics[] item, mirrored by test_models_mirror_the_custom_metric_rules."""


def test_node_and_spec_cases_cover_every_rule() -> None:
    covered = set(SPEC_LEVEL) | set(NODE_LEVEL) | set(POD_TEMPLATE_AT) | set(ENGINE_RULES)
    covered |= {"set exactly one of emptyDir, persistentVolumeClaim or hostPath"}
    covered |= set(CUSTOM_METRIC_RULES)
    assert covered == set(CASES)


# Within the 1Pi bound both fields have, so that only the pilot rule can refuse a pair.
QUANTITIES = st.one_of(
    st.integers(min_value=1, max_value=2**40),
    st.builds(
        lambda n, unit: f"{n}{unit}",
        st.integers(min_value=1, max_value=1024),
        st.sampled_from(["Ki", "Mi", "Gi", "Ti", "k", "M", "G", "T", "", "m"]),
    ),
)


@settings(max_examples=60, deadline=None)
@given(pilot=QUANTITIES, cpu=QUANTITIES)
def test_pilot_rule_and_model_agree_on_any_pair_of_quantities(pilot: int | str, cpu: int | str) -> None:
    value = spec(rollout__pilotCpu=pilot, offload__cpu=cpu)
    cel_ok = not [f for f in rule_failures(SPEC_SCHEMA, value) if f.path.endswith("pilotCpu")]
    assert cel_ok == (parse_quantity(pilot) < parse_quantity(cpu))
    try:
        KVOffloadPolicySpec.model_validate(value)
        model_ok = True
    except ValidationError as exc:
        model_ok = "pilotCpu" not in str(exc)
    assert cel_ok == model_ok


# --- the Kubernetes quantity library, as implemented for the tests -----------------


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        ("quantity('1Gi').isLessThan(quantity('1025Mi'))", True),
        ("quantity('1Gi').isLessThan(quantity('1024Mi'))", False),
        ("quantity('1G').isGreaterThan(quantity('1Gi'))", False),
        ("quantity('2Gi').isGreaterThan(quantity('2G'))", True),
        ("quantity('1Gi').compareTo(quantity('1024Mi'))", 0),
        ("quantity('500m').compareTo(quantity('1'))", -1),
        ("quantity('1.5Gi').asInteger()", 1610612736),
        ("quantity('1500m').asApproximateFloat()", 1.5),
        ("quantity('-3Gi').sign()", -1),
        ("quantity('0').sign()", 0),
        ("quantity('1e3').asInteger()", 1000),
        ("isQuantity('32Gi') && !isQuantity('32GB')", True),
        ("[1, 2, 2].isSorted() && ![2, 1].isSorted()", True),
    ],
)
def test_kubernetes_quantity_library(expr: str, expected: Any) -> None:
    assert evaluate(expr, None) == expected


@pytest.mark.parametrize("expr", ["quantity('32GB')", "quantity('500m').asInteger()", "quantity(5)"])
def test_quantity_errors_are_cel_errors(expr: str) -> None:
    with pytest.raises(celpy.CELEvalError):
        evaluate(expr, None)


def test_cel_and_python_parse_quantities_alike() -> None:
    assert evaluate("quantity('1.5Gi').asInteger()", None) == int(parse_quantity("1.5Gi")) == Decimal(1610612736)


@pytest.mark.parametrize("message", CUSTOM_METRIC_RULES)
def test_models_mirror_the_custom_metric_rules(message: str) -> None:
    good, bad = CASES[message]
    for value in good:
        KVOffloadPolicySpec.model_validate(_spec_with("analysis.metrics", [value]))
    for value in bad:
        with pytest.raises(ValidationError):
            KVOffloadPolicySpec.model_validate(_spec_with("analysis.metrics", [value]))
