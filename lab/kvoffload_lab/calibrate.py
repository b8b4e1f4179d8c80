"""Measure a GPU class's cost profile: ``python -m kvoffload_lab.calibrate --gpu-class NAME -o profile.json``.

It runs on a GPU image with PyTorch and Triton (neither is a dependency of the operator,
so both are imported only when a measurement runs) and measures:

- pinned host <-> device bandwidth at the page sizes vLLM moves, by the paths vLLM 0.32
  uses (``vllm/v1/kv_offload/cpu/gpu_worker.py``): loads of pages under 28 KiB through a
  Triton kernel that reads pinned host memory on 12 SMs, everything else and every
  store through one ``cuMemcpyBatchAsync``; for comparison the same kernel on all SMs,
  one ``cudaMemcpyAsync`` per page, and one contiguous copy; both directions at once;
- the host cost of submitting a restore (fixed, and per page descriptor);
- end-to-end restores of whole prompts, submitted as vLLM does: the held-out check of
  the restore model, never used to fit it;
- the pinning rate of 1, 4 and 16 GiB, as ``torch.empty(..., pin_memory=True)`` and as vLLM 0.32
  pins its CPU tier (a shared mmap of /dev/shm, pre-faulted, then ``cudaHostRegister``);
- prefill time of each model shape over prompt length with random bf16 weights (nothing
  is downloaded), plus held-out lengths the interpolation does not use;
- decode ITL (one CUDA-graph step) at a few batch sizes.

Every sample goes to a raw JSON file after each section, so a run cut short still
returns what it measured; ``--from-raw`` assembles a profile from such a file offline.
Without CUDA it refuses to run unless ``--allow-cpu --tiny`` asks for a logic check.
"""

from __future__ import annotations

import argparse
import ctypes
import datetime as dt
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from kvoffload.economics.estimated import derive_estimated
from kvoffload.economics.gpuspec import PUBLISHED_SPECS
from kvoffload.economics.profile import (
    GIB,
    SCHEMA_VERSION,
    VLLM_BLOCK_TOKENS,
    VLLM_ZERO_COPY_MAX_PAGE_BYTES,
    VLLM_ZERO_COPY_MIN_PAGES,
    VLLM_ZERO_COPY_SMS,
    ModelShape,
    Profile,
)
from kvoffload.economics.profileload import load_profile, profile_from_json

try:  # the GPU image has Triton; the operator's environment does not, and needs none of this
    import triton
    import triton.language as tl

    HAS_TRITON = True
except ImportError:  # pragma: no cover - depends on the image
    HAS_TRITON = False

KIB = 1024
MIB = 1024**2

# Shapes from the models' config.json (huggingface.co/Qwen/<name>/blob/main/config.json);
# layers, KV heads and head dim must match kvoffload.catalog (a test checks it).
MODEL_SHAPES: dict[str, ModelShape] = {
    "Qwen/Qwen3-0.6B": ModelShape(
        layers=28, hidden=1024, intermediate=3072, heads=16, kv_heads=8, head_dim=128, vocab=151936
    ),
    "Qwen/Qwen3-8B": ModelShape(
        layers=36, hidden=4096, intermediate=12288, heads=32, kv_heads=8, head_dim=128, vocab=151936
    ),
    "Qwen/Qwen3-32B": ModelShape(
        layers=64, hidden=5120, intermediate=25600, heads=64, kv_heads=8, head_dim=128, vocab=151936
    ),
}
TINY_SHAPE = ModelShape(layers=2, hidden=64, intermediate=128, heads=4, kv_heads=2, head_dim=16, vocab=512)

# Powers of two make the interpolation grid; the held-out lengths are timed too but
# never interpolated from, so they check the curve.
PREFILL_TOKENS = (128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768)
PREFILL_HELD_OUT = (1480, 3200, 12000)
PREFILL_MAX_TOKENS = {"Qwen/Qwen3-32B": 16384}
# Past this the GPU, not the host's kernel launches, sets the pace: no graph curve needed.
PREFILL_GRAPH_MAX_TOKENS = 4096
DECODE_BATCHES = (1, 8, 32, 128)
DECODE_CONTEXT = 1024

# Page sizes vLLM moves (one layer's K and V of one block: 8-64 KiB, less a rank under TP), 1 MiB, and one
# Qwen3-0.6B block of all layers (16 tokens × 114,688 B = 1,835,008 B). 24 KiB is held out.
PAGE_SIZES = (8 * KIB, 16 * KIB, 32 * KIB, 64 * KIB, 256 * KIB, MIB, 1_835_008)
HELD_OUT_PAGE = 24 * KIB
PIN_SIZES_GIB = (1, 4, 16)

# Figures measured before on an H200 (issue 11), to compare against: bytes/s, seconds, tokens/s.
REFERENCE: dict[str, float] = {
    "h2d contiguous GB/s": 55.0,
    "d2h contiguous GB/s": 55.0,
    # "50.5 GB/s in 1.8 MB blocks, 29 GB/s in 1 MiB blocks": the path is not stated, so both are shown
    "h2d memcpy_per_page 1835008 B GB/s": 50.5,
    "h2d batched_dma 1835008 B GB/s": 50.5,
    "h2d memcpy_per_page 1048576 B GB/s": 29.0,
    "h2d batched_dma 1048576 B GB/s": 29.0,
    "both directions GB/s": 98.0,
    "h2d zero_copy_12sm 8192 B GB/s": 36.0,
    "h2d zero_copy_12sm 16384 B GB/s": 39.0,
    "h2d zero_copy_12sm 32768 B GB/s": 46.0,
    "h2d zero_copy_12sm 65536 B GB/s": 48.0,
    "h2d zero_copy_all_sm 8192 B GB/s": 51.0,
    "h2d memcpy_per_page 8192 B GB/s": 3.1,
    "h2d memcpy_per_page 65536 B GB/s": 16.7,
    "pin 1 GiB s": 0.61,
    "pin 4 GiB s": 2.8,
    "pin 16 GiB s": 12.6,
    "pin 1 GiB s, vLLM's path": 0.61,
    "pin 4 GiB s, vLLM's path": 2.8,
    "pin 16 GiB s, vLLM's path": 12.6,
    "prefill Qwen/Qwen3-0.6B 1480 tok/s": 46e3,
    "prefill Qwen/Qwen3-0.6B 8192 tok/s": 149e3,
    "prefill Qwen/Qwen3-0.6B 32768 tok/s": 94e3,
    "prefill Qwen/Qwen3-8B 1480 tok/s": 29e3,
    "prefill Qwen/Qwen3-32B 1480 tok/s": 7.8e3,
}


class CalibrationError(RuntimeError):
    """The calibration cannot run here, or a measurement failed; the message says which."""


# --- progress and raw results ------------------------------------------------------------


class Log:
    """Progress on stdout (flushed) and, when given, in a log file."""

    def __init__(self, path: Path | None) -> None:
        self.start = time.monotonic()
        self.file = path.open("a") if path is not None else None

    def __call__(self, message: str) -> None:
        line = f"[{time.monotonic() - self.start:7.1f}s] {message}"
        print(line, flush=True)
        if self.file is not None:
            self.file.write(line + "\n")
            self.file.flush()


@dataclass
class Run:
    """One calibration: options, the raw results so far, and the clock."""

    log: Log
    raw: dict[str, Any]
    raw_path: Path | None
    deadline: float
    tiny: bool

    def save(self) -> None:
        """Write the raw results so far (after every section: a run cut short keeps them)."""
        if self.raw_path is not None:
            self.raw_path.write_text(json.dumps(self.raw, indent=1) + "\n")

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def section(self, name: str, fn: Callable[[], None], min_seconds: float = 0.0) -> None:
        """Run one section; a failure is logged and recorded, and the next section still runs."""
        if self.left() < min_seconds:
            self.log(f"SKIP {name}: {self.left():.0f}s left, it needs about {min_seconds:.0f}s")
            self.raw.setdefault("skipped", []).append(name)
            return
        self.log(f"== {name}")
        t0 = time.monotonic()
        try:
            fn()
        except Exception as exc:  # one broken section must not lose the others
            self.log(f"FAILED {name}: {type(exc).__name__}: {exc}")
            self.raw.setdefault("errors", {})[name] = f"{type(exc).__name__}: {exc}"
        self.log(f"   {name} took {time.monotonic() - t0:.1f}s")
        self.save()


