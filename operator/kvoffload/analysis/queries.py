"""The built-in queries of a cycle: every policy's measurements in a fixed number of PromQL queries.

Engines are selected by the labels the rendered PodMonitor copies from the pods
(``kvoffload_io_policy``, ``kvoffload_io_level``, ``kvoffload_io_config_hash``,
plus ``namespace``): labels that never change while a pod runs, so a role moving
from one level to another relabels nothing. A target names the config hash of
its stable and of its canary (``status.stable``/``status.canary``). Each query
covers every policy at once and groups by (namespace, policy, level, hash), so
the queries per cycle depend on how many distinct (window, dialect, extra
matchers) the policies use, never on how many policies there are. A batch's
queries are scoped to its own policies by a label matcher (``scope_matcher``), so
what Prometheus evaluates and the provider decodes grows with the batch, not with
the fleet; a batch too large to name asks fleet-wide.

A group in which some target asks for the workload figures (``Target.workload``:
a ladder in its baseline) gets ``WORKLOAD_QUERIES`` more queries: p50, p95 and p99
of four histograms (one query each, ``workload_quantiles``), concurrency, the
prefix-cache hit rate, the highest KV usage and the preemption rate. A cycle in
which no target asks for them sends exactly what it sent before.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass, field

from kvoffload.analysis.measurements import WORKLOAD_QUANTILES
from kvoffload.api.promql import pods_regex, render_matchers
from kvoffload.api.quantity import parse_duration
from kvoffload.engines.dialect import (
    CACHED_SOURCE_DEVICE,
    CACHED_SOURCE_DISK,
    CACHED_SOURCE_HOST,
    FINISHED_ABORT,
    FINISHED_STOP,
    LABEL_CPU_NUM_CHUNKS,
    LABEL_CPU_SIZE_BYTES,
    LABEL_FINISHED_REASON,
    LABEL_HTTP_STATUS,
    LABEL_OFFLOADING_BACKEND,
    LABEL_OFFLOADING_SIZE,
    LABEL_SOURCE,
    LABEL_TIER,
    SOURCE_EXTERNAL_KV_TRANSFER,
    SOURCE_LOCAL_CACHE_HIT,
    SOURCE_LOCAL_COMPUTE,
    Dialect,
)

PolicyKey = tuple[str, str]
"""(namespace, policy name)."""


@dataclass(frozen=True)
class LabelNames:
    """The series labels that tell policies and levels apart (an operator setting may rename them)."""

    policy: str = "kvoffload_io_policy"
    level: str = "kvoffload_io_level"
    config_hash: str = "kvoffload_io_config_hash"
    namespace: str = "namespace"
    pod: str = "pod"
    """The pod's name, which every scrape of Kubernetes pods adds: how an observed fleet is selected."""

    def grouping(self) -> str:
        return f"{self.namespace}, {self.policy}, {self.level}, {self.config_hash}"


@dataclass(frozen=True)
class Target:
    """One policy to measure this cycle."""

    namespace: str
    policy: str
    window: str = "2m"
    """The rate() window, a duration such as ``2m`` (spec.analysis.window)."""
    dialect: Dialect = field(kw_only=True)
    """The series the policy's engines export (``Engine.dialect``, confirmed against Prometheus)."""
    extra_matchers: str | None = None
    """Label matchers added to every query, e.g. ``cluster="prod"`` (spec.prometheus.extraMatchers)."""
    stable_hash: str | None = None
    """The config hash the stable level's pods run (``status.stable.configHash``)."""
    canary_hash: str | None = None
    """The canary level's config hash; None when no canary runs (the Stable guard, the baseline)."""
    workload: bool = False
    """True while the ladder is in its baseline: also read the workload figures (``WorkloadSample``)."""
    pods: tuple[str, ...] | None = None
    """Observe-only: the observed fleet's pods, selected by namespace and pod name (the series of a fleet the
    operator did not render carry none of its labels); they answer for both roles. None: the policy's labels."""
    payoff_since: float | None = None
    """Unix seconds from which to read the live payoff's sub-windows (the canary's step start); None: not read.
    Only with a canary: one range query per group that has such targets (``payoff_query``)."""
    payoff_step: float = 60.0
    """The sub-window, seconds: two scrapes at least (the PodMonitor scrapes every ``analysis.interval``)."""

    @property
    def key(self) -> PolicyKey:
        return (self.namespace, self.policy)


