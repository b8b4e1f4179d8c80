"""kvoffload simulate: a real trace's LRU curve, and what it gives each tier of a policy."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from kvoffload.cli.main import main
from tests.policy.render_policies import LAB
from tests.support import paths

# shared/traces/README.md: block-level LRU over the whole trace, in percent.
README_LRU = {
    "mooncake-conversation.jsonl": {1_000: 4.4, 4_000: 8.6, 16_000: 26.3, 64_000: 35.9},
    "mooncake-synthetic.jsonl": {1_000: 8.2, 4_000: 23.0, 16_000: 53.0, 64_000: 64.0},
}


def simulate(*args: str) -> dict[str, Any]:
    result = CliRunner().invoke(main, ["simulate", *args, "-o", "json"])
    assert result.exit_code == 0, result.output
    out: dict[str, Any] = json.loads(result.stdout)
    return out


@pytest.mark.parametrize("trace", sorted(README_LRU))
def test_the_lru_table_matches_the_traces_readme_within_half_a_point(
    mooncake_traces: dict[str, Path], trace: str
) -> None:
    out = simulate(str(mooncake_traces[trace]), "--blocks", ",".join(str(b) for b in README_LRU[trace]))
    measured = {row["blocks"]: 100 * row["hitRatio"] for row in out["lru"]}
    for blocks, percent in README_LRU[trace].items():
        assert measured[blocks] == pytest.approx(percent, abs=0.5), blocks
    assert sum(row["count"] for row in out["reuseDistance"]) == out["trace"]["blocks"] - out["trace"]["unique"]


def test_each_level_of_a_policy_gets_its_hit_share_per_tier(mooncake_traces: dict[str, Path]) -> None:
    trace = str(mooncake_traces["mooncake-conversation.jsonl"])
    out = simulate(trace, "--policy", str(paths.EXAMPLES / "llama-3.1-70b-tp4-nvme.yaml"), "--gpu-blocks", "2000", *LAB)
    levels = {level["name"]: level for level in out["policy"]["levels"]}
    gpu_only = levels["gpu-only"]
    assert [t["tier"] for t in gpu_only["tiers"]] == ["gpu"]
    assert gpu_only["externalShare"] == 0
    top = out["policy"]["levels"][-1]
    assert [t["tier"] for t in top["tiers"]][:2] == ["gpu", "cpu"]
    assert len(top["tiers"]) >= 3  # the filesystem tier
    for level in out["policy"]["levels"]:
        # every prompt block is served by exactly one tier or recomputed
        assert sum(t["share"] for t in level["tiers"]) + level["recomputed"] == pytest.approx(1.0)
        assert level["tiers"][0]["share"] == gpu_only["tiers"][0]["share"]  # the GPU is the same on every level
    # a bigger ladder level never serves less from the offload tiers
    shares = [level["externalShare"] for level in out["policy"]["levels"] if not level["name"].endswith("pilot")]
    assert shares == sorted(shares)
    assert top["externalShare"] > 0


def test_a_bad_trace_line_is_named_and_nothing_is_printed(tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    trace.write_text(
        '{"timestamp": 0, "input_length": 1024, "output_length": 1, "hash_ids": [1, 2]}\n{"timestamp": 1}\n'
    )
    result = CliRunner().invoke(main, ["simulate", str(trace)])
    assert result.exit_code == 2
    assert result.stdout == ""
    assert f"{trace}:2" in result.stderr


def test_the_table_names_the_trace_and_every_size(mooncake_traces: dict[str, Path]) -> None:
    trace = str(mooncake_traces["mooncake-synthetic.jsonl"])
    result = CliRunner().invoke(main, ["simulate", trace, "--blocks", "1000,64000"])
    assert result.exit_code == 0, result.output
    assert "3,993 requests" in result.stdout
    assert "64,000" in result.stdout
