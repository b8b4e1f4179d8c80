"""``trtllm-serve``'s command line as its click parser reads it: which ``extraArgs`` would set a value the operator
manages, load code, or name no option.

The table is ``data/trtllm-options.json`` (``options``), written by ``scripts/trtllm_options.py`` from
``tensorrt_llm/commands/serve.py`` at ``44373a31``. Click is not argparse: an option is matched by its exact name
(no abbreviations, and no ``_``/``-`` folding: ``--tp-size`` is no option of ``trtllm-serve``, ``--tp_size`` is),
``--name=value`` works for long names, and a flag (``is_flag``) takes no value. So the vLLM walk
(``engines/options.py``), which folds ``_`` into ``-`` and expands abbreviations, is not used to judge here.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Collection, Mapping, Sequence
from importlib import resources
from typing import Any

from kvoffload.engines.options import ArgProblem, OptionTable, option_dest, option_like

TABLE = "trtllm-options.json"

# dest -> why extraArgs may not set it (click's parameter names in the table).
_RENDERED = "the operator renders it from the spec"
_FILE = "the operator's --extra_llm_api_options file"
MANAGED_DESTS: Mapping[str, str] = {
    "host": _RENDERED + ": the probes, the Service and the PodMonitor use it",
    "port": _RENDERED + ": the probes, the Service and the PodMonitor use it",
    "report_addr": "it exists to serve on a port chosen at start (--port 0), which the probes could not reach",
    "grpc": "a gRPC server instead of the OpenAI HTTP one leaves the probes and the PodMonitor nothing to reach",
    "served_model_name": _RENDERED + " (spec.model.servedModelName)",
    "max_seq_len": _RENDERED + " (spec.model.maxModelLen), and the sizing uses it",
    "tensor_parallel_size": _RENDERED + " (spec.model.tensorParallelSize), and the GPUs and pinned pool follow it",
    "kv_cache_dtype": _RENDERED + " (spec.model.kvCacheDtype), and the bytes per token follow it",
    "free_gpu_memory_fraction": _RENDERED + " into " + _FILE + " (spec.gpu.memoryUtilization); a flag would win "
    "over the file",
    "extra_llm_api_options": _FILE + " holds the level's kv_cache_config (its host cache is the pinned pool)",
    "config_overrides": "--set is applied after " + _FILE + " and can change any of its values, the host cache "
    "included",
    "backend": "the operator sizes and renders the PyTorch backend (trtllm-serve's default) only",
    "pipeline_parallel_size": "it changes the GPUs an engine spans, which spec.gpu.count sets",
    "context_parallel_size": "it changes the GPUs an engine spans, which spec.gpu.count sets",
    "enable_attention_dp": "each rank then holds every KV head of its own requests, not 1/TP of them as the sizing "
    "assumes",
    "server_role": "disaggregated serving moves KV between engines, which the ladder neither sizes nor judges",
    "disagg_cluster_uri": "disaggregated serving moves KV between engines, which the ladder neither sizes nor judges",
}

# dest -> why it loads code beyond the image's own entry points and the model's weights; refused unless the cluster
# admin allows it (Tenancy.code_options, --allowed-code-option). The reasons are serve.py's own help texts.
_IMPORTS = "it names a Python object (an import path) that trtllm-serve imports and runs"
CODE_LOADING_DESTS: Mapping[str, str] = {
    "trust_remote_code": "the model repository's own Python code runs in the engine",
    "custom_module_dirs": "it names directories of Python modules that trtllm-serve imports",
    "custom_tokenizer": _IMPORTS + " as the tokenizer (besides its built-in aliases)",
    "post_processor_hook": _IMPORTS + " on every response",
    "middleware": _IMPORTS + " as FastAPI middleware of the server",
}


def _raw() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(
        (resources.files("kvoffload.engines.trtllm") / "data" / TABLE).read_text(encoding="utf-8")
    )
    return loaded


@functools.cache
def option_table() -> OptionTable:
    """``trtllm-serve``'s options exactly as click matches them."""
    raw = _raw()
    return OptionTable(
        versions=tuple(raw["versions"]),
        allow_abbrev=bool(raw["allowAbbrev"]),
        options={o: (e["dest"], e["nargs"]) for o, e in raw["options"].items()},
    )


