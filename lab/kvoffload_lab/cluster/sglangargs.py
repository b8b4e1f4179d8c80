"""An SGLang engine container as ``kvoffload emulate`` options: the one place the lab translates SGLang's command
line.

A pod whose container runs ``python3 -m sglang.launch_server`` (what ``spec.engine: sglang`` renders,
engines/sglang/command.py) runs in the local cluster as an emulator speaking SGLang: its flags, read as
SGLang 0.5.23 reads them, become the emulator's vLLM-shaped options plus ``--speak sglang``:

- ``--model-path`` (alias ``--model``) -> ``--model``; ``--served-model-name``, ``--host`` and ``--port`` as they
  are (SGLang's own defaults, 127.0.0.1:30000, when absent; the cluster puts its own host and port last anyway).
- ``--context-length`` (SGLang's ``human_readable_int``: ``32k`` is 32,000, ``32Ki`` 32,768) ->
  ``--max-model-len``; ``--tp-size`` (alias ``--tensor-parallel-size``) -> ``--tensor-parallel-size``;
  ``--mem-fraction-static`` -> ``--gpu-memory-utilization``; ``--kv-cache-dtype`` in vLLM's spelling (``bf16`` is
  ``bfloat16``; the FP4 and MX formats have no byte size the emulator knows, so they are refused).
- ``--max-running-requests`` -> ``--max-num-seqs`` and ``--chunked-prefill-size`` -> ``--max-num-batched-tokens``
  (without them the emulator keeps vLLM's batch defaults: SGLang's depend on the GPU's memory).
- ``--enable-metrics`` as it is (without it an SGLang engine serves no /metrics, and neither does the emulator).
- HiCache: ``--enable-hierarchical-cache`` (alias ``--enable-hicache``) with ``--hicache-size G`` ->
  ``--kv-offloading-size`` in GiB, ``G * 10^9 * tp_size / 2^30`` written as an exact decimal (SGLang's size is
  decimal gigabytes per TP rank, the emulator's CPU tier is the engine's total), ``--kv-offloading-backend
  native``. With ``--hicache-storage-backend file`` also a ``--kv-transfer-config`` with vLLM's
  TieringOffloadingSpec: the same CPU bytes, LRU, and one ``fs`` secondary tier whose ``root_dir`` is the
  container's ``SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR`` (else SGLang's default ``/tmp/hicache``). The
  file backend has no size and no thread settings, so the tier is unbounded and carries no thread counts.

The emulator then prices HiCache exactly as vLLM's native offload (one cost model, one block cache), and only
its /metrics speak SGLang. A flag that is neither translated nor in :data:`IGNORED` (with its reason) is
refused, naming it, rather than dropped: an engine the lab cannot model faithfully should not run as if it
could.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from decimal import Decimal
from pathlib import Path
from typing import Any, Final

from kvoffload.engines.sglang.command import ENGINE, FILE_BACKEND_DIR, GB
from kvoffload.engines.vllm.command import gib

LAUNCH: Final = ("-m", "sglang.launch_server")
"""After the interpreter (``python3``, ``python``...): what marks an SGLang container."""
DEFAULT_FILE_DIR: Final = "/tmp/hicache"
"""The file backend's directory when the variable is not set (SGLang's ``mem_cache/hicache_storage.py``)."""
DEFAULT_HOST: Final = "127.0.0.1"
DEFAULT_PORT: Final = 30000

ALIASES: Final[Mapping[str, str]] = {
    "--model": "--model-path",
    "--tensor-parallel-size": "--tp-size",
    "--enable-hicache": "--enable-hierarchical-cache",
}
"""SGLang's other names for the flags translated (its option table's, engines/sglang/data/sglang-options.json)."""

VALUED: Final = frozenset(
    {
        "--model-path",
        "--served-model-name",
        "--host",
        "--port",
        "--context-length",
        "--tp-size",
        "--kv-cache-dtype",
        "--mem-fraction-static",
        "--max-running-requests",
        "--chunked-prefill-size",
        "--hicache-size",
        "--hicache-storage-backend",
    }
)
"""Translated flags that take one value."""
SWITCHES: Final = frozenset({"--enable-metrics", "--enable-hierarchical-cache"})
"""Translated flags that take none."""

KV_CACHE_DTYPES: Final[Mapping[str, str]] = {
    "auto": "auto",
    "bf16": "bfloat16",
    "bfloat16": "bfloat16",
    "fp8_e4m3": "fp8_e4m3",
    "fp8_e5m2": "fp8_e5m2",
}
"""SGLang's --kv-cache-dtype choices the emulator sizes (one byte for FP8, the model's width otherwise), as vLLM
spells them; SGLang's others (mxfp8, nvfp4, fp4_mx_block16) are refused."""

