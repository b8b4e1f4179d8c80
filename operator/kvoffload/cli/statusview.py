"""A person's view of one policy: what ``kvoffload status NAME`` prints.

Pure: it formats a policy object (as the API server returns it) and reads no
clock unless it is not given one. The status is read through
``KVOffloadPolicyStatus``, so a field the operator wrote is shown the way the
model means it; the spec is read leniently, since a person may look at a
policy whose spec is invalid.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from kvoffload.analysis.assess import format_metric_value, format_threshold
from kvoffload.analysis.confidence import format_evidence, format_needed
from kvoffload.api.conventions import PROGRESSING, READY, ROLLBACK_DECISIONS, Reason
from kvoffload.api.quantity import format_duration
from kvoffload.api.status import (
    AnalysisStatus,
    BaselineStatus,
    Condition,
    HistoryEntry,
    KVOffloadPolicyStatus,
    MetricResult,
    Percentiles,
    Phase,
    VariantStatus,
)
from kvoffload.rollout import conditions as cond

DONE = "✓"
FAILED = "✗"
HELD = "held: offload will not pay"
ARROW = " → "
DEFAULT_PROMOTION_STEPS = (25, 50, 100)
HISTORY_SHOWN = 10


def table(rows: Sequence[Sequence[str]], indent: str = "  ") -> list[str]:
    """Rows as left-aligned columns (the first row is the header); the last column is not padded."""
    if not rows:
        return []
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    out = []
    for row in rows:
        cells = [cell.ljust(w) for cell, w in zip(row[:-1], widths[:-1], strict=True)] + [row[-1]]
        out.append((indent + "  ".join(cells)).rstrip())
    return out


def age(then: datetime | None, now: datetime) -> str:
    """How long ago, e.g. ``3m12s``; ``-`` when unknown."""
    if then is None:
        return "-"
    return format_duration(max(0.0, (now - then).total_seconds()))


def parse_time(value: Any) -> datetime | None:
    """An RFC 3339 time as the API server writes it (``...Z``); None when absent or malformed."""
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


def promotion_steps(spec: Mapping[str, Any]) -> Sequence[int]:
    """The spec's promotion percentages, read leniently (the defaults when absent or malformed)."""
    steps = (spec.get("rollout") or {}).get("promotionSteps")
    if isinstance(steps, list) and all(isinstance(s, int) for s in steps):
        return steps
    return DEFAULT_PROMOTION_STEPS


def _step_label(step: int, steps: Sequence[int]) -> str:
    if step == 0:
        return "canary"
    return f"{steps[step - 1]}%" if 0 < step <= len(steps) else f"step {step}"


def rolled_back_level(history: Sequence[HistoryEntry]) -> str | None:
    """The level the latest rollback took away: the stage of the decision just before it."""
    for i in range(len(history) - 1, 0, -1):
        if history[i].decision in ROLLBACK_DECISIONS:
            return history[i - 1].stage
    return None


def position(status: KVOffloadPolicyStatus, steps: Sequence[int] = DEFAULT_PROMOTION_STEPS) -> str:
    """Where the rollout stands on the current level: baseline, canary, a percentage, ✓ at rest; paused added."""
    if status.stage is None:
        return ""
    if status.canary is not None:
        where = _step_label(status.stage.step, steps)
    elif status.phase is Phase.BASELINE or (status.phase is Phase.PAUSED and _in_baseline(status)):
        where = "baseline"
    elif status.phase is Phase.STABLE:
        where = DONE
    elif status.phase is Phase.HELD:
        where = HELD
    else:
        where = ""
    if status.phase is Phase.PAUSED:
        where = f"{where} paused".strip()
    return where


def step_text(status: KVOffloadPolicyStatus, steps: Sequence[int] = DEFAULT_PROMOTION_STEPS) -> str:
    """The step within the current level, short: ``baseline``, ``canary``, ``50%``, ``✓``, ``held``, ``paused``..."""
    return position(status, steps).replace(HELD, "held") or "-"


def ladder_line(status: KVOffloadPolicyStatus, steps: Sequence[int] = DEFAULT_PROMOTION_STEPS) -> str:
    """The ladder with the current position marked, e.g. ``gpu-only ✓ → cpu-pilot ✓ → [cpu 50%] → nvme``.

    Levels below the current stage are done (✓); the current one is in brackets with
    where it is (baseline, canary, the promotion percentage, ✓ when stable at the top);
    after a rollback the level taken away is marked ✗.
    """
    if not status.ladder:
        return "-"
    if status.stage is None:
        return ARROW.join(status.ladder)
    current = status.stage.index
    failed = rolled_back_level(status.history) if status.phase is Phase.ROLLED_BACK else None
    where = position(status, steps)
    parts: list[str] = []
    for index, name in enumerate(status.ladder):
        if index < current:
            parts.append(f"{name} {DONE}")
        elif index == current:
            parts.append(f"[{name} {where}]" if where else f"[{name}]")
        elif name == failed:
            parts.append(f"{name} {FAILED}")
        else:
            parts.append(name)
    return ARROW.join(parts)


