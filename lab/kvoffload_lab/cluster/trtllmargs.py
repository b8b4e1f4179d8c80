"""A TensorRT-LLM engine container as ``kvoffload emulate`` options: the one place the lab translates
``trtllm-serve``'s command line and its ``--extra_llm_api_options`` file.

A pod whose container runs ``trtllm-serve MODEL ...`` (what ``spec.engine: trtllm`` renders,
engines/trtllm/command.py) runs in the local cluster as an emulator speaking TensorRT-LLM. Its options are read as
``trtllm-serve``'s click parser reads them, from the option table written from its sources
(``engines/trtllm/data/trtllm-options.json``, ``options.option_table``): exact names (``--tp_size``, not
``--tp-size``), ``--name=value`` or ``--name value``, a flag taking no value, the last one winning. They become the
emulator's vLLM-shaped options plus ``--speak trtllm``:

- the positional ``MODEL`` -> ``--model``; ``--served_model_name``, ``--host`` and ``--port`` as they are
  (``trtllm-serve``'s defaults, localhost:8000, when absent; the cluster puts its own host and port last anyway);
- ``--max_seq_len`` -> ``--max-model-len``; ``--tp_size`` (``--tensor_parallel_size``) -> ``--tensor-parallel-size``;
  ``--kv_cache_dtype`` ``auto`` or ``fp8`` as they are (``nvfp4`` has no byte size the emulator models);
- ``--max_batch_size`` -> ``--max-num-seqs`` and ``--max_num_tokens`` -> ``--max-num-batched-tokens``, with
  TensorRT-LLM's defaults (2,048 and 8,192, ``TorchLlmArgs``) when neither the flag nor the file sets them;
- ``--extra_llm_api_options FILE`` (``--config``): the YAML the kubelet read from the pod's ConfigMap volume,
  judged first as TensorRT-LLM would (``engines/trtllm/extra_options.problems``: unknown keys, types), then:

  - ``kv_cache_config.host_cache_size``: bytes **per rank** (every rank pins the whole value), so the emulator's
    CPU tier is ``host_cache_size * tp`` bytes: ``--kv-offloading-size`` in GiB as an exact decimal,
    ``--kv-offloading-backend native``. None or 0: no host cache;
  - ``kv_cache_config.free_gpu_memory_fraction`` -> ``--gpu-memory-utilization``, unless the flag
    ``--free_gpu_memory_fraction`` is given (explicit flags win over the file, serve.py's ``--config`` help). Not
    the same share (TensorRT-LLM's is of the memory left after the weights): the emulator sizes vLLM's way;
  - ``kv_cache_config.enable_block_reuse`` must be true (the emulator's GPU cache always reuses blocks), and
    ``secondary_offload_min_priority`` at most 35 (the default retention priority: every block is offloaded, as the
    emulator stores every block; above it, no default-priority block would reach the host cache);
  - ``return_perf_metrics: true`` -> ``--enable-metrics``: only then does ``trtllm-serve`` serve
    ``/prometheus/metrics``. With it, ``enable_iter_perf_stats`` must be true too (the emulator always reports the
    iteration series beside the per-request ones);
  - ``max_batch_size``, ``max_num_tokens`` as the flags above (the flags winning).

Any other flag or key is refused, naming it, rather than dropped: an engine the lab cannot model faithfully should
not run as if it could. A few flags are accepted and ignored (:data:`IGNORED`, with why).
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping, Sequence
from typing import Any, Final

import yaml

from kvoffload.engines.trtllm.command import ENGINE, LAUNCH, SECONDARY_OFFLOAD_MIN_PRIORITY
from kvoffload.engines.trtllm.extra_options import problems
from kvoffload.engines.trtllm.options import option_table
from kvoffload.engines.vllm.command import gib

DEFAULT_HOST: Final = "localhost"
DEFAULT_PORT: Final = 8000
DEFAULT_MAX_BATCH_SIZE: Final = 2048
DEFAULT_MAX_NUM_TOKENS: Final = 8192
"""``TorchLlmArgs``' ``max_batch_size`` and ``max_num_tokens`` defaults (llm_args.py at 44373a31)."""

