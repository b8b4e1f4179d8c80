"""The ``kvoffload`` command: the operator, and the tools around it."""

from __future__ import annotations

import importlib.util
import sys
from importlib.metadata import EntryPoint, entry_points
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

COMMAND_GROUP = "kvoffload.commands"
"""The entry-point group through which another distribution (the lab, ``kvoffload-lab``) adds subcommands."""

LAB_COMMANDS = ("calibrate", "cluster", "demo", "emulate")
"""The commands the lab adds: listed even where it is not installed, to say what to install."""

INSTALL_THE_LAB = "pip install kvoffload-lab (from a clone: pip install -e ./lab)"


class _Commands(click.Group):
    """The operator's commands, plus those other distributions register in :data:`COMMAND_GROUP`, each
    imported only when used or listed."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *LAB_COMMANDS, *_registered()})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        own = super().get_command(ctx, cmd_name)
        if own is not None:
            return own
        registered = _registered().get(cmd_name)
        if registered is None:
            return _needs_the_lab(cmd_name, []) if cmd_name in LAB_COMMANDS else None
        try:
            command = registered.load()
        except ModuleNotFoundError as exc:  # registered, but what it imports is not installed
            return _needs_the_lab(cmd_name, [exc.name or registered.module])
        if not isinstance(command, click.Command):
            raise click.ClickException(f"{registered.value} (entry point {cmd_name!r}) is not a click command")
        # A registered command may name the modules it needs beyond the operator's: checked before it starts.
        requires: tuple[str, ...] = tuple(getattr(command, "requires", ()))
        missing = [name for name in requires if importlib.util.find_spec(name) is None]
        if missing:
            return _needs_the_lab(cmd_name, missing)
        return command


def _registered() -> dict[str, EntryPoint]:
    """The subcommands installed distributions register, by name."""
    return {point.name: point for point in entry_points(group=COMMAND_GROUP)}


def _needs_the_lab(name: str, missing: list[str]) -> click.Command:
    """A stand-in for a lab command that cannot run here: it says what to install and exits 2."""
    lacking = f" (missing: {', '.join(missing)})" if missing else ""
    message = f"kvoffload {name} needs the lab: {INSTALL_THE_LAB}{lacking}"

    def refuse(**_: Any) -> None:
        click.echo(message, err=True)
        sys.exit(EXIT_BAD_INPUT)

    return click.Command(
        name,
        callback=refuse,
        context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
        params=[click.Argument(["args"], nargs=-1, type=click.UNPROCESSED)],
        help=message,
        short_help="needs the lab: pip install kvoffload-lab",
    )


@click.group(cls=_Commands, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="kvoffload")
def main() -> None:
    """Roll out vLLM KV-cache offloading (GPU -> pinned CPU -> filesystem tiers) one measured stage
    at a time, and take the newest tier away again when p99 TTFT or ITL breaks its budget.

    Start with `kvoffload demo` to watch the whole loop on this machine, or
    `kvoffload plan FILE` to size a policy.
    """


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
