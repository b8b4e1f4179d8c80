"""The emulator's prices (issue 11, part 2): a GPU class's profile, the seed's laptop re-fitted on 1,480 tokens,
the 3,200-token held-out check, and vLLM's cache-sizing flags."""

from __future__ import annotations

import random

import pytest

from kvoffload.economics.profileload import shipped_profile
from kvoffload.policy.catalog import find_gpu_class, find_model
from kvoffload_lab.engine.config import ConfigError
from kvoffload_lab.engine.costmodel import SEED_FIT, SEED_HELD_OUT, fit_laptop
from kvoffload_lab.engine.flags import parse_argv
from kvoffload_lab.engine.kvengine import KVEngine

MODEL = "Qwen/Qwen3-0.6B"
KV = 114_688
H200 = "nvidia-h200-141gb"
ESTIMATED = "nvidia-l40s"
MIB_256 = 268_435_456
# The seed table: 256 MiB of GPU KV cache (146 blocks of 16 tokens), max-model-len 2048, 1,600-token prompts.
SEED_TABLE = ["serve", MODEL, "--kv-cache-memory-bytes", str(MIB_256), "--max-model-len", "2048"]
PREFIX_TOKENS = 1600


def prompt(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(1, 150_000) for _ in range(n)]


def pattern(argv: list[str], n: int = PREFIX_TOKENS) -> list[float]:
    config, _, _ = parse_argv(argv)
    engine = KVEngine(config)
    a, b, c = prompt(1, n), prompt(2, n), prompt(3, n)
    return [engine.admit(p).price.ttft_s for p in (a, a, b, c, a)]


# --- the seed table through vLLM's own flags ---------------------------------------------------


def test_kv_cache_memory_bytes_bounds_the_gpu_cache() -> None:
    config, _, ignored = parse_argv(SEED_TABLE)
    assert config.gpu_kv_blocks == MIB_256 // (16 * KV) == 146
    assert ignored == []


def test_seed_table_without_offload() -> None:
    cold, hit, b, c, evicted = pattern(SEED_TABLE)
    assert 0.060 <= cold <= 0.095
    assert hit <= 0.025
    assert 0.060 <= b <= 0.095
    assert 0.060 <= c <= 0.095
    assert 0.060 <= evicted <= 0.095


def test_seed_table_with_half_a_gib_cpu_tier() -> None:
    cold, hit, _, _, restored = pattern([*SEED_TABLE, "--kv-offloading-size", "0.5"])
    assert 0.060 <= cold <= 0.095
    assert hit <= 0.025
    assert 0.025 <= restored <= 0.050


def test_the_cpu_tier_drops_the_tail_of_a_not_its_head() -> None:
    """A, B and C (300 blocks) overflow the 0.5 GiB tier (292 blocks) by 8. As in vLLM, every lookup touches all of
    a request's blocks in reverse, so the second A leaves A's head the most recent of A and the 8 go from its tail."""
    config, _, _ = parse_argv([*SEED_TABLE, "--kv-offloading-size", "0.5"])
    assert config.cpu_tier() is not None
    engine = KVEngine(config)
    a, b, c = prompt(1, 1600), prompt(2, 1600), prompt(3, 1600)
    for p in (a, a, b, c):
        engine.admit(p)
    last = engine.admit(a)
    assert (last.local_hit_tokens, last.cpu_hit_tokens, last.computed_tokens) == (0, 92 * 16, 1600 - 92 * 16)


# --- the laptop: fitted on 1,480 tokens, checked on 3,200 ----------------------------------------


