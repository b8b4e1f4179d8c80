"""The sized plan: every ladder level of one render input with what sizing gives it (host memory, tier capacity,
startup budget and progress deadline, config hash), worked out once and handed to rendering, ``decide``, the
status and the metrics, which read it instead of sizing again (docs/design.md, "Sizing").
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

from kvoffload.api.types import KVOffloadPolicy, KVOffloadPolicySpec
from kvoffload.policy.engine_config import engine_config
from kvoffload.policy.hostmemory import HostMemory, host_memory
from kvoffload.policy.kvshape import tier_capacity_tokens
from kvoffload.policy.ladder import Level, build_ladder
from kvoffload.policy.startup import progress_deadline_seconds, startup_seconds


@dataclass(frozen=True)
class SizedLevel:
    """One ladder level, sized."""

    level: Level
    memory: HostMemory
    """Host memory of one replica running the level (``hostmemory.host_memory``)."""
    capacity: Mapping[str, int]
    """Tokens each offload tier of the level holds per pod, in tier order (``kvshape.tier_capacity_tokens``)."""
    startup_seconds: int
    """What the startup probe allows (``startup.startup_seconds``)."""
    progress_deadline_seconds: float
    """rollout.progressDeadline stretched to the startup budget (``startup.progress_deadline_seconds``)."""
    config_hash: str
    """The hash of the level's engine config (``engine_config.EngineConfig.hash``)."""


@dataclass(frozen=True)
class Sized:
    """The ladder of one render input, every level sized, bottom (GPU-only) first."""

    policy: str
    """The policy's name: its engines carry it as their policy label."""
    levels: tuple[SizedLevel, ...]

    def __getitem__(self, index: int) -> SizedLevel:
        return self.levels[index]

    def __len__(self) -> int:
        return len(self.levels)

    def __iter__(self) -> Iterator[SizedLevel]:
        return iter(self.levels)

    @property
    def ladder(self) -> list[Level]:
        return [s.level for s in self.levels]

    @property
    def level_hashes(self) -> dict[int, str]:
        """The config hash of every level, by level index."""
        return {s.level.index: s.config_hash for s in self.levels}


HashOf = Callable[[Level, HostMemory], str]
"""The config hash of a level, given its host memory (the engine config is built from both)."""


def size_level(spec: KVOffloadPolicySpec, level: Level, hash_of: HashOf) -> SizedLevel:
    """One level sized; SizingError names the field when the model's KV shape is unknown."""
    memory = host_memory(spec, level)
    config_hash = hash_of(level, memory)  # before the capacity: a config that cannot render is named first
    return SizedLevel(
        level=level,
        memory=memory,
        capacity=tier_capacity_tokens(spec, level),
        startup_seconds=startup_seconds(spec, level),
        progress_deadline_seconds=progress_deadline_seconds(spec, level),
        config_hash=config_hash,
    )


def size_spec(spec: KVOffloadPolicySpec, policy: str, hash_of: HashOf) -> Sized:
    """Every level of ``spec``'s ladder sized, the config hashes from ``hash_of``."""
    return Sized(policy, tuple(size_level(spec, level, hash_of) for level in build_ladder(spec)))


def size_policy(policy: KVOffloadPolicy) -> Sized:
    """The sized plan of a parsed policy (model shape resolved): what one render input gives. SizingError names
    the field when a level cannot be sized; PolicyError when it cannot be rendered."""
    return size_spec(policy.spec, policy.metadata.name, lambda level, memory: engine_config(policy, level, memory).hash)


def sized_level(policy: KVOffloadPolicy, level: Level | SizedLevel) -> SizedLevel:
    """``level`` sized for ``policy`` (as it is, when it is sized already): for a caller that renders one level."""
    if isinstance(level, SizedLevel):
        return level
    return size_level(policy.spec, level, lambda lv, memory: engine_config(policy, lv, memory).hash)
