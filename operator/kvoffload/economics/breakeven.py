"""Does restoring a prompt's KV from the CPU tier beat recomputing it? The break-even on one GPU class's profile.

``recomputeMs`` is the profile's prefill time of the whole prompt from nothing cached;
``restoreMs`` is what loading the prompt's KV from pinned host memory costs the way
vLLM 0.32 moves it: one layer's K and V of one 16-token block per page, by the Triton
zero-copy kernel below 28 KiB and by one batched DMA otherwise, with the host's pointer
fill per layer and submit cost per page before the copy, and a fixed cost per restore
(see ``Profile.restore_seconds``). ``prefillMode`` says which implementation the
recompute figure stands for: ``eager`` (the default) is a PyTorch forward that launches
every kernel from the host, ``cuda_graph`` the same forward replayed, the GPU's time
alone; vLLM's own forward (fused kernels, graphs for small batches) lies between them. The ratio
is recompute / restore: above 1 a CPU hit is faster than a miss.

Pure: a profile and numbers in, numbers out. ``breakeven_for_model`` is the one helper
that asks the catalog for a model's KV bytes per token.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kvoffload.economics.profile import VLLM_BLOCK_TOKENS, Profile, ProfileError, TransferPath
from kvoffload.economics.profileload import shipped_profile

if TYPE_CHECKING:  # the calibration Job's image imports this module without pydantic
    from kvoffload.policy.sizing import SizingPlan

DEFAULT_PROMPT_TOKENS = 1480
"""The typical prompt of the seed measurement (docs/design.md, "Seed figures"), used when a policy names none."""


@dataclass(frozen=True)
class Breakeven:
    """Recompute against restore for one prompt of one model on one profile."""

    model: str
    prompt_tokens: int
    kv_bytes_per_token: int
    page_bytes: int
    path: str
    """The load path priced: vLLM's choice for the page size, or the one asked for."""
    recompute_ms: float
    restore_ms: float
    profile: str
    profile_kind: str
    prefill_mode: str

    @property
    def ratio(self) -> float:
        """Recompute time / restore time: how many times faster a CPU-tier hit is than a miss."""
        return self.recompute_ms / self.restore_ms if self.restore_ms > 0 else math.inf

    @property
    def pays(self) -> bool:
        """Whether restoring is faster than recomputing."""
        return self.ratio > 1.0

    def to_json(self) -> dict[str, Any]:
        """The ``economics`` object of ``kvoffload plan -o json`` (issue 11)."""
        return {
            "promptTokens": self.prompt_tokens,
            "recomputeMs": round(self.recompute_ms, 3),
            "restoreMs": round(self.restore_ms, 3),
            "ratio": round(self.ratio, 2),
            "profile": {"name": self.profile, "kind": self.profile_kind},
            "pageBytes": self.page_bytes,
            "path": self.path,
            "prefillMode": self.prefill_mode,
        }


def vllm_page_bytes(kv_bytes_per_token: int, layers: int, block_tokens: int = VLLM_BLOCK_TOKENS) -> int:
    """Bytes of one page vLLM moves: one layer's K and V of one block.

    vLLM 0.32's offloading connector asks for the ``LBHNC`` KV cache layout
    (``OffloadingConnector.get_required_kvcache_layout``): layer outermost, then block, with
    each token's K and V side by side within the block. Its worker registers one
    ``(num_blocks, page)`` tensor per layer (``offloading/worker.py``, ``register_kv_caches``),
    with the page of the layer's ``AttentionSpec``: ``kv_heads × block × (head_dim + head_dim_v)
    × dtype`` (``kv_cache_interface.py``). So a block is ``layers`` pages of ``block ×
    kv_bytes_per_token / layers`` bytes: 64 KiB for every Qwen3 (8 KV heads of 128, bf16).
    """
    if layers < 1 or kv_bytes_per_token < 1:
        raise ValueError("layers and kv_bytes_per_token must be >= 1")
    return block_tokens * kv_bytes_per_token // layers


def breakeven(
    profile: Profile,
    model: str,
    kv_bytes_per_token: int,
    prompt_tokens: int = DEFAULT_PROMPT_TOKENS,
    *,
    page_bytes: int | None = None,
    path: TransferPath | None = None,
    prefill_mode: str = "eager",
) -> Breakeven:
    """Recompute against restore of a ``prompt_tokens`` prompt of ``model`` on ``profile``.

    ``page_bytes`` defaults to vLLM's page for the model's shape in the profile. With
    ``path`` the restore is priced as bytes / that path's bandwidth alone (``contiguous``
    gives the link's best, what a figure like "55 GB/s" assumes), without vLLM's
    per-page and fixed costs.
    """
    if prompt_tokens < 1:
        raise ValueError("prompt_tokens must be >= 1")
    curve = profile.prefill_curve(model, prefill_mode)
    if page_bytes is None:
        page_bytes = vllm_page_bytes(kv_bytes_per_token, curve.shape.layers)
    nbytes = prompt_tokens * kv_bytes_per_token
    if path is None:
        restore_s = profile.restore_seconds(nbytes, page_bytes, curve.shape.layers)
        priced: str = profile.load_path(page_bytes, math.ceil(nbytes / page_bytes))
    else:
        size = nbytes if path == "contiguous" else page_bytes
        restore_s = nbytes / profile.bandwidth("h2d", path, size)
        priced = path
    return Breakeven(
        model=curve.model,
        prompt_tokens=prompt_tokens,
        kv_bytes_per_token=kv_bytes_per_token,
        page_bytes=page_bytes,
        path=priced,
        recompute_ms=profile.prefill_seconds(model, prompt_tokens, prefill_mode) * 1e3,
        restore_ms=restore_s * 1e3,
        profile=profile.gpu_class,
        profile_kind=profile.kind,
        prefill_mode=prefill_mode,
    )


def breakeven_for_model(
    profile: Profile,
    model: str,
    prompt_tokens: int = DEFAULT_PROMPT_TOKENS,
    **options: Any,
) -> Breakeven:
    """``breakeven`` with the KV bytes per token of a catalog model (bf16 KV, one copy, no TP)."""
    # Imported here: the calibration Job's image imports this package without pydantic.
    from kvoffload.policy.catalog import find_model
    from kvoffload.policy.kvshape import bytes_per_token

    entry = find_model(model)
    if entry is None:
        raise ProfileError(f"{model!r} is not in the catalog: pass its KV bytes per token to breakeven()")
    arch = entry.architecture
    return breakeven(profile, entry.name, bytes_per_token(arch, arch.dtype_bytes), prompt_tokens, **options)


def plan_economics(plan: SizingPlan, prompt_tokens: int = DEFAULT_PROMPT_TOKENS) -> dict[str, Any]:
    """``kvoffload plan``'s ``economics``: recompute against restore on the policy's GPU class.

    Priced with the shipped profile of the class (measured or estimated) and the KV bytes one
    GPU holds per token. ``{"error": why}`` when the class has no profile or the profile has no
    prefill curve for the model: the plan stays useful, and says what is missing.
    """
    try:
        profile = shipped_profile(plan.gpu_class)
        result = breakeven(profile, plan.model, plan.kv_bytes_per_token, prompt_tokens)
    except ProfileError as exc:
        return {"error": str(exc)}
    return result.to_json()