IGNORED: Final[Mapping[str, str]] = {
    "--page-size": "the emulator's caches keep 16-token blocks for both engines (SGLang's radix cache matches "
    "single tokens on CUDA by default): a page size changes no modelled price",
    "--hicache-write-policy": "every computed block is stored to the host tier as it is computed (write_through, "
    "SGLang's default); write_back and write_through_selective change when a backup happens, which is not "
    "modelled",
    "--hicache-io-backend": "the host-GPU copies are priced by the cost model, whatever kernel makes them",
    "--hicache-mem-layout": "the host pool's layout is not modelled; its copies are priced by the cost model",
    "--hicache-storage-prefetch-policy": "a storage hit is restored whole, as the fs tier's; no prefetch deadline",
    "--trust-remote-code": "no model code is loaded",
    "--log-level": "logging only",
}
"""SGLang flags (one value each but the switch ``--trust-remote-code``) accepted and ignored, with why."""
IGNORED_SWITCHES: Final = frozenset({"--trust-remote-code"})

_HUMAN_INT = re.compile(r"(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|k|M|G|T)")
_SI = {"k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
_IEC = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}


class SGLangArgsError(ValueError):
    """An SGLang command line the emulator cannot run faithfully; the message starts with the flag."""


def is_sglang(command: Sequence[str]) -> bool:
    """Whether a container's ``command`` launches SGLang's server (``python3 -m sglang.launch_server``)."""
    return len(command) >= 3 and Path(command[0]).name.startswith("python") and tuple(command[1:3]) == LAUNCH


def human_readable_int(flag: str, value: str) -> int:
    """SGLang's ``human_readable_int`` (srt/utils/common.py): an integer, SI (``32k``) or IEC (``32Ki``) suffixed."""
    text = value.strip()
    match = _HUMAN_INT.fullmatch(text)
    if match:
        number, suffix = match.groups()
        if suffix in _IEC:
            if "." in number:
                raise SGLangArgsError(f"{flag}: no decimals with IEC suffixes like {suffix!r}, got {value!r}")
            return int(number) * _IEC[suffix]
        return int(Decimal(number) * _SI[suffix])
    try:
        return int(text)
    except ValueError:
        raise SGLangArgsError(f"{flag}: not an integer, got {value!r}") from None


