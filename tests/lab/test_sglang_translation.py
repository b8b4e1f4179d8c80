"""An SGLang pod in the lab: its ``python3 -m sglang.launch_server`` command line becomes the emulator's options
(lab/cluster/sglangargs.py), level by level, and a rendered SGLang Deployment runs in the local cluster."""

from __future__ import annotations

import asyncio
import json
from decimal import Decimal
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from kvoffload.api.quantity import GIB
from kvoffload.api.types import KVOffloadPolicy
from kvoffload.controller.kubestate import parse_pod
from kvoffload.engines.sglang.command import option_table
from kvoffload.policy.ladder import build_ladder
from kvoffload.policy.render import render_deployment
from kvoffload_lab.cluster import sglangargs
from kvoffload_lab.cluster.localcluster import LocalCluster
from kvoffload_lab.cluster.podengine import ANNOTATION_PORT, LocalClusterError
from kvoffload_lab.cluster.speakers import emulate_options
from kvoffload_lab.engine.config import SPEAK_SGLANG
from kvoffload_lab.engine.flags import parse_argv
from tests.policy.render_policies import sglang_policies, sglang_policy
from tests.support.cluster import ENGINE_GPU_KV_BLOCKS, eventually

LAUNCH = ["python3", "-m", "sglang.launch_server"]
MODEL = ["--model-path", "Qwen/Qwen3-8B"]


def container(policy: KVOffloadPolicy, index: int) -> dict[str, Any]:
    level = build_ladder(policy.spec)[index]
    first: dict[str, Any] = render_deployment(policy, level, 1)["spec"]["template"]["spec"]["containers"][0]
    return first


def option(args: list[str], flag: str) -> str | None:
    return args[args.index(flag) + 1] if flag in args else None


CASES = [
    pytest.param(name, policy, level, id=f"{name}/{level.index}-{level.name}")
    for name, policy in sglang_policies().items()
    for level in build_ladder(policy.spec)
]


@pytest.mark.parametrize(("name", "policy", "level"), CASES)
def test_every_level_of_a_rendered_sglang_policy_becomes_the_emulators_options(
    name: str, policy: KVOffloadPolicy, level: Any
) -> None:
    spec = policy.spec
    rendered = render_deployment(policy, level, 1)["spec"]["template"]["spec"]["containers"][0]
    assert rendered["command"] == LAUNCH
    args = emulate_options(rendered)[1]
    config, _, ignored = parse_argv(args)
    assert ignored == []
    assert config.speak == SPEAK_SGLANG
    assert config.enable_metrics  # the rendered command line has --enable-metrics
    assert config.model == spec.model.name
    assert config.name == (spec.model.served_model_name or policy.metadata.name)
    assert config.max_model_len == spec.model.max_model_len
    assert config.tensor_parallel_size == spec.model.tensor_parallel_size
    assert config.kv_cache_dtype == spec.model.kv_cache_dtype.value
    assert config.gpu_memory_utilization == spec.gpu.memory_utilization
    if level.cpu_bytes is None:
        assert config.cpu_bytes is None
        assert config.offload_backend is None
        assert "--kv-offloading-size" not in args
        return
    # --hicache-size G per TP rank, decimal gigabytes: the engine's CPU tier is G * 10^9 * tp bytes exactly.
    gigabytes = int(rendered["args"][rendered["args"].index("--hicache-size") + 1])
    assert level.cpu_bytes == gigabytes * 10**9 * spec.model.tensor_parallel_size
    assert config.cpu_bytes == level.cpu_bytes
    assert config.offload_backend == "native"
    assert Decimal(option(args, "--kv-offloading-size") or "0") * GIB == level.cpu_bytes
    assert config.eviction_policy == "lru"
    if not level.secondary_tiers:
        assert config.secondary_tiers == ()
        assert "--kv-transfer-config" not in args
        return
    (tier,) = level.secondary_tiers
    (fs,) = config.secondary_tiers
    assert fs.type == "fs"
    transfer = json.loads(option(args, "--kv-transfer-config") or "{}")
    assert transfer["kv_connector"] == "OffloadingConnector"
    extra = transfer["kv_connector_extra_config"]
    assert extra["spec_name"] == "TieringOffloadingSpec"
    assert extra["cpu_bytes_to_use"] == level.cpu_bytes
    assert extra["secondary_tiers"] == [{"type": "fs", "root_dir": tier.path}]