def _in_baseline(status: KVOffloadPolicyStatus) -> bool:
    progressing = cond.find(status.conditions, PROGRESSING)
    return progressing is not None and progressing.reason == Reason.BASELINE_RUNNING


def _variant_rows(status: KVOffloadPolicyStatus) -> list[list[str]]:
    rows = [["VARIANT", "LEVEL", "TIERS", "CPU TIER", "READY/DESIRED", "CONFIG"]]
    pairs: list[tuple[str, VariantStatus | None]] = [("stable", status.stable), ("canary", status.canary)]
    for who, variant in pairs:
        if variant is None:
            continue
        name = status.ladder[variant.level] if 0 <= variant.level < len(status.ladder) else f"level {variant.level}"
        rows.append(
            [
                who,
                f"{variant.level} {name}",
                "+".join(variant.tiers) or "none",
                variant.cpu_size or "-",
                f"{variant.ready}/{variant.replicas}",
                variant.config_hash,
            ]
        )
    return rows


def _seconds(value: float | None) -> str:
    return "-" if value is None else format_duration(value)


def _baseline_line(baseline: BaselineStatus, now: datetime) -> str:
    rate = "-" if baseline.request_rate is None else f"{baseline.request_rate:.2f} req/s"
    usage = "-" if baseline.gpu_kv_usage is None else f"{baseline.gpu_kv_usage:.0%}"
    return (
        f"p99 TTFT {_seconds(baseline.ttft_p99)}, p99 ITL {_seconds(baseline.itl_p99)}, {rate}, "
        f"GPU KV usage {usage} (taken {age(baseline.taken_at, now)} ago)"
    )


def _latency(value: float | None) -> str:
    """Milliseconds below a second; above, seconds to two decimals (``format_duration`` rounds to whole ones)."""
    if value is None:
        return "-"
    return format_duration(value) if value < 1 else f"{value:.2f}s"


def _workload_line(b: BaselineStatus) -> str | None:
    """The baseline's workload figures, when it recorded them."""
    parts: list[str] = []

    def pct(p: Percentiles | None, show: Callable[[float | None], str]) -> str | None:
        return None if p is None else f"{show(p.p50)} / {show(p.p95)} / {show(p.p99)}"

    for label, p, show in (
        ("prompt tokens", b.prompt_tokens, lambda v: "-" if v is None else f"{v:,.0f}"),
        ("TTFT", b.ttft, _latency),
        ("ITL", b.itl, _latency),
        ("end-to-end", b.e2e_latency, _latency),
    ):
        if (text := pct(p, show)) is not None:
            parts.append(f"{label} {text}")
    if b.concurrency is not None:
        parts.append(f"{b.concurrency:.1f} running per engine")
    if b.prefix_cache_hit_rate is not None:
        parts.append(f"prefix-cache hits {b.prefix_cache_hit_rate:.1%}")
    if b.gpu_kv_usage_max is not None:
        parts.append(f"max GPU KV usage {b.gpu_kv_usage_max:.0%}")
    if b.preemption_rate is not None:
        parts.append(f"{b.preemption_rate:.3g} preemptions/s")
    return f"p50 / p95 / p99 {', '.join(parts)}" if parts else None


def _analysis_lines(analysis: AnalysisStatus, now: datetime) -> list[str]:
    head = f"Last analysis: {analysis.verdict.value} {age(analysis.time, now)} ago"
    streaks = (
        f"failures in a row {analysis.consecutive_failures}, inconclusive in a row {analysis.consecutive_inconclusive}"
    )
    if analysis.failing_since is not None:
        streaks += f", failing for {age(analysis.failing_since, now)}"
    lines = [f"{head} ({streaks})"]
    if analysis.message:
        lines.append(f"  {analysis.message}")
    if analysis.metrics:
        lines.extend(table(metric_rows(analysis.metrics)))
    return lines