def _positive_int(flag: str, value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise SGLangArgsError(f"{flag}: not an integer, got {value!r}") from None
    if number <= 0:
        raise SGLangArgsError(f"{flag}: must be positive, got {value!r}")
    return number


def _parse(args: Sequence[str]) -> dict[str, str | bool]:
    """SGLang's flags by their canonical name; ``--flag=value`` and ``--flag value``, the last one winning as in
    argparse. Refuses anything neither translated nor ignored."""
    found: dict[str, str | bool] = {}
    i = 0
    while i < len(args):
        arg = args[i]
        i += 1
        if not arg.startswith("-"):
            raise SGLangArgsError(f"{arg}: SGLang's launch_server takes no positional argument")
        name, eq, attached = arg.partition("=")
        name = ALIASES.get(name, name)
        switch = name in SWITCHES or name in IGNORED_SWITCHES
        if name not in VALUED and name not in IGNORED and not switch:
            raise SGLangArgsError(
                f"{name}: an SGLang flag the emulator does not translate (it translates "
                f"{', '.join(sorted(VALUED | SWITCHES))}; it ignores {', '.join(sorted(IGNORED))})"
            )
        if switch:
            if eq:
                raise SGLangArgsError(f"{name}: takes no value, got {attached!r}")
            found[name] = True
            continue
        if eq:
            value = attached
        elif i < len(args) and not args[i].startswith("--"):
            value = args[i]
            i += 1
        else:
            raise SGLangArgsError(f"{name}: expected one value")
        found[name] = value
    return found


def _env_value(env: Sequence[Mapping[str, Any]], name: str) -> str | None:
    """A container variable's literal value; one from a Secret or ConfigMap cannot be read here."""
    for item in reversed(list(env)):
        if item.get("name") == name:
            if "value" not in item:
                raise SGLangArgsError(f"{name}: set from {sorted(k for k in item if k != 'name')}, not a literal")
            return str(item["value"])
    return None


def emulate_args(args: Sequence[str], env: Sequence[Mapping[str, Any]] = ()) -> list[str]:
    """``kvoffload emulate`` options for ``python3 -m sglang.launch_server ARGS`` with the container's ``env``.

    Raises :class:`SGLangArgsError`, naming the flag, for one it cannot translate.
    """
    flags = _parse(args)

    def value(name: str) -> str | None:
        got = flags.get(name)
        return got if isinstance(got, str) else None

    model = value("--model-path")
    if model is None:
        raise SGLangArgsError("--model-path: required by SGLang's launch_server")
    out = ["--speak", "sglang", "--model", model]
    if (served := value("--served-model-name")) is not None:
        out += ["--served-model-name", served]
    out += ["--host", value("--host") or DEFAULT_HOST]
    out += ["--port", str(_positive_int("--port", value("--port") or str(DEFAULT_PORT)))]
    if (context := value("--context-length")) is not None:
        out += ["--max-model-len", str(human_readable_int("--context-length", context))]
    ranks = _positive_int("--tp-size", value("--tp-size") or "1")
    out += ["--tensor-parallel-size", str(ranks)]
    if (dtype := value("--kv-cache-dtype")) is not None:
        if dtype not in KV_CACHE_DTYPES:
            raise SGLangArgsError(
                f"--kv-cache-dtype: {dtype} has no KV byte size the emulator models (it takes "
                f"{', '.join(KV_CACHE_DTYPES)})"
            )
        out += ["--kv-cache-dtype", KV_CACHE_DTYPES[dtype]]
    if (fraction := value("--mem-fraction-static")) is not None:
        try:
            float(fraction)
        except ValueError:
            raise SGLangArgsError(f"--mem-fraction-static: not a number, got {fraction!r}") from None
        out += ["--gpu-memory-utilization", fraction]
    if (running := value("--max-running-requests")) is not None:
        out += ["--max-num-seqs", str(_positive_int("--max-running-requests", running))]
    if (chunk := value("--chunked-prefill-size")) is not None:
        out += ["--max-num-batched-tokens", str(_positive_int("--chunked-prefill-size", chunk))]
    if flags.get("--enable-metrics") is True:
        out.append("--enable-metrics")
    return out + _hicache_args(flags, value("--hicache-size"), value("--hicache-storage-backend"), ranks, env)


def _hicache_args(
    flags: Mapping[str, str | bool],
    size: str | None,
    backend: str | None,
    ranks: int,
    env: Sequence[Mapping[str, Any]],
) -> list[str]:
    """The CPU tier (and the fs tier under it) of ``--enable-hierarchical-cache``; none without it."""
    if flags.get("--enable-hierarchical-cache") is not True:
        if backend is not None:
            raise SGLangArgsError("--hicache-storage-backend: needs --enable-hierarchical-cache")
        return []  # SGLang reads no --hicache-size without HiCache
    gigabytes = 0 if size is None else _nonnegative_int("--hicache-size", size)
    if gigabytes == 0:
        raise SGLangArgsError(
            "--hicache-size: not given, so SGLang would size the host pool from the GPU pool (--hicache-ratio, or "
            "from the host's free memory), which the emulator does not translate; give --hicache-size"
        )
    cpu_bytes = gigabytes * GB * ranks
    out = ["--kv-offloading-size", gib(cpu_bytes), "--kv-offloading-backend", "native"]
    if backend is None:
        return out
    if backend != "file":
        raise SGLangArgsError(f"--hicache-storage-backend: {backend} is not emulated (file is, as an fs tier)")
    root = _env_value(env, FILE_BACKEND_DIR) or DEFAULT_FILE_DIR
    transfer = {
        "kv_connector": "OffloadingConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {
            "spec_name": "TieringOffloadingSpec",
            "cpu_bytes_to_use": cpu_bytes,
            "eviction_policy": "lru",
            "secondary_tiers": [{"type": "fs", "root_dir": root}],
        },
    }
    return [*out, "--kv-transfer-config", json.dumps(transfer, separators=(",", ":"))]


def _nonnegative_int(flag: str, value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise SGLangArgsError(f"{flag}: not an integer (SGLang's type is int), got {value!r}") from None
    if number < 0:
        raise SGLangArgsError(f"{flag}: must be >= 0, got {value!r}")
    return number


class SGLangSpeaker:
    """``python3 -m sglang.launch_server`` as the emulator runs it: translated by :func:`emulate_args`."""

    name: Final = "sglang"
    title: Final = "SGLang"
    metrics_path: Final = ENGINE.metrics_path

    def emulate_args(self, container: Mapping[str, Any], files: Mapping[str, str]) -> list[str]:
        """The emulator's options for an SGLang container (its command, args and env; SGLang reads no config file
        the operator mounts, so ``files`` is not read)."""
        command = [str(c) for c in container.get("command") or []]
        if not is_sglang(command):
            raise SGLangArgsError(f"command: {command!r} does not run python3 -m sglang.launch_server")
        args = [str(a) for a in container.get("args") or []]
        return emulate_args([*command[3:], *args], container.get("env") or [])


SPEAKER: Final = SGLangSpeaker()
