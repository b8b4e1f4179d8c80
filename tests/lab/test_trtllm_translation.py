"""A TensorRT-LLM pod in the lab: its ``trtllm-serve`` command line and the ``--extra_llm_api_options`` file its
ConfigMap mounts become the emulator's options (lab/cluster/trtllmargs.py), level by level, chosen through the
speaker registry (lab/cluster/speakers.py); and a rendered TensorRT-LLM Deployment runs in the local cluster,
Prometheus scraping it at ``/prometheus/metrics``."""

from __future__ import annotations

import asyncio
from decimal import Decimal
from typing import Any

import aiohttp
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from kvoffload.api.quantity import GIB
from kvoffload.api.types import KVOffloadPolicy
from kvoffload.controller.kubestate import parse_pod
from kvoffload.engines import ENGINES
from kvoffload.engines.trtllm.command import CONFIG_PATH
from kvoffload.engines.trtllm.options import option_table
from kvoffload.policy.ladder import Level, build_ladder
from kvoffload.policy.render import render_config_map, render_deployment
from kvoffload_lab.cluster import trtllmargs
from kvoffload_lab.cluster.localcluster import LocalCluster
from kvoffload_lab.cluster.podengine import ANNOTATION_PORT, LocalClusterError
from kvoffload_lab.cluster.speakers import (
    LABEL_NAME,
    SPEAKERS,
    config_map_mounts,
    emulate_options,
    mounted_files,
    speaker_for,
)
from kvoffload_lab.demo import TRTLLM_IMAGE
from kvoffload_lab.engine.config import SPEAK_TRTLLM
from kvoffload_lab.engine.flags import parse_argv
from tests.policy.render_policies import make_policy, merge
from tests.support.cluster import ENGINE_GPU_KV_BLOCKS, eventually

MODEL = ["Qwen/Qwen3-8B"]
LAUNCH = ["trtllm-serve"]


def trtllm_policy(**spec_patch: Any) -> KVOffloadPolicy:
    """A Qwen3-8B policy on TensorRT-LLM with a 32 GiB host cache, ``spec_patch`` merged into its spec."""
    base = {"engine": "trtllm", "model": {"image": TRTLLM_IMAGE}, "offload": {"cpu": "32Gi"}}
    return make_policy(**merge(base, spec_patch))


POLICIES = {
    "cpu": trtllm_policy(),
    "fp8-tp2-pilot": trtllm_policy(
        model={"tensorParallelSize": 2, "kvCacheDtype": "fp8", "servedModelName": "chat-fp8"},
        gpu={"count": 2, "memoryUtilization": 0.85},
        offload={"cpu": "64Gi"},
        rollout={"pilotCpu": "8Gi"},
    ),
    "odd-bytes-tp3": trtllm_policy(model={"tensorParallelSize": 3}, gpu={"count": 3}, offload={"cpu": "1000001Ki"}),
}
CASES = [
    pytest.param(name, policy, level, id=f"{name}/{level.index}-{level.name}")
    for name, policy in POLICIES.items()
    for level in build_ladder(policy.spec)
]


def pod_of(policy: KVOffloadPolicy, level: Level) -> tuple[dict[str, Any], dict[str, str]]:
    """The rendered pod template of ``level`` and the files its ConfigMap volume puts into the container."""
    template: dict[str, Any] = render_deployment(policy, level, 1)["spec"]["template"]
    config_map = render_config_map(policy, level)
    assert config_map is not None
    mounts = config_map_mounts(template["spec"], template["spec"]["containers"][0])
    return template, mounted_files(mounts, {config_map["metadata"]["name"]: config_map})


def option(args: list[str], flag: str) -> str | None:
    return args[args.index(flag) + 1] if flag in args else None


@pytest.mark.parametrize(("name", "policy", "level"), CASES)
def test_every_level_of_a_rendered_trtllm_policy_becomes_the_emulators_options(
    name: str, policy: KVOffloadPolicy, level: Level
) -> None:
    spec = policy.spec
    template, files = pod_of(policy, level)
    container = template["spec"]["containers"][0]
    assert container["command"] == LAUNCH
    assert list(files) == [CONFIG_PATH]
    speaker, args = emulate_options(container, template["metadata"]["labels"], files)
    assert speaker is SPEAKERS["trtllm"]
    config, _, ignored = parse_argv(args)
    assert ignored == []
    assert config.speak == SPEAK_TRTLLM
    assert config.enable_metrics  # the rendered file has return_perf_metrics: true
    assert config.model == spec.model.name
    assert config.name == (spec.model.served_model_name or policy.metadata.name)
    assert config.max_model_len == spec.model.max_model_len
    assert config.tensor_parallel_size == spec.model.tensor_parallel_size
    assert config.kv_cache_dtype == spec.model.kv_cache_dtype.value
    assert config.gpu_memory_utilization == spec.gpu.memory_utilization
    assert (config.max_num_seqs, config.max_num_batched_tokens) == (2048, 8192)  # TorchLlmArgs' defaults
    kv = yaml.safe_load(files[CONFIG_PATH])["kv_cache_config"]
    if level.cpu_bytes is None:
        assert "host_cache_size" not in kv
        assert config.cpu_bytes is None
        assert config.offload_backend is None
        return
    # host_cache_size is each rank's share, and every rank pins it: the engine's tier is tp times it, the level's
    # bytes less under tp bytes.
    ranks = spec.model.tensor_parallel_size
    assert config.cpu_bytes == kv["host_cache_size"] * ranks
    assert config.cpu_bytes is not None
    assert 0 <= level.cpu_bytes - config.cpu_bytes < ranks
    assert Decimal(option(args, "--kv-offloading-size") or "0") * GIB == config.cpu_bytes
    assert config.offload_backend == "native"
    assert config.secondary_tiers == ()


