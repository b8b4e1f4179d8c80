"""The ``kvoffload`` command: the operator, and the tools around it."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from kvoffload import __version__
from kvoffload.validation import PolicyError

F = TypeVar("F", bound=Callable[..., Any])

# Exit codes: 0 ok / pass, 1 fail verdict, 2 bad input, 3 inconclusive.
EXIT_BAD_INPUT = 2


def reports_bad_input(func: F) -> F:
    """Print a PolicyError as a list of field paths and exit 2, never a traceback."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except PolicyError as exc:
            click.echo(exc.render(), err=True)
            sys.exit(EXIT_BAD_INPUT)

    return wrapper  # type: ignore[return-value]


POLICY_FILE = click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
OUTPUT = click.option("-o", "--output", type=click.Choice(["table", "json"]), default="table", show_default=True)


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="kvoffload")
def main() -> None:
    """Roll out vLLM KV-cache offloading (GPU -> pinned CPU -> filesystem tiers) one measured stage
    at a time, and take the newest tier away again when p99 TTFT or ITL breaks its budget.

    Start with `kvoffload demo` to watch the whole loop on this machine, or
    `kvoffload plan FILE` to size a policy.
    """


@main.command()
@POLICY_FILE
@OUTPUT
@reports_bad_input
def plan(file: Path, output: str) -> None:
    """Size a policy: KV bytes per token, tokens per tier, pinned pool, /dev/shm, host memory, warnings."""
    raise click.ClickException("plan: not implemented yet")


@main.command()
@POLICY_FILE
@click.option("--level", type=int, default=None, help="Ladder level index (0 = GPU-only). Default: the top level.")
@click.option("--stage", default=None, help="Ladder level name, e.g. gpu-only, cpu-pilot, cpu, nvme.")
@reports_bad_input
def render(file: Path, level: int | None, stage: str | None) -> None:
    """Print the manifests (Deployment, Service, PodMonitor) of one ladder level, for GitOps."""
    raise click.ClickException("render: not implemented yet")


@main.command()
def crd() -> None:
    """Print the KVOffloadPolicy CustomResourceDefinition generated from the models."""
    raise click.ClickException("crd: not implemented yet")
