"""The demo's report: a rollout timeline as a PNG plot and a short summary.

A :class:`Timeline` is what ``kvoffload demo`` saw once per analysis cycle (phase,
stage, replicas, p99 TTFT and external share per variant, the verdict) plus the
operator's decisions from ``status.history`` and the Ready engines per ladder level the
kubelet stand-in counted (``lab/capacity.py``). :func:`write_report` turns it into
``timeline.png`` (matplotlib, Agg backend: no display needed), ``summary.md``
(which links the PNG) and ``report.html`` (the PNG inlined, one self-contained
file). Nothing here talks to a cluster or to Prometheus.
"""

from __future__ import annotations

import base64
import html
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvoffload.api.conventions import ROLLBACK_DECISIONS, VARIANTS
from kvoffload.api.quantity import format_duration
from kvoffload_lab.capacity import Capacity, steps

if TYPE_CHECKING:
    from matplotlib.figure import Figure

COLORS = {"stable": "#1f77b4", "canary": "#ff7f0e"}
ROLLBACK_COLOR = "#d62728"
LEVEL_COLORS = ("#7f7f7f", "#bcbd22", "#2ca02c", "#9467bd", "#17becf", "#8c564b", "#e377c2")
"""Ready engines per level, by ladder position (gpu-only grey)."""
CAPACITY_LABEL = "Ready by level\n(kubelet census)"
PNG_NAME = "timeline.png"
MARKDOWN_NAME = "summary.md"
HTML_NAME = "report.html"
PNG_ALT = "p99 TTFT, external share, replicas and Ready engines per level over time"


@dataclass(frozen=True)
class Sample:
    """One observation of the rollout: what the status and Prometheus showed at ``t``."""

    t: float
    """Seconds since the demo applied the policy."""
    phase: str
    stage: str
    step: int = 0
    replicas: Mapping[str, int] = field(default_factory=dict)
    """Desired replicas per variant (``stable``, ``canary``)."""
    ready: Mapping[str, int] = field(default_factory=dict)
    """Ready replicas per variant."""
    levels: Mapping[str, str] = field(default_factory=dict)
    """Ladder level name per variant."""
    ttft_p99: Mapping[str, float | None] = field(default_factory=dict)
    """p99 time to first token per variant, seconds."""
    external_share: Mapping[str, float | None] = field(default_factory=dict)
    """Share of prompt tokens loaded from offload tiers per variant, 0 to 1."""
    verdict: str | None = None
    ttft_p50: Mapping[str, float | None] = field(default_factory=dict)
    """p50 time to first token per variant, seconds (what most requests see)."""
    avoided_tokens_per_s: Mapping[str, float | None] = field(default_factory=dict)
    """Prompt tokens per second the offload tiers provided instead of a prefill, per variant (all its engines)."""
    gpu_s_saved_per_s: Mapping[str, float | None] = field(default_factory=dict)
    """GPU-seconds of prefill those tokens spared per second, per variant: the engines' modelled compute of the
    restored tokens less what the rest of their prompts cost once the tokens were there (0.5 = half a GPU)."""


@dataclass(frozen=True)
class Decision:
    """One entry of ``status.history``, placed on the demo's clock."""

    t: float
    stage: str
    decision: str
    reason: str
    message: str = ""

    @property
    def is_rollback(self) -> bool:
        return self.decision in ROLLBACK_DECISIONS


