"""The parts of a Kubernetes pod a policy may shape: environment, volumes, scheduling, metadata.

The shapes follow core/v1 (field names, enums and bounds), cut to what an engine pod needs. Every model
refuses unknown fields, so what the operator never passes on (securityContext, containers, hostNetwork, a
projected service account token...) is an error naming its path, never silently dropped. What only shows
once rendered (label syntax, collisions with what the operator manages) is judged in ``policy/renderable.py``,
and what the cluster admin must allow (hostPath, service accounts, priority and runtime classes, Secret volumes,
key-less tolerations, service mesh keys) in ``policy/tenancy.py``.
"""

from __future__ import annotations

from typing import Annotated, Literal, Self

from pydantic import AfterValidator, ConfigDict, Field, model_validator
from pydantic.config import JsonDict

from kvoffload.api.fields import (
    LOADER_ENV,
    LOADER_ENV_PREFIXES,
    DnsLabel,
    Model,
    Name,
    NonNegativeQuantity,
    cel_list,
    cel_rules,
)

# --- environment ------------------------------------------------------------------------


def _not_a_loader_variable(name: str) -> str:
    if name.startswith(LOADER_ENV_PREFIXES) or name in LOADER_ENV:
        raise ValueError(f"{name} changes what code the engine loads; a policy may not set it")
    return name


EnvName = Annotated[
    str,
    Field(
        min_length=1,
        max_length=253,
        pattern=r"^[-._a-zA-Z][-._a-zA-Z0-9]*$",
        description="Variable name; none that changes what code the engine loads (LD_*, PYTHONPATH, ...).",
        json_schema_extra=cel_rules(
            (
                f"!self.startsWith('LD_') && !(self in {cel_list(LOADER_ENV)})",
                "may not change what code the engine loads (LD_*, " + ", ".join(sorted(LOADER_ENV)) + ")",
            )
        ),
    ),
    AfterValidator(_not_a_loader_variable),
]


def _exactly_one(*fields: str) -> JsonDict:
    """The CEL twin of :func:`_count_set`: exactly one of ``fields`` is set."""
    count = " + ".join(f"(has(self.{f}) ? 1 : 0)" for f in fields)
    return cel_rules((f"{count} == 1", f"set exactly one of {', '.join(fields)}"))


def _count_set(model: Model, *fields: str) -> None:
    if sum(getattr(model, f) is not None for f in fields) != 1:
        names = [type(model).model_fields[f].alias or f for f in fields]
        raise ValueError(f"set exactly one of {', '.join(names)}")


class EnvVar(Model):
    """An extra environment variable for the engine container (plain value only)."""

    name: EnvName
    value: str = Field(default="", max_length=32768, description="Variable value.")


class KeySelector(Model):
    """One key of a Secret or ConfigMap in the policy's namespace."""

    name: Name = Field(description="Secret or ConfigMap name, in the policy's namespace.")
    key: str = Field(min_length=1, max_length=253, pattern=r"^[-._a-zA-Z0-9]+$", description="The key.")
    optional: bool | None = Field(default=None, description="Start the pod even when it is missing.")


# The downward API fields the kubelet resolves for an environment variable (core/v1 validation).
_FIELD_PATH = (
    r"^(metadata\.(name|namespace|uid)|metadata\.(labels|annotations)\['[^']{1,316}'\]"
    r"|spec\.(nodeName|serviceAccountName)|status\.(hostIP|hostIPs|podIP|podIPs))$"
)


class ObjectFieldSelector(Model):
    field_path: str = Field(max_length=400, pattern=_FIELD_PATH, description="A downward API field of the pod.")
    api_version: str | None = Field(default=None, pattern=r"^v1$", description="Always v1.")


class ResourceFieldSelector(Model):
    resource: Literal[
        "limits.cpu",
        "limits.memory",
        "limits.ephemeral-storage",
        "requests.cpu",
        "requests.memory",
        "requests.ephemeral-storage",
    ] = Field(description="A resource of the engine container.")
    container_name: str | None = Field(
        default=None,
        pattern=r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$",
        description="The engine container: vllm, or sglang for spec.engine sglang.",
    )
    divisor: NonNegativeQuantity | None = Field(default=None, description="Unit the value is given in.")


