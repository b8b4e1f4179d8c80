"""What the kubelet stand-in saw, counted where a person would look: every engine it started, and the
Ready engines of each ladder level over time. Independent of the operator's own status."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from kvoffload.api.conventions import LABEL_LEVEL, LABEL_POLICY


class _Engine(Protocol):
    @property
    def labels(self) -> Mapping[str, str]: ...

    @property
    def ready(self) -> bool: ...


@dataclass
class Census:
    """Engine starts (one per pod the stand-in started) and Ready engines per level, sampled."""

    started: Counter[str] = field(default_factory=Counter)
    """Engines started, by ``policy/level``."""
    samples: list[tuple[float, dict[str, int]]] = field(default_factory=list)
    """(time, Ready engines by level) for one policy, as ``sample`` took them."""

    def engine_started(self, labels: Mapping[str, str]) -> None:
        self.started[f"{labels.get(LABEL_POLICY, '')}/{labels.get(LABEL_LEVEL, '')}"] += 1

    def sample(self, at: float, policy: str, engines: Iterable[_Engine]) -> dict[str, int]:
        ready: Counter[str] = Counter()
        for engine in engines:
            if engine.labels.get(LABEL_POLICY) == policy and engine.ready:
                ready[engine.labels.get(LABEL_LEVEL, "")] += 1
        self.samples.append((at, dict(ready)))
        return dict(ready)

    def pods_started(self, policy: str) -> int:
        return sum(n for key, n in self.started.items() if key.split("/", 1)[0] == policy)

    def min_ready(self, replicas: int) -> int | None:
        """The fewest Ready engines once the fleet first had ``replicas`` Ready (start-up is not a dip)."""
        totals = [sum(ready.values()) for _, ready in self.samples]
        first = next((i for i, total in enumerate(totals) if total >= replicas), None)
        return None if first is None else min(totals[first:])

    def to_json(self, policy: str, replicas: int) -> dict[str, Any]:
        return {
            "podsStarted": self.pods_started(policy),
            "podsStartedByLevel": {
                k.split("/", 1)[1]: n for k, n in sorted(self.started.items()) if k.startswith(f"{policy}/")
            },
            "minReadyReplicas": self.min_ready(replicas),
            "readyByLevel": [{"t": round(t, 1), "ready": ready} for t, ready in self.samples],
        }
