"""``kvoffload calibrate --engine-url URL``: a running engine's TTFT phases, fitted into an engine profile."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import click

from kvoffload.economics.enginecost import (
    ENGINE_MODES,
    EngineProfile,
    Run,
    copy_pricer,
    load_engine_profile,
    model_cost,
)
from kvoffload.economics.engineprobe import EngineSeries, Plan, discover, measure
from kvoffload.economics.profile import ProfileError
from kvoffload.engines.dialect import SOURCE_EXTERNAL_KV_TRANSFER as EXTERNAL
from kvoffload.engines.dialect import SOURCE_LOCAL_CACHE_HIT as LOCAL_HIT
from kvoffload.engines.dialect import SOURCE_LOCAL_COMPUTE as COMPUTED
from kvoffload.engines.dialect import Dialect
from kvoffload.engines.sglang.dialect import SGLANG
from kvoffload.engines.vllm.dialect import dialect_for


def series_of(dialect: Dialect) -> EngineSeries:
    """Where the probe reads a dialect's TTFT and token split."""
    cached = dialect.prompt_tokens_cached_by_source
    return EngineSeries(
        ttft_sum=dialect.ttft + "_sum",
        ttft_count=dialect.ttft + "_count",
        by_source=dialect.prompt_tokens_by_source,
        source_computed=COMPUTED,
        source_local_hit=LOCAL_HIT,
        source_external=EXTERNAL,
        prompt_tokens=dialect.prompt_tokens,
        cached_by_source=cached,
        cached_device="device",
        cached_host=tuple(dialect.cached_tier_sources),
    )


def _lengths(_ctx: click.Context, param: click.Parameter, value: str) -> tuple[int, ...]:
    try:
        lengths = tuple(int(x) for x in value.split(",") if x.strip())
    except ValueError:
        raise click.BadParameter(f"{value!r}: comma-separated token counts, such as 512,2048", param=param) from None
    if any(n < 16 for n in lengths):
        raise click.BadParameter("every length must be at least 16 tokens (one KV block)", param=param)
    return lengths


@click.command(name="calibrate --engine-url")
@click.option("--engine-url", required=True, metavar="URL", help="The engine's HTTP address (vLLM or SGLang).")
@click.option(
    "--model",
    required=True,
    metavar="NAME",
    help="The catalog model it serves (its parameters and KV shape price the fit).",
)
@click.option("--gpu-class", required=True, metavar="CLASS", help="The GPU class it runs on (nvidia-h100-80gb...).")
@click.option(
    "--engine-mode",
    type=click.Choice(ENGINE_MODES),
    default="cudagraph",
    show_default=True,
    help="How the engine runs its forward: vLLM's default captures CUDA graphs; eager is --enforce-eager.",
)
@click.option("--engine", "engine_name", type=click.Choice(["vllm", "sglang"]), default="vllm", show_default=True)
@click.option(
    "--lengths",
    default="512,1024,2048,4096",
    show_default=True,
    callback=_lengths,
    help="Prompt lengths (tokens) measured and fitted.",
)
@click.option(
    "--hold-out",
    default="",
    callback=_lengths,
    help="Prompt lengths measured and stored but never fitted: a check the profile cannot have learnt.",
)
@click.option("--reps", default=3, show_default=True, type=click.IntRange(1, 50), help="Rounds of every length.")
@click.option(
    "--filler-tokens",
    default=2048,
    show_default=True,
    type=click.IntRange(16),
    help="Tokens of each filler prompt that evicts the measured prompt from the GPU cache.",
)
@click.option(
    "--max-fillers",
    default=64,
    show_default=True,
    type=click.IntRange(1),
    help="Refuse an engine whose GPU cache takes more fillers than this to turn over.",
)
@click.option(
    "--gpu-tokens",
    type=click.IntRange(16),
    default=None,
    help="The engine's GPU KV cache in tokens (default: from its /metrics).",
)
@click.option("--served-model-name", default=None, help="The name the engine's API answers to (default: its first).")
@click.option("--engine-version", default=None, help="The engine's version (default: its /version).")
@click.option(
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    required=True,
    help="The engine profile to write. An existing one of the same class, engine and version gains this "
    "run (replacing an earlier run of the same model and mode), and every fit is worked out again.",
)
@click.option(
    "--raw",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Also write every request (fillers too) with its token split, as measured.",
)
@click.option("--seed", default=0, show_default=True, help="Seed of the random prompts.")
def engine_calibrate(
    engine_url: str,
    model: str,
    gpu_class: str,
    engine_mode: str,
    engine_name: str,
    lengths: tuple[int, ...],
    hold_out: tuple[int, ...],
    reps: int,
    filler_tokens: int,
    max_fillers: int,
    gpu_tokens: int | None,
    served_model_name: str | None,
    engine_version: str | None,
    out: Path,
    raw: Path | None,
    seed: int,
) -> None:
    """Measure a running engine's time to first token (cold, GPU hit, CPU restore) at several prompt lengths,
    through its own API and /metrics, and fit the engine profile `kvoffload plan` forecasts with.

    The engine must serve nothing else while it runs (each request is timed by the engine's own TTFT
    histogram), and have a CPU tier and a small GPU cache (vLLM: --kv-offloading-size 4
    --num-gpu-blocks-override 520) so that fillers evict a prompt from the GPU while the tier keeps it.
    """
    try:
        cost = model_cost(model)
        series = series_of(SGLANG if engine_name == "sglang" else dialect_for(engine_version))
        engine = discover(engine_url, series, served_model_name, gpu_tokens, engine_version)
        click.echo(
            f"engine {engine.url}: {engine_name} {engine.version}, serving {engine.model!r}, GPU cache "
            f"{engine.gpu_tokens:,} tokens; {Plan((), (), filler_tokens=filler_tokens).fillers(engine.gpu_tokens)}"
            f" fillers of {filler_tokens:,} tokens turn it over",
            err=True,
        )
        plan = Plan(lengths, hold_out, reps=reps, filler_tokens=filler_tokens, max_fillers=max_fillers, seed=seed)
        samples, record = measure(
            engine, series, plan, copy_pricer(gpu_class, cost), lambda line: click.echo(line, err=True)
        )
        run = Run(
            model=cost,
            mode=engine_mode,  # type: ignore[arg-type]
            samples=tuple(samples),
            engine_version=engine.version,
            date=time.strftime("%Y-%m-%d", time.gmtime()),
            command="kvoffload calibrate " + " ".join(sys.argv[2:]),
        )
        profile = EngineProfile(gpu_class, engine_name, engine.version, ())
        if out.exists():
            earlier = load_engine_profile(out)
            if (earlier.gpu_class, earlier.engine, earlier.engine_version) != (gpu_class, engine_name, engine.version):
                raise ProfileError(
                    f"{out} holds {earlier.name}, not {gpu_class} {engine_name} {engine.version}: write another file"
                )
            profile = earlier
        profile = profile.with_run(run)
    except ProfileError as exc:
        raise click.ClickException(str(exc)) from None
    out.write_text(profile.dumps())
    if raw is not None:
        raw.write_text(json.dumps({"engine": vars(engine), "run": run.to_json(), "requests": record}, indent=1) + "\n")
    fitted = profile.fits.get((run.mode, cost.name))
    click.echo(
        f"wrote {out}: {profile.name}, {len(profile.runs)} run(s); {cost.name} {engine_mode}: "
        + (", ".join(f"{k} {v}" for k, v in fitted.to_json().items()) if fitted else "held out, not fitted"),
        err=True,
    )
