"""The emulator under load (issue 11, part 3): one scheduler per engine, a host link that loads and stores share,
the pinning delay at start, and a case where offload hurts with no fault injected. All in virtual time."""

from __future__ import annotations

import itertools
import random
import statistics
from collections.abc import Sequence

import pytest

from kvoffload.economics.profile import GIB
from kvoffload.economics.profileload import shipped_profile
from kvoffload_lab.engine.config import ConfigError
from kvoffload_lab.engine.costmodel import both_ways_factor
from kvoffload_lab.engine.flags import parse_argv
from kvoffload_lab.engine.kvengine import KVEngine
from kvoffload_lab.engine.pcie import Link
from kvoffload_lab.engine.scheduler import Request, Scheduler, run_virtual

MODEL = "Qwen/Qwen3-0.6B"
H200 = "nvidia-h200-141gb"
SLOW_LINK = "nvidia-l40s"  # estimated, PCIe Gen4: half the H200's link
SEED_TABLE = ["serve", MODEL, "--kv-cache-memory-bytes", "268435456", "--max-model-len", "2048"]


def prompt(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(1, 150_000) for _ in range(n)]


def scheduler(argv: Sequence[str]) -> Scheduler:
    config, _, _ = parse_argv(list(argv))
    return Scheduler(
        KVEngine(config), max_num_batched_tokens=config.max_num_batched_tokens, max_num_seqs=config.max_num_seqs
    )


def ttfts(requests: Sequence[Request]) -> list[float]:
    out = [r.ttft for r in requests]
    assert all(t is not None for t in out)
    return [t for t in out if t is not None]


def p(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# --- one request alone is priced as before -----------------------------------------------------------


@pytest.mark.parametrize("offload", [[], ["--kv-offloading-size", "0.5"]])
def test_a_lone_request_costs_what_the_price_list_says(offload: list[str]) -> None:
    """The seed table through the scheduler: one request at a time costs exactly its price."""
    a, b, c = prompt(1, 1600), prompt(2, 1600), prompt(3, 1600)
    prompts = (a, a, b, c, a)
    priced = KVEngine(parse_argv([*SEED_TABLE, *offload])[0])
    expected = [priced.admit(x).price.ttft_s for x in prompts]
    got = ttfts(run_virtual(scheduler([*SEED_TABLE, *offload]), [(i * 1.0, x, 4) for i, x in enumerate(prompts)]))
    assert got == pytest.approx(expected, rel=1e-9)


# --- the batch flags ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "tokens", "seqs"),
    [
        ([], 2048, 256),  # the laptop
        (["--gpu-class", H200], 8192, 1024),  # >= 70 GiB
        (["--gpu-class", "nvidia-a100-80gb"], 2048, 256),  # vLLM keeps the small defaults on an A100
        (["--gpu-class", SLOW_LINK], 2048, 256),  # 48 GB
        (["--max-num-batched-tokens", "512", "--max-num-seqs", "8"], 512, 8),
    ],
)
def test_batch_flags_default_as_vllm_serve_does(argv: list[str], tokens: int, seqs: int) -> None:
    config, _, ignored = parse_argv(["serve", MODEL, *argv])
    assert (config.max_num_batched_tokens, config.max_num_seqs) == (tokens, seqs)
    assert ignored == []


def test_a_budget_under_max_num_seqs_is_refused_as_vllm_does() -> None:
    with pytest.raises(ConfigError, match=r"^--max-num-batched-tokens: 128 is smaller than --max-num-seqs 256"):
        parse_argv(["serve", MODEL, "--max-num-batched-tokens", "128"])


def test_a_prompt_longer_than_the_budget_is_prefilled_in_chunks() -> None:
    n = 3200
    chunked = scheduler(["serve", MODEL, "--max-model-len", "4096"])  # 2,048 a step
    whole = scheduler(["serve", MODEL, "--max-model-len", "4096", "--max-num-batched-tokens", "4096"])
    (a,) = run_virtual(chunked, [(0.0, prompt(4, n), 1)])
    (b,) = run_virtual(whole, [(0.0, prompt(4, n), 1)])
    assert (chunked.totals.steps, whole.totals.steps) == (2, 1)
    # The laptop's FLOPs add up over chunks: the same compute, in two steps; the second chunk also reads the
    # first one's K/V from GPU memory (issue 25), which one whole step does not.
    assert a.ttft is not None
    assert b.ttft is not None
    read = chunked.cost.cache_read_seconds(2048, chunked.cost.kv_bytes_per_token)
    assert read > 0
    assert a.ttft == pytest.approx(b.ttft + read, rel=1e-9)


