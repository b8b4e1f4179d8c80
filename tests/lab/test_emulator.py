"""The emulated engine: the A, A, B, C, A restore pattern (docs/design.md, "Seed figures"), faults, vLLM's flags."""

from __future__ import annotations

import json
import random
import signal
import threading
import time
import urllib.error
import urllib.request
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kvoffload_lab.engine.config import ConfigError
from kvoffload_lab.engine.faults import Faults, apply_faults
from kvoffload_lab.engine.flags import parse_argv
from kvoffload_lab.engine.kvengine import KVEngine, tokenize
from tests.support import paths
from tests.support.engines import Engine, EngineFactory

# docs/design.md, "Seed figures": Qwen3-0.6B (114,688 KV bytes/token), a 1,480-token prefix, vLLM 0.31 on a laptop GPU.
COLD_S = 0.0773
GPU_HIT_S = 0.014
CPU_RESTORE_S = 0.0351
TOLERANCE = 0.15
# 184 blocks of 16 tokens hold A and B (92 full blocks each), so C evicts all of A.
SCENARIO = ["serve", "Qwen/Qwen3-0.6B", "--block-size", "16", "--gpu-kv-blocks", "184", "--max-model-len", "4096"]
WITH_CPU_TIER = [*SCENARIO, "--kv-offloading-size", "0.5", "--kv-offloading-backend", "native"]
ROOT = paths.ROOT


def prompt(seed: int, n: int = 1480) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(1, 150_000) for _ in range(n)]


A, B, C = prompt(1), prompt(2), prompt(3)


def near(value: float, expected: float) -> bool:
    return abs(value - expected) <= TOLERANCE * expected


def run_pattern(engine: KVEngine) -> list[float]:
    return [engine.admit(p).price.ttft_s for p in (A, A, B, C, A)]


def test_a_a_b_c_a_with_a_cpu_tier_restores_a_instead_of_recomputing() -> None:
    config, _, _ = parse_argv(WITH_CPU_TIER)
    assert config.kv_bytes_per_token == 114_688  # from the model catalog
    cold, hit, b, c, restored = run_pattern(KVEngine(config))
    assert near(cold, COLD_S)
    assert near(b, COLD_S)
    assert near(c, COLD_S)
    assert near(hit, GPU_HIT_S)
    assert near(restored, CPU_RESTORE_S)


def test_a_a_b_c_a_without_offload_recomputes_a() -> None:
    config, _, _ = parse_argv(SCENARIO)
    cold, hit, _, _, again = run_pattern(KVEngine(config))
    assert near(cold, COLD_S)
    assert near(hit, GPU_HIT_S)
    assert near(again, COLD_S)


def test_half_a_gib_cpu_tier_holds_about_4681_tokens() -> None:
    config, _, _ = parse_argv(WITH_CPU_TIER)
    tier = config.cpu_tier()
    assert tier is not None
    assert tier.capacity_blocks * config.block_size == 4672  # 292 whole 16-token blocks of 4,681 tokens


def test_a_full_prefix_hit_recomputes_its_whole_last_block() -> None:
    # vLLM caps a hit at max_cache_hit_length = num_tokens - 1 in whole blocks (v1/core/kv_cache_manager.py)
    config, _, _ = parse_argv(SCENARIO)
    engine = KVEngine(config)
    whole = prompt(9, 32)  # exactly two blocks
    engine.admit(whole)
    again = engine.admit(whole)
    assert (again.local_hit_tokens, again.computed_tokens) == (16, 16)


def test_a_secondary_fs_tier_serves_what_the_cpu_tier_lost() -> None:
    transfer = {
        "kv_connector": "OffloadingConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {
            "spec_name": "TieringOffloadingSpec",
            "cpu_bytes_to_use": 100 * 16 * 114_688,  # 100 blocks: less than A + B
            "eviction_policy": "lru",
            "secondary_tiers": [{"type": "fs", "root_dir": "/mnt/kv", "n_read_threads": 4, "n_write_threads": 2}],
        },
    }
    config, _, _ = parse_argv([*SCENARIO, "--kv-transfer-config", json.dumps(transfer)])
    assert config.offload_backend == "native"
    assert config.eviction_policy == "lru"
    engine = KVEngine(config)
    for p in (A, B, C):
        engine.admit(p)
    back = engine.admit(A)
    assert back.local_hit_tokens == 0
    assert back.cpu_hit_tokens == 0
    assert back.disk_hit_tokens == 1472
    assert back.price.disk_restored_bytes == 1472 * 114_688


