"""decide() on a canary that fails its requests before their first token: no TTFT samples, yet a sustained
error-gate breach rolls back (it is Fail, not Inconclusive), and never pauses on maxInconclusive."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from kvoffload.analysis.errorgate import ERROR_SHARE
from kvoffload.analysis.measurements import VariantSample
from kvoffload.api.conventions import ANALYSIS_INCONCLUSIVE, DEGRADED
from kvoffload.api.status import Phase, Verdict
from kvoffload.rollout import conditions as cond
from tests.rollout.test_rollout import HEALTHY, Traffic, World, at_stage, in_phase, make_spec


def finished(total: int, failed: int) -> dict[str, float]:
    return {"stop": float(total - failed), "length": 0.0, "abort": 0.0, "error": float(failed), "repetition": 0.0}


# Every canary request fails before a first token: the TTFT histogram counts none, the engine finished 400.
ALL_FAILED = VariantSample(requests=0.0, request_rate=0.0, finished=finished(400, 400))
STABLE = replace(HEALTHY, finished=finished(1200, 0))


def test_a_sustained_error_breach_with_no_ttft_samples_rolls_back_instead_of_pausing() -> None:
    world = World.given(make_spec())
    world.run_until(at_stage("cpu"), Traffic(stable=STABLE))
    world.run_for("5m", Traffic(stable=STABLE))
    stable_before = world.st.stable
    assert stable_before is not None

    world.run_until(in_phase(Phase.ROLLED_BACK), Traffic(canary=ALL_FAILED, stable=STABLE), limit="3m")

    last = world.st.last_analysis
    assert last is not None
    assert last.verdict is Verdict.FAIL
    assert last.failing_since == world.now - timedelta(minutes=2)  # rolled back after sustainedFor, not at once
    share = next(m for m in last.metrics if m.name == ERROR_SHARE)
    assert share.passed is False
    assert world.plan is not None
    assert world.plan.variants is not None
    assert world.plan.variants.canary is None
    assert world.plan.variants.stable.level == stable_before.level
    assert world.decisions()[-1] == "Rollback"
    degraded = cond.find(world.st.conditions, DEGRADED)
    assert degraded is not None
    assert degraded.status == "True"
    assert not cond.is_true(world.st.conditions, ANALYSIS_INCONCLUSIVE)
