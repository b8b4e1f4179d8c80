"""Which engine options the operator manages and which load code, derived from the engines' own option tables.

vLLM 0.32-0.34's (``engines/vllm/data/vllm-options.json``) and SGLang 0.5.23's
(``engines/sglang/data/sglang-options.json``) tables list every dest their parsers have. Each dest whose name says
it touches the GPU memory share, the KV pool or the host pool (:data:`MEMORY`) must be managed or exempted below
with a reason; each dest whose name says it loads code (:data:`CODE`) must be a code-loading option (refused unless
the cluster admin allows it), managed, or exempted with a reason. A new engine release that adds such an option
fails here until someone decides, as the managed flags do against the real parsers
(tests/realvllm/test_managed_flags.py).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pytest

from kvoffload.engines import ENGINES
from kvoffload.engines.options import OptionTable, judge_extra_args, option_dest
from kvoffload.engines.sglang import command as sglang
from kvoffload.engines.vllm.flags import CODE_LOADING_DESTS, MANAGED_DESTS, managed_pattern, option_table
from kvoffload.policy.loading import parse_policy
from kvoffload.policy.tenancy import Tenancy, check_tenancy
from kvoffload_lab.demo import SGLANG_IMAGE
from tests.policy.render_policies import policy_object

# Names that say a dest sets the GPU memory share, sizes the KV pool or holds host memory.
MEMORY = re.compile(
    r"memory|mem_fraction|gpu_blocks|total_tokens|kv_cache|offload|hicache|swap|cpu_backup|sleep|_gb$|_bytes$"
    r"|cache_size|_pool|pool_|external_linker|kt_weight"
)
# Names that say a dest imports or runs code: remote code, a class or module path, a plug-in, a hook.
CODE = re.compile(
    r"remote_code|_cls$|plugin|middleware|extension|class|hook|logits?_processor|custom|sidecar|weight_loader$"
    r"|executor|radix_cache_backend|linker_backend"
)

_SPLIT = "it divides the same GPU share differently; the share itself stays spec.gpu.memoryUtilization"
_HOW = "how the host pool is filled or laid out, not its size or where it lives"
_SLEEP = "acts only with --enable-sleep-mode, which is managed"

VLLM_MEMORY_EXEMPT: Mapping[str, str] = {
    "cp_kv_cache_interleave_size": "the KV layout across context-parallel ranks, not its size",
    "dcp_kv_cache_interleave_size": "the KV layout across context-parallel ranks, not its size",
    "disable_hybrid_kv_cache_manager": _SPLIT,
    "enable_extensible_kv_cache": "how vLLM measures the free memory it sizes the pool from, within the same share",
    "kv_cache_metrics": "metrics only",
    "kv_cache_metrics_sample": "metrics only",
    "mm_ipc_gpu_memory_gb": "video decoding memory carved out of the same GPU share, like activations",
    "mm_processor_cache_gb": "a pageable cache of the front end, held within the pod's memory limit like any other",
    "sleep_mode_backend": _SLEEP,
    "sleep_mode_offload_cudagraph": _SLEEP,
    "sleep_preserve_parameter_names": _SLEEP,
}
SGLANG_MEMORY_EXEMPT: Mapping[str, str] = {
    "disable_hybrid_swa_memory": _SPLIT,
    "enable_unified_memory": _SPLIT,
    "mamba_full_memory_ratio": _SPLIT,
    "max_mamba_cache_size": _SPLIT,
    "enable_kv_cache_sharding": "prefill workers of PD disaggregation only, which the operator does not render",
    "prefill_only_disable_kv_cache": "embedding-only prefill allocates no KV: nothing to offload",
    "enable_memory_saver": "releases GPU memory on request; a host copy needs --enable-weights-cpu-backup (managed)",
    "hicache_io_backend": _HOW,
    "hicache_mem_layout": _HOW,
    "hicache_write_policy": _HOW,
    "hicache_storage_prefetch_policy": _HOW,
    "hicache_storage_prefetch_retry_max_attempts": _HOW,
    "hicache_storage_prefetch_retry_poll_interval": _HOW,
    "kt_threadpool_count": "CPU threads of ktransformers, whose expert weights (--kt-weight-path) are managed",
    "mm_preprocess_cache_size_mb": "a pageable cache, held within the pod's memory limit like any other",
    "ple_offload_dir": "acts only with --ple-offload-backend file, which is managed",
    "prefill_kv_cache_dequant_dtype": "a dtype prefill attention computes in, not the cache's",
    "speculative_draft_kv_cache_dtype": "the draft model's own pool, within the same GPU share",
    "sleep_on_idle": "the scheduler's CPU sleeps when idle: no memory",
    "speculative_domino_candidate_pool_size": "a list of draft candidates, not memory",
    "unified_cache_external_linker_backend": "acts only with --enable-unified-cache-external-linker, which is managed",
    "unified_cache_external_linker_config": "acts only with --enable-unified-cache-external-linker, which is managed",
}
VLLM_CODE_EXEMPT: Mapping[str, str] = {
    "custom_histogram_buckets": "metric buckets",
    "disable_custom_all_reduce": "switches a built-in kernel off",
}
SGLANG_CODE_EXEMPT: Mapping[str, str] = {
    "disable_custom_all_reduce": "switches a built-in kernel off",
    "sidecar_args": "arguments of --sidecar, which is a code-loading option",
    "smg_http_sidecar_port": "a port",
    "tokenizer_metrics_allowed_custom_labels": "metric labels",
    "tokenizer_metrics_custom_labels_header": "metric labels",
    "unified_cache_external_linker_backend": "acts only with --enable-unified-cache-external-linker, which is managed",
}


@dataclass(frozen=True)
class Kinds:
    """One engine's table and what the operator decided about its options."""

    title: str
    table: OptionTable
    managed: Mapping[str, str]
    code: Mapping[str, str]
    memory_exempt: Mapping[str, str]
    code_exempt: Mapping[str, str]

    def dests(self) -> set[str]:
        return {dest for dest, _ in self.table.options.values()}


