"""``kvoffload analyze``: one analysis cycle of a policy file against Prometheus, now."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from kvoffload.cli.common import (
    EXIT_FAIL,
    EXIT_INCONCLUSIVE,
    OUTPUT,
    POLICY_FILE,
    STRUCTURED,
    dump,
    judged_as_the_cluster,
    reports_bad_input,
    resource_name,
)
from kvoffload.cli.connection import prometheus_connection
from kvoffload.policy.tenancy import Tenancy

if TYPE_CHECKING:
    from kvoffload.analysis.promhttp import Connection


@click.command()
@POLICY_FILE
@click.option("--prometheus", "prometheus_url", default=None, help="Prometheus base URL. Default: spec.prometheus.url.")
@click.option("--level", type=int, default=None, help="Ladder level the canary runs (0 = GPU-only). Default: the top.")
@click.option(
    "--stable-level",
    type=int,
    default=None,
    help="Ladder level the stable engines run. Default: the nearest level below --level that may hold the fleet.",
)
@click.option("--guard", is_flag=True, help="No canary runs: judge --level's engines against the absolute budgets.")
@click.option("--warming-up", is_flag=True, help="Judge as in a step's first half: offload hit checks not gated.")
@click.option(
    "--payoff-over",
    default=None,
    help="How far back the live payoff reads its sub-windows (a duration, e.g. 15m). Default: rollout.stepDuration.",
)
@click.option(
    "--series-labels",
    default="kvoffload_io_policy,kvoffload_io_level,kvoffload_io_config_hash",
    show_default=True,
    help="The series labels naming the policy, the level and the config hash, as POLICY,LEVEL,CONFIG_HASH.",
)
@click.option("--bearer-token-file", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None)
@prometheus_connection(legacy_names=True)
@click.option("--timeout", type=click.FloatRange(min=0.1), default=10.0, show_default=True, help="Seconds per query.")
@OUTPUT
@judged_as_the_cluster
@reports_bad_input
def analyze(
    file: Path,
    prometheus_url: str | None,
    level: int | None,
    stable_level: int | None,
    guard: bool,
    warming_up: bool,
    payoff_over: str | None,
    series_labels: str,
    bearer_token_file: Path | None,
    connection: Connection,
    timeout: float,
    output: str,
    tenancy: Tenancy,
) -> None:
    """Run one analysis cycle now: canary vs stable, every metric with its value, threshold and verdict.

    Exit status: 0 Pass, 1 Fail, 3 Inconclusive (too few requests, no data, Prometheus unreachable),
    2 bad input.
    """
    import time
    from dataclasses import replace

    from kvoffload.analysis.assess import assess
    from kvoffload.analysis.payoff import payoff_sub_window
    from kvoffload.analysis.prometheus import PrometheusProvider
    from kvoffload.analysis.queries import LabelNames, Target
    from kvoffload.api.errors import PolicyError
    from kvoffload.api.quantity import parse_duration
    from kvoffload.api.status import Verdict
    from kvoffload.cli.statusview import metric_rows
    from kvoffload.engines import engine_for
    from kvoffload.engines.dialect import confirm_dialect
    from kvoffload.policy.engine_config import config_hash
    from kvoffload.policy.ladder import build_ladder, find_level
    from kvoffload.policy.loading import load_policy

    policy = load_policy(file, tenancy)
    spec = policy.spec
    labels = [part.strip() for part in series_labels.split(",")]
    if len(labels) != 3 or not all(labels):
        raise click.BadParameter("want POLICY,LEVEL,CONFIG_HASH", param_hint="--series-labels")
    ladder = build_ladder(spec)
    try:
        chosen = find_level(ladder, index=level)
    except KeyError as exc:
        raise click.BadParameter(str(exc.args[0]), param_hint="--level") from None
    if guard:
        stable = chosen
    elif stable_level is not None:
        try:
            stable = find_level(ladder, index=stable_level)
        except KeyError as exc:
            raise click.BadParameter(str(exc.args[0]), param_hint="--stable-level") from None
    else:
        below = [lv for lv in ladder[: chosen.index] if not lv.canary_only]
        stable = below[-1] if below else chosen
    try:
        dialect = engine_for(spec).dialect(spec)
    except PolicyError as exc:
        (first, *_) = exc.errors
        raise click.BadParameter(first.message, param_hint=first.path) from None

    provider = PrometheusProvider(
        prometheus_url or spec.prometheus.url,
        bearer_token_file=bearer_token_file,
        connection=connection,
        timeout=timeout,
        labels=LabelNames(policy=labels[0], level=labels[1], config_hash=labels[2]),
    )
    namespace = policy.metadata.namespace
    target = Target(
        namespace,
        policy.metadata.name,
        spec.analysis.window,
        spec.prometheus.extra_matchers,
        dialect=dialect,
        stable_hash=config_hash(policy, stable),
        canary_hash=None if guard else config_hash(policy, chosen),
    )
    if not guard and chosen.offloads and stable.index != chosen.index:
        # As a step would have it so far: the live payoff's sub-windows over the step (or --payoff-over).
        try:
            over = parse_duration(payoff_over or spec.rollout.step_duration)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--payoff-over") from None
        since = time.time() - over
        target = replace(target, payoff_since=since, payoff_step=payoff_sub_window(spec.analysis))
    # The image tag can be off by a release: the series Prometheus holds decide.
    target = replace(target, dialect=confirm_dialect(dialect, set(provider.present_metric_names(target))))
    measurements = provider.measure([target])[target.key]
    result = assess(spec, chosen, measurements, warmed_up=not warming_up)

    if output in STRUCTURED:
        doc = {
            "policy": policy.metadata.name,
            "namespace": namespace,
            "level": {"index": chosen.index, "name": chosen.name, "tiers": chosen.tiers},
            "mode": "guard" if guard else "canary",
            "window": spec.analysis.window,
            "dialect": target.dialect.name,
            "verdict": result.verdict.value,
            "message": result.message,
            "metrics": [m.model_dump(mode="json", by_alias=True) for m in result.metrics],
        }
        click.echo(dump(doc, output))
    elif output == "name":
        click.echo(resource_name(policy.metadata.name))
    else:  # table; wide has nothing more to show
        who = "stable only (guard)" if guard else "canary vs stable"
        click.echo(
            f"{namespace}/{policy.metadata.name}: level {chosen.index} ({chosen.name}), {who}, "
            f"window {spec.analysis.window}, vLLM dialect {target.dialect.name}, Prometheus {provider.url}"
        )
        rows = metric_rows(result.metrics)
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
        for r in rows if result.metrics else []:
            click.echo("  ".join(cell.ljust(w) for cell, w in zip(r[:-1], widths, strict=True)) + "  " + r[-1])
        click.echo(f"verdict: {result.verdict.value}: {result.message}")
    codes = {Verdict.PASS: 0, Verdict.FAIL: EXIT_FAIL, Verdict.INCONCLUSIVE: EXIT_INCONCLUSIVE}
    sys.exit(codes[result.verdict])