def metric_rows(metrics: Sequence[MetricResult]) -> list[list[str]]:
    """The metric table of ``kvoffload status`` and ``kvoffload analyze``, header first. EVIDENCE (how sure: the
    interval, the p-value against alpha) is a column only when some row has any, so a table without reads as
    before; the requests an Inconclusive row would need go after its WHY, where it does not say them."""
    evidence = [format_evidence(m) for m in metrics]
    shown = any(evidence)
    rows = [["METRIC", "CANARY", "STABLE", "THRESHOLD", "RESULT", *(["EVIDENCE"] if shown else []), "WHY"]]
    for m, sure in zip(metrics, evidence, strict=True):
        rows.append(
            [
                m.name,
                format_metric_value(m.name, m.canary),
                format_metric_value(m.name, m.stable),
                format_threshold(m.name, m.threshold),
                {True: "pass", False: "FAIL", None: "-"}[m.passed],
                *([sure or "-"] if shown else []),
                _why(m),
            ]
        )
    return rows


def _why(m: MetricResult) -> str:
    """The row's message, then the requests an Inconclusive breach would need unless the message names them."""
    n = m.requests_needed
    # The built-in gates' messages may say it already ("about 640 canary requests would settle it"): say it once.
    if n is None or str(n) in m.message or f"{n:,}" in m.message:
        return m.message
    return f"{m.message}; {format_needed(m)}" if m.message else format_needed(m)


def _condition_rows(conditions: Sequence[Condition], now: datetime) -> list[list[str]]:
    rows = [["TYPE", "STATUS", "REASON", "SINCE", "MESSAGE"]]
    for c in conditions:
        rows.append([c.type, c.status, c.reason, f"{age(c.last_transition_time, now)} ago", c.message])
    return rows


def _history_rows(history: Sequence[HistoryEntry]) -> list[list[str]]:
    rows = [["TIME", "STAGE", "DECISION", "REASON", "MESSAGE"]]
    for h in history:
        rows.append([h.time.astimezone(UTC).strftime("%H:%M:%SZ"), h.stage, h.decision, h.reason, h.message])
    return rows


def render(policy_obj: Mapping[str, Any], now: datetime | None = None) -> str:
    """The status of one policy object as text for a terminal.

    Raises pydantic's ValidationError when ``status`` does not fit ``KVOffloadPolicyStatus``.
    ``now`` defaults to the current time (ages are relative to it).
    """
    now = now or datetime.now(UTC)
    meta = policy_obj.get("metadata") or {}
    spec = policy_obj.get("spec") or {}
    name = f"{meta.get('namespace', 'default')}/{meta.get('name', '?')}"
    created = parse_time(meta.get("creationTimestamp"))
    raw = policy_obj.get("status")
    if not raw or "phase" not in raw:
        return (
            f"{name}: no status yet (age {age(created, now)}): the operator has not acted on it; "
            "is `kvoffload run` running and watching this namespace?"
        )
    status = KVOffloadPolicyStatus.model_validate(raw)
    generation = meta.get("generation")
    lines: list[str] = []
    header = f"{name}  phase {status.phase.value}"
    if status.stage is not None:
        header += f"  stage {status.stage.index} {status.stage.name}"
        where = position(status, promotion_steps(spec))
        header += f" ({where + ', ' if where else ''}for {age(status.stage.started_at, now)})"
    header += f"  age {age(created, now)}"
    lines.append(header)
    if generation is not None and status.observed_generation is not None and generation != status.observed_generation:
        lines.append(f"  (spec generation {generation} not yet acted on; status is for {status.observed_generation})")
    if status.message:
        lines.append(f"  {status.message}")
    lines += ["", f"Ladder: {ladder_line(status, promotion_steps(spec))}"]
    if status.stable is not None or status.canary is not None:
        lines += ["", "Variants:", *table(_variant_rows(status))]
    lines.append("")
    lines.append(
        f"Baseline: {_baseline_line(status.baseline, now) if status.baseline is not None else 'not taken yet'}"
    )
    if status.baseline is not None and (workload := _workload_line(status.baseline)) is not None:
        lines.append(f"  workload: {workload}")
    if status.preflight is not None:
        pf = status.preflight
        lines.append(f"Preflight ({age(pf.judged_at, now)} ago): {pf.message}")
    lines.append("")
    lines += _analysis_lines(status.last_analysis, now) if status.last_analysis is not None else ["Last analysis: none"]
    if status.host_memory is not None:
        hm = status.host_memory
        lines += [
            "",
            f"Host memory per replica: pinned {hm.pinned}, /dev/shm {hm.shm}, request {hm.request}, limit {hm.limit}",
        ]
    if status.conditions:
        lines += ["", "Conditions:", *table(_condition_rows(status.conditions, now))]
    if status.history:
        shown = status.history[-HISTORY_SHOWN:]
        more = f", {len(status.history) - len(shown)} older not shown" if len(shown) < len(status.history) else ""
        lines += ["", f"History (oldest first{more}):", *table(_history_rows(shown))]
    return "\n".join(lines)