def _median(xs: Sequence[float]) -> float:
    return float(statistics.median(xs))


def _gbps(nbytes: float, seconds: float) -> float:
    return nbytes / seconds / 1e9


# --- environment ---------------------------------------------------------------------------


def _run_text(cmd: Sequence[str]) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=20, check=False).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def measure_environment(run: Run, torch: Any) -> None:
    """Device, driver, torch and host, as the profile's ``source`` records them."""
    env: dict[str, Any] = {
        "torch": str(torch.__version__),
        "cuda": str(torch.version.cuda or ""),
        "python": platform.python_version(),
        "kernel": platform.release(),
        "cpu": _cpu_model(),
        "cpus": os.cpu_count() or 0,
        "triton": str(triton.__version__) if HAS_TRITON else "",
    }
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        env["device"] = str(props.name)
        env["sms"] = int(props.multi_processor_count)
        env["memoryBytes"] = int(props.total_memory)
        smi = _run_text(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm", "--format=csv"])
        env["nvidiaSmi"] = smi
        lines = smi.splitlines()
        env["driver"] = lines[1].split(",")[1].strip() if len(lines) > 1 else ""
    else:
        env["device"] = "cpu"
        env["sms"] = 0
        env["driver"] = ""
    run.raw["environment"] = env
    run.log(f"device {env['device']}, driver {env['driver']}, torch {env['torch']}, CUDA {env['cuda']}")
    run.log(f"host {env['cpu']} ({env['cpus']} CPUs), kernel {env['kernel']}, triton {env['triton'] or 'absent'}")


# --- transfers -------------------------------------------------------------------------------

if HAS_TRITON:

    @triton.jit  # type: ignore[untyped-decorator]
    def _copy_pages_kernel(src_ptrs, dst_ptrs, sizes, n_pages, CHUNK_BYTES: tl.constexpr):  # type: ignore[no-untyped-def]
        # Like vLLM's swap_blocks_triton kernel: each program walks pages pid, pid + grid, ...
        # and copies each in CHUNK_BYTES pieces of 8-byte words, reading host memory directly.
        pid = tl.program_id(0)
        grid = tl.num_programs(0)
        words: tl.constexpr = CHUNK_BYTES // 8
        offsets = tl.arange(0, words)
        page = pid
        while page < n_pages:
            src = tl.load(src_ptrs + page).to(tl.pointer_type(tl.int64))
            dst = tl.load(dst_ptrs + page).to(tl.pointer_type(tl.int64))
            n_words = tl.load(sizes + page) // 8
            for start in range(0, n_words, words):
                idx = start + offsets
                mask = idx < n_words
                tl.store(dst + idx, tl.load(src + idx, mask=mask, other=0), mask=mask)
            page += grid


class _MemLocation(ctypes.Structure):
    _fields_ = (("type", ctypes.c_int), ("id", ctypes.c_int))


class _MemcpyAttributes(ctypes.Structure):
    _fields_ = (
        ("srcAccessOrder", ctypes.c_int),
        ("srcLocHint", _MemLocation),
        ("dstLocHint", _MemLocation),
        ("flags", ctypes.c_uint),
    )


_SRC_ACCESS_ORDER_STREAM = 1
_SRC_ACCESS_ORDER_ANY = 3


class BatchCopier:
    """``cuMemcpyBatchAsync`` through ctypes, as vLLM's ``swap_blocks_batch`` calls it.

    The driver exports the CUDA 12.8 form (with ``failIdx``) as ``cuMemcpyBatchAsync``
    and the CUDA 13 form (without) as ``cuMemcpyBatchAsync_v2``; either does.
    """

    def __init__(self) -> None:
        lib = ctypes.CDLL("libcuda.so.1")
        self.fail_idx = ctypes.c_size_t(0)
        self.idx = ctypes.c_size_t(0)
        ptr = ctypes.c_void_p
        try:
            fn = lib.cuMemcpyBatchAsync
            fn.argtypes = [ptr, ptr, ptr, ctypes.c_size_t, ptr, ptr, ctypes.c_size_t, ptr, ptr]
            self.with_fail_idx = True
        except AttributeError:
            fn = lib.cuMemcpyBatchAsync_v2
            fn.argtypes = [ptr, ptr, ptr, ctypes.c_size_t, ptr, ptr, ctypes.c_size_t, ptr]
            self.with_fail_idx = False
        fn.restype = ctypes.c_int
        self.fn = fn
        self.attrs = {
            order: _MemcpyAttributes(order, _MemLocation(0, 0), _MemLocation(0, 0), 0)
            for order in (_SRC_ACCESS_ORDER_STREAM, _SRC_ACCESS_ORDER_ANY)
        }

    def __call__(self, dsts: Any, srcs: Any, sizes: Any, stream: Any, any_order: bool) -> None:
        """Copy ``sizes[i]`` bytes from ``srcs[i]`` to ``dsts[i]`` (CPU int64 tensors of addresses) on ``stream``."""
        attr = self.attrs[_SRC_ACCESS_ORDER_ANY if any_order else _SRC_ACCESS_ORDER_STREAM]
        args: list[Any] = [
            dsts.data_ptr(),
            srcs.data_ptr(),
            sizes.data_ptr(),
            int(sizes.numel()),
            ctypes.addressof(attr),
            ctypes.addressof(self.idx),
            1,
        ]
        if self.with_fail_idx:
            args.append(ctypes.addressof(self.fail_idx))
        args.append(stream.cuda_stream)
        rc = self.fn(*args)
        if rc != 0:
            raise CalibrationError(f"cuMemcpyBatchAsync returned CUDA error {rc} (failIdx {self.fail_idx.value})")


class Transfers:
    """Pinned host and device buffers, and the copy paths over them."""

    def __init__(self, torch: Any, total_bytes: int, max_page: int) -> None:
        self.torch = torch
        self.total = total_bytes
        # Source slots sit two pages apart, so no two neighbouring pages are contiguous.
        self.host = torch.empty(2 * total_bytes + 2 * max_page, dtype=torch.uint8, pin_memory=True)
        self.dev = torch.empty(total_bytes + 2 * max_page, dtype=torch.uint8, device="cuda")
        self.host.fill_(7)
        self.stream = torch.cuda.Stream()
        self.sms = int(torch.cuda.get_device_properties(0).multi_processor_count)
        self.batch = BatchCopier()
        self.exposed = 0
        self.cycles_per_second = self._sleep_rate()

    def _sleep_rate(self) -> float:
        torch = self.torch
        torch.cuda._sleep(400_000_000)  # clocks up first: at idle clocks the rate would read several times low
        torch.cuda.synchronize()
        with torch.cuda.stream(self.stream):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            torch.cuda._sleep(50_000_000)
            b.record()
        b.synchronize()
        return float(50_000_000 / (a.elapsed_time(b) / 1e3))

    def hold(self, seconds: float) -> None:
        """Keep the stream busy for ``seconds`` so the host can queue work behind it unseen."""
        self.torch.cuda._sleep(int(seconds * self.cycles_per_second))

    def addresses(self, page: int, n: int, direction: str, seed: int = 0) -> tuple[Any, Any, Any]:
        """Scattered host slots and a shuffled order of device pages, as a block table gives them."""
        torch = self.torch
        g = torch.Generator().manual_seed(seed)
        host_slots = torch.randperm(n, generator=g, dtype=torch.int64) * (2 * page) + self.host.data_ptr()
        dev_slots = torch.randperm(n, generator=g, dtype=torch.int64) * page + self.dev.data_ptr()
        sizes = torch.full((n,), page, dtype=torch.int64)
        if direction == "h2d":
            return host_slots, dev_slots, sizes
        return dev_slots, host_slots, sizes

    def pages_for(self, page: int, cap: int) -> int:
        return max(1, min(cap, self.total // page))

    def time_gpu(self, submit: Callable[[], None], reps: int, hold_s: float) -> list[float]:
        """GPU seconds of ``submit``'s work, the host's queueing hidden behind a busy stream."""
        torch = self.torch
        out: list[float] = []
        self.exposed = 0
        for _ in range(reps):
            with torch.cuda.stream(self.stream):
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                self.hold(hold_s)
                a.record()
                submit()
                if a.query():  # the stream ran dry before the host had queued everything
                    self.exposed += 1
                b.record()
            b.synchronize()
            out.append(a.elapsed_time(b) / 1e3)
        return out

    # the paths

    def zero_copy(self, srcs: Any, dsts: Any, sizes: Any, programs: int, page: int) -> Callable[[], None]:
        """The Triton kernel on ``programs`` SMs, its address arrays already on the GPU."""
        if not HAS_TRITON:
            raise CalibrationError("Triton is not installed: the zero-copy path cannot be measured")
        torch = self.torch
        s, d, z = (t.to("cuda") for t in (srcs, dsts, sizes))
        n = int(sizes.numel())
        chunk = min(1 << max(3, (page - 1).bit_length()), 8192)
        grid = (min(programs, n),)
        torch.cuda.synchronize()

        def submit() -> None:
            _copy_pages_kernel[grid](s, d, z, n, CHUNK_BYTES=chunk)

        return submit

    def batched(self, srcs: Any, dsts: Any, sizes: Any, any_order: bool) -> Callable[[], None]:
        """One cuMemcpyBatchAsync of every page."""

        def submit() -> None:
            # on our own stream: cuMemcpyBatchAsync refuses the legacy default stream (CUDA error 1)
            self.batch(dsts, srcs, sizes, self.stream, any_order)

        return submit

    def per_page(self, page: int, n: int, direction: str) -> Callable[[], None]:
        """One cudaMemcpyAsync (``Tensor.copy_``) per page."""
        torch = self.torch
        g = torch.Generator().manual_seed(1)
        hs = (torch.randperm(n, generator=g) * 2 * page).tolist()
        ds = (torch.randperm(n, generator=g) * page).tolist()
        host_views = [self.host[h : h + page] for h in hs]
        dev_views = [self.dev[d : d + page] for d in ds]
        pairs = list(zip(dev_views, host_views, strict=True))
        if direction == "d2h":
            pairs = [(h, d) for d, h in pairs]

        def submit() -> None:
            for dst, src in pairs:
                dst.copy_(src, non_blocking=True)

        return submit

    def contiguous(self, nbytes: int, direction: str) -> Callable[[], None]:
        """One copy of ``nbytes``."""
        h, d = self.host[:nbytes], self.dev[:nbytes]
        dst, src = (d, h) if direction == "h2d" else (h, d)

        def submit() -> None:
            dst.copy_(src, non_blocking=True)

        return submit


def _check_copy(
    run: Run, tr: Transfers, name: str, submit: Callable[[], None], srcs: Any, dsts: Any, page: int
) -> None:
    """Fill the source pages with a pattern, copy, and compare the first destination page."""
    torch = tr.torch
    tr.host[: 16 * MIB].random_(0, 256)  # the checks use 64 pages of 64 KiB at most
    tr.dev[: 16 * MIB].random_(0, 256)
    torch.cuda.synchronize()
    with torch.cuda.stream(tr.stream):
        submit()
    tr.stream.synchronize()
    s0, d0 = int(srcs[0]), int(dsts[0])
    host_base, dev_base = tr.host.data_ptr(), tr.dev.data_ptr()
    if host_base <= s0 < host_base + tr.host.numel():  # h2d
        want = tr.host[s0 - host_base : s0 - host_base + page].cuda()
        got = tr.dev[d0 - dev_base : d0 - dev_base + page]
    else:
        want = tr.dev[s0 - dev_base : s0 - dev_base + page].cpu()
        got = tr.host[d0 - host_base : d0 - host_base + page]
    ok = bool(torch.equal(want.cpu(), got.cpu()))
    run.raw.setdefault("copyChecks", {})[name] = ok
    run.log(f"   copy check {name}: {'ok' if ok else 'WRONG BYTES'}")
    if not ok:
        raise CalibrationError(f"{name} copied the wrong bytes")


def measure_transfers(run: Run, torch: Any) -> None:
    """Bandwidth of every path at every page size, both directions, and both at once."""
    # 512 MiB on the device and twice that pinned: room for the largest whole-prompt restore check
    total = 64 * MIB if run.tiny else 512 * MIB
    tr = Transfers(torch, total, max(PAGE_SIZES))
    run.log(f"pinned pool {2 * total / MIB:.0f} MiB, device buffer {total / MIB:.0f} MiB, {tr.sms} SMs")
    points: list[dict[str, Any]] = run.raw.setdefault("transfers", [])

    def record(direction: str, path: str, page: int, pages: int, secs: list[float]) -> None:
        t = _median(secs)
        points.append(
            {
                "direction": direction,
                "path": path,
                "pageBytes": page,
                "pages": pages,
                "seconds": t,
                "samples": secs,
                "hostExposedReps": tr.exposed,
            }
        )
        exposed = f"  (host queueing showed in {tr.exposed} reps)" if tr.exposed else ""
        run.log(f"   {direction} {path:<16} {page:>9} B x {pages:>6}: {_gbps(page * pages, t):6.1f} GB/s{exposed}")

    broken: set[str] = set()

    def attempt(path: str, what: str, fn: Callable[[], None]) -> None:
        """Run one measurement of ``path``; a failure marks the path broken and the others go on."""
        if path in broken:
            return
        try:
            fn()
        except Exception as exc:
            broken.add(path)
            run.log(f"   FAILED {what}: {type(exc).__name__}: {exc}; no more {path} measurements")
            run.raw.setdefault("errors", {})[what] = f"{type(exc).__name__}: {exc}"

    # correctness first: a path that copies the wrong bytes measures nothing
    s, d, z = tr.addresses(16 * KIB, 64, "h2d")
    zc_check = tr.zero_copy(s, d, z, VLLM_ZERO_COPY_SMS, 16 * KIB) if HAS_TRITON else None
    if zc_check is not None:
        check = partial(_check_copy, run, tr, "zero_copy_12sm h2d", zc_check, s, d, 16 * KIB)
        attempt("zero_copy_12sm", "zero_copy_12sm h2d copy check", check)
    else:
        broken.update({"zero_copy_12sm", "zero_copy_all_sm"})
        run.log("   no Triton: the zero-copy paths are not measured")
    check = partial(_check_copy, run, tr, "batched_dma h2d", tr.batched(s, d, z, True), s, d, 16 * KIB)
    attempt("batched_dma", "batched_dma h2d copy check", check)
    s, d, z = tr.addresses(64 * KIB, 64, "d2h")
    check = partial(_check_copy, run, tr, "batched_dma d2h", tr.batched(s, d, z, False), s, d, 64 * KIB)
    attempt("batched_dma", "batched_dma d2h copy check", check)

    def contiguous(direction: str, nbytes: int) -> None:
        record(direction, "contiguous", nbytes, 1, tr.time_gpu(tr.contiguous(nbytes, direction), 5, 0.002))

    for nbytes in (total // 4, total):
        for direction in ("h2d", "d2h"):
            attempt("contiguous", f"{direction} contiguous {nbytes}", partial(contiguous, direction, nbytes))

    def timed(
        direction: str, path: str, page: int, pages: int, make: Callable[[], Callable[[], None]], hold: float
    ) -> None:
        submit = make()
        with torch.cuda.stream(tr.stream):
            submit()  # warm-up; for the Triton kernel, its compile for this chunk size
        tr.stream.synchronize()
        record(direction, path, page, pages, tr.time_gpu(submit, 5, hold))

    for page in (*PAGE_SIZES, HELD_OUT_PAGE):
        n = tr.pages_for(page, 32768)
        n_pp = min(n, 512)
        for direction in ("h2d", "d2h"):
            s, d, z = tr.addresses(page, n, direction)
            dma = partial(tr.batched, s, d, z, direction == "h2d")
            attempt(
                "batched_dma",
                f"{direction} batched_dma {page}",
                partial(timed, direction, "batched_dma", page, n, dma, 0.15),
            )
            if direction == "h2d":
                for path, programs in (("zero_copy_12sm", VLLM_ZERO_COPY_SMS), ("zero_copy_all_sm", tr.sms)):
                    zc = partial(tr.zero_copy, s, d, z, programs, page)
                    attempt(path, f"h2d {path} {page}", partial(timed, direction, path, page, n, zc, 0.002))
            pp = partial(tr.per_page, page, n_pp, direction)
            attempt(
                "memcpy_per_page",
                f"{direction} memcpy_per_page {page}",
                partial(timed, direction, "memcpy_per_page", page, n_pp, pp, 0.05),
            )
    run.save()

    # both directions at once: one copy each way on two streams, started together
    def both_ways() -> None:
        half = total // 2
        s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
        dev2 = torch.empty(half, dtype=torch.uint8, device="cuda")
        both: list[float] = []
        for _ in range(5):
            with torch.cuda.stream(tr.stream):
                a = torch.cuda.Event(enable_timing=True)
                tr.hold(0.002)
                a.record()
            s1.wait_stream(tr.stream)
            s2.wait_stream(tr.stream)
            with torch.cuda.stream(s1):
                tr.dev[:half].copy_(tr.host[:half], non_blocking=True)
                b1 = torch.cuda.Event(enable_timing=True)
                b1.record()
            with torch.cuda.stream(s2):
                tr.host[total : total + half].copy_(dev2, non_blocking=True)
                b2 = torch.cuda.Event(enable_timing=True)
                b2.record()
            torch.cuda.synchronize()
            both.append(max(a.elapsed_time(b1), a.elapsed_time(b2)) / 1e3)
        run.raw["bidirectional"] = {"bytes": 2 * half, "seconds": _median(both), "samples": both}
        run.log(f"   both directions at once: {_gbps(2 * half, _median(both)):6.1f} GB/s")

    attempt("bidirectional", "both directions at once", both_ways)
    run.save()
    measure_restore_costs(run, tr, broken)


def _wall(torch: Any, fn: Callable[[], None], reps: int) -> list[float]:
    out: list[float] = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        out.append(time.perf_counter() - t0)
    return out


def _slope(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """Least-squares line through (xs, ys): (intercept, slope)."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    return my - b * mx, b


def measure_restore_costs(run: Run, tr: Transfers, broken: set[str]) -> None:
    """Host submit cost per page and per restore, and whole-prompt restores (the held-out check).

    A restore here is what vLLM's worker does per load: turn block ids into page
    addresses, then one submit (the Triton kernel with its address arrays copied up,
    or one cuMemcpyBatchAsync), then wait for it.
    """
    torch = tr.torch
    stream = tr.stream

    def submitter(path: str, page: int, n: int) -> Callable[[], None]:
        block_ids = torch.randperm(n, generator=torch.Generator().manual_seed(3))
        dev_ids = torch.randperm(n, generator=torch.Generator().manual_seed(4))
        if 2 * n * page > tr.host.numel() or n * page > tr.dev.numel():
            raise CalibrationError(f"{n} pages of {page} B do not fit the buffers")
        host_base, dev_base = tr.host.data_ptr(), tr.dev.data_ptr()
        chunk = min(1 << max(3, (page - 1).bit_length()), 8192)
        sizes = torch.full((n,), page, dtype=torch.int64)

        def submit() -> None:
            srcs = block_ids * (2 * page) + host_base
            dsts = dev_ids * page + dev_base
            with torch.cuda.stream(stream):
                if path == "zero_copy_12sm":
                    s, d, z = (t.to("cuda", non_blocking=True) for t in (srcs, dsts, sizes))
                    _copy_pages_kernel[(min(VLLM_ZERO_COPY_SMS, n),)](s, d, z, n, CHUNK_BYTES=chunk)
                else:
                    tr.batch(dsts, srcs, sizes, stream, True)

        return submit

    # host time to submit n pages (no wait): the slope is the per-page cost
    submit_cost: dict[str, float] = {}
    for path, page in (("batched_dma", 32 * KIB), ("zero_copy_12sm", 16 * KIB)):
        if path in broken:
            continue
        ns = [n for n in (256, 1024, 4096) if 2 * n * page <= tr.host.numel() and n * page <= tr.dev.numel()]
        ts: list[float] = []
        for n in ns:
            fn = submitter(path, page, n)
            fn()
            samples: list[float] = []
            for _ in range(7):
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                fn()
                samples.append(time.perf_counter() - t0)
            torch.cuda.synchronize()
            ts.append(_median(samples))
        intercept, slope = _slope([float(n) for n in ns], ts)
        submit_cost[path] = max(0.0, slope)
        run.log(f"   submit {path}: {intercept * 1e6:.1f} us + {slope * 1e9:.1f} ns/page  (points {ts})")
    if "batched_dma" in broken:
        raise CalibrationError("batched DMA is broken here: no restore costs")
    fixed = _median(_wall(torch, submitter("batched_dma", 8 * KIB, VLLM_ZERO_COPY_MIN_PAGES), 21))
    run.log(f"   fixed cost of a restore (16 pages of 8 KiB, submit to done): {fixed * 1e6:.1f} us")
    run.raw["restore"] = {"fixedSeconds": fixed, "submitSecondsPerPage": submit_cost}

    # whole prompts as vLLM 0.32 moves them (breakeven.vllm_page_bytes): 1,480 tokens = 92 full blocks of
    # 16 tokens, a page per layer and block holding its K and V (64 KiB for a Qwen3, 32 KiB per rank at TP 2)
    blocks = 1480 // VLLM_BLOCK_TOKENS
    checks = [
        ("Qwen3-0.6B 1480 tok, 64 KiB pages", 64 * KIB, blocks * 28),
        ("Qwen3-8B 1480 tok, 64 KiB pages", 64 * KIB, blocks * 36),
        ("Qwen3-32B 1480 tok, 64 KiB pages", 64 * KIB, blocks * 64),
        ("Qwen3-8B TP2 1480 tok, 32 KiB pages", 32 * KIB, blocks * 36),
        ("Qwen3-0.6B 1480 tok, 1,835,008 B whole blocks", 1_835_008, blocks),
    ]
    out: list[dict[str, Any]] = []
    for label, page, pages in checks:
        if page * pages * 2 > tr.host.numel() or page * pages > tr.dev.numel():
            run.log(f"   skip check {label}: the buffers are too small")
            continue
        small = page < VLLM_ZERO_COPY_MAX_PAGE_BYTES and pages >= VLLM_ZERO_COPY_MIN_PAGES
        path = "zero_copy_12sm" if small else "batched_dma"
        if path in broken:
            continue
        fn = submitter(path, page, pages)
        fn()
        secs = _wall(torch, fn, 7)
        out.append({"label": label, "pageBytes": page, "pages": pages, "path": path, "seconds": _median(secs)})
        run.log(
            f"   restore {label} via {path}: {_median(secs) * 1e3:.2f} ms "
            f"({_gbps(page * pages, _median(secs)):.1f} GB/s end to end)"
        )
    run.raw["restoreChecks"] = out


# --- pinning -------------------------------------------------------------------------------------


def measure_pinning(run: Run, torch: Any) -> None:
    """Seconds for ``torch.empty(n, pin_memory=True)`` of 1, 4 and 16 GiB, freed (and uncached) between."""
    sizes = (1,) if run.tiny else PIN_SIZES_GIB
    out: list[dict[str, Any]] = []
    torch._C._host_emptyCache()  # the transfer section's pool must not be handed back
    for gib in sizes:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        x = torch.empty(gib * GIB, dtype=torch.uint8, pin_memory=True)
        t = time.perf_counter() - t0
        del x
        torch._C._host_emptyCache()  # the caching host allocator would hand the block back next time
        out.append({"bytes": gib * GIB, "seconds": t})
        run.log(f"   pin {gib:>2} GiB: {t:.2f} s ({t / gib:.2f} s/GiB)")
        run.raw["pinning"] = out
        run.save()


# vLLM 0.32's CPU tier (vllm/v1/kv_offload/cpu/shared_offload_region.py, gpu_worker.py): a file in
# /dev/shm, mmap'd shared, pre-faulted with MADV_POPULATE_WRITE row by row, then registered with
# cudaHostRegister. Not torch's cudaHostAlloc: the pages are shmem, faulted in before the driver pins them.
MADV_POPULATE_WRITE = 23  # <linux/mman.h>; Python's mmap module names it only from 3.13
SHM_ROW_BYTES = 2 * MIB  # about one block of all layers of a Qwen3-8B (16 × 147,456 B): vLLM's row


def _shm_backing(nbytes: int) -> tuple[int, str]:
    """A file descriptor of ``nbytes`` of shmem: in /dev/shm as vLLM does, else a memfd (also shmem)."""
    stat = os.statvfs("/dev/shm") if os.path.isdir("/dev/shm") else None
    if stat is not None and stat.f_bavail * stat.f_frsize > nbytes + GIB:
        path = f"/dev/shm/kvoffload_calibrate_{os.getpid()}.mmap"
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        os.unlink(path)  # vLLM unlinks once every worker has mapped it; the pages stay until closed
        backing = "/dev/shm"
    else:
        fd = os.memfd_create("kvoffload_calibrate")
        backing = "memfd (/dev/shm too small)"
    os.ftruncate(fd, nbytes)
    return fd, backing


def measure_pinning_vllm(run: Run, torch: Any) -> None:
    """Seconds vLLM 0.32's path takes to pin 1, 4 and 16 GiB: mmap, pre-fault by rows, cudaHostRegister."""
    import mmap

    cudart = torch.cuda.cudart()
    sizes = (1,) if run.tiny else PIN_SIZES_GIB
    out: list[dict[str, Any]] = []
    for gib in sizes:
        nbytes = gib * GIB
        t0 = time.perf_counter()
        fd, backing = _shm_backing(nbytes)
        mm = mmap.mmap(fd, nbytes, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        t1 = time.perf_counter()
        for offset in range(0, nbytes, SHM_ROW_BYTES):
            mm.madvise(MADV_POPULATE_WRITE, offset, min(SHM_ROW_BYTES, nbytes - offset))
        t2 = time.perf_counter()
        anchor = ctypes.c_char.from_buffer(mm)
        ptr = ctypes.addressof(anchor)
        err = int(cudart.cudaHostRegister(ptr, nbytes, 0))
        t3 = time.perf_counter()
        if err != 0:
            raise RuntimeError(f"cudaHostRegister of {gib} GiB failed with CUDA error {err}")
        cudart.cudaHostUnregister(ptr)
        del anchor
        mm.close()
        os.close(fd)
        point = {
            "bytes": nbytes,
            "seconds": t3 - t0,
            "mapSeconds": t1 - t0,
            "populateSeconds": t2 - t1,
            "registerSeconds": t3 - t2,
            "backing": backing,
            "rowBytes": SHM_ROW_BYTES,
        }
        out.append(point)
        run.log(
            f"   vLLM path {gib:>2} GiB ({backing}): {t3 - t0:.2f} s ({(t3 - t0) / gib:.2f} s/GiB): "
            f"pre-fault {t2 - t1:.2f} s, cudaHostRegister {t3 - t2:.2f} s"
        )
        run.raw["pinningVllm"] = out
        run.save()


# --- the model forward ------------------------------------------------------------------------------


class Decoder:
    """A dense Qwen3-style decoder with random bf16 weights: what a prefill or decode step computes.

    Fused QKV and gate-up projections as vLLM runs them, RMSNorm on q and k (Qwen3),
    rotary embeddings, causal SDPA with grouped KV heads, SwiGLU, and logits for the last
    token only (vLLM samples one token per prompt).
    """

    def __init__(self, torch: Any, shape: ModelShape, device: str, dtype: Any) -> None:
        self.torch = torch
        self.shape = shape
        self.device = device
        self.dtype = dtype
        s = shape

        def w(*dims: int) -> Any:
            return torch.empty(*dims, device=device, dtype=dtype).normal_(0.0, 0.02)

        self.embed = w(s.vocab, s.hidden)
        self.layers = [
            {
                "qkv": w((s.heads + 2 * s.kv_heads) * s.head_dim, s.hidden),
                "o": w(s.hidden, s.heads * s.head_dim),
                "gate_up": w(2 * s.intermediate, s.hidden),
                "down": w(s.hidden, s.intermediate),
                "in_norm": torch.ones(s.hidden, device=device, dtype=dtype),
                "post_norm": torch.ones(s.hidden, device=device, dtype=dtype),
                "q_norm": torch.ones(s.head_dim, device=device, dtype=dtype),
                "k_norm": torch.ones(s.head_dim, device=device, dtype=dtype),
            }
            for _ in range(s.layers)
        ]
        self.final_norm = torch.ones(s.hidden, device=device, dtype=dtype)
        self.expand_kv = False  # set when SDPA cannot group KV heads without the math kernel

    def rope(self, positions: Any) -> tuple[Any, Any]:
        torch = self.torch
        d = self.shape.head_dim
        inv = 1.0 / (1_000_000.0 ** (torch.arange(0, d, 2, device=self.device, dtype=torch.float32) / d))
        f = positions.float()[:, None] * inv[None, :]
        emb = torch.cat((f, f), dim=-1)
        return emb.cos().to(self.dtype), emb.sin().to(self.dtype)

    @staticmethod
    def _rotate(x: Any, cos: Any, sin: Any) -> Any:
        half = x.shape[-1] // 2
        x1, x2 = x[..., :half], x[..., half:]
        rot = x.new_empty(x.shape)
        rot[..., :half] = -x2
        rot[..., half:] = x1
        return x * cos + rot * sin

    def _attend(self, q: Any, k: Any, v: Any, causal: bool) -> Any:
        F = self.torch.nn.functional
        if self.expand_kv:
            rep = self.shape.heads // self.shape.kv_heads
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)

    def prefill(self, ids: Any) -> Any:
        """Logits of the last token after a forward over ``ids`` (one prompt, nothing cached)."""
        torch = self.torch
        F = torch.nn.functional
        s = self.shape
        t = ids.shape[0]
        cos, sin = self.rope(torch.arange(t, device=self.device))
        cos, sin = cos[:, None, :], sin[:, None, :]
        x = F.embedding(ids, self.embed)
        for layer in self.layers:
            h = F.rms_norm(x, (s.hidden,), layer["in_norm"], 1e-6)
            qkv = F.linear(h, layer["qkv"])
            q, k, v = qkv.split([s.heads * s.head_dim, s.kv_heads * s.head_dim, s.kv_heads * s.head_dim], dim=-1)
            q = F.rms_norm(q.view(t, s.heads, s.head_dim), (s.head_dim,), layer["q_norm"], 1e-6)
            k = F.rms_norm(k.view(t, s.kv_heads, s.head_dim), (s.head_dim,), layer["k_norm"], 1e-6)
            q, k = self._rotate(q, cos, sin), self._rotate(k, cos, sin)
            v = v.view(t, s.kv_heads, s.head_dim)
            a = self._attend(q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None], True)
            x = x + F.linear(a[0].transpose(0, 1).reshape(t, s.heads * s.head_dim), layer["o"])
            h = F.rms_norm(x, (s.hidden,), layer["post_norm"], 1e-6)
            g, u = F.linear(h, layer["gate_up"]).chunk(2, dim=-1)
            x = x + F.linear(F.silu(g) * u, layer["down"])
        last = F.rms_norm(x[-1:], (s.hidden,), self.final_norm, 1e-6)
        return F.linear(last, self.embed)

    def kv_cache(self, batch: int, context: int) -> list[tuple[Any, Any]]:
        """Random K and V of ``context`` tokens (plus one slot for the new token) per sequence and layer."""
        s = self.shape
        torch = self.torch
        return [
            (
                torch.empty(batch, s.kv_heads, context + 1, s.head_dim, device=self.device, dtype=self.dtype).normal_(),
                torch.empty(batch, s.kv_heads, context + 1, s.head_dim, device=self.device, dtype=self.dtype).normal_(),
            )
            for _ in range(s.layers)
        ]

    def decode(self, ids: Any, cache: list[tuple[Any, Any]], cos: Any, sin: Any) -> Any:
        """One decode step: a token per sequence, attending over its cached context (fixed position)."""
        torch = self.torch
        F = torch.nn.functional
        s = self.shape
        b = ids.shape[0]
        pos = cache[0][0].shape[2] - 1
        x = F.embedding(ids, self.embed)
        for layer, (kc, vc) in zip(self.layers, cache, strict=True):
            h = F.rms_norm(x, (s.hidden,), layer["in_norm"], 1e-6)
            q, k, v = F.linear(h, layer["qkv"]).split(
                [s.heads * s.head_dim, s.kv_heads * s.head_dim, s.kv_heads * s.head_dim], dim=-1
            )
            q = F.rms_norm(q.view(b, s.heads, s.head_dim), (s.head_dim,), layer["q_norm"], 1e-6)
            k = F.rms_norm(k.view(b, s.kv_heads, s.head_dim), (s.head_dim,), layer["k_norm"], 1e-6)
            q, k = self._rotate(q, cos, sin), self._rotate(k, cos, sin)
            kc[:, :, pos].copy_(k)
            vc[:, :, pos].copy_(v.view(b, s.kv_heads, s.head_dim))
            a = self._attend(q[:, :, None, :], kc, vc, False)
            x = x + F.linear(a.reshape(b, s.heads * s.head_dim), layer["o"])
            h = F.rms_norm(x, (s.hidden,), layer["post_norm"], 1e-6)
            g, u = F.linear(h, layer["gate_up"]).chunk(2, dim=-1)
            x = x + F.linear(F.silu(g) * u, layer["down"])
        return F.linear(F.rms_norm(x, (s.hidden,), self.final_norm, 1e-6), self.embed)


def _choose_attention(run: Run, model: Decoder) -> None:
    """Group KV heads inside SDPA when a fused kernel can; else expand them (never the O(T²)-memory math kernel)."""
    torch = model.torch
    if model.device == "cpu":
        return
    from torch.nn.attention import SDPBackend, sdpa_kernel

    s = model.shape
    q = torch.randn(1, s.heads, 256, s.head_dim, device="cuda", dtype=model.dtype)
    k = torch.randn(1, s.kv_heads, 256, s.head_dim, device="cuda", dtype=model.dtype)
    fused = [SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]
    try:
        with sdpa_kernel(fused):
            torch.nn.functional.scaled_dot_product_attention(q, k, k, is_causal=True, enable_gqa=True)
        torch.cuda.synchronize()
        model.expand_kv = False
    except RuntimeError as exc:
        run.log(f"   SDPA groups no KV heads in a fused kernel here ({str(exc).splitlines()[0]}); expanding them")
        model.expand_kv = True


def _fused_attention_only(torch: Any, device: str) -> Any:
    """On CUDA, SDPA without its math kernel (whose T×T scores would not fit at 32k tokens); elsewhere nothing."""
    if device != "cuda":
        import contextlib

        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION])


def _time_events(torch: Any, fn: Callable[[], Any], reps: int, device: str) -> list[float]:
    out: list[float] = []
    for _ in range(reps):
        if device == "cpu":
            t0 = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t0)
            continue
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b) / 1e3)
    return out


