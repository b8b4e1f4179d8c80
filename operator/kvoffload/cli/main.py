"""The ``kvoffload`` command: the operator, and the tools around it."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import click

from kvoffload import __version__
from kvoffload.api.errors import FieldError, PolicyError
from kvoffload.api.types import EngineName, KVOffloadPolicy
from kvoffload.cli.common import (
    EXIT_BAD_INPUT,
    EXIT_FAIL,
    EXIT_INCONCLUSIVE,
    MONITOR_LABELS,
    OUTPUT,
    POLICY_FILE,
    STRUCTURED,
    Duration,
    dump,
    judged_as_the_cluster,
    reports_bad_input,
    resource_name,
)
from kvoffload.cli.connection import prometheus_connection
from kvoffload.cli.logs import LOG_FORMATS
from kvoffload.cli.simulate import simulate
from kvoffload.engines import engine_for
from kvoffload.policy.tenancy import Tenancy

if TYPE_CHECKING:
    from pydantic import ValidationError

    from kvoffload.analysis.prometheus import Connection

WORKLOAD_FILE = click.option(
    "--workload",
    "workload_file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    metavar="DEPLOYMENT.yaml",
    help="The Deployment the policy's spec.workloadRef takes over, as a file (for review before it is applied): "
    "each level is derived from its pod template as the operator derives it from the cluster's. Needed with "
    "spec.workloadRef.",
)

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


@main.command()
@POLICY_FILE
@click.option(
    "--prompt-tokens",
    type=click.IntRange(min=1),
    default=1480,
    show_default=True,
    help="The model's typical prompt, for the break-even of restore against recompute and the forecast.",
)
@click.option(
    "--gpu-class",
    default=None,
    metavar="CLASS",
    help="Forecast on this GPU class's engine profile instead of spec.gpu.class.",
)
@WORKLOAD_FILE
@OUTPUT
@judged_as_the_cluster
@reports_bad_input
def plan(
    file: Path, prompt_tokens: int, gpu_class: str | None, workload_file: Path | None, output: str, tenancy: Tenancy
) -> None:
    """Size a policy: KV bytes per token, tokens per tier, pinned pool, /dev/shm, host memory, warnings,
    and whether restoring a prompt from the CPU tier beats recomputing it on this GPU class.

    The forecast is the engine's own time to first token (cold, GPU hit, CPU restore), from the class's
    engine profile (`kvoffload calibrate --engine-url`); the break-even is the copy against a PyTorch forward.

    A policy with spec.model.configMap is sized from a ConfigMap of that name in the same file. A policy with
    spec.workloadRef needs --workload, the Deployment it takes over: its engine is recognised there and its flags
    checked against the spec; what the levels would replace in it is printed as warnings on stderr.
    """
    from kvoffload.economics.breakeven import plan_economics
    from kvoffload.economics.enginecost import plan_forecast
    from kvoffload.policy.loading import iter_documents, load_policy
    from kvoffload.policy.sizing import format_plan, plan_policy, resolve_config_map

    policy = resolve_config_map(load_policy(file, tenancy), iter_documents(file), str(file))
    policy, warnings = adopted(policy, file, workload_file, tenancy)
    policy = judged(policy, file)
    result = plan_policy(policy)
    economics = plan_economics(result, prompt_tokens)
    if policy.spec.engine != EngineName.VLLM and "error" not in economics:
        # The profiles time vLLM's loads (a 64 KiB page per layer and block, one batched DMA); not this engine's.
        economics["note"] = (
            f"the restore is priced as vLLM moves the KV; {engine_for(policy.spec).title}'s own path is not modelled"
        )
    forecast = plan_forecast(gpu_class or result.gpu_class, policy.spec, prompt_tokens)
    if output in STRUCTURED:
        document = result.model_dump(mode="json", by_alias=True)
        for level in document["levels"]:
            if level["cpuBytes"] is not None:
                level["economics"] = economics
        document["forecast"] = forecast
        click.echo(dump(document, output))
    elif output == "name":
        click.echo(resource_name(policy.metadata.name))
    else:  # table; wide has nothing more to show
        click.echo(format_plan(result))
        click.echo(_economics_line(economics))
        click.echo(_forecast_line(forecast))
    for warning in warnings:
        click.echo(f"warning: {warning}", err=True)


def _forecast_line(forecast: dict[str, Any]) -> str:
    if "error" in forecast:
        return f"forecast: not priced: {forecast['error']}"
    ttft = forecast["ttftMs"]
    saving = forecast["savingMs"]
    return (
        f"forecast ({forecast['promptTokens']:,}-token prompt, {forecast['engineMode']}, {forecast['source']}): "
        f"TTFT cold {ttft['cold']:.1f} ms, GPU hit {ttft['gpuHit']:.1f} ms, CPU restore {ttft['cpuRestore']:.1f} ms: "
        + (
            f"a restore saves {saving:.1f} ms"
            if saving > 0
            else f"a restore costs {-saving:.1f} ms more: the tier does not pay"
        )
    )


def judged(policy: KVOffloadPolicy, file: Path) -> KVOffloadPolicy:
    """``policy``, once judged as the operator and its webhook judge it (it renders, its vLLM version has a
    dialect, every level can be sized); PolicyError naming the fields otherwise."""
    from kvoffload.controller.reconcile import judge_resolved

    try:
        judge_resolved(policy)
    except PolicyError as exc:
        raise PolicyError(exc.errors, str(file)) from None
    return policy


def adopted(
    policy: KVOffloadPolicy, file: Path, workload_file: Path | None, tenancy: Tenancy
) -> tuple[KVOffloadPolicy, list[str]]:
    """``policy`` with the Deployment its spec.workloadRef names read from ``workload_file``, judged against
    ``tenancy`` as the operator judges it, and the warnings about it; the policy as it is without workloadRef.
    PolicyError names the field."""
    from kvoffload.policy.loading import iter_documents
    from kvoffload.policy.tenancy import check_tenancy
    from kvoffload.policy.workload import WHERE, adopt, workload_warnings

    ref = policy.spec.workload_ref
    if ref is None:
        if workload_file is not None:
            raise PolicyError(
                [FieldError(WHERE, f"--workload {workload_file}: the policy has no workloadRef")], str(file)
            )
        return policy, []
    if workload_file is None:
        raise PolicyError(
            [FieldError(WHERE, f"the policy takes over Deployment {ref.name}: pass --workload DEPLOYMENT.yaml")],
            str(file),
        )
    found = [d for d in iter_documents(workload_file) if isinstance(d, dict) and d.get("kind") == "Deployment"]
    named = [d for d in found if (d.get("metadata") or {}).get("name") == ref.name]
    if not named:
        held = ", ".join(str((d.get("metadata") or {}).get("name")) for d in found) or "none"
        raise PolicyError(
            [FieldError(f"{WHERE}.name", f"{workload_file} holds no Deployment {ref.name} (it holds: {held})")],
            str(file),
        )
    deployment = named[0]
    namespace = (deployment.get("metadata") or {}).get("namespace")
    wrong = []
    if deployment.get("apiVersion") != ref.api_version.value:
        wrong.append(f"{workload_file}: Deployment {ref.name} is {deployment.get('apiVersion')}, not {ref.api_version}")
    if namespace not in (None, policy.metadata.namespace):
        wrong.append(
            f"{workload_file}: Deployment {ref.name} is in namespace {namespace}, not the policy's "
            f"({policy.metadata.namespace})"
        )
    if wrong:
        raise PolicyError([FieldError(f"{WHERE}.name", w) for w in wrong], str(file))
    try:
        policy = adopt(policy, deployment)
    except PolicyError as exc:
        raise PolicyError(exc.errors, str(file)) from None
    if problems := check_tenancy(policy, tenancy):
        raise PolicyError(problems, str(file))
    return policy, workload_warnings(policy)


def _economics_line(economics: dict[str, Any]) -> str:
    if "error" in economics:
        return f"break-even: not priced: {economics['error']}"
    profile = economics["profile"]
    return (
        f"break-even ({economics['promptTokens']:,}-token prompt, {profile['kind']} profile {profile['name']}): "
        f"recompute {economics['recomputeMs']:.1f} ms, restore from the CPU tier {economics['restoreMs']:.1f} ms: "
        f"{economics['ratio']:.1f}x"
        + ("" if economics["ratio"] > 1 else ", offload cannot pay")
        + (f" ({economics['note']})" if "note" in economics else "")
    )


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


@main.command()
@POLICY_FILE
@click.option(
    "--level",
    default=None,
    metavar="LEVEL",
    help="Ladder level, by index (0 = GPU-only) or name (gpu-only, cpu-pilot, cpu, nvme...). Default: the top level.",
)
@click.option("--stage", default=None, hidden=True, help="Old name of --level NAME.")
@WORKLOAD_FILE
@MONITOR_LABELS
@judged_as_the_cluster
@reports_bad_input
def render(
    file: Path,
    level: str | None,
    stage: str | None,
    workload_file: Path | None,
    monitor_labels: dict[str, str],
    tenancy: Tenancy,
) -> None:
    """Print the manifests (Deployment, Service, PodMonitor) of one ladder level, for GitOps.

    A policy with spec.model.configMap reads the model's KV shape from a ConfigMap of that name in the
    same file (as `plan` does): the pods carry each tier's capacity in tokens.

    A policy with spec.workloadRef needs --workload, the Deployment it takes over: each level's pod template is
    that Deployment's, with only the engine's offload flags and variables, the memory request and limit (raised,
    never lowered), /dev/shm and the tier volumes changed, and the operator's labels and annotations added. What
    it replaces of the team's own (their offload flags, say) is printed as warnings on stderr.
    """
    from kvoffload.policy.ladder import build_ladder, find_level
    from kvoffload.policy.loading import iter_documents, load_policy
    from kvoffload.policy.render import dump_yaml, render_level
    from kvoffload.policy.sizing import resolve_config_map

    if stage is not None:
        if level is not None:
            click.echo("give --level, not both --level and --stage", err=True)
            sys.exit(EXIT_BAD_INPUT)
        click.echo("warning: --stage is deprecated; use --level NAME", err=True)
        level = stage
    policy = resolve_config_map(load_policy(file, tenancy), iter_documents(file), str(file))
    policy, warnings = adopted(policy, file, workload_file, tenancy)
    policy = judged(policy, file)
    try:
        ladder = build_ladder(policy.spec)
        chosen = find_level(ladder, index=int(level)) if level and level.isdigit() else find_level(ladder, name=level)
    except KeyError as exc:
        click.echo(f"{file}: {exc.args[0]}", err=True)
        sys.exit(EXIT_BAD_INPUT)
    text = dump_yaml(render_level(policy, chosen, monitor_labels))  # whole text first: nothing printed on error
    for warning in warnings:
        click.echo(f"warning: {warning}", err=True)
    click.echo(text, nl=False)


@main.command()
@click.option(
    "--kind",
    type=click.Choice(["policy", "analysistemplate"]),
    default="policy",
    show_default=True,
    help="Which CRD: KVOffloadPolicy, or the cluster-scoped KVOffloadAnalysisTemplate.",
)
def crd(kind: str) -> None:
    """Print a CustomResourceDefinition generated from the models."""
    from kvoffload.api.crd import crd_yaml, template_crd_yaml

    click.echo(crd_yaml() if kind == "policy" else template_crd_yaml(), nl=False)


@main.command()
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
    from kvoffload.analysis.dialects import confirm_dialect, policy_dialect
    from kvoffload.analysis.payoff import payoff_sub_window
    from kvoffload.analysis.prometheus import LabelNames, PrometheusProvider, Target
    from kvoffload.api.quantity import parse_duration
    from kvoffload.api.types import Verdict
    from kvoffload.cli.statusview import metric_rows
    from kvoffload.policy.ladder import build_ladder, find_level
    from kvoffload.policy.loading import load_policy
    from kvoffload.policy.render import config_hash

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
        dialect = policy_dialect(spec)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="spec.model.vllmVersion") from None

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
        dialect,
        spec.prometheus.extra_matchers,
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


# --- manual control and status -------------------------------------------------------

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


def _me() -> str:
    """How this program was called: ``kvoffload``, or ``kubectl kvoffload`` as a kubectl plugin."""
    called = click.get_current_context().find_root().info_name
    return called if called and not called.startswith("-") else "kvoffload"  # `python -c` names itself -c


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
        click.echo(f"{_me()} {verb}: {exc}", err=True)
        sys.exit(EXIT_FAIL)
    phase = (policy.get("status") or {}).get("phase", "not yet acted on")
    click.echo(
        f"asked {ns}/{name} to {verb} ({key or control.VERBS[verb]}={value}): {what or control.WHAT_IT_DOES[verb]}.\n"
        f"The operator acts on it at its next cycle (phase now: {phase}); see `{_me()} status {name} -n {ns}`."
    )


@main.command()
@POLICY_NAME
@NAMESPACE
@KUBECONFIG
@CONTEXT
def promote(name: str, namespace: str | None, kubeconfig: Path | None, context: str | None) -> None:
    """End the current baseline or step now and move on, without waiting for evidence."""
    _control("promote", name, namespace, kubeconfig, context)


@main.command()
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


@main.command()
@POLICY_NAME
@NAMESPACE
@KUBECONFIG
@CONTEXT
def retry(name: str, namespace: str | None, kubeconfig: Path | None, context: str | None) -> None:
    """Start the ladder again from the stable level, after a rollback, a pause or a preflight hold (Held)."""
    _control("retry", name, namespace, kubeconfig, context)


@main.command()
@POLICY_NAME
@NAMESPACE
@KUBECONFIG
@CONTEXT
def pause(name: str, namespace: str | None, kubeconfig: Path | None, context: str | None) -> None:
    """Stop forward motion; rollbacks on hard failures or sustained breaches still apply."""
    _control("pause", name, namespace, kubeconfig, context)


@main.command()
@POLICY_NAME
@NAMESPACE
@KUBECONFIG
@CONTEXT
def resume(name: str, namespace: str | None, kubeconfig: Path | None, context: str | None) -> None:
    """Go on after a pause (a person's, or too many Inconclusive verdicts); the step clock restarts."""
    _control("resume", name, namespace, kubeconfig, context)


def _unreadable(exc: ValidationError, where: str) -> NoReturn:
    from kvoffload.api.errors import errors_from

    problems = "; ".join(f"{e.path}: {e.message}" for e in errors_from(exc, ("status",)))
    click.echo(f"{_me()} status: {where} has a status this version cannot read: {problems}", err=True)
    sys.exit(EXIT_FAIL)


@main.command()
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
        click.echo(f"{_me()} status: --timeout needs --watch", err=True)
        sys.exit(EXIT_BAD_INPUT)
    try:
        api = control.connect(kubeconfig, context)
        ns = namespace or control.default_namespace(kubeconfig, context)
        with api:
            if watch:
                sys.exit(_watch(api, ns, name, output, timeout))
            policy = control.read_policy(api, ns, name)
    except control.ControlError as exc:
        click.echo(f"{_me()} status: {exc}", err=True)
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
            click.echo(watch.final_line(state, code, _me()), err=True)
            return code
    where = f" (still {state.phase})" if state is not None else ""
    waited = format_duration(timeout or 0)
    click.echo(
        f"{_me()} status: timed out after {waited} waiting for {namespace}/{name} to come to rest{where} "
        f"(exit {EXIT_INCONCLUSIVE})",
        err=True,
    )
    return EXIT_INCONCLUSIVE


@main.command("get")
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
        click.echo(f"{_me()} get: --timeout needs --watch", err=True)
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
        click.echo(f"{_me()} get: {exc}", err=True)
        sys.exit(EXIT_FAIL)
    except KeyboardInterrupt:
        return


@main.command("list")
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
        click.echo(f"{_me()} list: {exc}", err=True)
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


@main.command(short_help="Run the operator (kopf inside).")
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
    from kvoffload.controller.reconcile import ControllerSettings, SecretLocation
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


main.add_command(simulate)


def kubectl_plugin() -> None:
    """The ``kubectl-kvoffload`` entry point: the same commands, called as ``kubectl kvoffload ...``.

    kubectl runs the first ``kubectl-kvoffload`` on $PATH with every argument after ``kubectl kvoffload``
    (-n, --kubeconfig and --context included, which the commands take themselves).
    """
    main(prog_name="kubectl kvoffload")