def test_the_pod_label_chooses_the_speaker_and_a_container_without_it_is_recognised() -> None:
    template, _files = pod_of(POLICIES["cpu"], build_ladder(POLICIES["cpu"].spec)[1])
    container = template["spec"]["containers"][0]
    assert template["metadata"]["labels"][LABEL_NAME] == "trtllm"
    assert speaker_for(container, template["metadata"]["labels"]).name == "trtllm"
    assert speaker_for(container).name == "trtllm"  # ENGINES' trtllm recognises trtllm-serve
    assert speaker_for({"args": ["--model", "m"]}).name == "vllm"  # the vLLM image's entrypoint
    assert set(SPEAKERS) == set(ENGINES)  # every engine of the seam runs in the lab
    for name, speaker in SPEAKERS.items():
        assert speaker.metrics_path == ENGINES[name].metrics_path, name
    assert SPEAKERS["trtllm"].metrics_path == "/prometheus/metrics"


def config(text: str) -> dict[str, str]:
    return {CONFIG_PATH: text}


GOOD_FILE = "kv_cache_config:\n  host_cache_size: 1000\nreturn_perf_metrics: true\nenable_iter_perf_stats: true\n"


def test_explicit_flags_win_over_the_file_and_the_file_fills_in() -> None:
    text = (
        "kv_cache_config:\n  free_gpu_memory_fraction: 0.5\nmax_batch_size: 8\nmax_num_tokens: 4096\n"
        "return_perf_metrics: false\n"
    )
    args = trtllmargs.emulate_args(
        [*MODEL, "--extra_llm_api_options", CONFIG_PATH, "--max_batch_size=16", "--log_level", "debug"], config(text)
    )
    assert option(args, "--gpu-memory-utilization") == "0.5"
    assert (option(args, "--max-num-seqs"), option(args, "--max-num-batched-tokens")) == ("16", "4096")
    assert "--enable-metrics" not in args  # no /prometheus/metrics without return_perf_metrics
    assert (option(args, "--host"), option(args, "--port")) == ("localhost", "8000")  # trtllm-serve's defaults
    flagged = trtllmargs.emulate_args(
        ["serve", *MODEL, "--config", CONFIG_PATH, "--free_gpu_memory_fraction", "0.7"], config(text)
    )
    assert option(flagged, "--gpu-memory-utilization") == "0.7"
    assert option(trtllmargs.emulate_args([*MODEL, "--config", CONFIG_PATH], config(GOOD_FILE)), "--model") == MODEL[0]


@pytest.mark.parametrize(
    ("extra", "text", "named"),
    [
        (["--tp-size", "2"], GOOD_FILE, "--tp-size: trtllm-serve has no such option"),  # click folds no '-'
        (["--pp_size", "2"], GOOD_FILE, "--pp_size: a trtllm-serve option the emulator does not translate"),
        (["--kv_cache_dtype", "nvfp4"], GOOD_FILE, "--kv_cache_dtype: nvfp4"),
        (["--backend", "_autodeploy"], GOOD_FILE, "--backend: _autodeploy"),
        (["--trust_remote_code=yes"], GOOD_FILE, "--trust_remote_code: a flag"),
        (["second-model"], GOOD_FILE, "MODEL: trtllm-serve takes one positional argument"),
        ([], "kv_cache_config:\n  host_cache_sise: 1\n", "kv_cache_config.host_cache_sise: unknown key"),
        ([], "kv_cache_config:\n  host_cache_size: '1'\n", "kv_cache_config.host_cache_size: expected"),
        ([], "kv_cache_config:\n  enable_block_reuse: false\n", "kv_cache_config.enable_block_reuse"),
        ([], "kv_cache_config:\n  secondary_offload_min_priority: 40\n", "kv_cache_config.secondary_offload_min"),
        ([], "kv_cache_config:\n  tokens_per_block: 64\n", "kv_cache_config.tokens_per_block"),
        ([], "return_perf_metrics: true\n", "enable_iter_perf_stats: must be true"),
        ([], "max_beam_width: 2\n", "max_beam_width: a key of the extra options file"),
        ([], ": not yaml: [", "is not YAML"),
    ],
)
def test_what_cannot_be_translated_is_refused_naming_the_flag_or_key(extra: list[str], text: str, named: str) -> None:
    container = {"command": LAUNCH, "args": [*MODEL, "--extra_llm_api_options", CONFIG_PATH, *extra]}
    with pytest.raises(LocalClusterError, match=f"TensorRT-LLM engine in the lab: .*{named}"):
        emulate_options(container, {LABEL_NAME: "trtllm"}, config(text))