def measure_model(run: Run, torch: Any, model_name: str, device: str) -> None:
    """Prefill over prompt length and decode ITL over batch size for one model shape."""
    shape = TINY_SHAPE if run.tiny else MODEL_SHAPES[model_name]
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    t0 = time.monotonic()
    model = Decoder(torch, shape, device, dtype)
    _choose_attention(run, model)
    run.log(
        f"   {model_name}: {shape.params / 1e9:.2f}B params, random weights in {time.monotonic() - t0:.1f}s"
        f"{', KV heads expanded' if model.expand_kv else ''}"
    )
    entry: dict[str, Any] = {
        "model": model_name,
        "shape": {
            "layers": shape.layers,
            "hidden": shape.hidden,
            "intermediate": shape.intermediate,
            "heads": shape.heads,
            "kvHeads": shape.kv_heads,
            "headDim": shape.head_dim,
            "vocab": shape.vocab,
        },
        "mode": "eager",
        "expandKV": model.expand_kv,
        "points": [],
        "heldOut": [],
    }
    run.raw.setdefault("prefill", []).append(entry)
    cap = PREFILL_MAX_TOKENS.get(model_name, max(PREFILL_TOKENS))
    grid = [n for n in PREFILL_TOKENS if n <= cap]
    held = [n for n in PREFILL_HELD_OUT if n <= cap]
    if run.tiny:
        grid, held = [16, 32, 64, 128], [48]
    gen = torch.Generator(device=device).manual_seed(0)
    with torch.inference_mode(), _fused_attention_only(torch, device):
        for tokens, where in [*((n, "points") for n in grid), *((n, "heldOut") for n in held)]:
            if run.left() < 20:
                run.log(f"   stop {model_name} prefill at {tokens}: {run.left():.0f}s left")
                break
            try:
                ids = torch.randint(0, shape.vocab, (tokens,), device=device, generator=gen)
                model.prefill(ids)  # warm-up: kernel choice for this shape
                reps = 5 if tokens <= 4096 else 3 if tokens <= 8192 else 2
                secs = _time_events(torch, partial(model.prefill, ids), reps, device)
            except RuntimeError as exc:  # one length that fails (memory, a kernel) leaves the others
                run.log(f"   prefill {tokens} tokens FAILED: {str(exc).splitlines()[0]}")
                run.raw.setdefault("errors", {})[f"prefill {model_name} {tokens}"] = str(exc).splitlines()[0]
                continue
            entry[where].append({"tokens": tokens, "seconds": _median(secs), "samples": secs})
            t = _median(secs)
            run.log(f"   prefill {tokens:>6} tokens: {t * 1e3:8.2f} ms = {tokens / t:9.0f} tok/s")
        run.save()
        if device == "cuda":
            measure_prefill_graphs(run, torch, model, model_name, entry, [*grid, *held])
        measure_decode(run, torch, model, model_name, device)
    del model
    if device == "cuda":
        torch.cuda.empty_cache()


