"""Versioned cost profiles of a GPU class: what moving, pinning and recomputing KV costs there.

A profile is either ``measured`` (the lab's ``kvoffload calibrate``, on the GPU)
or ``estimated`` (derived from a measured one by published specifications, see
``estimated.derive_estimated``). The shipped ones live in ``profiles/<gpu-class>.json`` beside
this module and ship in the wheel as package data.

The helpers here price the parts of a request the planner and the emulator need:
prefill time for N tokens (piecewise linear over the measured curve), restore time
for B bytes moved in pages of P bytes (by the path vLLM picks for that page), store
time, pinning time and decode ITL.

Pure: standard library only (no torch, no pydantic), so the calibration can import it
on a GPU image that has neither the operator's dependencies nor its packages.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, get_args

from kvoffload.economics.gpuspec import PUBLISHED_SPECS, GpuSpec

SCHEMA_VERSION = 1

Kind = Literal["measured", "estimated"]
Direction = Literal["h2d", "d2h"]
TransferPath = Literal["contiguous", "batched_dma", "zero_copy_12sm", "zero_copy_all_sm", "memcpy_per_page"]
# torch_pin_memory: cudaHostAlloc through torch. vllm_shm_register: vLLM 0.32's CPU tier, a shared mmap
# of /dev/shm pre-faulted with MADV_POPULATE_WRITE, then cudaHostRegister (what an engine pays at start).
PinPath = Literal["torch_pin_memory", "vllm_shm_register"]

KINDS: tuple[str, ...] = get_args(Kind)
DIRECTIONS: tuple[str, ...] = get_args(Direction)
TRANSFER_PATHS: tuple[str, ...] = get_args(TransferPath)
PIN_PATHS: tuple[str, ...] = get_args(PinPath)

GIB = 1024**3

# vLLM 0.32 (vllm/v1/kv_offload/cpu/gpu_worker.py, swap_blocks_triton.py): loads of pages
# under 28 KiB, 8-byte aligned, at least 16 at a time, go through a Triton kernel that
# reads pinned host memory on 12 SMs; everything else, and every store, is cuMemcpyBatchAsync.
VLLM_ZERO_COPY_MAX_PAGE_BYTES = 28 * 1024
VLLM_ZERO_COPY_MIN_PAGES = 16
VLLM_ZERO_COPY_SMS = 12
# vLLM's default KV block on CUDA, in tokens.
VLLM_BLOCK_TOKENS = 16


class ProfileError(ValueError):
    """A profile that does not parse or does not hold what was asked; the message names the field."""


# --- the profile ---------------------------------------------------------------------


@dataclass(frozen=True)
class Source:
    """Where a profile's figures come from."""

    device: str
    """The accelerator as the driver names it, or the class it was derived for."""
    driver: str
    torch: str
    cuda: str
    date: str
    """ISO date of the measurement (or of the derivation)."""
    command: str
    """The command that produced the file."""
    host: str = ""
    """CPU and runtime of the host, where known: pinning and the zero-copy path depend on it."""


@dataclass(frozen=True)
class Derivation:
    """How an estimated profile was scaled from a measured one."""

    base_profile: str
    base_spec: GpuSpec
    target_spec: GpuSpec
    method: str


@dataclass(frozen=True)
class TransferPoint:
    """Measured rate of moving ``pages`` pages of ``page_bytes`` each, by one path and direction."""

    direction: Direction
    path: TransferPath
    page_bytes: int
    pages: int
    bytes_per_second: float


@dataclass(frozen=True)
class PinPoint:
    """Seconds pinning ``bytes`` of host memory took, by one path."""

    bytes: int
    seconds: float
    path: PinPath = "torch_pin_memory"


@dataclass(frozen=True)
class RestoreCost:
    """Fixed and per-page costs of one restore beyond its bytes / bandwidth."""

    fixed_seconds: float
    """Submit-to-done latency of a restore of one batch of 16 small pages (launch, events)."""
    submit_seconds_per_page: Mapping[str, float]
    """Host time to submit one page descriptor, per path (pointer arrays, the driver call)."""
    zero_copy_max_page_bytes: int = VLLM_ZERO_COPY_MAX_PAGE_BYTES
    zero_copy_min_pages: int = VLLM_ZERO_COPY_MIN_PAGES
    fill_seconds_per_layer: float = 0.0
    """Host time of vLLM 0.32's pointer fill for one layer of one load, before the submit
    (``gpu_worker.py`` ``_fill_direct_ops``: two numpy pointer arrays and the sizes per layer)."""


