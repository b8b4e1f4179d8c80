"""The kubelet stand-in's census: engines started and Ready engines per level, as the demo reports them."""

from __future__ import annotations

from dataclasses import dataclass, field

from kvoffload.api.conventions import LABEL_LEVEL, LABEL_POLICY
from kvoffload.lab.cluster.census import Census


@dataclass
class FakeEngine:
    level: str
    ready: bool
    policy: str = "demo"
    labels: dict[str, str] = field(init=False)

    def __post_init__(self) -> None:
        self.labels = {LABEL_POLICY: self.policy, LABEL_LEVEL: self.level}


def test_the_census_counts_starts_per_level_and_the_fewest_ready_after_the_fleet_first_filled() -> None:
    census = Census()
    for level in ("gpu-only", "gpu-only", "cpu", "cpu"):
        census.engine_started({LABEL_POLICY: "demo", LABEL_LEVEL: level})
    census.engine_started({LABEL_POLICY: "other", LABEL_LEVEL: "cpu"})
    census.sample(0.0, "demo", [FakeEngine("gpu-only", False), FakeEngine("gpu-only", False)])  # starting: no dip
    census.sample(1.0, "demo", [FakeEngine("gpu-only", True), FakeEngine("gpu-only", True)])
    census.sample(2.0, "demo", [FakeEngine("gpu-only", True), FakeEngine("cpu", False)])  # a swap: 1 Ready
    census.sample(3.0, "demo", [FakeEngine("cpu", True), FakeEngine("cpu", True), FakeEngine("x", True, "other")])

    summary = census.to_json("demo", replicas=2)
    assert summary["podsStarted"] == 4
    assert summary["podsStartedByLevel"] == {"cpu": 2, "gpu-only": 2}
    assert summary["minReadyReplicas"] == 1
    assert summary["readyByLevel"][-1] == {"t": 3.0, "ready": {"cpu": 2}}
    assert Census().min_ready(2) is None  # never full: no figure rather than a false 0