class EnvVarSource(Model):
    """Where a variable's value comes from: exactly one source."""

    model_config = ConfigDict(
        json_schema_extra=_exactly_one("secretKeyRef", "configMapKeyRef", "fieldRef", "resourceFieldRef")
    )

    secret_key_ref: KeySelector | None = Field(default=None, description="A key of a Secret (e.g. HF_TOKEN).")
    config_map_key_ref: KeySelector | None = Field(default=None, description="A key of a ConfigMap.")
    field_ref: ObjectFieldSelector | None = Field(default=None, description="A field of the pod.")
    resource_field_ref: ResourceFieldSelector | None = Field(default=None, description="A resource of the engine.")

    @model_validator(mode="after")
    def _one_source(self) -> Self:
        _count_set(self, "secret_key_ref", "config_map_key_ref", "field_ref", "resource_field_ref")
        return self


class PodEnvVar(Model):
    """An environment variable with a plain value or one taken from a Secret, a ConfigMap or the pod."""

    model_config = ConfigDict(
        json_schema_extra=cel_rules(
            ("!(has(self.valueFrom) && has(self.value) && self.value != '')", "set value or valueFrom, not both")
        )
    )

    name: EnvName
    value: str | None = Field(default=None, max_length=32768, description="A plain value.")
    value_from: EnvVarSource | None = Field(default=None, description="Where the value comes from.")

    @model_validator(mode="after")
    def _value_or_source(self) -> Self:
        if self.value_from is not None and self.value:
            raise ValueError("set value or valueFrom, not both")
        return self


def _not_a_loader_prefix(prefix: str) -> str:
    # A prefix that could complete into a loader variable (LD_ + PRELOAD, PYTHON + PATH) is refused outright.
    if prefix.startswith(LOADER_ENV_PREFIXES) or any(p.startswith(prefix) for p in (*LOADER_ENV_PREFIXES, *LOADER_ENV)):
        raise ValueError(f"{prefix!r} could complete into a variable that changes what code the engine loads")
    return prefix


class EnvFromRef(Model):
    name: Name = Field(description="Secret or ConfigMap name, in the policy's namespace.")
    optional: bool | None = Field(default=None, description="Start the pod even when it is missing.")


class EnvFromSource(Model):
    """Every key of a Secret or ConfigMap as a variable, under a prefix. The operator cannot see those keys
    when it judges the policy, so the prefix is required, and may not complete into a variable that changes
    what code the engine loads (a key named PRELOAD under LD_)."""

    model_config = ConfigDict(json_schema_extra=_exactly_one("configMapRef", "secretRef"))

    prefix: Annotated[str, AfterValidator(_not_a_loader_prefix)] = Field(
        min_length=1,
        max_length=253,
        pattern=r"^[-._a-zA-Z][-._a-zA-Z0-9]*$",
        description="Prepended to every key (e.g. APP_); none that could complete into LD_* or PYTHON*.",
        json_schema_extra=cel_rules(
            (
                f"!self.startsWith('LD_') && !({cel_list(LOADER_ENV | {'LD_'})}.exists(v, v.startsWith(self)))",
                "could complete into a variable that changes what code the engine loads (LD_*, PYTHON*, ...)",
            )
        ),
    )
    config_map_ref: EnvFromRef | None = Field(default=None, description="A ConfigMap.")
    secret_ref: EnvFromRef | None = Field(default=None, description="A Secret.")

    @model_validator(mode="after")
    def _one_source(self) -> Self:
        _count_set(self, "config_map_ref", "secret_ref")
        return self


# --- volumes ----------------------------------------------------------------------------


class EmptyDirSource(Model):
    medium: Literal["", "Memory"] = Field(default="", description="Storage medium.")
    size_limit: NonNegativeQuantity | None = Field(default=None, description="Size limit.")


class PVCSource(Model):
    claim_name: DnsLabel = Field(description="PersistentVolumeClaim name.")
    read_only: bool = Field(default=False, description="Mount read-only.")


class HostPathSource(Model):
    path: str = Field(min_length=1, max_length=4096, pattern=r"^/", description="Absolute path on the node.")
    type: Literal["", "Directory", "DirectoryOrCreate"] = Field(default="DirectoryOrCreate", description="Type.")


