"""Versioned cost profiles of a GPU class: what moving, pinning and recomputing KV costs there.

A profile is either ``measured`` (``python -m kvoffload.economics.calibrate`` on the GPU)
or ``estimated`` (derived from a measured one by published specifications, see
``derive_estimated``). The shipped ones live in ``profiles/<gpu-class>.json`` beside
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
from importlib import resources
from pathlib import Path
from typing import Any, Literal, cast, get_args

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
class GpuSpec:
    """Published figures of one GPU class, each from a vendor document listed in ``citations``."""

    gpu_class: str
    product: str
    host_link: str
    """E.g. ``PCIe Gen5 x16``."""
    host_link_bytes_per_second: float
    """Theoretical per-direction rate of the host link."""
    hbm_bytes_per_second: float
    bf16_dense_flops: float
    """Dense (no sparsity) bf16 tensor rate, FLOP/s."""
    memory_bytes: int
    citations: tuple[str, ...]


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


# --- reading -------------------------------------------------------------------------------


class _Obj:
    """A JSON object read with the path of every field in its errors."""

    def __init__(self, value: object, path: str) -> None:
        if not isinstance(value, dict):
            raise ProfileError(f"{path}: must be an object")
        self.value: dict[str, Any] = value
        self.path = path

    def _get(self, key: str) -> object:
        if key not in self.value:
            raise ProfileError(f"{self.path}.{key}: missing")
        return self.value[key]

    def get_str(self, key: str, default: str | None = None) -> str:
        if default is not None and key not in self.value:
            return default
        v = self._get(key)
        if not isinstance(v, str):
            raise ProfileError(f"{self.path}.{key}: must be a string")
        return v

    def get_int(self, key: str, minimum: int = 0, default: int | None = None) -> int:
        if default is not None and key not in self.value:
            return default
        v = self._get(key)
        if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
            raise ProfileError(f"{self.path}.{key}: must be an integer >= {minimum}")
        return v

    def get_num(self, key: str, positive: bool = True) -> float:
        v = self._get(key)
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
            raise ProfileError(f"{self.path}.{key}: must be a finite number")
        if v < 0 or (positive and v == 0):
            raise ProfileError(f"{self.path}.{key}: must be {'> 0' if positive else '>= 0'}")
        return float(v)

    def get_bool(self, key: str) -> bool:
        v = self._get(key)
        if not isinstance(v, bool):
            raise ProfileError(f"{self.path}.{key}: must be true or false")
        return v

    def get_choice(self, key: str, choices: tuple[str, ...]) -> str:
        v = self.get_str(key)
        if v not in choices:
            raise ProfileError(f"{self.path}.{key}: {v!r} is not one of {', '.join(choices)}")
        return v

    def get_obj(self, key: str) -> _Obj:
        return _Obj(self._get(key), f"{self.path}.{key}")

    def get_objs(self, key: str, required: bool = True) -> list[_Obj]:
        if not required and key not in self.value:
            return []
        v = self._get(key)
        if not isinstance(v, list):
            raise ProfileError(f"{self.path}.{key}: must be a list")
        return [_Obj(item, f"{self.path}.{key}[{i}]") for i, item in enumerate(v)]

    def get_strs(self, key: str) -> tuple[str, ...]:
        if key not in self.value:
            return ()
        v = self.value[key]
        if not isinstance(v, list) or not all(isinstance(s, str) for s in v):
            raise ProfileError(f"{self.path}.{key}: must be a list of strings")
        return tuple(v)


def _points(items: list[_Obj], x_key: str, path: str) -> tuple[CurvePoint, ...]:
    points = tuple(CurvePoint(o.get_int(x_key, minimum=1), o.get_num("seconds")) for o in items)
    xs = [p.x for p in points]
    if len(set(xs)) != len(xs):
        raise ProfileError(f"{path}: two points at the same {x_key}")
    return tuple(sorted(points, key=lambda p: p.x))


def _read_spec(o: _Obj) -> GpuSpec:
    return GpuSpec(
        gpu_class=o.get_str("gpuClass"),
        product=o.get_str("product"),
        host_link=o.get_str("hostLink"),
        host_link_bytes_per_second=o.get_num("hostLinkBytesPerSecond"),
        hbm_bytes_per_second=o.get_num("hbmBytesPerSecond"),
        bf16_dense_flops=o.get_num("bf16DenseFlops"),
        memory_bytes=o.get_int("memoryBytes", minimum=1),
        citations=o.get_strs("citations"),
    )


def profile_from_json(data: object, origin: str = "profile") -> Profile:
    """A Profile from its parsed JSON; ProfileError names the first bad field."""
    root = _Obj(data, origin)
    version = root.get_int("schemaVersion", minimum=1)
    if version != SCHEMA_VERSION:
        raise ProfileError(f"{origin}.schemaVersion: {version} is not supported (this code reads {SCHEMA_VERSION})")
    src = root.get_obj("source")
    source = Source(
        device=src.get_str("device"),
        driver=src.get_str("driver"),
        torch=src.get_str("torch"),
        cuda=src.get_str("cuda"),
        date=src.get_str("date"),
        command=src.get_str("command"),
        host=src.get_str("host", default=""),
    )
    transfers = tuple(
        TransferPoint(
            direction=cast(Direction, o.get_choice("direction", DIRECTIONS)),
            path=cast(TransferPath, o.get_choice("path", TRANSFER_PATHS)),
            page_bytes=o.get_int("pageBytes", minimum=1),
            pages=o.get_int("pages", minimum=1),
            bytes_per_second=o.get_num("bytesPerSecond"),
        )
        for o in root.get_objs("transfers")
    )
    for direction in DIRECTIONS:
        if not any(t.direction == direction and t.path == "contiguous" for t in transfers):
            raise ProfileError(f"{origin}.transfers: no {direction} contiguous measurement")
    if not any(t.direction == "h2d" and t.path == "batched_dma" for t in transfers):
        raise ProfileError(f"{origin}.transfers: no h2d batched_dma measurement (vLLM's load path for large pages)")
    if not any(t.direction == "d2h" and t.path == "batched_dma" for t in transfers):
        raise ProfileError(f"{origin}.transfers: no d2h batched_dma measurement (vLLM's store path)")
    rest = root.get_obj("restore")
    submit = rest.get_obj("submitSecondsPerPage")
    per_page: dict[str, float] = {}
    for key in submit.value:
        if key not in TRANSFER_PATHS:
            raise ProfileError(f"{submit.path}.{key}: not a transfer path ({', '.join(TRANSFER_PATHS)})")
        per_page[key] = submit.get_num(key, positive=False)
    restore = RestoreCost(
        fixed_seconds=rest.get_num("fixedSeconds", positive=False),
        submit_seconds_per_page=per_page,
        zero_copy_max_page_bytes=rest.get_int("zeroCopyMaxPageBytes", default=VLLM_ZERO_COPY_MAX_PAGE_BYTES),
        zero_copy_min_pages=rest.get_int("zeroCopyMinPages", default=VLLM_ZERO_COPY_MIN_PAGES),
        fill_seconds_per_layer=rest.get_num("fillSecondsPerLayer", positive=False)
        if "fillSecondsPerLayer" in rest.value
        else 0.0,
    )
    hit = HitCost()
    if "hit" in root.value:
        h = root.get_obj("hit")
        hit = HitCost(
            hash_seconds_per_block=h.get_num("hashSecondsPerBlock", positive=False),
            hbm_bytes_per_second=h.get_num("hbmBytesPerSecond", positive=False),
            source=h.get_str("source", default=""),
        )
    prefill: list[PrefillCurve] = []
    for o in root.get_objs("prefill"):
        s = o.get_obj("shape")
        shape = ModelShape(
            layers=s.get_int("layers", 1),
            hidden=s.get_int("hidden", 1),
            intermediate=s.get_int("intermediate", 1),
            heads=s.get_int("heads", 1),
            kv_heads=s.get_int("kvHeads", 1),
            head_dim=s.get_int("headDim", 1),
            vocab=s.get_int("vocab", 1),
        )
        points = _points(o.get_objs("points"), "tokens", f"{o.path}.points")
        if not points:
            raise ProfileError(f"{o.path}.points: empty")
        held = _points(o.get_objs("heldOut", required=False), "tokens", f"{o.path}.heldOut")
        curve = PrefillCurve(o.get_str("model"), shape, points, held, o.get_str("mode", default="eager"))
        if any(c.model == curve.model and c.mode == curve.mode for c in prefill):
            raise ProfileError(f"{o.path}: a second {curve.mode} curve for {curve.model}")
        prefill.append(curve)
    decode: list[DecodeCurve] = []
    for o in root.get_objs("decode"):
        points = _points(o.get_objs("points"), "batch", f"{o.path}.points")
        if not points:
            raise ProfileError(f"{o.path}.points: empty")
        decode.append(DecodeCurve(o.get_str("model"), o.get_int("contextTokens", 1), points, o.get_bool("cudaGraph")))
    checks = tuple(
        RestoreCheck(
            label=o.get_str("label"),
            page_bytes=o.get_int("pageBytes", 1),
            pages=o.get_int("pages", 1),
            path=cast(TransferPath, o.get_choice("path", TRANSFER_PATHS)),
            seconds=o.get_num("seconds"),
            layers=o.get_int("layers", 0, default=0),
        )
        for o in root.get_objs("restoreChecks", required=False)
    )
    derivation = None
    if "derivation" in root.value:
        d = root.get_obj("derivation")
        derivation = Derivation(
            base_profile=d.get_str("baseProfile"),
            base_spec=_read_spec(d.get_obj("baseSpec")),
            target_spec=_read_spec(d.get_obj("targetSpec")),
            method=d.get_str("method"),
        )
    kind = cast(Kind, root.get_choice("kind", KINDS))
    if kind == "estimated" and derivation is None:
        raise ProfileError(f"{origin}.derivation: an estimated profile must say what it was derived from")
    return Profile(
        gpu_class=root.get_str("gpuClass"),
        kind=kind,
        source=source,
        transfers=transfers,
        bidirectional_bytes_per_second=root.get_num("bidirectionalBytesPerSecond"),
        pinning=tuple(
            PinPoint(
                o.get_int("bytes", 1),
                o.get_num("seconds"),
                cast(PinPath, o.get_choice("path", PIN_PATHS) if "path" in o.value else "torch_pin_memory"),
            )
            for o in root.get_objs("pinning")
        ),
        restore=restore,
        prefill=tuple(prefill),
        decode=tuple(decode),
        restore_checks=checks,
        derivation=derivation,
        notes=root.get_strs("notes"),
        schema_version=version,
        hit=hit,
    )


def loads_profile(text: str, origin: str = "profile") -> Profile:
    """A Profile from JSON text."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ProfileError(f"{origin}: not valid JSON: {exc}") from None
    return profile_from_json(data, origin)