TRANSLATED: Final = frozenset(
    {
        "host",
        "port",
        "served_model_name",
        "max_seq_len",
        "tensor_parallel_size",
        "kv_cache_dtype",
        "free_gpu_memory_fraction",
        "max_batch_size",
        "max_num_tokens",
        "extra_llm_api_options",
        "backend",
    }
)
"""The click parameters (dests) the translation reads."""
IGNORED: Final[Mapping[str, str]] = {
    "log_level": "logging only",
    "trust_remote_code": "no model code is loaded",
    "tokenizer": "the emulator tokenizes by its own rule; no tokenizer is loaded",
}
"""Parameters accepted and ignored, with why."""
KV_CACHE_DTYPES: Final = frozenset({"auto", "fp8"})
FILE_KEYS: Final = frozenset(
    {"kv_cache_config", "return_perf_metrics", "enable_iter_perf_stats", "max_batch_size", "max_num_tokens"}
)
KV_KEYS: Final = frozenset(
    {"enable_block_reuse", "host_cache_size", "secondary_offload_min_priority", "free_gpu_memory_fraction"}
)


class TRTLLMArgsError(ValueError):
    """A TensorRT-LLM command line or config file the emulator cannot run faithfully; the message starts with the
    flag or key."""


def is_trtllm(command: Sequence[str]) -> bool:
    """Whether a container's ``command`` runs ``trtllm-serve``."""
    return bool(command) and posixpath.basename(command[0]) == LAUNCH


def _parse(args: Sequence[str]) -> tuple[list[str], dict[str, str | bool]]:
    """The positional arguments and the options by click parameter name, as ``trtllm-serve`` reads them."""
    table = option_table()
    found: dict[str, str | bool] = {}
    positional: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        i += 1
        if not arg.startswith("-"):
            positional.append(arg)
            continue
        name, eq, attached = arg.partition("=")
        entry = table.options.get(name)
        if entry is None:
            raise TRTLLMArgsError(f"{name}: trtllm-serve has no such option")
        dest, nargs = entry
        if dest not in TRANSLATED and dest not in IGNORED:
            raise TRTLLMArgsError(
                f"{name}: a trtllm-serve option the emulator does not translate (it translates "
                f"{', '.join(sorted(TRANSLATED))}; it ignores {', '.join(sorted(IGNORED))})"
            )
        if nargs == 0:
            if eq:
                raise TRTLLMArgsError(f"{name}: a flag, takes no value, got {attached!r}")
            found[dest] = True
            continue
        if eq:
            value = attached
        elif i < len(args):
            value = args[i]
            i += 1
        else:
            raise TRTLLMArgsError(f"{name}: expected one value")
        found[dest] = value
    return positional, found


