"""The options that say how to reach a Prometheus behind a tenant gateway (Mimir, Cortex, a Thanos receive), TLS
or basic auth: one decorator, so ``kvoffload run`` and ``kvoffload analyze`` take the same ones."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from kvoffload.analysis.promhttp import Connection, header_problem
from kvoffload.cli.common import EXIT_BAD_INPUT

F = TypeVar("F", bound=Callable[..., Any])


def _headers(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    headers: list[tuple[str, str]] = []
    for item in values:
        name, sep, value = item.partition("=")
        problem = header_problem(name.strip(), value.strip()) if sep else "give NAME=VALUE"
        if problem:
            raise click.BadParameter(f"{item!r}: {problem}", ctx, param)
        headers.append((name.strip(), value.strip()))
    return tuple(headers)


def prometheus_connection(*, legacy_names: bool = False) -> Callable[[F], F]:
    """Add the connection options and hand the command a ``connection`` (a :class:`Connection`).

    ``legacy_names``: also accept ``analyze``'s older ``--ca-bundle`` and ``--insecure-skip-tls-verify``.
    """

    def decorate(func: F) -> F:
        @functools.wraps(func)
        def wrapper(
            *args: Any,
            prometheus_headers: tuple[tuple[str, str], ...],
            prometheus_ca_file: Path | None,
            prometheus_username: str | None,
            prometheus_password_file: Path | None,
            prometheus_insecure_skip_verify: bool,
            **kwargs: Any,
        ) -> Any:
            connection = Connection(
                headers=prometheus_headers,
                username=prometheus_username or None,
                password_file=prometheus_password_file,
                ca_file=prometheus_ca_file,
                insecure_skip_verify=prometheus_insecure_skip_verify,
            )
            if problems := connection.problems():
                for problem in problems:
                    click.echo(f"Prometheus connection: {problem}", err=True)
                sys.exit(EXIT_BAD_INPUT)
            if connection.insecure_skip_verify:
                click.echo(
                    "WARNING: Prometheus's TLS certificate will not be verified (--prometheus-insecure-skip-verify): "
                    "whoever can intercept the connection reads the credentials and forges the evidence",
                    err=True,
                )
            return func(*args, connection=connection, **kwargs)

        ca_names = ("--prometheus-ca-file", "--ca-bundle") if legacy_names else ("--prometheus-ca-file",)
        skip_names = (
            ("--prometheus-insecure-skip-verify", "--insecure-skip-tls-verify")
            if legacy_names
            else ("--prometheus-insecure-skip-verify",)
        )
        file_type = click.Path(dir_okay=False, path_type=Path)
        options = (
            click.option(
                "--prometheus-header",
                "prometheus_headers",
                multiple=True,
                metavar="NAME=VALUE",
                callback=_headers,
                help="An HTTP header for every query (repeat for more), e.g. X-Scope-OrgID=team-a for Mimir, Cortex "
                "or a Thanos receive. Not Authorization: use a token or basic auth from a Secret.",
            ),
            click.option(
                *ca_names,
                "prometheus_ca_file",
                type=file_type,
                default=None,
                help="A PEM bundle of the CAs that sign Prometheus's certificate (instead of the system's).",
            ),
            click.option(
                "--prometheus-username",
                default=None,
                envvar="KVOFFLOAD_PROMETHEUS_USERNAME",
                help="Basic auth user, with --prometheus-password-file. [env: KVOFFLOAD_PROMETHEUS_USERNAME]",
            ),
            click.option(
                "--prometheus-password-file",
                type=file_type,
                default=None,
                help="A file holding the basic auth password (a mounted Secret key; read again for every batch). "
                "Never sent beside a bearer token.",
            ),
            click.option(
                *skip_names,
                "prometheus_insecure_skip_verify",
                is_flag=True,
                help="Do not verify Prometheus's TLS certificate. Anyone on the path can then read the credentials "
                "and forge the evidence: for a lab only.",
            ),
        )
        for option in reversed(options):
            wrapper = option(wrapper)
        return wrapper  # type: ignore[return-value]

    return decorate