@dataclass
class Timeline:
    """Everything the report needs about one demo run."""

    policy: str
    scenario: str
    ladder: list[str]
    samples: list[Sample] = field(default_factory=list)
    decisions: list[Decision] = field(default_factory=list)
    ttft_budget: float | None = None
    """The absolute p99 TTFT budget, seconds (drawn as a line)."""
    min_external_share: float | None = None
    expected: str = ""
    """What the scenario should end in, in words (e.g. ``Stable at nvme``)."""
    outcome: str = ""
    """What it ended in, in words."""
    ok: bool | None = None
    """Whether the outcome is the expected one; None while running."""
    notes: list[str] = field(default_factory=list)
    """Anything worth a line in the summary (faults injected, load figures)."""
    capacity: list[Capacity] = field(default_factory=list)
    """Ready engines per ladder level, as the kubelet stand-in counted them at each sample."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Timeline:
        data = dict(doc)
        data["samples"] = [Sample(**s) for s in data.get("samples", [])]
        data["decisions"] = [Decision(**d) for d in data.get("decisions", [])]
        data["capacity"] = [Capacity(**c) for c in data.get("capacity", [])]
        return cls(**data)

    @property
    def duration(self) -> float:
        times = [s.t for s in self.samples] + [d.t for d in self.decisions] + [c.t for c in self.capacity]
        return max(times, default=0.0)

    @property
    def rollbacks(self) -> list[Decision]:
        return [d for d in self.decisions if d.is_rollback]


# --- the plot -----------------------------------------------------------------------


def _series(samples: Sequence[Sample], pick: str, variant: str, scale: float) -> tuple[list[float], list[float]]:
    xs: list[float] = []
    ys: list[float] = []
    for s in samples:
        value = getattr(s, pick).get(variant)
        xs.append(s.t)
        ys.append(float("nan") if value is None else value * scale)
    return xs, ys


def _short(text: str, limit: int = 90) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _capacity_panel(ax: Any, timeline: Timeline) -> None:
    """Ready engines per ladder level, stacked (the top edge is all Ready engines), from the census."""
    times, by_level = steps(timeline.capacity, timeline.ladder)
    bottom = [0] * len(times)
    for level, counts in by_level.items():
        top = [b + n for b, n in zip(bottom, counts, strict=True)]
        position = timeline.ladder.index(level) if level in timeline.ladder else len(timeline.ladder)
        color = LEVEL_COLORS[position % len(LEVEL_COLORS)]
        ax.fill_between(times, bottom, top, step="post", color=color, alpha=0.75, lw=0, label=level)
        bottom = top
    if times:
        ax.step(times, bottom, where="post", color="black", lw=1.2, label="Ready, all levels")
    ax.set_ylabel(CAPACITY_LABEL)
    ax.set_ylim(0, max(bottom, default=1) * 1.5 + 0.5)  # headroom for the legend above the stack
    ax.yaxis.get_major_locator().set_params(integer=True)


def figure(timeline: Timeline) -> Figure:
    """Draw p99 TTFT, external share and replicas per variant, and Ready engines per level, over time, with
    the decisions marked.

    Every decision is a vertical line labelled with what it was and the level it led to;
    a rollback is a red line with its reason and figures in a red box.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_ttft, ax_share, ax_reps, ax_cap) = plt.subplots(
        4,
        1,
        sharex=True,
        figsize=(12, 10.5),
        gridspec_kw={"height_ratios": [3, 2, 1.4, 1.6]},
        constrained_layout=True,
    )
    samples = timeline.samples
    for variant in VARIANTS:
        xs, ys = _series(samples, "ttft_p99", variant, 1000.0)
        if any(y == y for y in ys):  # any non-NaN
            ax_ttft.plot(xs, ys, marker=".", lw=1.6, color=COLORS[variant], label=f"{variant} p99 TTFT")
        xs, ys = _series(samples, "external_share", variant, 100.0)
        if any(y == y for y in ys):
            ax_share.plot(xs, ys, marker=".", lw=1.6, color=COLORS[variant], label=f"{variant} external share")
        reps = [s.replicas.get(variant, 0) for s in samples]
        if any(reps):
            ax_reps.step([s.t for s in samples], reps, where="post", lw=2, color=COLORS[variant], label=variant)
    if timeline.ttft_budget is not None:
        ax_ttft.axhline(timeline.ttft_budget * 1000, ls="--", color="grey", lw=1)
        ax_ttft.annotate(
            f"budget {format_duration(timeline.ttft_budget)}",
            (1.0, timeline.ttft_budget * 1000),
            xycoords=("axes fraction", "data"),
            xytext=(-4, -11),
            textcoords="offset points",
            ha="right",
            fontsize=8,
            color="grey",
        )
    if timeline.min_external_share is not None:
        ax_share.axhline(timeline.min_external_share * 100, ls="--", color="grey", lw=1)
    ax_ttft.set_ylabel("p99 TTFT (ms)")
    ax_ttft.set_ylim(bottom=0)
    ax_share.set_ylabel("external share (%)")
    ax_share.set_ylim(bottom=0)
    ax_reps.set_ylabel("replicas")
    ax_reps.set_ylim(bottom=0)
    ax_reps.yaxis.get_major_locator().set_params(integer=True)
    _capacity_panel(ax_cap, timeline)
    ax_cap.set_xlabel("seconds since the policy was applied")

    for d in timeline.decisions:
        color = ROLLBACK_COLOR if d.is_rollback else "#555555"
        for ax in (ax_ttft, ax_share, ax_reps, ax_cap):
            ax.axvline(d.t, color=color, lw=2.2 if d.is_rollback else 0.9, ls="-" if d.is_rollback else ":")
        ax_ttft.annotate(
            f"{d.decision} → {d.stage}",
            (d.t, 1.0),
            xycoords=("data", "axes fraction"),
            xytext=(2, -4),
            textcoords="offset points",
            rotation=90,
            va="top",
            ha="left",
            fontsize=7.5,
            color=color,
            fontweight="bold" if d.is_rollback else "normal",
        )
    for d in timeline.rollbacks:
        ax_ttft.annotate(
            f"{d.decision}: {d.reason}\n{_short(d.message, 70)}",
            (d.t, 0.55),
            xycoords=("data", "axes fraction"),
            xytext=(-12, 0),
            textcoords="offset points",
            ha="right",
            va="center",
            fontsize=8,
            color="white",
            bbox={"boxstyle": "round", "fc": ROLLBACK_COLOR, "ec": ROLLBACK_COLOR, "alpha": 0.9},
            arrowprops={"arrowstyle": "->", "color": ROLLBACK_COLOR},
        )
    # The decision labels hang from the top of the TTFT panel: keep its legend at the bottom.
    for ax, where in ((ax_ttft, "lower left"), (ax_share, "best"), (ax_reps, "best"), (ax_cap, "upper left")):
        ax.grid(alpha=0.25)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc=where, fontsize=8, framealpha=0.85, ncol=8 if ax is ax_cap else 1)
    if samples or timeline.decisions or timeline.capacity:
        ax_cap.set_xlim(0, max(timeline.duration, 1.0) * 1.02)
    title = f"kvoffload demo ({timeline.scenario}): {timeline.policy}, ladder {' → '.join(timeline.ladder)}"
    if timeline.outcome:
        title += f"\nended {timeline.outcome}"
    fig.suptitle(title, fontsize=11)
    return fig


