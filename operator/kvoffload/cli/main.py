"""The ``kvoffload`` command: the operator, and the tools around it."""

from __future__ import annotations

import importlib
import sys
from typing import Any

import click

from kvoffload import __version__
from kvoffload.cli.analyze import analyze
from kvoffload.cli.common import EXIT_BAD_INPUT
from kvoffload.cli.inspect import get, list_policies, status
from kvoffload.cli.manual import abort, pause, promote, resume, retry
from kvoffload.cli.render import crd, plan, render
from kvoffload.cli.run import run
from kvoffload.cli.simulate import simulate

LAB_COMMANDS = ("cluster", "demo", "emulate")
"""Commands that live in the lab (``kvoffload.lab.commands``), loaded only when asked for."""


class _Commands(click.Group):
    """The operator's commands, plus the lab's, which are imported only when used or listed."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted([*super().list_commands(ctx), *LAB_COMMANDS])

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in LAB_COMMANDS:
            return super().get_command(ctx, cmd_name)
        try:
            lab = importlib.import_module("kvoffload.lab.commands")
        except ModuleNotFoundError as exc:  # the operator image ships without the lab
            return _needs_the_lab(cmd_name, [exc.name or "kvoffload.lab"])
        missing: list[str] = lab.missing_modules(cmd_name)
        if missing:
            return _needs_the_lab(cmd_name, missing)
        command: click.Command = getattr(lab, cmd_name)
        return command


def _needs_the_lab(name: str, missing: list[str]) -> click.Command:
    """A stand-in for a lab command that cannot run here: it says what to install and exits 2."""
    message = f"kvoffload {name} needs the lab: pip install 'kvoffload[lab]' (missing: {', '.join(missing)})"

    def refuse(**_: Any) -> None:
        click.echo(message, err=True)
        sys.exit(EXIT_BAD_INPUT)

    return click.Command(
        name,
        callback=refuse,
        context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
        params=[click.Argument(["args"], nargs=-1, type=click.UNPROCESSED)],
        help=message,
        short_help="needs the lab: pip install 'kvoffload[lab]'",
    )


@click.group(cls=_Commands, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="kvoffload")
def main() -> None:
    """Roll out vLLM KV-cache offloading (GPU -> pinned CPU -> filesystem tiers) one measured stage
    at a time, and take the newest tier away again when p99 TTFT or ITL breaks its budget.

    Start with `kvoffload demo` to watch the whole loop on this machine, or
    `kvoffload plan FILE` to size a policy.
    """


@main.command(
    context_settings={"ignore_unknown_options": True, "allow_extra_args": True, "help_option_names": []},
    short_help="Measure a GPU's offload costs into a profile (needs a GPU and PyTorch).",
)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def calibrate(args: tuple[str, ...]) -> None:
    """Measure this GPU's pinned transfers, pinning rate, prefill and decode into a cost profile.

    Runs `python -m kvoffload.economics.calibrate ARGS` (see `kvoffload calibrate --help`). With
    --engine-url, measures a running engine's time to first token instead (`kvoffload calibrate
    --engine-url URL --help`).
    """
    if any(a == "--engine-url" or a.startswith("--engine-url=") for a in args):
        from kvoffload.cli.calibrate import engine_calibrate

        engine_calibrate.main(list(args), prog_name="kvoffload calibrate")
        return
    from kvoffload.economics import calibrate as calibration

    sys.exit(calibration.main(list(args)))


main.add_command(plan)
main.add_command(render)
main.add_command(crd)
main.add_command(analyze)
main.add_command(promote)
main.add_command(abort)
main.add_command(retry)
main.add_command(pause)
main.add_command(resume)
main.add_command(status)
main.add_command(get)
main.add_command(list_policies)
main.add_command(run)
main.add_command(simulate)


def kubectl_plugin() -> None:
    """The ``kubectl-kvoffload`` entry point: the same commands, called as ``kubectl kvoffload ...``.

    kubectl runs the first ``kubectl-kvoffload`` on $PATH with every argument after ``kubectl kvoffload``
    (-n, --kubeconfig and --context included, which the commands take themselves).
    """
    main(prog_name="kubectl kvoffload")