def short_age(then: datetime | None, now: datetime) -> str:
    """An age as kubectl prints one: ``45s``, ``3m12s``, ``42m``, ``5h3m``, ``30h``, ``3d4h``, ``40d``, ``3y``."""
    if then is None:
        return "<unknown>"
    seconds = max(0, int((now - then).total_seconds()))
    minutes, hours, days = seconds // 60, seconds // 3600, seconds // 86400
    if seconds < 120:
        return f"{seconds}s"
    if minutes < 10:
        return f"{minutes}m{seconds % 60}s" if seconds % 60 else f"{minutes}m"
    if hours < 3:
        return f"{minutes}m"
    if hours < 8:
        return f"{hours}h{minutes % 60}m" if minutes % 60 else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    if days < 8:
        return f"{days}d{hours % 24}h" if hours % 24 else f"{days}d"
    if days < 365 * 2:
        return f"{days}d"
    return f"{days // 365}y"


LIST_COLUMNS = ("NAMESPACE", "NAME", "PHASE", "LEVEL", "STEP", "TIERS", "CANARY/STABLE", "P99 TTFT", "AGE")
WIDE_COLUMNS = ("READY", "REASON", "GENERATION", "MESSAGE")
"""What ``kvoffload list -o wide`` adds: the Ready condition and its reason, the generation the status is for
(``observed/stored``), and the status message."""


def list_entry(policy_obj: Mapping[str, Any], now: datetime) -> dict[str, Any]:
    """One policy as ``kvoffload list`` shows it. Lenient: a status this version cannot read shows its raw phase."""
    meta = policy_obj.get("metadata") or {}
    raw = policy_obj.get("status") or {}
    entry: dict[str, Any] = {
        "namespace": meta.get("namespace", ""),
        "name": meta.get("name", ""),
        "phase": str(raw.get("phase") or Phase.PENDING.value),
        "level": None,
        "levelName": "",
        "step": "-",
        "tiers": "",
        "canaryStable": "",
        "ttftP99": "",
        "age": short_age(parse_time(meta.get("creationTimestamp")), now),
        "generation": meta.get("generation"),
        "observedGeneration": raw.get("observedGeneration"),
        "message": str(raw.get("message") or ""),
        "ready": "",
        "reason": "",
    }
    try:
        status = KVOffloadPolicyStatus.model_validate(raw)
    except ValidationError:
        entry["step"] = "?"  # written by another version of the operator
        return entry
    if (ready := cond.find(status.conditions, READY)) is not None:
        entry["ready"], entry["reason"] = ready.status, ready.reason
    if "phase" in raw and status.stage is not None:
        entry["level"], entry["levelName"] = status.stage.index, status.stage.name
        entry["step"] = step_text(status, promotion_steps(policy_obj.get("spec") or {}))
    entry.update(tiers=status.tiers_summary, canaryStable=status.canary_summary, ttftP99=status.ttft_p99)
    return entry


def list_table(
    policies: Sequence[Mapping[str, Any]], now: datetime, *, namespaces: bool, wide: bool = False
) -> list[str]:
    """``kvoffload list``'s table: kubectl's layout, the NAMESPACE column only across namespaces, and
    :data:`WIDE_COLUMNS` after AGE with ``wide``."""
    header = list(LIST_COLUMNS if namespaces else LIST_COLUMNS[1:])
    rows: list[list[str]] = [header + list(WIDE_COLUMNS) if wide else header]
    for obj in policies:
        e = list_entry(obj, now)
        level = "-" if e["level"] is None else f"{e['level']} {e['levelName']}"
        cells = [e["name"], e["phase"], level, e["step"], e["tiers"] or "-", e["canaryStable"] or "-"]
        cells += [e["ttftP99"] or "-", e["age"]]
        if wide:
            seen, stored = e["observedGeneration"], e["generation"]
            generation = f"{'-' if seen is None else seen}/{'-' if stored is None else stored}"
            cells += [e["ready"] or "-", e["reason"] or "-", generation, e["message"] or "-"]
        rows.append([e["namespace"], *cells] if namespaces else cells)
    return table(rows, indent="")


def to_json(policy_obj: Mapping[str, Any]) -> dict[str, Any]:
    """What ``kvoffload status -o json`` prints: the policy's identity and its status as the model reads it."""
    meta = policy_obj.get("metadata") or {}
    raw = policy_obj.get("status")
    status = KVOffloadPolicyStatus.model_validate(raw) if raw else None
    return {
        "name": meta.get("name"),
        "namespace": meta.get("namespace"),
        "generation": meta.get("generation"),
        "status": status.model_dump(mode="json", by_alias=True, exclude_none=True) if status is not None else None,
    }
