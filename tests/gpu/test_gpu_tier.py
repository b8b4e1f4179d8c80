"""The GPU tier (issue 26): what real vLLM 0.26.0 on an H100 showed, held as fixtures and checked here.

The run itself (``tests/gpu/gpu_tier.py`` on the device machine) is marked ``gpu``: by hand, recorded in
``bench/gpu/``, never in CI. The checks below read its recorded outputs and run everywhere:

- the /metrics captures (``tests/data/vllm-0.26.0-gpu*-metrics.txt``) against the emulator speaking 0.26:
  every family, with its type, labels, buckets, sample names and help text, is the same (the emulator
  knows 0.26's family set, CacheConfig fields and the offload manager's families);
- the 0.24 dialect row reads 0.26 as it is (no row of its own needed);
- the memory claim: the rendered request held the engine under a cgroup of that size, and the pinned
  CPU tier is what PyTorch's pinned host allocator makes of vLLM 0.26's per-layer tensors, not the tier.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from kvoffload.api.quantity import GIB, MIB, quantity_bytes
from kvoffload.api.types import KVOffloadPolicy
from kvoffload.engines import dialect as dialects
from kvoffload.engines.vllm import dialect as vllm_dialects
from kvoffload.engines.vllm.hostmemory import per_layer_pinned_bytes
from kvoffload.policy.hostmemory import engine_pinned_bytes
from kvoffload.policy.ladder import build_ladder
from kvoffload_lab.engine.flags import parse_argv
from kvoffload_lab.engine.kvengine import KVEngine
from kvoffload_lab.engine.metrics import EngineMetrics
from tests.lab.test_emulator_conformance import Shape, shapes
from tests.support import paths

OFFLOAD_CAPTURE = paths.DATA / "vllm-0.26.0-gpu-offload-metrics.txt"
"""The canary's /metrics after the economics runs: --max-model-len 8192, --kv-offloading-size 4, native."""
GPU_CAPTURE = paths.DATA / "vllm-0.26.0-gpu-metrics.txt"
"""The stable (GPU-only level) engine's /metrics, same run."""
MEMORY = paths.DATA / "vllm-0.26.0-gpu-memory.json"
POLICIES = paths.TESTS / "gpu" / "policies"

# vllm:cache_config_info is CacheConfig.__dict__: its label names follow the release's fields.
CACHE_CONFIG = "vllm:cache_config_info"


def emulator(*args: str, served: int = 1) -> dict[str, Shape]:
    """The emulator's /metrics speaking 0.26 after ``served`` requests of 3 blocks each (the captures were taken
    after traffic, and vLLM creates some series at their first report)."""
    config, _, _ = parse_argv(
        ["serve", "Qwen/Qwen3-0.6B", "--max-model-len", "8192", "--vllm-version", "0.26.0", *args]
    )
    engine, metrics = KVEngine(config), EngineMetrics(config)
    for request in range(served):
        metrics.record_admission(engine.admit(range(request, request + 3 * config.block_size)), max_tokens=8)
    return shapes(metrics.exposition().decode())


CASES = [
    pytest.param(OFFLOAD_CAPTURE, ("--kv-offloading-size", "4"), id="offload"),
    pytest.param(GPU_CAPTURE, (), id="gpu-only"),
]


@pytest.mark.parametrize(("capture", "args"), CASES)
def test_emulator_equals_vllm_026_exactly(capture, args) -> None:  # type: ignore[no-untyped-def]
    # Every family, its type, label names, bucket bounds, sample names and help text; for
    # cache_config_info the label names are 0.26's CacheConfig fields.
    ours, theirs = emulator(*args), shapes(capture.read_text())
    assert sorted(ours) == sorted(theirs)
    for name in theirs:
        assert ours[name] == theirs[name], name
    for label in (dialects.LABEL_OFFLOADING_SIZE, dialects.LABEL_OFFLOADING_BACKEND):
        assert label in ours[CACHE_CONFIG].labels