def plot(timeline: Timeline, path: Path) -> Path:
    """:func:`figure`, saved as a PNG at ``path``."""
    import matplotlib.pyplot as plt

    fig = figure(timeline)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


# --- the summary --------------------------------------------------------------------


@dataclass(frozen=True)
class StageFigures:
    """The median figures over one stretch of the run spent on one stage and phase."""

    stage: str
    phase: str
    start: float
    end: float
    ttft_stable: float | None
    ttft_canary: float | None
    share_stable: float | None
    share_canary: float | None
    ttft_p50_stable: float | None = None
    ttft_p50_canary: float | None = None
    avoided_stable: float | None = None
    """Median prompt tokens avoided per second."""
    avoided_canary: float | None = None
    saved_stable: float | None = None
    """Median GPU-seconds saved per second."""
    saved_canary: float | None = None

    @property
    def seconds(self) -> float:
        return self.end - self.start


def _median(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def stage_figures(samples: Sequence[Sample]) -> list[StageFigures]:
    """One row per run of consecutive samples on the same stage, step and phase."""
    runs: list[list[Sample]] = []
    for s in samples:
        if runs and (runs[-1][-1].stage, runs[-1][-1].step, runs[-1][-1].phase) == (s.stage, s.step, s.phase):
            runs[-1].append(s)
        else:
            runs.append([s])
    return [
        StageFigures(
            stage=run[0].stage,
            phase=run[0].phase,
            start=run[0].t,
            end=run[-1].t,
            ttft_stable=_median(s.ttft_p99.get("stable") for s in run),
            ttft_canary=_median(s.ttft_p99.get("canary") for s in run),
            share_stable=_median(s.external_share.get("stable") for s in run),
            share_canary=_median(s.external_share.get("canary") for s in run),
            ttft_p50_stable=_median(s.ttft_p50.get("stable") for s in run),
            ttft_p50_canary=_median(s.ttft_p50.get("canary") for s in run),
            avoided_stable=_median(s.avoided_tokens_per_s.get("stable") for s in run),
            avoided_canary=_median(s.avoided_tokens_per_s.get("canary") for s in run),
            saved_stable=_median(s.gpu_s_saved_per_s.get("stable") for s in run),
            saved_canary=_median(s.gpu_s_saved_per_s.get("canary") for s in run),
        )
        for run in runs
    ]


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.0f}ms"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def _rate(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _pair(a: str, b: str) -> str:
    return f"{a} / {b}"


def _at(t: float) -> str:
    return format_duration(t) if t >= 1 else "0s"


