"""TensorRT-LLM as an engine of the seam (``engines/trtllm``), checked against the tables taken from its own
sources: every rendered extra-options file through ``extra_options.problems`` (unknown keys refused, types as
declared), every rendered flag through ``trtllm-serve``'s option table, the managed and code-loading options
refused in ``extraArgs``, the host cache sized per rank, and every series the dialect reads found in the saved
collector source (parsed with ``ast`` by ``scripts/trtllm_options.py``, not typed here).

TensorRT-LLM itself cannot run here (docs/engines.md): nothing below starts it."""

from __future__ import annotations

import dataclasses
import importlib.util
import inspect
import sys
from types import ModuleType
from typing import Any

import pytest
import yaml

from kvoffload.api.quantity import GIB
from kvoffload.api.types import KVOffloadPolicy
from kvoffload.engines.dialect import HISTOGRAM_SUFFIXES
from kvoffload.engines.engine import CONFIG_DIR, PORT, Engine
from kvoffload.engines.trtllm import options
from kvoffload.engines.trtllm.command import CONFIG_FILE, CONFIG_PATH, ENGINE, SECONDARY_OFFLOAD_MIN_PRIORITY
from kvoffload.engines.trtllm.dialect import OFFLOAD_BYTES, ONBOARD_BYTES, PREFIX, TRTLLM
from kvoffload.engines.trtllm.extra_options import problems
from kvoffload.policy.ladder import Level, build_ladder
from tests.support.paths import ROOT

BASE: dict[str, Any] = {
    "apiVersion": "kvoffload.io/v1alpha1",
    "kind": "KVOffloadPolicy",
    "metadata": {"name": "chat", "namespace": "llm"},
    "spec": {
        # spec.engine stays vLLM's default until the integrator registers trtllm: the engine is called directly.
        "model": {"name": "Qwen/Qwen3-8B", "image": "nvcr.io/nvidia/tensorrt-llm/release:1.2.0", "maxModelLen": 16384},
        "gpu": {"class": "nvidia-h100-80gb"},
        "replicas": 4,
        "resources": {"baseMemory": "24Gi"},
        "offload": {"cpu": "32Gi"},
    },
}


def policy(**spec: Any) -> KVOffloadPolicy:
    raw = {**BASE, "spec": {**BASE["spec"], **spec}}
    return KVOffloadPolicy.model_validate(raw)


def tp2() -> KVOffloadPolicy:
    return policy(
        model={**BASE["spec"]["model"], "tensorParallelSize": 2, "kvCacheDtype": "fp8", "servedModelName": "chat-fp8"},
        gpu={"class": "nvidia-h100-80gb", "count": 2, "memoryUtilization": 0.85},
        offload={"cpu": "64Gi"},
        rollout={"pilotCpu": "8Gi"},
    )


POLICIES = {"tp1": policy(), "tp2-fp8-pilot": tp2()}
CASES = [
    pytest.param(p, level, id=f"{name}/{level.index}-{level.name}")
    for name, p in POLICIES.items()
    for level in build_ladder(p.spec)
]


def parse(args: list[str]) -> tuple[list[str], dict[str, str | bool]]:
    """``args`` as click reads them with trtllm-serve's exact table: positionals, and each dest's last value."""
    table = options.option_table()
    positional: list[str] = []
    values: dict[str, str | bool] = {}
    i = 0
    while i < len(args):
        arg = args[i]
        i += 1
        if not arg.startswith("--"):
            positional.append(arg)
            continue
        name, eq, attached = arg.partition("=")
        dest, nargs = table.options[name]  # a KeyError is an option trtllm-serve does not have
        if nargs == 0:
            values[dest] = True
        elif eq:
            values[dest] = attached
        else:
            values[dest], i = args[i], i + 1
    return positional, values


def config(p: KVOffloadPolicy, level: Level) -> dict[str, Any]:
    files = ENGINE.config_files(p, level)
    assert list(files) == [CONFIG_FILE]
    loaded: dict[str, Any] = yaml.safe_load(files[CONFIG_FILE])
    return loaded


