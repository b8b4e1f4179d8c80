"""Ready replicas per ladder level over time, as the report draws them.

The kubelet stand-in's census (``lab/cluster/census.py``) counts the Ready engines of each level once per
analysis cycle; :class:`Capacity` is one such count on the demo's clock and :func:`steps` turns a run of them
into one step series per level. Pure: nothing here talks to a cluster or draws.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Capacity:
    """The Ready engines of each level at ``t`` (seconds since the demo applied the policy)."""

    t: float
    ready: Mapping[str, int] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return sum(self.ready.values())


def steps(capacity: Sequence[Capacity], ladder: Sequence[str] = ()) -> tuple[list[float], dict[str, list[int]]]:
    """The sample times and, per level that was ever Ready, its Ready count at each of them (0 where none was).

    Each count holds until the next sample (a step drawn ``where="post"``). Levels come in ladder order,
    then any level the ladder does not name in the order it was first seen."""
    seen: list[str] = []
    for c in capacity:
        seen += [level for level, n in c.ready.items() if n > 0 and level not in seen]
    levels = [lv for lv in ladder if lv in seen] + [lv for lv in seen if lv not in ladder]
    return [c.t for c in capacity], {lv: [c.ready.get(lv, 0) for c in capacity] for lv in levels}