def test_the_ladder_of_a_file_tier_policy_grows_tier_by_tier() -> None:
    policy = sglang_policies()["pilot-and-file-tier"]
    sizes = []
    for index in range(len(build_ladder(policy.spec))):
        config, _, _ = parse_argv(emulate_options(container(policy, index))[1])
        sizes.append((config.cpu_bytes, len(config.secondary_tiers)))
    assert sizes == [(None, 0), (8 * 10**9, 0), (64 * 10**9, 0), (64 * 10**9, 1)]


def test_tensor_parallel_ranks_multiply_the_per_rank_pool_and_fp8_keeps_its_spelling() -> None:
    args = sglangargs.emulate_args(
        [*MODEL, "--tensor-parallel-size", "2", "--kv-cache-dtype", "bf16", "--enable-hicache", "--hicache-size=3"]
    )
    assert option(args, "--tensor-parallel-size") == "2"
    assert option(args, "--kv-cache-dtype") == "bfloat16"
    assert option(args, "--kv-offloading-size") == "5.58793544769287109375"  # 3 GB on each of 2 ranks, in GiB
    assert Decimal("5.58793544769287109375") * GIB == 6 * 10**9


def test_sglangs_own_defaults_and_number_forms_are_kept() -> None:
    args = sglangargs.emulate_args([*MODEL, "--context-length", "32k"])
    assert (option(args, "--host"), option(args, "--port")) == ("127.0.0.1", "30000")
    assert option(args, "--max-model-len") == "32000"
    assert option(args, "--served-model-name") is None  # SGLang serves it as the model path, as the emulator does
    assert option(sglangargs.emulate_args([*MODEL, "--context-length", "32Ki"]), "--max-model-len") == "32768"
    assert "--enable-metrics" not in args
    config, _, _ = parse_argv(args)
    assert not config.enable_metrics


def test_the_file_backends_directory_defaults_to_sglangs() -> None:
    args = sglangargs.emulate_args(
        [*MODEL, "--enable-hierarchical-cache", "--hicache-size", "4", "--hicache-storage-backend", "file"]
    )
    transfer = json.loads(option(args, "--kv-transfer-config") or "{}")
    assert transfer["kv_connector_extra_config"]["secondary_tiers"] == [{"type": "fs", "root_dir": "/tmp/hicache"}]


def test_ignored_flags_are_accepted_and_the_batch_flags_translated() -> None:
    args = sglangargs.emulate_args(
        [
            *MODEL,
            "--page-size",
            "64",
            "--hicache-write-policy",
            "write_back",
            "--trust-remote-code",
            "--max-running-requests",
            "8",
            "--chunked-prefill-size",
            "4096",
        ]
    )
    assert "--page-size" not in args
    assert (option(args, "--max-num-seqs"), option(args, "--max-num-batched-tokens")) == ("8", "4096")


@pytest.mark.parametrize(
    ("extra", "env", "flag"),
    [
        (["--disable-radix-cache"], [], "--disable-radix-cache"),
        (["--hicache-ratio", "2"], [], "--hicache-ratio"),
        (["--enable-hierarchical-cache"], [], "--hicache-size"),
        (["--enable-hierarchical-cache", "--hicache-size", "0"], [], "--hicache-size"),
        (["--enable-hierarchical-cache", "--hicache-size", "1.5"], [], "--hicache-size"),
        (["--enable-hierarchical-cache", "--hicache-size", "4", "--hicache-storage-backend", "mooncake"], [], ""),
        (["--hicache-storage-backend", "file"], [], "--hicache-storage-backend"),
        (["--kv-cache-dtype", "nvfp4"], [], "--kv-cache-dtype"),
        (["--context-length", "1.5Ki"], [], "--context-length"),
        (["--tp-size", "0"], [], "--tp-size"),
        (["--model-pat", "x"], [], "--model-pat"),  # SGLang would take the abbreviation; the emulator names it
        (
            ["--enable-hierarchical-cache", "--hicache-size", "4", "--hicache-storage-backend", "file"],
            [{"name": "SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR", "valueFrom": {"configMapKeyRef": {"name": "x"}}}],
            "SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR",
        ),
    ],
)
def test_what_cannot_be_translated_is_refused_naming_the_flag(
    extra: list[str], env: list[dict[str, Any]], flag: str
) -> None:
    pod = {"command": LAUNCH, "args": [*MODEL, *extra], "env": env}
    with pytest.raises(LocalClusterError, match=f"SGLang engine in the lab: {flag or '--hicache-storage-backend'}"):
        emulate_options(pod)


