"""The KVOffloadPolicy custom resource: spec and status as pydantic v2 models.

These models are the single source of the schema: ``kvoffload crd`` turns them
into the CRD, and the operator validates every object through them. Field
names are camelCase on the wire (aliases) and snake_case in Python.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator
from pydantic.alias_generators import to_camel

from kvoffload.api.baseurl import CRD_DOT_SEGMENT, CRD_PATTERN, base_url_problem
from kvoffload.api.fields import DnsLabel, Model, Name, cel_rules
from kvoffload.api.notifications import NotificationsSpec
from kvoffload.api.podspec import PodTemplate
from kvoffload.api.promql import TemplateError, render_matchers
from kvoffload.api.quantity import parse_quantity
from kvoffload.api.rollout import AnalysisSpec, RolloutSpec
from kvoffload.api.serving import (
    DEFAULT_ENGINE,
    ENGINE_NAMES,
    KNOWN_ENGINES,
    AdoptedWorkload,
    GPUSpec,
    ModelSpec,
    OffloadSpec,
    ResourceSpec,
    WorkloadRef,
    managed_flag_rules,
)
from kvoffload.api.status import KVOffloadPolicyStatus


class SecretKeyRef(Model):
    name: DnsLabel = Field(description="Secret name, in the policy's namespace.")
    key: str = Field(min_length=1, max_length=253, description="Key holding the token.")


class PrometheusSpec(Model):
    """Where the metrics live."""

    model_config = ConfigDict(
        json_schema_extra=cel_rules(
            (f"!has(self.url) || !self.url.matches('{CRD_DOT_SEGMENT}')", "url: no . or .. path segment", ".url")
        )
    )

    url: str = Field(
        default="http://prometheus-operated.monitoring.svc:9090",
        pattern=CRD_PATTERN,
        max_length=2048,
        description="Prometheus base URL: scheme, host, optional port and path; no user, query or fragment.",
    )
    bearer_token_secret: SecretKeyRef | None = Field(default=None, description="Secret with a bearer token.")
    extra_matchers: str | None = Field(
        default=None,
        max_length=1024,
        # Each value a PromQL string literal: a backslash always escapes the next character, so a value cannot
        # end in one and close its literal early (``\"`` reads as a quote inside the string).
        pattern=r'^[a-zA-Z_][a-zA-Z0-9_]*\s*(=|!=|=~|!~)\s*"(?:[^"\\]|\\.)*"(\s*,\s*[a-zA-Z_][a-zA-Z0-9_]*\s*(=|!=|=~|!~)\s*"(?:[^"\\]|\\.)*")*$',
        description='Label matchers added to every query, e.g. cluster="prod".',
    )
    monitor_labels: dict[str, str] = Field(
        default_factory=dict,
        max_length=32,
        description="More labels for the rendered PodMonitor, e.g. the release label your Prometheus selects on.",
    )

    @field_validator("url")
    @classmethod
    def _base_url(cls, url: str) -> str:
        problem = base_url_problem(url)
        if problem is not None:
            raise ValueError(problem)
        return url

    @field_validator("extra_matchers")
    @classmethod
    def _matchers_decode(cls, text: str | None) -> str | None:
        # The pattern admits any escape; PromQL knows a few (\q is refused by Prometheus): decode it as the
        # operator will, so a value the queries could not carry is refused here, not each cycle.
        if text is not None:
            try:
                render_matchers(text)
            except TemplateError as exc:
                raise ValueError(str(exc)) from None
        return text


class KVOffloadPolicySpec(Model):
    """The desired state: a vLLM fleet and the offload ladder it should climb."""

    model_config = ConfigDict(
        json_schema_extra=cel_rules(
            (
                "self.gpu.count == self.model.tensorParallelSize",
                "gpu.count must equal model.tensorParallelSize (one engine spans its GPUs)",
                ".gpu.count",
            ),
            (
                "!has(self.rollout.pilotCpu)"
                " || quantity(string(self.rollout.pilotCpu)).isLessThan(quantity(string(self.offload.cpu)))",
                "rollout.pilotCpu must be smaller than offload.cpu",
                ".rollout.pilotCpu",
            ),
            (
                "self.rollout.maxSurge != 0 || self.rollout.canaryReplicas < self.replicas",
                "rollout.canaryReplicas must be fewer than replicas when maxSurge is 0",
                ".rollout.canaryReplicas",
            ),
            (
                "!(has(self.model.architecture) && has(self.model.configMap))",
                "set model.architecture or model.configMap, not both",
                ".model.configMap",
            ),
            (
                "has(self.workloadRef) != has(self.model.image)",
                "set model.image or workloadRef, exactly one",
                ".workloadRef",
            ),
            (
                "!has(self.workloadRef) || (!has(self.podTemplate) && !has(self.model.extraArgs)"
                " && !has(self.model.env))",
                "with workloadRef, the referenced Deployment carries the pod, flags and environment: drop "
                "podTemplate, model.extraArgs and model.env",
                ".workloadRef",
            ),
            (
                "!has(self.rollout.preflight) || !has(self.rollout.preflight.promptTokens)"
                " || self.rollout.preflight.promptTokens <= self.model.maxModelLen",
                "rollout.preflight.promptTokens must be at most model.maxModelLen",
                ".rollout.preflight",
            ),
            *managed_flag_rules(),
        )
    )

    engine: str = Field(
        default=DEFAULT_ENGINE,
        description="The serving engine, which renders its own command line, offload settings and metric queries: "
        + ", ".join(f"{e.name} ({e.title})" for e in KNOWN_ENGINES)
        + ". docs/engines.md says what each supports.",
        json_schema_extra={"enum": list(ENGINE_NAMES)},
    )
    model: ModelSpec = Field(description="The model and engine.")
    gpu: GPUSpec = Field(description="The GPU class and count per replica.")
    replicas: int = Field(ge=1, le=1000, description="Engine replicas in total.")
    resources: ResourceSpec = Field(description="Host resources per replica.")
    offload: OffloadSpec = Field(description="The offload tiers.")
    rollout: RolloutSpec = Field(default_factory=RolloutSpec, description="The staged rollout.")
    analysis: AnalysisSpec = Field(default_factory=AnalysisSpec, description="The analysis rules.")
    prometheus: PrometheusSpec = Field(default_factory=PrometheusSpec, description="The metrics source.")
    pod_template: PodTemplate | None = Field(
        default=None,
        description="What to add to the engine pods (Secrets as variables, volumes, scheduling, labels), merged "
        "under what the operator manages.",
    )
    workload_ref: WorkloadRef | None = Field(
        default=None,
        description="A Deployment the team already runs, instead of model.image: each level is its pod template "
        "with only the offload flags, memory, /dev/shm and tier volumes changed; the operator scales it down as "
        "its own engines become Ready, and back up before they go.",
    )
    notifications: NotificationsSpec | None = Field(
        default=None,
        description="Tell the cluster admin's webhook sinks, by name, of promotions, rollbacks, pauses, a step "
        "awaiting kvoffload.io/promote and an invalid spec (absent: no notification). Changing it starts no "
        "new ladder.",
    )

    @field_validator("engine")
    @classmethod
    def _known_engine(cls, name: str) -> str:
        if name not in ENGINE_NAMES:
            raise ValueError(f"{name!r} is no engine the operator knows: name one of {', '.join(ENGINE_NAMES)}")
        return name

    @model_validator(mode="after")
    def _cross_field(self) -> KVOffloadPolicySpec:
        if self.gpu.count != self.model.tensor_parallel_size:
            raise ValueError("gpu.count must equal model.tensorParallelSize (one engine spans its GPUs)")
        if self.rollout.pilot_cpu is not None and parse_quantity(self.rollout.pilot_cpu) >= parse_quantity(
            self.offload.cpu
        ):
            raise ValueError("rollout.pilotCpu must be smaller than offload.cpu")
        if self.rollout.canary_replicas >= self.replicas and self.rollout.max_surge == 0:
            raise ValueError("rollout.canaryReplicas must be fewer than replicas when maxSurge is 0")
        if self.model.architecture is not None and self.model.config_map is not None:
            raise ValueError("set model.architecture or model.configMap, not both")
        if (self.workload_ref is None) == (self.model.image is None):
            raise ValueError("set model.image or workloadRef, exactly one")
        if self.workload_ref is not None and (self.pod_template is not None or self.model.extra_args or self.model.env):
            raise ValueError(
                "with workloadRef, the referenced Deployment carries the pod, flags and environment: drop "
                "podTemplate, model.extraArgs and model.env"
            )
        tokens = self.rollout.preflight.prompt_tokens if self.rollout.preflight is not None else None
        if tokens is not None and tokens > self.model.max_model_len:
            raise ValueError("rollout.preflight.promptTokens must be at most model.maxModelLen")
        return self

    _workload: AdoptedWorkload | None = PrivateAttr(default=None)

    @property
    def workload(self) -> AdoptedWorkload | None:
        """The Deployment spec.workloadRef names, once read (None before, and without workloadRef)."""
        return self._workload

    def with_workload(self, workload: AdoptedWorkload) -> KVOffloadPolicySpec:
        """This spec with its referenced Deployment read."""
        if self.workload_ref is None:
            raise ValueError("only a spec with workloadRef adopts a Deployment")
        spec = self.model_copy()
        spec._workload = workload
        return spec

    @property
    def image(self) -> str | None:
        """The engine image: model.image, else the referenced container's (None until it is read)."""
        if self.model.image is not None:
            return self.model.image
        return self._workload.image if self._workload is not None else None


class ObjectMeta(BaseModel):
    """The parts of metadata the operator reads; the rest passes through."""

    model_config = ConfigDict(extra="allow", populate_by_name=True, alias_generator=to_camel)

    name: Name = Field(description="Policy name.")
    namespace: str = Field(default="default", description="Policy namespace.")
    uid: str | None = None
    generation: int | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)


class KVOffloadPolicy(BaseModel):
    """A whole KVOffloadPolicy object."""

    model_config = ConfigDict(populate_by_name=True, extra="forbid")

    api_version: Literal["kvoffload.io/v1alpha1"] = Field(alias="apiVersion")
    kind: Literal["KVOffloadPolicy"]
    metadata: ObjectMeta
    spec: KVOffloadPolicySpec
    status: KVOffloadPolicyStatus | None = None