def test_text_prompts_tokenize_deterministically() -> None:
    assert tokenize("the same words") == tokenize("the  same words")
    assert len(tokenize("a b c")) == 3


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["--kv-transfer-config", "{not json"], "--kv-transfer-config"),
        (["--kv-transfer-config", '{"kv_connector":"OffloadingConnector"}'], "--kv-transfer-config"),
        (["--kv-offloading-size", "-1"], "--kv-offloading-size"),
        (["--block-size", "0"], "--block-size"),
        (["--vllm-version", "newest"], "--vllm-version"),
    ],
)
def test_bad_flags_name_the_flag(argv: list[str], flag: str) -> None:
    with pytest.raises(ConfigError, match=f"^{flag}"):
        parse_argv(["serve", "m", *argv])


def test_a_rendered_deployment_command_line_parses() -> None:
    """The container args `kvoffload render` writes, plus extraArgs the emulator does not model."""
    from kvoffload.policy.engine_config import engine_args
    from kvoffload.policy.ladder import build_ladder, find_level
    from kvoffload.policy.loading import load_policy

    policy = load_policy(ROOT / "tests" / "data" / "render-qwen3-small.yaml")
    top = find_level(build_ladder(policy.spec), index=None, name=None)
    args = [*engine_args(policy, top), "--enforce-eager", "--swap-space", "4"]
    config, _, ignored = parse_argv(args)
    assert config.model == "Qwen/Qwen3-0.6B"
    assert config.name == "qwen3-small"
    assert config.offload_backend == "native"
    assert config.cpu_bytes is not None
    assert config.cpu_bytes > 0
    assert ignored == ["--enforce-eager", "--swap-space", "4"]


def test_faults_apply_from_their_start_time() -> None:
    faults = Faults()
    apply_faults(faults, {"ttft_multiplier": 3, "ttft_multiplier_after": 10, "outage_after": 5, "outage_for": 1}, 100.0)
    assert faults.ttft_factor(109.9) == 1.0
    assert faults.ttft_factor(110.0) == 3.0
    assert not faults.in_outage(104.9)
    assert faults.in_outage(105.5)
    assert not faults.in_outage(106.0)
    apply_faults(faults, {"clear": True}, 200.0)
    assert faults.ttft_factor(1e9) == 1.0
    assert not faults.in_outage(1e9)
    with pytest.raises(ValueError, match=r"^bogus"):
        apply_faults(faults, {"bogus": 1}, 0.0)
    with pytest.raises(ValueError, match=r"^added_latency"):
        apply_faults(faults, {"added_latency": -1}, 0.0)


# --- over HTTP, against `kvoffload emulate` processes ----------------------------------


def ttft_histogram(engine: Engine) -> tuple[float, float]:
    """(count, sum) of the engine's own vllm:time_to_first_token_seconds."""
    for fam in text_string_to_metric_families(engine.get("/metrics")):
        if fam.name == "vllm:time_to_first_token_seconds":
            values = {s.name: s.value for s in fam.samples}
            return values["vllm:time_to_first_token_seconds_count"], values["vllm:time_to_first_token_seconds_sum"]
    raise AssertionError("no TTFT histogram")


def counter(engine: Engine, sample: str, **labels: str) -> float:
    for fam in text_string_to_metric_families(engine.get("/metrics")):
        for s in fam.samples:
            if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items()):
                return float(s.value)
    raise AssertionError(f"no {sample} {labels}")


def measured_matches_modelled(answer: dict[str, Any]) -> bool:
    ext = answer["kvoffload"]
    # The engine really waits the modelled time; a busy 2-core runner may add a little, never take any.
    return bool(ext["modelled_ttft_s"] <= ext["measured_ttft_s"] <= ext["modelled_ttft_s"] + 0.05)


