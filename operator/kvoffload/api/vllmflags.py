"""``vllm serve``'s command line as vLLM's own parser reads it: which ``extraArgs`` would set a value the
operator manages.

A flag is judged by what it sets (its argparse ``dest``), not by how it is spelt. vLLM's
``FlexibleArgumentParser`` turns ``_`` into ``-`` in a flag's name, takes ``--flag=value``, folds dotted keys
(``--kv-transfer-config.kv_role=…``) into the JSON of their base flag, and argparse accepts short aliases
(``-tp``), other long names for the same setting (``--device-memory-utilization``) and unique abbreviations
(``--max-model 4096``). The option table (``data/vllm-options.json``) is taken from vLLM's own parsers by
``scripts/vllm_options.py``, and tests/realvllm checks it against them, so the walk below needs no vLLM.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

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

_NEGATIVE_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+$")  # argparse reads these as values, not options
_OPTIMIZATION_LEVELS = ("0", "1", "2", "3")  # what vLLM takes after a bare -O


@dataclass(frozen=True)
class OptionTable:
    """``vllm serve``'s options: each option string's dest and how many values it takes."""

    versions: tuple[str, ...]
    allow_abbrev: bool
    options: Mapping[str, tuple[str, int | str]]

    def flags_of(self, dest: str) -> list[str]:
        """Every option string that sets ``dest``, long names first and negations (``--no-x``) after them."""
        found = [o for o, (d, _) in self.options.items() if d == dest]
        return sorted(found, key=lambda o: (not o.startswith("--"), o.startswith(("--no-", "--disable-")), o))


def load_option_table(package: str, name: str) -> OptionTable:
    """An option table shipped in ``package``'s ``data`` folder (written by ``scripts/*_options.py``)."""
    raw: dict[str, Any] = json.loads((resources.files(package) / "data" / name).read_text(encoding="utf-8"))
    return OptionTable(
        versions=tuple(raw["versions"]),
        allow_abbrev=bool(raw["allowAbbrev"]),
        options={o: (e["dest"], e["nargs"]) for o, e in raw["options"].items()},
    )


@functools.cache
def option_table() -> OptionTable:
    """The option table shipped with the operator (vLLM's parsers, every version in ``versions``)."""
    return load_option_table("kvoffload.api", "vllm-options.json")


def managed_flags() -> list[str]:
    """Every spelling vLLM gives the managed settings (long names and aliases), for messages and CEL."""
    table = option_table()
    return sorted({o for dest in MANAGED_DESTS for o in table.flags_of(dest)})


@dataclass(frozen=True)
class ArgProblem:
    """One ``extraArgs`` item that may not stand: its index and why."""

    index: int
    message: str


def option_like(arg: str) -> bool:
    """Whether argparse reads ``arg`` as an option (not a value such as -1)."""
    return arg.startswith("-") and arg != "-" and not _NEGATIVE_NUMBER.match(arg)


def candidates(table: OptionTable, name: str) -> list[str]:
    """The option strings argparse may take ``name`` for: itself, else its unique-prefix expansions."""
    if name in table.options:
        return [name]
    if name.startswith("--"):
        return sorted(o for o in table.options if o.startswith(name)) if table.allow_abbrev else []
    # One dash: argparse also reads "-tp8" as "-tp" "8"... only for options of two characters ("-h5").
    return sorted(o for o in table.options if o.startswith(name) or (len(o) == 2 and name.startswith(o)))


def _name(arg: str) -> tuple[str, bool, bool]:
    """The option name vLLM's parser looks up for ``arg``; whether a value is attached (``=``); and whether
    it is a dotted key (``--flag.key``, also ``-cc.key``), which always takes a value."""
    key, eq, _ = arg.partition("=")
    base, dot, _ = key.partition(".")
    if arg.startswith("--"):
        return "--" + base[2:].replace("_", "-"), bool(eq), bool(dot)
    return base, bool(eq), bool(dot)


def option_dest(name: str) -> str:
    """A dest as the admin may name it: ``--trust-remote-code``, ``trust-remote-code`` or ``trust_remote_code``."""
    return name.lstrip("-").replace("-", "_")


def _code_problem(table: OptionTable, dest: str, spelled: str, why: str) -> str:
    flag = table.flags_of(dest)[0]
    return (
        f"sets {flag}{spelled}, which loads code the image allow-list does not vouch for: {why}; "
        f"only a cluster admin can allow it (--allowed-code-option {flag})"
    )


