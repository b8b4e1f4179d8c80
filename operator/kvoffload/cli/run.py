"""``kvoffload run``: the operator itself (kopf inside), with its settings from the command line."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from kvoffload.cli.common import EXIT_BAD_INPUT, EXIT_FAIL, MONITOR_LABELS, judged_as_the_cluster
from kvoffload.cli.connection import prometheus_connection
from kvoffload.cli.logs import LOG_FORMATS
from kvoffload.policy.tenancy import Tenancy

if TYPE_CHECKING:
    from kvoffload.analysis.promhttp import Connection


@click.command(short_help="Run the operator (kopf inside).")
@click.option(
    "-n",
    "--namespace",
    "namespaces",
    multiple=True,
    metavar="NS",
    help="Watch policies in this namespace (repeat for more; globs such as 'llm-*' work).",
)
@click.option("-A", "--all-namespaces", is_flag=True, help="Watch policies in every namespace.")
@click.option(
    "--standalone",
    is_flag=True,
    help="Do not coordinate with other operator instances through kopf peering (one replica, or tests).",
)
@click.option(
    "--leader-elect",
    is_flag=True,
    help="Run as one of several replicas: reconcile only while holding the leader Lease, stand by (serving the "
    "webhook) otherwise. A SIGKILLed leader is replaced within --lease-duration + 2 s.",
)
@click.option(
    "--lease",
    default=None,
    metavar="NAMESPACE/NAME",
    help="The coordination.k8s.io Lease to elect over. [default: kvoffload-leader in $POD_NAMESPACE, else the "
    "service account's namespace, else default]",
)
@click.option(
    "--lease-duration",
    type=click.IntRange(3, 300),
    default=8,
    show_default=True,
    metavar="SECONDS",
    help="How long an unrenewed Lease keeps the others waiting. The leader renews every second and gives up "
    "after 60% of this without a renewal.",
)
@click.option(
    "--metrics-port",
    type=click.IntRange(0, 65535),
    default=8080,
    show_default=True,
    help="Serve the operator's own Prometheus metrics at :PORT/metrics, and its probes at /healthz (liveness) "
    "and /readyz (readiness); 0 disables.",
)
@click.option(
    "--policy-label",
    default="kvoffload_io_policy",
    show_default=True,
    help="The series label that names the policy (the PodMonitor's sanitised kvoffload.io/policy).",
)
@click.option(
    "--level-label",
    default="kvoffload_io_level",
    show_default=True,
    help="The series label that names the ladder level (the PodMonitor's sanitised kvoffload.io/level).",
)
@click.option(
    "--config-hash-label",
    default="kvoffload_io_config_hash",
    show_default=True,
    help="The series label with the engine's config hash (sanitised kvoffload.io/config-hash); with the level it "
    "tells stable and canary apart.",
)
@click.option(
    "--prometheus-url",
    default=None,
    envvar="KVOFFLOAD_PROMETHEUS_URL",
    help="Query this Prometheus for every policy instead of each spec.prometheus.url.",
)
@click.option(
    "--prometheus-token-secret",
    default=None,
    metavar="NAMESPACE/NAME",
    help="A Secret (in the operator's own namespace, say) holding the Prometheus bearer token, used for every "
    "policy that names no spec.prometheus.bearerTokenSecret.",
)
@click.option(
    "--prometheus-token-key",
    default="token",
    show_default=True,
    help="The key of --prometheus-token-secret that holds the token.",
)
@click.option(
    "--webhook-port",
    type=click.IntRange(0, 65535),
    default=0,
    show_default=True,
    help="Serve the validating admission webhook over HTTPS on this port (needs --webhook-cert and "
    "--webhook-key); 0: no webhook.",
)
@click.option("--webhook-address", default="0.0.0.0", show_default=True, help="Where the webhook listens.")
@click.option(
    "--webhook-cert",
    type=click.Path(dir_okay=False),
    default=None,
    help="The webhook's TLS certificate (PEM); re-read when it changes.",
)
@click.option("--webhook-key", type=click.Path(dir_okay=False), default=None, help="Its private key (PEM).")
@click.option(
    "--notifications-config",
    type=click.Path(dir_okay=False),
    default=None,
    help="The notification sinks policies may name in spec.notifications.sinks (YAML: sinks with a name, a url "
    "or urlFile, a format json|slack; docs/notifications.md). None given: no policy may ask for notifications.",
)
@MONITOR_LABELS
@prometheus_connection()
@click.option("-v", "--verbose", is_flag=True, help="Log at DEBUG level (kopf's and the operator's).")
@click.option(
    "--log-format",
    type=click.Choice(LOG_FORMATS),
    default="text",
    show_default=True,
    help="text: kopf's lines. json: one object per line (time, level, logger, message; object for a policy's "
    "records; exc_info with a traceback), for kopf's loggers and the operator's alike.",
)
@judged_as_the_cluster
def run(
    namespaces: tuple[str, ...],
    all_namespaces: bool,
    standalone: bool,
    leader_elect: bool,
    lease: str | None,
    lease_duration: int,
    metrics_port: int,
    policy_label: str,
    level_label: str,
    config_hash_label: str,
    prometheus_url: str | None,
    prometheus_token_secret: str | None,
    prometheus_token_key: str,
    webhook_port: int,
    webhook_address: str,
    webhook_cert: str | None,
    webhook_key: str | None,
    notifications_config: str | None,
    monitor_labels: dict[str, str],
    connection: Connection,
    verbose: bool,
    log_format: str,
    tenancy: Tenancy,
) -> None:
    """Run the operator: watch KVOffloadPolicies and roll each one up its ladder, stage by measured stage.

    Talks to the cluster through the in-cluster service account, else $KUBECONFIG (or
    ~/.kube/config). Give -n NS (repeatable) or -A. Stops cleanly on SIGINT or SIGTERM.

    A policy gets no more than the --allowed-* options grant (docs/security.md): no hostPath tier unless
    under --allowed-host-path, only --allowed-image images when any is given, and the operator's
    Prometheus token, headers, basic auth and TLS settings only for --prometheus-url or a --prometheus-allowed-url.
    """
    import asyncio
    from dataclasses import replace

    from kvoffload.cli.logs import configure_logging
    from kvoffload.controller.handlers import WebhookSettings, run_operator
    from kvoffload.controller.leadership import LEASE_NAME, LeaseSettings, own_namespace, quiet_library_logs
    from kvoffload.controller.settings import ControllerSettings, SecretLocation
    from kvoffload.notify.config import ConfigError, load_config
    from kvoffload.policy.tenancy import SinkGrant

    notifications = None
    if notifications_config is not None:
        try:
            notifications = load_config(Path(notifications_config))
        except ConfigError as exc:
            click.echo(f"kvoffload run: --notifications-config {exc}", err=True)
            sys.exit(EXIT_BAD_INPUT)
    # The sinks the operator has, each for the namespaces the admin granted it, are the only ones a policy may
    # name (none without a configuration).
    sinks = notifications.sinks if notifications is not None else []
    tenancy = replace(tenancy, notification_sinks=tuple(SinkGrant(s.name, tuple(s.namespaces)) for s in sinks))
    token = None
    if prometheus_token_secret is not None:
        secret_namespace, _, secret_name = prometheus_token_secret.partition("/")
        if not (secret_namespace and secret_name) or "/" in secret_name or not prometheus_token_key:
            click.echo("--prometheus-token-secret must be NAMESPACE/NAME, with a --prometheus-token-key", err=True)
            sys.exit(EXIT_BAD_INPUT)
        token = SecretLocation(secret_namespace, secret_name, prometheus_token_key)
    if bool(namespaces) == all_namespaces:
        click.echo("give -n NAMESPACE (one or more) or -A, not both and not neither", err=True)
        sys.exit(EXIT_BAD_INPUT)
    webhook = None
    if webhook_port:
        if not (webhook_cert and webhook_key):
            click.echo("--webhook-port needs --webhook-cert and --webhook-key", err=True)
            sys.exit(EXIT_BAD_INPUT)
        webhook = WebhookSettings(webhook_port, webhook_cert, webhook_key, webhook_address)
    election = None
    if lease is not None and not leader_elect:
        click.echo("--lease needs --leader-elect", err=True)
        sys.exit(EXIT_BAD_INPUT)
    if leader_elect:
        lease_namespace, _, lease_name = (lease or f"{own_namespace()}/{LEASE_NAME}").partition("/")
        if not (lease_namespace and lease_name) or "/" in lease_name:
            click.echo(f"--lease must be NAMESPACE/NAME, not {lease!r}", err=True)
            sys.exit(EXIT_BAD_INPUT)
        election = LeaseSettings.for_duration(lease_namespace, lease_duration, lease_name)
        quiet_library_logs()
    import kubernetes.config

    settings = ControllerSettings(
        prometheus_url=prometheus_url,
        prometheus_token=token,
        tenancy=tenancy,
        monitor_labels=monitor_labels,
        prometheus_connection=connection,
    )
    if connection.configured and prometheus_url is None and not tenancy.prometheus_url_prefixes:
        # They are the admin's Prometheus's: with neither, any policy could have them sent anywhere.
        click.echo(
            "kvoffload run: --prometheus-header, basic auth and TLS settings need --prometheus-url or at least one "
            "--prometheus-allowed-url: they are sent nowhere else",
            err=True,
        )
        sys.exit(EXIT_BAD_INPUT)
    if problems := settings.judged_tenancy.problems():
        for problem in problems:
            click.echo(f"kvoffload run: {problem}", err=True)
        sys.exit(EXIT_BAD_INPUT)
    configure_logging(log_format, verbose=verbose)
    try:
        asyncio.run(
            run_operator(
                namespaces=namespaces,
                clusterwide=all_namespaces,
                standalone=standalone,
                metrics_port=metrics_port,
                controller_settings=settings,
                policy_label=policy_label,
                level_label=level_label,
                config_hash_label=config_hash_label,
                webhook=webhook,
                lease=election,
                notifications=notifications,
            )
        )
    except kubernetes.config.ConfigException as exc:
        click.echo(f"kvoffload run: no Kubernetes configuration (in-cluster or $KUBECONFIG): {exc}", err=True)
        sys.exit(EXIT_FAIL)
