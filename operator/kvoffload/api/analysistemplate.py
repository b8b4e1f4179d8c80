"""Custom metrics (``spec.analysis.metrics[]``) and the cluster-scoped KVOffloadAnalysisTemplate that shares them.

A custom metric is a PromQL template (``api/promql.py``: ``{{ selector }}`` and ``{{ window }}`` filled in by
the operator), judged either against absolute bounds or as canary/stable, each with its own
``sustainedFor``; a ``dryRun`` metric is evaluated and shown, and never decides. A platform team writes its
gates once in a KVOffloadAnalysisTemplate and policies name it in ``spec.analysis.templates[]``; the
operator reads the template at every analysis, so a change reaches its policies at their next cycle, and
each result in status names the template and generation that judged it (``template: name@generation``).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from kvoffload.api.fields import Duration, Model, Name, cel_rules
from kvoffload.api.promql import TemplateError, check_template

TEMPLATE_KIND = "KVOffloadAnalysisTemplate"
TEMPLATE_PLURAL = "kvoffloadanalysistemplates"
TEMPLATE_SINGULAR = "kvoffloadanalysistemplate"
TEMPLATE_SHORT_NAMES = ["kvoat"]

MAX_METRICS = 16
"""Custom metrics per policy or template: each costs one or two queries per policy per cycle."""

METRIC_NAME_PATTERN = r"^[a-zA-Z][a-zA-Z0-9_-]{0,62}$"


class Comparison(StrEnum):
    ABSOLUTE = "absolute"
    """The subject's value (canary, else stable) is held to ``min``/``max``."""
    RATIO = "ratio"
    """canary / stable is held to ``min``/``max``; judged only while a canary and a stable side both run."""


def _checked_query(query: str) -> str:
    try:
        check_template(query)
    except TemplateError as exc:
        raise ValueError(str(exc)) from None
    return query


_BOUND_RULE = ("has(self.min) || has(self.max)", "give min, max or both", ".max")
_ORDER_RULE = ("!has(self.min) || !has(self.max) || self.min <= self.max", "min must be at most max", ".min")


class CustomMetric(Model):
    """One PromQL gate of your own (or, with dryRun, a reading): see docs/design.md, "Custom metrics"."""

    model_config = ConfigDict(json_schema_extra=cel_rules(_BOUND_RULE, _ORDER_RULE))

    # maxLength bounds the cost the API server estimates for the uniqueness rule (kube-apiserver v1.37 refused it
    # without: "estimated rule cost exceeds budget by factor of 8.1x").
    name: str = Field(
        max_length=63,
        pattern=METRIC_NAME_PATTERN,
        description="Its name in status.lastAnalysis.metrics and on the dashboard; unique across the policy.",
    )
    query: Annotated[str, AfterValidator(_checked_query)] = Field(
        min_length=1,
        max_length=4096,
        description="PromQL with {{ selector }} (the operator's matchers for one variant's engines, written inside "
        "braces) in every vector selector, and {{ window }} (analysis.window); it must give one number.",
    )
    comparison: Comparison = Field(
        default=Comparison.ABSOLUTE,
        description="absolute: the canary's value (the stable's without a canary) against min/max; ratio: "
        "canary / stable against min/max.",
    )
    min: float | None = Field(default=None, description="Least value (or ratio) that passes.")
    max: float | None = Field(default=None, description="Greatest value (or ratio) that passes.")
    sustained_for: Duration | None = Field(
        default=None, description="How long a breach must last to roll back; default: analysis.sustainedFor."
    )
    dry_run: bool = Field(
        default=False, description="true: evaluated and shown in status and on the dashboard, never decides."
    )

    @model_validator(mode="after")
    def _bounds(self) -> CustomMetric:
        if self.min is None and self.max is None:
            raise ValueError("give min, max or both")
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError("min must be at most max")
        return self


def _unique_names(metrics: list[CustomMetric]) -> list[CustomMetric]:
    names = [m.name for m in metrics]
    if len(set(names)) != len(names):
        raise ValueError("metric names must be unique")
    return metrics


CustomMetrics = Annotated[
    list[CustomMetric],
    AfterValidator(_unique_names),
    Field(
        default_factory=list,
        max_length=MAX_METRICS,
        json_schema_extra=cel_rules(
            ("self.all(m, self.exists_one(n, n.name == m.name))", "metric names must be unique")
        ),
    ),
]


class TemplateRef(Model):
    """A KVOffloadAnalysisTemplate by name (cluster-scoped)."""

    name: Name = Field(description="The KVOffloadAnalysisTemplate's metadata.name.")


class AnalysisTemplateSpec(Model):
    """The gates a platform team defines once."""

    metrics: CustomMetrics = Field(description="The template's custom metrics.")


class TemplateMeta(BaseModel):
    """The parts of a template's metadata the operator reads."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    name: str
    generation: int | None = None


class KVOffloadAnalysisTemplate(BaseModel):
    """A whole KVOffloadAnalysisTemplate object (cluster-scoped, no status)."""

    model_config = ConfigDict(populate_by_name=True, extra="forbid")

    api_version: Literal["kvoffload.io/v1alpha1"] = Field(alias="apiVersion")
    kind: Literal["KVOffloadAnalysisTemplate"]
    metadata: TemplateMeta
    spec: AnalysisTemplateSpec

    @property
    def version(self) -> str:
        """``name@generation``, as status names the template that judged a result."""
        return f"{self.metadata.name}@{self.metadata.generation if self.metadata.generation is not None else 0}"


def metric_sources(inline: list[CustomMetric], templates: list[KVOffloadAnalysisTemplate]) -> list[MetricSource]:
    """Every custom metric a policy is judged on: its templates' in the order named, then its own. A name that
    two of them define raises ValueError naming both."""
    found: list[MetricSource] = []
    seen: dict[str, str] = {}
    for template in templates:
        found += [MetricSource(metric=m, template=template.version) for m in template.spec.metrics]
    found += [MetricSource(metric=m) for m in inline]
    for source in found:
        where = source.template or "spec.analysis.metrics"
        if source.metric.name in seen:
            raise ValueError(f"metric {source.metric.name!r} is defined by both {seen[source.metric.name]} and {where}")
        seen[source.metric.name] = where
    return found


class MetricSource(BaseModel):
    """A custom metric with where it came from."""

    model_config = ConfigDict(frozen=True)

    metric: CustomMetric
    template: str | None = None
    """``name@generation`` of its KVOffloadAnalysisTemplate; None for the policy's own."""