def judge_extra_args(
    args: Sequence[str],
    table: OptionTable | None = None,
    *,
    managed: Mapping[str, str] = MANAGED_DESTS,
    code: Mapping[str, str] = CODE_LOADING_DESTS,
    allowed: Collection[str] = (),
    engine: str = "vLLM",
) -> list[ArgProblem]:
    """Every ``extraArgs`` item that would set a ``managed`` value, that would turn on a ``code``-loading option
    the admin has not ``allowed`` (dests or flags, :func:`option_dest`), that the engine has no option for, or
    that it would read as a positional argument (the model); empty when all may stand. The table and dests are
    vLLM's unless an engine gives its own (SGLang's plain argparse is judged the same way, and ``_`` in a name
    is read as ``-`` there too, which can only refuse more).

    The walk follows ``FlexibleArgumentParser.parse_args`` and argparse: names normalised, dotted keys
    reduced to their base flag, aliases and abbreviations resolved, and each option's values skipped."""
    table = table or option_table()
    known = ", ".join(table.versions)
    permitted = {option_dest(a) for a in allowed}
    found: list[ArgProblem] = []
    i = 0
    while i < len(args):
        arg = args[i]
        i += 1
        if arg == "--":
            found.append(ArgProblem(i - 1, f"'--' ends {engine}'s options: what follows would be read as the model"))
            break
        if not option_like(arg):
            found.append(
                ArgProblem(
                    i - 1,
                    f"{arg!r} is no option's value: {engine} would read it as a positional argument, the model "
                    "(give values right after their flag, or as --flag=value)",
                )
            )
            continue
        if engine == "vLLM" and arg.startswith("-O") and not arg.startswith("--"):
            # vLLM's own shorthand for --optimization-level: -O3, -O=3 or -O 3 (a bare -O takes only 0-3).
            if arg != "-O":
                continue
            if i < len(args) and args[i] in _OPTIMIZATION_LEVELS:
                i += 1
                continue
            found.append(ArgProblem(i - 1, "vLLM reads a bare -O only before a level, 0 to 3 (or write -O3)"))
            continue
        name, attached, dotted = _name(arg)
        spelt_as = candidates(table, name)
        if not name.startswith("--") and len(name) > 2 and len(spelt_as) == 1 and len(spelt_as[0]) == 2:
            attached = True  # "-qfp8": argparse reads a two-character option with its value attached
        hits = [c for c in spelt_as if table.options[c][0] in managed]
        # "--no-trust-remote-code" turns the option off: it loads nothing.
        code_hits = [
            c
            for c in spelt_as
            if table.options[c][0] in code and table.options[c][0] not in permitted and not c.startswith("--no-")
        ]
        if hits:
            dest = table.options[hits[0]][0]
            spelled = "" if name == hits[0] else f" ({arg.partition('=')[0]} is read as {hits[0]})"
            found.append(
                ArgProblem(
                    i - 1,
                    f"sets {table.flags_of(dest)[0]}{spelled}, which the operator manages: {managed[dest]}",
                )
            )
        elif code_hits:
            dest = table.options[code_hits[0]][0]
            spelled = "" if name == code_hits[0] else f" ({arg.partition('=')[0]} is read as {code_hits[0]})"
            found.append(ArgProblem(i - 1, _code_problem(table, dest, spelled, code[dest])))
        elif not spelt_as:
            found.append(ArgProblem(i - 1, f"{engine} {known} has no option {name}"))
        elif len(spelt_as) > 1:
            found.append(ArgProblem(i - 1, f"{name} is ambiguous in {engine}: it could be {', '.join(spelt_as[:4])}"))
        if attached:
            continue
        nargs = 1 if dotted or len(spelt_as) != 1 else table.options[spelt_as[0]][1]
        if nargs in (1, "?") and i < len(args) and not option_like(args[i]):
            i += 1
        elif nargs in ("+", "*"):
            while i < len(args) and not option_like(args[i]):
                i += 1
        elif isinstance(nargs, int) and nargs > 1:
            i += nargs
    return found


def cel_managed_pattern() -> str:
    """A regular expression (RE2) matching an ``extraArgs`` item that spells a managed flag outright: any
    mix of ``-`` and ``_``, with ``=value`` or a dotted key. The CRD's CEL rule uses it; abbreviations and
    the walk over values are the webhook's to judge (:func:`judge_extra_args`)."""
    long_names = sorted({f[2:] for f in managed_flags() if f.startswith("--")})
    short = sorted({f[1:] for f in managed_flags() if not f.startswith("--")})
    spelled = "|".join(n.replace("-", "[-_]") for n in long_names)
    return f"^(--({spelled})([=.].*)?|-({'|'.join(short)})(=.*)?)$"


__all__ = [
    "CODE_LOADING_DESTS",
    "MANAGED_DESTS",
    "ArgProblem",
    "OptionTable",
    "cel_managed_pattern",
    "judge_extra_args",
    "load_option_table",
    "managed_flags",
    "option_dest",
    "option_table",
]
