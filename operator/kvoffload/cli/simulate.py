"""``kvoffload simulate``: what a real trace's reuse would give each cache size and each tier of a policy."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from kvoffload.cli.common import (
    EXIT_BAD_INPUT,
    OUTPUT,
    STRUCTURED,
    dump,
    judged_as_the_cluster,
    reports_bad_input,
    resource_name,
)
from kvoffload.policy.tenancy import Tenancy


def _sizes(value: str | None) -> list[int] | None:
    if value is None:
        return None
    try:
        sizes = sorted({int(part) for part in value.split(",") if part.strip()})
    except ValueError:
        raise click.BadParameter(f"expected comma-separated block counts, got {value!r}") from None
    if not sizes or sizes[0] < 0:
        raise click.BadParameter(f"expected block counts >= 0, got {value!r}")
    return sizes


@click.command()
@click.argument("trace", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option(
    "--policy",
    "policy_path",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="Map the curve onto this KVOffloadPolicy's GPU, CPU and filesystem tiers, level by level.",
)
@click.option("--blocks", default=None, help="Cache sizes for the LRU table, e.g. 1000,4000,16000 (default: a sweep).")
@click.option(
    "--block-tokens",
    type=click.IntRange(min=1),
    default=512,
    show_default=True,
    help="Tokens per block: Mooncake traces hash 512-token blocks; token-id traces are cut to this.",
)
@click.option(
    "--gpu-blocks",
    type=click.IntRange(min=0),
    default=None,
    help="The fleet's GPU KV cache in blocks (default: kvoffload plan's estimate × replicas).",
)
@OUTPUT
@judged_as_the_cluster
@reports_bad_input
def simulate(
    trace: Path,
    policy_path: Path | None,
    blocks: str | None,
    block_tokens: int,
    gpu_blocks: int | None,
    output: str,
    tenancy: Tenancy,
) -> None:
    """Replay a request trace (Mooncake JSONL with hash_ids, or {"token_ids": [...]} lines) through an
    LRU cache at every size at once (Mattson stack distances, one pass), and print the hit-ratio curve
    and the reuse-distance distribution.

    With --policy, it also gives every ladder level's hit share per tier (GPU, CPU, filesystem), the
    fleet taken as replicas × one pod's capacity behind a prefix-aware router, and the smallest CPU
    tier within 5% of the best hit share.
    """
    if output == "name" and policy_path is None:  # before the replay: there is no object to name
        click.echo("-o name prints the policy simulated: give --policy FILE", err=True)
        sys.exit(EXIT_BAD_INPUT)
    from kvoffload.economics.simulate import default_sizes, simulate_plan, smallest_within
    from kvoffload.economics.stackdist import reuse_profile
    from kvoffload.economics.traces import TraceError, read_trace

    sizes = _sizes(blocks)
    try:
        blocks_trace = read_trace(trace, block_tokens=block_tokens)
    except TraceError as exc:
        click.echo(f"kvoffload simulate: {exc}", err=True)
        sys.exit(EXIT_BAD_INPUT)
    profile = reuse_profile(blocks_trace.blocks)
    sizes = sizes or default_sizes(profile.unique)
    result: dict[str, Any] = {
        "trace": {
            "source": str(trace),
            "format": blocks_trace.format,
            "requests": blocks_trace.requests,
            "blocks": profile.accesses,
            "unique": profile.unique,
            "blockTokens": block_tokens,
            "infiniteHitRatio": profile.hit_ratio(None),
        },
        "lru": [
            {"blocks": size, "hitRatio": ratio} for size, ratio in zip(sizes, profile.hit_ratios(sizes), strict=True)
        ],
        "reuseDistance": [{"from": lo, "to": hi, "count": n} for lo, hi, n in profile.distance_buckets()],
    }
    if policy_path is not None:
        from kvoffload.policy.loading import iter_documents, load_policy
        from kvoffload.policy.sizing import plan_policy, resolve_config_map

        policy = resolve_config_map(load_policy(policy_path, tenancy), iter_documents(policy_path), str(policy_path))
        plan = plan_policy(policy)
        replicas = policy.spec.replicas
        try:
            levels = simulate_plan(profile, plan, block_tokens=block_tokens, replicas=replicas, gpu_blocks=gpu_blocks)
        except ValueError as exc:
            click.echo(f"kvoffload simulate: {exc} (--gpu-blocks)", err=True)
            sys.exit(EXIT_BAD_INPUT)
        gpu = levels[0].tiers[0].blocks
        result["policy"] = {
            "name": plan.policy,
            "replicas": replicas,
            "levels": [
                {
                    "index": lv.index,
                    "name": lv.name,
                    "tiers": [{"tier": t.tier, "blocks": t.blocks, "share": t.share} for t in lv.tiers],
                    "externalShare": lv.external_share,
                    "recomputed": lv.recomputed,
                }
                for lv in levels
            ],
            "recommendedCpuBlocks": smallest_within(profile, sizes, floor=gpu),
        }
    if output in STRUCTURED:
        click.echo(dump(result, output))
    elif output == "name":
        click.echo(resource_name(result["policy"]["name"].rpartition("/")[2]))  # planned as NAMESPACE/NAME
    else:  # table; wide has nothing more to show
        click.echo(_table(result))


def _table(result: dict[str, Any]) -> str:
    t = result["trace"]
    lines = [
        f"{t['source']}: {t['requests']:,} requests, {t['blocks']:,} blocks of {t['blockTokens']} tokens, "
        f"{t['unique']:,} distinct; an unbounded cache hits {t['infiniteHitRatio']:.1%}",
        "",
        f"  {'LRU blocks':>12}  {'hit ratio':>9}",
        *(f"  {row['blocks']:>12,}  {row['hitRatio']:>9.1%}" for row in result["lru"]),
    ]
    policy = result.get("policy")
    if policy is not None:
        lines += ["", f"policy {policy['name']} ({policy['replicas']} replicas behind a prefix-aware router):"]
        for level in policy["levels"]:
            tiers = ", ".join(f"{x['tier']} {x['share']:.1%} of {x['blocks']:,} blocks" for x in level["tiers"])
            lines.append(
                f"  {level['name']:<10} {tiers}; external {level['externalShare']:.1%}, "
                f"recomputed {level['recomputed']:.1%}"
            )
        lines.append(f"  smallest CPU tier within 5% of the best hit share: {policy['recommendedCpuBlocks']:,} blocks")
    return "\n".join(lines)