def test_requests_queue_behind_max_num_seqs() -> None:
    one = scheduler(["serve", MODEL, "--max-num-seqs", "1"])
    first, second = run_virtual(one, [(0.0, prompt(5, 500), 8), (0.0, prompt(6, 500), 8)])
    assert second.scheduled_at is not None
    assert first.finished_at is not None
    assert second.scheduled_at == pytest.approx(first.finished_at)
    assert second.ttft is not None
    assert first.ttft is not None
    assert second.ttft > first.ttft + 7 * 0.010


def test_itl_grows_with_the_decode_batch() -> None:
    def mean_itl(n: int) -> float:
        s = scheduler(["serve", MODEL, "--gpu-class", H200])
        reqs = run_virtual(s, [(0.0, prompt(100 + i, 64), 32) for i in range(n)])
        return statistics.mean(x for r in reqs for x in r.itls[1:])  # the decode steps, prefills done

    profile = shipped_profile(H200)
    assert mean_itl(1) == pytest.approx(profile.decode_itl_seconds(MODEL, 1), rel=1e-6)
    assert mean_itl(64) == pytest.approx(profile.decode_itl_seconds(MODEL, 64), rel=1e-6)
    assert mean_itl(64) > 1.5 * mean_itl(1)


# --- the host link --------------------------------------------------------------------------------------


def test_loads_and_stores_contend_at_the_both_ways_rate() -> None:
    profile = shipped_profile(H200)
    factor = both_ways_factor(profile)
    assert factor == pytest.approx(profile.bidirectional_bytes_per_second / (2 * 55.2e9), rel=0.01)
    assert 0.85 < factor < 0.92  # 98 GB/s both ways against 55 each way
    alone = Link(factor)
    load = alone.submit(0.0, "h2d", 0.010)
    alone.advance(1.0)
    assert load.finished == pytest.approx(0.010)
    shared = Link(factor)
    shared.submit(0.0, "d2h", 1.0)  # heavy store traffic
    load = shared.submit(0.0, "h2d", 0.010)
    queued = shared.submit(0.0, "h2d", 0.010)  # FIFO behind the first load
    shared.advance(1.0)
    assert load.finished == pytest.approx(0.010 / factor)
    assert queued.finished == pytest.approx(0.020 / factor)


def test_every_computed_block_is_stored_and_a_finished_request_keeps_its_blocks_until_stored() -> None:
    s = scheduler(["serve", MODEL, "--kv-offloading-size", "1", "--gpu-kv-blocks", "512"])
    (req,) = run_virtual(s, [(0.0, prompt(9, 1600), 1)])  # done at its prefill step, its 100 blocks in flight
    assert s.totals.stored_bytes == 100 * s.config.block_bytes
    assert req.finished_at is not None
    assert req.freed_at is not None
    store_s = s.cost.store_seconds(100 * s.config.block_bytes)
    assert req.freed_at == pytest.approx(req.finished_at + store_s)
    assert s.blocks_used == 0


def test_without_offload_nothing_is_stored() -> None:
    s = scheduler(["serve", MODEL, "--gpu-kv-blocks", "512"])
    (req,) = run_virtual(s, [(0.0, prompt(9, 1600), 1)])
    assert s.totals.stored_bytes == 0
    assert req.freed_at == req.finished_at


# --- pinning at start ------------------------------------------------------------------------------------


def test_pinning_at_start_follows_the_tier_size() -> None:
    small = parse_argv(["serve", MODEL, "--gpu-class", H200, "--kv-offloading-size", "1"])[0]
    big = parse_argv(["serve", MODEL, "--gpu-class", H200, "--kv-offloading-size", "16"])[0]
    profile = shipped_profile(H200)
    assert small.pinning_s == pytest.approx(profile.pin_seconds(small.cpu_allocation().size_bytes))  # type: ignore[union-attr]
    assert 0.4 < small.pinning_s < 0.7  # ~0.5 s a GiB measured
    assert big.pinning_s > 10 * small.pinning_s
    assert parse_argv(["serve", MODEL])[0].pinning_s == 0.0  # no tier, nothing pinned
    scaled = parse_argv(["serve", MODEL, "--kv-offloading-size", "1", "--pinning-time-scale", "0.5"])[0]
    laptop = parse_argv(["serve", MODEL, "--kv-offloading-size", "1"])[0]
    assert scaled.pinning_s == pytest.approx(laptop.pinning_s / 2)  # the laptop borrows the H200 host's rate
    assert scaled.ready_delay_s == scaled.pinning_s
    with pytest.raises(ConfigError, match=r"^--pinning-time-scale"):
        parse_argv(["serve", MODEL, "--pinning-time-scale", "-1"])
    assert GIB == 2**30