@dataclass(frozen=True)
class HitCost:
    """What a prefix-cache hit costs beyond the tokens it still computes (issue 25, item 6)."""

    hash_seconds_per_block: float = 0.0
    """Host time of vLLM's block hash (sha256 of a pickle, its default) per full prompt block; every
    request pays it for every full block when it is made, hit or not."""
    hbm_bytes_per_second: float = 0.0
    """The GPU's memory bandwidth: a short query over a long cached context reads every cached K/V byte
    once (0: the class's published figure, ``PUBLISHED_SPECS``)."""
    source: str = ""
    """Where the figures come from."""


@dataclass(frozen=True)
class ModelShape:
    """The dimensions of a dense decoder that decide its prefill and decode cost."""

    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int

    @property
    def params(self) -> int:
        """Parameters of the decoder layers and one (tied) embedding."""
        attn = self.hidden * self.head_dim * (self.heads * 2 + self.kv_heads * 2)
        mlp = 3 * self.hidden * self.intermediate
        return self.layers * (attn + mlp) + self.vocab * self.hidden

    @property
    def kv_bytes_per_token(self) -> int:
        """bf16 K and V of one token in all layers."""
        return 2 * self.layers * self.kv_heads * self.head_dim * 2


@dataclass(frozen=True)
class CurvePoint:
    """One measured point: ``x`` (tokens or batch) and the seconds it took."""

    x: int
    seconds: float


@dataclass(frozen=True)
class PrefillCurve:
    """Prefill time of one model shape over prompt length, and the held-out points not used to interpolate."""

    model: str
    shape: ModelShape
    points: tuple[CurvePoint, ...]
    held_out: tuple[CurvePoint, ...] = ()
    mode: str = "eager"
    """How the forward ran: ``eager`` PyTorch launches every kernel from the host; ``cuda_graph``
    replays them, the GPU's time alone. vLLM (fused kernels, graphs for small batches) lies between."""


@dataclass(frozen=True)
class DecodeCurve:
    """Time of one decode step (ITL) of one model shape over batch size, at a fixed context length."""

    model: str
    context_tokens: int
    points: tuple[CurvePoint, ...]
    cuda_graph: bool


@dataclass(frozen=True)
class RestoreCheck:
    """An end-to-end restore timed as vLLM submits it, kept out of every fit: the held-out check."""

    label: str
    page_bytes: int
    pages: int
    path: TransferPath
    seconds: float
    layers: int = 0
    """Layers the pages span, for the per-layer pointer fill; 0 where the check was timed without it."""

    @property
    def bytes(self) -> int:
        return self.page_bytes * self.pages