# --- the command line and the file ---------------------------------------------------------------------------


@pytest.mark.parametrize(("p", "level"), CASES)
def test_every_rendered_file_is_one_tensorrt_llm_takes(p: KVOffloadPolicy, level: Level) -> None:
    assert problems(config(p, level)) == []


@pytest.mark.parametrize(("p", "level"), CASES)
def test_every_rendered_flag_is_a_trtllm_serve_option_with_the_spec_s_value(p: KVOffloadPolicy, level: Level) -> None:
    spec = p.spec
    assert ENGINE.command(spec) == ["trtllm-serve"]
    positional, got = parse(ENGINE.args(p, level))
    assert positional == [spec.model.name]
    assert got == {
        "host": "0.0.0.0",
        "port": str(PORT),
        "tensor_parallel_size": str(spec.model.tensor_parallel_size),
        "max_seq_len": str(spec.model.max_model_len),
        "kv_cache_dtype": spec.model.kv_cache_dtype.value,
        "served_model_name": spec.model.served_model_name or p.metadata.name,
        "extra_llm_api_options": f"{CONFIG_DIR}/{CONFIG_FILE}",
    }
    raw = options._raw()["options"]
    assert got["kv_cache_dtype"] in raw["--kv_cache_dtype"]["choices"]
    assert ENGINE.env(spec, level) == []


def test_a_cpu_level_s_file_holds_each_rank_s_share_of_the_tier() -> None:
    p = tp2()
    cpu = next(level for level in build_ladder(p.spec) if level.name == "cpu")
    assert cpu.cpu_bytes == 64 * GIB
    assert config(p, cpu) == {
        "kv_cache_config": {
            "enable_block_reuse": True,
            "free_gpu_memory_fraction": 0.85,
            "host_cache_size": 32 * GIB,  # per rank: every rank pins the whole value
            "secondary_offload_min_priority": SECONDARY_OFFLOAD_MIN_PRIORITY,
        },
        "return_perf_metrics": True,
        "enable_iter_perf_stats": True,
    }
    assert SECONDARY_OFFLOAD_MIN_PRIORITY == 35


def test_the_gpu_only_level_s_file_has_no_host_cache_but_keeps_the_series_on() -> None:
    p = tp2()
    (gpu_only,) = [level for level in build_ladder(p.spec) if level.cpu_bytes is None]
    assert config(p, gpu_only) == {
        "kv_cache_config": {"enable_block_reuse": True, "free_gpu_memory_fraction": 0.85},
        "return_perf_metrics": True,
        "enable_iter_perf_stats": True,
    }
    # The file is named on every level: it turns on the per-request and iteration series.
    assert ENGINE.offload_args(p.spec, gpu_only) == ["--extra_llm_api_options", CONFIG_PATH]


def test_extra_args_come_last_as_written() -> None:
    p = policy(model={**BASE["spec"]["model"], "extraArgs": ["--max_batch_size", "64", "--enable_chunked_prefill"]})
    level = build_ladder(p.spec)[-1]
    assert ENGINE.args(p, level)[-3:] == ["--max_batch_size", "64", "--enable_chunked_prefill"]
    assert ENGINE.judge_extra_args(p.spec.model.extra_args) == []


# --- host memory ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ranks", "cpu", "per_rank"),
    [(1, 32 * GIB, 32 * GIB), (2, 64 * GIB, 32 * GIB), (4, 10**9 + 3, 250_000_000), (8, 7, 0)],
)
def test_each_rank_pins_its_share_and_the_pod_pins_them_all(ranks: int, cpu: int, per_rank: int) -> None:
    p = policy(
        model={**BASE["spec"]["model"], "tensorParallelSize": ranks},
        gpu={"class": "nvidia-h100-80gb", "count": ranks},
    )
    level = Level(1, "cpu", cpu)
    assert config(p, level)["kv_cache_config"]["host_cache_size"] == per_rank
    assert ENGINE.pinned_bytes(p.spec, level, None) == per_rank * ranks <= cpu
    assert ENGINE.pinned_bytes(p.spec, level, 36) == per_rank * ranks  # the layers do not change it
    assert ENGINE.pinned_bytes(p.spec, Level(0, "gpu-only", None), None) == 0
    # Anonymous pinned memory (BufferManager::pinned), not a /dev/shm file, and no reserve beside it.
    assert (ENGINE.pool_in_shm(p.spec, level), ENGINE.host_reserve(p.spec, level)) == (False, 0)


