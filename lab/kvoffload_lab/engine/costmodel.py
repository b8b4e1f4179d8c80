"""What a request's prefill costs, by where its prompt blocks come from: the seed's laptop, or a GPU class's profile.

**With a GPU class** (``kvoffload emulate --gpu-class NAME``) every cost comes from the class's
shipped profile (``kvoffload.economics.profile``) and the served model's curves in it:

- compute: the profile's prefill curve (``eager``, the mode ``kvoffload plan``'s break-even
  uses) over prompt length. A miss of ``n`` tokens costs ``prefill(n)``; ``c`` tokens computed
  after ``h`` cached ones cost ``prefill(1) + prefill(h + c) - prefill(h)``: the forward's fixed
  cost plus the curve's growth over the whole context, so attention over the cached part counts;
- a restore from the CPU tier: ``Profile.restore_seconds`` at the page vLLM moves (one layer's K and V
  of one block): bytes / the bandwidth of vLLM's load path at that page size, plus the
  host's pointer fill per layer and submit cost per page, both before the copy, and a fixed cost;
  plus one engine step (the decode step at batch 1) the request waits while its asynchronous load lands;
- a hit (issue 25): the cached K/V read once at the class's memory bandwidth (the short query over
  the cached context is memory-bound), and vLLM's block hashing of the prompt (the profile's host
  time per block, paid by every request); a full hit recomputes its whole last block, as vLLM does;
- ITL: the profile's decode curve at the batch of requests running when the request arrives
  (``itl_s`` is the batch-1 figure);
- stores: bytes / the device-to-host batched DMA rate at the page size;
- no fixed cost per request beyond the curve's own (the API server's overhead is not priced),
  and the filesystem tier keeps the laptop's 3 GB/s (no profile measures it).

Tensor parallelism ``t``: every rank holds ``1/t`` of the KV heads and of the weights, and the
ranks work at once. The compute above the forward's fixed cost ``prefill(1)`` is divided by ``t``
(the fixed launch cost is not); a restore moves ``1/t`` of the bytes per rank in pages ``1/t``
the size, each rank over its own link; ITL is divided by ``t`` (a decode step reads the weights).
The all-reduces between ranks are not priced, so TP > 1 is optimistic.

**Without a class** the seed's laptop (docs/design.md, "Seed figures": Qwen3-0.6B, vLLM 0.31 on a
laptop Ada GPU) prices it:

- compute: the FLOPs of the model's shape at one effective rate ``prefill_flops_per_s``:
  ``2 × non-embedding params`` per token plus ``4 × layers × query heads × head_dim`` per
  (query, key) pair of causal attention, the cached context included;
- a fixed cost per request ``base_s`` (scheduling, the API server, sampling);
- a hit's cached K/V read at ``LAPTOP_HBM_BYTES_PER_S`` and the block hashing at the H200 host's time per
  block (borrowed, as the pinning is), both in the fit below;
- a restore: bytes at the measured 12.6 GB/s plus ``restore_step_s``, the engine step the
  request waits for the asynchronous load.

Measured (seed): 12.6 GB/s. Fitted, on the 1,480-token figures only (``fit_laptop``):
``prefill_flops_per_s`` and ``base_s`` from the cold (77.3 ms) and GPU-hit (14 ms) figures,
``restore_step_s`` from the CPU-restore figure (35.1 ms). The 3,200-token figures (174.7 ms cold,
18.9 ms GPU hit) are held out: ``tests/lab/test_emulator_pricing.py`` checks the prediction against
them (cold 178.5 ms, +2.2%; GPU hit 15.7 ms, -17.0%: the read, the hashing and the recomputed last
block grow the hit with the cached length; before issue 25 it was 13.7 ms, -28%).
ITL stays the seed emulator's flat 10 ms (not a seed figure).
A model whose shape no shipped profile records is priced with Qwen3-0.6B's shape (logged).
Tensor parallelism on the laptop divides the FLOPs and the restored bytes by ``t`` (each rank its own link).
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from kvoffload.economics.breakeven import vllm_page_bytes
from kvoffload.economics.profile import ModelShape, Profile, ProfileError
from kvoffload.economics.profileload import shipped_profile, shipped_profile_names

log = logging.getLogger("kvoffload.emulate")

QWEN3_0_6B: Final = ModelShape(
    layers=28, hidden=1024, intermediate=3072, heads=16, kv_heads=8, head_dim=128, vocab=151_936
)
"""The seed's model (Hugging Face Qwen/Qwen3-0.6B config.json)."""