def _sections(timeline: Timeline) -> tuple[list[str], list[tuple[str, list[list[str]]]]]:
    """The summary's paragraphs and titled tables, shared by the Markdown and the HTML."""
    verdict = {True: "as expected", False: "NOT as expected", None: "still running"}[timeline.ok]
    paragraphs = [
        f"Ended **{timeline.outcome or 'unknown'}** after {_at(timeline.duration)} ({verdict}; "
        f"expected {timeline.expected or 'n/a'}).",
        f"Ladder: {' → '.join(timeline.ladder)}. {len(timeline.samples)} samples, {len(timeline.decisions)} decisions.",
    ]
    for d in timeline.rollbacks:
        paragraphs.append(f"**{d.decision}** at {_at(d.t)} ({d.reason}), landing on {d.stage}: {d.message}")
    if not timeline.rollbacks:
        paragraphs.append("No rollback.")
    paragraphs.extend(timeline.notes)
    decisions = [["time", "stage", "decision", "reason", "message"]] + [
        [_at(d.t), d.stage, f"**{d.decision}**" if d.is_rollback else d.decision, d.reason, d.message]
        for d in timeline.decisions
    ]
    stages = [
        ["from", "to", "stage", "phase", "p99 TTFT stable", "p99 TTFT canary", "ext. share stable", "ext. share canary"]
    ]
    bought = [
        [
            "from",
            "to",
            "stage",
            "p50 TTFT stable / canary",
            "tokens avoided/s stable / canary",
            "GPU-s saved/s stable / canary",
        ]
    ]
    for f in stage_figures(timeline.samples):
        times = [_at(f.start), _at(f.end), f.stage, f.phase]
        stages.append([*times, _ms(f.ttft_stable), _ms(f.ttft_canary), _pct(f.share_stable), _pct(f.share_canary)])
        bought.append(
            [
                *times[:3],
                _pair(_ms(f.ttft_p50_stable), _ms(f.ttft_p50_canary)),
                _pair(_rate(f.avoided_stable), _rate(f.avoided_canary)),
                _pair(_rate(f.saved_stable, 3), _rate(f.saved_canary, 3)),
            ]
        )
    return paragraphs, [
        ("Decisions", decisions),
        ("Medians per stage", stages),
        ("What offload bought (medians per stage)", bought),
    ]


def summary_json(timeline: Timeline) -> dict[str, Any]:
    """The per-stage figures as ``kvoffload demo -o json`` carries them in its ``summary``."""
    return {"stages": [{**asdict(f), "seconds": round(f.seconds, 2)} for f in stage_figures(timeline.samples)]}


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def markdown(timeline: Timeline, png_name: str = PNG_NAME) -> str:
    """The summary as Markdown, linking the PNG next to it."""
    paragraphs, tables = _sections(timeline)
    out = [f"# kvoffload demo: {timeline.scenario} ({timeline.policy})", ""]
    for p in paragraphs:
        out += [p, ""]
    out += [f"![{PNG_ALT}]({png_name})", ""]
    for title, rows in tables:
        out += [f"## {title}", "", "| " + " | ".join(rows[0]) + " |", "|" + "---|" * len(rows[0])]
        out += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in rows[1:]]
        out.append("")
    return "\n".join(out)


def _inline(text: str) -> str:
    """Escape, then turn the Markdown **bold** of the shared sections into <strong>."""
    parts = html.escape(text).split("**")
    return "".join(f"<strong>{p}</strong>" if i % 2 else p for i, p in enumerate(parts))


def html_report(timeline: Timeline, png: bytes) -> str:
    """The summary as one self-contained HTML page, the PNG inlined."""
    paragraphs, tables = _sections(timeline)
    title = html.escape(f"kvoffload demo: {timeline.scenario} ({timeline.policy})")
    body = [f"<h1>{title}</h1>"]
    body += [f"<p>{_inline(p)}</p>" for p in paragraphs]
    image = base64.b64encode(png).decode()
    body.append(f'<img alt="{PNG_ALT}" src="data:image/png;base64,{image}">')
    for name, rows in tables:
        head = "".join(f"<th>{html.escape(c)}</th>" for c in rows[0])
        cells = "".join("<tr>" + "".join(f"<td>{_inline(c)}</td>" for c in row) + "</tr>" for row in rows[1:])
        body.append(f"<h2>{html.escape(name)}</h2><table><tr>{head}</tr>{cells}</table>")
    style = (
        "body{font-family:sans-serif;max-width:1250px;margin:2em auto}img{max-width:100%}"
        "table{border-collapse:collapse;font-size:90%}td,th{border:1px solid #ccc;padding:3px 6px;text-align:left}"
    )
    return (
        f'<!doctype html><html><head><meta charset="utf-8"><title>{title}</title><style>{style}</style></head>'
        f"<body>{''.join(body)}</body></html>\n"
    )


@dataclass(frozen=True)
class ReportFiles:
    png: Path
    markdown: Path
    html: Path


def write_report(timeline: Timeline, out_dir: Path) -> ReportFiles:
    """Write ``timeline.png``, ``summary.md`` and ``report.html`` into ``out_dir`` (created if needed)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    png = plot(timeline, out_dir / PNG_NAME)
    md = out_dir / MARKDOWN_NAME
    md.write_text(markdown(timeline, PNG_NAME))
    page = out_dir / HTML_NAME
    page.write_text(html_report(timeline, png.read_bytes()))
    return ReportFiles(png, md, page)