# --- extraArgs -----------------------------------------------------------------------------------------------------


def test_every_managed_and_code_loading_dest_is_a_trtllm_serve_option() -> None:
    dests = {dest for dest, _ in options.option_table().options.values()}
    assert set(options.MANAGED_DESTS) <= dests
    assert set(options.CODE_LOADING_DESTS) <= dests
    assert set(options.MANAGED_DESTS).isdisjoint(options.CODE_LOADING_DESTS)


@pytest.mark.parametrize("flag", options.managed_flags())
def test_a_managed_flag_is_refused_however_it_is_given(flag: str) -> None:
    nargs = options.option_table().options[flag][1]
    for args in ([flag] if nargs == 0 else [flag, "1"], [f"{flag}=1"] if nargs else [flag]):
        (problem,) = [p for p in ENGINE.judge_extra_args(args) if "manages" in p.message]
        assert problem.index == 0
        assert problem.message.startswith(f"sets {options.flags_of(options.option_table().options[flag][0])[0]},")


@pytest.mark.parametrize(
    ("args", "index", "says"),
    [
        (["--tp-size", "2"], 0, "has no option --tp-size (its options are spelt with '_': --tp_size)"),
        (["--max-batch-size", "64"], 0, "has no option --max-batch-size (its options are spelt with '_'"),
        (["--max_batch"], 0, "has no option --max_batch"),  # click takes no abbreviation
        (["--host", "::"], 0, "sets --host, which the operator manages"),
        (["--kv_cache_free_gpu_memory_fraction", "0.5"], 0, "sets --free_gpu_memory_fraction, which the operator"),
        (["--config", "/x.yaml"], 0, "sets --config, which the operator manages"),
        (["--set", "kv_cache_config.host_cache_size=0"], 0, "sets --set, which the operator manages"),
        (["--backend", "_autodeploy"], 0, "sets --backend, which the operator manages"),
        (["--trust_remote_code"], 0, "sets --trust_remote_code, which loads code"),
        (["--middleware", "m.M"], 0, "sets --middleware, which loads code"),
        (["--custom_module_dirs", "/m"], 0, "sets --custom_module_dirs, which loads code"),
        (["--enable_chunked_prefill=true"], 0, "--enable_chunked_prefill is a switch"),
        (["--max_batch_size"], 0, "--max_batch_size needs a value"),
        (["--max_batch_size", "64", "other-model"], 2, "'other-model' is no option's value"),
        (["--", "x"], 0, "'--' ends trtllm-serve's options"),
    ],
)
def test_what_extra_args_may_not_say_is_refused_by_index(args: list[str], index: int, says: str) -> None:
    found = ENGINE.judge_extra_args(args)
    assert [p.index for p in found] == [index], found
    assert says in found[0].message


def test_a_code_loading_option_stands_where_the_admin_allows_it() -> None:
    assert ENGINE.judge_extra_args(["--trust_remote_code"], allowed=["trust_remote_code"]) == []
    assert ENGINE.judge_extra_args(["--middleware", "m.M"], allowed=["--middleware"]) == []
    assert set(ENGINE.code_options) == set(options.CODE_LOADING_DESTS)


def test_the_cel_pattern_catches_managed_flags_spelt_outright() -> None:
    import re

    from kvoffload.engines.options import managed_patterns

    (whole,) = managed_patterns(ENGINE.managed_flags)
    pattern = re.compile(whole)
    for spelt in ("--tp_size", "--tp_size=2", "--extra_llm_api_options", "--set=x=1", "--free_gpu_memory_fraction"):
        assert pattern.match(spelt), spelt
    # click folds no "-" into "_": --tp-size is no option at all, which judge_extra_args says (above).
    for spelt in ("--max_batch_size", "--trust_remote_code", "--hostname"):
        assert not pattern.match(spelt), spelt


