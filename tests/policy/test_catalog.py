"""The model and GPU catalogs, and reading a Hugging Face config.json."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvoffload.api.quantity import GIB
from kvoffload.api.serving import Architecture
from kvoffload.policy.catalog import (
    GPU_CLASSES,
    MODELS,
    ConfigError,
    architecture_from_config,
    architecture_from_configmap_data,
    architecture_from_json,
    find_gpu_class,
    find_model,
    load_config_file,
    model_names,
)
from kvoffload.policy.kvshape import bytes_per_token
from tests.support import paths

CONFIGS = paths.DATA / "configs"

# config.json samples in tests/data/configs, and the catalog entry each must reproduce.
SAMPLES = {
    "Qwen3-0.6B.json": "Qwen/Qwen3-0.6B",
    "Qwen3-8B.json": "Qwen/Qwen3-8B",
    "Llama-3.1-8B.json": "meta-llama/Llama-3.1-8B",
    "Qwen2.5-7B-Instruct.json": "Qwen/Qwen2.5-7B-Instruct",
    "Mixtral-8x7B-Instruct-v0.1.json": "mistralai/Mixtral-8x7B-Instruct-v0.1",
    "DeepSeek-V3.json": "deepseek-ai/DeepSeek-V3",
    "gpt-oss-20b.json": "openai/gpt-oss-20b",
    "gemma-3-27b-it.json": "google/gemma-3-27b-it",
}


# --- the model catalog ------------------------------------------------------------


def test_the_catalog_holds_at_least_ten_popular_models() -> None:
    required = {
        "Qwen/Qwen3-0.6B",
        "Qwen/Qwen3-8B",
        "Qwen/Qwen3-32B",
        "meta-llama/Llama-3.1-8B",
        "meta-llama/Llama-3.1-70B",
        "meta-llama/Llama-3.3-70B-Instruct",
        "mistralai/Mistral-7B-v0.3",
        "deepseek-ai/DeepSeek-V3",
        "openai/gpt-oss-20b",
        "openai/gpt-oss-120b",
        "mistralai/Mixtral-8x7B-Instruct-v0.1",
        "google/gemma-3-27b-it",
    }
    assert len(MODELS) >= 10
    assert required <= set(model_names())


@pytest.mark.parametrize("entry", MODELS, ids=lambda m: m.name)
def test_every_entry_cites_the_config_json_of_its_own_repo(entry) -> None:  # type: ignore[no-untyped-def]
    assert entry.source == f"https://huggingface.co/{entry.name}/blob/main/config.json"
    assert entry.params > 0
    assert entry.weight_bytes > 0


def test_names_are_unique_across_entries_and_aliases() -> None:
    names = [n.lower() for m in MODELS for n in m.names()]
    assert len(names) == len(set(names))


def test_lookup_is_by_exact_id_ignoring_case() -> None:
    entry = find_model("qwen/QWEN3-0.6b")
    assert entry is not None
    assert entry.name == "Qwen/Qwen3-0.6B"
    assert find_model("Qwen3-0.6B") is None  # the HF id, not a fragment of it
    assert find_model("Qwen/Qwen3-0.6B-FP8") is None


def test_an_instruct_alias_finds_the_base_entry() -> None:
    entry = find_model("meta-llama/Llama-3.1-70B-Instruct")
    assert entry is not None
    assert entry.name == "meta-llama/Llama-3.1-70B"


@pytest.mark.parametrize(("sample", "model"), SAMPLES.items(), ids=list(SAMPLES))
def test_catalog_entry_matches_its_config_json_sample(sample: str, model: str) -> None:
    entry = find_model(model)
    assert entry is not None
    assert load_config_file(CONFIGS / sample) == entry.architecture
    assert json.loads((CONFIGS / sample).read_text())["_source"] == entry.source


def test_models_with_sliding_window_layers_say_so() -> None:
    sliding = {m.name: m.sliding_window_layers for m in MODELS if m.sliding_window_layers}
    assert sliding == {"google/gemma-3-27b-it": 52, "openai/gpt-oss-20b": 12, "openai/gpt-oss-120b": 18}
    gpt = json.loads((CONFIGS / "gpt-oss-20b.json").read_text())
    assert gpt["layer_types"].count("sliding_attention") == sliding["openai/gpt-oss-20b"]


# --- reading config.json ------------------------------------------------------------


def test_head_dim_defaults_to_hidden_size_over_attention_heads() -> None:
    arch = architecture_from_config(
        {"num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8}
    )
    assert (arch.num_kv_heads, arch.head_dim) == (8, 128)


def test_an_explicit_head_dim_wins_over_hidden_size() -> None:
    # Qwen3-0.6B: hidden 1024 / 16 heads would be 64, but head_dim says 128.
    arch = architecture_from_json((CONFIGS / "Qwen3-0.6B.json").read_text())
    assert arch.head_dim == 128
    assert bytes_per_token(arch, arch.dtype_bytes) == 114_688


def test_kv_heads_default_to_attention_heads_for_plain_mha() -> None:
    arch = architecture_from_config({"num_hidden_layers": 12, "hidden_size": 768, "num_attention_heads": 12})
    assert (arch.num_kv_heads, arch.head_dim) == (12, 64)


def test_mla_config_gives_the_latent_shape() -> None:
    arch = architecture_from_json((CONFIGS / "DeepSeek-V3.json").read_text())
    assert arch == Architecture(num_layers=61, kv_lora_rank=512, qk_rope_head_dim=64, dtype_bytes=2)


def test_a_multimodal_config_is_read_from_its_text_config() -> None:
    arch = architecture_from_json((CONFIGS / "gemma-3-27b-it.json").read_text())
    assert (arch.num_layers, arch.num_kv_heads, arch.head_dim) == (62, 16, 128)


@pytest.mark.parametrize(
    ("dtype", "expected"),
    [("bfloat16", 2), ("float16", 2), ("float32", 2), (None, 2)],
    ids=["bf16", "fp16", "fp32-served-as-fp16", "missing"],
)
def test_kv_auto_dtype_follows_how_vllm_serves_the_checkpoint(dtype: str | None, expected: int) -> None:
    config = {"num_hidden_layers": 2, "hidden_size": 128, "num_attention_heads": 2, "torch_dtype": dtype}
    assert architecture_from_config(config).dtype_bytes == expected


def test_newer_configs_name_the_dtype_dtype() -> None:
    config = {"num_hidden_layers": 2, "hidden_size": 128, "num_attention_heads": 2, "dtype": "bfloat16"}
    assert architecture_from_config(config).dtype_bytes == 2


@pytest.mark.parametrize(
    ("config", "names"),
    [
        ({"hidden_size": 128, "num_attention_heads": 2}, "num_hidden_layers"),
        ({"num_hidden_layers": 2, "hidden_size": 128}, "num_attention_heads"),
        ({"num_hidden_layers": 2, "num_attention_heads": 2}, "hidden_size"),
        ({"num_hidden_layers": 2, "hidden_size": 100, "num_attention_heads": 3}, "not a multiple"),
        ({"num_hidden_layers": "two", "hidden_size": 128, "num_attention_heads": 2}, "num_hidden_layers"),
        ({"num_hidden_layers": 2, "kv_lora_rank": 512}, "qk_rope_head_dim"),
    ],
    ids=["no-layers", "no-heads", "no-hidden-size", "uneven-heads", "layers-not-int", "mla-without-rope"],
)
def test_a_config_that_lacks_the_kv_shape_names_the_key(config: dict[str, object], names: str) -> None:
    with pytest.raises(ConfigError, match=names):
        architecture_from_config(config)


def test_a_configmap_without_the_key_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"no key 'config\.json'"):
        architecture_from_configmap_data({"other.json": "{}"})


def test_a_configmap_with_broken_json_is_refused() -> None:
    with pytest.raises(ConfigError, match="not valid JSON"):
        architecture_from_configmap_data({"config.json": "{nope"})


def test_a_configmap_under_another_key_is_read() -> None:
    data = {"qwen.json": (CONFIGS / "Qwen3-8B.json").read_text()}
    arch = architecture_from_configmap_data(data, "qwen.json")
    assert bytes_per_token(arch, arch.dtype_bytes) == 147_456


def test_a_missing_config_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="No such file"):
        load_config_file(tmp_path / "config.json")


# --- the GPU catalog ------------------------------------------------------------------


def test_gpu_classes_cover_the_common_datacenter_gpus() -> None:
    names = {g.name for g in GPU_CLASSES}
    assert {
        "nvidia-h100-80gb",
        "nvidia-h200-141gb",
        "nvidia-a100-80gb",
        "nvidia-a100-40gb",
        "nvidia-l40s",
        "nvidia-l4",
        "nvidia-b200",
        "amd-mi300x",
    } <= names
    assert len(names) == len(GPU_CLASSES)


@pytest.mark.parametrize("gpu", GPU_CLASSES, ids=lambda g: g.name)
def test_each_gpu_class_schedules_on_its_vendors_resource_and_taint(gpu) -> None:  # type: ignore[no-untyped-def]
    vendor = "amd.com" if gpu.name.startswith("amd-") else "nvidia.com"
    assert gpu.resource == f"{vendor}/gpu"
    assert all(key.startswith(f"{vendor}/gpu.") for key in gpu.node_labels)
    assert [(t.key, t.operator, t.effect) for t in gpu.tolerations] == [(f"{vendor}/gpu", "Exists", "NoSchedule")]
    assert gpu.memory_bytes >= 20 * GIB
    assert gpu.host_ram_per_gpu_bytes >= gpu.memory_bytes  # host RAM per GPU exceeds HBM on these shapes
    assert gpu.host_ram_source


def test_h100_is_selected_by_the_product_label_gpu_feature_discovery_sets() -> None:
    h100 = find_gpu_class("nvidia-h100-80gb")
    assert h100 is not None
    assert h100.node_labels == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    assert h100.host_ram_per_gpu_bytes == 256 * GIB  # DGX H100: 2 TiB over 8 GPUs


def test_an_unknown_gpu_class_is_none() -> None:
    assert find_gpu_class("nvidia-h100") is None
