"""A cycle's custom metrics: the policy's templates read, its queries asked, the results folded into the verdict.

Templates (KVOffloadAnalysisTemplate, cluster-scoped) are read from the API server at every analysis, one GET
each, so a change reaches every policy that names one at its next analysis, and each result says which
generation judged it (``template: name@generation``).

A template that is not there (yet: GitOps may apply the policy first) does not make the policy Invalid, whose
spec is right: the analysis is Inconclusive, with a result ``template/<name>`` saying what is missing, so a
step neither promotes nor rolls back on missing gates, and the policy pauses after ``maxInconclusive``
cycles, naming the template. A template that does not validate (an older operator's, or one admitted while
the webhook was down) is reported the same way.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from datetime import datetime

from pydantic import ValidationError

from kvoffload.analysis.assess import REQUESTS, Assessment
from kvoffload.analysis.custom import CustomResult, judge_custom, with_custom
from kvoffload.analysis.customquery import read_custom
from kvoffload.analysis.prometheus import LabelNames, MetricsProvider, Target
from kvoffload.api.analysistemplate import KVOffloadAnalysisTemplate, metric_sources
from kvoffload.api.errors import errors_from
from kvoffload.api.types import AnalysisStatus, KVOffloadPolicySpec, MetricResult
from kvoffload.controller.gateway import KubernetesGateway
from kvoffload.rollout.plan import AnalysisSubject

log = logging.getLogger(__name__)

TEMPLATE_RESULT_PREFIX = "template/"
"""The result that stands for a template that could not be read: ``template/<name>``."""


async def read_templates(
    gateway: KubernetesGateway, names: Sequence[str]
) -> tuple[list[KVOffloadAnalysisTemplate], list[CustomResult]]:
    """The templates named, in order, and a not-judged gated result for each one missing or invalid."""
    found: list[KVOffloadAnalysisTemplate] = []
    missing: list[CustomResult] = []
    for name in names:
        obj = await gateway.read_analysis_template(name)
        problem = None
        if obj is None:
            problem = f"KVOffloadAnalysisTemplate {name} not found: analysis waits for it"
        else:
            try:
                found.append(KVOffloadAnalysisTemplate.model_validate(obj))
            except ValidationError as exc:
                problem = f"KVOffloadAnalysisTemplate {name} is invalid: " + "; ".join(map(str, errors_from(exc)))
        if problem is not None:
            version = None if obj is None else f"{name}@{(obj.get('metadata') or {}).get('generation', 0)}"
            result = MetricResult(
                name=f"{TEMPLATE_RESULT_PREFIX}{name}", message=problem, dry_run=False, template=version or name
            )
            missing.append(CustomResult(result, gated=True))
    return found, missing


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
) -> Assessment:
    """``assessment`` with the policy's custom metrics judged beside it (see the module and ``analysis/custom``).

    May raise the gateway's errors (reading a template), as any read of the cycle does."""
    analysis = spec.analysis
    templates, unread = await read_templates(gateway, [ref.name for ref in analysis.templates])
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
        readings = await asyncio.to_thread(
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
