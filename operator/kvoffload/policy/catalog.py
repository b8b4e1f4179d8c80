"""The built-in catalogs: the KV shape of popular open models, and GPU classes.

Every model entry holds the config.json values sizing needs and cites the
config.json they come from. Every GPU class holds what scheduling needs (the
extended resource, the node labels GPU feature discovery sets, the usual
taint) and what sizing needs (GPU memory, typical host RAM per GPU).

Pure: no I/O except the explicit ``load_config_file`` helper.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from kvoffload.api.podspec import Toleration
from kvoffload.api.quantity import GIB, MIB
from kvoffload.api.serving import Architecture

GB = 10**9

# vLLM's dtype "auto" serves float32 and float16 checkpoints in float16 and
# bfloat16 ones in bfloat16 (vLLM docs, --dtype), so KV "auto" is 2 bytes for all three.
_CONFIG_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "half": 2, "float32": 2, "float": 2}


# --- models -------------------------------------------------------------------


@dataclass(frozen=True)
class ModelEntry:
    """One model: its KV shape, the size of its weights, and where the figures come from."""

    name: str
    """Hugging Face id, as `vllm serve` takes it."""
    architecture: Architecture
    params: float
    """Total parameters (all experts for MoE models)."""
    weight_bytes_per_param: float
    """Bytes per parameter as the checkpoint stores them (2 for bf16, 1 for fp8...)."""
    source: str
    """URL of the config.json the KV figures come from."""
    aliases: tuple[str, ...] = ()
    """Other HF ids with the same KV shape (instruct or renamed repos)."""
    max_position_embeddings: int | None = None
    sliding_window_layers: int = 0
    """Layers that attend over a sliding window only; counted as full layers (an upper bound)."""
    note: str = ""

    @property
    def weight_bytes(self) -> int:
        """Rough size of the weights on the GPUs, all ranks together."""
        return round(self.params * self.weight_bytes_per_param)

    def names(self) -> tuple[str, ...]:
        return (self.name, *self.aliases)


def _gqa(layers: int, kv_heads: int, head_dim: int, dtype_bytes: int = 2) -> Architecture:
    return Architecture(num_layers=layers, num_kv_heads=kv_heads, head_dim=head_dim, dtype_bytes=dtype_bytes)


def _mla(layers: int, kv_lora_rank: int, qk_rope_head_dim: int, dtype_bytes: int = 2) -> Architecture:
    return Architecture(
        num_layers=layers, kv_lora_rank=kv_lora_rank, qk_rope_head_dim=qk_rope_head_dim, dtype_bytes=dtype_bytes
    )


def _hf(repo: str) -> str:
    return f"https://huggingface.co/{repo}/blob/main/config.json"


# All checkpoints below declare torch_dtype bfloat16 in their config.json.
MODELS: tuple[ModelEntry, ...] = (
    ModelEntry(
        "Qwen/Qwen3-0.6B",
        _gqa(28, 8, 128),  # explicit head_dim 128 (hidden 1024 / 16 heads would give 64)
        0.6e9,
        2,
        _hf("Qwen/Qwen3-0.6B"),
        max_position_embeddings=40960,
    ),
    ModelEntry(
        "Qwen/Qwen3-4B",
        _gqa(36, 8, 128),  # hidden 2560 / 32 heads would give 80: explicit head_dim 128
        4.0e9,
        2,
        _hf("Qwen/Qwen3-4B"),
        max_position_embeddings=40960,
    ),
    ModelEntry(
        "Qwen/Qwen3-8B",
        _gqa(36, 8, 128),
        8.2e9,
        2,
        _hf("Qwen/Qwen3-8B"),
        max_position_embeddings=40960,
    ),
    ModelEntry(
        "Qwen/Qwen3-32B",
        _gqa(64, 8, 128),  # explicit head_dim 128; hidden 5120 / 40 heads
        32.8e9,
        2,
        _hf("Qwen/Qwen3-32B"),
        max_position_embeddings=40960,
    ),
    ModelEntry(
        "Qwen/Qwen3-30B-A3B",
        _gqa(48, 4, 128),
        30.5e9,
        2,
        _hf("Qwen/Qwen3-30B-A3B"),
        max_position_embeddings=40960,
    ),
    ModelEntry(
        "Qwen/Qwen2.5-7B-Instruct",
        _gqa(28, 4, 128),  # hidden 3584 / 28 heads
        7.6e9,
        2,
        _hf("Qwen/Qwen2.5-7B-Instruct"),
        max_position_embeddings=32768,
    ),
    ModelEntry(
        "meta-llama/Llama-3.1-8B",
        _gqa(32, 8, 128),  # hidden 4096 / 32 heads
        8.0e9,
        2,
        _hf("meta-llama/Llama-3.1-8B"),
        aliases=("meta-llama/Llama-3.1-8B-Instruct", "meta-llama/Meta-Llama-3.1-8B-Instruct"),
        max_position_embeddings=131072,
    ),
    ModelEntry(
        "meta-llama/Llama-3.1-70B",
        _gqa(80, 8, 128),  # hidden 8192 / 64 heads
        70.6e9,
        2,
        _hf("meta-llama/Llama-3.1-70B"),
        aliases=("meta-llama/Llama-3.1-70B-Instruct", "meta-llama/Meta-Llama-3.1-70B-Instruct"),
        max_position_embeddings=131072,
    ),
    ModelEntry(
        "meta-llama/Llama-3.3-70B-Instruct",
        _gqa(80, 8, 128),
        70.6e9,
        2,
        _hf("meta-llama/Llama-3.3-70B-Instruct"),
        max_position_embeddings=131072,
    ),
    ModelEntry(
        "mistralai/Mistral-7B-Instruct-v0.3",
        _gqa(32, 8, 128),  # hidden 4096 / 32 heads
        7.25e9,
        2,
        _hf("mistralai/Mistral-7B-Instruct-v0.3"),
        aliases=("mistralai/Mistral-7B-v0.3",),
        max_position_embeddings=32768,
    ),
    ModelEntry(
        "mistralai/Mixtral-8x7B-Instruct-v0.1",
        _gqa(32, 8, 128),  # hidden 4096 / 32 heads
        46.7e9,
        2,
        _hf("mistralai/Mixtral-8x7B-Instruct-v0.1"),
        aliases=("mistralai/Mixtral-8x7B-v0.1",),
        max_position_embeddings=32768,
    ),
    ModelEntry(
        "google/gemma-3-27b-it",
        _gqa(62, 16, 128),  # text_config; 5 of every 6 layers are local (sliding window 1024)
        27.4e9,
        2,
        _hf("google/gemma-3-27b-it"),
        max_position_embeddings=131072,
        sliding_window_layers=52,
        note="52 of 62 layers use a 1,024-token sliding window; counted as full layers",
    ),
    ModelEntry(
        "deepseek-ai/DeepSeek-V3",
        _mla(61, 512, 64),  # MLA: the compressed latent (512) plus the RoPE key (64) per layer
        671e9,
        1,  # the checkpoint is fp8 (quantization_config fp8 e4m3); KV "auto" is bf16
        _hf("deepseek-ai/DeepSeek-V3"),
        aliases=("deepseek-ai/DeepSeek-V3-0324", "deepseek-ai/DeepSeek-R1", "deepseek-ai/DeepSeek-R1-0528"),
        max_position_embeddings=163840,
    ),
    ModelEntry(
        "openai/gpt-oss-20b",
        _gqa(24, 8, 64),  # explicit head_dim 64; alternating sliding (128) and full layers
        20.9e9,
        0.6,  # MoE weights in MXFP4 (~4.25 bits); the checkpoint is about 13 GB
        _hf("openai/gpt-oss-20b"),
        max_position_embeddings=131072,
        sliding_window_layers=12,
        note="12 of 24 layers use a 128-token sliding window; counted as full layers",
    ),
    ModelEntry(
        "openai/gpt-oss-120b",
        _gqa(36, 8, 64),
        116.8e9,
        0.56,  # MoE weights in MXFP4; the checkpoint is about 65 GB
        _hf("openai/gpt-oss-120b"),
        max_position_embeddings=131072,
        sliding_window_layers=18,
        note="18 of 36 layers use a 128-token sliding window; counted as full layers",
    ),
)

_BY_NAME: dict[str, ModelEntry] = {n.lower(): m for m in MODELS for n in m.names()}


def find_model(name: str) -> ModelEntry | None:
    """The catalog entry for a Hugging Face id (case-insensitive), or None."""
    return _BY_NAME.get(name.strip().lower())


def model_names() -> list[str]:
    """Every id the catalog knows, aliases included, sorted."""
    return sorted(n for m in MODELS for n in m.names())


# --- reading a Hugging Face config.json ---------------------------------------------


class ConfigError(ValueError):
    """A config.json that does not describe a model's KV shape; the message names the key."""


