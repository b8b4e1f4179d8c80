"""The lab's commands, ``kvoffload emulate`` and ``kvoffload demo``, which the CLI loads only when asked.

The operator image ships without the lab; ``kvoffload.cli.main`` then answers these
commands with what to install instead.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import click

from kvoffload.cli.common import EXIT_BAD_INPUT, EXIT_FAIL, OUTPUT, reports_bad_input
from kvoffload.lab.engine.flags import engine_options

REQUIRES: dict[str, tuple[str, ...]] = {
    "emulate": (),
    "demo": ("kmock", "matplotlib", "jsonpatch", "attrs"),
}
"""Modules of the ``lab`` extra each command needs, beyond the operator's own."""


def missing_modules(command: str) -> list[str]:
    """The modules ``command`` needs that are not installed: checked before it starts anything."""
    return [name for name in REQUIRES.get(command, ()) if importlib.util.find_spec(name) is None]


@click.command(
    "emulate",
    context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
    short_help="An engine that speaks vLLM's /metrics and /v1/completions, for demos and tests.",
)
@engine_options
def emulate(args: tuple[str, ...], port: int, host: str, **options: Any) -> None:
    """Run an emulated vLLM engine: block-level GPU/CPU/disk caches priced by a cost model,
    vLLM 0.32's exact /metrics families, and fault knobs (also `POST /emulator/faults`).

    Accepts a Deployment's `vllm serve MODEL --flag ...` arguments; flags it does not know
    are ignored with a warning.
    """
    import logging
    import time

    from kvoffload.lab.engine import flags
    from kvoffload.lab.engine.config import ConfigError
    from kvoffload.lab.engine.server import Emulator, run

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        config, faults, ignored = flags.build({"args": args, **options}, time.monotonic())
    except ConfigError as exc:
        click.echo(str(exc), err=True)
        sys.exit(EXIT_BAD_INPUT)
    if ignored:
        click.echo(f"warning: ignoring arguments the emulator does not model: {' '.join(ignored)}", err=True)
    logging.getLogger("kvoffload.emulate").info(
        "priced by %s; GPU KV cache %d blocks of %d tokens", config.cost.name, config.gpu_kv_blocks, config.block_size
    )
    run(Emulator(config, faults), host, port)


@click.command("demo")
@click.option(
    "--scenario",
    type=click.Choice(["promote", "regression"]),
    default="promote",
    show_default=True,
    help="promote: climb to the top and stay. regression: the newest tier's canary slows down ×4 and is rolled back.",
)
@click.option("--fast", is_flag=True, help="Shrink every duration: each scenario ends in about 2-3 minutes.")
@OUTPUT
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("demo-out"),
    show_default=True,
    help="Where the report goes (timeline.png, summary.md, report.html, operator.log).",
)
@click.option(
    "--policy",
    "policy_path",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="A KVOffloadPolicy to roll out instead of the embedded demo policy (examples/demo-two-tier.yaml).",
)
@reports_bad_input
def demo(scenario: str, fast: bool, output: str, out_dir: Path, policy_path: Path | None) -> None:
    """The whole loop on this machine, no cluster needed: an emulated Kubernetes API, a real Prometheus,
    emulated vLLM engines, the operator, and a replay of the Mooncake conversation trace.

    Shows the rollout live, writes a report (PNG plot and summary) into --out, and exits 0 when the
    scenario ended as expected, 1 otherwise. With -o json only the final status and timeline go to
    stdout (the progress view goes to stderr).
    """
    import asyncio
    import json

    from kvoffload.lab import demo as demo_mod

    stream = sys.stderr if output == "json" else sys.stdout
    progress = demo_mod.Progress(stream)
    try:
        result = asyncio.run(
            demo_mod.run_until_signalled(
                demo_mod.SCENARIOS[scenario], fast=fast, out_dir=out_dir, policy_path=policy_path, progress=progress
            )
        )
    except demo_mod.DemoError as exc:
        click.echo(f"kvoffload demo: {exc}", err=True)
        sys.exit(EXIT_FAIL)
    except (KeyboardInterrupt, asyncio.CancelledError):
        progress.close()
        click.echo("kvoffload demo: interrupted; every process it started has been stopped", err=True)
        sys.exit(130)
    if output == "json":
        click.echo(json.dumps(result.to_json(), indent=2))
    else:
        click.echo(demo_mod.final_summary(result))
    sys.exit(0 if result.ok else EXIT_FAIL)