def test_a_fresh_engine_lacks_only_the_series_vllm_creates_at_first_report() -> None:
    # Before any request the lookup and allocation histograms have no series yet, in vLLM as here.
    fresh, theirs = emulator("--kv-offloading-size", "4", served=0), shapes(OFFLOAD_CAPTURE.read_text())
    lazy = {"vllm:kv_offload_cpu_allocation_size", "vllm:kv_offload_lookup_sync_delay_seconds"}
    assert set(theirs) - set(fresh) == {f"{name}_created" for name in lazy}
    assert all(not fresh[name].samples for name in lazy)


def test_the_024_dialect_reads_026_as_captured() -> None:
    dialect = vllm_dialects.dialect_for("0.26.0")
    assert dialect.name == "0.24"
    for capture in (OFFLOAD_CAPTURE, GPU_CAPTURE):
        present = {s.name for f in text_string_to_metric_families(capture.read_text()) for s in f.samples}
        assert dialects.confirm_dialect(dialect, present) == dialect
    present = {s.name for f in text_string_to_metric_families(OFFLOAD_CAPTURE.read_text()) for s in f.samples}
    for name in dialect.offload_families():
        assert dialects.has_family(name, present), name


def test_the_capture_saw_cpu_restores() -> None:
    samples = {
        (s.name, s.labels.get("source")): s.value
        for f in text_string_to_metric_families(OFFLOAD_CAPTURE.read_text())
        for s in f.samples
    }
    assert samples[("vllm:prompt_tokens_by_source_total", dialects.SOURCE_EXTERNAL_KV_TRANSFER)] > 0
    assert samples[("vllm:kv_offload_load_bytes_total", None)] > 0
    assert samples[("vllm:kv_offload_store_bytes_total", None)] > 0


def _pow2(n: int) -> int:
    return 1 << (n - 1).bit_length()


def _policy(level_key: str) -> KVOffloadPolicy:
    name = level_key.rsplit("-level", 1)[0]
    return KVOffloadPolicy.model_validate(yaml.safe_load((POLICIES / f"{name}.yaml").read_text()))


def test_the_rendered_request_held_the_engine_with_its_headroom() -> None:
    runs = json.loads(MEMORY.read_text())["runs"]
    assert len(runs) == 9
    for name, run in runs.items():
        headroom = quantity_bytes(_policy(run["level"]).spec.resources.headroom)  # 2 GiB (0.6B), 4 GiB (8B)
        assert run["limit"].startswith("cgroup v2 memory.max=")
        assert run["oom_kill"] == 0
        assert run["cgroup_memory_peak"] <= run["memory_request_bytes"] - headroom, name


