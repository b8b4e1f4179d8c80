"""``vllm serve``'s command line as vLLM's own parser reads it: which ``extraArgs`` would set a value the
operator manages.

A flag is judged by what it sets (its argparse ``dest``), not by how it is spelt. vLLM's
``FlexibleArgumentParser`` turns ``_`` into ``-`` in a flag's name, takes ``--flag=value``, folds dotted keys
(``--kv-transfer-config.kv_role=…``) into the JSON of their base flag, and argparse accepts short aliases
(``-tp``), other long names for the same setting (``--device-memory-utilization``) and unique abbreviations
(``--max-model 4096``). The option table (``data/vllm-options.json``) is taken from vLLM's own parsers by
``scripts/vllm_options.py``, and tests/realvllm checks it against them, so the walk (``engines/options.py``)
needs no vLLM.
"""

from __future__ import annotations

import functools
from collections.abc import Collection, Mapping, Sequence

from kvoffload.engines import options
from kvoffload.engines.options import ArgProblem, OptionTable, load_option_table

# dest -> why extraArgs may not set it.
_RENDERED = "the operator renders it from the spec"
MANAGED_DESTS: Mapping[str, str] = {
    "model": _RENDERED + " (spec.model.name)",
    "served_model_name": _RENDERED + " (spec.model.servedModelName)",
    "port": _RENDERED + ": the probes, the Service and the PodMonitor use it",
    "host": _RENDERED + ": the probes, the Service and the PodMonitor use it",
    "uds": "a Unix socket instead of the port would leave the probes, the Service and the PodMonitor nothing to reach",
    "max_model_len": _RENDERED + " (spec.model.maxModelLen), and the sizing uses it",
    "tensor_parallel_size": _RENDERED + " (spec.model.tensorParallelSize), and the GPUs and pinned pool follow it",
    "kv_cache_dtype": _RENDERED + " (spec.model.kvCacheDtype), and the bytes per token follow it",
    "gpu_memory_utilization": _RENDERED + " (spec.gpu.memoryUtilization)",
    "kv_offloading_size": _RENDERED + " per ladder level (spec.offload.cpu): it is the pinned pool",
    "kv_offloading_backend": _RENDERED + " (spec.offload.backend)",
    "kv_transfer_config": _RENDERED + " per ladder level (spec.offload): it holds the pinned pool and the tiers",
    "block_size": _RENDERED + " (vLLM's GPU block, which the offload block is sized from)",
    "config": "a config file can set any flag, managed ones included",
    "data_parallel_size": "more engines per pod would each pin a pool the memory request does not hold",
    "data_parallel_size_local": "more engines per pod would each pin a pool the memory request does not hold",
    "pipeline_parallel_size": "it changes the GPUs an engine spans, which spec.gpu.count sets",
    "cpu_offload_gb": "weights offloaded to host memory are pinned memory the request does not hold",
    "cpu_offload_params": "weights offloaded to host memory are pinned memory the request does not hold",
    "offload_backend": "weights offloaded to host memory are pinned memory the request does not hold",
    "offload_params": "weights offloaded to host memory are pinned memory the request does not hold",
    "offload_group_size": "weights offloaded to host memory are pinned memory the request does not hold",
    "offload_num_in_group": "weights offloaded to host memory are pinned memory the request does not hold",
    "offload_prefetch_step": "weights offloaded to host memory are pinned memory the request does not hold",
    # The GPU memory share and the KV pool: the sizing and the analysis read them from the spec.
    "kv_cache_memory_bytes": "it sizes the KV pool outright, ignoring spec.gpu.memoryUtilization",
    "num_gpu_blocks_override": "it sizes the KV pool outright, ignoring spec.gpu.memoryUtilization",
    "kv_cache_dtype_skip_layers": "it keeps some layers' KV in another dtype than spec.model.kvCacheDtype, so the "
    "bytes per token differ from the sizing's",
    # The host pool.
    "enable_sleep_mode": "sleep level 1 moves the weights into pinned host memory the request does not hold",
}

# dest -> why it loads code: options that make vLLM import or run code beyond what the image's own entry points
# and the model's weights hold (remote code in the model repository, an import path, a plug-in file). The image
# allow-list vouches for neither, so each is refused unless the cluster admin allows it
# (Tenancy.code_options, --allowed-code-option). CEL cannot see that allowance: the webhook and the operator judge.
_IMPORTS = "it names a Python object (module.qualname) that vLLM imports and runs"
CODE_LOADING_DESTS: Mapping[str, str] = {
    "trust_remote_code": "the model repository's own Python code runs in the engine",
    "worker_cls": _IMPORTS + " as every GPU worker",
    "worker_extension_cls": _IMPORTS + " as a mix-in of every GPU worker",
    "scheduler_cls": _IMPORTS + " as the scheduler",
    "distributed_executor_backend": "besides mp, ray, uni and external_launcher, " + _IMPORTS + " as the executor",
    "middleware": _IMPORTS + " as ASGI middleware of the API server",
    "logits_processors": _IMPORTS + " as a logits processor",
    "model_class_overrides": _IMPORTS + " as the model's class",
    "tool_parser_plugin": "it names a Python file that vLLM loads as a tool parser",
    "reasoning_parser_plugin": "it names a Python file that vLLM loads as a reasoning parser",
    "io_processor_plugin": "it loads an installed plug-in's code for every request's input and output",
}

_OPTIMIZATION_LEVELS = ("0", "1", "2", "3")  # what vLLM takes after a bare -O


@functools.cache
def option_table() -> OptionTable:
    """The option table shipped with the operator (vLLM's parsers, every version in ``versions``)."""
    return load_option_table("kvoffload.engines.vllm", "vllm-options.json")


def managed_flags() -> list[str]:
    """Every spelling vLLM gives the managed settings (long names and aliases), for messages and CEL."""
    return options.managed_flags(option_table(), MANAGED_DESTS)


def judge_extra_args(args: Sequence[str], *, allowed: Collection[str] = ()) -> list[ArgProblem]:
    """Every ``extraArgs`` item that would set a managed value, that would turn on a code-loading option the
    admin has not ``allowed`` (dests or flags), that vLLM has no option for, or that it would read as a positional
    argument (:func:`kvoffload.engines.options.judge_extra_args` over vLLM's table, with its ``-O`` shorthand)."""
    return options.judge_extra_args(
        args,
        option_table(),
        managed=MANAGED_DESTS,
        code=CODE_LOADING_DESTS,
        allowed=allowed,
        engine="vLLM",
        levels={"-O": _OPTIMIZATION_LEVELS},
    )


def managed_pattern() -> str:
    """A regular expression (RE2) matching an ``extraArgs`` item that spells a managed flag outright: any
    mix of ``-`` and ``_``, with ``=value`` or a dotted key. The CRD's CEL rule uses it; abbreviations and
    the walk over values are the webhook's to judge (:func:`judge_extra_args`)."""
    return options.managed_pattern(option_table(), MANAGED_DESTS)


__all__ = [
    "CODE_LOADING_DESTS",
    "MANAGED_DESTS",
    "judge_extra_args",
    "managed_flags",
    "managed_pattern",
    "option_table",
]
