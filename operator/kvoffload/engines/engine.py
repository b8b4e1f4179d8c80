"""What the operator needs from a serving engine: its container, its command line and environment for
one ladder level, the checks only it can make, and where it keeps the pinned pool.

The rest of the operator speaks to this protocol through :func:`kvoffload.engines.engine_for`; the
engines' own modules (``engines/vllm``, ``engines/sglang``) are imported by nothing else (the layout test
checks it).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from kvoffload.api.errors import FieldError
from kvoffload.api.serving import SecondaryTier
from kvoffload.api.types import KVOffloadPolicy, KVOffloadPolicySpec
from kvoffload.engines.dialect import Dialect
from kvoffload.engines.options import ArgProblem

# The port every engine serves on: the probes, the Service and the PodMonitor use it.
PORT = 8000
SHM_PATH = "/dev/shm"
# Where an engine's config files (``Engine.config_files``) are mounted, read-only, from the level's ConfigMap.
CONFIG_DIR = "/etc/kvoffload/engine"


class Rung(Protocol):
    """The part of a ladder level an engine renders (``policy.ladder.Level``)."""

    @property
    def cpu_bytes(self) -> int | None: ...

    @property
    def secondary_tiers(self) -> tuple[SecondaryTier, ...]: ...


@dataclass(frozen=True)
class Setting:
    """A value a container's own command line sets, with the flag as it was spelt (for messages)."""

    flag: str
    value: str
    number: int | None = None
    """The value as a whole number, where the engine reads it as one (``32k`` is 32000 to vLLM); None otherwise."""


@dataclass(frozen=True)
class Served:
    """What a container's own command line sets of what the policy also says; None where it leaves the engine's
    default."""

    model: Setting | None
    max_model_len: Setting | None
    tensor_parallel_size: Setting | None
    kv_cache_dtype: Setting | None
    port: int
    """The port it serves on: its --port, else the engine's default."""


@dataclass(frozen=True)
class DerivedContainer:
    """A referenced container's command, args and env for one ladder level: the user's, less their offload flags
    and variables, plus the level's. None where the container had none and the level adds none."""

    command: list[str] | None
    args: list[str] | None
    env: list[dict[str, Any]] | None
    removed_flags: tuple[str, ...]
    """The user's offload flags as spelt (without their values)."""
    removed_env: tuple[str, ...]