def load_profile(path: Path) -> Profile:
    """A Profile from a JSON file."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise ProfileError(f"{path}: {exc.strerror or exc}") from None
    return loads_profile(text, str(path))


def shipped_profile_names() -> list[str]:
    """The GPU classes with a profile shipped in the package, sorted."""
    folder = resources.files("kvoffload.economics").joinpath("profiles")
    return sorted(p.name.removesuffix(".json") for p in folder.iterdir() if p.name.endswith(".json"))


def shipped_profile(gpu_class: str) -> Profile:
    """The profile shipped for ``gpu_class``; ProfileError when there is none."""
    res = resources.files("kvoffload.economics").joinpath("profiles", f"{gpu_class}.json")
    if not res.is_file():
        known = ", ".join(shipped_profile_names())
        raise ProfileError(f"no shipped profile for GPU class {gpu_class!r} (shipped: {known})")
    profile = loads_profile(res.read_text(), f"profiles/{gpu_class}.json")
    if profile.gpu_class != gpu_class:
        raise ProfileError(f"profiles/{gpu_class}.json: gpuClass is {profile.gpu_class!r}")
    return profile


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


# --- estimated profiles ------------------------------------------------------------------

_GB = 10**9
_GIB = 1024**3
_MIB = 1024**2

# Vendor figures. Host link rates are per direction, theoretical: PCIe Gen4 x16 32 GB/s,
# Gen5 x16 64 GB/s (the datasheets quote both directions together, 64 and 128 GB/s).
# bf16 rates are dense; the datasheets' larger figures count 2:4 sparsity.
PUBLISHED_SPECS: Mapping[str, GpuSpec] = {
    s.gpu_class: s
    for s in (
        GpuSpec(
            "nvidia-h200-141gb",
            "NVIDIA H200 SXM",
            "PCIe Gen5 x16",
            64e9,
            4.8e12,
            989e12,
            143771 * _MIB,
            (
                "https://www.nvidia.com/en-us/data-center/h200/ (H200 SXM: 141 GB HBM3e, 4.8 TB/s, "
                "BF16 Tensor Core 1,979 TFLOPS with sparsity, PCIe Gen5 128 GB/s)",
            ),
        ),
        GpuSpec(
            "nvidia-h100-80gb",
            "NVIDIA H100 SXM",
            "PCIe Gen5 x16",
            64e9,
            3.35e12,
            989e12,
            80 * _GIB,
            (
                "https://www.nvidia.com/en-us/data-center/h100/ (H100 SXM: 80 GB HBM3, 3.35 TB/s, "
                "BF16 Tensor Core 1,979 TFLOPS with sparsity, PCIe Gen5 128 GB/s)",
            ),
        ),
        GpuSpec(
            "nvidia-b200",
            "NVIDIA B200 (HGX B200)",
            "PCIe Gen5 x16",
            64e9,
            8.0e12,
            2.25e15,
            180 * _GB,
            (
                "https://www.nvidia.com/en-us/data-center/hgx/ (HGX B200, per GPU: 180 GB HBM3e, 8 TB/s, "
                "FP16/BF16 4.5 PFLOPS with sparsity, i.e. 2.25 dense)",
                "https://glennklockwood.com/garden/processors/B200 (HGX B200 at 1,000 W: BF16 2,250 TFLOPS dense; "
                "the chip speaks PCIe Gen6, but HGX B200's x86 hosts link it at Gen5 x16, which is assumed here)",
            ),
        ),
        GpuSpec(
            "nvidia-a100-80gb",
            "NVIDIA A100 80GB SXM",
            "PCIe Gen4 x16",
            32e9,
            2.039e12,
            312e12,
            80 * _GIB,
            (
                "https://www.nvidia.com/en-us/data-center/a100/ (A100 80GB SXM: HBM2e 2,039 GB/s, "
                "BF16 Tensor Core 312 TFLOPS, 624 with sparsity, PCIe Gen4 64 GB/s)",
            ),
        ),
        GpuSpec(
            "nvidia-a100-40gb",
            "NVIDIA A100 40GB SXM",
            "PCIe Gen4 x16",
            32e9,
            1.555e12,
            312e12,
            40 * _GIB,
            (
                "https://www.nvidia.com/en-us/data-center/a100/ (A100 40GB SXM: HBM2 1,555 GB/s, "
                "BF16 Tensor Core 312 TFLOPS, 624 with sparsity, PCIe Gen4 64 GB/s)",
            ),
        ),
        GpuSpec(
            "nvidia-l40s",
            "NVIDIA L40S",
            "PCIe Gen4 x16",
            32e9,
            864e9,
            362.05e12,
            48 * _GB,
            (
                "https://www.nvidia.com/en-us/data-center/l40s/ (L40S: 48 GB GDDR6, 864 GB/s, "
                "BF16 Tensor Core 362.05 TFLOPS, 733 with sparsity, PCIe Gen4 x16 64 GB/s bidirectional)",
            ),
        ),
        GpuSpec(
            "nvidia-l4",
            "NVIDIA L4",
            "PCIe Gen4 x16",
            32e9,
            300e9,
            121e12,
            24 * _GB,
            (
                "https://www.nvidia.com/en-us/data-center/l4/ (L4: 24 GB GDDR6, 300 GB/s, "
                "BF16 Tensor Core 242 TFLOPS with sparsity, i.e. 121 dense, PCIe Gen4 x16 64 GB/s)",
            ),
        ),
        GpuSpec(
            "amd-mi300x",
            "AMD Instinct MI300X",
            "PCIe Gen5 x16",
            64e9,
            5.3e12,
            1307.4e12,
            192 * _GIB,
            (
                "https://www.amd.com/en/products/accelerators/instinct/mi300/mi300x.html (MI300X: 192 GB HBM3, "
                "5.3 TB/s, peak BF16 1,307.4 TFLOPS dense, 2,614.9 with sparsity, PCIe Gen5 x16 128 GB/s)",
            ),
        ),
    )
}


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
