"""The engine's price list and GPU KV cache size: ``--gpu-class`` and vLLM's cache-sizing flags (issue 11, part 2).

Pricing: with ``--gpu-class`` the class's shipped profile and the model's curves in it
(``costmodel.class_cost``); a model the profile has no curve for is an error naming the class
and the models it has. Without a class, the seed's laptop (``costmodel.laptop_cost``).

GPU KV cache, in blocks, first that applies (vLLM's own precedence, the emulator's knob first):

1. ``--gpu-kv-blocks`` (the emulator's knob, kept as it was);
2. ``--num-gpu-blocks-override``;
3. ``--kv-cache-memory-bytes`` (per GPU, as in vLLM): bytes // the block's bytes on one rank;
4. with a class, ``--gpu-memory-utilization`` (default 0.9) × the class's memory
   (``policy/catalog.py``) less the model's weights on one rank; activations, CUDA graphs and
   the runtime's own memory are not subtracted, so this overstates the cache by a few GiB;
5. else the default 4,096 blocks.

As vLLM does, a cache sized by 2–4 that cannot hold one ``--max-model-len`` sequence is an error.
"""

from __future__ import annotations

import dataclasses
import logging

from kvoffload.economics.profile import ProfileError
from kvoffload_lab.engine.costmodel import CostModel, class_cost, laptop_cost

log = logging.getLogger("kvoffload.emulate")


class SizingError(ValueError):
    """A class or cache-sizing flag the engine cannot honour; the message starts with the flag."""


def engine_cost(
    gpu_class: str | None, model: str, *, tensor_parallel_size: int, block_size: int, kv_bytes_per_token: int
) -> CostModel:
    """The price list: the class's profile for ``model``, or the seed's laptop without a class."""
    if gpu_class is None:
        return dataclasses.replace(laptop_cost(model, tensor_parallel_size), kv_bytes_per_token=kv_bytes_per_token)
    try:
        return class_cost(
            gpu_class,
            model,
            tensor_parallel_size=tensor_parallel_size,
            block_size=block_size,
            kv_bytes_per_token=kv_bytes_per_token,
        )
    except ProfileError as exc:
        raise SizingError(f"--gpu-class: {exc}") from exc


def with_itl(cost: CostModel, itl: float | None) -> CostModel:
    """``cost`` with ``--itl`` in place of the profile's ITL, when given."""
    return cost if itl is None else dataclasses.replace(cost, itl_s=itl, itl_given=True)


def gpu_kv_blocks(
    *,
    default_blocks: int,
    gpu_kv_blocks: int | None,
    num_gpu_blocks_override: int | None,
    kv_cache_memory_bytes: int | None,
    gpu_memory_utilization: float,
    utilization_given: bool,
    gpu_class: str | None,
    model: str,
    block_bytes: int,
    block_size: int,
    tensor_parallel_size: int,
    max_model_len: int,
) -> int:
    """The GPU KV cache in blocks, by the precedence in the module docstring; SizingError names the flag."""
    for name, value in (
        ("--kv-cache-memory-bytes", kv_cache_memory_bytes),
        ("--num-gpu-blocks-override", num_gpu_blocks_override),
    ):
        if value is not None and value <= 0:
            raise SizingError(f"{name}: must be positive, got {value}")
    if gpu_kv_blocks is not None:
        for name, value in (
            ("--num-gpu-blocks-override", num_gpu_blocks_override),
            ("--kv-cache-memory-bytes", kv_cache_memory_bytes),
        ):
            if value is not None:
                log.warning("%s %s: --gpu-kv-blocks %s takes precedence", name, value, gpu_kv_blocks)
        return gpu_kv_blocks
    rank_block_bytes = max(1, block_bytes // tensor_parallel_size)
    if num_gpu_blocks_override is not None:
        flag, blocks = "--num-gpu-blocks-override", num_gpu_blocks_override
        if kv_cache_memory_bytes is not None:
            log.warning("--kv-cache-memory-bytes: --num-gpu-blocks-override takes precedence (as in vLLM)")
    elif kv_cache_memory_bytes is not None:
        flag, blocks = "--kv-cache-memory-bytes", kv_cache_memory_bytes // rank_block_bytes
    elif gpu_class is not None:
        flag = "--gpu-memory-utilization"
        blocks = _blocks_by_utilization(
            gpu_class, model, gpu_memory_utilization, tensor_parallel_size, rank_block_bytes
        )
    else:
        if utilization_given:
            log.warning(
                "--gpu-memory-utilization: without --gpu-class the GPU's memory is unknown; "
                "the GPU KV cache stays %d blocks",
                default_blocks,
            )
        return default_blocks
    if blocks * block_size < max_model_len:
        raise SizingError(
            f"{flag}: a GPU KV cache of {blocks} blocks holds {blocks * block_size} tokens, "
            f"fewer than --max-model-len {max_model_len} (vLLM refuses to start)"
        )
    return blocks


def _blocks_by_utilization(
    gpu_class: str, model: str, utilization: float, tensor_parallel_size: int, rank_block_bytes: int
) -> int:
    from kvoffload.policy.catalog import find_gpu_class, find_model

    gpu = find_gpu_class(gpu_class)
    if gpu is None:
        raise SizingError(f"--gpu-class: {gpu_class!r} is not in the GPU catalog")
    entry = find_model(model)
    if entry is None:
        raise SizingError(
            f"--gpu-memory-utilization: {model!r} is not in the model catalog, so its weights are unknown; "
            "pass --kv-cache-memory-bytes or --num-gpu-blocks-override"
        )
    weights = entry.weight_bytes / tensor_parallel_size
    free = utilization * gpu.memory_bytes - weights
    if free <= 0:
        raise SizingError(
            f"--gpu-memory-utilization: {utilization} of {gpu_class} leaves no room "
            f"after {weights / 2**30:.1f} GiB of weights per GPU"
        )
    return int(free // rank_block_bytes)