def measure_prefill_graphs(
    run: Run, torch: Any, model: Decoder, model_name: str, eager: dict[str, Any], lengths: Sequence[int]
) -> None:
    """Prefill of the short prompts replayed from a CUDA graph: the GPU's time without the host's launches.

    Eager PyTorch launches some 20 kernels a layer one by one, and below a few thousand
    tokens a small model waits on the host, not the GPU. vLLM fuses many of them
    (torch.compile) and graphs small batches, so its prefill lies between the two curves.
    """
    entry: dict[str, Any] = {**eager, "mode": "cuda_graph", "points": [], "heldOut": []}
    run.raw["prefill"].append(entry)
    held = set(PREFILL_HELD_OUT)
    for tokens in sorted(n for n in lengths if n <= PREFILL_GRAPH_MAX_TOKENS):
        if run.left() < 20:
            run.log(f"   stop {model_name} graph prefill at {tokens}: {run.left():.0f}s left")
            break
        try:
            ids = torch.randint(0, model.shape.vocab, (tokens,), device="cuda")
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                model.prefill(ids)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                model.prefill(ids)
            graph.replay()
            secs = _time_events(torch, graph.replay, 5, "cuda")
            del graph
        except RuntimeError as exc:
            run.log(f"   graph prefill {tokens} tokens FAILED: {str(exc).splitlines()[0]}")
            run.raw.setdefault("errors", {})[f"graph prefill {model_name} {tokens}"] = str(exc).splitlines()[0]
            break
        t = _median(secs)
        entry["heldOut" if tokens in held else "points"].append({"tokens": tokens, "seconds": t, "samples": secs})
        run.log(f"   prefill {tokens:>6} tokens, CUDA graph: {t * 1e3:8.2f} ms = {tokens / t:9.0f} tok/s")
    torch.cuda.empty_cache()
    run.save()


