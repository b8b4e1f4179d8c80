"""What every kvoffload command shares: exit codes, the policy-file argument, -o, and bad-input reporting."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from kvoffload.api.errors import PolicyError

F = TypeVar("F", bound=Callable[..., Any])

# Exit codes: 0 ok / pass, 1 fail verdict, 2 bad input, 3 inconclusive.
EXIT_FAIL = 1
EXIT_BAD_INPUT = 2
EXIT_INCONCLUSIVE = 3


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
