"""The host costs of a vLLM 0.32 load that the calibration did not time, timed as vLLM spends them (issue 25, 5 and 6).

Runs on the device machine, which has PyTorch and CUDA but no vLLM, so the few pure-Python pieces of vLLM 0.32 it
needs are copied here, each cited to its file and lines under ``vllm/`` in vLLM 0.32.0's wheel:

- the per-layer pointer fill of every load: ``compute_sub_block_ptrs`` (``v1/kv_offload/cpu/gpu_worker.py``
  80-128, its ``blocks_per_chunk == 1`` fast path, the default: ``offloading/config.py`` 98) and
  ``SingleDirectionOffloadingHandler._fill_direct_ops`` (378-418: two pointer arrays and the sizes per layer),
  into pinned int64 descriptor buffers (``_new_descriptor_buffers``, 242-252; ``canonical_layout`` is off by
  default, ``offloading/config.py`` 173);
- the submit: one ``cuMemcpyBatchAsync`` of every descriptor with ``CU_MEMCPY_SRC_ACCESS_ORDER_ANY`` on a load
  (``transfer_async``, 534-704, ``_custom_ops.swap_blocks_batch``), through ``economics.calibrate.BatchCopier``;
- the block hash: ``hash_block_tokens`` (``v1/core/kv_cache_utils.py`` 695-725) with the default
  ``prefix_caching_hash_algo = "sha256"`` (``config/cache.py`` 143), i.e. ``utils/hashing.py`` 26-41:
  sha256 of ``pickle.dumps((parent, tuple(block_tokens), None), HIGHEST_PROTOCOL)``, chained from
  ``NONE_HASH = sha256("vllm-none-hash")`` (``kv_cache_utils.py`` 122, 160-172), over every full block of a
  request when it is made (``request_block_hasher``, 941-999, called from ``v1/request.py`` 230).

Writes one JSON of every sample and prints a summary. Run from the repository root:

    PYTHONPATH=operator python3 bench/calibration/vllm_load_costs.py --json $OUT/vllm-load-costs.json
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import pickle
import platform
import random
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from kvoffload_lab.calibrate import Transfers

KIB = 1024
PAGE = 64 * KIB  # vLLM 0.32's page for every Qwen3: one layer's K and V of one 16-token block
BLOCKS = 1480 // 16  # the held-out restores: 92 full blocks
SHAPES = {"Qwen3-0.6B": 28, "Qwen3-8B": 36, "Qwen3-32B": 64}  # layers


def median(xs: list[float]) -> float:
    return float(statistics.median(xs))


# --- vLLM 0.32, copied --------------------------------------------------------------------------------


def compute_sub_block_ptrs(
    block_ids: np.ndarray, blocks_per_chunk: int, output: np.ndarray, tensor: torch.Tensor, skip_count: int = 0
) -> None:
    """gpu_worker.py 80-128 (the fast path; vLLM's default blocks_per_chunk is 1)."""
    assert skip_count < blocks_per_chunk
    num_sub_blocks = len(output)
    base_ptr = tensor.data_ptr()
    row_stride = tensor.stride(0)
    if blocks_per_chunk == 1:
        output[:] = base_ptr + block_ids.astype(np.uint64)[:num_sub_blocks] * row_stride
        return
    raise NotImplementedError("only the default blocks_per_chunk == 1 is copied")


def fill_direct_ops(
    src_tensors: list[torch.Tensor],
    dst_tensors: list[torch.Tensor],
    group_src: np.ndarray,
    group_dst: np.ndarray,
    all_src: np.ndarray,
    all_dst: np.ndarray,
    all_sizes: np.ndarray,
) -> int:
    """gpu_worker.py 378-418, one KV cache group, one page size: returns the descriptors filled."""
    group_size = len(group_dst)
    op_idx = 0
    for t_idx in range(len(src_tensors)):
        end_idx = op_idx + group_size
        compute_sub_block_ptrs(group_src, 1, all_src[op_idx:end_idx], src_tensors[t_idx], skip_count=0)
        compute_sub_block_ptrs(group_dst, 1, all_dst[op_idx:end_idx], dst_tensors[t_idx], skip_count=0)
        all_sizes[op_idx:end_idx] = PAGE
        op_idx = end_idx
    return op_idx


def vllm_sha256(obj: Any) -> bytes:
    """utils/hashing.py 26-41."""
    return hashlib.sha256(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)).digest()


