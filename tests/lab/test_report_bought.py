"""What offload bought, in the demo's report (issue 11, part 3): p50 TTFT, prompt tokens avoided per second and
GPU-seconds saved per level. They move when a tier pays and stay flat when it does not. The figures of each level
come from the emulator's own scheduler run in virtual time on one workload; no test here waits on a clock."""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence

import pytest

from kvoffload_lab.demo import Bought, SavedMeter, bought_queries
from kvoffload_lab.engine.scheduler import run_virtual
from kvoffload_lab.report import Sample, Timeline, markdown, summary_json
from tests.lab.test_engine_load import CPU_TIER, ENGINE, SLOW_LINK, conversations, scheduler

SECONDS = 120.0


def level_figures(argv: Sequence[str], work: Sequence[tuple[float, list[int], int]]) -> Bought:
    """One engine's figures over the run, as the demo's sample holds them for its variant."""
    s = scheduler(argv)
    reqs = run_virtual(s, work)
    p50 = statistics.median(r.ttft for r in reqs if r.ttft is not None)
    return Bought(
        ttft_p50={"stable": p50},
        avoided_tokens_per_s={"stable": s.totals.avoided_tokens / SECONDS},
        gpu_s_saved_per_s={"stable": s.totals.saved_gpu_s / SECONDS},
    )


def climb(engine: Sequence[str], *, reuse: bool) -> list[dict[str, float | None]]:
    """gpu-only then cpu, each level's samples carrying its figures; the per-stage figures the summary shows."""
    work = conversations(seconds=SECONDS, rate=10, sessions=60, reuse=reuse)
    samples: list[Sample] = []
    for t0, (stage, argv) in enumerate((("gpu-only", engine), ("cpu", [*engine, *CPU_TIER]))):
        b = level_figures(argv, work)
        samples += [
            Sample(
                t=t0 * 10.0 + i,
                phase="Stable",
                stage=stage,
                replicas={"stable": 2},
                ttft_p50=b.ttft_p50,
                avoided_tokens_per_s=b.avoided_tokens_per_s,
                gpu_s_saved_per_s=b.gpu_s_saved_per_s,
            )
            for i in range(3)
        ]
    timeline = Timeline(policy="default/demo", scenario="promote", ladder=["gpu-only", "cpu"], samples=samples)
    summary = summary_json(timeline)
    json.dumps(summary)  # what `kvoffload demo -o json` carries
    assert "What offload bought" in markdown(timeline)
    return [{k: s[k] for k in ("ttft_p50_stable", "avoided_stable", "saved_stable")} for s in summary["stages"]]


def test_when_a_tier_pays_p50_ttft_falls_and_tokens_avoided_and_gpu_seconds_saved_rise() -> None:
    gpu_only, cpu = climb(ENGINE, reuse=True)  # the laptop: a restore costs a fraction of a recompute
    assert gpu_only["avoided_stable"] == 0
    assert gpu_only["saved_stable"] == 0
    assert cpu["ttft_p50_stable"] is not None
    assert gpu_only["ttft_p50_stable"] is not None
    assert cpu["ttft_p50_stable"] < 0.85 * gpu_only["ttft_p50_stable"]
    assert cpu["avoided_stable"] is not None
    assert cpu["avoided_stable"] > 1000
    assert cpu["saved_stable"] is not None
    assert cpu["saved_stable"] > 0.1


def test_without_reuse_a_tier_buys_nothing_and_the_figures_stay_flat() -> None:
    gpu_only, cpu = climb(ENGINE, reuse=False)
    assert cpu["avoided_stable"] == gpu_only["avoided_stable"] == 0
    assert cpu["saved_stable"] == gpu_only["saved_stable"] == 0
    assert cpu["ttft_p50_stable"] == pytest.approx(gpu_only["ttft_p50_stable"], rel=0.02)


def test_on_a_launch_bound_class_the_tokens_come_back_but_save_no_gpu_and_p50_ttft_rises() -> None:
    gpu_only, cpu = climb([*ENGINE, "--gpu-class", SLOW_LINK], reuse=True)
    assert cpu["avoided_stable"] is not None
    assert cpu["avoided_stable"] > 1000
    assert cpu["saved_stable"] is not None
    assert cpu["saved_stable"] < 0.03
    assert cpu["ttft_p50_stable"] is not None
    assert gpu_only["ttft_p50_stable"] is not None
    assert cpu["ttft_p50_stable"] > gpu_only["ttft_p50_stable"]


def test_the_saved_meter_turns_engine_totals_into_a_rate_per_role() -> None:
    meter = SavedMeter()
    assert meter.update(0.0, [("stable", "p1", 0.0), ("canary", "p2", 1.0)]) == {}  # first sight: no rate yet
    rates = meter.update(2.0, [("stable", "p1", 0.0), ("canary", "p2", 2.0), ("canary", "p3", 5.0)])
    assert rates == {"stable": 0.0, "canary": 0.5}
    assert meter.update(4.0, [("canary", "p2", 1.0)]) == {"canary": 0.0}  # a restarted engine never goes negative


def test_the_queries_read_vllms_ttft_histogram_and_the_external_source() -> None:
    from kvoffload.engines.vllm.dialect import dialect_for

    q = bought_queries(dialect_for("0.32.0"), "default", "demo", "20s")
    assert q["ttft_p50"].startswith("histogram_quantile(0.5, sum by (le, kvoffload_io_config_hash) (rate(vllm:time_to")
    assert 'source="external_kv_transfer"' in q["avoided_tokens_per_s"]
    assert 'kvoffload_io_policy="demo"' in q["avoided_tokens_per_s"]