PINNING_REFERENCE: Final = "nvidia-h200-141gb"
"""The measured profile whose host pinning rate and block-hash time, both-ways link factor and decode shape the
laptop borrows."""


PREFILL_MODE: Final = "eager"
"""The profile curve a class prices prefill with: the one ``kvoffload plan``'s break-even uses."""


@dataclass(frozen=True)
class PrefillFlops:
    """FLOPs of a dense decoder's prefill: a linear part per token, and attention per (query, key) pair."""

    linear_per_token: float
    attention_per_pair: float

    @classmethod
    def of(cls, shape: ModelShape) -> PrefillFlops:
        non_embedding = shape.params - shape.vocab * shape.hidden
        return cls(2.0 * non_embedding, 4.0 * shape.layers * shape.heads * shape.head_dim)

    def flops(self, computed: int, cached: int) -> float:
        """FLOPs of computing ``computed`` tokens after ``cached`` ones (causal attention over all of them)."""
        pairs = computed * cached + computed * (computed + 1) / 2
        return self.linear_per_token * computed + self.attention_per_pair * pairs


@dataclass(frozen=True)
class SeedFigures:
    """The seed's measured figures at one prompt length (docs/design.md, "Seed figures")."""

    prompt_tokens: int
    cold_s: float
    gpu_hit_s: float
    cpu_restore_s: float | None = None


SEED_FIT: Final = SeedFigures(1480, cold_s=0.0773, gpu_hit_s=0.014, cpu_restore_s=0.0351)
"""What the laptop profile is fitted on."""
SEED_HELD_OUT: Final = SeedFigures(3200, cold_s=0.1747, gpu_hit_s=0.0189)
"""What it is checked against, never fitted on."""
SEED_KV_BYTES_PER_TOKEN: Final = 114_688
SEED_CPU_RESTORE_BYTES_PER_S: Final = 12.6e9
SEED_BLOCK_SIZE: Final = 16


def split_hit(prompt_tokens: int, cached_blocks: int, block_size: int) -> tuple[int, int]:
    """(cached, computed) tokens of a prompt whose ``cached_blocks`` leading blocks hit.

    vLLM caps a hit at ``max_cache_hit_length = num_tokens - 1`` whole blocks (``v1/core/kv_cache_manager.py``
    295): a full hit recomputes the whole last block, not one token."""
    cap = max(0, prompt_tokens - 1) // block_size * block_size
    cached = min(cached_blocks * block_size, cap)
    return cached, prompt_tokens - cached


LAPTOP_HBM_BYTES_PER_S: Final = 256e9
"""The laptop GPU's memory bandwidth. The seed names only "a laptop Ada GPU"; its 12.6 GB/s host link is a PCIe
Gen4 x8 one, which the RTX 4050, 4060 and 4070 Laptop GPUs have (192, 256 and 256 GB/s of GDDR6); the x16 parts
(4080 and 4090 Laptop: 432 and 576 GB/s) would reach about twice that rate. Chosen on that reading alone, before
the held-out hit was priced; docs/lab.md gives the hit at both ends of the range."""


def _reference_hash_s_per_block() -> float:
    """The laptop borrows the block-hash time of the measured H200 profile's host, as it borrows its pinning."""
    return shipped_profile(PINNING_REFERENCE).hit.hash_seconds_per_block


@dataclass(frozen=True)
class LaptopFit:
    """The laptop's free constants, fitted on the seed's 1,480-token figures."""

    prefill_flops_per_s: float
    base_s: float
    restore_step_s: float


