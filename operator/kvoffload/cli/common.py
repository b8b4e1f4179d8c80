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
EXIT_OK = 0
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


def judged_as_the_cluster(func: F) -> F:
    """Add the admin's allow-lists (the options ``kvoffload run`` takes) and hand the command a ``tenancy``,
    so that a policy is judged here as the cluster's operator and webhook judge it."""
    from kvoffload.policy.tenancy import Tenancy

    @functools.wraps(func)
    def wrapper(
        *args: Any,
        allowed_host_paths: tuple[str, ...],
        allowed_images: tuple[str, ...],
        prometheus_allowed_urls: tuple[str, ...],
        prometheus_allow_private: bool,
        allowed_service_accounts: tuple[str, ...],
        allowed_priority_classes: tuple[str, ...],
        allowed_runtime_classes: tuple[str, ...],
        allowed_secret_volumes: tuple[str, ...],
        allow_keyless_tolerations: bool,
        allowed_pod_annotations: tuple[str, ...],
        allowed_code_options: tuple[str, ...],
        min_analysis_interval: float,
        min_analysis_window: float,
        **kwargs: Any,
    ) -> Any:
        tenancy = Tenancy(
            host_path_roots=allowed_host_paths,
            image_patterns=allowed_images,
            prometheus_url_prefixes=prometheus_allowed_urls,
            private_prometheus=prometheus_allow_private,
            service_accounts=allowed_service_accounts,
            priority_classes=allowed_priority_classes,
            runtime_classes=allowed_runtime_classes,
            secret_volumes=allowed_secret_volumes,
            keyless_tolerations=allow_keyless_tolerations,
            pod_annotations=allowed_pod_annotations,
            code_options=allowed_code_options,
            min_analysis_interval=min_analysis_interval,
            min_analysis_window=min_analysis_window,
        )
        if problems := tenancy.problems():
            for problem in problems:
                click.echo(problem, err=True)
            sys.exit(EXIT_BAD_INPUT)
        return func(*args, tenancy=tenancy, **kwargs)

    for option in reversed(TENANCY_OPTIONS):
        wrapper = option(wrapper)
    return wrapper  # type: ignore[return-value]


class Duration(click.ParamType):  # type: ignore[type-arg]  # generic from click 8.2 on
    """A Go-style duration (``90s``, ``10m``, ``1h30m``; a bare number is seconds), as seconds."""

    name = "duration"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            seconds = float(value)
        else:
            from kvoffload.api.quantity import parse_duration

            text = str(value).strip()
            try:
                seconds = float(text) if text.replace(".", "", 1).isdigit() else parse_duration(text)
            except ValueError as exc:
                self.fail(str(exc), param, ctx)
        if seconds < 0:
            self.fail(f"{value!r} is negative", param, ctx)
        return seconds


TENANCY_OPTIONS = (
    click.option(
        "--allowed-host-path",
        "allowed_host_paths",
        multiple=True,
        metavar="PATH",
        help="A node path under which hostPath tiers may live (repeat for more). None given: no hostPath tier.",
    ),
    click.option(
        "--allowed-image",
        "allowed_images",
        multiple=True,
        metavar="PATTERN",
        help="Engine images allowed, a shell pattern over the image without tag or digest, e.g. "
        "'registry.example.com/llm/*' (repeat for more). None given: any image.",
    ),
    click.option(
        "--prometheus-allowed-url",
        "prometheus_allowed_urls",
        multiple=True,
        metavar="URL",
        help="A Prometheus URL prefix a policy's spec.prometheus.url may name (repeat for more); the operator's "
        "token goes only there. None given: any URL but the node's, link-local ones and cloud metadata services.",
    ),
    click.option(
        "--prometheus-allow-private",
        is_flag=True,
        help="Let a policy name a Prometheus at a loopback, link-local or cloud metadata address: for a lab "
        "on one machine, never for a shared cluster.",
    ),
    click.option(
        "--allowed-service-account",
        "allowed_service_accounts",
        multiple=True,
        metavar="NAME",
        help="A ServiceAccount engine pods may run as (spec.podTemplate.serviceAccountName; repeat for more). "
        "None given: only the namespace's default.",
    ),
    click.option(
        "--allowed-priority-class",
        "allowed_priority_classes",
        multiple=True,
        metavar="NAME",
        help="A PriorityClass a policy may name (repeat for more). None given: none.",
    ),
    click.option(
        "--allowed-runtime-class",
        "allowed_runtime_classes",
        multiple=True,
        metavar="NAME",
        help="A RuntimeClass a policy may name (repeat for more). None given: none.",
    ),
    click.option(
        "--allowed-secret-volume",
        "allowed_secret_volumes",
        multiple=True,
        metavar="NAME_PATTERN",
        help="Secrets a policy may mount as a volume (spec.podTemplate.volumes[].secret), a shell pattern over "
        "the name (repeat for more); never the names of ServiceAccount token Secrets. None given: none.",
    ),
    click.option(
        "--allow-keyless-tolerations",
        is_flag=True,
        help="Let a policy give a toleration without a key, which tolerates every taint. Off: each names its key.",
    ),
    click.option(
        "--allowed-pod-annotation",
        "allowed_pod_annotations",
        multiple=True,
        metavar="PATTERN",
        help="A service mesh annotation or label key (sidecar.istio.io/inject, linkerd.io/inject, ...) that "
        "spec.podTemplate.metadata may set, a shell pattern (repeat for more). None given: none.",
    ),
    click.option(
        "--allowed-code-option",
        "allowed_code_options",
        multiple=True,
        metavar="FLAG",
        help="An engine option that loads code (--trust-remote-code, --worker-extension-cls, SGLang's "
        "--custom-weight-loader, ...) that spec.model.extraArgs may set (repeat for more). None given: none.",
    ),
    click.option(
        "--min-analysis-interval",
        type=Duration(),
        default="0s",
        show_default=True,
        metavar="DURATION",
        help="The shortest spec.analysis.interval a policy may ask for: the scrape interval of its engines and "
        "how often its queries run on the shared Prometheus (the chart sets 10s).",
    ),
    click.option(
        "--min-analysis-window",
        type=Duration(),
        default="0s",
        show_default=True,
        metavar="DURATION",
        help="The shortest spec.analysis.window a policy may ask for: the range each query reads (the chart sets 1m).",
    ),
)


