"""SGLang engines (``spec.engine: sglang``): the command line, the host memory and what SGLang cannot run.

SGLang 0.5.23's own parser checks every rendered command line in tests/sglang.
"""

from __future__ import annotations

from typing import Any

import pytest

from kvoffload.api.errors import PolicyError
from kvoffload.api.quantity import GIB, quantity_bytes
from kvoffload.api.types import KVOffloadPolicy
from kvoffload.controller.judging import judge_resolved
from kvoffload.policy.engine_config import engine_env
from kvoffload.policy.hostmemory import SHM_EXTRA_BYTES, host_memory, pinned_pool_bytes
from kvoffload.policy.ladder import Level, build_ladder, find_level
from kvoffload.policy.render import render_deployment
from kvoffload.policy.renderable import check_renderable
from tests.policy.render_policies import make_policy, sglang_policies, sglang_policy


def container(policy: KVOffloadPolicy, level: Level) -> dict[str, Any]:
    pod = render_deployment(policy, level, 1)["spec"]["template"]
    (engine,) = pod["spec"]["containers"]
    return engine  # type: ignore[no-any-return]


def value_after(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


def test_the_gpu_only_level_launches_sglang_on_the_operators_port_without_hicache() -> None:
    policy = sglang_policy()
    engine = container(policy, find_level(build_ladder(policy.spec), name="gpu-only"))
    assert engine["name"] == "sglang"
    assert engine["command"] == ["python3", "-m", "sglang.launch_server"]
    args = engine["args"]
    assert value_after(args, "--model-path") == "Qwen/Qwen3-8B"
    # SGLang binds 127.0.0.1:30000 by default: the probes and the Service need all interfaces and port 8000.
    assert (value_after(args, "--host"), value_after(args, "--port")) == ("0.0.0.0", "8000")
    assert value_after(args, "--context-length") == "16384"
    assert "--enable-metrics" in args
    assert not [a for a in args if a.startswith("--hicache") or a == "--enable-hierarchical-cache"]
    assert engine["ports"][0]["containerPort"] == 8000


@pytest.mark.parametrize(("ranks", "cpu", "per_rank"), [(1, "32G", "32"), (2, "64G", "32"), (4, "1T", "250")])
def test_the_cpu_tier_is_hicache_size_in_whole_gigabytes_per_rank(ranks: int, cpu: str, per_rank: str) -> None:
    policy = sglang_policy(
        model={"tensorParallelSize": ranks}, gpu={"count": ranks}, offload={"cpu": cpu}, replicas=ranks + 2
    )
    args = container(policy, find_level(build_ladder(policy.spec), name="cpu"))["args"]
    assert "--enable-hierarchical-cache" in args
    assert value_after(args, "--hicache-size") == per_rank
    # SGLang reads it as host_size * 1e9 bytes per rank: the ranks together hold exactly offload.cpu.
    assert int(per_rank) * 10**9 * ranks == quantity_bytes(cpu)
    assert "--hicache-storage-backend" not in args


def test_the_file_tier_is_sglangs_file_backend_on_the_tiers_volume() -> None:
    policy = sglang_policies()["pilot-and-file-tier"]
    ladder = build_ladder(policy.spec)
    assert [lv.name for lv in ladder] == ["gpu-only", "cpu-pilot", "cpu", "nvme"]
    pilot = container(policy, find_level(ladder, name="cpu-pilot"))
    assert value_after(pilot["args"], "--hicache-size") == "8"
    nvme_level = find_level(ladder, name="nvme")
    nvme = container(policy, nvme_level)
    assert value_after(nvme["args"], "--hicache-storage-backend") == "file"
    assert {"name": "SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR", "value": "/mnt/kv-nvme"} in nvme["env"]
    assert {"name": "kv-nvme", "mountPath": "/mnt/kv-nvme"} in nvme["volumeMounts"]
    assert engine_env(policy.spec, find_level(ladder, name="cpu")) == []


def test_the_pool_is_in_the_memory_request_but_not_in_dev_shm() -> None:
    # SGLang pins anonymous host memory (cudaHostRegister), where vLLM keeps its pool in a /dev/shm file.
    sglang = sglang_policy()
    vllm = make_policy(offload={"cpu": "32G"})
    for policy, shm_holds_pool in ((sglang, False), (vllm, True)):
        level = find_level(build_ladder(policy.spec), name="cpu")
        memory = host_memory(policy.spec, level)
        assert memory.pinned == pinned_pool_bytes(policy.spec, level) > 32 * 10**9
        assert memory.shm == (memory.pinned + SHM_EXTRA_BYTES if shm_holds_pool else 0)
    # SGLang allocates its pool only while 10 GiB more stay free in its cgroup: the request holds them.
    level = find_level(build_ladder(sglang.spec), name="cpu")
    same_pool = make_policy(offload={"cpu": "32G"})
    assert host_memory(sglang.spec, level).request - host_memory(same_pool.spec, level).request == 10 * GIB
    gpu_only = find_level(build_ladder(sglang.spec), name="gpu-only")
    assert host_memory(sglang.spec, gpu_only).request == host_memory(same_pool.spec, gpu_only).request
    pod = render_deployment(sglang, find_level(build_ladder(sglang.spec), name="cpu"), 1)["spec"]["template"]
    (dshm,) = [v for v in pod["spec"]["volumes"] if v["name"] == "dshm"]
    assert quantity_bytes(dshm["emptyDir"]["sizeLimit"]) == SHM_EXTRA_BYTES == GIB


def test_an_sglang_image_tag_is_not_read_as_a_vllm_version() -> None:
    # 0.5 would be a vLLM from before 0.27, which pins per layer: SGLang's pool is the tier, no rounding.
    policy = sglang_policy(model={"image": "lmsysorg/sglang:v0.5.23"})
    level = find_level(build_ladder(policy.spec), name="cpu")
    assert host_memory(policy.spec, level).pinned < 2 * 32 * 10**9


@pytest.mark.parametrize(
    ("patch", "path", "words"),
    [
        ({"offload": {"backend": "lmcache"}}, "spec.offload.backend", "vLLM connector"),
        ({"offload": {"evictionPolicy": "arc"}}, "spec.offload.evictionPolicy", "LRU"),
        ({"offload": {"blockSize": 64}}, "spec.offload.blockSize", "vLLM"),
        ({"offload": {"storeThreshold": 2}}, "spec.offload.storeThreshold", "vLLM"),
        ({"offload": {"cpu": "32Gi"}}, "spec.offload.cpu", "whole gigabytes"),
        ({"rollout": {"pilotCpu": "1.5G"}}, "spec.rollout.pilotCpu", "whole gigabytes"),
        ({"model": {"kvCacheDtype": "fp8"}}, "spec.model.kvCacheDtype", "fp8_e4m3"),
        ({"model": {"vllmVersion": "0.32.0"}}, "spec.model.vllmVersion", "vllm only"),
        (
            {"model": {"env": [{"name": "SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR", "value": "/tmp"}]}},
            "spec.model.env[0].name",
            "managed",
        ),
    ],
)
def test_what_sglang_cannot_run_is_refused_naming_the_field(patch: dict[str, Any], path: str, words: str) -> None:
    errors = check_renderable(sglang_policy(**patch))
    assert [e.path for e in errors] == [path]
    assert words in errors[0].message


def test_two_tiers_are_refused_sglang_has_one_storage_backend() -> None:
    tiers = [{"name": "a", "size": "1Ti", "path": "/mnt/a"}, {"name": "b", "size": "1Ti", "path": "/mnt/b"}]
    errors = check_renderable(sglang_policy(offload={"secondaryTiers": tiers}))
    assert [e.path for e in errors] == ["spec.offload.secondaryTiers"]


def test_a_tp_size_must_divide_the_tier_into_whole_gigabytes() -> None:
    policy = sglang_policy(model={"tensorParallelSize": 2}, gpu={"count": 2}, offload={"cpu": "33G"})
    (error,) = check_renderable(policy)
    assert error.path == "spec.offload.cpu"
    assert "multiple of 2G" in error.message


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--hicache-size", "64"], "--hicache-size, which the operator manages"),
        (["--hicache-si", "64"], "is read as --hicache-size"),  # argparse takes a unique prefix
        (["--enable-hicache"], "which the operator manages"),  # SGLang's alias of --enable-hierarchical-cache
        (["--tp", "2"], "manages"),
        (["--enforce-eager"], "SGLang 0.5.23 has no option --enforce-eager"),  # a vLLM flag
        (["--mem-fraction-static=0.9"], "manages"),
        (["--enable-lmcache"], "pinned memory the request does not hold"),
        (["stray"], "positional"),
    ],
)
def test_extra_args_are_judged_by_sglangs_own_option_table(args: list[str], words: str) -> None:
    with pytest.raises(PolicyError) as raised:
        sglang_policy(model={"extraArgs": args})
    (error,) = raised.value.errors
    assert error.path.startswith("spec.model.extraArgs[")
    assert words in error.message


def test_sglang_flags_vllm_lacks_are_taken() -> None:
    assert check_renderable(sglang_policies()["extra-args"]) == []


def test_the_operator_judges_an_sglang_policy_on_sglangs_series() -> None:
    policy = sglang_policies()["pilot-and-file-tier"]
    dialect, sized = judge_resolved(policy)
    assert dialect.ttft == "sglang:time_to_first_token_seconds"
    assert len(set(sized.level_hashes.values())) == len(build_ladder(policy.spec)) == 4