def fit_laptop(
    flops: PrefillFlops | None = None,
    seed: SeedFigures = SEED_FIT,
    *,
    hbm_bytes_per_s: float = LAPTOP_HBM_BYTES_PER_S,
    hash_s_per_block: float | None = None,
) -> LaptopFit:
    """Solve the cold, GPU-hit and CPU-restore figures of ``seed`` for the three free constants.

    cold = base + hash(n) + F(n, 0) / rate; hit = base + hash(n) + read(h) + F(c, h) / rate, with (h, c)
    the GPU hit's split of the prompt in 16-token blocks, hash the block hashing every request pays and
    read(h) the cached K/V read once at the GPU's memory bandwidth; restore = hit + h × KV bytes / 12.6 GB/s + step.
    """
    f = flops or PrefillFlops.of(QWEN3_0_6B)
    hash_block = _reference_hash_s_per_block() if hash_s_per_block is None else hash_s_per_block
    n = seed.prompt_tokens
    cached, computed = split_hit(n, n // SEED_BLOCK_SIZE, SEED_BLOCK_SIZE)
    cold_flops, hit_flops = f.flops(n, 0), f.flops(computed, cached)
    read = cached * SEED_KV_BYTES_PER_TOKEN / hbm_bytes_per_s
    rate = (cold_flops - hit_flops) / (seed.cold_s - seed.gpu_hit_s + read)
    base = seed.cold_s - (n // SEED_BLOCK_SIZE) * hash_block - cold_flops / rate
    if seed.cpu_restore_s is None:
        raise ValueError("fit_laptop needs the CPU-restore figure")
    step = seed.cpu_restore_s - seed.gpu_hit_s - cached * SEED_KV_BYTES_PER_TOKEN / SEED_CPU_RESTORE_BYTES_PER_S
    return LaptopFit(rate, base, step)


_LAPTOP: Final = fit_laptop()
_SEED_FLOPS: Final = PrefillFlops.of(QWEN3_0_6B)


@dataclass(frozen=True)
class CostModel:
    """Rates and fixed costs of one engine (seconds, bytes, tokens): the laptop's, or a class profile's."""

    prefill_flops_per_s: float = _LAPTOP.prefill_flops_per_s
    """Laptop: effective prefill rate (fitted)."""
    flops: PrefillFlops = _SEED_FLOPS
    """Laptop: the served model's prefill FLOPs."""
    base_s: float = _LAPTOP.base_s
    """Fixed per-request cost to the first token (laptop: fitted; a class: 0, the curve holds the forward's own)."""
    cpu_restore_bytes_per_s: float = SEED_CPU_RESTORE_BYTES_PER_S
    """Pinned host -> GPU transfer rate (laptop: measured; a class: its load path at the page size, all ranks)."""
    disk_restore_bytes_per_s: float = 3.0e9
    """Filesystem tier -> GPU rate (an NVMe read through the CPU tier)."""
    restore_step_s: float = _LAPTOP.restore_step_s
    """Extra engine step a request waits for an asynchronous offload load (laptop: fitted; a class: ITL)."""
    store_bytes_per_s: float = SEED_CPU_RESTORE_BYTES_PER_S
    """GPU -> host store rate (stores run asynchronously; they do not delay the first token)."""
    itl_s: float = 0.010
    """Time between output tokens."""
    profile: Profile | None = None
    """The GPU class's profile; None prices as the seed's laptop."""
    model: str = ""
    """The model's name in ``profile``."""
    tensor_parallel_size: int = 1
    page_bytes: int = 0
    """Bytes of one page one rank moves (a class only)."""
    itl_given: bool = False
    """``--itl`` was given: it replaces the decode curve."""
    both_ways_factor: float = 0.0
    """Share of each direction's own rate left while loads and stores move at once (0: the H200's measured one)."""
    hbm_bytes_per_s: float = LAPTOP_HBM_BYTES_PER_S
    """GPU memory bandwidth a hit reads its cached K/V at (a class: its profile's)."""
    hash_s_per_block: float = -1.0
    """Host seconds of vLLM's block hash per full prompt block (a class: its profile's; < 0: the H200 host's)."""
    block_tokens: int = SEED_BLOCK_SIZE
    """Tokens of one KV block: the hashed unit."""
    layers: int = 0
    """Layers of the served model: the restore's pointer fill is per layer (a class only)."""
    kv_bytes_per_token: int = 0
    """The engine's KV bytes per token (all ranks): what a step's cached context reads (0: not priced)."""

    def cache_read_seconds(self, cached_tokens: int, kv_bytes_per_token: int) -> float:
        """Seconds a prefill over ``cached_tokens`` reads their K/V once at the GPU's memory bandwidth."""
        return max(0, cached_tokens) * kv_bytes_per_token / (self.hbm_bytes_per_s * self.tensor_parallel_size)

    def admission_seconds(self, prompt_tokens: int) -> float:
        """Host time before the engine can schedule a request: the fixed cost ``base_s`` and vLLM's block hashing."""
        return self.base_s + self.hash_seconds(prompt_tokens)

    def hash_seconds(self, prompt_tokens: int) -> float:
        """Host seconds vLLM spends hashing the full blocks of a ``prompt_tokens`` prompt (every request pays it)."""
        per_block = self.hash_s_per_block if self.hash_s_per_block >= 0 else _reference_hash_s_per_block()
        return (max(0, prompt_tokens) // self.block_tokens) * per_block

    @property
    def link_factor(self) -> float:
        """Both-ways rate over the sum of the one-way rates: the profile's, else the measured H200's (0.89)."""
        if self.both_ways_factor > 0:
            return self.both_ways_factor
        return both_ways_factor(self.profile or shipped_profile(PINNING_REFERENCE))

    def pin_seconds(self, nbytes: int) -> float:
        """Seconds to pin a CPU tier of ``nbytes`` at start: the profile's pinning, else the H200 host's (measured).

        Pinning is the host kernel's work (page faults and locking), not the GPU's; the laptop has no
        measurement, so it borrows the measured H200 host's rate."""
        return (self.profile or shipped_profile(PINNING_REFERENCE)).pin_seconds(nbytes)

    def step_seconds(self, chunks: Sequence[tuple[int, int]], decodes: int) -> float:
        """One engine step: prefill ``chunks`` of (computed, cached) tokens and one token for ``decodes`` sequences.

        The prefill chunks share one forward: a class's fixed cost ``prefill(1)`` is paid once per
        step, not per chunk (the laptop's FLOPs have none). The decode batch adds its ITL at that
        batch: a mixed step costs both, which overstates it somewhat (vLLM runs them in one forward).
        """
        total = 0.0
        if chunks:
            fixed = self._fixed_s()
            total = fixed + math.fsum(max(0.0, self.compute_seconds(c, h) - fixed) for c, h in chunks if c > 0)
            total += math.fsum(self.cache_read_seconds(h, self.kv_bytes_per_token) for c, h in chunks if c > 0)
        if decodes > 0:
            total += self.itl_seconds(decodes)
        return total

    def _fixed_s(self) -> float:
        if self.profile is None:
            return 0.0
        return self.profile.prefill_seconds(self.model, 1, PREFILL_MODE)

    def store_seconds(self, nbytes: int) -> float:
        """Seconds the link takes to store ``nbytes`` (all ranks, each over its own link) to the CPU tier alone."""
        if nbytes <= 0:
            return 0.0
        if self.profile is None:
            return nbytes / (self.store_bytes_per_s * self.tensor_parallel_size)
        return self.profile.store_seconds(-(-nbytes // self.tensor_parallel_size), self.page_bytes)

    def load_seconds(self, cpu_bytes: int, disk_bytes: int) -> float:
        """Seconds a load of ``cpu_bytes`` from the CPU tier and ``disk_bytes`` from the fs tier keeps the link busy."""
        return self.cpu_restore_seconds(cpu_bytes) + max(0, disk_bytes) / self.disk_restore_bytes_per_s

    @property
    def name(self) -> str:
        return "laptop (seed)" if self.profile is None else f"{self.profile.gpu_class} ({self.profile.kind})"

    def compute_seconds(self, computed: int, cached: int) -> float:
        """Seconds to compute ``computed`` prompt tokens after ``cached`` ones, beyond ``base_s``."""
        if computed <= 0:
            return 0.0
        p = self.profile
        if p is None:
            return self.flops.flops(computed, cached) / (self.prefill_flops_per_s * self.tensor_parallel_size)
        fixed = p.prefill_seconds(self.model, 1, PREFILL_MODE)
        if cached == 0:
            whole = p.prefill_seconds(self.model, computed, PREFILL_MODE)
        else:
            grow = p.prefill_seconds(self.model, cached + computed, PREFILL_MODE)
            grow -= p.prefill_seconds(self.model, cached, PREFILL_MODE)
            whole = fixed + max(0.0, grow)
        return fixed + max(0.0, whole - fixed) / self.tensor_parallel_size

    def itl_seconds(self, batch: int) -> float:
        """Seconds of one decode step with ``batch`` sequences.

        A class: its decode curve at that batch, divided by TP. ``--itl``: one flat figure. The laptop:
        the seed emulator's 10 ms at batch 1 (not a seed figure), growing with the batch as the
        measured H200 curve of Qwen3-0.6B grows (x1.15 at 8, x1.41 at 32, x2.53 at 128): the shape
        is borrowed, the laptop's own curve was never measured.
        """
        if self.itl_given:
            return self.itl_s
        if self.profile is None:
            return self.itl_s * _laptop_decode_growth(max(1, batch))
        return self.profile.decode_itl_seconds(self.model, max(1, batch)) / self.tensor_parallel_size

    def cpu_restore_seconds(self, nbytes: int) -> float:
        """Seconds to load ``nbytes`` (all ranks together) from the CPU tier, without the engine step."""
        if nbytes <= 0:
            return 0.0
        if self.profile is None:
            return nbytes / (self.cpu_restore_bytes_per_s * self.tensor_parallel_size)
        return self.profile.restore_seconds(-(-nbytes // self.tensor_parallel_size), self.page_bytes, self.layers)


def both_ways_factor(profile: Profile) -> float:
    """The profile's both-ways rate over the sum of its best one-way rates, at most 1."""
    one_way = profile.contiguous_h2d_bytes_per_second + profile.contiguous_d2h_bytes_per_second
    return min(1.0, profile.bidirectional_bytes_per_second / one_way)


@functools.cache
def _laptop_decode_growth(batch: int) -> float:
    ref = shipped_profile(PINNING_REFERENCE)
    model = QWEN3_0_6B_NAME
    return ref.decode_itl_seconds(model, batch) / ref.decode_itl_seconds(model, 1)


QWEN3_0_6B_NAME: Final = "Qwen/Qwen3-0.6B"


def laptop_cost(model: str, tensor_parallel_size: int = 1) -> CostModel:
    """The seed's laptop, pricing ``model`` by its shape (from any shipped profile; else Qwen3-0.6B's)."""
    shape = _shape_of(model)
    if shape is None:
        log.info("no shipped profile records the shape of %s: the laptop prices it as Qwen3-0.6B", model)
        shape = QWEN3_0_6B
    return CostModel(flops=PrefillFlops.of(shape), tensor_parallel_size=tensor_parallel_size)


@functools.cache
def _shape_of(model: str) -> ModelShape | None:
    names = {model.strip().lower(), _canonical(model).lower()}
    for gpu_class in shipped_profile_names():
        for curve in shipped_profile(gpu_class).prefill:
            if curve.model.lower() in names:
                return curve.shape
    return None


def _canonical(model: str) -> str:
    from kvoffload.policy.catalog import find_model

    entry = find_model(model)
    return entry.name if entry is not None else model


def class_cost(
    gpu_class: str,
    model: str,
    *,
    tensor_parallel_size: int = 1,
    block_size: int = 16,
    kv_bytes_per_token: int | None = None,
) -> CostModel:
    """The costs of ``model`` on ``gpu_class``'s shipped profile; ProfileError naming what it has when it cannot."""
    profile = shipped_profile(gpu_class)
    try:
        curve = profile.prefill_curve(model, PREFILL_MODE)
    except ProfileError as exc:
        try:  # a catalog alias of a model the profile has
            curve = profile.prefill_curve(_canonical(model), PREFILL_MODE)
        except ProfileError:
            raise exc from None
    name = curve.model
    tp = tensor_parallel_size
    shape = curve.shape
    # vLLM's page (one layer's K and V of one block); a rank holds kv_heads / tp of the heads.
    kv = kv_bytes_per_token or shape.kv_bytes_per_token  # the engine's (an fp8 KV cache halves it)
    page = max(1, vllm_page_bytes(kv, shape.layers, block_size) // tp)
    step = profile.decode_itl_seconds(name, 1) / tp
    restore_rate = profile.bandwidth("h2d", profile.load_path(page, 64), page) * tp
    return CostModel(
        base_s=0.0,
        cpu_restore_bytes_per_s=restore_rate,
        restore_step_s=step,
        store_bytes_per_s=profile.bandwidth("d2h", "batched_dma", page) * tp,
        itl_s=step,
        profile=profile,
        model=name,
        tensor_parallel_size=tp,
        page_bytes=page,
        hbm_bytes_per_s=profile.hbm_bytes_per_second,
        hash_s_per_block=profile.hit.hash_seconds_per_block,
        block_tokens=block_size,
        layers=shape.layers,
        kv_bytes_per_token=kv,
    )


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
    cache_read_s: float = 0.0
    """Reading the cached K/V once at the GPU's memory bandwidth."""
    hash_s: float = 0.0
    """vLLM's block hashing of the prompt."""


def price(
    model: CostModel,
    *,
    computed_tokens: int,
    cpu_restored_tokens: int,
    disk_restored_tokens: int,
    kv_bytes_per_token: int,
    gpu_hit_tokens: int = 0,
) -> Price:
    """Price a prefill that computes ``computed_tokens`` and restores the rest from the tiers.

    Tokens hit in the GPU cache cost no transfer; the computed tokens attend over every cached one, and
    that short query reads every cached K/V byte once (memory-bound). Every request pays vLLM's block hashing.
    """
    if min(computed_tokens, cpu_restored_tokens, disk_restored_tokens, gpu_hit_tokens) < 0:
        raise ValueError("token counts must be >= 0")
    cached = gpu_hit_tokens + cpu_restored_tokens + disk_restored_tokens
    compute_s = model.compute_seconds(computed_tokens, cached)
    cpu_bytes = cpu_restored_tokens * kv_bytes_per_token
    disk_bytes = disk_restored_tokens * kv_bytes_per_token
    cpu_s = model.cpu_restore_seconds(cpu_bytes)
    disk_s = disk_bytes / model.disk_restore_bytes_per_s
    restore_s = cpu_s + disk_s + (model.restore_step_s if cpu_bytes or disk_bytes else 0.0)
    read_s = model.cache_read_seconds(cached, kv_bytes_per_token) if computed_tokens > 0 else 0.0
    hash_s = model.hash_seconds(computed_tokens + cached)
    return Price(
        ttft_s=model.base_s + hash_s + compute_s + read_s + restore_s,
        compute_s=compute_s,
        restore_s=restore_s,
        base_s=model.base_s,
        computed_tokens=computed_tokens,
        cpu_restored_bytes=cpu_bytes,
        disk_restored_bytes=disk_bytes,
        cpu_restore_s=cpu_s,
        disk_restore_s=disk_s,
        cache_read_s=read_s,
        hash_s=hash_s,
    )
