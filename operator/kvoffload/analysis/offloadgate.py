"""The offload rows ``assess()`` hands off: each secondary tier's chunk hits under tiering (``tierHitShare``),
and what the engines run and allocated against the level (``liveConfig``)."""

from __future__ import annotations

import math
from collections.abc import Callable

from kvoffload.analysis.measurements import VariantSample, _num, _ratio
from kvoffload.api.quantity import GIB
from kvoffload.engines.dialect import (
    LABEL_CPU_NUM_CHUNKS,
    LABEL_CPU_SIZE_BYTES,
    LABEL_OFFLOADING_BACKEND,
    LABEL_OFFLOADING_SIZE,
    LABEL_TIER,
    TIER_PRIMARY,
    secondary_tier_label,
)
from kvoffload.policy.ladder import Level

TIER_HIT_SHARE = "tierHitShare"
"""Prefix ``tierHitShare.<tier>``: chunk lookups that hit that tier under tiering (``0:primary``, ``1:fs``)."""


def _tier_hit_shares(
    add: Callable[..., None],
    subject: VariantSample,
    c: VariantSample,
    stable: VariantSample,
    level: Level,
    who: str,
    *,
    warmed_up: bool,
    enough: bool,
) -> None:
    """``tierHitShare.<tier>`` rows from the tiering chunk counters; each secondary tier of the level is gated."""
    if not (subject.tier_chunk_queries or c.tier_chunk_queries or stable.tier_chunk_queries):
        return
    secondary = {secondary_tier_label(i, t.type.value): t.name for i, t in enumerate(level.secondary_tiers)}
    seen = set(subject.tier_chunk_queries) | set(c.tier_chunk_queries) | set(stable.tier_chunk_queries)
    labels = [TIER_PRIMARY, *secondary, *sorted(seen - {TIER_PRIMARY, *secondary})]

    def share(sample: VariantSample, label: str) -> float | None:
        return _ratio(_num(sample.tier_chunk_hits.get(label, 0.0)), _num(sample.tier_chunk_queries.get(label)))

    for label in labels:
        name = f"{TIER_HIT_SHARE}.{label}"
        c_share, s_share = share(c, label), share(stable, label)
        if label not in secondary or not subject.tier_chunk_queries:
            if label in seen:
                add(name, c_share, s_share, None, None, f"chunk lookups that hit tier {label} (reported)", gated=False)
            continue
        if not warmed_up:
            add(name, c_share, s_share, 0.0, None, "warming up: gated after the first half of the step", gated=False)
            continue
        hits = _num(subject.tier_chunk_hits.get(label)) or 0.0
        looked_up = _num(subject.tier_chunk_queries.get(label)) or 0.0
        ok = hits > 0
        tier = f"tier {label} ({secondary[label]})"
        msg = (
            f"{who}: {tier} hit {hits:.0f} of {looked_up:.0f} chunk lookups ({hits / looked_up:.1%})"
            if ok
            else f"secondary {tier} was never hit on the {who} ({looked_up:.0f} chunk lookups): it does not pay"
        )
        add(name, c_share, s_share, 0.0, ok if enough else None, msg, gated=True)


def _cpu_series(sample: VariantSample) -> list[tuple[str, int, int]]:
    """(pod, allocated bytes, chunks) of each CPU-tier series of ``vllm:kv_offload_config_info``.

    Under tiering every tier has a series; only the primary one (``0:primary``) fills the CPU labels.
    """
    out = []
    for labels in sample.offload_allocated:
        if labels.get(LABEL_TIER, "") not in ("", TIER_PRIMARY):
            continue
        try:
            size, chunks = int(labels.get(LABEL_CPU_SIZE_BYTES, "")), int(labels.get(LABEL_CPU_NUM_CHUNKS, ""))
        except ValueError:
            continue
        out.append((labels.get("pod", ""), size, chunks))
    return out


def _allocated_bytes(sample: VariantSample) -> float | None:
    series = _cpu_series(sample)
    return float(min(size for _, size, _ in series)) if series else None


def _allocated_check(subject: VariantSample, level: Level, who: str) -> tuple[bool, float, str] | None:
    """Whether every engine allocated the rendered CPU tier: (ok, the figure reported, the message).

    vLLM 0.33 allocates ``cpu_bytes_to_use // chunk`` whole chunks (``CPUOffloadingSpec``), so an engine
    that honours the rendered size shows at most that size and less than one chunk under it. None where
    the subject shows no ``vllm:kv_offload_config_info`` (before 0.33, or no connector running).
    """
    series = _cpu_series(subject)
    if not series:
        return None
    rendered = level.cpu_bytes
    wrong: list[str] = []
    for pod, size, chunks in series:
        chunk = size // chunks if chunks > 0 else 0
        where = f"{who} pod {pod}" if pod else who
        if rendered is None:
            wrong.append(f"{where} allocated a {size} B CPU tier, but level {level.name} has none")
        elif size > rendered or chunks <= 0 or rendered - size >= chunk:
            wrong.append(
                f"{where} allocated {size} B ({chunks} chunks of {chunk} B) for the CPU tier, "
                f"rendered {rendered} B ({rendered / GIB:g} GiB) at level {level.name}"
            )
    if wrong:
        return False, float(series[0][1]), "ALLOCATED SIZE MISMATCH: " + "; ".join(wrong)
    sizes = sorted({size for _, size, _ in series})
    text = f"allocated CPU tier {', '.join(map(str, sizes))} B matches the rendered {rendered} B (to within a chunk)"
    return True, float(sizes[0]), text


def _live_config_message(subject: VariantSample, level: Level, who: str) -> str:
    """What vllm:cache_config_info says the subject runs, and whether it matches the level."""
    if not subject.config:
        return f"no cache config series for the {who}"
    size = subject.config.get(LABEL_OFFLOADING_SIZE, "None")
    backend = subject.config.get(LABEL_OFFLOADING_BACKEND, "None")
    seen = f"{who} runs {LABEL_OFFLOADING_SIZE}={size} {LABEL_OFFLOADING_BACKEND}={backend}"
    # Only the plain CPU-tier command line sets --kv-offloading-size; tiered levels use a connector config.
    if level.secondary_tiers:
        return seen
    if level.cpu_bytes is None:
        matches = size in ("None", "", "0", "0.0")
    else:
        try:
            matches = math.isclose(float(size), level.cpu_bytes / GIB, rel_tol=1e-3)
        except ValueError:
            matches = False
    return f"{seen}: {'matches' if matches else 'DOES NOT MATCH'} level {level.name}"