# --- check ---------------------------------------------------------------------------------------------------------


def test_a_plain_policy_renders() -> None:
    assert ENGINE.check(policy()) == []
    assert ENGINE.check(tp2()) == []


@pytest.mark.parametrize(
    ("patch", "fields"),
    [
        ({"offload": {"cpu": "32Gi", "backend": "lmcache"}}, ["spec.offload.backend"]),
        (
            {
                "offload": {
                    "cpu": "32Gi",
                    "secondaryTiers": [
                        {"name": "nvme", "size": "1Ti", "path": "/mnt/a"},
                        {"name": "nfs", "size": "1Ti", "path": "/mnt/b"},
                    ],
                }
            },
            ["spec.offload.secondaryTiers[0]", "spec.offload.secondaryTiers[1]"],
        ),
        ({"offload": {"cpu": "32Gi", "evictionPolicy": "arc"}}, ["spec.offload.evictionPolicy"]),
        (
            {"offload": {"cpu": "32Gi", "blockSize": 64, "storeThreshold": 2}},
            ["spec.offload.blockSize", "spec.offload.storeThreshold"],
        ),
        ({"model": {**BASE["spec"]["model"], "kvCacheDtype": "bfloat16"}}, ["spec.model.kvCacheDtype"]),
        ({"model": {**BASE["spec"]["model"], "vllmVersion": "0.32"}}, ["spec.model.vllmVersion"]),
    ],
)
def test_what_tensorrt_llm_cannot_run_is_refused_naming_the_field(patch: dict[str, Any], fields: list[str]) -> None:
    assert [e.path for e in ENGINE.check(policy(**patch))] == fields


def test_a_secondary_tier_is_refused_because_tensorrt_llm_has_no_file_tier() -> None:
    p = policy(offload={"cpu": "32Gi", "secondaryTiers": [{"name": "nvme", "size": "1Ti", "path": "/mnt/a"}]})
    (error,) = ENGINE.check(p)
    assert "no tier beyond its host cache" in error.message


# --- adoption ------------------------------------------------------------------------------------------------------

RUNNING = {
    "name": "server",
    "image": "nvcr.io/nvidia/tensorrt-llm/release:1.2.0",
    "command": ["trtllm-serve"],
    "args": ["Qwen/Qwen3-8B", "--tp_size", "2", "--max_seq_len", "8192", "--port", "9000", "--max_batch_size", "64"],
}


def test_a_container_running_trtllm_serve_is_recognised_by_its_command_or_args() -> None:
    assert ENGINE.recognises(RUNNING)
    assert ENGINE.recognises({"name": "s", "args": ["trtllm-serve", "serve", "m"]})
    assert ENGINE.recognises({"name": "s", "command": ["/bin/sh", "-c", 'exec trtllm-serve m "$@"', "sh"]})
    # The image alone says nothing: NGC's image runs whatever its command is.
    assert not ENGINE.recognises({"name": "s", "image": RUNNING["image"], "args": ["m", "--tp_size", "2"]})
    assert not ENGINE.recognises({"name": "s", "command": ["vllm", "serve", "m"]})


def test_what_a_running_container_serves_is_read_from_its_options() -> None:
    served = ENGINE.served(RUNNING)
    assert served.model is not None
    assert served.model.value == "Qwen/Qwen3-8B"
    assert served.tensor_parallel_size is not None
    assert served.tensor_parallel_size.number == 2
    assert served.max_model_len is not None
    assert served.max_model_len.number == 8192
    assert served.port == 9000
    assert ENGINE.served({**RUNNING, "args": ["m"]}).port == 8000  # trtllm-serve's default