# --- whether offload pays, under load --------------------------------------------------------------------


def conversations(
    *, seconds: float, rate: float, sessions: int, reuse: bool, seed: int = 5
) -> list[tuple[float, list[int], int]]:
    """Poisson arrivals of turns of ``sessions`` conversations: each turn resends the history plus 200 new tokens
    (up to 1,600, then it starts over). ``reuse=False``: every prompt is new (the same lengths)."""
    rng = random.Random(seed)
    history: dict[int, list[int]] = {}
    out: list[tuple[float, list[int], int]] = []
    t = 0.0
    i = 0
    while t < seconds:
        t += rng.expovariate(rate)
        sid = rng.randrange(sessions)
        h = history.setdefault(sid, [])
        if len(h) >= 1600:
            h.clear()
        h.extend(prompt(sid * 100_000 + len(h), 200))
        out.append((t, list(h) if reuse else prompt(10_000_000 + i, len(h)), 8))
        i += 1
    return out


ENGINE = ["serve", MODEL, "--gpu-kv-blocks", "400", "--max-model-len", "2048"]
"""A GPU cache of 6,400 tokens: a few histories; the rest come back from the CPU tier or are recomputed."""
CPU_TIER = ["--kv-offloading-size", "4"]


def run(argv: Sequence[str], workload: Sequence[tuple[float, list[int], int]]) -> tuple[list[float], Scheduler]:
    s = scheduler(argv)
    return ttfts(run_virtual(s, workload)), s


def test_offload_pays_on_the_laptop_under_conversation_load() -> None:
    work = conversations(seconds=120, rate=10, sessions=60, reuse=True)
    base, _ = run(ENGINE, work)
    tier, s = run([*ENGINE, *CPU_TIER], work)
    assert s.totals.avoided_tokens > 0.3 * (s.totals.avoided_tokens + s.totals.prefill_tokens)
    assert p(tier, 0.5) < 0.85 * p(base, 0.5)
    assert p(tier, 0.99) < 0.85 * p(base, 0.99)


def test_offload_hurts_on_its_own_on_a_slow_link_class_with_a_launch_bound_model() -> None:
    """No fault: on the L40S (estimated, PCIe Gen4) the 0.6B's eager prefill is launch-bound, so the few tokens a
    restored request still computes cost nearly a whole miss; the load, the step it lands in and the stores sharing
    the link come on top. The same workload that pays on the laptop makes TTFT worse."""
    work = conversations(seconds=120, rate=10, sessions=60, reuse=True)
    cls = ["--gpu-class", SLOW_LINK]
    base, _ = run([*ENGINE, *cls], work)
    tier, s = run([*ENGINE, *cls, *CPU_TIER], work)
    assert s.totals.avoided_tokens > 0.3 * (s.totals.avoided_tokens + s.totals.prefill_tokens)
    assert s.totals.stored_bytes > 0
    assert p(tier, 0.5) > 1.1 * p(base, 0.5)
    assert p(tier, 0.9) > 1.1 * p(base, 0.9)
    assert statistics.mean(tier) > 1.1 * statistics.mean(base)
    # The tail is the queue behind the longest prompts, which the tier neither shortens nor lengthens here.
    assert p(tier, 0.99) == pytest.approx(p(base, 0.99), rel=0.05)
    # What the hits spared the GPU is next to nothing against its busy time.
    assert s.totals.saved_gpu_s < 0.02 * s.totals.busy_s


def test_without_prefix_reuse_a_cpu_tier_changes_nothing_but_the_stores() -> None:
    work = conversations(seconds=60, rate=10, sessions=60, reuse=False)
    base, _ = run(ENGINE, work)
    tier, s = run([*ENGINE, *CPU_TIER], work)
    assert s.totals.avoided_tokens == 0
    assert s.totals.saved_gpu_s == 0
    assert s.totals.stored_bytes > 0
    assert p(tier, 0.5) == pytest.approx(p(base, 0.5), rel=0.02)


