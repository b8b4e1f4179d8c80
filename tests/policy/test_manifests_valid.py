"""Every rendered manifest passes the real validators: kubernetes-validate (strict) for the
built-in kinds, the PodMonitor fields we use against the Prometheus Operator's schema, and
a property test: any spec either renders valid manifests or is refused with a PolicyError.
"""

from __future__ import annotations

from typing import Any

import jsonschema
import kubernetes_validate
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from kvoffload.api.errors import PolicyError
from kvoffload.api.types import KVOffloadPolicy
from kvoffload.policy.catalog import gpu_class_names, model_names
from kvoffload.policy.ladder import build_ladder
from kvoffload.policy.loading import parse_policy
from kvoffload.policy.render import render
from tests.policy.render_policies import BASE, LevelCase, level_cases, merge

# The oldest Kubernetes the CRD targets (CEL quantity library) and the newest schema we have.
K8S_VERSIONS = ("1.30", kubernetes_validate.latest_version())

# The PodMonitor fields we render, as monitoring.coreos.com/v1 defines them (prometheus-operator
# v0.91.0, example/prometheus-operator-crd/monitoring.coreos.com_podmonitors.yaml). Anything
# else we might add is refused, so this schema must grow with the template.
_LABEL_SELECTOR = {
    "type": "object",
    "properties": {"matchLabels": {"type": "object", "additionalProperties": {"type": "string"}}},
    "additionalProperties": False,
}
POD_MONITOR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "PodMonitor"},
        "metadata": {
            "type": "object",
            "required": ["name", "namespace"],
            "additionalProperties": False,
            "properties": {
                "name": {"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", "maxLength": 63},
                "namespace": {"type": "string"},
                "labels": {"type": "object", "additionalProperties": {"type": "string"}},
            },
        },
        "spec": {
            "type": "object",
            "required": ["selector", "podMetricsEndpoints"],
            "additionalProperties": False,
            "properties": {
                "selector": _LABEL_SELECTOR,
                "podTargetLabels": {"type": "array", "items": {"type": "string"}},
                "sampleLimit": {"type": "integer", "minimum": 0},  # int64 in the Prometheus Operator's CRD
                "podMetricsEndpoints": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "properties": {
                            "port": {"type": "string"},
                            "path": {"type": "string"},
                            "interval": {
                                "type": "string",
                                "pattern": r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?"
                                r"(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$",
                            },
                        },
                    },
                },
            },
        },
    },
}


def validate(doc: dict[str, Any], versions: tuple[str, ...] = K8S_VERSIONS) -> None:
    """Raise when a rendered manifest is not what the API server (or the PodMonitor CRD) accepts."""
    if doc["kind"] == "PodMonitor":
        jsonschema.validate(doc, POD_MONITOR_SCHEMA)
        return
    for version in versions:
        kubernetes_validate.validate(doc, version, strict=True)


def assert_valid(docs: list[dict[str, Any]], versions: tuple[str, ...] = K8S_VERSIONS) -> None:
    for doc in docs:
        try:
            validate(doc, versions)
        except (kubernetes_validate.ValidationError, jsonschema.ValidationError) as exc:
            first = str(exc).splitlines()[0]
            pytest.fail(f"{doc['kind']} {doc['metadata']['name']}: {first}")


CASES = level_cases()


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
@pytest.mark.parametrize("variant", ["stable", "canary"])
def test_every_rendered_manifest_is_valid_kubernetes(case: LevelCase, variant: str) -> None:
    docs = render(case.policy, case.level, variant)  # type: ignore[arg-type]
    assert [d["kind"] for d in docs] == ["Deployment", "Service", "PodMonitor"]
    assert_valid(docs)


def test_the_validators_catch_what_they_must() -> None:
    """The validators are live: an unknown field, a bad type and a bad interval are refused."""
    case = CASES[-1]
    deployment, _, monitor = render(case.policy, case.level, "stable")
    broken = merge(deployment, {"spec": {"template": {"spec": {"containers": [{"name": "x", "imagee": "y"}]}}}})
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(broken)
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(merge(deployment, {"spec": {"replicas": "three"}}))
    endpoint = {**monitor["spec"]["podMetricsEndpoints"][0], "interval": "1.5s"}
    with pytest.raises(jsonschema.ValidationError):
        validate(merge(monitor, {"spec": {"podMetricsEndpoints": [endpoint]}}))


# --- any spec renders valid manifests or is refused ---------------------------------------

QUANTITIES = st.sampled_from(["512Mi", "1Gi", "4Gi", "32Gi", "1.5G", "100", "0", "-1Gi", "lots", "1e3", 7])
DURATIONS = st.sampled_from(["30s", "1500ms", "2m", "1.5m", "1h", "0s", "1d", "soon"])
PATHS = st.sampled_from(
    ["/mnt/kv", "/mnt/kv/sub", "/mnt", "/dev/shm", "/dev/shm/x", "/dev", "/usr", "/var/cache/kv", "/data//kv", "rel"]
)
SAFE_TEXT = st.text(st.characters(exclude_categories=("Cs",)), max_size=12)
NAMES = st.one_of(
    st.sampled_from(["chat", "llama-70b", "a", "9lives", "chat.v2", "Chat", "a" * 63, "a" * 70]),
    st.from_regex(r"[a-z][-a-z0-9]{0,20}[a-z0-9]", fullmatch=True),
)
LABEL_KEYS = st.sampled_from(["pool", "nvidia.com/gpu.product", "bad key", "a/b/c"])
TIER_NAMES = st.sampled_from(["nvme", "disk", "shared", "cpu", "Bad_Name", "t" * 63])


