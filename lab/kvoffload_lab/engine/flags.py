"""``kvoffload emulate``'s flags: vLLM's own where the engine models them, ``--speak``, plus fault knobs.

They live beside the engine; the click command in ``kvoffload_lab.commands`` only wires them.
Every fault knob also reads a ``KVOFFLOAD_EMULATE_*`` variable, so a Deployment's env can set it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, TypeVar

import click

from kvoffload_lab.engine.config import SPEAKS, EngineConfig, config_from_options
from kvoffload_lab.engine.faults import Faults, faults_from_options

F = TypeVar("F", bound=Callable[..., Any])

ENV_PREFIX: Final = "KVOFFLOAD_EMULATE_"


def _env(name: str) -> str:
    return f"{ENV_PREFIX}{name}"


OPTIONS: Final[tuple[Callable[[Any], Any], ...]] = (
    click.option("--port", type=int, default=8000, show_default=True),
    click.option("--host", default="127.0.0.1", show_default=True),
    click.option("--model", default=None, help="What `vllm serve` would load (also taken from `serve MODEL`)."),
    click.option("--served-model-name", default=None),
    click.option("--kv-offloading-size", type=float, default=None, help="CPU tier, GiB (vLLM's flag)."),
    click.option("--kv-offloading-backend", type=click.Choice(["native", "lmcache"]), default=None),
    click.option("--kv-transfer-config", default=None, help="JSON, as vLLM takes it (OffloadingConnector, LMCache)."),
    click.option("--max-model-len", type=int, default=None),
    click.option("--block-size", type=int, default=None, help="Tokens per KV block (default 16)."),
    click.option("--gpu-memory-utilization", type=float, default=None),
    click.option("--tensor-parallel-size", "-tp", type=int, default=None),
    click.option("--kv-cache-dtype", default=None),
    click.option(
        "--kv-bytes-per-token",
        type=int,
        default=None,
        envvar=_env("KV_BYTES_PER_TOKEN"),
        help="Default: the model catalog's figure, else 114688 (Qwen3-0.6B).",
    ),
    click.option(
        "--gpu-kv-blocks",
        type=int,
        default=None,
        envvar=_env("GPU_KV_BLOCKS"),
        help="GPU KV cache capacity in blocks (default 4096).",
    ),
    click.option(
        "--gpu-class",
        default=None,
        envvar=_env("GPU_CLASS"),
        help="Price from this GPU class's shipped profile (default: the seed's laptop). Not a vLLM flag.",
    ),
    click.option("--kv-cache-memory-bytes", type=int, default=None, help="GPU KV cache per GPU, bytes (vLLM's flag)."),
    click.option("--num-gpu-blocks-override", type=int, default=None, help="GPU KV cache in blocks (vLLM's flag)."),
    click.option(
        "--max-num-batched-tokens",
        type=int,
        default=None,
        help="Token budget per engine step (vLLM's flag; default as vLLM: 8192 on 70+ GiB GPUs but A100, else 2048).",
    ),
    click.option(
        "--max-num-seqs", type=int, default=None, help="Running requests at most (vLLM's flag; 1024 or 256, as above)."
    ),
    click.option(
        "--pinning-time-scale",
        type=float,
        default=None,
        envvar=_env("PINNING_TIME_SCALE"),
        help="Multiply the modelled pinning of the CPU tier at start (default 1; 0: none). Not a vLLM flag.",
    ),
    click.option(
        "--vllm-version", default=None, envvar=_env("VLLM_VERSION"), help="Metric dialect to speak (default 0.32.0)."
    ),
    click.option(
        "--speak",
        type=click.Choice(SPEAKS),
        default=None,
        help="Whose metrics to expose: vllm (default), sglang (SGLang 0.5.23's sglang: families) or trtllm "
        "(TensorRT-LLM's trtllm_ families at /prometheus/metrics). Not a vLLM flag.",
    ),
    click.option(
        "--enable-metrics",
        is_flag=True,
        default=False,
        help="Speaking sglang (its flag) or trtllm (its return_perf_metrics), the Prometheus metrics are served only "
        "with it, as those engines do.",
    ),
    click.option(
        "--startup-delay",
        type=float,
        default=None,
        envvar=_env("STARTUP_DELAY"),
        help="Seconds before the port opens (models pinning the CPU pool).",
    ),
    click.option("--itl", type=float, default=None, envvar=_env("ITL"), help="Seconds between output tokens (0.010)."),
    click.option(
        "--allocate-cpu-gib",
        type=float,
        default=None,
        envvar=_env("ALLOCATE_CPU_GIB"),
        help="Fault: allocate this CPU tier (GiB) instead of the configured size; kv_offload_config_info shows it.",
    ),
    click.option(
        "--added-latency", type=float, default=0.0, envvar=_env("ADDED_LATENCY"), help="Seconds added to every TTFT."
    ),
    click.option("--ttft-multiplier", type=float, default=1.0, envvar=_env("TTFT_MULTIPLIER")),
    click.option(
        "--ttft-multiplier-after",
        type=float,
        default=None,
        envvar=_env("TTFT_MULTIPLIER_AFTER"),
        help="Seconds from start before --ttft-multiplier applies.",
    ),
    click.option("--itl-multiplier", type=float, default=1.0, envvar=_env("ITL_MULTIPLIER")),
    click.option("--itl-multiplier-after", type=float, default=None, envvar=_env("ITL_MULTIPLIER_AFTER")),
    click.option(
        "--outage-after",
        type=float,
        default=None,
        envvar=_env("OUTAGE_AFTER"),
        help="Seconds from start before every endpoint answers 503.",
    ),
    click.option(
        "--outage-for",
        type=float,
        default=None,
        envvar=_env("OUTAGE_FOR"),
        help="How long the outage lasts (default: for good).",
    ),
    click.option(
        "--error-share",
        type=click.FloatRange(0.0, 1.0),
        default=0.0,
        envvar=_env("ERROR_SHARE"),
        help="Share of requests that fail (finished_reason error, HTTP 500), as a failed KV load fails them.",
    ),
    click.option(
        "--error-share-after",
        type=float,
        default=None,
        envvar=_env("ERROR_SHARE_AFTER"),
        help="Seconds from start before --error-share applies.",
    ),
    click.option(
        "--restore-latency",
        type=click.FloatRange(min=0.0),
        default=0.0,
        envvar=_env("RESTORE_LATENCY"),
        help="Seconds added to the TTFT of every request that restored prompt tokens from an offload tier.",
    ),
)
"""The engine's options, in the order ``--help`` lists them."""