def promql_duration(window: str | float) -> str:
    """A window as a PromQL duration: whole seconds or milliseconds (``1m30s`` -> ``90s``).

    Prometheus 2.42 accepts compound durations, but a single unit is valid in every version.
    """
    seconds = parse_duration(window)
    millis = round(seconds * 1000)
    return f"{millis // 1000}s" if millis % 1000 == 0 else f"{millis}ms"


@dataclass(frozen=True)
class Query:
    """One PromQL expression of a cycle and what its answer fills in."""

    field: str
    """The VariantSample field (or ``tier_hits`` / ``config``, or a ``workload.`` figure) it fills."""
    expr: str


HISTOGRAM_FIELDS = ("workload.prompt_tokens", "workload.ttft", "workload.itl", "workload.e2e")
"""Workload queries answered with the ``WORKLOAD_QUANTILES`` of a histogram, one series per quantile."""

BUCKET_FIELDS = ("ttft_histogram", "itl_histogram")
"""Queries answered with a histogram's bucket counts, one series per ``le``: read whole into ``VariantSample``."""

QUANTILE_LABEL = "quantile"
"""The label ``workload_quantiles`` gives each series of its answer: which quantile it is."""

WORKLOAD_QUERIES = 8
"""Queries a group adds when a target in it asks for the workload figures."""

ALLOCATED_LABELS = ("pod", LABEL_TIER, LABEL_CPU_SIZE_BYTES, LABEL_CPU_NUM_CHUNKS)
"""The labels of vllm:kv_offload_config_info read into ``VariantSample.offload_allocated``."""


SCOPE_MAX_CHARS = 2000
"""The longest matcher a batch is scoped with (about 160 policies). A larger batch is most of the fleet's answer
anyway, so it asks fleet-wide, and a query's URL, which may hold the matcher twice, stays under the 8 kB that
common proxies accept."""


def scope_matcher(keys: Collection[PolicyKey], labels: LabelNames | None = None) -> str | None:
    """A matcher selecting the series of these policies (a superset across namespaces), or None when too long.

    Namespace and policy names are Kubernetes names, whose only regex metacharacter is ``.``; Prometheus
    anchors the expression.
    """
    labels = labels or LabelNames()
    if not keys:
        return None

    def one_of(label: str, values: Iterable[str]) -> str:
        names = sorted(set(values))
        if len(names) == 1:
            return f'{label}="{names[0]}"'
        escaped = (name.replace(".", "\\.") for name in names)
        return f"{label}=~`{'|'.join(escaped)}`"  # a raw string: the backslash is not escaped again

    matcher = f"{one_of(labels.namespace, (k[0] for k in keys))}, {one_of(labels.policy, (k[1] for k in keys))}"
    return matcher if len(matcher) <= SCOPE_MAX_CHARS else None


def fleet_matcher(target: Target, labels: LabelNames | None = None) -> str:
    """The matcher of an observed fleet: its namespace and its pods by name (anchored by Prometheus; a pod name's
    only regex metacharacter is ``.``). A fleet without pods matches no series."""
    labels = labels or LabelNames()
    return f'{labels.namespace}="{target.namespace}", {labels.pod}=~`{pods_regex(target.pods or ())}`'