def volumes() -> st.SearchStrategy[Any]:
    return st.one_of(
        st.just({"emptyDir": {}}),
        st.builds(lambda m, s: {"emptyDir": {"medium": m, **s}}, st.sampled_from(["", "Memory", "Disk"]),
                  st.sampled_from([{}, {"sizeLimit": "10Gi"}, {"sizeLimit": "bad"}])),
        st.builds(lambda n, ro: {"persistentVolumeClaim": {"claimName": n, "readOnly": ro}},
                  st.sampled_from(["kv", "Bad"]), st.booleans()),
        st.builds(lambda p, t: {"hostPath": {"path": p, "type": t}}, st.sampled_from(["/nvme/kv", "rel"]),
                  st.sampled_from(["", "Directory", "DirectoryOrCreate", "Socket"])),
        st.just({"emptyDir": {}, "hostPath": {"path": "/x"}}),
        st.just({}),
    )  # fmt: skip


TIERS = st.fixed_dictionaries(
    {"name": TIER_NAMES, "size": QUANTITIES, "path": PATHS},
    optional={
        "type": st.sampled_from(["fs", "obj"]),
        "readThreads": st.integers(-1, 2000),
        "writeThreads": st.integers(-1, 2000),
        "volume": volumes(),
    },
)
TOLERATIONS = st.fixed_dictionaries(
    {},
    optional={
        "key": st.sampled_from(["dedicated", "nvidia.com/gpu"]),
        "operator": st.sampled_from(["Exists", "Equal", "In"]),
        "value": st.sampled_from(["llm", ""]),
        "effect": st.sampled_from(["NoSchedule", "NoExecute", "Sometimes"]),
        "tolerationSeconds": st.integers(-5, 10_000),
    },
)
SPEC_PATCHES = st.fixed_dictionaries(
    {},
    optional={
        "model": st.fixed_dictionaries(
            {},
            optional={
                "name": st.sampled_from([*model_names()[:4], "someone/unknown-model"]),
                "servedModelName": st.one_of(SAFE_TEXT, st.just("chat")),
                "image": st.sampled_from(["vllm/vllm-openai:v0.32.0", "has space:1", "reg.io/x@sha256:" + "a" * 64]),
                "maxModelLen": st.integers(-1, 300_000),
                "kvCacheDtype": st.sampled_from(["auto", "fp8", "bfloat16", "int3"]),
                "extraArgs": st.lists(
                    st.one_of(SAFE_TEXT, st.sampled_from(["--enable-prefix-caching", "--port=9", "--kv-offloading-size"])),  # noqa: E501
                    max_size=3,
                ),
                "env": st.lists(
                    st.fixed_dictionaries(
                        {"name": st.sampled_from(["A", "B_1", "LMCACHE_CHUNK_SIZE", "1bad", "with space"])},
                        optional={"value": SAFE_TEXT},
                    ),
                    max_size=3,
                ),
            },
        ),
        "gpu": st.fixed_dictionaries(
            {},
            optional={
                "class": st.sampled_from([*gpu_class_names(), "tpu-v5"]),
                "memoryUtilization": st.floats(-0.5, 1.5, allow_nan=False),
                "nodeSelector": st.dictionaries(LABEL_KEYS, st.one_of(SAFE_TEXT, st.just("llm")), max_size=2),
                "tolerations": st.lists(TOLERATIONS, max_size=2),
            },
        ),
        "replicas": st.integers(-1, 12),
        "resources": st.fixed_dictionaries(
            {}, optional={"baseMemory": QUANTITIES, "headroom": QUANTITIES, "cpu": st.sampled_from(["8", "500m", "x"])}
        ),
        "offload": st.fixed_dictionaries(
            {},
            optional={
                "backend": st.sampled_from(["native", "lmcache", "mooncake"]),
                "cpu": QUANTITIES,
                "blockSize": st.sampled_from([None, 16, 24, 64, 256, 0]),
                "evictionPolicy": st.sampled_from(["lru", "arc", "fifo"]),
                "storeThreshold": st.sampled_from([None, 0, 2, -1]),
                "secondaryTiers": st.lists(TIERS, max_size=3),
                "overheadFactor": st.floats(0.5, 5, allow_nan=False),
            },
        ),
        "rollout": st.fixed_dictionaries(
            {},
            optional={
                "canaryReplicas": st.integers(0, 5),
                "maxSurge": st.integers(-1, 3),
                "pilotCpu": QUANTITIES,
                "progressDeadline": DURATIONS,
            },
        ),
        "analysis": st.fixed_dictionaries({}, optional={"interval": DURATIONS}),
    },
)  # fmt: skip


def render_and_validate(policy: KVOffloadPolicy) -> PolicyError | None:
    """Render every level (stable) and the top level's canary, and validate each distinct manifest."""
    ladder = build_ladder(policy.spec)
    try:
        docs = [render(policy, level, "stable")[0] for level in ladder]
        docs += render(policy, ladder[-1], "canary")  # the canary, the Service and the PodMonitor
    except PolicyError as exc:
        return exc
    # One schema version keeps a hundred examples fast; the fixed cases above check both.
    assert_valid(docs, versions=K8S_VERSIONS[:1])
    return None


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=NAMES, spec_patch=SPEC_PATCHES)
def test_any_spec_renders_valid_manifests_or_is_refused_with_a_policy_error(
    name: str, spec_patch: dict[str, Any]
) -> None:
    obj = merge(BASE, {"metadata": {"name": name}, "spec": spec_patch})
    try:
        policy = parse_policy(obj)
    except PolicyError as exc:
        refusal: PolicyError | None = exc
        event("refused by validation")
    else:
        refusal = render_and_validate(policy)
        event("rendered and valid" if refusal is None else "refused at render")
    if refusal is not None:
        assert refusal.errors, "a PolicyError names at least one field"
        assert all(e.path and e.message for e in refusal.errors), refusal.errors