def test_the_second_session_ran_under_a_private_dev_shm_of_the_rendered_size() -> None:
    runs = json.loads(MEMORY.read_text())["runs"]
    for name in ("exact12", "big8b", "big8b_econ", "big8b_eager", "tier3p5", "tier3p6"):
        run = runs[name]
        assert run["shm"].startswith("private tmpfs /dev/shm"), name
        assert run["dev_shm_size_kB_seen"] == [run["shm_bytes"] // 1024], name
        assert run["dev_shm_used_peak_kB"] < 1024, name  # nothing of the tier in /dev/shm on 0.26


# The engine's own pinned buffers besides the tier (cgroup shmem of the GPU-only engine with 520 GPU
# blocks, and what every tier run showed beyond its tensors): they grow with the GPU block count.
OWN_PINNED_MAX = 128 * MIB


@pytest.mark.parametrize(
    ("name", "level_cpu"),
    [
        ("exact12", None),  # the rendered 12 GiB level, verbatim
        ("big8b", None),  # Qwen3-8B, the rendered 8 GiB level, verbatim
        ("big8b_econ", None),
        ("big8b_eager", None),
        ("tier3p5", "3584Mi"),  # 128 MiB a layer: no rounding
        ("tier3p6", None),  # 3.6 GiB (not a whole MiB): per_layer_pinned_bytes below
    ],
)
def test_the_sizing_rule_predicts_the_pinned_tier_held_out(name: str, level_cpu: str | None) -> None:
    """The per-layer rule (operator/kvoffload/policy/hostmemory.py) was written from vLLM's source before these
    runs: each tier's pinned bytes are the rule's to the byte, plus the engine's own pinned buffers."""
    run = json.loads(MEMORY.read_text())["runs"][name]
    policy = _policy(run["level"])
    spec = policy.spec
    if level_cpu is not None:
        spec = spec.model_copy(update={"offload": spec.offload.model_copy(update={"cpu": level_cpu})})
    level = build_ladder(spec)[-1]
    if name == "tier3p6":
        predicted = per_layer_pinned_bytes(int(3.6 * GIB), run["layers"])
    else:
        assert level.cpu_bytes == int(run["kv_offloading_size_gib"] * GIB)
        predicted = engine_pinned_bytes(spec, level)
    own = run["cgroup_shmem_peak"] - predicted
    assert 0 < own < OWN_PINNED_MAX, (name, predicted, run["cgroup_shmem_peak"])
    assert own == (71_573_504 if run["num_gpu_blocks_override"] else 90_447_872), name


def test_the_old_pool_was_short_by_the_rounding() -> None:
    """pool = tier (overheadFactor 1.0) against what the engine pinned for the tier."""
    runs = json.loads(MEMORY.read_text())["runs"]
    short = {
        name: per_layer_pinned_bytes(int(runs[name]["kv_offloading_size_gib"] * GIB), runs[name]["layers"])
        - int(runs[name]["kv_offloading_size_gib"] * GIB)
        for name in ("canary", "exact12", "big8b", "tier3p5")
    }
    assert short == {"canary": 3 * GIB, "exact12": 2 * GIB, "big8b": 1 * GIB, "tier3p5": 0}


def test_vllm_026_pins_per_layer_tensors_rounded_to_a_power_of_two() -> None:
    """vLLM 0.26's CPUOffloadingSpec allocates one torch.zeros(pin_memory=True) tensor per layer (no /dev/shm
    pool: that is TieringOffloadingSpec's), and PyTorch's CUDA host allocator rounds each up to a power of two.
    For a 4 GiB tier of Qwen3-0.6B that is 28 x 256 MiB = 7 GiB pinned, 1.75x what the sizing assumes."""
    runs = json.loads(MEMORY.read_text())["runs"]
    tier = 4 * GIB
    page = 16 * 2 * 8 * 128 * 2  # one layer's K and V of one 16-token block
    blocks = tier // (28 * page)  # vLLM: cpu_bytes_to_use // kv_bytes_per_block
    pinned = 28 * _pow2(blocks * page)
    assert pinned == 7 * GIB
    base_shmem = runs["stable"]["cgroup_shmem_peak"]  # the engine's own pinned buffers, without a tier
    for name in ("canary", "canary_eager"):
        assert runs[name]["cgroup_shmem_peak"] == pinned + base_shmem
        assert runs[name]["dev_shm_used_peak_kB"] < 1024  # nothing of the tier in /dev/shm
    assert pinned - tier == 3 * GIB  # what the rendered pool (offload.cpu x overheadFactor 1.0) leaves out


@pytest.mark.gpu
def test_gpu_tier_on_the_device(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """By hand on a machine with an NVIDIA GPU and the vLLM 0.26 kit in /tmp/kp (see tests/gpu/README.md)."""
    if shutil.which("nvidia-smi") is None or not os.path.isdir(os.environ.get("KP", "/tmp/kp")):
        pytest.skip("needs an NVIDIA GPU and the vLLM 0.26 kit")
    env = dict(os.environ, RES=str(tmp_path), PYTHONUNBUFFERED="1")
    subprocess.run([sys.executable, str(paths.TESTS / "gpu" / "gpu_tier.py")], env=env, check=True, timeout=1800)
    res = json.loads((tmp_path / "results.json").read_text())
    assert res["outcome"] == "done"
    assert all(step.get("ok") for step in res["steps"].values()), res["steps"]