def _int(where: str, value: object, *, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise TRTLLMArgsError(f"{where}: not an integer, got {value!r}")
    try:
        number = int(value)
    except ValueError:
        raise TRTLLMArgsError(f"{where}: not an integer, got {value!r}") from None
    if number < minimum:
        raise TRTLLMArgsError(f"{where}: must be >= {minimum}, got {value!r}")
    return number


def _fraction(where: str, value: object) -> str:
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise TRTLLMArgsError(f"{where}: not a number, got {value!r}") from None
    if not 0 < number <= 1:
        raise TRTLLMArgsError(f"{where}: must be in (0, 1], got {value!r}")
    return str(value)


def read_config(path: str, files: Mapping[str, str]) -> dict[str, Any]:
    """The ``--extra_llm_api_options`` document at ``path``, from the files mounted into the container."""
    text = files.get(posixpath.normpath(path))
    if text is None:
        mounted = ", ".join(sorted(files)) or "none"
        raise TRTLLMArgsError(
            f"--extra_llm_api_options: {path} is not a file of a ConfigMap volume mounted into the container "
            f"(mounted: {mounted})"
        )
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise TRTLLMArgsError(f"--extra_llm_api_options: {path} is not YAML ({exc})") from exc
    if document is None:
        return {}
    found = problems(document)
    if found:
        raise TRTLLMArgsError(f"--extra_llm_api_options: TensorRT-LLM would refuse {path}: {'; '.join(found)}")
    assert isinstance(document, dict)  # problems() refuses anything but a mapping
    return document


def emulate_args(args: Sequence[str], files: Mapping[str, str]) -> list[str]:
    """``kvoffload emulate`` options for ``trtllm-serve ARGS`` with the container's mounted ``files`` (path -> text).

    Raises :class:`TRTLLMArgsError`, naming the flag or key, for one it cannot translate.
    """
    args = list(args)
    if args[:1] == ["serve"]:  # click's command, which trtllm-serve MODEL reaches by default
        args = args[1:]
    positional, flags = _parse(args)
    if len(positional) != 1:
        raise TRTLLMArgsError(f"MODEL: trtllm-serve takes one positional argument, got {positional!r}")

    def value(dest: str) -> str | None:
        got = flags.get(dest)
        return got if isinstance(got, str) else None

    if (backend := value("backend")) not in (None, "pytorch"):
        raise TRTLLMArgsError(f"--backend: {backend} is not emulated (pytorch, the default, is)")
    config_path = value("extra_llm_api_options")
    config = read_config(config_path, files) if config_path is not None else {}
    for key in config:
        if key not in FILE_KEYS:
            raise TRTLLMArgsError(f"{key}: a key of the extra options file the emulator does not translate")
    kv = config.get("kv_cache_config") or {}
    for key in kv:
        if key not in KV_KEYS:
            raise TRTLLMArgsError(f"kv_cache_config.{key}: a key the emulator does not translate")

    out = ["--speak", "trtllm", "--model", positional[0]]
    if (served := value("served_model_name")) is not None:
        out += ["--served-model-name", served]
    out += ["--host", value("host") or DEFAULT_HOST]
    out += ["--port", str(_int("--port", value("port") or DEFAULT_PORT))]
    if (length := value("max_seq_len")) is not None:
        out += ["--max-model-len", str(_int("--max_seq_len", length))]
    ranks = _int("--tp_size", value("tensor_parallel_size") or 1)
    out += ["--tensor-parallel-size", str(ranks)]
    dtype = value("kv_cache_dtype") or "auto"
    if dtype not in KV_CACHE_DTYPES:
        raise TRTLLMArgsError(f"--kv_cache_dtype: {dtype} has no KV byte size the emulator models")
    out += ["--kv-cache-dtype", dtype]
    if (fraction := value("free_gpu_memory_fraction")) is not None:
        out += ["--gpu-memory-utilization", _fraction("--free_gpu_memory_fraction", fraction)]
    elif (fraction_in_file := kv.get("free_gpu_memory_fraction")) is not None:
        out += ["--gpu-memory-utilization", _fraction("kv_cache_config.free_gpu_memory_fraction", fraction_in_file)]
    batch = value("max_batch_size") or config.get("max_batch_size") or DEFAULT_MAX_BATCH_SIZE
    tokens = value("max_num_tokens") or config.get("max_num_tokens") or DEFAULT_MAX_NUM_TOKENS
    out += ["--max-num-seqs", str(_int("max_batch_size", batch))]
    out += ["--max-num-batched-tokens", str(_int("max_num_tokens", tokens))]
    out += _metrics_args(config)
    return out + _host_cache_args(kv, ranks)


def _metrics_args(config: Mapping[str, Any]) -> list[str]:
    if config.get("return_perf_metrics") is not True:
        return []  # trtllm-serve mounts no /prometheus/metrics
    if config.get("enable_iter_perf_stats") is not True:
        raise TRTLLMArgsError(
            "enable_iter_perf_stats: must be true beside return_perf_metrics (the emulator always reports the "
            "iteration series with the per-request ones)"
        )
    return ["--enable-metrics"]


def _host_cache_args(kv: Mapping[str, Any], ranks: int) -> list[str]:
    """The CPU tier of ``kv_cache_config``: the host cache of every rank; none without one."""
    if kv.get("enable_block_reuse", True) is not True:
        raise TRTLLMArgsError("kv_cache_config.enable_block_reuse: false is not emulated (its GPU cache reuses blocks)")
    priority = kv.get("secondary_offload_min_priority")
    if priority is not None and priority > SECONDARY_OFFLOAD_MIN_PRIORITY:
        raise TRTLLMArgsError(
            f"kv_cache_config.secondary_offload_min_priority: {priority} would offload no block of the default "
            f"retention priority {SECONDARY_OFFLOAD_MIN_PRIORITY}; the emulator offloads every block"
        )
    size = kv.get("host_cache_size")
    if not size:
        return []
    per_rank = _int("kv_cache_config.host_cache_size", size)
    return ["--kv-offloading-size", gib(per_rank * ranks), "--kv-offloading-backend", "native"]


class TRTLLMSpeaker:
    """``trtllm-serve`` as the emulator runs it: translated by :func:`emulate_args`, its metrics at
    ``/prometheus/metrics``."""

    name: Final = "trtllm"
    title: Final = "TensorRT-LLM"
    metrics_path: Final = ENGINE.metrics_path

    def emulate_args(self, container: Mapping[str, Any], files: Mapping[str, str]) -> list[str]:
        command = [str(c) for c in container.get("command") or []]
        if not is_trtllm(command):
            raise TRTLLMArgsError(f"command: {command!r} does not run {LAUNCH}")
        # No variable configures TensorRT-LLM's host cache (command.py renders none): env is not read.
        args = [str(a) for a in container.get("args") or []]
        return emulate_args([*command[1:], *args], files)


SPEAKER: Final = TRTLLMSpeaker()