NONE_HASH = vllm_sha256("vllm-none-hash")


def request_block_hashes(all_token_ids: list[int], block: int = 16) -> list[bytes]:
    """kv_cache_utils.py 954-999 and 695-725, a text-only request without LoRA (extra_keys None)."""
    out: list[bytes] = []
    parent: bytes | None = None
    start = 0
    while start + block <= len(all_token_ids):
        tokens = all_token_ids[start : start + block]
        parent = vllm_sha256((parent or NONE_HASH, tuple(tokens), None))
        out.append(parent)
        start += block
    return out


# --- measurements ----------------------------------------------------------------------------------


def time_host(fn: Callable[[], Any], reps: int) -> list[float]:
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def measure_hash(raw: dict[str, Any], runs: int) -> None:
    rng = random.Random(5)
    rows = []
    for blocks in (92, 200):
        tokens = [rng.randrange(1, 151_936) for _ in range(blocks * 16)]
        request_block_hashes(tokens)
        samples = time_host(lambda t=tokens: request_block_hashes(t), runs)  # type: ignore[misc]
        rows.append({"blocks": blocks, "seconds": samples, "median": median(samples)})
        m = median(samples)
        print(f"hash {blocks} blocks: median {m * 1e6:.1f} us = {m / blocks * 1e6:.3f} us/block")
    per_block = (rows[1]["median"] - rows[0]["median"]) / (200 - 92)
    raw["hash"] = {"rows": rows, "secondsPerBlockSlope": per_block, "secondsPerBlockAt200": rows[1]["median"] / 200}
    print(f"hash slope {per_block * 1e6:.3f} us/block")


def layer_tensors(layers: int, blocks: int, device: str = "cuda") -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    pin = device == "cuda"
    cpu = [torch.empty((blocks, PAGE), dtype=torch.int8, pin_memory=pin) for _ in range(layers)]
    gpu = [torch.empty((blocks, PAGE), dtype=torch.int8, device=device) for _ in range(layers)]
    return cpu, gpu


def measure_fill_only(raw: dict[str, Any], runs: int) -> None:
    """The per-layer fill with both sides' tensors in host memory: the same numpy work, for a host without a GPU."""
    slots = 160
    cpu_all, dev_all = layer_tensors(max(SHAPES.values()), slots, "cpu")
    rng = np.random.default_rng(9)
    out = []
    for name, layers in SHAPES.items():
        n = layers * BLOCKS
        a_src, a_dst, a_sizes = (np.empty(n, dtype=np.int64) for _ in range(3))
        cpu_ids = rng.permutation(slots)[:BLOCKS].astype(np.int64)
        gpu_ids = rng.permutation(slots)[:BLOCKS].astype(np.int64)
        args = (cpu_all[:layers], dev_all[:layers], cpu_ids, gpu_ids, a_src, a_dst, a_sizes)
        fill_direct_ops(*args)
        fills = time_host(lambda args=args: fill_direct_ops(*args), runs)  # type: ignore[misc]
        out.append({"shape": name, "layers": layers, "pages": n, "fillSeconds": fills})
        print(f"fill {name}: {median(fills) * 1e6:.1f} us ({median(fills) / layers * 1e6:.2f} us/layer)")
    raw["fills"] = out


