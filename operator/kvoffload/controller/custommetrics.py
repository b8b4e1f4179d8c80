"""A cycle's custom metrics: the policy's templates read, its queries asked, the results folded into the verdict.

Templates (KVOffloadAnalysisTemplate, cluster-scoped) are read from the API server at every analysis, one GET
each, so a change reaches every policy that names one at its next analysis, and each result says which
generation judged it (``template: name@generation``).

A template that is not there (yet: GitOps may apply the policy first) does not make the policy Invalid, whose
spec is right: the analysis is Inconclusive, with a result ``template/<name>`` saying what is missing, so a
step neither promotes nor rolls back on missing gates, and the policy pauses after ``maxInconclusive``
cycles, naming the template. A template the operator may not read (403: its RBAC) or the API server would not
give (5xx) is reported the same way, naming the error, and the cycle goes on to decide(). A template that does
not validate (an older operator's, or one admitted while the webhook was down) is reported the same way; where
only some of its metrics are bad, each bad metric is reported on its own (``template/<name>/<metric>``) and the
rest judged: a bad gated metric is not judged (Inconclusive), a bad dry-run metric is shown and never gates.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from kvoffload.analysis.assess import REQUESTS, Assessment
from kvoffload.analysis.custom import CustomResult, judge_custom, with_custom
from kvoffload.analysis.customquery import read_custom
from kvoffload.analysis.hub import in_analysis_pool
from kvoffload.analysis.prometheus import MetricsProvider
from kvoffload.analysis.queries import LabelNames, Target
from kvoffload.api.analysistemplate import CustomMetric, KVOffloadAnalysisTemplate, metric_sources
from kvoffload.api.errors import errors_from
from kvoffload.api.status import AnalysisStatus, MetricResult
from kvoffload.api.types import KVOffloadPolicySpec
from kvoffload.controller.apierrors import GatewayError
from kvoffload.controller.gateway import KubernetesGateway, Obj
from kvoffload.rollout.plan import AnalysisSubject

log = logging.getLogger(__name__)

TEMPLATE_RESULT_PREFIX = "template/"
"""The result that stands for a template that could not be read: ``template/<name>``."""


async def read_templates(
    gateway: KubernetesGateway, names: Sequence[str], on_read_error: Callable[[GatewayError], None] | None = None
) -> tuple[list[KVOffloadAnalysisTemplate], list[CustomResult]]:
    """The templates named, in order, and a not-judged result for each one missing, unreadable or invalid, and
    for each bad metric of a template otherwise valid (gated unless that metric is a dry run).

    Never raises the gateway's errors: a template the operator may not read (403) or the API server would not
    give (5xx) is not judged, as a missing one is, so the cycle goes on to decide() (a hard failure still rolls
    back at once) and the policy pauses after ``maxInconclusive`` cycles naming the template and the error."""
    found: list[KVOffloadAnalysisTemplate] = []
    missing: list[CustomResult] = []
    for name in names:
        obj: Obj | None = None
        problem = None
        try:
            obj = await gateway.read_analysis_template(name)
        except GatewayError as exc:
            log.warning("KVOffloadAnalysisTemplate %s could not be read: %s", name, exc)
            if on_read_error is not None:
                on_read_error(exc)
            problem = f"KVOffloadAnalysisTemplate {name} could not be read: {exc}: analysis waits for it"
        else:
            if obj is None:
                problem = f"KVOffloadAnalysisTemplate {name} not found: analysis waits for it"
            else:
                template, bad, problem = _parse_template(name, obj)
                if template is not None:
                    found.append(template)
                missing += bad
        if problem is not None:
            version = None if obj is None else _version_of(name, obj)
            result = MetricResult(
                name=f"{TEMPLATE_RESULT_PREFIX}{name}", message=problem, dry_run=False, template=version or name
            )
            missing.append(CustomResult(result, gated=True))
    return found, missing


def _version_of(name: str, obj: Obj) -> str:
    return f"{name}@{(obj.get('metadata') or {}).get('generation', 0)}"


def _parse_template(name: str, obj: Obj) -> tuple[KVOffloadAnalysisTemplate | None, list[CustomResult], str | None]:
    """The template with its valid metrics, a not-judged result for each bad metric, and the problem that makes
    the whole template invalid (None when there is none).

    Each metric is judged on its own: one bad metric does not take its template's other gates away, and a bad
    dry-run metric is shown, never gated (a dry run never decides, even by being wrong)."""
    try:
        return KVOffloadAnalysisTemplate.model_validate(obj), [], None
    except ValidationError as exc:
        whole = f"KVOffloadAnalysisTemplate {name} is invalid: " + "; ".join(map(str, errors_from(exc)))
    spec = obj.get("spec")
    raw_metrics = spec.get("metrics") if isinstance(spec, dict) else None
    if not isinstance(spec, dict) or not isinstance(raw_metrics, list):
        return None, [], whole
    good: list[Any] = []
    bad: list[CustomResult] = []
    version = _version_of(name, obj)
    for i, raw in enumerate(raw_metrics):
        try:
            CustomMetric.model_validate(raw)
        except ValidationError as exc:
            dry_run = isinstance(raw, dict) and raw.get("dryRun") is True
            metric_name = raw.get("name") if isinstance(raw, dict) else None
            label = metric_name if isinstance(metric_name, str) and metric_name else f"metrics[{i}]"
            why = "; ".join(map(str, errors_from(exc, prefix=("spec", "metrics", i))))
            message = f"KVOffloadAnalysisTemplate {name} metric {label} is invalid: {why}: not judged"
            result = MetricResult(
                name=f"{TEMPLATE_RESULT_PREFIX}{name}/{label}",
                message=f"dry run: {message}" if dry_run else message,
                dry_run=dry_run,
                template=version,
            )
            bad.append(CustomResult(result, gated=not dry_run))
        else:
            good.append(raw)
    if not bad:
        return None, [], whole  # the problem is not in a metric: the template as a whole is invalid
    try:
        template = KVOffloadAnalysisTemplate.model_validate({**obj, "spec": {**spec, "metrics": good}})
    except ValidationError:
        return None, [], whole
    return template, bad, None


async def judged_with_custom(
    *,
    gateway: KubernetesGateway,
    provider: MetricsProvider,
    spec: KVOffloadPolicySpec,
    target: Target,
    subject: AnalysisSubject,
    assessment: Assessment,
    previous: AnalysisStatus | None,
    now: datetime,
    on_read_error: Callable[[GatewayError], None] | None = None,
) -> Assessment:
    """``assessment`` with the policy's custom metrics judged beside it (see the module and ``analysis/custom``).

    A template that cannot be read is a not-judged result (``read_templates``), never an error of the cycle."""
    analysis = spec.analysis
    templates, unread = await read_templates(gateway, [ref.name for ref in analysis.templates], on_read_error)
    try:
        sources = metric_sources(list(analysis.metrics), templates)
    except ValueError as exc:
        clash = MetricResult(name="customMetrics", message=str(exc), dry_run=False)
        return with_custom(assessment, [*unread, CustomResult(clash, gated=True)])
    requests = assessment.metric(REQUESTS)
    if requests is None:  # no measurements at all (Prometheus down): nothing to ask it either
        readings = []
    else:
        labels = getattr(provider, "labels", None)
        readings = await in_analysis_pool(  # not asyncio's default executor: the Kubernetes API calls use it
            read_custom, provider, sources, target, labels if isinstance(labels, LabelNames) else None
        )
    results = judge_custom(
        readings,
        previous,
        analysis,
        now,
        has_canary=target.canary_hash is not None,
        stable_side=subject.stable_side,
        comparing=subject.comparing,
        enough=requests is not None and requests.passed is True,
    )
    return with_custom(assessment, [*unread, *results])
