"""The policy a command acts on in the cluster (NAME, -n, --kubeconfig, --context), and how the program was
called, for its messages."""

from __future__ import annotations

from pathlib import Path

import click

POLICY_NAME = click.argument("name")
NAMESPACE = click.option(
    "-n", "--namespace", default=None, help="The policy's namespace. Default: the kubeconfig context's, else default."
)
KUBECONFIG = click.option(
    "--kubeconfig",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    envvar="KUBECONFIG",
    help="Kubeconfig file. Default: $KUBECONFIG, in-cluster, ~/.kube/config.",
)
CONTEXT = click.option("--context", default=None, help="The kubeconfig context to use. Default: its current context.")


def me() -> str:
    """How this program was called: ``kvoffload``, or ``kubectl kvoffload`` as a kubectl plugin."""
    called = click.get_current_context().find_root().info_name
    return called if called and not called.startswith("-") else "kvoffload"  # `python -c` names itself -c