RelativePath = Annotated[
    str,
    Field(
        min_length=1,
        max_length=1024,
        pattern=r"^[^/]",
        description="A relative path without '..'.",
        json_schema_extra=cel_rules(("!self.matches('(^|/)[.][.](/|$)')", "may not contain '..'")),
    ),
]


def _no_dot_dot(path: str) -> str:
    if ".." in path.split("/"):
        raise ValueError("may not contain '..'")
    return path


class KeyToPath(Model):
    key: str = Field(min_length=1, max_length=253, description="The key to project.")
    path: Annotated[RelativePath, AfterValidator(_no_dot_dot)] = Field(description="File it becomes.")
    mode: int | None = Field(default=None, ge=0, le=0o777, description="File mode bits.")


class SecretVolumeSource(Model):
    secret_name: Name = Field(description="Secret name, in the policy's namespace.")
    items: list[KeyToPath] = Field(default_factory=list, max_length=64, description="Keys to project; default all.")
    default_mode: int | None = Field(default=None, ge=0, le=0o777, description="File mode bits.")
    optional: bool | None = Field(default=None, description="Start the pod even when it is missing.")


class ConfigMapVolumeSource(Model):
    name: Name = Field(description="ConfigMap name, in the policy's namespace.")
    items: list[KeyToPath] = Field(default_factory=list, max_length=64, description="Keys to project; default all.")
    default_mode: int | None = Field(default=None, ge=0, le=0o777, description="File mode bits.")
    optional: bool | None = Field(default=None, description="Start the pod even when it is missing.")


_VOLUME_SOURCES = ("empty_dir", "secret", "config_map", "persistent_volume_claim", "host_path")


class PodVolume(Model):
    """A volume of the engine pod: exactly one source. No projected service account token: the engine pod
    holds no Kubernetes credentials (docs/security.md)."""

    model_config = ConfigDict(
        json_schema_extra=_exactly_one("emptyDir", "secret", "configMap", "persistentVolumeClaim", "hostPath")
    )

    name: DnsLabel = Field(description="Volume name, unique in the pod.")
    empty_dir: EmptyDirSource | None = Field(default=None, description="Scratch space.")
    secret: SecretVolumeSource | None = Field(default=None, description="A Secret's keys as files.")
    config_map: ConfigMapVolumeSource | None = Field(default=None, description="A ConfigMap's keys as files.")
    persistent_volume_claim: PVCSource | None = Field(default=None, description="A claim, e.g. a model cache.")
    host_path: HostPathSource | None = Field(
        default=None, description="A node path, only under roots a cluster admin allowed."
    )

    @model_validator(mode="after")
    def _one_source(self) -> Self:
        _count_set(self, *_VOLUME_SOURCES)
        return self


class VolumeMount(Model):
    """A mount of a ``podTemplate.volumes`` entry into the engine container."""

    name: DnsLabel = Field(description="One of podTemplate.volumes.")
    mount_path: str = Field(min_length=2, max_length=1024, pattern=r"^/", description="Absolute path.")
    read_only: bool = Field(default=False, description="Mount read-only.")
    sub_path: Annotated[RelativePath, AfterValidator(_no_dot_dot)] | None = Field(
        default=None, description="A path inside the volume to mount instead of its root."
    )


class LocalObjectReference(Model):
    name: Name = Field(description="Object name, in the policy's namespace.")


# --- scheduling --------------------------------------------------------------------------

LabelKey = Annotated[str, Field(min_length=1, max_length=316, description="A label key.")]
_Values = Annotated[list[Annotated[str, Field(max_length=63)]], Field(max_length=64)]


class LabelSelectorRequirement(Model):
    key: LabelKey
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"] = Field(description="How values apply.")
    values: _Values = Field(default_factory=list, description="Values; none for Exists and DoesNotExist.")


class LabelSelector(Model):
    match_labels: dict[str, str] = Field(default_factory=dict, max_length=64, description="Labels to match.")
    match_expressions: list[LabelSelectorRequirement] = Field(
        default_factory=list, max_length=32, description="Requirements to match."
    )


class NodeSelectorRequirement(Model):
    key: LabelKey
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"] = Field(description="How values apply.")
    values: _Values = Field(default_factory=list, description="Values; one integer for Gt and Lt.")