@dataclass(frozen=True)
class Profile:
    """Everything the planner, the emulator and the simulator know about one GPU class."""

    gpu_class: str
    kind: Kind
    source: Source
    transfers: tuple[TransferPoint, ...]
    bidirectional_bytes_per_second: float
    """H2D and D2H at once, both counted."""
    pinning: tuple[PinPoint, ...]
    restore: RestoreCost
    prefill: tuple[PrefillCurve, ...]
    decode: tuple[DecodeCurve, ...]
    restore_checks: tuple[RestoreCheck, ...] = ()
    derivation: Derivation | None = None
    notes: tuple[str, ...] = ()
    schema_version: int = SCHEMA_VERSION
    hit: HitCost = HitCost()

    # --- lookups -------------------------------------------------------------------

    def prefill_curve(self, model: str, mode: str = "eager") -> PrefillCurve:
        """The prefill curve of ``model`` (a Hugging Face id, case-insensitive) measured in ``mode``."""
        for curve in self.prefill:
            if curve.model.lower() == model.strip().lower() and curve.mode == mode:
                return curve
        known = ", ".join(f"{c.model} ({c.mode})" for c in self.prefill) or "none"
        raise ProfileError(f"profile {self.gpu_class} has no {mode} prefill curve for {model!r} (it has: {known})")

    def decode_curve(self, model: str) -> DecodeCurve:
        """The decode curve of ``model`` (a Hugging Face id, case-insensitive)."""
        for curve in self.decode:
            if curve.model.lower() == model.strip().lower():
                return curve
        known = ", ".join(c.model for c in self.decode) or "none"
        raise ProfileError(f"profile {self.gpu_class} has no decode curve for {model!r} (it has: {known})")

    def transfer_points(self, direction: Direction, path: TransferPath) -> list[TransferPoint]:
        """The measured points of one direction and path, by page size."""
        return sorted(
            (t for t in self.transfers if t.direction == direction and t.path == path), key=lambda t: t.page_bytes
        )

    # --- interpolation ---------------------------------------------------------------

    def prefill_seconds(self, model: str, tokens: int, mode: str = "eager") -> float:
        """Seconds to prefill ``tokens`` prompt tokens of ``model`` from nothing cached.

        Piecewise linear in time over the measured points; outside them the nearest
        segment is extended (below the first point that keeps the fixed cost a short
        prompt pays; past the last it understates attention's quadratic growth).
        """
        if tokens < 0:
            raise ValueError("tokens must be >= 0")
        if tokens == 0:
            return 0.0
        return max(0.0, _piecewise_linear(self.prefill_curve(model, mode).points, tokens))

    def prefill_tokens_per_second(self, model: str, tokens: int, mode: str = "eager") -> float:
        """Prefill throughput at a prompt of ``tokens`` tokens."""
        return tokens / self.prefill_seconds(model, tokens, mode)

    def decode_itl_seconds(self, model: str, batch: int) -> float:
        """Seconds of one decode step with ``batch`` sequences (piecewise linear over batch size)."""
        if batch < 1:
            raise ValueError("batch must be >= 1")
        return max(0.0, _piecewise_linear(self.decode_curve(model).points, batch))

    def bandwidth(self, direction: Direction, path: TransferPath, page_bytes: int) -> float:
        """Bytes per second moving pages of ``page_bytes`` by ``path``.

        Linear in log(page size) between measured page sizes, flat outside them.
        """
        points = self.transfer_points(direction, path)
        if not points:
            raise ProfileError(f"profile {self.gpu_class} has no {direction} {path} measurement")
        if page_bytes <= 0:
            raise ValueError("page_bytes must be > 0")
        xs = [math.log(p.page_bytes) for p in points]
        ys = [p.bytes_per_second for p in points]
        return _interp_clamped(xs, ys, math.log(page_bytes))

    def load_path(self, page_bytes: int, pages: int) -> TransferPath:
        """The path vLLM 0.32 loads ``pages`` pages of ``page_bytes`` by (see the module constants)."""
        r = self.restore
        if page_bytes < r.zero_copy_max_page_bytes and page_bytes % 8 == 0 and pages >= r.zero_copy_min_pages:
            return "zero_copy_12sm"
        return "batched_dma"

    def restore_seconds(self, nbytes: int, page_bytes: int, layers: int = 0) -> float:
        """Seconds to load ``nbytes`` from the CPU tier in pages of ``page_bytes`` over ``layers`` layers, as vLLM does.

        fixed cost + layers × pointer fill per layer + pages × host submit cost per page + bytes /
        bandwidth of the path at that page size. The terms add up: vLLM 0.32 fills every layer's
        pointers, then submits all pages in one ``cuMemcpyBatchAsync`` whose host work ends before the
        copy starts (``gpu_worker.py`` ``transfer_async``), and the bandwidth is the copy's own GPU time.
        """
        if nbytes < 0:
            raise ValueError("nbytes must be >= 0")
        if layers < 0:
            raise ValueError("layers must be >= 0")
        if nbytes == 0:
            return 0.0
        pages = math.ceil(nbytes / page_bytes)
        path = self.load_path(page_bytes, pages)
        per_page = self.restore.submit_seconds_per_page.get(path, 0.0)
        host = self.restore.fixed_seconds + layers * self.restore.fill_seconds_per_layer + pages * per_page
        return host + nbytes / self.bandwidth("h2d", path, page_bytes)

    @property
    def hbm_bytes_per_second(self) -> float:
        """The GPU's memory bandwidth: the profile's own figure, else the class's published one."""
        if self.hit.hbm_bytes_per_second > 0:
            return self.hit.hbm_bytes_per_second
        spec = self.derivation.target_spec if self.derivation is not None else PUBLISHED_SPECS.get(self.gpu_class)
        if spec is None:
            raise ProfileError(f"profile {self.gpu_class} has no memory bandwidth (hit.hbmBytesPerSecond)")
        return spec.hbm_bytes_per_second

    def cache_read_seconds(self, nbytes: int) -> float:
        """Seconds to read ``nbytes`` of cached K/V once at the GPU's memory bandwidth."""
        return max(0, nbytes) / self.hbm_bytes_per_second

    def hash_seconds(self, prompt_tokens: int, block_tokens: int = VLLM_BLOCK_TOKENS) -> float:
        """Host seconds vLLM spends hashing the full blocks of a ``prompt_tokens`` prompt."""
        return (max(0, prompt_tokens) // block_tokens) * self.hit.hash_seconds_per_block

    def store_seconds(self, nbytes: int, page_bytes: int) -> float:
        """Seconds to store ``nbytes`` to the CPU tier in pages of ``page_bytes`` (always batched DMA in vLLM)."""
        if nbytes < 0:
            raise ValueError("nbytes must be >= 0")
        if nbytes == 0:
            return 0.0
        pages = math.ceil(nbytes / page_bytes)
        per_page = self.restore.submit_seconds_per_page.get("batched_dma", 0.0)
        return self.restore.fixed_seconds + pages * per_page + nbytes / self.bandwidth("d2h", "batched_dma", page_bytes)

    def pin_points(self) -> list[PinPoint]:
        """The pinning points an engine's start follows: vLLM's own path where measured, else torch's, by size."""
        vllm = [p for p in self.pinning if p.path == "vllm_shm_register"]
        return sorted(vllm or self.pinning, key=lambda p: p.bytes)

    def pin_seconds(self, nbytes: int) -> float:
        """Seconds to pin ``nbytes`` of host memory: linear through the measured points, extended past the ends."""
        if nbytes <= 0:
            return 0.0
        points = self.pin_points()
        if not points:
            raise ProfileError(f"profile {self.gpu_class} has no pinning measurement")
        if len(points) == 1:
            return points[0].seconds * nbytes / points[0].bytes
        return max(0.0, _piecewise_linear([CurvePoint(p.bytes, p.seconds) for p in points], nbytes))

    @property
    def pin_seconds_per_gib(self) -> float:
        """The slope of pinning between the smallest and the largest measured size."""
        points = self.pin_points()
        if len(points) < 2:
            return self.pin_seconds(GIB)
        lo, hi = points[0], points[-1]
        return (hi.seconds - lo.seconds) / ((hi.bytes - lo.bytes) / GIB)

    @property
    def contiguous_h2d_bytes_per_second(self) -> float:
        """The best one-copy host-to-device rate measured."""
        return max(t.bytes_per_second for t in self.transfer_points("h2d", "contiguous"))

    @property
    def contiguous_d2h_bytes_per_second(self) -> float:
        """The best one-copy device-to-host rate measured."""
        return max(t.bytes_per_second for t in self.transfer_points("d2h", "contiguous"))

    # --- (de)serialisation --------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        """The profile as the JSON object the files hold."""
        out: dict[str, Any] = {
            "schemaVersion": self.schema_version,
            "gpuClass": self.gpu_class,
            "kind": self.kind,
            "source": _source_json(self.source),
            "transfers": [
                {
                    "direction": t.direction,
                    "path": t.path,
                    "pageBytes": t.page_bytes,
                    "pages": t.pages,
                    "bytesPerSecond": t.bytes_per_second,
                }
                for t in self.transfers
            ],
            "bidirectionalBytesPerSecond": self.bidirectional_bytes_per_second,
            "pinning": [{"bytes": p.bytes, "seconds": p.seconds, "path": p.path} for p in self.pinning],
            "restore": {
                "fixedSeconds": self.restore.fixed_seconds,
                "submitSecondsPerPage": dict(self.restore.submit_seconds_per_page),
                "zeroCopyMaxPageBytes": self.restore.zero_copy_max_page_bytes,
                "zeroCopyMinPages": self.restore.zero_copy_min_pages,
            },
            "prefill": [
                {
                    "model": c.model,
                    "mode": c.mode,
                    "shape": _shape_json(c.shape),
                    "points": [{"tokens": p.x, "seconds": p.seconds} for p in c.points],
                    "heldOut": [{"tokens": p.x, "seconds": p.seconds} for p in c.held_out],
                }
                for c in self.prefill
            ],
            "decode": [
                {
                    "model": c.model,
                    "contextTokens": c.context_tokens,
                    "cudaGraph": c.cuda_graph,
                    "points": [{"batch": p.x, "seconds": p.seconds} for p in c.points],
                }
                for c in self.decode
            ],
            "restoreChecks": [
                {
                    "label": r.label,
                    "pageBytes": r.page_bytes,
                    "pages": r.pages,
                    "path": r.path,
                    "seconds": r.seconds,
                    **({"layers": r.layers} if r.layers else {}),
                }
                for r in self.restore_checks
            ],
            "notes": list(self.notes),
        }
        if self.restore.fill_seconds_per_layer:
            out["restore"]["fillSecondsPerLayer"] = self.restore.fill_seconds_per_layer
        if self.hit != HitCost():
            out["hit"] = {
                "hashSecondsPerBlock": self.hit.hash_seconds_per_block,
                "hbmBytesPerSecond": self.hit.hbm_bytes_per_second,
                "source": self.hit.source,
            }
        if self.derivation is not None:
            d = self.derivation
            out["derivation"] = {
                "baseProfile": d.base_profile,
                "method": d.method,
                "baseSpec": _spec_json(d.base_spec),
                "targetSpec": _spec_json(d.target_spec),
            }
        return out

    def dumps(self) -> str:
        """The profile as JSON text, two-space indented, with a final newline."""
        return json.dumps(self.to_json(), indent=2) + "\n"


# --- interpolation helpers --------------------------------------------------------------


def _interp_clamped(xs: Sequence[float], ys: Sequence[float], x: float) -> float:
    if x <= xs[0]:
        return ys[0]
    if x >= xs[-1]:
        return ys[-1]
    for i in range(1, len(xs)):
        if x <= xs[i]:
            w = (x - xs[i - 1]) / (xs[i] - xs[i - 1])
            return ys[i - 1] + w * (ys[i] - ys[i - 1])
    return ys[-1]  # unreachable: x < xs[-1]


def _piecewise_linear(points: Sequence[CurvePoint], x: float) -> float:
    """Linear between neighbours; the end segments extended past the ends; one point scales through zero."""
    pts = sorted(points, key=lambda p: p.x)
    if not pts:
        raise ProfileError("no points to interpolate")
    if len(pts) == 1:
        return pts[0].seconds * x / pts[0].x
    i = 1
    while i < len(pts) - 1 and x > pts[i].x:
        i += 1
    a, b = pts[i - 1], pts[i]
    return a.seconds + (x - a.x) * (b.seconds - a.seconds) / (b.x - a.x)


# --- writing helpers -------------------------------------------------------------------


def _source_json(s: Source) -> dict[str, Any]:
    out: dict[str, Any] = {
        "device": s.device,
        "driver": s.driver,
        "torch": s.torch,
        "cuda": s.cuda,
        "date": s.date,
        "command": s.command,
    }
    if s.host:
        out["host"] = s.host
    return out


def _shape_json(s: ModelShape) -> dict[str, Any]:
    return {
        "layers": s.layers,
        "hidden": s.hidden,
        "intermediate": s.intermediate,
        "heads": s.heads,
        "kvHeads": s.kv_heads,
        "headDim": s.head_dim,
        "vocab": s.vocab,
    }


def _spec_json(s: GpuSpec) -> dict[str, Any]:
    return {
        "gpuClass": s.gpu_class,
        "product": s.product,
        "hostLink": s.host_link,
        "hostLinkBytesPerSecond": s.host_link_bytes_per_second,
        "hbmBytesPerSecond": s.hbm_bytes_per_second,
        "bf16DenseFlops": s.bf16_dense_flops,
        "memoryBytes": s.memory_bytes,
        "citations": list(s.citations),
    }


@dataclass(frozen=True)
class HeldOutError:
    """A held-out point and what the profile predicts for it."""

    what: str
    measured_seconds: float
    predicted_seconds: float

    @property
    def relative_error(self) -> float:
        return self.predicted_seconds / self.measured_seconds - 1.0


def held_out_errors(profile: Profile) -> list[HeldOutError]:
    """Every held-out point of a profile (prefill lengths, end-to-end restores) against its prediction."""
    out: list[HeldOutError] = []
    for c in profile.prefill:
        for p in c.held_out:
            predicted = profile.prefill_seconds(c.model, p.x, c.mode)
            out.append(HeldOutError(f"prefill {c.model} ({c.mode}) {p.x} tokens", p.seconds, predicted))
    for r in profile.restore_checks:
        predicted = profile.restore_seconds(r.bytes, r.page_bytes, r.layers)
        out.append(HeldOutError(f"restore {r.label}", r.seconds, predicted))
    return out
