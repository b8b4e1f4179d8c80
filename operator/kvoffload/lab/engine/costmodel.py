"""What a request's prefill costs, by where its prompt blocks come from.

Default constants reproduce the seed measurement (docs/design.md, "Seed figures") (Qwen3-0.6B, 114,688 KV
bytes per token, vLLM 0.31 on a laptop Ada GPU, 1,480-token prompt):

- cold: 77.3 ms = fixed overhead + 1,480 tokens at ~23,000 tokens/s;
- GPU prefix hit: ~14 ms, the fixed overhead plus the few tokens past the last full block;
- restored from the CPU tier: 35.1 ms = fixed overhead + 170 MB at ~12.6 GB/s
  (13.5 ms) + one extra scheduler step while the asynchronous load lands,
  + the remainder's compute.

The fixed overhead (13 ms) and the restore step (8.5 ms) are not measured;
they are what the three measured figures leave once the stated rates are taken out.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CostModel:
    """Rates and fixed costs of one engine (seconds, bytes, tokens)."""

    prefill_tokens_per_s: float = 23_000.0
    """Recompute (prefill) throughput."""
    base_s: float = 0.013
    """Fixed per-request cost to the first token: scheduling, one forward pass, sampling."""
    cpu_restore_bytes_per_s: float = 12.6e9
    """Pinned host -> GPU transfer rate."""
    disk_restore_bytes_per_s: float = 3.0e9
    """Filesystem tier -> GPU rate (an NVMe read through the CPU tier)."""
    restore_step_s: float = 0.0085
    """Extra scheduler step a request waits for an asynchronous offload load."""
    store_bytes_per_s: float = 12.6e9
    """GPU -> host store rate (stores run asynchronously; they do not delay the first token)."""
    itl_s: float = 0.010
    """Time between output tokens."""


@dataclass(frozen=True)
class Price:
    """The modelled time to first token of one request, and its parts."""

    ttft_s: float
    compute_s: float
    restore_s: float
    base_s: float
    computed_tokens: int
    cpu_restored_bytes: int
    disk_restored_bytes: int
    cpu_restore_s: float
    disk_restore_s: float


def price(
    model: CostModel,
    *,
    computed_tokens: int,
    cpu_restored_tokens: int,
    disk_restored_tokens: int,
    kv_bytes_per_token: int,
) -> Price:
    """Price a prefill that computes ``computed_tokens`` and restores the rest from the tiers.

    Tokens hit in the GPU cache cost nothing beyond the fixed overhead.
    """
    if min(computed_tokens, cpu_restored_tokens, disk_restored_tokens) < 0:
        raise ValueError("token counts must be >= 0")
    compute_s = computed_tokens / model.prefill_tokens_per_s
    cpu_bytes = cpu_restored_tokens * kv_bytes_per_token
    disk_bytes = disk_restored_tokens * kv_bytes_per_token
    cpu_s = cpu_bytes / model.cpu_restore_bytes_per_s
    disk_s = disk_bytes / model.disk_restore_bytes_per_s
    restore_s = cpu_s + disk_s + (model.restore_step_s if cpu_bytes or disk_bytes else 0.0)
    return Price(
        ttft_s=model.base_s + compute_s + restore_s,
        compute_s=compute_s,
        restore_s=restore_s,
        base_s=model.base_s,
        computed_tokens=computed_tokens,
        cpu_restored_bytes=cpu_bytes,
        disk_restored_bytes=disk_bytes,
        cpu_restore_s=cpu_s,
        disk_restore_s=disk_s,
    )