class Engine(Protocol):
    """One serving engine, as the operator renders and judges it."""

    @property
    def name(self) -> str:
        """``spec.engine``, and the pods' ``app.kubernetes.io/name``."""
        ...

    @property
    def title(self) -> str:
        """The engine's name in messages (``vLLM``, ``SGLang``)."""
        ...

    @property
    def container(self) -> str:
        """The engine container's name."""
        ...

    @property
    def metrics_path(self) -> str:
        """Where the engine serves Prometheus' text format (the PodMonitor scrapes it)."""
        ...

    @property
    def restore_profiled(self) -> bool:
        """Whether the shipped GPU profiles (``economics/profile.py``) time this engine's own KV restore path;
        where not, ``kvoffload plan`` says its restore is priced as a profiled engine's."""
        ...

    def pool_in_shm(self, spec: KVOffloadPolicySpec, rung: Rung) -> bool:
        """Whether the pinned CPU pool lives in /dev/shm (so the emptyDir must hold it)."""
        ...

    def host_reserve(self, spec: KVOffloadPolicySpec, rung: Rung) -> int:
        """Host bytes the engine insists stay free beside its pool when it allocates it (the memory request holds
        them too)."""
        ...

    def pinned_bytes(self, spec: KVOffloadPolicySpec, rung: Rung, layers: int | None) -> int:
        """Host bytes the engine pins for the rung's CPU tier, before overheadFactor (0 without one). ``layers`` is
        the model's attention layers, None while unknown (a ``configMap`` not read yet)."""
        ...

    def config_files(self, policy: KVOffloadPolicy, rung: Rung) -> dict[str, str]:
        """The files the engine reads its options from for ``rung`` (file name -> text), mounted read-only at
        ``CONFIG_DIR`` from the level's ConfigMap; empty where the command line says everything."""
        ...

    def command(self, spec: KVOffloadPolicySpec) -> list[str]: ...

    def dialect(self, spec: KVOffloadPolicySpec) -> Dialect:
        """The series this policy's engines export and how to read them (``engines/dialect.py``); raises PolicyError
        naming the field where the policy names a release that is not one."""
        ...

    def args(self, policy: KVOffloadPolicy, rung: Rung) -> list[str]:
        """The engine's arguments: managed flags, offload flags for ``rung``, then ``spec.model.extraArgs``."""
        ...

    def env(self, spec: KVOffloadPolicySpec, rung: Rung) -> list[dict[str, Any]]:
        """The variables the engine's offload is configured through (before spec.model.env)."""
        ...

    def check(self, policy: KVOffloadPolicy) -> list[FieldError]:
        """What this engine cannot run in the spec, each naming its field; empty when it renders."""
        ...

    @property
    def code_options(self) -> Mapping[str, str]:
        """The engine's options that load code (dest -> why): refused in ``extraArgs`` unless the admin allows them."""
        ...

    @property
    def managed_flags(self) -> Sequence[str]:
        """Every spelling of the flags the operator manages (long names and aliases): the CRD's CEL rules refuse them
        spelt outright in ``extraArgs`` (``api/data/engines.json``, ``scripts/engine_tables.py``); the rest
        (abbreviations, values) is :meth:`judge_extra_args`'s."""
        ...

    def eager(self, spec: KVOffloadPolicySpec) -> bool:
        """Whether the policy's flags (an adopted container's own, with spec.workloadRef) turn CUDA graphs off (the
        engine then launches every kernel from the host, a larger fixed cost a request: ``economics/enginecost.py``)."""
        ...

    def judge_extra_args(self, args: Sequence[str], *, allowed: Collection[str] = ()) -> list[ArgProblem]:
        """Every ``extraArgs`` item that would set a managed value, turn on a code-loading option not in
        ``allowed`` (dests or flags the cluster admin allows), or that the engine's parser has no option for."""
        ...

    # --- a container the team already runs (spec.workloadRef) ---

    def recognises(self, container: Mapping[str, Any]) -> bool:
        """Whether ``container`` runs this engine: its command or args launch it, or it has no command and its image
        is the engine's."""
        ...

    def served(self, container: Mapping[str, Any]) -> Served:
        """What ``container``'s own options set of the model, context length, parallelism, KV dtype and port."""
        ...

    def adoption_problems(self, container: Mapping[str, Any]) -> list[str]:
        """Why levels cannot be derived from ``container`` (its options unreadable, flags the operator could not
        replace); empty when they can."""
        ...

    def offload_args(self, spec: KVOffloadPolicySpec, rung: Rung) -> list[str]:
        """The offload flags of ``rung`` alone (none on the GPU-only level)."""
        ...

    def offload_env(self, spec: KVOffloadPolicySpec, rung: Rung) -> list[dict[str, Any]]:
        """The variables the offload of ``rung`` reads, alone."""
        ...

    def split_offload(self, args: Sequence[str]) -> tuple[list[str], list[str]]:
        """``args`` without the offload flags (however spelt, with their values), and those flags."""
        ...

    def derive(self, container: Mapping[str, Any], spec: KVOffloadPolicySpec, rung: Rung) -> DerivedContainer:
        """``container``'s command, args and env for ``rung``: its offload flags and variables replaced by the
        rung's (flags appended to args), everything else as written."""
        ...

    def code_problems(self, container: Mapping[str, Any], *, allowed: Collection[str] = ()) -> list[str]:
        """Each option of ``container`` that loads code and is not in ``allowed`` (the user's other flags are
        theirs: only code loading is the admin's to refuse)."""
        ...


def managed_env_errors(policy: KVOffloadPolicy, managed: frozenset[str], why: str) -> list[FieldError]:
    """``spec.model.env`` and ``spec.podTemplate.env`` items that set a variable the engine's offload reads."""
    spec = policy.spec
    overlay = spec.pod_template.env if spec.pod_template is not None else []
    return [
        FieldError(where, f"{name} is managed by the operator from spec.offload{why}")
        for where, name in (
            *((f"spec.model.env[{i}].name", e.name) for i, e in enumerate(spec.model.env)),
            *((f"spec.podTemplate.env[{i}].name", e.name) for i, e in enumerate(overlay)),
        )
        if name in managed
    ]
