"""``kvoffload plan``, ``render`` and ``crd``: a policy file sized, its manifests for one ladder level, and the
CRDs generated from the models; and how a file's policy is judged and its workloadRef Deployment read."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from kvoffload.api.errors import FieldError, PolicyError
from kvoffload.api.types import KVOffloadPolicy
from kvoffload.cli.common import (
    EXIT_BAD_INPUT,
    MONITOR_LABELS,
    OUTPUT,
    POLICY_FILE,
    STRUCTURED,
    dump,
    judged_as_the_cluster,
    reports_bad_input,
    resource_name,
)
from kvoffload.engines import ENGINES, engine_for
from kvoffload.policy.sized import Sized
from kvoffload.policy.tenancy import Tenancy

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


@click.command()
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
    from kvoffload.policy.adoptwarnings import workload_warnings
    from kvoffload.policy.loading import iter_documents, load_policy
    from kvoffload.policy.plantable import format_plan
    from kvoffload.policy.sizing import plan_policy, resolve_config_map

    policy = resolve_config_map(load_policy(file, tenancy), iter_documents(file), str(file))
    policy, sized = judged(adopted(policy, file, workload_file, tenancy), file)
    warnings = workload_warnings(policy, sized)
    result = plan_policy(policy)
    economics = plan_economics(result, prompt_tokens)
    engine = engine_for(policy.spec)
    if not engine.restore_profiled and "error" not in economics:
        # The profiles time one engine's loads (a 64 KiB page per layer and block, one batched DMA); not this one's.
        timed = ", ".join(e.title for e in ENGINES.values() if e.restore_profiled)
        economics["note"] = f"the restore is priced as {timed} moves the KV; {engine.title}'s own path is not modelled"
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


def judged(policy: KVOffloadPolicy, file: Path) -> tuple[KVOffloadPolicy, Sized]:
    """``policy``, once judged as the operator and its webhook judge it (it renders, its vLLM version has a
    dialect, every level can be sized), and its sized plan; PolicyError naming the fields otherwise."""
    from kvoffload.controller.judging import judge_resolved

    try:
        _, sized = judge_resolved(policy)
    except PolicyError as exc:
        raise PolicyError(exc.errors, str(file)) from None
    return policy, sized


def adopted(policy: KVOffloadPolicy, file: Path, workload_file: Path | None, tenancy: Tenancy) -> KVOffloadPolicy:
    """``policy`` with the Deployment its spec.workloadRef names read from ``workload_file``, judged against
    ``tenancy`` as the operator judges it; the policy as it is without workloadRef. PolicyError names the field."""
    from kvoffload.policy.loading import iter_documents
    from kvoffload.policy.tenancy import check_tenancy
    from kvoffload.policy.workload import WHERE, adopt

    ref = policy.spec.workload_ref
    if ref is None:
        if workload_file is not None:
            raise PolicyError(
                [FieldError(WHERE, f"--workload {workload_file}: the policy has no workloadRef")], str(file)
            )
        return policy
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
    return policy


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


@click.command()
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
    from kvoffload.policy.adoptwarnings import workload_warnings
    from kvoffload.policy.ladder import find_level
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
    policy, sized = judged(adopted(policy, file, workload_file, tenancy), file)
    warnings = workload_warnings(policy, sized)
    try:
        ladder = sized.ladder
        chosen = find_level(ladder, index=int(level)) if level and level.isdigit() else find_level(ladder, name=level)
    except KeyError as exc:
        click.echo(f"{file}: {exc.args[0]}", err=True)
        sys.exit(EXIT_BAD_INPUT)
    # The whole text first: nothing printed on error.
    text = dump_yaml(render_level(policy, sized[chosen.index], monitor_labels))
    for warning in warnings:
        click.echo(f"warning: {warning}", err=True)
    click.echo(text, nl=False)


@click.command()
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