def test_a_container_whose_options_live_in_its_own_file_cannot_be_adopted() -> None:
    assert ENGINE.adoption_problems(RUNNING) == []
    own = {**RUNNING, "args": [*RUNNING["args"], "--config", "/cfg/llm.yaml"]}
    (problem,) = ENGINE.adoption_problems(own)
    assert "sets --config /cfg/llm.yaml: its options live in that file, which the operator cannot read" in problem
    overrides = {**RUNNING, "args": [*RUNNING["args"], "--set", "kv_cache_config.host_cache_size=0"]}
    (problem,) = ENGINE.adoption_problems(overrides)
    assert "would override the level's KV-cache settings" in problem


def test_a_level_is_derived_with_the_level_s_own_file_and_the_user_s_other_options() -> None:
    p = tp2()
    cpu = build_ladder(p.spec)[-1]
    own = {**RUNNING, "args": [*RUNNING["args"], "--extra_llm_api_options", "/old.yaml"], "env": [{"name": "A"}]}
    derived = ENGINE.derive(own, p.spec, cpu)
    assert derived.command == ["trtllm-serve"]
    assert derived.args == [*RUNNING["args"], "--extra_llm_api_options", CONFIG_PATH]
    assert derived.removed_flags == ("--extra_llm_api_options",)
    assert (derived.env, derived.removed_env) == ([{"name": "A"}], ())


def test_code_loading_options_of_a_running_container_are_named() -> None:
    (problem,) = ENGINE.code_problems({**RUNNING, "args": [*RUNNING["args"], "--trust_remote_code"]})
    assert "sets --trust_remote_code, which loads code" in problem


# --- the seam ------------------------------------------------------------------------------------------------------


def test_the_engine_has_every_member_of_the_protocol() -> None:
    engine: Engine = ENGINE  # mypy checks the signatures
    members = {name for name, _ in inspect.getmembers(Engine) if not name.startswith("_")}
    assert len(members) > 20
    assert members <= set(dir(engine))
    assert (engine.name, engine.title, engine.container) == ("trtllm", "TensorRT-LLM", "trtllm")
    assert engine.dialect(policy().spec) is TRTLLM
    assert engine.eager(policy().spec) is False


# --- the dialect ---------------------------------------------------------------------------------------------------


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("trtllm_options", ROOT / "scripts" / "trtllm_options.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def collector() -> dict[str, Any]:
    """The series collector.py declares, read from the saved source with ast."""
    script = _script()
    table: dict[str, Any] = script.metrics_table(script.parse(script.COLLECTOR))
    return table


def _exported(collector: dict[str, Any]) -> set[str]:
    names: set[str] = set()
    for entry in collector["series"].values():
        names.update(entry["samples"])
        if entry["type"] == "histogram":
            names.add(entry["declared"])  # a histogram is named by its base
    return names


def test_every_series_the_dialect_names_is_one_the_collector_declares(collector: dict[str, Any]) -> None:
    exported = _exported(collector)
    settings = {"name", "series_prefix", "cached_source_label", "gpu_prefix_cache_hits_matcher", "http_status_label"}
    settings.add("http_requests")  # the API server's, not the collector's: trtllm-serve exports no sample of it
    named = {
        f.name: value
        for f in dataclasses.fields(TRTLLM)
        if f.name not in settings and isinstance(value := getattr(TRTLLM, f.name), str)
    }
    assert len(named) == 10, named
    missing = {field: name for field, name in named.items() if name not in exported}
    assert missing == {}
    for base in TRTLLM.histograms():
        if base is not None:
            assert {base + s for s in HISTOGRAM_SUFFIXES} <= exported
    assert {ONBOARD_BYTES, OFFLOAD_BYTES} <= exported
    assert collector["prefix"] == PREFIX == TRTLLM.series_prefix


def test_the_dialect_says_there_is_no_itl_series(collector: dict[str, Any]) -> None:
    assert TRTLLM.itl is None
    # TPOT is the nearest, one sample per finished request: not an inter-token latency.
    assert [f for f in collector["series"] if "inter_token" in f] == []
    assert collector["itl"]["series"] == ["trtllm_time_per_output_token_seconds"]
    assert TRTLLM.request_prompt_tokens is None
    assert TRTLLM.num_preemptions is None
