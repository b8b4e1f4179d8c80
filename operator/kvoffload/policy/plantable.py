"""The table ``kvoffload plan`` prints: a header, one aligned row per ladder level, then the warnings."""

from __future__ import annotations

from kvoffload.api.quantity import format_bytes, format_duration
from kvoffload.policy.sizing import SizingPlan, format_tokens


def _shape(plan: SizingPlan) -> str:
    a = plan.architecture
    if a.kv_lora_rank is not None:
        return (
            f"MLA: {a.num_layers} layers × ({a.kv_lora_rank} + {a.qk_rope_head_dim or 0}) × "
            f"{plan.kv_dtype_bytes} B = {plan.kv_bytes_per_token:,} B/token"
        )
    return (
        f"2 × {a.num_layers} layers × {a.num_kv_heads} KV heads × {a.head_dim} head dim × {plan.kv_dtype_bytes} B "
        f"= {plan.kv_bytes_per_token:,} B/token"
    )


def _columns(rows: list[list[str]], right: set[int]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return [
        "  ".join(
            c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))
        ).rstrip()
        for r in rows
    ]


def format_plan(plan: SizingPlan) -> str:
    """The plan as a person reads it: a header, one aligned row per level, then the warnings."""
    lines = [f"Policy      {plan.policy}", f"Model       {plan.model}  ({plan.architecture_source})"]
    lines.append(f"KV          {_shape(plan)}")
    if plan.stored_bytes_per_token != plan.kv_bytes_per_token:
        lines.append(f"            {plan.stored_bytes_per_token:,} B/token across {plan.tensor_parallel_size} TP ranks")
    lines.append(f"Max prompt  {format_tokens(plan.max_model_len)} = {format_bytes(plan.max_model_len_bytes)} of KV")
    gpu = f"GPU         {plan.gpu_count} × {plan.gpu_class} ({format_bytes(plan.gpu_memory_bytes)} each)"
    if plan.gpu_kv_cache_bytes is not None and plan.weight_bytes is not None:
        gpu += (
            f"; KV cache ~{format_bytes(max(0, plan.gpu_kv_cache_bytes))} "
            f"(~{format_tokens(plan.gpu_kv_cache_tokens or 0)}) after ~{format_bytes(plan.weight_bytes)} of weights"
        )
    lines.append(gpu)
    lines.append(f"Host RAM    {format_bytes(plan.host_ram_per_replica_bytes)} per replica ({plan.host_ram_source})")
    lines.append("")
    rows = [["LEVEL", "TIERS", "CPU TIER", "HOLDS", "PINNED", "/DEV/SHM", "MEMORY REQ=LIMIT", "STARTUP", "DEADLINE"]]
    for lv in plan.levels:
        rows.append(
            [
                f"{lv.index} {lv.name}" + (" (canary only)" if lv.canary_only else ""),
                "+".join(lv.tiers) or "-",
                "-" if lv.cpu_bytes is None else format_bytes(lv.cpu_bytes),
                "-" if lv.cpu_tokens is None else format_tokens(lv.cpu_tokens),
                format_bytes(lv.pinned_bytes) if lv.pinned_bytes else "-",
                format_bytes(lv.shm_bytes) if lv.shm_bytes else "-",
                format_bytes(lv.memory_request_bytes),
                format_duration(lv.startup_seconds),
                format_duration(lv.progress_deadline_seconds),
            ]
        )
    lines += _columns(rows, right={2, 3, 4, 5, 6, 7, 8})
    top = plan.levels[-1].secondary_tiers
    if top:
        lines.append("")
        lines += [f"Tier {t.name}: {format_bytes(t.bytes)}, holds {format_tokens(t.tokens)}" for t in top]
    lines.append("")
    if plan.warnings:
        lines.append(f"Warnings ({len(plan.warnings)}):")
        lines += [f"  - {w}" for w in plan.warnings]
    else:
        lines.append("No warnings.")
    return "\n".join(lines)
