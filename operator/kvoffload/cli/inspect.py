"""``kvoffload status``, ``get`` and ``list``: a person's views of policies in the cluster, once or watched."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import click

from kvoffload.cli.common import (
    EXIT_BAD_INPUT,
    EXIT_FAIL,
    EXIT_INCONCLUSIVE,
    OUTPUT,
    STRUCTURED,
    Duration,
    dump,
    resource_name,
)
from kvoffload.cli.target import CONTEXT, KUBECONFIG, NAMESPACE, POLICY_NAME, me

if TYPE_CHECKING:
    from pydantic import ValidationError


def _unreadable(exc: ValidationError, where: str) -> NoReturn:
    from kvoffload.api.errors import errors_from

    problems = "; ".join(f"{e.path}: {e.message}" for e in errors_from(exc, ("status",)))
    click.echo(f"{me()} status: {where} has a status this version cannot read: {problems}", err=True)
    sys.exit(EXIT_FAIL)


@click.command()
@POLICY_NAME
@NAMESPACE
@KUBECONFIG
@CONTEXT
@OUTPUT
@click.option(
    "-w",
    "--watch",
    is_flag=True,
    help="Follow the policy until it comes to rest: one line per change of phase, level, step or reason; "
    "the exit status says how it ended (below).",
)
@click.option(
    "--timeout",
    type=Duration(),
    default=None,
    metavar="DURATION",
    help="With --watch: give up after this long (90s, 10m, 1h30m) and exit 3. Default, or 0: wait as long as it takes.",
)
def status(
    name: str,
    namespace: str | None,
    kubeconfig: Path | None,
    context: str | None,
    output: str,
    watch: bool,
    timeout: float | None,
) -> None:
    """A person's view of one policy: phase, ladder position, variants, baseline, last analysis, history.

    With --watch, for a pipeline: print one line each time the phase, the level, the step or the
    reason changes (with -o json, one JSON object per line), and end when the policy comes to rest:

    \b
      0  Stable: the top level of the ladder runs on every replica. An
         observe-only policy (spec.rollout.observeOnly) also ends Stable
         with 0, though nothing was applied: its lines and last line say
         "observe-only: nothing was applied" (-o json: "observeOnly": true).
      1  RolledBack (a rollback or an abort halted the ladder), Invalid (the
         spec fails validation) or Held (the preflight found that offload
         cannot pay): the climb is Stalled until a person acts. Also: the
         policy cannot be read, or was deleted.
      2  Bad input (an unknown option, a malformed --timeout).
      3  Paused (by a person, or after too many Inconclusive analyses in a
         row), or --timeout passed first.

    A status the operator wrote for an older spec (status.observedGeneration behind
    metadata.generation) ends no watch: after `kubectl apply`, the watch waits until the operator has
    acted on the new spec. The watch uses the Kubernetes watch API and reconnects when a stream ends or
    breaks. Without --watch the status is printed once, and the exit status is 0 when it could be read,
    1 otherwise.
    """
    from pydantic import ValidationError

    from kvoffload.cli import control, statusview

    if timeout is not None and not watch:
        click.echo(f"{me()} status: --timeout needs --watch", err=True)
        sys.exit(EXIT_BAD_INPUT)
    try:
        api = control.connect(kubeconfig, context)
        ns = namespace or control.default_namespace(kubeconfig, context)
        with api:
            if watch:
                sys.exit(_watch(api, ns, name, output, timeout))
            policy = control.read_policy(api, ns, name)
    except control.ControlError as exc:
        click.echo(f"{me()} status: {exc}", err=True)
        sys.exit(EXIT_FAIL)
    try:
        if output in STRUCTURED:
            text = dump(statusview.to_json(policy), output)
        elif output == "name":
            text = resource_name(name)
        else:  # table; wide has nothing more to show: the view is whole
            text = statusview.render(policy)
    except ValidationError as exc:
        _unreadable(exc, f"{ns}/{name}")
    click.echo(text)


def _watch(api: Any, namespace: str, name: str, output: str, timeout: float | None) -> int:
    """Follow one policy until it comes to rest; print a line per change; return the exit code."""
    import time
    from datetime import UTC, datetime

    from pydantic import ValidationError

    from kvoffload.api.quantity import format_duration
    from kvoffload.cli import control, watch

    deadline = time.monotonic() + timeout if timeout else None
    last: tuple[Any, ...] | None = None
    state = None
    for obj in control.PolicyWatch(api, namespace, name, deadline=deadline):
        try:
            state = watch.progress(obj)
        except ValidationError as exc:
            _unreadable(exc, f"{namespace}/{name}")
        if state.key() != last:
            click.echo(watch.change(state, output, datetime.now(UTC)))
            last = state.key()
        if (code := watch.outcome(state)) is not None:
            click.echo(watch.final_line(state, code, me()), err=True)
            return code
    where = f" (still {state.phase})" if state is not None else ""
    waited = format_duration(timeout or 0)
    click.echo(
        f"{me()} status: timed out after {waited} waiting for {namespace}/{name} to come to rest{where} "
        f"(exit {EXIT_INCONCLUSIVE})",
        err=True,
    )
    return EXIT_INCONCLUSIVE


@click.command("get")
@POLICY_NAME
@NAMESPACE
@KUBECONFIG
@CONTEXT
@OUTPUT
@click.option(
    "-w",
    "--watch",
    is_flag=True,
    help="Read the tree again every --interval and print it again when something in it changed, until Ctrl-C "
    "or --timeout.",
)
@click.option(
    "--interval",
    type=Duration(),
    default="2s",
    show_default=True,
    metavar="DURATION",
    help="With --watch: how often to read.",
)
@click.option(
    "--timeout",
    type=Duration(),
    default=None,
    metavar="DURATION",
    help="With --watch: stop after this long (exit 0). Default: until Ctrl-C.",
)
def get(
    name: str,
    namespace: str | None,
    kubeconfig: Path | None,
    context: str | None,
    output: str,
    watch: bool,
    interval: float,
    timeout: float | None,
) -> None:
    """A policy and what runs for it, as a tree (as `kubectl argo rollouts get rollout` shows one): the policy's
    phase, level, Ready and reason and last verdict; its Deployments with their role (stable, canary, retiring,
    taken-over), level and replicas ready of desired; their ReplicaSets; and their pods with readiness, restarts
    and age. -o wide adds each pod's node and IP and each object's config hash.

    Exit status 0 when the policy could be read, 1 otherwise.
    """
    import time
    from datetime import UTC, datetime

    from kvoffload.cli import control, tree

    if timeout is not None and not watch:
        click.echo(f"{me()} get: --timeout needs --watch", err=True)
        sys.exit(EXIT_BAD_INPUT)

    def shown(found: tree.Tree, now: datetime) -> str:
        if output in STRUCTURED:
            return dump(tree.document(found, now), output)
        if output == "name":
            return resource_name(name)
        return "\n".join(tree.render(found, now, wide=output == "wide"))

    deadline = None if timeout is None else time.monotonic() + timeout
    last = None
    try:
        api = control.connect(kubeconfig, context)
        ns = namespace or control.default_namespace(kubeconfig, context)
        with api:
            while True:
                found = tree.read(api, ns, name)
                # The same objects print the same at a fixed instant: ages alone do not make a new tree.
                key = shown(found, datetime.fromtimestamp(0, UTC))
                if key != last:
                    click.echo(("---\n" if watch and output == "yaml" else "") + shown(found, datetime.now(UTC)))
                    if watch and output in ("table", "wide"):
                        click.echo()
                    last = key
                if not watch or (deadline is not None and time.monotonic() + interval > deadline):
                    return
                time.sleep(interval)
    except control.ControlError as exc:
        click.echo(f"{me()} get: {exc}", err=True)
        sys.exit(EXIT_FAIL)
    except KeyboardInterrupt:
        return


@click.command("list")
@click.option(
    "-n", "--namespace", default=None, help="List this namespace. Default: the kubeconfig context's, else default."
)
@click.option(
    "-A", "--all-namespaces", is_flag=True, help="List every namespace (the namespace given with -n is ignored)."
)
@click.option(
    "-l", "--selector", default=None, metavar="SELECTOR", help="Only policies with these labels, e.g. team=llm."
)
@KUBECONFIG
@CONTEXT
@OUTPUT
def list_policies(
    namespace: str | None,
    all_namespaces: bool,
    selector: str | None,
    kubeconfig: Path | None,
    context: str | None,
    output: str,
) -> None:
    """List the policies of a namespace, or of all (-A): phase, ladder level, step, tiers and age; -o wide adds
    Ready, its reason, the generation acted on, and the status message.

    Exit status 0 when the list could be read (even empty), 1 otherwise.
    """
    from datetime import UTC, datetime

    from kvoffload.cli import control, statusview

    try:
        api = control.connect(kubeconfig, context)
        ns = None if all_namespaces else namespace or control.default_namespace(kubeconfig, context)
        with api:
            policies = control.list_policies(api, ns, selector)
    except control.ControlError as exc:
        click.echo(f"{me()} list: {exc}", err=True)
        sys.exit(EXIT_FAIL)
    now = datetime.now(UTC)
    if output in STRUCTURED:
        click.echo(dump([statusview.list_entry(p, now) for p in policies], output))
    elif not policies:
        click.echo(f"No KVOffloadPolicies found{'' if ns is None else f' in {ns} namespace'}.", err=True)
    elif output == "name":
        click.echo("\n".join(resource_name(p["metadata"]["name"]) for p in policies))
    else:
        table = statusview.list_table(policies, now, namespaces=ns is None, wide=output == "wide")
        click.echo("\n".join(table))
