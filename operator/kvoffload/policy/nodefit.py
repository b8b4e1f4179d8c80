"""The checks no node could pass, and the rest of what the schema cannot see of a policy (unknown catalog
entries): run on every parse, by the operator, its webhook and the CLI (docs/design.md, "Sizing").
"""

from __future__ import annotations

from kvoffload.api.errors import FieldError
from kvoffload.api.quantity import format_bytes, quantity_bytes
from kvoffload.api.types import KVOffloadPolicy, KVOffloadPolicySpec
from kvoffload.policy.catalog import GPUClass, find_gpu_class, find_model, gpu_class_names
from kvoffload.policy.hostmemory import host_memory, memory_backed_tier_bytes, pinned_pool_bytes
from kvoffload.policy.kvshape import not_in_catalog
from kvoffload.policy.ladder import build_ladder


def check_fits_node(spec: KVOffloadPolicySpec, gpu: GPUClass) -> list[FieldError]:
    """What can never be scheduled on a node of the GPU class: more GPUs than a node has, a tier
    or a pod's memory request larger than the node's whole host memory. Each error names the field
    to change; empty when every level fits.
    """
    errors: list[FieldError] = []
    node = gpu.host_ram_per_node_bytes
    where = f"a whole {gpu.name} node's host memory, {format_bytes(node)} ({gpu.host_ram_source})"
    if spec.gpu.count > gpu.gpus_per_node:
        errors.append(
            FieldError(
                "spec.gpu.count", f"{spec.gpu.count} GPUs per engine, but a {gpu.name} node has {gpu.gpus_per_node}"
            )
        )
    top = build_ladder(spec)[-1]  # the levels only add tiers, so the top one needs the most
    pool = pinned_pool_bytes(spec, top)
    if pool > node:
        factor = spec.offload.overhead_factor
        pinned = f"{format_bytes(pool)} pinned" + (f" with overheadFactor {factor}" if factor != 1.0 else "")
        errors.append(
            FieldError("spec.offload.cpu", f"the CPU tier ({pinned}) is larger than {where}; no node can hold it")
        )
    for i, tier in enumerate(top.secondary_tiers):
        size = quantity_bytes(tier.size)
        if tier.volume.empty_dir is not None and tier.volume.empty_dir.medium == "Memory" and size > node:
            errors.append(
                FieldError(
                    f"spec.offload.secondaryTiers[{i}].size",
                    f"the memory-backed tier ({format_bytes(size)}) is larger than {where}; no node can hold it",
                )
            )
    if errors:
        return errors
    request = host_memory(spec, top).request
    if request > node:
        parts = {
            "spec.resources.baseMemory": quantity_bytes(spec.resources.base_memory),
            "spec.offload.cpu": pool,
            "spec.resources.headroom": quantity_bytes(spec.resources.headroom),
        }
        biggest = max(parts, key=lambda k: parts[k])
        errors.append(
            FieldError(
                biggest,
                f"the memory request of level {top.name}, {format_bytes(request)} per replica (baseMemory "
                f"{format_bytes(parts['spec.resources.baseMemory'])} + pinned pool {format_bytes(pool)} + headroom "
                f"{format_bytes(parts['spec.resources.headroom'])}"
                + (
                    f" + memory-backed tiers {format_bytes(memory_backed_tier_bytes(top))}"
                    if memory_backed_tier_bytes(top)
                    else ""
                )
                + f") is more than {where}; no node can schedule it",
            )
        )
    return errors


def check_policy(policy: KVOffloadPolicy) -> list[FieldError]:
    """Problems the schema cannot see (unknown catalog entries, what no node of the GPU class can
    hold); empty when the policy can be sized and scheduled.

    Only hard errors: things that are merely unwise (a TP size that does not divide
    the KV heads, a small tier) are ``plan`` warnings.
    """
    spec = policy.spec
    errors: list[FieldError] = []
    gpu = find_gpu_class(spec.gpu.class_)
    if gpu is None:
        errors.append(
            FieldError(
                "spec.gpu.class", f"unknown GPU class {spec.gpu.class_!r}; known: {', '.join(gpu_class_names())}"
            )
        )
    else:
        errors += check_fits_node(spec, gpu)
    arch = spec.model.architecture
    if arch is None and spec.model.config_map is None and find_model(spec.model.name) is None:
        errors.append(FieldError("spec.model.name", not_in_catalog(spec.model.name)))
    if arch is not None and arch.kv_lora_rank is not None and arch.qk_rope_head_dim is None:
        errors.append(FieldError("spec.model.architecture.qkRopeHeadDim", "required with kvLoraRank (MLA)"))
    return errors