def measure_decode(run: Run, torch: Any, model: Decoder, model_name: str, device: str) -> None:
    """ITL of one decode step over batch size, captured in a CUDA graph as vLLM runs decode."""
    context = 32 if run.tiny else DECODE_CONTEXT
    entry: dict[str, Any] = {"model": model_name, "contextTokens": context, "cudaGraph": device == "cuda", "points": []}
    if device == "cuda":
        torch.cuda.empty_cache()  # prefill's cached blocks would count against the KV cache below
    run.raw.setdefault("decode", []).append(entry)
    for batch in (1, 4) if run.tiny else DECODE_BATCHES:
        if run.left() < 15:
            run.log(f"   stop {model_name} decode at batch {batch}: {run.left():.0f}s left")
            break
        need = batch * (context + 1) * model.shape.kv_bytes_per_token
        if device == "cuda" and need > 0.8 * torch.cuda.mem_get_info()[0]:
            run.log(f"   skip decode batch {batch}: its KV ({need / GIB:.1f} GiB) does not fit beside the weights")
            continue
        cache = model.kv_cache(batch, context)
        ids = torch.randint(0, model.shape.vocab, (batch,), device=device)
        cos, sin = model.rope(torch.full((batch,), context, device=device))
        cos, sin = cos[:, None, :], sin[:, None, :]

        def step(ids: Any = ids, cache: Any = cache, cos: Any = cos, sin: Any = sin) -> Any:
            return model.decode(ids, cache, cos, sin)

        for _ in range(3):
            step()
        fn: Callable[[], Any] = step
        graph: Any = None
        if device == "cuda":
            try:
                side = torch.cuda.Stream()
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    step()
                torch.cuda.current_stream().wait_stream(side)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    step()
                fn = graph.replay
                fn()
            except RuntimeError as exc:  # time it eagerly rather than not at all, and say so
                run.log(f"   decode batch {batch}: no CUDA graph ({str(exc).splitlines()[0]}); timing eager steps")
                entry["cudaGraph"] = False
                graph, fn = None, step
        secs = _time_events(torch, fn, 20, device)
        entry["points"].append({"batch": batch, "seconds": _median(secs), "samples": secs})
        run.log(f"   decode batch {batch:>4} @ {context} ctx: ITL {_median(secs) * 1e3:7.2f} ms")
        del cache, fn, graph
        if device == "cuda":
            torch.cuda.empty_cache()


