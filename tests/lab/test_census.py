"""The kubelet stand-in's census: engines started and Ready engines per level, as the demo reports them."""

from __future__ import annotations

from dataclasses import dataclass, field

from kvoffload.api.conventions import LABEL_LEVEL, LABEL_POLICY
from kvoffload_lab.capacity import Capacity, steps
from kvoffload_lab.cluster.census import Census


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


def test_engines_that_start_turn_ready_and_stop_give_the_exact_ready_steps_per_level() -> None:
    """Two gpu-only engines start and turn Ready; one is swapped for the pilot (a dip while it starts), then the
    last for cpu, then the pilot too; an nvme engine that never turns Ready and another policy's are not drawn."""
    census = Census()
    capacity: list[Capacity] = []

    def sample(t: float, *fleet: FakeEngine) -> None:
        capacity.append(Capacity(t, census.sample(t, "demo", fleet)))

    g1, g2, pilot, c1, c2 = (FakeEngine(lv, False) for lv in ("gpu-only", "gpu-only", "cpu-pilot", "cpu", "cpu"))
    sample(0, g1, g2)  # both starting
    g1.ready = g2.ready = True
    sample(10, g1, g2)
    sample(20, g1, pilot)  # g2 stopped, the pilot starting
    pilot.ready = True
    sample(30, g1, pilot, FakeEngine("x", True, "other"))
    c1.ready = True
    sample(40, pilot, c1, FakeEngine("nvme", False))  # g1 stopped, a cpu engine Ready
    c2.ready = True
    sample(50, c1, c2)  # the pilot stopped

    times, by_level = steps(capacity, ["gpu-only", "cpu-pilot", "cpu", "nvme"])
    assert times == [0, 10, 20, 30, 40, 50]
    assert by_level == {"gpu-only": [0, 2, 1, 1, 0, 0], "cpu-pilot": [0, 0, 0, 1, 1, 0], "cpu": [0, 0, 0, 0, 1, 2]}
    assert list(by_level) == ["gpu-only", "cpu-pilot", "cpu"]  # ladder order; nvme was never Ready
    assert [c.total for c in capacity] == [0, 2, 1, 2, 2, 2]
    assert [(t, c.ready) for t, c in zip(times, capacity, strict=True)] == [
        (t, ready) for t, ready in census.samples
    ]  # what the report draws is what the census holds


def test_levels_the_ladder_does_not_name_come_after_it_in_the_order_first_seen() -> None:
    capacity = [Capacity(0, {"b": 1}), Capacity(5, {"cpu": 1, "a": 1, "b": 0}), Capacity(9, {})]
    times, by_level = steps(capacity, ["gpu-only", "cpu"])
    assert times == [0, 5, 9]
    assert list(by_level.items()) == [("cpu", [0, 1, 0]), ("b", [1, 0, 0]), ("a", [0, 1, 0])]
    assert steps([], ["gpu-only"]) == ([], {})