def test_restore_pattern_over_http_with_and_without_a_cpu_tier(engine_factory: EngineFactory) -> None:
    offload, plain = engine_factory([WITH_CPU_TIER, SCENARIO])
    for engine, last in ((offload, CPU_RESTORE_S), (plain, COLD_S)):
        answers = [engine.complete(p, max_tokens=2) for p in (A, A, B, C, A)]
        modelled = [a["kvoffload"]["modelled_ttft_s"] for a in answers]
        assert near(modelled[0], COLD_S)
        assert near(modelled[1], GPU_HIT_S)
        assert near(modelled[4], last)
        assert all(measured_matches_modelled(a) for a in answers)
        count, total = ttft_histogram(engine)
        assert count == 5
        assert total == pytest.approx(sum(a["kvoffload"]["measured_ttft_s"] for a in answers), rel=1e-6)
    restored = 1472
    assert counter(offload, "vllm:prompt_tokens_by_source_total", source="external_kv_transfer") == restored
    assert counter(offload, "vllm:prompt_tokens_cached_by_source_total", source="host") == restored
    assert counter(offload, "vllm:kv_offload_load_bytes_total") == restored * 114_688
    assert counter(plain, "vllm:prompt_tokens_by_source_total", source="external_kv_transfer") == 0


def test_a_ttft_multiplier_set_at_runtime_triples_ttft(engine_factory: EngineFactory) -> None:
    (engine,) = engine_factory(1, SCENARIO)
    before = engine.complete(prompt(20, 320), max_tokens=1)["kvoffload"]["modelled_ttft_s"]
    engine.set_faults(ttft_multiplier=3)
    after = engine.complete(prompt(21, 320), max_tokens=1)
    assert after["kvoffload"]["modelled_ttft_s"] == pytest.approx(3 * before)
    assert measured_matches_modelled(after)


def test_a_ttft_multiplier_flag_applies_only_after_its_time(engine_factory: EngineFactory) -> None:
    (engine,) = engine_factory(1, [*SCENARIO, "--ttft-multiplier", "3", "--ttft-multiplier-after", "3"])
    early = engine.complete(prompt(30, 320), max_tokens=1)["kvoffload"]["modelled_ttft_s"]
    deadline = time.monotonic() + 15
    while json.loads(engine.get("/emulator/faults"))["ttft_multiplier_in"] > 0:
        assert time.monotonic() < deadline, "the multiplier never became due"
        time.sleep(0.1)  # polling interval of the condition wait
    late = engine.complete(prompt(31, 320), max_tokens=1)["kvoffload"]["modelled_ttft_s"]
    assert late == pytest.approx(3 * early)