def _positive_int(config: Mapping[str, Any], key: str) -> int | None:
    value = config.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{key} must be a positive integer, got {value!r}")
    return value


def _require(config: Mapping[str, Any], *keys: str) -> int:
    for key in keys:
        value = _positive_int(config, key)
        if value is not None:
            return value
    raise ConfigError(f"{' or '.join(keys)} is missing")


def architecture_from_config(config: Mapping[str, Any]) -> Architecture:
    """The KV shape of a Hugging Face config.json (already parsed).

    Handles GQA/MHA (``num_key_value_heads``, defaulting to ``num_attention_heads``;
    ``head_dim``, defaulting to ``hidden_size / num_attention_heads``), MLA
    (``kv_lora_rank`` + ``qk_rope_head_dim``), and multimodal configs whose
    language model sits under ``text_config``. Raises ConfigError naming the key.
    """
    if not isinstance(config, Mapping):
        raise ConfigError("config.json must be a JSON object")
    text = config.get("text_config")
    lm: Mapping[str, Any] = text if isinstance(text, Mapping) and "num_hidden_layers" in text else config
    dtype_name = lm.get("torch_dtype") or lm.get("dtype") or config.get("torch_dtype") or config.get("dtype")
    dtype_bytes = _CONFIG_DTYPE_BYTES.get(str(dtype_name), 2) if dtype_name else 2
    layers = _require(lm, "num_hidden_layers", "num_layers", "n_layer")
    try:
        if lm.get("kv_lora_rank") is not None:
            rank = _require(lm, "kv_lora_rank")
            rope = lm.get("qk_rope_head_dim")
            if isinstance(rope, bool) or not isinstance(rope, int) or rope < 0:
                raise ConfigError(f"qk_rope_head_dim must be a non-negative integer, got {rope!r}")
            return Architecture(num_layers=layers, kv_lora_rank=rank, qk_rope_head_dim=rope, dtype_bytes=dtype_bytes)
        heads = _require(lm, "num_attention_heads", "n_head")
        kv_heads = _positive_int(lm, "num_key_value_heads") or heads
        head_dim = _positive_int(lm, "head_dim")
        if head_dim is None:
            hidden = _require(lm, "hidden_size", "n_embd")
            if hidden % heads:
                raise ConfigError(f"hidden_size {hidden} is not a multiple of num_attention_heads {heads}")
            head_dim = hidden // heads
        return Architecture(num_layers=layers, num_kv_heads=kv_heads, head_dim=head_dim, dtype_bytes=dtype_bytes)
    except ValidationError as exc:
        raise ConfigError("; ".join(str(e["msg"]) for e in exc.errors())) from None