class NodeSelectorTerm(Model):
    match_expressions: list[NodeSelectorRequirement] = Field(
        default_factory=list, max_length=32, description="Requirements on node labels."
    )
    match_fields: list[NodeSelectorRequirement] = Field(
        default_factory=list, max_length=32, description="Requirements on node fields."
    )


class NodeSelector(Model):
    node_selector_terms: list[NodeSelectorTerm] = Field(
        min_length=1, max_length=32, description="Terms, any of which must match."
    )


class PreferredSchedulingTerm(Model):
    weight: int = Field(ge=1, le=100, description="Weight, 1 to 100.")
    preference: NodeSelectorTerm = Field(description="The preferred nodes.")


class NodeAffinity(Model):
    required_during_scheduling_ignored_during_execution: NodeSelector | None = Field(
        default=None, description="Nodes the pod must run on."
    )
    preferred_during_scheduling_ignored_during_execution: list[PreferredSchedulingTerm] = Field(
        default_factory=list, max_length=32, description="Nodes the pod prefers."
    )


# No namespaceSelector: an empty one selects every namespace, and any other reaches past the tenant's (the own
# namespace is the default). namespaces may name only the policy's own, which the schema cannot see, so
# policy/renderable.py judges it (issue 33).
class PodAffinityTerm(Model):
    """A pod (anti-)affinity term, over pods of the policy's own namespace."""

    label_selector: LabelSelector | None = Field(default=None, description="The pods to be near or away from.")
    namespaces: list[DnsLabel] = Field(
        default_factory=list, max_length=64, description="Only the policy's own namespace, the default."
    )
    topology_key: LabelKey = Field(description="The node label that defines 'near'.")
    match_label_keys: list[LabelKey] = Field(default_factory=list, max_length=32, description="Keys to match.")
    mismatch_label_keys: list[LabelKey] = Field(default_factory=list, max_length=32, description="Keys to differ.")


class WeightedPodAffinityTerm(Model):
    weight: int = Field(ge=1, le=100, description="Weight, 1 to 100.")
    pod_affinity_term: PodAffinityTerm = Field(description="The term.")


class PodAffinity(Model):
    required_during_scheduling_ignored_during_execution: list[PodAffinityTerm] = Field(
        default_factory=list, max_length=32, description="Terms that must hold."
    )
    preferred_during_scheduling_ignored_during_execution: list[WeightedPodAffinityTerm] = Field(
        default_factory=list, max_length=32, description="Terms preferred."
    )


class Affinity(Model):
    node_affinity: NodeAffinity | None = Field(default=None, description="Node affinity.")
    pod_affinity: PodAffinity | None = Field(default=None, description="Pod affinity.")
    pod_anti_affinity: PodAffinity | None = Field(default=None, description="Pod anti-affinity.")


class TopologySpreadConstraint(Model):
    max_skew: int = Field(ge=1, le=2**31 - 1, description="How uneven the spread may be.")
    topology_key: LabelKey = Field(description="The node label to spread over.")
    when_unsatisfiable: Literal["DoNotSchedule", "ScheduleAnyway"] = Field(description="What to do if it can't.")
    label_selector: LabelSelector | None = Field(default=None, description="The pods counted.")
    min_domains: int | None = Field(default=None, ge=1, le=2**31 - 1, description="Domains to count at least.")
    node_affinity_policy: Literal["Honor", "Ignore"] | None = Field(default=None, description="Honor or Ignore.")
    node_taints_policy: Literal["Honor", "Ignore"] | None = Field(default=None, description="Honor or Ignore.")
    match_label_keys: list[LabelKey] = Field(default_factory=list, max_length=32, description="Keys to match.")


_TOLERATION_SECONDS_RULE = (
    "!has(self.tolerationSeconds) || (has(self.effect) && self.effect == 'NoExecute')",
    "tolerationSeconds needs effect NoExecute",
    ".tolerationSeconds",
)