def status_of(engine: Engine, path: str) -> int:
    try:
        with urllib.request.urlopen(f"{engine.url}{path}", timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def test_an_outage_answers_503_until_cleared(engine_factory: EngineFactory) -> None:
    (engine,) = engine_factory(1, SCENARIO)
    engine.set_faults(outage_after=0)
    assert status_of(engine, "/health") == 503
    assert status_of(engine, "/metrics") == 503
    with pytest.raises(urllib.error.HTTPError) as err:
        engine.complete(prompt(40, 64))
    assert err.value.code == 503
    engine.set_faults(clear=True)
    assert status_of(engine, "/health") == 200
    assert engine.complete(prompt(40, 64))["usage"]["prompt_tokens"] == 64


def test_an_error_share_fails_exactly_that_share_with_a_500_and_leaves_the_others_latency_alone(
    engine_factory: EngineFactory,
) -> None:
    (engine,) = engine_factory(1, SCENARIO)
    plain = engine.complete(prompt(50, 64), max_tokens=2)["kvoffload"]["modelled_ttft_s"]
    engine.set_faults(error_share=0.05)
    codes: list[int] = []
    kinds: set[str] = set()
    ttfts: list[float] = []
    for _ in range(40):
        try:
            ttfts.append(engine.complete(prompt(50, 64), max_tokens=2)["kvoffload"]["modelled_ttft_s"])
            codes.append(200)
        except urllib.error.HTTPError as exc:
            kinds.add(json.loads(exc.read())["error"]["type"])
            codes.append(exc.code)
    assert kinds == {"InternalServerError"}
    assert codes.count(500) == 2, codes  # 5% of 40, counted, not drawn: the 20th and the 40th
    assert codes.index(500) == 19
    # What vLLM shows for a request that finished with reason error: counted by its reason, no TTFT of its own.
    assert counter(engine, "vllm:request_success_total", finished_reason="error") == 2
    assert counter(engine, "vllm:request_success_total", finished_reason="length") == 39
    count, _ = ttft_histogram(engine)
    assert count == 39
    assert counter(engine, "vllm:e2e_request_latency_seconds_count") == 41
    # The API server's count, as vLLM's instrumentator keeps it: the same two requests, as 500s.
    completions = {"handler": "/v1/completions", "method": "POST"}
    assert counter(engine, "http_requests_total", **completions, status="5xx") == 2
    assert counter(engine, "http_requests_total", **completions, status="2xx") == 39
    # The requests that succeed keep their latency (the prompt is a GPU prefix hit from the second on).
    assert all(t <= plain for t in ttfts)
    assert json.loads(engine.get("/emulator/faults"))["error_share"] == 0.05
    engine.set_faults(clear=True)
    assert engine.complete(prompt(50, 64))["usage"]["prompt_tokens"] == 64


def test_an_error_share_flag_parses_and_a_share_over_one_is_refused() -> None:
    _, faults, _ = parse_argv([*SCENARIO, "--error-share", "0.05", "--error-share-after", "2"], start=100.0)
    assert faults.error_share == 0.05
    assert not faults.fails(101.0)
    assert [faults.fails(102.0 + i) for i in range(20)].count(True) == 1
    with pytest.raises(ValueError, match="error_share: must be at most 1"):
        apply_faults(Faults(), {"error_share": 1.5}, 0.0)


@pytest.mark.parametrize(
    ("speak", "itl_sum", "engine_clock"),
    [
        ([], "vllm:inter_token_latency_seconds_sum", True),
        (["--speak", "sglang", "--enable-metrics"], "sglang:inter_token_latency_seconds_sum", False),
    ],
    ids=["vllm", "sglang"],
)
def test_a_stalled_host_delays_the_tokens_but_only_a_frontend_clock_counts_it_in_itl(
    engine_factory: EngineFactory, speak: list[str], itl_sum: str, engine_clock: bool
) -> None:
    """vLLM times ITL by its engine core's stamps, SGLang by its tokenizer manager's: stop the process mid-decode."""
    gap, stall = 0.2, 1.0
    (engine,) = engine_factory(1, [*SCENARIO, *speak, "--itl", str(gap)])
    answer: dict[str, Any] = {}
    sender = threading.Thread(target=lambda: answer.update(engine.complete(prompt(40, 64), max_tokens=3)))
    started = time.monotonic()
    sender.start()
    time.sleep(gap / 2)  # the first token is out (a 64-token prefill is ~10 ms); two gaps of 0.2 s follow
    engine.process.send_signal(signal.SIGSTOP)
    time.sleep(stall)
    engine.process.send_signal(signal.SIGCONT)
    sender.join(timeout=10)
    assert answer, "the request never finished"
    assert time.monotonic() - started >= stall  # the client waited out the stall
    itls = counter(engine, itl_sum)
    if engine_clock:
        assert itls == pytest.approx(2 * gap, rel=1e-6)
    else:
        assert itls > 2 * gap + stall / 2  # the sends resumed only after it: from the first token, at least 1.1 s


def test_metrics_keep_their_colons_when_the_scraper_asks_for_openmetrics(engine_factory: EngineFactory) -> None:
    (engine,) = engine_factory(1, SCENARIO)
    request = urllib.request.Request(
        f"{engine.url}/metrics",
        headers={"Accept": "application/openmetrics-text;version=1.0.0;q=0.9,text/plain;version=0.0.4;q=0.5"},
    )
    with urllib.request.urlopen(request, timeout=5) as response:
        content_type = response.headers["Content-Type"]
        text = response.read().decode()
    assert content_type.startswith("text/plain; version=0.0.4")
    assert "vllm:time_to_first_token_seconds_bucket" in text
    assert "vllm_time_to_first_token_seconds" not in text


def test_rendered_args_start_an_engine_that_reports_its_offload_config(engine_factory: EngineFactory) -> None:
    from kvoffload.policy.engine_config import engine_args
    from kvoffload.policy.ladder import build_ladder, find_level
    from kvoffload.policy.loading import load_policy

    policy = load_policy(ROOT / "tests" / "data" / "render-qwen3-small.yaml")
    top = find_level(build_ladder(policy.spec), index=None, name=None)
    (engine,) = engine_factory(1, ["serve", *engine_args(policy, top), "--enforce-eager"])
    models = json.loads(engine.get("/v1/models"))
    assert models["data"][0]["id"] == "qwen3-small"
    for fam in text_string_to_metric_families(engine.get("/metrics")):
        if fam.name == "vllm:cache_config_info":
            (sample,) = fam.samples
            assert sample.labels["kv_offloading_backend"] == "native"
            assert float(sample.labels["kv_offloading_size"]) > 0
            break
    else:
        raise AssertionError("no vllm:cache_config_info")