def _monitor_labels(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> dict[str, str]:
    from kvoffload.policy.renderable import check_label

    labels: dict[str, str] = {}
    for item in values:
        key, sep, value = item.partition("=")
        problems = check_label("--monitor-label", key, value) if sep else []
        if not sep or problems:
            reason = problems[0].message if problems else "give KEY=VALUE"
            raise click.BadParameter(f"{item!r}: {reason}", ctx, param)
        labels[key] = value
    return labels


MONITOR_LABELS = click.option(
    "--monitor-label",
    "monitor_labels",
    multiple=True,
    metavar="KEY=VALUE",
    callback=_monitor_labels,
    help="A label for every rendered PodMonitor (repeat for more), e.g. release=kube-prometheus-stack: the "
    "label your Prometheus' podMonitorSelector requires. A policy adds its own in spec.prometheus.monitorLabels.",
)


POLICY_FILE = click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
OUTPUTS = ("table", "wide", "json", "yaml", "name")
"""The -o formats, as kubectl names them: ``wide`` is the table with the columns a command has more to show (the
table where it has none), ``yaml`` the same document as ``json``, ``name`` one ``kvoffloadpolicy.kvoffload.io/NAME``
line per policy the output is about."""


def output_option(*formats: str) -> Callable[[F], F]:
    """The ``-o/--output`` option over ``formats`` (of :data:`OUTPUTS`), table first and the default."""
    unknown = set(formats) - set(OUTPUTS)
    if unknown or not formats or formats[0] != "table":
        raise ValueError(f"-o formats {formats}: table first, then some of {OUTPUTS}")
    described = {
        "table": "table",
        "wide": "wide (more columns where there are more to show)",
        "json": "json",
        "yaml": "yaml (the same document as json)",
        "name": "name (kvoffloadpolicy.kvoffload.io/NAME, as kubectl prints it)",
    }
    option = click.option(
        "-o",
        "--output",
        type=click.Choice(formats),
        default="table",
        show_default=True,
        help=", ".join(described[f] for f in formats) + ".",
    )
    return option


OUTPUT = output_option(*OUTPUTS)
STRUCTURED = frozenset({"json", "yaml"})
"""The -o formats that print the command's document rather than a table."""


def resource_name(name: str) -> str:
    """A policy as ``kubectl get -o name`` prints it: ``kvoffloadpolicy.kvoffload.io/NAME``."""
    from kvoffload.api.conventions import API_GROUP, KIND

    return f"{KIND.lower()}.{API_GROUP}/{name}"


def dump(document: Any, output: str) -> str:
    """``document`` as -o json or -o yaml prints it (the same content; YAML keeps the keys' order and non-ASCII
    text as it is, as JSON does with ``ensure_ascii=False``)."""
    import json

    if output == "json":
        return json.dumps(document, indent=2, ensure_ascii=False)
    if output == "yaml":
        import yaml

        return yaml.safe_dump(document, sort_keys=False, allow_unicode=True, default_flow_style=False).rstrip("\n")
    raise ValueError(f"-o {output} is not a document format")