def measure_loads(raw: dict[str, Any], tr: Transfers, runs: int) -> None:
    """The per-layer fill alone, and whole loads as vLLM submits them (fill, one batch, wait), per shape."""
    slots = 160
    cpu_all, gpu_all = layer_tensors(max(SHAPES.values()), slots)
    rng = np.random.default_rng(9)
    out = []
    for name, layers in SHAPES.items():
        src_t, dst_t = cpu_all[:layers], gpu_all[:layers]
        n = layers * BLOCKS
        batch_src = torch.empty(n, dtype=torch.int64, pin_memory=True)
        batch_dst = torch.empty(n, dtype=torch.int64, pin_memory=True)
        batch_sizes = torch.empty(n, dtype=torch.int64, pin_memory=True)
        a_src, a_dst, a_sizes = batch_src.numpy(), batch_dst.numpy(), batch_sizes.numpy()
        cpu_ids = rng.permutation(slots)[:BLOCKS].astype(np.int64)
        gpu_ids = rng.permutation(slots)[:BLOCKS].astype(np.int64)

        fill = functools.partial(fill_direct_ops, src_t, dst_t, cpu_ids, gpu_ids, a_src, a_dst, a_sizes)

        fill()
        fills = time_host(fill, runs)
        stream = tr.stream
        walls, submits, gpu_ms = [], [], []
        for _ in range(runs + 1):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            fill()
            t1 = time.perf_counter()
            with torch.cuda.stream(stream):
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record(stream)
                tr.batch(batch_dst, batch_src, batch_sizes, stream, True)
                t2 = time.perf_counter()
                b.record(stream)
            b.synchronize()
            t3 = time.perf_counter()
            walls.append(t3 - t0)
            submits.append(t2 - t1)
            gpu_ms.append(a.elapsed_time(b) / 1e3)
        walls, submits, gpu_ms = walls[1:], submits[1:], gpu_ms[1:]  # the first is a warm-up
        # the copy's own GPU time, the submit hidden behind a busy stream (calibrate's Transfers.time_gpu)
        copy = functools.partial(tr.batch, batch_dst, batch_src, batch_sizes, stream, True)
        hidden = tr.time_gpu(copy, runs, 0.02)
        row = {
            "shape": name,
            "layers": layers,
            "pages": n,
            "pageBytes": PAGE,
            "fillSeconds": fills,
            "loadWallSeconds": walls,
            "submitSeconds": submits,
            "eventSeconds": gpu_ms,
            "copyGpuSeconds": hidden,
        }
        out.append(row)
        print(
            f"load {name} ({layers} layers, {n} pages): fill {median(fills) * 1e6:.1f} us "
            f"({median(fills) / layers * 1e6:.2f} us/layer), submit {median(submits) * 1e6:.1f} us "
            f"({median(submits) / n * 1e9:.1f} ns/page), copy alone {median(hidden) * 1e3:.3f} ms "
            f"({n * PAGE / median(hidden) / 1e9:.1f} GB/s), load in all {median(walls) * 1e3:.3f} ms"
        )
    raw["loads"] = out


def measure_submit_slope(raw: dict[str, Any], tr: Transfers, runs: int) -> None:
    """calibrate.measure_restore_costs' per-page submit slope (32 KiB, 256/1,024/4,096 pages), over ``runs`` runs."""
    page = 32 * KIB
    slopes = []
    for _ in range(runs):
        ts = []
        ns = (256, 1024, 4096)
        for n in ns:
            srcs, dsts, sizes = tr.addresses(page, n, "h2d", seed=n)

            submit = functools.partial(tr.batch, dsts, srcs, sizes, tr.stream, True)

            submit()
            samples = []
            for _ in range(7):
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                submit()
                samples.append(time.perf_counter() - t0)
            torch.cuda.synchronize()
            ts.append(median(samples))
        mx, my = statistics.fmean(ns), statistics.fmean(ts)
        slope = sum((x - mx) * (y - my) for x, y in zip(ns, ts, strict=True)) / sum((x - mx) ** 2 for x in ns)
        slopes.append(slope)
    raw["submitSlope"] = {"pageBytes": page, "secondsPerPage": slopes, "median": median(slopes)}
    every = [round(s * 1e9, 1) for s in slopes]
    print(f"submit slope over {runs} runs: median {median(slopes) * 1e9:.1f} ns/page, all {every}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", required=True)
    p.add_argument("--runs", type=int, default=21)
    p.add_argument("--host-only", action="store_true", help="the hash and the fill alone, no GPU")
    args = p.parse_args()
    with open("/proc/cpuinfo") as f:
        cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), platform.processor())
    raw: dict[str, Any] = {
        "command": f"PYTHONPATH=operator python3 bench/calibration/vllm_load_costs.py --json ... --runs {args.runs}",
        "device": "none" if args.host_only else torch.cuda.get_device_name(0),
        "cpu": cpu,
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "torch": torch.__version__,
        "kernel": platform.release(),
    }
    print(f"device {raw['device']}, host {cpu} ({raw['cpus']} CPUs), python {raw['python']}, numpy {raw['numpy']}")
    measure_hash(raw, args.runs)
    if args.host_only:
        measure_fill_only(raw, args.runs)
        with open(args.json, "w") as f:
            json.dump(raw, f, indent=1)
        return
    tr = Transfers(torch, 4096 * 32 * KIB, 64 * KIB)
    measure_submit_slope(raw, tr, 9)
    measure_loads(raw, tr, args.runs)
    with open(args.json, "w") as f:
        json.dump(raw, f, indent=1)


if __name__ == "__main__":
    main()