def architecture_from_json(text: str) -> Architecture:
    """The KV shape from config.json text (e.g. a ConfigMap's value)."""
    try:
        config = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"not valid JSON: {exc}") from None
    return architecture_from_config(config)


def architecture_from_configmap_data(data: Mapping[str, str] | None, key: str = "config.json") -> Architecture:
    """The KV shape from a ConfigMap's ``data`` (the operator fetches it; this only reads it)."""
    if not data or key not in data:
        raise ConfigError(f"the ConfigMap has no key {key!r}")
    return architecture_from_json(data[key])


def load_config_file(path: Path) -> Architecture:
    """The KV shape from a config.json on disk (the one I/O helper here)."""
    try:
        with path.open("rb") as stream:
            data = stream.read(_MAX_CONFIG_BYTES + 1)
        if len(data) > _MAX_CONFIG_BYTES:
            raise ConfigError(f"{path}: larger than {_MAX_CONFIG_BYTES // 1024} KiB; not a config.json")
        text = data.decode("utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not UTF-8 text") from None
    return architecture_from_json(text)


_MAX_CONFIG_BYTES = 1024 * 1024  # the largest Hugging Face config.json is tens of KiB


# --- GPU classes ----------------------------------------------------------------


_NVIDIA_TAINT = Toleration(key="nvidia.com/gpu", operator="Exists", effect="NoSchedule")
_AMD_TAINT = Toleration(key="amd.com/gpu", operator="Exists", effect="NoSchedule")


