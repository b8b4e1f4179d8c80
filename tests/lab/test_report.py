"""The demo report: a crafted rollout timeline with a rollback becomes a PNG and a summary."""

from __future__ import annotations

import base64
import json
import struct
from pathlib import Path

import pytest

from kvoffload_lab.capacity import Capacity
from kvoffload_lab.report import (
    CAPACITY_LABEL,
    Decision,
    Sample,
    Timeline,
    figure,
    markdown,
    stage_figures,
    write_report,
)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
LADDER = ["gpu-only", "cpu-pilot", "cpu", "nvme"]


def sample(
    t: float, phase: str, stage: str, step: int, stable: tuple[int, float], canary: tuple[int, float, float] | None
) -> Sample:
    """stable: (replicas, p99 TTFT s); canary: (replicas, p99 TTFT s, external share)."""
    replicas = {"stable": stable[0], "canary": canary[0] if canary else 0}
    ttft = {"stable": stable[1], "canary": canary[1] if canary else None}
    share = {"stable": 0.0 if stage == "gpu-only" or canary else 0.25, "canary": canary[2] if canary else None}
    return Sample(
        t=t,
        phase=phase,
        stage=stage,
        step=step,
        replicas=replicas,
        ready=replicas,
        levels={"stable": "gpu-only", "canary": stage} if canary else {"stable": stage},
        ttft_p99=ttft,
        external_share=share,
        verdict="Fail" if canary and canary[1] > 0.5 else "Pass",
    )


READY = [
    (range(0, 22, 2), {"gpu-only": 4}),
    (range(22, 44, 2), {"gpu-only": 3, "cpu-pilot": 1}),
    (range(44, 66, 2), {"gpu-only": 3, "cpu": 1}),
    (range(66, 68, 2), {"gpu-only": 2, "cpu": 1}),  # a gpu-only engine stopped, its cpu successor not Ready yet
    (range(68, 88, 2), {"gpu-only": 2, "cpu": 2}),
    (range(88, 110, 2), {"cpu": 3, "nvme": 1}),
    (range(110, 130, 2), {"cpu": 4}),
]
"""What the kubelet stand-in counted Ready, per level, over the regression run."""


def regression_timeline() -> Timeline:
    """Climb to the CPU tier, then the nvme canary's TTFT goes ×4 and the operator rolls it back."""
    samples = [sample(t, "Baseline", "gpu-only", 0, (4, 0.38), None) for t in range(0, 22, 2)]
    samples += [sample(t, "Canary", "cpu-pilot", 0, (3, 0.39), (1, 0.26, 0.18)) for t in range(22, 44, 2)]
    samples += [sample(t, "Canary", "cpu", 0, (3, 0.38), (1, 0.22, 0.31)) for t in range(44, 66, 2)]
    samples += [sample(t, "Promoting", "cpu", 1, (2, 0.37), (2, 0.21, 0.32)) for t in range(66, 88, 2)]
    samples += [sample(t, "Canary", "nvme", 0, (3, 0.21), (1, 0.2, 0.35)) for t in range(88, 100, 2)]
    samples += [sample(t, "Canary", "nvme", 0, (3, 0.21), (1, 0.82, 0.35)) for t in range(100, 110, 2)]
    samples += [sample(t, "RolledBack", "cpu", 0, (4, 0.21), None) for t in range(110, 130, 2)]
    decisions = [
        Decision(0.4, "gpu-only", "NewLadder", "NewLadder", "ladder gpu-only → cpu-pilot → cpu → nvme"),
        Decision(21.0, "cpu-pilot", "BaselineTaken", "BaselineTaken", "baseline of gpu-only taken over 20s"),
        Decision(43.0, "cpu", "PilotPassed", "PilotPassed", "canary cpu-pilot passed after 20s"),
        Decision(65.0, "cpu", "Promoted", "Promoted", "cpu now on 2 of 4 replicas (50%)"),
        Decision(87.0, "nvme", "LevelPromoted", "LevelPromoted", "cpu is stable; canary nvme on 1 of 4"),
        Decision(
            109.0,
            "cpu",
            "Rollback",
            "AnalysisFailed",
            "canary failed for 6s: ttftP99 canary 820.0ms / stable 210.0ms; canary nvme removed",
        ),
    ]
    return Timeline(
        policy="default/demo",
        scenario="regression",
        ladder=LADDER,
        samples=samples,
        decisions=decisions,
        ttft_budget=0.5,
        min_external_share=0.02,
        expected="RolledBack at cpu",
        outcome="RolledBack at cpu",
        ok=True,
        notes=["Injected a ×4 TTFT regression on the nvme canary at 100s."],
        capacity=[Capacity(t, ready) for times, ready in READY for t in times],
    )


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == PNG_MAGIC
    assert data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def test_a_regression_timeline_becomes_a_png_and_a_summary_that_names_the_rollback(tmp_path: Path) -> None:
    files = write_report(regression_timeline(), tmp_path / "out")

    png = files.png.read_bytes()
    width, height = png_size(png)
    assert (width, height) == (1200, 1050)
    assert 20_000 < len(png) < 2_000_000  # a real plot, not an empty canvas

    summary = files.markdown.read_text()
    assert "# kvoffload demo: regression (default/demo)" in summary
    assert "Ended **RolledBack at cpu** after 2m8s (as expected; expected RolledBack at cpu)." in summary
    assert "**Rollback** at 1m49s (AnalysisFailed), landing on cpu: canary failed for 6s" in summary
    assert "![p99 TTFT, external share, replicas and Ready engines per level over time](timeline.png)" in summary
    assert "| 1m49s | cpu | **Rollback** | AnalysisFailed |" in summary
    assert "Injected a ×4 TTFT regression" in summary

    page = files.html.read_text()
    inlined = page.split('src="data:image/png;base64,')[1].split('"')[0]
    assert base64.b64decode(inlined) == png
    assert "<strong>Rollback</strong>" in page