# --- assembling the profile ------------------------------------------------------------------------


def build_profile(raw: dict[str, Any], gpu_class: str, command: str) -> Profile:
    """The profile of a calibration's raw results; ProfileError says what is missing."""
    env = raw.get("environment", {})
    transfers = [
        {
            "direction": t["direction"],
            "path": t["path"],
            "pageBytes": t["pageBytes"],
            "pages": t["pages"],
            "bytesPerSecond": t["pageBytes"] * t["pages"] / t["seconds"],
        }
        for t in raw.get("transfers", [])
    ]
    bidi = raw.get("bidirectional")
    data: dict[str, Any] = {
        "schemaVersion": SCHEMA_VERSION,
        "gpuClass": gpu_class,
        "kind": "measured",
        "source": {
            "device": env.get("device", ""),
            "driver": env.get("driver", ""),
            "torch": env.get("torch", ""),
            "cuda": env.get("cuda", ""),
            "date": raw.get("date", ""),
            "command": command,
            "host": f"{env.get('cpu', '')}, {env.get('cpus', 0)} CPUs, kernel {env.get('kernel', '')}",
        },
        "transfers": transfers,
        "bidirectionalBytesPerSecond": bidi["bytes"] / bidi["seconds"] if bidi else 0,
        "pinning": [
            *(
                {"bytes": p["bytes"], "seconds": p["seconds"], "path": "torch_pin_memory"}
                for p in raw.get("pinning", [])
            ),
            *(
                {"bytes": p["bytes"], "seconds": p["seconds"], "path": "vllm_shm_register"}
                for p in raw.get("pinningVllm", [])
            ),
        ],
        "restore": {
            **raw.get("restore", {"fixedSeconds": 0, "submitSecondsPerPage": {}}),
            "zeroCopyMaxPageBytes": VLLM_ZERO_COPY_MAX_PAGE_BYTES,
            "zeroCopyMinPages": VLLM_ZERO_COPY_MIN_PAGES,
        },
        "prefill": [
            {
                "model": c["model"],
                "mode": c.get("mode", "eager"),
                "shape": c["shape"],
                "points": [{"tokens": p["tokens"], "seconds": p["seconds"]} for p in c["points"]],
                "heldOut": [{"tokens": p["tokens"], "seconds": p["seconds"]} for p in c["heldOut"]],
            }
            for c in raw.get("prefill", [])
            if c["points"]
        ],
        "decode": [
            {
                "model": c["model"],
                "contextTokens": c["contextTokens"],
                "cudaGraph": c["cudaGraph"],
                "points": [{"batch": p["batch"], "seconds": p["seconds"]} for p in c["points"]],
            }
            for c in raw.get("decode", [])
            if c["points"]
        ],
        "restoreChecks": [
            {k: c[k] for k in ("label", "pageBytes", "pages", "path", "seconds")} for c in raw.get("restoreChecks", [])
        ],
        **({"hit": raw["hit"]} if "hit" in raw else {}),
        "notes": [
            "Transfer rates are GPU time between CUDA events, the host's queueing hidden behind a busy stream; "
            "restore costs add the host's submit time per page and a fixed submit-to-done cost.",
            "Prefill: bf16, random weights, one prompt, logits of the last token only; 'eager' launches every "
            "kernel from Python, 'cuda_graph' replays them (the GPU's time alone).",
            "Decode: one step captured in a CUDA graph, every sequence at the same context length.",
            *([f"Sections that failed: {', '.join(sorted(raw['errors']))}"] if raw.get("errors") else []),
            *(
                [
                    "The host's queueing showed in the GPU time of "
                    + ", ".join(f"{t['direction']} {t['path']} {t['pageBytes']} B" for t in exposed)
                    + ": the driver did not return before the stream ran dry, so these rates are lower bounds."
                ]
                if (exposed := [t for t in raw.get("transfers", []) if t.get("hostExposedReps")])
                else []
            ),
            *raw.get("provenance", []),
            *raw.get("assembly", []),
        ],
    }
    return profile_from_json(data, f"calibration of {gpu_class}")