def build_queries(
    window: str,
    dialect: Dialect,
    extra_matchers: str | None = None,
    labels: LabelNames | None = None,
    *,
    workload: bool = False,
    scope: str | None = None,
    fleet: bool = False,
) -> tuple[Query, ...]:
    """The queries of one group of policies sharing (window, dialect, extra matchers).

    Each selects the policies of ``scope`` (a ``scope_matcher``), or every policy (``<policy label>!=""``),
    and groups by namespace, policy, level and config hash. Metrics the dialect lacks are left out.
    ``workload`` adds the ``WORKLOAD_QUERIES`` of the baseline's workload figures, at the end. ``fleet``: the
    scope is one observed fleet (``fleet_matcher``), summed over its pods, grouped by namespace alone.
    """
    labels = labels or LabelNames()
    w = promql_duration(window)
    by = labels.namespace if fleet else labels.grouping()
    # Decoded and written again, never pasted: a value ending in a backslash cannot close its literal early.
    # A text that is not a list of label matchers raises TemplateError (a ValueError).
    sel = (scope or f'{labels.policy}!=""') + (f", {render_matchers(extra_matchers)}" if extra_matchers else "")

    def s(extra: str = "") -> str:
        return "{" + sel + (f", {extra}" if extra else "") + "}"

    def increase(name: str, extra: str = "", by_labels: str = by) -> str:
        return f"sum by ({by_labels}) (increase({name}{s(extra)}[{w}]))"

    def relabel(expr: str, to: str, value: str, source: str = "", regex: str = "") -> str:
        return f'label_replace({expr}, "{to}", "{value}", "{source}", "{regex}")'

    # An engine without per-token gaps (dialect.itl None) gets no ITL queries: assess() says its rows are not judged.
    itl = dialect.itl_bucket
    queries = [
        Query("requests", increase(f"{dialect.ttft}_count")),
        Query("ttft_p99", f"histogram_quantile(0.99, sum by (le, {by}) (rate({dialect.ttft_bucket}{s()}[{w}])))"),
        *([Query("itl_p99", f"histogram_quantile(0.99, sum by (le, {by}) (rate({itl}{s()}[{w}])))")] if itl else []),
        # The buckets themselves (issue 37): the judge weighs every request of both variants, not two p99s.
        Query("ttft_histogram", increase(dialect.ttft_bucket, "", f"le, {by}")),
        *([Query("itl_histogram", increase(itl, "", f"le, {by}"))] if itl else []),
        Query("kv_usage", f"avg by ({by}) (avg_over_time({dialect.kv_cache_usage}{s()}[{w}]))"),
    ]
    if dialect.prefix_cache_hits and dialect.prefix_cache_queries:
        looked_up = increase(dialect.prefix_cache_queries)
        gpu_hits = increase(dialect.prefix_cache_hits, dialect.gpu_prefix_cache_hits_matcher or "")
        # SGLang shows a cache source only from its first hit: none yet is a rate of 0, not an unknown one.
        queries.append(Query("prefix_cache_hit_rate", f"({gpu_hits} or {looked_up} * 0) / {looked_up}"))
    if dialect.cache_config_info:
        queries.append(
            Query(
                "config",
                f"group by ({by}, {LABEL_OFFLOADING_SIZE}, {LABEL_OFFLOADING_BACKEND}) "
                f"(last_over_time({dialect.cache_config_info}{s()}[{w}]))",
            )
        )
    # The error gate: every finished request by its reason; assess() counts FAILED_REASONS as failed.
    if dialect.request_success:
        queries.append(Query("finished", increase(dialect.request_success, "", f"{by}, {LABEL_FINISHED_REASON}")))
    elif dialect.requests_finished and dialect.requests_aborted:
        # Two counters read as two reasons; an engine shows its abort counter only from the first abort.
        done = relabel(increase(dialect.requests_finished), LABEL_FINISHED_REASON, FINISHED_STOP)
        aborted = relabel(increase(dialect.requests_aborted), LABEL_FINISHED_REASON, FINISHED_ABORT)
        queries.append(Query("finished", f"{done} or {aborted}"))
    if dialect.http_status_label == LABEL_HTTP_STATUS:
        queries.append(Query("http_responses", increase(dialect.http_requests, "", f"{by}, {LABEL_HTTP_STATUS}")))
    else:  # status codes, folded into vLLM's classes: 503 -> 5xx
        codes = relabel(
            f"increase({dialect.http_requests}{s()}[{w}])",
            LABEL_HTTP_STATUS,
            "${1}xx",
            dialect.http_status_label,
            "([1-5])[0-9][0-9]",
        )
        queries.append(Query("http_responses", f"sum by ({by}, {LABEL_HTTP_STATUS}) ({codes})"))
    if dialect.prompt_tokens_by_source:
        name = dialect.prompt_tokens_by_source
        external = increase(name, f'{LABEL_SOURCE}="{SOURCE_EXTERNAL_KV_TRANSFER}"')
        queries.append(Query("external_share", f"{external} / {increase(name)}"))
    if dialect.prompt_tokens_cached_by_source:
        cached, label = dialect.prompt_tokens_cached_by_source, dialect.cached_source_label
        host, disk = dialect.cached_tier_sources
        tiers = f'{label}=~"{host}|{disk}"'
        if (label, host, disk) == (LABEL_SOURCE, CACHED_SOURCE_HOST, CACHED_SOURCE_DISK):
            queries.append(Query("tier_hits", increase(cached, tiers, f"{by}, {LABEL_SOURCE}")))
        else:  # the engine's label and values, read as the vocabulary's: source host and disk
            hits = relabel(f"increase({cached}{s(tiers)}[{w}])", LABEL_SOURCE, "$1", label, "(.*)")
            hits = relabel(
                relabel(hits, LABEL_SOURCE, CACHED_SOURCE_HOST, LABEL_SOURCE, host),
                LABEL_SOURCE,
                CACHED_SOURCE_DISK,
                LABEL_SOURCE,
                disk,
            )
            queries.append(Query("tier_hits", f"sum by ({by}, {LABEL_SOURCE}) ({hits})"))
        if dialect.external_from_cached:
            # No hit yet shows no series: read that as a share of 0, not as no share.
            prompt = increase(dialect.prompt_tokens)
            queries.append(Query("external_share", f"({increase(cached, tiers)} or {prompt} * 0) / {prompt}"))
    if dialect.tiering_chunk_queries and dialect.tiering_chunk_hits:
        queries.append(Query("tier_chunk_queries", increase(dialect.tiering_chunk_queries, "", f"{by}, {LABEL_TIER}")))
        queries.append(Query("tier_chunk_hits", increase(dialect.tiering_chunk_hits, "", f"{by}, {LABEL_TIER}")))
    if dialect.offload_config_info:
        # An instant selector, not last_over_time: a pod that left (an older level) must not speak for the variant.
        queries.append(
            Query(
                "offload_allocated",
                f"group by ({by}, {', '.join(ALLOCATED_LABELS)}) ({dialect.offload_config_info}{s()})",
            )
        )
    if dialect.offload is not None:
        off = dialect.offload
        queries.append(
            Query(
                "load_bytes_per_second",
                f"{increase(off.load_bytes, off.load_selector)} / {increase(off.load_time, off.load_selector)}",
            )
        )
    if workload:
        buckets = {
            "workload.prompt_tokens": dialect.request_prompt_tokens_bucket,
            "workload.ttft": dialect.ttft_bucket,
            "workload.itl": dialect.itl_bucket,
            "workload.e2e": dialect.e2e_bucket,
        }
        queries.extend(
            Query(f, workload_quantiles(f"sum by (le, {by}) (rate({name}{s()}[{w}]))"))
            for f, name in buckets.items()
            if name is not None
        )
        hits, looked_up = increase(dialect.prefix_cache_hits), increase(dialect.prefix_cache_queries)
        queries += [
            Query(
                "workload.running_requests", f"avg by ({by}) (avg_over_time({dialect.num_requests_running}{s()}[{w}]))"
            ),
            Query("workload.prefix_cache_hit_rate", f"{hits} / {looked_up}"),
            Query("workload.kv_usage_max", f"max by ({by}) (max_over_time({dialect.kv_cache_usage}{s()}[{w}]))"),
        ]
        if dialect.num_preemptions is not None:
            queries.append(
                Query("workload.preemptions_per_second", f"sum by ({by}) (rate({dialect.num_preemptions}{s()}[{w}]))")
            )
    return tuple(queries)