def engine_options(func: F) -> F:
    """Put every engine option (and the ``serve MODEL --flag ...`` arguments) on a click command."""
    for option in reversed(OPTIONS):
        func = option(func)
    return click.argument("args", nargs=-1, type=click.UNPROCESSED)(func)


@click.command(context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
@engine_options
def _parser(**_params: Any) -> None:
    """Parses a command line into the options ``build`` takes; never run."""


FAULT_OPTIONS: Final = (
    "added_latency",
    "ttft_multiplier",
    "ttft_multiplier_after",
    "itl_multiplier",
    "itl_multiplier_after",
    "outage_after",
    "outage_for",
    "error_share",
    "error_share_after",
    "restore_latency",
)


def build(params: Mapping[str, Any], start: float) -> tuple[EngineConfig, Faults, list[str]]:
    """The engine config, its faults and the ignored arguments from ``kvoffload emulate``'s parsed options."""
    options = {k: v for k, v in params.items() if k not in ("host", "port", "args", *FAULT_OPTIONS)}
    config, ignored = config_from_options(positional=params.get("args", ()), **options)
    faults = faults_from_options(start=start + config.ready_delay_s, **{k: params[k] for k in FAULT_OPTIONS})
    return config, faults, ignored


def parse_argv(argv: Sequence[str], start: float | None = None) -> tuple[EngineConfig, Faults, list[str]]:
    """Parse a ``kvoffload emulate`` command line (``serve MODEL --flag ...``) without serving."""
    ctx = _parser.make_context("emulate", list(argv))
    return build(ctx.params, time.monotonic() if start is None else start)