ENGINE_KINDS = [
    Kinds("vLLM", option_table(), MANAGED_DESTS, CODE_LOADING_DESTS, VLLM_MEMORY_EXEMPT, VLLM_CODE_EXEMPT),
    Kinds(
        "SGLang",
        sglang.option_table(),
        sglang.MANAGED_DESTS,
        sglang.CODE_LOADING_DESTS,
        SGLANG_MEMORY_EXEMPT,
        SGLANG_CODE_EXEMPT,
    ),
]
BY_TITLE = {kinds.title: kinds for kinds in ENGINE_KINDS}


def _judge(kinds: Kinds, args: list[str], allowed: tuple[str, ...] = ()) -> list[str]:
    return [
        p.message
        for p in judge_extra_args(
            args, kinds.table, managed=kinds.managed, code=kinds.code, allowed=allowed, engine=kinds.title
        )
    ]


@pytest.mark.parametrize("kinds", ENGINE_KINDS, ids=lambda k: k.title)
def test_every_memory_or_pool_option_is_managed_or_exempted_with_a_reason(kinds: Kinds) -> None:
    undecided = sorted(d for d in kinds.dests() if MEMORY.search(d) and d not in {*kinds.managed, *kinds.memory_exempt})
    assert undecided == [], f"{kinds.title}: manage these in MANAGED_DESTS or exempt them here, with a reason"
    # No stale exemption: each still exists, still matches, and is not also managed.
    for dest, why in kinds.memory_exempt.items():
        assert dest in kinds.dests()
        assert MEMORY.search(dest)
        assert dest not in kinds.managed
        assert why


@pytest.mark.parametrize("kinds", ENGINE_KINDS, ids=lambda k: k.title)
def test_every_code_loading_option_is_judged_or_exempted_with_a_reason(kinds: Kinds) -> None:
    decided = {*kinds.code, *kinds.managed, *kinds.code_exempt}
    undecided = sorted(d for d in kinds.dests() if CODE.search(d) and d not in decided)
    assert undecided == [], f"{kinds.title}: add these to CODE_LOADING_DESTS or exempt them here, with a reason"
    for dest, why in kinds.code_exempt.items():
        assert dest in kinds.dests()
        assert CODE.search(dest)
        assert dest not in kinds.code
        assert why
    # Every code option exists in the table and is not also managed (a managed one is refused whatever is allowed).
    assert set(kinds.code) <= kinds.dests()
    assert not set(kinds.code) & set(kinds.managed)
    assert set(kinds.managed) <= kinds.dests()


