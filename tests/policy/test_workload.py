"""spec.workloadRef, read: the engine recognised in the referenced container, its offload flags found however
spelt, its own flags checked against the spec (each refusal named by its path), the warnings the team gets, the
admin's allow-lists over the referenced pod, and the config hash following the template (issue 35)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from kvoffload.api.errors import PolicyError
from kvoffload.api.types import KVOffloadPolicy
from kvoffload.engines import ENGINES
from kvoffload.engines.engine import Setting
from kvoffload.policy.adoptwarnings import workload_warnings
from kvoffload.policy.engine_config import config_hash
from kvoffload.policy.ladder import build_ladder, find_level
from kvoffload.policy.render import render_deployment
from kvoffload.policy.renderable import check_renderable
from kvoffload.policy.sized import Sized, size_policy
from kvoffload.policy.templating import render_input
from kvoffload.policy.tenancy import Tenancy, check_tenancy
from kvoffload.policy.workload import adopt
from tests.policy.workload_cases import (
    NAMES,
    TENANCY,
    adopted,
    deployment,
    engine_container,
    parsed,
    policy,
    policy_object,
)

VLLM = ENGINES["vllm"]
SGLANG = ENGINES["sglang"]


def paths_of(caught: pytest.ExceptionInfo[PolicyError]) -> list[str]:
    return [e.path for e in caught.value.errors]


def refused(name: str, changed: dict[str, Any] | None = None, **policy_patch: Any) -> PolicyError:
    """The refusal of adopting ``changed`` (else the unchanged Deployment) by the policy, ``policy_patch`` merged
    into its spec."""
    obj = policy_object(name)
    for key, value in policy_patch.items():
        obj["spec"][key] = {**obj["spec"].get(key, {}), **value} if isinstance(value, dict) else value
    with pytest.raises(PolicyError) as caught:
        adopt(parsed(obj), changed if changed is not None else deployment(name))
    return caught.value


def with_container(name: str, **fields: Any) -> dict[str, Any]:
    """The workload's Deployment with its engine container's ``fields`` replaced (None removes one)."""
    obj = deployment(name)
    container = engine_container(obj, {"sglang": "sglang"}.get(name, "vllm"))
    for key, value in fields.items():
        if value is None:
            container.pop(key, None)
        else:
            container[key] = value
    return obj


# --- the engine, recognised ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "engine"), [("production-stack", "vllm"), ("llm-d", "vllm"), ("sglang", "sglang")])
def test_each_workloads_engine_is_recognised_from_its_container(name: str, engine: str) -> None:
    taken = adopted(name)
    assert taken.spec.engine == engine
    assert taken.spec.workload is not None
    assert taken.spec.workload.image == engine_container(deployment(name), taken.spec.workload.container)["image"]


def test_a_policy_that_names_no_engine_takes_the_containers_and_is_validated_as_such() -> None:
    before = policy("sglang")
    assert before.spec.engine == "vllm"  # the default, until the container is read
    taken = adopted("sglang")
    assert taken.spec.engine == "sglang"
    assert "engine" in taken.spec.model_fields_set
    assert taken.spec.model_dump(exclude={"engine"}) == before.spec.model_dump(exclude={"engine"})  # nothing else


def test_a_routing_sidecar_is_no_engine() -> None:
    sidecar = engine_container(deployment("llm-d"), "routing-proxy")
    assert not any(e.recognises(sidecar) for e in ENGINES.values())
    # Without workloadRef.container, the one container that runs an engine is chosen.
    obj = policy_object("llm-d")
    del obj["spec"]["workloadRef"]["container"]
    assert adopt(parsed(obj), deployment("llm-d")).spec.workload.container == "vllm"  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("container", "engine"),
    [
        ({"image": "vllm/vllm-openai:v0.32.0", "args": ["--model", "m"]}, "vllm"),  # the image's entry point
        ({"image": "corp/llm:1", "command": ["python3", "-m", "vllm.entrypoints.openai.api_server"]}, "vllm"),
        ({"image": "corp/llm:1", "command": ["/usr/local/bin/vllm", "serve", "m"]}, "vllm"),
        ({"image": "corp/llm:1", "command": ["sh", "-c", 'exec vllm serve "$@"', "vllm"], "args": ["m"]}, "vllm"),
        ({"image": "corp/llm:1", "command": ["sglang", "serve", "m"]}, "sglang"),
        ({"image": "lmsysorg/sglang:v0.5.23", "command": ["python3", "-m", "sglang.launch_server"]}, "sglang"),
        ({"image": "lmsysorg/sglang:v0.5.23", "command": ["/app/start.sh"]}, None),  # a wrapper we cannot read
        ({"image": "vllm/vllm-openai:v0.32.0", "command": ["sglang", "serve"]}, "sglang"),  # the command wins
    ],
)
def test_the_engine_is_read_from_command_args_and_image(container: dict[str, Any], engine: str | None) -> None:
    assert [e.name for e in ENGINES.values() if e.recognises(container)] == ([engine] if engine else [])


def test_an_engine_named_in_the_spec_must_be_the_containers() -> None:
    error = refused("sglang", engine="vllm")
    assert [e.path for e in error.errors] == ["spec.engine"]
    assert "container 'sglang' runs SGLang" in str(error)


def test_an_engine_named_in_the_spec_reads_a_container_it_cannot_recognise_by_image() -> None:
    obj = with_container("production-stack", image="registry.corp/llm-serving:3")
    container = engine_container(obj, "vllm")
    container["args"] = container.pop("command")[2:]  # the image's own entry point runs vllm serve
    with pytest.raises(PolicyError) as caught:
        adopted("production-stack", obj)
    assert paths_of(caught) == ["spec.workloadRef"]
    obj_policy = policy_object("production-stack")
    obj_policy["spec"]["engine"] = "vllm"
    assert adopt(parsed(obj_policy), obj).spec.engine == "vllm"


# --- the offload flags, however spelt ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "spelt",
    [
        ["--kv-transfer-config", '{"kv_connector":"LMCacheConnectorV1","kv_role":"kv_both"}'],
        ['--kv_transfer_config={"kv_connector":"OffloadingConnector"}'],
        ["--kv-transfer-config.kv_connector=LMCacheConnectorV1"],
        ["--kv-offloading-size", "8", "--kv-offloading-backend", "native"],
        ["--kv-offloading-size=8"],
        ["--kv-offloading-s", "8"],  # an abbreviation argparse takes
        ["--kv_offloading_backend", "lmcache"],
    ],
)
def test_vllms_offload_flags_are_split_off_however_spelt(spelt: list[str]) -> None:
    own = ["m", "--enable-chunked-prefill", "--kv-cache-dtype", "fp8", "--kv-events-config", "{}", "-tp", "2"]
    kept, removed = VLLM.split_offload([*own[:3], *spelt, *own[3:]])
    assert kept == own
    assert removed == spelt


@pytest.mark.parametrize(
    "spelt",
    [
        ["--enable-hierarchical-cache", "--hicache-ratio", "2"],
        ["--enable-hicache", "--hicache-size=8"],
        ["--hicache_size", "8", "--hicache-storage-backend", "file"],
        ["--hicache-host-memory-mode", "cache", "--hicache-host-memory-fraction", "0.5"],
        ["--enable-lmcache"],  # SGLang refuses it beside HiCache
    ],
)
def test_sglangs_offload_flags_are_split_off_however_spelt(spelt: list[str]) -> None:
    own = ["--model-path", "m", "--hicache-write-policy", "write_back", "--page-size", "64"]
    kept, removed = SGLANG.split_offload([*own[:2], *spelt, *own[2:]])
    assert kept == own
    assert removed == spelt


def test_what_the_container_serves_is_read_as_the_engines_parser_reads_it() -> None:
    container = {"name": "vllm", "command": ["vllm", "serve"]}
    container["args"] = ["--model", "other", "Qwen/Qwen3-8B", "--max-model-len=32k", "-tp", "2", "--port", "8200"]
    served = VLLM.served(container)
    assert served.model == Setting("its positional argument", "Qwen/Qwen3-8B")  # vllm serve's positional wins
    assert served.max_model_len == Setting("--max-model-len", "32k", 32_000)
    assert served.tensor_parallel_size == Setting("-tp", "2", 2)
    assert served.port == 8200
    sglang = {"name": "s", "command": ["python3", "-m", "sglang.launch_server"]}
    sglang["args"] = ["--model", "Qwen/Qwen3-8B", "--tensor-parallel-size", "4", "--context-length", "8192"]
    served = SGLANG.served(sglang)
    assert served.model == Setting("--model", "Qwen/Qwen3-8B")
    assert served.tensor_parallel_size == Setting("--tensor-parallel-size", "4", 4)
    assert served.max_model_len == Setting("--context-length", "8192", 8192)
    assert served.port == 30000


def test_eager_is_read_from_the_adopted_containers_flags() -> None:
    taken = adopted("production-stack")
    assert not VLLM.eager(taken.spec)
    for flags, eager in ((["--enforce-eager"], True), (["--enforce-eager", "--no-enforce-eager"], False)):
        obj = with_container("production-stack", args=flags)
        assert VLLM.eager(adopted("production-stack", obj).spec) is eager
    obj = with_container("sglang", args=[*engine_args("sglang"), "--disable-cuda-graph"])
    assert SGLANG.eager(adopted("sglang", obj).spec)


def engine_args(name: str) -> list[str]:
    args: list[str] = engine_container(deployment(name), "sglang" if name == "sglang" else "vllm")["args"]
    return args


# --- the container's own flags against the spec ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("patch", "path", "says"),
    [
        (
            {"model": {"name": "meta-llama/Llama-3.1-8B"}},
            "spec.model.name",
            "serves 'meta-llama/Llama-3.1-8B-Instruct'",
        ),
        ({"model": {"maxModelLen": 8192}}, "spec.model.maxModelLen", "sets --max-model-len 16384"),
        ({"model": {"tensorParallelSize": 2}, "gpu": {"count": 2}}, "spec.model.tensorParallelSize", "runs no"),
        ({"model": {"kvCacheDtype": "fp8"}}, "spec.model.kvCacheDtype", "sets no KV cache dtype: auto"),
        ({"gpu": {"count": 2}, "model": {"tensorParallelSize": 2}}, "spec.gpu.count", "asks for 1 nvidia.com/gpu"),
        ({"gpu": {"class": "amd-mi300x"}}, "spec.gpu.class", "asks for nvidia.com/gpu"),
    ],
)
def test_a_spec_the_container_contradicts_is_refused_naming_both(patch: dict[str, Any], path: str, says: str) -> None:
    obj = policy_object("production-stack")
    for key, value in patch.items():
        obj["spec"][key] = {**obj["spec"][key], **value}
    with pytest.raises(PolicyError) as caught:
        adopt(parsed(obj), deployment("production-stack"))
    found = [e for e in caught.value.errors if e.path == path]
    assert found, caught.value.render()
    assert says in found[0].message


@pytest.mark.parametrize(
    ("container", "path", "says"),
    [
        ({"command": ["vllm", "serve", "--port", "8000"]}, "spec.model.name", "names no model"),
        ({"command": ["vllm", "serve", "m", "--max-model-len", "auto"]}, "spec.model.maxModelLen", "auto"),
        (
            {"args": ["--kv-transfer-config", '{"kv_connector":"NixlConnector","kv_role":"kv_both"}']},
            "spec.workloadRef",
            "kv_connector NixlConnector, which moves KV between engines",
        ),
        ({"args": ["--", "x"]}, "spec.workloadRef", "ends its options with '--'"),
        (
            {"command": ["sh", "-c", "vllm serve m --kv-offloading-size 8"], "args": None},
            "spec.workloadRef",
            "sets --kv-offloading-size in its shell script",
        ),
        (
            {"command": ["sh", "-c", "vllm serve m"], "args": None},
            "spec.workloadRef",
            'does not pass its args on ("$@")',
        ),
        ({"resources": {"requests": {"memory": "lots"}}}, "spec.workloadRef", "resources.requests.memory 'lots'"),
        ({"resources": {"limits": {"nvidia.com/gpu": "2"}}}, "spec.gpu.count", "asks for 2 nvidia.com/gpu"),
    ],
)
def test_a_container_that_cannot_be_taken_over_is_refused_by_path(
    container: dict[str, Any], path: str, says: str
) -> None:
    error = refused("production-stack", with_container("production-stack", **container))
    found = [e for e in error.errors if e.path == path]
    assert found, error.render()
    assert says in found[0].message


@pytest.mark.parametrize(
    ("change", "path"),
    [
        (lambda d: d["spec"]["template"]["spec"].update(containers=[]), "spec.workloadRef"),
        (lambda d: d["spec"].pop("template"), "spec.workloadRef"),
        (lambda d: engine_container(d, "vllm").pop("image"), "spec.workloadRef"),
        (lambda d: engine_container(d, "vllm").update(name="engine"), "spec.workloadRef.container"),
    ],
)
def test_a_deployment_without_the_named_container_is_refused_by_path(change: Any, path: str) -> None:
    obj = deployment("llm-d")
    change(obj)
    with pytest.raises(PolicyError) as caught:
        adopted("llm-d", obj)
    assert paths_of(caught) == [path]


def test_several_containers_none_named_and_none_an_engine_is_refused() -> None:
    obj = deployment("llm-d")
    engine_container(obj, "vllm")["command"] = ["/app/run"]
    pol = policy_object("llm-d")
    del pol["spec"]["workloadRef"]["container"]
    with pytest.raises(PolicyError) as caught:
        adopt(parsed(pol), obj)
    assert paths_of(caught) == ["spec.workloadRef.container"]
    assert "routing-proxy, vllm" in str(caught.value)


def test_the_sglang_containers_own_flags_are_checked_too() -> None:
    error = refused("sglang", model={"maxModelLen": 16384, "tensorParallelSize": 2}, gpu={"count": 2})
    assert {e.path for e in error.errors} == {
        "spec.model.maxModelLen",
        "spec.model.tensorParallelSize",
        "spec.gpu.count",
    }
    assert "--context-length 32768" in error.render()


# --- what the derived pods change, and the pod around them ---------------------------------------------------------


def warnings_of(taken: KVOffloadPolicy) -> list[str]:
    return workload_warnings(taken, size_policy(taken))


def test_the_warnings_name_the_flags_and_variables_each_level_replaces() -> None:
    warnings = warnings_of(adopted("production-stack"))
    assert warnings == [
        "container 'vllm' sets --kv-transfer-config, which every level replaces with its own offload flags",
        "container 'vllm' sets LMCACHE_LOG_LEVEL, LMCACHE_LOCAL_CPU, LMCACHE_MAX_LOCAL_CPU_SIZE, which every level "
        "replaces with its own offload variables",
    ]
    assert warnings_of(adopted("llm-d")) == []
    assert "--enable-hierarchical-cache, --hicache-ratio" in warnings_of(adopted("sglang"))[0]
    assert workload_warnings(policy("sglang"), Sized("sglang", ())) == []  # not read yet


def test_the_warnings_tell_what_the_pod_keeps_though_the_spec_would_differ() -> None:
    obj = with_container(
        "llm-d",
        args=["Qwen/Qwen3-8B", "--port", "8300"],
        startupProbe={"httpGet": {"path": "/health", "port": 8300}, "failureThreshold": 3},
    )
    pol = policy_object("llm-d")
    pol["spec"]["gpu"]["nodeSelector"] = {"pool": "gpu"}
    warnings = warnings_of(adopt(parsed(pol), obj))
    assert len(warnings) == 4, warnings
    assert "sets no context length" in warnings[0]
    assert "spec.gpu.nodeSelector and spec.gpu.tolerations are not applied" in warnings[1]
    assert "startupProbe allows 30 s" in warnings[2]
    assert "declares no containerPort 8300" in warnings[3]


def test_the_operators_volumes_may_not_clash_with_the_pods() -> None:
    obj = deployment("production-stack")
    container = engine_container(obj, "vllm")
    container["volumeMounts"].append({"name": "vllm-storage", "mountPath": "/mnt"})  # over the tier's /mnt/kv-nvme
    obj["spec"]["template"]["spec"]["volumes"].append({"name": "kv-nvme", "emptyDir": {}})
    errors = check_renderable(adopted("production-stack", obj))
    assert [e.path for e in errors] == ["spec.offload.secondaryTiers[0].name", "spec.offload.secondaryTiers[0].path"]
    assert "collides with volume 'vllm-storage', which container 'vllm' mounts at '/mnt'" in errors[1].message
    obj = deployment("production-stack")
    obj["spec"]["template"]["spec"]["volumes"][1] = {"name": "shm", "persistentVolumeClaim": {"claimName": "x"}}
    (error,) = check_renderable(adopted("production-stack", obj))
    assert error.path == "spec.workloadRef"
    assert "mounts volume 'shm' at /dev/shm, which is no memory emptyDir" in error.message


def test_a_policy_whose_deployment_was_not_read_does_not_render() -> None:
    taken = policy("llm-d")
    with pytest.raises(PolicyError) as caught:
        render_deployment(taken, build_ladder(taken.spec)[0], 1)
    assert paths_of(caught) == ["spec.workloadRef"]


# --- the admin's allow-lists over the referenced pod --------------------------------------------------------------


def test_a_code_loading_flag_of_the_container_is_the_admins_to_allow() -> None:
    obj = with_container("sglang", args=[*engine_args("sglang"), "--trust-remote-code"])
    taken = adopted("sglang", obj)
    (error,) = check_tenancy(taken, TENANCY)
    assert error.path == "spec.workloadRef"
    assert "Deployment sglang-qwen3: container 'sglang' sets --trust-remote-code, which loads code" in error.message
    assert check_tenancy(taken, Tenancy(host_path_roots=("/mnt",), code_options=("--trust-remote-code",))) == []
    # Its other flags (managed ones included, such as --port) are the team's own.
    assert check_tenancy(adopted("llm-d"), TENANCY) == []


def test_a_hostpath_volume_of_the_referenced_pod_is_judged_against_the_admins_roots() -> None:
    taken = adopted("sglang")
    assert check_tenancy(taken, TENANCY) == []
    (error,) = check_tenancy(taken, Tenancy(host_path_roots=("/nvme",)))
    assert error.path == "spec.workloadRef"
    assert "volume 'hf-cache' is a hostPath: /mnt/hf-cache is not under a node path" in error.message


def test_the_referenced_image_is_judged_against_the_image_allow_list() -> None:
    (error,) = check_tenancy(adopted("llm-d"), Tenancy(image_patterns=("docker.io/vllm/*",)))
    assert error.path == "spec.workloadRef"
    assert "ghcr.io/llm-d/llm-d is not among the images" in error.message


# --- the hash follows the template ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_the_config_hash_changes_when_the_templates_image_changes(name: str) -> None:
    taken = adopted(name)
    container = taken.spec.workload.container  # type: ignore[union-attr]
    obj = deployment(name)
    engine_container(obj, container)["image"] += "-patched"
    changed = adopted(name, obj)
    for level in build_ladder(taken.spec):
        assert config_hash(adopted(name), level) == config_hash(taken, level)  # read again: the same
        assert config_hash(changed, level) != config_hash(taken, level)
    assert render_input(changed) != render_input(taken)
    assert render_input(adopted(name)) == render_input(taken)


def test_any_change_to_the_template_changes_the_hash_and_the_render_input() -> None:
    taken = adopted("llm-d")
    obj = deployment("llm-d")
    obj["spec"]["template"]["metadata"]["labels"]["team"] = "search"
    changed = adopted("llm-d", obj)
    level = find_level(build_ladder(taken.spec), name="cpu")
    assert config_hash(changed, level) != config_hash(taken, level)
    assert render_input(changed) != render_input(taken)
    # The Deployment's replicas are not the pod's: they change neither.
    obj = deployment("llm-d")
    obj["spec"]["replicas"] = 9
    assert config_hash(adopted("llm-d", obj), level) == config_hash(taken, level)


def test_adopting_never_changes_the_deployment_it_was_given() -> None:
    obj = deployment("production-stack")
    before = copy.deepcopy(obj)
    taken = adopted("production-stack", obj)
    for level in build_ladder(taken.spec):
        render_deployment(taken, level, 1)
    assert obj == before


def test_every_workload_fixture_parses_as_the_policy_it_is() -> None:
    for name in NAMES:
        pol: KVOffloadPolicy = policy(name)
        assert pol.spec.workload_ref is not None
        assert pol.spec.model.image is None