def seed_engine_prices(n: int) -> tuple[float, float, float]:
    """Cold, GPU-hit and CPU-restore TTFT of an ``n``-token prompt on the laptop."""
    big = ["serve", MODEL, "--gpu-kv-blocks", "1024", "--max-model-len", "4096"]
    p = prompt(7, n)
    gpu = KVEngine(parse_argv(big)[0])
    cold, hit = gpu.admit(p).price.ttft_s, gpu.admit(p).price.ttft_s
    small = ["serve", MODEL, "--gpu-kv-blocks", str(n // 16), "--kv-offloading-size", "2"]
    cpu = KVEngine(parse_argv(small)[0])
    cpu.admit(p)
    cpu.admit(prompt(8, n))  # evicts p from the GPU
    restored = cpu.admit(p)
    assert restored.cpu_hit_tokens > 0
    assert restored.local_hit_tokens == 0
    return cold, hit, restored.price.ttft_s


def test_the_laptop_reproduces_the_figures_it_was_fitted_on() -> None:
    cold, hit, restored = seed_engine_prices(SEED_FIT.prompt_tokens)
    assert cold == pytest.approx(SEED_FIT.cold_s, rel=1e-9)
    assert hit == pytest.approx(SEED_FIT.gpu_hit_s, rel=1e-9)
    assert restored == pytest.approx(SEED_FIT.cpu_restore_s, rel=1e-9)


def test_the_laptop_fit_is_physical() -> None:
    fit = fit_laptop()
    assert 20e12 < fit.prefill_flops_per_s < 30e12  # a laptop Ada GPU's bf16 tensor rate, well below peak
    assert 0.010 < fit.base_s < 0.016
    assert 0.005 < fit.restore_step_s < 0.010  # about one engine step (the laptop's ITL is ~10 ms)


def test_held_out_3200_token_cold_prefill_within_20_percent() -> None:
    cold, _, _ = seed_engine_prices(SEED_HELD_OUT.prompt_tokens)
    assert cold == pytest.approx(SEED_HELD_OUT.cold_s, rel=0.20)


def test_held_out_3200_token_gpu_hit_within_20_percent() -> None:
    """Issue 25: the hit reads its cached K/V at the GPU's memory bandwidth, pays vLLM's block hashing, and a full
    hit (3,200 tokens are 200 whole blocks) recomputes its last block. 15.7 ms against the measured 18.9 ms
    (-17.0%); it was 13.7 ms (-28%) before. Nothing is fitted to the 3,200-token figures."""
    _, hit, _ = seed_engine_prices(SEED_HELD_OUT.prompt_tokens)
    assert hit == pytest.approx(SEED_HELD_OUT.gpu_hit_s, rel=0.20)


def test_held_out_3200_token_gpu_hit_as_the_model_prices_it() -> None:
    """Catches a drift of the hit's price."""
    _, hit, _ = seed_engine_prices(SEED_HELD_OUT.prompt_tokens)
    assert hit == pytest.approx(0.01569, rel=0.02)


def test_a_full_hit_recomputes_its_whole_last_block() -> None:
    big = ["serve", MODEL, "--gpu-kv-blocks", "1024", "--max-model-len", "4096"]
    engine = KVEngine(parse_argv(big)[0])
    p = prompt(7, 3200)
    engine.admit(p)
    hit = engine.admit(p)
    assert (hit.local_hit_tokens, hit.computed_tokens) == (3184, 16)  # vLLM: max_cache_hit_length = n - 1


def test_a_hit_grows_with_what_is_cached() -> None:
    small, large = (seed_engine_prices(n)[1] for n in (1480, 3200))
    config = parse_argv(["serve", MODEL])[0]
    read = config.cost.cache_read_seconds(3184, KV) - config.cost.cache_read_seconds(1472, KV)
    hashing = config.cost.hash_seconds(3200) - config.cost.hash_seconds(1480)
    assert read > 0
    assert hashing > 0
    assert large - small > read + hashing


# --- a GPU class's profile ------------------------------------------------------------------------


def class_prices(gpu_class: str, *extra: str, n: int = 1480) -> tuple[float, float, float]:
    return seed_engine_prices_on([f"--gpu-class={gpu_class}", *extra], n)


def seed_engine_prices_on(flags: list[str], n: int, model: str = MODEL) -> tuple[float, float, float]:
    p = prompt(7, n)
    gpu = KVEngine(parse_argv(["serve", model, "--gpu-kv-blocks", "1024", *flags])[0])
    cold, hit = gpu.admit(p).price.ttft_s, gpu.admit(p).price.ttft_s
    cpu = KVEngine(
        parse_argv(["serve", model, "--gpu-kv-blocks", str(n // 16), "--kv-offloading-size", "2", *flags])[0]
    )
    cpu.admit(p)
    cpu.admit(prompt(8, n))
    restored = cpu.admit(p)
    assert restored.cpu_hit_tokens == n - n % 16
    return cold, hit, restored.price.ttft_s


@pytest.mark.parametrize("gpu_class", [H200, ESTIMATED])
def test_a_class_prices_what_its_profile_says(gpu_class: str) -> None:
    profile = shipped_profile(gpu_class)
    cold, hit, restored = class_prices(gpu_class)
    fixed = profile.prefill_seconds(MODEL, 1, "eager")
    hashing = profile.hash_seconds(1480)
    assert cold == pytest.approx(profile.prefill_seconds(MODEL, 1480, "eager") + hashing)
    grow = profile.prefill_seconds(MODEL, 1480, "eager") - profile.prefill_seconds(MODEL, 1472, "eager")
    read = profile.cache_read_seconds(1472 * KV)
    assert hit == pytest.approx(hashing + fixed + grow + read)
    page = 16 * KV // 28  # one layer's K and V of one block (vLLM 0.32)
    assert page == 65_536
    step = profile.decode_itl_seconds(MODEL, 1)
    restore = profile.restore_seconds(1472 * KV, page, 28)
    assert restored == pytest.approx(hashing + fixed + grow + read + restore + step)


def test_measured_and_estimated_classes_price_the_same_request_differently() -> None:
    h200, l40s = shipped_profile(H200), shipped_profile(ESTIMATED)
    assert (h200.kind, l40s.kind) == ("measured", "estimated")
    fast, slow = class_prices(H200), class_prices(ESTIMATED)
    assert all(s > f for f, s in zip(fast, slow, strict=True))
    # The H200's eager 0.6B forward is launch-bound (19.6 ms at 128 tokens, 20.5 ms at 1,480): the 8 tokens a
    # restored request still computes cost nearly a whole miss, so a CPU restore of the 0.6B does not pay there.
    assert fast[2] > fast[0]
    config, _, _ = parse_argv(["serve", MODEL, f"--gpu-class={ESTIMATED}"])
    assert config.cost.itl_s == pytest.approx(l40s.decode_itl_seconds(MODEL, 1))
    assert config.cost.name == "nvidia-l40s (estimated)"


def test_tensor_parallelism_splits_compute_and_bytes_per_rank() -> None:
    profile = shipped_profile(H200)
    model = "Qwen/Qwen3-8B"
    config, _, _ = parse_argv(["serve", model, f"--gpu-class={H200}", "-tp", "2", "--gpu-kv-blocks", "64"])
    cost = config.cost
    fixed = profile.prefill_seconds(model, 1, "eager")
    whole = profile.prefill_seconds(model, 4096, "eager")
    assert cost.compute_seconds(4096, 0) == pytest.approx(fixed + (whole - fixed) / 2)
    kv = config.kv_bytes_per_token
    page = 16 * kv // (36 * 2)  # a 64 KiB page a layer and block, half of it a rank
    assert cost.page_bytes == page
    assert cost.cpu_restore_seconds(4096 * kv) == pytest.approx(profile.restore_seconds(4096 * kv // 2, page, 36))
    assert cost.itl_s == pytest.approx(profile.decode_itl_seconds(model, 1) / 2)


def test_a_model_the_profile_lacks_is_an_error_naming_the_class_and_its_models() -> None:
    with pytest.raises(ConfigError, match=r"^--gpu-class: profile nvidia-h200-141gb has no eager prefill curve") as e:
        parse_argv(["serve", "meta-llama/Llama-3.1-8B-Instruct", f"--gpu-class={H200}"])
    assert "'meta-llama/Llama-3.1-8B-Instruct'" in str(e.value)
    assert "Qwen/Qwen3-32B" in str(e.value)


def test_an_unknown_class_is_an_error() -> None:
    with pytest.raises(ConfigError, match=r"^--gpu-class: no shipped profile for GPU class 'tpu'"):
        parse_argv(["serve", MODEL, "--gpu-class=tpu"])


def test_without_a_class_the_seed_laptop_prices() -> None:
    config, _, _ = parse_argv(["serve", MODEL])
    assert config.cost.profile is None
    assert config.cost.name == "laptop (seed)"


# --- vLLM's cache-sizing flags --------------------------------------------------------------------


def test_num_gpu_blocks_override_bounds_the_cache_and_evicts() -> None:
    config, _, ignored = parse_argv(["serve", MODEL, "--num-gpu-blocks-override", "128", "--max-model-len", "2048"])
    assert (config.gpu_kv_blocks, ignored) == (128, [])
    engine = KVEngine(config)
    a, b = prompt(1, 1480), prompt(2, 1480)
    engine.admit(a)
    engine.admit(b)  # 92 + 92 blocks > 128: the tail of A goes first, then its head
    again = engine.admit(a)
    assert again.local_hit_tokens < 1472
    assert again.computed_tokens > 8


def test_override_wins_over_bytes_and_the_emulator_knob_wins_over_both() -> None:
    both = [*SEED_TABLE, "--num-gpu-blocks-override", "200"]
    assert parse_argv(both)[0].gpu_kv_blocks == 200
    assert parse_argv([*both, "--gpu-kv-blocks", "184"])[0].gpu_kv_blocks == 184


def test_gpu_memory_utilization_sizes_from_the_class_memory_less_the_weights() -> None:
    model = "Qwen/Qwen3-32B"
    entry, gpu = find_model(model), find_gpu_class(H200)
    assert entry is not None
    assert gpu is not None
    config, _, _ = parse_argv(["serve", model, f"--gpu-class={H200}", "--gpu-memory-utilization", "0.5"])
    expected = int((0.5 * gpu.memory_bytes - entry.weight_bytes) // config.block_bytes)
    assert config.gpu_kv_blocks == expected
    assert 0 < expected < parse_argv(["serve", model, f"--gpu-class={H200}"])[0].gpu_kv_blocks  # default 0.9


def test_a_cache_smaller_than_max_model_len_is_refused_as_vllm_does() -> None:
    with pytest.raises(ConfigError, match=r"^--kv-cache-memory-bytes: a GPU KV cache of 146 blocks"):
        parse_argv(["serve", MODEL, "--kv-cache-memory-bytes", str(MIB_256), "--max-model-len", "4096"])
    with pytest.raises(ConfigError, match=r"^--gpu-memory-utilization: 0.1 of nvidia-l4 leaves no room"):
        parse_argv(["serve", "Qwen/Qwen3-8B", "--gpu-class=nvidia-l4", "--gpu-memory-utilization", "0.1"])


def test_without_a_class_gpu_memory_utilization_changes_nothing() -> None:
    assert parse_argv(["serve", MODEL, "--gpu-memory-utilization", "0.5"])[0].gpu_kv_blocks == 4096


def test_on_the_h200_a_restore_of_the_8b_beats_recomputing_it() -> None:
    cold, _, restored = seed_engine_prices_on([f"--gpu-class={H200}"], 1480, model="Qwen/Qwen3-8B")
    assert restored < cold


def test_a_class_decode_itl_follows_its_batch_curve_unless_itl_is_given() -> None:
    profile = shipped_profile(H200)
    cost = parse_argv(["serve", MODEL, f"--gpu-class={H200}"])[0].cost
    assert cost.itl_seconds(32) == pytest.approx(profile.decode_itl_seconds(MODEL, 32))
    assert cost.itl_seconds(32) > cost.itl_seconds(1) == pytest.approx(cost.itl_s)
    fixed = parse_argv(["serve", MODEL, f"--gpu-class={H200}", "--itl", "0.02"])[0].cost
    assert fixed.itl_seconds(32) == fixed.itl_s == 0.02
    # The laptop: the seed's 10 ms at batch 1, growing as the measured H200 curve of the 0.6B grows (issue 11, part 3).
    laptop = parse_argv(["serve", MODEL])[0].cost
    h200 = shipped_profile(H200)
    assert laptop.itl_seconds(1) == 0.010
    growth = h200.decode_itl_seconds(MODEL, 32) / h200.decode_itl_seconds(MODEL, 1)
    assert laptop.itl_seconds(32) == pytest.approx(0.010 * growth)
    assert growth > 1.2


def test_the_laptop_prices_tensor_parallelism_and_the_model_shape() -> None:
    one = parse_argv(["serve", "Qwen/Qwen3-8B"])[0].cost
    two = parse_argv(["serve", "Qwen/Qwen3-8B", "-tp", "2"])[0].cost
    assert two.compute_seconds(1480, 0) == pytest.approx(one.compute_seconds(1480, 0) / 2)
    assert two.cpu_restore_seconds(10**9) == pytest.approx(one.cpu_restore_seconds(10**9) / 2)
    small = parse_argv(["serve", MODEL])[0].cost
    assert one.compute_seconds(1480, 0) > 10 * small.compute_seconds(1480, 0)  # 8B against 0.6B: by FLOPs


def test_an_fp8_kv_cache_halves_the_page_a_class_moves() -> None:
    bf16 = parse_argv(["serve", MODEL, f"--gpu-class={H200}"])[0]
    fp8 = parse_argv(["serve", MODEL, f"--gpu-class={H200}", "--kv-cache-dtype", "fp8"])[0]
    assert fp8.kv_bytes_per_token * 2 == bf16.kv_bytes_per_token
    assert fp8.cost.page_bytes * 2 == bf16.cost.page_bytes == 65_536