def test_the_issue_s_options_are_decided() -> None:
    vllm, sgl = BY_TITLE["vLLM"], BY_TITLE["SGLang"]
    assert {"trust_remote_code", "worker_extension_cls", "middleware"} <= set(vllm.code)
    assert {"trust_remote_code", "custom_weight_loader"} <= set(sgl.code)
    assert {"kv_cache_memory_bytes", "num_gpu_blocks_override"} <= set(vllm.managed)
    assert {
        "max_total_tokens",
        "enable_weights_cpu_backup",
        "disaggregation_decode_enable_offload_kvcache",
        "mem_fraction_static",
    } <= set(sgl.managed)


@pytest.mark.parametrize("kinds", ENGINE_KINDS, ids=lambda k: k.title)
def test_a_code_option_is_refused_unless_the_admin_allows_it(kinds: Kinds) -> None:
    for dest in kinds.code:
        for flag in kinds.table.flags_of(dest):
            nargs = kinds.table.options[flag][1]
            args = [flag] if nargs in (0, "?", "*") else [flag, "pkg.mod.Thing"]
            if flag.startswith("--no-"):
                assert _judge(kinds, args) == [], args  # turning it off loads nothing
                continue
            (message,) = _judge(kinds, args)
            assert "loads code" in message
            assert f"--allowed-code-option {kinds.table.flags_of(dest)[0]}" in message
            # The admin names the flag, or the dest, in either spelling.
            for allowed in (flag, dest, dest.replace("_", "-")):
                assert _judge(kinds, args, (allowed,)) == [], (args, allowed)
            # Allowing another option allows not this one.
            other = next(d for d in kinds.code if d != dest)
            assert _judge(kinds, args, (other,)) != []


def test_spellings_of_a_code_option_are_refused_as_the_parser_reads_them() -> None:
    vllm = BY_TITLE["vLLM"]
    for args in (["--trust_remote_code"], ["--trust-remote"], ["--worker-extension-cls=a.B"], ["--middleware", "m"]):
        assert any("loads code" in m for m in _judge(vllm, args)), args
    # A managed flag stays managed whatever the admin allows.
    assert "manages" in _judge(vllm, ["--kv-cache-memory-bytes=80G"], ("kv_cache_memory_bytes",))[0]


def test_the_cel_pattern_refuses_the_newly_managed_vllm_flags_but_no_code_option() -> None:
    pattern = re.compile(managed_pattern())
    for arg in ("--kv-cache-memory-bytes=80G", "--num_gpu_blocks_override", "--enable-sleep-mode"):
        assert pattern.match(arg), arg
    # The admin's allowance is not the CRD's to see: code options are the webhook's and the operator's.
    assert not pattern.match("--trust-remote-code")


def test_each_engine_says_its_code_options_and_the_admin_may_name_only_those() -> None:
    assert ENGINES["vllm"].code_options == CODE_LOADING_DESTS
    assert ENGINES["sglang"].code_options == sglang.CODE_LOADING_DESTS
    assert Tenancy(code_options=("--trust-remote-code", "custom_weight_loader", "worker-cls")).problems() == []
    (problem,) = Tenancy(code_options=("--trust-remote-cod",)).problems()
    assert "--allowed-code-option '--trust-remote-cod'" in problem
    assert option_dest("--worker-extension-cls") == "worker_extension_cls"


@pytest.mark.parametrize(
    ("engine", "args", "allowed", "index"),
    [
        ({}, ["--max-num-seqs", "8", "--trust-remote-code"], ("--trust-remote-code",), 2),
        ({}, ["--worker-extension-cls=pkg.Ext"], ("worker_extension_cls",), 0),
        (
            {"engine": "sglang", "model": {"image": SGLANG_IMAGE}, "offload": {"cpu": "32G"}},
            ["--custom-weight-loader", "pkg.load"],
            ("--custom-weight-loader",),
            0,
        ),
    ],
)
def test_check_tenancy_refuses_a_code_option_naming_the_item_until_the_admin_allows_it(
    engine: dict[str, Any], args: list[str], allowed: tuple[str, ...], index: int
) -> None:
    obj = policy_object(**engine)
    obj["spec"]["model"]["extraArgs"] = args
    policy = parse_policy(obj, tenancy=Tenancy(code_options=allowed))
    (error,) = check_tenancy(policy, Tenancy())
    assert error.path == f"spec.model.extraArgs[{index}]"
    assert "loads code" in error.message
    assert check_tenancy(policy, Tenancy(code_options=allowed)) == []