PAYOFF_LABEL = "kvoffload_payoff"
"""The label ``payoff_query`` gives each series of its answer: which increment it is (``PAYOFF_SERIES``)."""

PAYOFF_SERIES = ("requests", "ttft_seconds", "computed", "local_hit", "external", "prompt")
"""Its values. ``prompt`` (every prompt token) stands in for ``computed`` where the engine splits only cached tokens
by source (SGLang): computed = prompt - GPU hits - restored."""

MAX_PAYOFF_POINTS = 120
"""Sub-windows read at most per series: a long step is read over its latest ones only (a hundred series a policy
would otherwise grow with the step)."""


def payoff_query(
    step: str,
    dialect: Dialect,
    extra_matchers: str | None = None,
    labels: LabelNames | None = None,
    *,
    scope: str | None = None,
) -> str | None:
    """One range query for the live payoff (``analysis/payoff.py``): each variant's increments over sub-windows of
    ``step`` (requests, their TTFT summed, prompt tokens by source), one series each, labelled ``PAYOFF_LABEL``.
    Evaluated at that step, the sub-windows tile the range. None where the dialect splits no prompt tokens by
    source."""
    labels = labels or LabelNames()
    by = labels.grouping()
    sel = (scope or f'{labels.policy}!=""') + (f", {render_matchers(extra_matchers)}" if extra_matchers else "")

    def inc(name: str, extra: str = "") -> str:
        return f"increase({name}{{{sel}{', ' + extra if extra else ''}}}[{step}])"

    def named(expr: str, value: str, source: str = "", regex: str = "") -> str:
        return f'label_replace({expr}, "{PAYOFF_LABEL}", "{value}", "{source}", "{regex}")'

    parts = [
        named(f"sum by ({by}) ({inc(dialect.ttft + '_count')})", "requests"),
        named(f"sum by ({by}) ({inc(dialect.ttft + '_sum')})", "ttft_seconds"),
    ]
    if dialect.prompt_tokens_by_source:
        name = dialect.prompt_tokens_by_source
        for source, value in (
            (SOURCE_LOCAL_COMPUTE, "computed"),
            (SOURCE_LOCAL_CACHE_HIT, "local_hit"),
            (SOURCE_EXTERNAL_KV_TRANSFER, "external"),
        ):
            matcher = f'{LABEL_SOURCE}="{source}"'
            parts.append(named(f"sum by ({by}) ({inc(name, matcher)})", value))
    elif dialect.external_from_cached and dialect.prompt_tokens_cached_by_source:
        cached, label = dialect.prompt_tokens_cached_by_source, dialect.cached_source_label
        host, disk = dialect.cached_tier_sources
        gpu = dialect.gpu_prefix_cache_hits_matcher or f'{label}="{CACHED_SOURCE_DEVICE}"'
        tiers = f'{label}=~"{host}|{disk}"'
        parts += [
            named(f"sum by ({by}) ({inc(dialect.prompt_tokens)})", "prompt"),
            named(f"sum by ({by}) ({inc(cached, gpu)})", "local_hit"),
            named(f"sum by ({by}) ({inc(cached, tiers)})", "external"),
        ]
    else:
        return None
    return " or ".join(parts)


def workload_quantiles(bucket_rates: str) -> str:
    """One query for every ``WORKLOAD_QUANTILES`` of a histogram, each series labelled with its quantile.

    Prometheus interpolates, not the operator: a fleet-wide baseline then reads three series a variant, not one per
    bucket (about 20). At 1,000 policies the four histograms' buckets were 75,000 series, some 60 MiB decoded at once.
    """
    return " or ".join(
        f'label_replace(histogram_quantile({q}, {bucket_rates}), "{QUANTILE_LABEL}", "{q}", "", "")'
        for q in WORKLOAD_QUANTILES
    )