def comparisons(raw: dict[str, Any]) -> list[tuple[str, float | None, float]]:
    """(figure, measured or None, reference) for every reference figure of issue 11."""
    got: dict[str, float] = {}
    for t in raw.get("transfers", []):
        rate = _gbps(t["pageBytes"] * t["pages"], t["seconds"])
        if t["path"] == "contiguous":
            key = f"{t['direction']} contiguous GB/s"
            got[key] = max(got.get(key, 0.0), rate)
        else:
            got[f"{t['direction']} {t['path']} {t['pageBytes']} B GB/s"] = rate
    if raw.get("bidirectional"):
        got["both directions GB/s"] = _gbps(raw["bidirectional"]["bytes"], raw["bidirectional"]["seconds"])
    for p in raw.get("pinning", []):
        got[f"pin {p['bytes'] // GIB} GiB s"] = p["seconds"]
    for p in raw.get("pinningVllm", []):
        got[f"pin {p['bytes'] // GIB} GiB s, vLLM's path"] = p["seconds"]
    for c in raw.get("prefill", []):
        if c.get("mode", "eager") != "eager":  # the references were eager runs
            continue
        for p in [*c["points"], *c["heldOut"]]:
            got[f"prefill {c['model']} {p['tokens']} tok/s"] = p["tokens"] / p["seconds"]
    return [(k, got.get(k), ref) for k, ref in REFERENCE.items()]


