"""One pass over a block stream gives the LRU hit ratio at every cache size, as an LRU cache would."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from functools import cache
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvoffload.economics import stackdist
from kvoffload.economics.stackdist import previous_access, reuse_distances, reuse_profile
from kvoffload.economics.traces import BlockTrace, read_mooncake


def lru_hits(stream: Sequence[int], blocks: int) -> int:
    """The plain simulation: one OrderedDict LRU of ``blocks`` blocks."""
    cached: OrderedDict[int, None] = OrderedDict()
    hits = 0
    for block in stream:
        if block in cached:
            hits += 1
            cached.move_to_end(block)
            continue
        cached[block] = None
        if len(cached) > blocks:
            cached.popitem(last=False)
    return hits


def naive_distances(stream: Sequence[int]) -> list[int]:
    """Reuse distance by definition: distinct other blocks since the previous access."""
    out = []
    for i, block in enumerate(stream):
        before = [j for j in range(i) if stream[j] == block]
        out.append(len(set(stream[before[-1] + 1 : i])) if before else -1)
    return out


# --- small streams with known answers ----------------------------------------------------------


def test_a_block_seen_again_after_two_others_hits_from_three_blocks_on() -> None:
    profile = reuse_profile([1, 2, 3, 1])
    assert reuse_distances([1, 2, 3, 1]).tolist() == [-1, -1, -1, 2]
    assert [profile.hits(c) for c in range(5)] == [0, 0, 0, 1, 1]
    assert profile.hit_ratio(3) == 0.25
    assert profile.hit_ratio() == 0.25


def test_repeats_inside_the_window_count_once() -> None:
    stream = [1, 2, 2, 2, 1]
    assert reuse_distances(stream).tolist() == [-1, -1, 0, 0, 1]
    profile = reuse_profile(stream)
    assert [profile.hits(c) for c in range(4)] == [0, 2, 3, 3]


def test_a_loop_one_block_longer_than_the_cache_never_hits() -> None:
    profile = reuse_profile([1, 2, 3] * 4)
    assert profile.hits(2) == 0
    assert profile.hits(3) == 9
    assert profile.hit_ratio(3) == 0.75


def test_first_accesses_miss_at_every_size() -> None:
    profile = reuse_profile([7, 8, 9, 10])
    assert (profile.accesses, profile.unique, profile.reaccesses) == (4, 4, 0)
    assert profile.hit_ratio(10**9) == 0.0
    assert profile.hit_ratio() == 0.0


def test_a_cache_of_no_blocks_never_hits() -> None:
    assert reuse_profile([5, 5, 5, 5]).hits(0) == 0
    assert reuse_profile([5, 5, 5, 5]).hits(1) == 3


def test_an_empty_stream_has_no_hits() -> None:
    profile = reuse_profile([])
    assert (profile.accesses, profile.unique) == (0, 0)
    assert profile.hit_ratio(100) == 0.0
    assert profile.hit_ratio() == 0.0
    assert profile.distance_buckets() == []


def test_the_distribution_counts_each_reaccess_at_its_distance() -> None:
    stream = [1, 2, 3, 1, 1, 4, 5, 6, 2]  # distances: 1 at 2, 1 at 0, 2 at 5
    profile = reuse_profile(stream)
    assert profile.histogram.tolist() == [1, 0, 1, 0, 0, 1]
    assert profile.distance_buckets() == [(0, 1, 1), (1, 2, 0), (2, 4, 1), (4, 8, 1)]
    assert sum(count for _, _, count in profile.distance_buckets()) == profile.reaccesses == 3


def test_previous_access_points_at_the_same_block() -> None:
    assert previous_access([4, 9, 4, 4, 9]).tolist() == [-1, -1, 0, 2, 1]


def test_block_ids_can_be_any_64_bit_integer() -> None:
    stream = [2**62, -3, 2**62, -(2**63), -3]
    assert reuse_distances(stream).tolist() == [-1, -1, 1, -1, 2]


def test_a_stream_is_one_dimensional_and_of_integers() -> None:
    with pytest.raises(ValueError, match="1-D"):
        reuse_profile([[1, 2], [3, 4]])
    with pytest.raises(ValueError, match="integer"):
        reuse_profile([1.5, 2.0])
    with pytest.raises(ValueError, match="blocks"):
        reuse_profile([1, 1]).hits(-1)


# --- the one-pass curve against a plain LRU ---------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 12), max_size=150))
def test_one_pass_curve_equals_an_lru_simulated_at_each_size(stream: list[int]) -> None:
    profile = reuse_profile(stream)
    for blocks in range(len(set(stream)) + 2):
        assert profile.hits(blocks) == lru_hits(stream, blocks), blocks
    assert reuse_distances(stream).tolist() == naive_distances(stream)


@settings(max_examples=20, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(1, 3000))
def test_long_streams_match_too(seed: int, distinct: int) -> None:
    # Long enough for many partition levels above the brute-forced runs.
    rng = np.random.default_rng(seed)
    stream = rng.zipf(1.3, 4000) % distinct
    profile = reuse_profile(stream)
    for blocks in (1, 7, 64, 300, distinct):
        assert profile.hits(blocks) == lru_hits(stream.tolist(), blocks), blocks


# --- the README's table, on the real traces --------------------------------------------------

# shared/traces/README.md: blocks, unique, infinite cache and LRU hit ratios (percent).
README_TABLE = {
    "mooncake-conversation.jsonl": (288_500, 182_790, 36.6, {1_000: 4.4, 4_000: 8.6, 16_000: 26.3, 64_000: 35.9}),
    "mooncake-synthetic.jsonl": (121_877, 43_924, 64.0, {1_000: 8.2, 4_000: 23.0, 16_000: 53.0, 64_000: 64.0}),
}


@cache
def trace(path: Path) -> BlockTrace:
    return read_mooncake(path)


@pytest.mark.parametrize("name", sorted(README_TABLE))
def test_curve_matches_the_readme_table(mooncake_traces: dict[str, Path], name: str) -> None:
    blocks, unique, infinite, by_size = README_TABLE[name]
    profile = reuse_profile(trace(mooncake_traces[name]).blocks)
    assert (profile.accesses, profile.unique) == (blocks, unique)
    assert 100 * profile.hit_ratio() == pytest.approx(infinite, abs=0.5)
    for size, percent in by_size.items():
        assert 100 * profile.hit_ratio(size) == pytest.approx(percent, abs=0.5), size


@pytest.mark.parametrize("name", sorted(README_TABLE))
def test_curve_matches_a_plain_lru_on_the_first_20k_blocks_of_the_trace(
    mooncake_traces: dict[str, Path], name: str
) -> None:
    stream = trace(mooncake_traces[name]).blocks[:20_000]
    profile = reuse_profile(stream)
    for size in (100, 1_000, 4_000):
        assert profile.hits(size) == lru_hits(stream.tolist(), size), size


def test_streams_past_two_billion_reaccesses_take_the_64_bit_path(monkeypatch: pytest.MonkeyPatch) -> None:
    stream = np.random.default_rng(7).integers(0, 50, 3000)
    expected = reuse_distances(stream)
    monkeypatch.setattr(stackdist, "_INT32_LIMIT", 0)
    assert reuse_distances(stream).tolist() == expected.tolist()