def test_a_clean_climb_says_no_rollback() -> None:
    timeline = regression_timeline()
    timeline.decisions = [d for d in timeline.decisions if not d.is_rollback]
    timeline.outcome, timeline.ok = "Stable at nvme", False
    text = markdown(timeline)
    assert "No rollback." in text
    assert "NOT as expected" in text


def test_medians_are_taken_per_stretch_of_stage_and_phase() -> None:
    rows = stage_figures(regression_timeline().samples)
    assert [(r.stage, r.phase) for r in rows] == [
        ("gpu-only", "Baseline"),
        ("cpu-pilot", "Canary"),
        ("cpu", "Canary"),
        ("cpu", "Promoting"),
        ("nvme", "Canary"),
        ("cpu", "RolledBack"),
    ]
    nvme = rows[4]
    assert (nvme.start, nvme.end) == (88, 108)
    assert nvme.ttft_canary == pytest.approx(0.2)  # 6 samples at 200ms, 5 at 820ms
    assert nvme.share_canary == pytest.approx(0.35)
    assert rows[0].ttft_canary is None


def test_a_timeline_survives_a_json_round_trip() -> None:
    timeline = regression_timeline()
    again = Timeline.from_json(json.loads(json.dumps(timeline.to_json())))
    assert again == timeline
    assert again.rollbacks[0].reason == "AnalysisFailed"


def _area(vertices: list[tuple[float, float]]) -> float:
    """The shoelace area of a closed polygon."""
    pairs = zip(vertices, vertices[1:] + vertices[:1], strict=True)
    return abs(sum(x0 * y1 - x1 * y0 for (x0, y0), (x1, y1) in pairs)) / 2


def test_the_capacity_panel_stacks_the_census_ready_engines_per_level_with_the_decisions_marked() -> None:
    import matplotlib.pyplot as plt

    timeline = regression_timeline()
    fig = figure(timeline)
    try:
        (ax,) = [a for a in fig.axes if a.get_ylabel() == CAPACITY_LABEL]
        legend = ax.get_legend()
        assert legend is not None
        assert [t.get_text() for t in legend.get_texts()] == [
            "gpu-only",
            "cpu-pilot",
            "cpu",
            "nvme",
            "Ready, all levels",
        ]

        # The top edge: all Ready engines at each sample, the dip at 66s included.
        (total,) = [line for line in ax.lines if line.get_label() == "Ready, all levels"]
        assert list(total.get_xdata()) == [c.t for c in timeline.capacity]
        assert list(total.get_ydata()) == [4] * 33 + [3] + [4] * 31

        # Each level's band holds its engine-seconds: count × the time to the next sample (a step, held).
        times = [c.t for c in timeline.capacity]
        bands = {c.get_label(): c for c in ax.collections}
        assert list(bands) == ["gpu-only", "cpu-pilot", "cpu", "nvme"]
        for level, band in bands.items():
            (path,) = band.get_paths()
            counts = [c.ready.get(level, 0) for c in timeline.capacity]
            held = sum(n * (t1 - t0) for n, t0, t1 in zip(counts, times, times[1:], strict=False))
            assert _area([tuple(v) for v in path.vertices]) == pytest.approx(held), level
        assert {level: round(_area([tuple(v) for v in b.get_paths()[0].vertices])) for level, b in bands.items()} == {
            "gpu-only": 4 * 22 + 3 * 44 + 2 * 22,
            "cpu-pilot": 22,
            "cpu": 22 + 2 + 2 * 20 + 3 * 22 + 4 * 18,  # the last sample (128s) holds for no time
            "nvme": 22,
        }

        nvme = bands["nvme"].get_paths()[0].vertices
        assert (nvme[:, 1].min(), nvme[:, 1].max()) == (3, 4)  # stacked on the three cpu engines, not from 0

        # The stage changes are marked here as on the other panels; the rollback in red.
        marks = {line.get_xdata()[0]: line.get_color() for line in ax.lines if line is not total}
        assert marks == {d.t: "#d62728" if d.is_rollback else "#555555" for d in timeline.decisions}
    finally:
        plt.close(fig)


def test_a_timeline_without_a_census_still_draws_an_empty_capacity_panel() -> None:
    import matplotlib.pyplot as plt

    timeline = regression_timeline()
    timeline.capacity = []
    fig = figure(timeline)
    try:
        (ax,) = [a for a in fig.axes if a.get_ylabel() == CAPACITY_LABEL]
        assert not ax.collections
        assert ax.get_legend() is None
    finally:
        plt.close(fig)