def format_comparisons(raw: dict[str, Any]) -> str:
    """The reference figures beside the measured ones, with their ratio."""
    lines = [f"{'figure':<40} {'measured':>12} {'reference':>12} {'ratio':>7}"]
    for key, got, ref in comparisons(raw):
        shown = "-" if got is None else f"{got:12.4g}"
        ratio = "-" if got is None else f"{got / ref:7.2f}"
        lines.append(f"{key:<40} {shown:>12} {ref:12.4g} {ratio:>7}")
    return "\n".join(lines)


# --- the command -------------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m kvoffload_lab.calibrate",
        description="Measure a GPU class's cost profile for kvoffload (needs a GPU, PyTorch and Triton).",
    )
    p.add_argument("--gpu-class", required=True, help="the catalog GPU class this GPU is, e.g. nvidia-h200-141gb")
    p.add_argument("--models", nargs="+", default=list(MODEL_SHAPES), help="model shapes to time (default: all)")
    p.add_argument("-o", "--output", type=Path, required=True, help="where to write the profile JSON")
    p.add_argument("--raw", type=Path, help="where to write every sample (default: OUTPUT with .raw.json)")
    p.add_argument("--log", type=Path, help="also write the progress to this file")
    p.add_argument("--budget-seconds", type=float, default=480.0, help="stop starting new work after this long")
    p.add_argument("--skip", nargs="*", default=[], choices=["transfers", "prefill", "pinning"], help="skip sections")
    p.add_argument("--from-raw", type=Path, help="assemble the profile from an earlier run's raw file; measure nothing")
    p.add_argument(
        "--estimate-from",
        type=Path,
        help="derive an estimated profile for --gpu-class from this measured one and published figures",
    )
    p.add_argument("--allow-cpu", action="store_true", help="run without CUDA (only with --tiny: checks the logic)")
    p.add_argument("--tiny", action="store_true", help="tiny shapes and sizes: a logic check, not a calibration")
    return p


def main(argv: Iterable[str] | None = None) -> int:
    """Run the calibration (or assemble ``--from-raw``) and write the profile; the exit code says how it went."""
    args = _parser().parse_args(list(argv) if argv is not None else None)
    command = "python -m kvoffload_lab.calibrate " + " ".join(
        a for a in (list(argv) if argv is not None else sys.argv[1:])
    )
    unknown = [m for m in args.models if m not in MODEL_SHAPES]
    if unknown:
        print(f"unknown model shape(s): {', '.join(unknown)}; known: {', '.join(MODEL_SHAPES)}", file=sys.stderr)
        return 2
    if args.estimate_from is not None:
        return _estimate(args.estimate_from, args.gpu_class, args.output, command)
    if args.from_raw is not None:
        raw = json.loads(args.from_raw.read_text())
        raw["assembly"] = [f"Assembled from the raw samples of {raw.get('date', '?')} by: {command}"]
        return _finish(raw, args.gpu_class, raw.get("command", command), args.output, Log(args.log))

    try:
        import torch
    except ImportError:
        print("PyTorch is not installed: the calibration runs in a GPU image with PyTorch and Triton", file=sys.stderr)
        return 2
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu" and not (args.allow_cpu and args.tiny):
        print(
            "CUDA is not available: a calibration measures a GPU. "
            "Pass --allow-cpu --tiny to check the logic on the CPU.",
            file=sys.stderr,
        )
        return 2
    raw_path = args.raw or args.output.with_suffix(".raw.json")
    log = Log(args.log)
    run = Run(
        log=log,
        raw={"date": dt.date.today().isoformat(), "command": command, "gpuClass": args.gpu_class},
        raw_path=raw_path,
        deadline=time.monotonic() + args.budget_seconds,
        tiny=args.tiny,
    )
    log(f"calibrating {args.gpu_class} on {device}; budget {args.budget_seconds:.0f}s; raw samples to {raw_path}")
    run.section("environment", lambda: measure_environment(run, torch))
    if device == "cuda" and "transfers" not in args.skip:
        run.section("transfers", lambda: measure_transfers(run, torch), min_seconds=30)
    elif device == "cpu":
        log("SKIP transfers: no CUDA (pinned memory, DMA and the zero-copy kernel need a GPU)")
    if device == "cuda" and "pinning" not in args.skip:
        run.section("pinning", lambda: measure_pinning(run, torch), min_seconds=20)
        run.section("pinning as vLLM pins", lambda: measure_pinning_vllm(run, torch), min_seconds=30)
    elif device == "cpu":
        log("SKIP pinning: no CUDA (pinned memory needs a GPU driver)")
    if "prefill" not in args.skip:
        for name in args.models:
            run.section(f"model {name}", partial(measure_model, run, torch, name, device), min_seconds=20)
    return _finish(run.raw, args.gpu_class, command, args.output, log)


def _estimate(base_path: Path, gpu_class: str, output: Path, command: str) -> int:
    spec = PUBLISHED_SPECS.get(gpu_class)
    if spec is None:
        print(f"no published figures for {gpu_class!r}; known: {', '.join(PUBLISHED_SPECS)}", file=sys.stderr)
        return 2
    try:
        profile = derive_estimated(load_profile(base_path), spec, date=dt.date.today().isoformat(), command=command)
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 1
    output.write_text(profile.dumps())
    print(f"wrote {output} (estimated from {base_path.name}; {profile.notes[0]})")
    return 0


def _finish(raw: dict[str, Any], gpu_class: str, command: str, output: Path, log: Log) -> int:
    log("reference figures (issue 11) beside this run's:\n" + format_comparisons(raw))
    try:
        profile = build_profile(raw, gpu_class, command)
    except ValueError as exc:
        log(f"no profile written: {exc}")
        return 1
    from kvoffload.economics.profile import held_out_errors

    for e in held_out_errors(profile):
        log(
            f"held out: {e.what}: measured {e.measured_seconds * 1e3:.2f} ms, "
            f"predicted {e.predicted_seconds * 1e3:.2f} ms ({e.relative_error:+.1%})"
        )
    output.write_text(profile.dumps())
    log(f"wrote {output} ({profile.kind}, {len(profile.transfers)} transfer points, {len(profile.prefill)} models)")
    return 0 if not raw.get("errors") else 1


if __name__ == "__main__":
    sys.exit(main())