@functools.cache
def walk_table() -> OptionTable:
    """The same options keyed as ``engines/adoption.py``'s walk looks them up (it folds ``_`` into ``-``, as vLLM's
    parser does). Only for reading a container that already runs: its spelling is one click took."""
    table = option_table()
    folded = {"--" + o[2:].replace("_", "-") if o.startswith("--") else o: v for o, v in table.options.items()}
    return OptionTable(table.versions, False, folded)


def flags_of(dest: str) -> list[str]:
    """Every option string of ``dest``, long names first."""
    table: OptionTable = option_table()
    return table.flags_of(dest)


def managed_flags() -> list[str]:
    """Every spelling of the managed settings, for messages and CEL."""
    return sorted({o for dest in MANAGED_DESTS for o in flags_of(dest)})


def judge_extra_args(args: Sequence[str], *, allowed: Collection[str] = ()) -> list[ArgProblem]:
    """Every ``extraArgs`` item that would set a managed value, turn on a code-loading option the admin has not
    ``allowed`` (dests or flags, :func:`~kvoffload.engines.options.option_dest`), that ``trtllm-serve`` has no option
    for, or that it would read as a positional argument (a second model); empty when all may stand."""
    table = option_table()
    permitted = {option_dest(a) for a in allowed}
    known = ", ".join(table.versions)
    found: list[ArgProblem] = []
    i = 0
    while i < len(args):
        arg, at = args[i], i
        i += 1
        if arg == "--":
            found.append(ArgProblem(at, "'--' ends trtllm-serve's options: what follows would be read as the model"))
            break
        if not option_like(arg):
            found.append(
                ArgProblem(
                    at,
                    f"{arg!r} is no option's value: trtllm-serve would read it as a positional argument, a second "
                    "model (give values right after their flag, or as --flag=value)",
                )
            )
            continue
        name, eq, _ = arg.partition("=")
        entry = table.options.get(name)
        if entry is None:
            hint = "--" + name[2:].replace("-", "_")
            spelt = (
                f" (its options are spelt with '_': {hint})" if name.startswith("--") and hint in table.options else ""
            )
            found.append(ArgProblem(at, f"trtllm-serve {known} has no option {name}{spelt}"))
            if not eq and i < len(args) and not option_like(args[i]):
                i += 1  # its value, most likely: not a second problem
            continue
        dest, nargs = entry
        if dest in MANAGED_DESTS:
            found.append(ArgProblem(at, f"sets {flags_of(dest)[0]}, which the operator manages: {MANAGED_DESTS[dest]}"))
            if not eq and nargs != 0:
                i += 1  # its value, if any: the item is refused already, not twice
            continue
        if dest in CODE_LOADING_DESTS and dest not in permitted:
            flag = flags_of(dest)[0]
            found.append(
                ArgProblem(
                    at,
                    f"sets {flag}, which loads code the image allow-list does not vouch for: "
                    f"{CODE_LOADING_DESTS[dest]}; only a cluster admin can allow it (--allowed-code-option {flag})",
                )
            )
        if nargs == 0:
            if eq:
                found.append(ArgProblem(at, f"{name} is a switch: click takes no value after it"))
            continue
        if eq:
            continue
        if i == len(args):
            found.append(ArgProblem(at, f"{name} needs a value"))
        i += 1  # click takes the next item as the value, whatever it looks like
    return found


__all__ = [
    "CODE_LOADING_DESTS",
    "MANAGED_DESTS",
    "flags_of",
    "judge_extra_args",
    "managed_flags",
    "option_table",
    "walk_table",
]