# --- the e2e no-fault rollback's workload (tests/lab/test_e2e_offload_hurts.py), in virtual time -------------

ONE_SEQUENCE = [
    "serve",
    MODEL,
    "--max-model-len",
    "4096",
    "--gpu-kv-blocks",
    "256",  # one max-length sequence: one request at a time
    "--max-num-batched-tokens",
    "4096",  # a whole prompt in one prefill chunk
]
BIG_CPU_TIER = ["--kv-offloading-size", "4"]  # holds all 8 prefixes


def shared_prefixes(*, rate: float, seconds: float, seed: int = 11) -> list[tuple[float, list[int], int]]:
    """The e2e's load on one engine: evenly spaced arrivals (round-robin), one of 8 shared 3,968-token prefixes
    and a unique 32-token tail each, 2 output tokens."""
    rng = random.Random(seed)
    prefixes = [prompt(7_000 + i, 3968) for i in range(8)]
    count = int(rate * seconds)
    return [(i / rate, prefixes[rng.randrange(8)] + prompt(8_000_000 + i, 32), 2) for i in range(count)]


def served_per_second(argv: Sequence[str]) -> float:
    """Requests finished per second with the queue never empty (arrivals far above what the engine serves)."""
    done = sorted(r.finished_at or 0.0 for r in run_virtual(scheduler(argv), shared_prefixes(rate=40, seconds=20)))
    k = len(done) // 4  # the middle half: no start, no drain
    return (len(done) - 2 * k) / (done[-k] - done[k])


def window_p99s(requests: Sequence[Request], width: float = 6.0) -> list[float]:
    """p99 TTFT of the requests that arrived in each successive window (the operator's analysis window)."""
    end = max(r.arrived for r in requests)
    out, start = [], 0.0
    while start + width <= end:
        out.append(p(ttfts([r for r in requests if start <= r.arrived < start + width]), 0.99))
        start += width
    return out


def test_on_the_l40s_a_cpu_tier_cuts_what_a_one_sequence_engine_serves() -> None:
    """A hit still runs the launch-bound forward, after its load and the step it lands in, holding the blocks the
    next request needs: the tier costs service time. At 13 requests/s the gpu-only engine keeps up; the tier's
    queue grows without end (what the e2e's canary shows, and the operator rolls back)."""
    cls = ["--gpu-class", SLOW_LINK]
    base_rate = served_per_second([*ONE_SEQUENCE, *cls])
    tier_rate = served_per_second([*ONE_SEQUENCE, *cls, *BIG_CPU_TIER])
    assert base_rate == pytest.approx(16.0, rel=0.05)
    assert tier_rate == pytest.approx(10.7, rel=0.05)
    work = shared_prefixes(rate=13, seconds=42)
    base = window_p99s(run_virtual(scheduler([*ONE_SEQUENCE, *cls]), work))
    tier_s = scheduler([*ONE_SEQUENCE, *cls, *BIG_CPU_TIER])
    tier = window_p99s(run_virtual(tier_s, work))
    assert tier_s.totals.avoided_tokens > 0.8 * 3968 * len(work)  # the tier serves most prefixes
    assert max(base) < 0.1  # a miss and no wait
    assert tier[0] > 5 * max(base)
    assert all(b > a for a, b in itertools.pairwise(tier))  # the queue only grows
    assert tier[-1] > 3.0


def test_on_the_laptop_the_same_load_is_served_faster_with_the_tier() -> None:
    """The converse: where compute, not launches, dominates a miss (the seed laptop's FLOPs), the same prompts
    restored from the same tier serve four times the requests, and at a rate the gpu-only engine keeps up with
    the tier's p99 TTFT is a fraction of its."""
    assert served_per_second([*ONE_SEQUENCE, *BIG_CPU_TIER]) > 3.5 * served_per_second(ONE_SEQUENCE)
    work = shared_prefixes(rate=3, seconds=42)
    base = window_p99s(run_virtual(scheduler(ONE_SEQUENCE), work))
    tier = window_p99s(run_virtual(scheduler([*ONE_SEQUENCE, *BIG_CPU_TIER]), work))
    # Past the first two windows: each prefix misses once before the tier holds it.
    assert all(t < 0.5 * b for t, b in zip(tier[2:], base[2:], strict=True))