def test_a_config_file_that_is_not_mounted_is_refused_naming_the_flag() -> None:
    container = {"command": LAUNCH, "args": [*MODEL, "--extra_llm_api_options", "/etc/other/x.yaml"]}
    with pytest.raises(LocalClusterError, match=r"--extra_llm_api_options: /etc/other/x\.yaml is not a file"):
        emulate_options(container, {LABEL_NAME: "trtllm"}, config(GOOD_FILE))


def test_the_translated_and_ignored_options_are_trtllm_serves_own() -> None:
    dests = {dest for dest, _ in option_table().options.values()}
    assert dests >= trtllmargs.TRANSLATED
    assert set(trtllmargs.IGNORED) <= dests


def test_config_map_volumes_mount_their_keys_or_items_and_a_missing_one_is_refused() -> None:
    spec = {
        "volumes": [
            {"name": "a", "configMap": {"name": "cm-a"}},
            {"name": "b", "configMap": {"name": "cm-b", "items": [{"key": "k", "path": "sub/f.yaml"}]}},
            {"name": "c", "configMap": {"name": "cm-c", "optional": True}},
            {"name": "d", "emptyDir": {}},
        ]
    }
    container = {"volumeMounts": [{"name": n, "mountPath": f"/m/{n}"} for n in "abcd"]}
    mounts = config_map_mounts(spec, container)
    assert [path for path, _ in mounts] == ["/m/a", "/m/b", "/m/c"]
    maps = {"cm-a": {"data": {"x": "1", "y": "2"}}, "cm-b": {"data": {"k": "3", "z": "4"}}, "cm-c": None}
    assert mounted_files(mounts, maps) == {"/m/a/x": "1", "/m/a/y": "2", "/m/b/sub/f.yaml": "3"}
    with pytest.raises(LocalClusterError, match="configMap cm-a: not found"):
        mounted_files(mounts, {**maps, "cm-a": None})
    with pytest.raises(LocalClusterError, match="subPath"):
        config_map_mounts(spec, {"volumeMounts": [{"name": "a", "mountPath": "/m/a/x", "subPath": "x"}]})


# --- the running cluster ------------------------------------------------------------------


@pytest.fixture
def cluster_engine_args() -> list[str]:
    """Small GPU caches as every lab engine has, and no pinning delay for the 32 GiB host cache."""
    return ["--gpu-kv-blocks", str(ENGINE_GPU_KV_BLOCKS), "--pinning-time-scale", "0"]


@pytest.mark.e2e
async def test_a_rendered_trtllm_deployment_runs_in_the_lab_and_is_scraped_at_its_path(
    local_cluster: LocalCluster,
) -> None:
    policy = trtllm_policy()
    level = build_ladder(policy.spec)[1]  # cpu: a 32 GiB host cache
    deployment = render_deployment(policy, level, 1)
    config_map = render_config_map(policy, level)
    assert config_map is not None
    namespace, name = deployment["metadata"]["namespace"], deployment["metadata"]["name"]
    await local_cluster.apply(deployment)  # before its ConfigMap: no pod starts until the ConfigMap is there

    def ready_pod() -> dict[str, Any] | None:
        for engine in local_cluster.pods(namespace=namespace):
            pod = local_cluster.get("v1", "Pod", namespace, engine.pod)
            if pod is not None and engine.deployment == name and parse_pod(pod).ready:
                return pod
        return None

    await asyncio.sleep(1.0)  # several kubelet passes (0.2 s each) without the ConfigMap
    assert not local_cluster.pods(namespace=namespace)
    await local_cluster.apply(config_map)
    pod = await eventually(ready_pod, "a ready TensorRT-LLM pod")
    assert pod["status"]["containerStatuses"][0]["name"] == "trtllm"
    url = f"http://127.0.0.1:{pod['metadata']['annotations'][ANNOTATION_PORT]}"
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{url}/v1/completions", json={"prompt": "a b c d", "max_tokens": 2}) as response:
            assert response.status == 200
        async with session.get(f"{url}/prometheus/metrics") as response:
            text = await response.text()
        async with session.get(f"{url}/metrics") as response:
            stats = await response.json()  # trtllm-serve's /metrics: iteration stats as JSON
    assert stats
    assert stats[0]["kvCacheStats"]["maxNumBlocks"] == ENGINE_GPU_KV_BLOCKS
    names = {f.name for f in text_string_to_metric_families(text)}
    assert "trtllm_time_to_first_token_seconds" in names
    assert "trtllm_kv_cache_host_utilization" in names
    assert all(n.startswith("trtllm_") for n in names)
    series = await asyncio.to_thread(
        local_cluster.prometheus.wait_for_series, 'trtllm_request_success_total{kvoffload_io_policy="chat"}', 30.0, 1
    )
    assert series