def test_a_missing_model_path_is_refused() -> None:
    with pytest.raises(LocalClusterError, match="--model-path"):
        emulate_options({"command": LAUNCH, "args": ["--port", "8000"]})


def test_the_translated_and_ignored_flags_are_sglangs_own() -> None:
    """Every flag the translation reads is an option of SGLang 0.5.23's parser, with the arity it assumes."""
    table = option_table()
    for flag in (*sglangargs.VALUED, *sglangargs.IGNORED, *sglangargs.ALIASES):
        assert flag in table.options, flag
    for alias, name in sglangargs.ALIASES.items():
        assert table.options[alias][0] == table.options[name][0], alias
    for flag in sglangargs.VALUED | (set(sglangargs.IGNORED) - sglangargs.IGNORED_SWITCHES):
        assert table.options[flag][1] == 1, flag
    for flag in sglangargs.SWITCHES | sglangargs.IGNORED_SWITCHES:
        assert table.options[flag][1] == 0, flag


def test_a_vllm_container_is_untouched() -> None:
    assert emulate_options({"command": ["vllm", "serve"], "args": ["m", "--port", "1"]})[1] == ["m", "--port", "1"]
    assert not sglangargs.is_sglang(["python3", "-m", "vllm.entrypoints.openai.api_server"])
    assert sglangargs.is_sglang(["/usr/bin/python3", "-m", "sglang.launch_server"])


# --- the running cluster ------------------------------------------------------------------


@pytest.fixture
def cluster_engine_args() -> list[str]:
    """Small GPU caches as every lab engine has, and no pinning delay for the 32 GB pool (12 s on the laptop)."""
    return ["--gpu-kv-blocks", str(ENGINE_GPU_KV_BLOCKS), "--pinning-time-scale", "0"]


@pytest.mark.e2e
async def test_a_rendered_sglang_deployment_runs_in_the_lab_and_speaks_sglang(local_cluster: LocalCluster) -> None:
    policy = sglang_policy()
    level = build_ladder(policy.spec)[1]  # cpu: HiCache with a 32 GB pool
    deployment = render_deployment(policy, level, 1)
    namespace = deployment["metadata"]["namespace"]
    await local_cluster.apply(deployment)
    name = deployment["metadata"]["name"]

    def ready_pod() -> dict[str, Any] | None:
        for engine in local_cluster.pods(namespace=namespace):
            pod = local_cluster.get("v1", "Pod", namespace, engine.pod)
            if pod is not None and engine.deployment == name and parse_pod(pod).ready:
                return pod
        return None

    pod = await eventually(ready_pod, "a ready SGLang pod")
    assert pod["status"]["containerStatuses"][0]["name"] == "sglang"
    url = f"http://127.0.0.1:{pod['metadata']['annotations'][ANNOTATION_PORT]}"
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{url}/v1/completions", json={"prompt": "a b c d", "max_tokens": 2}) as response:
            assert response.status == 200
        async with session.get(f"{url}/metrics") as response:
            text = await response.text()
    names = {f.name for f in text_string_to_metric_families(text)}
    assert "sglang:time_to_first_token_seconds" in names
    assert "sglang:hicache_host_total_tokens" in names
    assert all(n.startswith("sglang:") for n in names)
    series = await asyncio.to_thread(
        local_cluster.prometheus.wait_for_series, 'sglang:num_requests_total{kvoffload_io_policy="chat"}', 30.0, 1
    )
    assert series