class Toleration(Model):
    """A Kubernetes toleration."""

    # Kubernetes' own rule (ValidateTolerations): without it the CRD admits a policy whose Deployment the API server
    # then refuses, and the policy never gets a status.
    model_config = ConfigDict(json_schema_extra=cel_rules(_TOLERATION_SECONDS_RULE))

    key: str | None = Field(default=None, max_length=316, description="Taint key.")
    operator: Literal["Exists", "Equal"] | None = Field(default=None, description="Exists or Equal.")
    value: str | None = Field(default=None, max_length=63, description="Taint value.")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(default=None, description="Effect.")
    toleration_seconds: int | None = Field(
        default=None, ge=0, le=2**31 - 1, description="For NoExecute: how long to stay."
    )

    @model_validator(mode="after")
    def _seconds_for_no_execute(self) -> Self:
        if self.toleration_seconds is not None and self.effect != "NoExecute":
            raise ValueError("tolerationSeconds needs effect NoExecute")
        return self


# --- the overlay ---------------------------------------------------------------------------


# Annotations that set a container's or the pod's security profile, which the operator sets in the security
# context: no admin allowance, so the CRD's CEL refuses them with the webhook down.
SECURITY_PROFILE_ANNOTATION_PREFIXES = (
    "container.apparmor.security.beta.kubernetes.io/",
    "seccomp.security.alpha.kubernetes.io/",
    "container.seccomp.security.alpha.kubernetes.io/",
)


def _no_security_profile(annotations: dict[str, str]) -> dict[str, str]:
    for key in annotations:
        if key.startswith(SECURITY_PROFILE_ANNOTATION_PREFIXES):
            raise ValueError(
                f"{key} would change the pod's security profile (AppArmor, seccomp), which the operator sets"
            )
    return annotations


_SECURITY_PROFILE_RULE = (
    "self.all(k, " + " && ".join(f"!k.startsWith('{p}')" for p in SECURITY_PROFILE_ANNOTATION_PREFIXES) + ")",
    "may not change the pod's security profile (AppArmor, seccomp annotations), which the operator sets",
)


class PodTemplateMetadata(Model):
    labels: dict[str, str] = Field(
        default_factory=dict, max_length=64, description="Pod labels; none the operator sets itself."
    )
    annotations: Annotated[dict[str, str], AfterValidator(_no_security_profile)] = Field(
        default_factory=dict,
        max_length=64,
        description="Pod annotations; none the operator sets itself, none that changes the security profile.",
        json_schema_extra=cel_rules(_SECURITY_PROFILE_RULE),
    )


class PodTemplate(Model):
    """What a policy adds to its engine pods, merged under what the operator manages: the offload flags, the
    memory the sizing computed, /dev/shm, the security context and the labels it selects on are never the
    overlay's to change."""

    metadata: PodTemplateMetadata = Field(default_factory=PodTemplateMetadata, description="Labels, annotations.")
    env: list[PodEnvVar] = Field(
        default_factory=list, max_length=128, description="More variables, from a value or a Secret/ConfigMap key."
    )
    env_from: list[EnvFromSource] = Field(
        default_factory=list, max_length=16, description="Every key of a Secret or ConfigMap as a variable."
    )
    volumes: list[PodVolume] = Field(default_factory=list, max_length=32, description="More volumes.")
    volume_mounts: list[VolumeMount] = Field(
        default_factory=list, max_length=32, description="Mounts of those volumes in the engine container."
    )
    image_pull_secrets: list[LocalObjectReference] = Field(
        default_factory=list, max_length=16, description="Secrets to pull the image with."
    )
    affinity: Affinity | None = Field(default=None, description="Node and pod affinity.")
    topology_spread_constraints: list[TopologySpreadConstraint] = Field(
        default_factory=list, max_length=16, description="How to spread engine pods."
    )
    tolerations: list[Toleration] = Field(default_factory=list, max_length=64, description="More tolerations.")
    priority_class_name: Name | None = Field(default=None, description="A PriorityClass a cluster admin allowed.")
    runtime_class_name: Name | None = Field(default=None, description="A RuntimeClass a cluster admin allowed.")
    service_account_name: Name | None = Field(
        default=None, description="A ServiceAccount a cluster admin allowed; its token is still not mounted."
    )


__all__ = [
    "SECURITY_PROFILE_ANNOTATION_PREFIXES",
    "Affinity",
    "EmptyDirSource",
    "EnvFromSource",
    "EnvVar",
    "HostPathSource",
    "PVCSource",
    "PodEnvVar",
    "PodTemplate",
    "PodVolume",
    "Toleration",
    "VolumeMount",
]
