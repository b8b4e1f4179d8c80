"""Estimated profiles: a measured profile scaled to another GPU class by its published figures (host link,
dense bf16 rate, HBM bandwidth, in ``gpuspec``).

Pure: standard library only, as ``profile`` is, so the calibration can import it on a GPU image."""

from __future__ import annotations

from dataclasses import dataclass

from kvoffload.economics.gpuspec import PUBLISHED_SPECS, GpuSpec
from kvoffload.economics.profile import (
    CurvePoint,
    DecodeCurve,
    Derivation,
    HitCost,
    PrefillCurve,
    Profile,
    ProfileError,
    Source,
    TransferPoint,
)


@dataclass(frozen=True)
class _Scale:
    link: float
    flops: float
    hbm: float


def derive_estimated(base: Profile, target: GpuSpec, *, date: str, command: str) -> Profile:
    """An ``estimated`` profile for ``target`` scaled from a ``measured`` one by published figures.

    - every transfer rate, both paths and both directions, by the host-link ratio (the link
      is what limits them on the measured class: the contiguous copy reaches most of it);
    - prefill times by the inverse of the dense bf16 ratio (long prompts are compute-bound;
      the short ones' fixed cost is scaled too, which overstates the gain of a faster part);
    - decode ITL by the inverse of the HBM ratio (a decode step reads the weights and the KV);
    - host costs (pinning, submit per page, the per-layer pointer fill, the fixed restore cost, block hashing)
      are the base host's; the memory bandwidth is the target's published one;
    - a model whose weights take over 90% of the target's memory gets no curves.
    """
    if base.kind != "measured":
        raise ProfileError(f"derive from a measured profile, not {base.kind} {base.gpu_class}")
    base_spec = PUBLISHED_SPECS.get(base.gpu_class)
    if base_spec is None:
        raise ProfileError(f"no published figures for the base class {base.gpu_class!r}")
    s = _Scale(
        link=target.host_link_bytes_per_second / base_spec.host_link_bytes_per_second,
        flops=target.bf16_dense_flops / base_spec.bf16_dense_flops,
        hbm=target.hbm_bytes_per_second / base_spec.hbm_bytes_per_second,
    )
    fits = {c.model for c in base.prefill if c.shape.params * 2 <= 0.9 * target.memory_bytes}
    prefill = tuple(
        PrefillCurve(
            c.model,
            c.shape,
            tuple(CurvePoint(p.x, p.seconds / s.flops) for p in c.points),
            tuple(CurvePoint(p.x, p.seconds / s.flops) for p in c.held_out),
            c.mode,
        )
        for c in base.prefill
        if c.model in fits
    )
    decode = tuple(
        DecodeCurve(
            c.model, c.context_tokens, tuple(CurvePoint(p.x, p.seconds / s.hbm) for p in c.points), c.cuda_graph
        )
        for c in base.decode
        if c.model in fits
    )
    dropped = sorted({c.model for c in base.prefill} - fits)
    notes = [
        f"Estimated from the measured {base.gpu_class} profile, not measured on this class: transfer rates "
        f"× {s.link:.3g} (host link), prefill times × {1 / s.flops:.3g} (dense bf16), decode times × {1 / s.hbm:.3g} "
        "(HBM bandwidth).",
        "Pinning and per-page submit costs are the measured host's: they depend on the node's CPU and memory.",
    ]
    if dropped:
        notes.append(f"No curves for {', '.join(dropped)}: the bf16 weights take over 90% of one GPU's memory.")
    return Profile(
        gpu_class=target.gpu_class,
        kind="estimated",
        source=Source(
            device=target.product,
            driver="",
            torch="",
            cuda="",
            date=date,
            command=command,
            host=base.source.host,
        ),
        transfers=tuple(
            TransferPoint(t.direction, t.path, t.page_bytes, t.pages, t.bytes_per_second * s.link)
            for t in base.transfers
        ),
        bidirectional_bytes_per_second=base.bidirectional_bytes_per_second * s.link,
        pinning=base.pinning,
        restore=base.restore,
        hit=HitCost(hash_seconds_per_block=base.hit.hash_seconds_per_block, source=base.hit.source),
        prefill=prefill,
        decode=decode,
        restore_checks=(),
        derivation=Derivation(
            base_profile=base.gpu_class,
            base_spec=base_spec,
            target_spec=target,
            method="transfers × host-link ratio; prefill ÷ dense bf16 ratio; decode ÷ HBM ratio; host costs kept",
        ),
        notes=tuple(notes),
    )
