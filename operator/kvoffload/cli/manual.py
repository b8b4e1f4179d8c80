"""``kvoffload promote|abort|retry|pause|resume NAME``: manual control of a policy through its annotations."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from kvoffload.cli.common import EXIT_FAIL
from kvoffload.cli.target import CONTEXT, KUBECONFIG, NAMESPACE, POLICY_NAME, me


def _control(
    verb: str,
    name: str,
    namespace: str | None,
    kubeconfig: Path | None,
    context: str | None,
    *,
    key: str | None = None,
    what: str | None = None,
) -> None:
    from kvoffload.cli import control

    try:
        api = control.connect(kubeconfig, context)
        ns = namespace or control.default_namespace(kubeconfig, context)
        with api:
            value, policy = control.request(api, ns, name, verb, key=key)
    except control.ControlError as exc:
        click.echo(f"{me()} {verb}: {exc}", err=True)
        sys.exit(EXIT_FAIL)
    phase = (policy.get("status") or {}).get("phase", "not yet acted on")
    click.echo(
        f"asked {ns}/{name} to {verb} ({key or control.VERBS[verb]}={value}): {what or control.WHAT_IT_DOES[verb]}.\n"
        f"The operator acts on it at its next cycle (phase now: {phase}); see `{me()} status {name} -n {ns}`."
    )


@click.command()
@POLICY_NAME
@NAMESPACE
@KUBECONFIG
@CONTEXT
def promote(name: str, namespace: str | None, kubeconfig: Path | None, context: str | None) -> None:
    """End the current baseline or step now and move on, without waiting for evidence."""
    _control("promote", name, namespace, kubeconfig, context)


@click.command()
@POLICY_NAME
@NAMESPACE
@KUBECONFIG
@CONTEXT
@click.option(
    "--release",
    is_flag=True,
    help="A policy with spec.workloadRef: give the team's Deployment back at its recorded count, wait until it is "
    "Ready, then remove the operator's own engines; the policy stays, Paused (Released), until the "
    "kvoffload.io/release annotation is removed (`kubectl annotate kvop NAME kvoffload.io/release-`), which "
    "takes the Deployment over again from GPU-only.",
)
def abort(name: str, namespace: str | None, kubeconfig: Path | None, context: str | None, release: bool) -> None:
    """Remove the canary and halt the ladder on the stable level (phase RolledBack); with --release, hand a
    taken-over Deployment back."""
    if release:
        from kvoffload.api.conventions import RELEASE

        what = "hand the Deployment back at its recorded count, then remove the operator's own engines"
        _control("abort", name, namespace, kubeconfig, context, key=RELEASE, what=what)
        return
    _control("abort", name, namespace, kubeconfig, context)


@click.command()
@POLICY_NAME
@NAMESPACE
@KUBECONFIG
@CONTEXT
def retry(name: str, namespace: str | None, kubeconfig: Path | None, context: str | None) -> None:
    """Start the ladder again from the stable level, after a rollback, a pause or a preflight hold (Held)."""
    _control("retry", name, namespace, kubeconfig, context)


@click.command()
@POLICY_NAME
@NAMESPACE
@KUBECONFIG
@CONTEXT
def pause(name: str, namespace: str | None, kubeconfig: Path | None, context: str | None) -> None:
    """Stop forward motion; rollbacks on hard failures or sustained breaches still apply."""
    _control("pause", name, namespace, kubeconfig, context)


@click.command()
@POLICY_NAME
@NAMESPACE
@KUBECONFIG
@CONTEXT
def resume(name: str, namespace: str | None, kubeconfig: Path | None, context: str | None) -> None:
    """Go on after a pause (a person's, or too many Inconclusive verdicts); the step clock restarts."""
    _control("resume", name, namespace, kubeconfig, context)