@dataclass(frozen=True)
class GPUClass:
    """One kind of GPU node: how to schedule on it and how much memory it has."""

    name: str
    resource: str
    """Extended resource the device plugin advertises."""
    node_labels: Mapping[str, str]
    """Labels that select the node (as GPU feature discovery / the AMD node labeller set them)."""
    memory_bytes: int
    """Memory of one GPU."""
    host_ram_per_gpu_bytes: int
    """Host RAM of a typical node of this class divided by its GPUs."""
    host_ram_source: str
    """The node shape the host RAM figure comes from."""
    tolerations: tuple[Toleration, ...] = field(default=(_NVIDIA_TAINT,))
    gpus_per_node: int = 8
    """GPUs in a node of that shape (every source above names 8)."""

    @property
    def host_ram_per_node_bytes(self) -> int:
        """Host RAM of the whole node: what no single pod can exceed."""
        return self.host_ram_per_gpu_bytes * self.gpus_per_node


GPU_CLASSES: tuple[GPUClass, ...] = (
    GPUClass(
        "nvidia-h100-80gb",
        "nvidia.com/gpu",
        {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
        80 * GIB,
        2 * 1024 * GIB // 8,
        "NVIDIA DGX H100: 2 TB system memory, 8 GPUs",
    ),
    GPUClass(
        "nvidia-h200-141gb",
        "nvidia.com/gpu",
        {"nvidia.com/gpu.product": "NVIDIA-H200"},  # nvidia-smi name "NVIDIA H200", spaces -> "-"
        143771 * MIB,  # nvidia-smi memory.total on an H200 SXM
        2 * 1024 * GIB // 8,
        "NVIDIA DGX H200: 2 TB system memory, 8 GPUs",
    ),
    GPUClass(
        "nvidia-b200",
        "nvidia.com/gpu",
        {"nvidia.com/gpu.product": "NVIDIA-B200"},
        180 * GB,
        2 * 1024 * GIB // 8,
        "NVIDIA DGX B200: 2 TB system memory (4 TB optional), 8 GPUs",
    ),
    GPUClass(
        "nvidia-a100-80gb",
        "nvidia.com/gpu",
        {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"},
        80 * GIB,
        2 * 1024 * GIB // 8,
        "NVIDIA DGX A100 640GB: 2 TB system memory, 8 GPUs",
    ),
    GPUClass(
        "nvidia-a100-40gb",
        "nvidia.com/gpu",
        {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB"},
        40 * GIB,
        1024 * GIB // 8,
        "NVIDIA DGX A100 320GB: 1 TB system memory, 8 GPUs",
    ),
    GPUClass(
        "nvidia-l40s",
        "nvidia.com/gpu",
        {"nvidia.com/gpu.product": "NVIDIA-L40S"},
        48 * GB,
        1536 * GIB // 8,
        "AWS g6e.48xlarge: 1,536 GiB, 8 L40S",
    ),
    GPUClass(
        "nvidia-l4",
        "nvidia.com/gpu",
        {"nvidia.com/gpu.product": "NVIDIA-L4"},
        24 * GB,
        768 * GIB // 8,
        "AWS g6.48xlarge: 768 GiB, 8 L4",
    ),
    GPUClass(
        "amd-mi300x",
        "amd.com/gpu",
        # The device-id label is the stable one; product-name can be missing (ROCm/k8s-device-plugin#112).
        {"amd.com/gpu.device-id": "74a1"},
        192 * GIB,
        1850 * GIB // 8,
        "Azure ND MI300X v5: 1,850 GiB, 8 MI300X",
        tolerations=(_AMD_TAINT,),
    ),
)

_GPU_BY_NAME: dict[str, GPUClass] = {g.name: g for g in GPU_CLASSES}


def find_gpu_class(name: str) -> GPUClass | None:
    """The GPU class of that name, or None."""
    return _GPU_BY_NAME.get(name)


def gpu_class_names() -> list[str]:
    return [g.name for g in GPU_CLASSES]
