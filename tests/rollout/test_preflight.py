"""The preflight gate, scenario by scenario: each rule that refuses, the gate passing, retry, a new spec.

``World`` (tests/rollout/test_rollout.py) drives the pure ``decide()``: the baseline's
workload figures come with the stable traffic, the restore price as the adapter would
compute it with ``economics.breakeven``. The judgment itself is checked on its own first.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from kvoffload.analysis.measurements import Percentiles, VariantSample, WorkloadSample
from kvoffload.api.conventions import (
    OFFLOAD_WILL_NOT_PAY,
    PAUSE,
    PAUSED,
    PROGRESSING,
    PROMOTE,
    READY,
    RECONCILING,
    RETRY,
    STALLED,
    Decision,
    Reason,
)
from kvoffload.api.rollout import PreflightSpec
from kvoffload.api.status import BaselineStatus, Mode, Phase
from kvoffload.economics.breakeven import DEFAULT_PROMPT_TOKENS as ECONOMICS_DEFAULT_PROMPT
from kvoffload.rollout import conditions as cond
from kvoffload.rollout.preflight import (
    DEFAULT_PROMPT_TOKENS,
    EXTERNAL_SHARE_NOT_JUDGED,
    RestorePrice,
    judge,
    prompt_tokens_for,
)
from tests.rollout.test_rollout import HEALTHY, Traffic, World, at_stage, in_phase, make_spec

# An H200-like price (Qwen3-8B at 1,480 tokens: recompute ~13x a restore) and one where restore loses.
CHEAP_RESTORE = RestorePrice(
    1480, recompute_ms=51.0, restore_ms=4.0, profile="nvidia-h200-141gb", profile_kind="measured"
)
SLOW_RESTORE = RestorePrice(1480, recompute_ms=9.0, restore_ms=12.0, profile="nvidia-l4", profile_kind="estimated")


def workload(
    *, kv_max: float = 0.97, preemptions: float = 0.2, hits: float = 0.35, prompt_p50: float = 1480.0
) -> WorkloadSample:
    return WorkloadSample(
        prompt_tokens=Percentiles(prompt_p50, 3000.0, 6000.0),
        ttft=Percentiles(0.12, 0.30, 0.40),
        itl=Percentiles(0.012, 0.018, 0.020),
        e2e=Percentiles(1.5, 3.0, 4.2),
        running_requests=12.0,
        prefix_cache_hit_rate=hits,
        kv_usage_max=kv_max,
        preemptions_per_second=preemptions,
    )


# Memory is the constraint and prompts share prefixes: offload can pay.
PRESSED = workload()
# The KV cache never came near full, nothing was preempted, but prompts share prefixes.
ROOMY = workload(kv_max=0.55, preemptions=0.0, hits=0.35)
# Roomy and nearly no reuse.
NO_REUSE = workload(kv_max=0.55, preemptions=0.0, hits=0.01)


def traffic(w: WorkloadSample | None) -> Traffic:
    return Traffic(stable=replace(HEALTHY, workload=w))


def preflight_spec(**preflight: Any) -> Any:
    return make_spec(**{"rollout.preflight": preflight})


def held(world: World) -> bool:
    return cond.is_true(world.st.conditions, OFFLOAD_WILL_NOT_PAY)


def condition(world: World, type_: str) -> Any:
    found = cond.find(world.st.conditions, type_)
    assert found is not None, type_
    return found


def hold_at_the_end_of_the_baseline(price: RestorePrice, w: WorkloadSample | None, **preflight: Any) -> World:
    world = World.given(preflight_spec(**preflight), price=price)
    world.run_for("10m", traffic(w))
    return world


# --- the judgment on its own -----------------------------------------------------------


def baseline_of(w: WorkloadSample) -> BaselineStatus:
    return BaselineStatus(
        prefix_cache_hit_rate=w.prefix_cache_hit_rate,
        gpu_kv_usage_max=w.kv_usage_max,
        preemption_rate=w.preemptions_per_second,
    )


@pytest.mark.parametrize(
    ("price", "w", "refused"),
    [
        (CHEAP_RESTORE, PRESSED, ()),
        (SLOW_RESTORE, PRESSED, (Reason.RESTORE_NOT_FASTER,)),
        (CHEAP_RESTORE, ROOMY, (Reason.GPU_MEMORY_NOT_CONSTRAINED,)),
        (CHEAP_RESTORE, NO_REUSE, (Reason.NO_PREFIX_REUSE, Reason.GPU_MEMORY_NOT_CONSTRAINED)),
        (
            SLOW_RESTORE,
            NO_REUSE,
            (Reason.RESTORE_NOT_FASTER, Reason.NO_PREFIX_REUSE, Reason.GPU_MEMORY_NOT_CONSTRAINED),
        ),
        # near full without a preemption, or preempting below kvPressure: memory is the constraint either way
        (CHEAP_RESTORE, workload(kv_max=0.92, preemptions=0.0, hits=0.01), ()),
        (CHEAP_RESTORE, workload(kv_max=0.40, preemptions=0.05, hits=0.01), ()),
        # a ratio of exactly 1: restore is no faster
        (RestorePrice(1480, recompute_ms=10.0, restore_ms=10.0), PRESSED, (Reason.RESTORE_NOT_FASTER,)),
    ],
)
def test_each_rule_refuses_on_its_own_evidence(price: RestorePrice, w: WorkloadSample, refused: tuple[Reason]) -> None:
    judgment = judge(PreflightSpec(), baseline_of(w), price)
    assert judgment.refused == refused
    assert judgment.pays is (refused == ())
    assert judgment.reason == (refused[0] if refused else Reason.OFFLOAD_MAY_PAY)


def test_the_message_shows_every_figure_and_the_bound_it_is_held_to() -> None:
    judgment = judge(PreflightSpec(), baseline_of(ROOMY), CHEAP_RESTORE)
    assert judgment.message == (
        "offload will not pay: GPU memory is not the constraint ("
        "recompute/restore 12.75x: recompute 51.0 ms, restore 4.0 ms for a 1,480-token prompt "
        "(measured profile nvidia-h200-141gb); max GPU KV usage 55% (kvPressure 90%); preemptions 0/s; "
        "prefix-cache hit rate 35.0% (minPrefixReuse 5%)); "
        f"not judged: {EXTERNAL_SHARE_NOT_JUDGED}"
    )


def test_missing_figures_leave_their_rules_unjudged_and_never_refuse() -> None:
    unpriced = RestorePrice(1480, error="profile nvidia-l4 has no eager prefill curve for 'acme/llm'")
    judgment = judge(PreflightSpec(), BaselineStatus(), unpriced)
    assert judgment.pays
    assert judgment.refused == ()
    assert judgment.not_judged == (
        "restore vs recompute: profile nvidia-l4 has no eager prefill curve for 'acme/llm'",
        "GPU memory pressure: no max KV usage and preemptions figures",
        EXTERNAL_SHARE_NOT_JUDGED,
    )
    assert "n/a" in judgment.message


def test_the_predicted_external_share_is_never_judged_without_a_trace() -> None:
    for w in (PRESSED, ROOMY, NO_REUSE):
        assert EXTERNAL_SHARE_NOT_JUDGED in judge(PreflightSpec(), baseline_of(w), CHEAP_RESTORE).not_judged


def test_the_prompt_priced_is_the_spec_s_else_the_baseline_p50_else_1480() -> None:
    sample = VariantSample(workload=workload(prompt_p50=2345.6))
    assert prompt_tokens_for(PreflightSpec(prompt_tokens=900), sample) == 900
    assert prompt_tokens_for(PreflightSpec(), sample) == 2346
    assert prompt_tokens_for(PreflightSpec(), VariantSample()) == 1480
    assert prompt_tokens_for(PreflightSpec(), None) == 1480
    assert DEFAULT_PROMPT_TOKENS == ECONOMICS_DEFAULT_PROMPT  # rollout may not import economics: kept equal here


# --- through decide() ------------------------------------------------------------------


def test_OffloadWillNotPay_holds_the_fleet_on_gpu_only_when_restore_is_not_faster() -> None:
    # Given a policy with a preflight, on a GPU class where restoring loses to recomputing
    world = World.given(preflight_spec(), price=SLOW_RESTORE)
    assert condition(world, OFFLOAD_WILL_NOT_PAY).reason == Reason.PREFLIGHT_NOT_JUDGED
    assert "then the preflight judges" in world.st.message

    # When the baseline ends, under memory pressure and with reuse
    world.run_for("10m", traffic(PRESSED))

    # Then the fleet holds on GPU-only with no canary, and says why with the figures
    assert world.fleet == (("gpu-only", 4), None)
    assert world.st.mode is Mode.HELD
    assert world.phase is Phase.HELD
    will_not_pay = condition(world, OFFLOAD_WILL_NOT_PAY)
    assert will_not_pay.status == "True"
    assert will_not_pay.reason == Reason.RESTORE_NOT_FASTER
    for figure in ("recompute/restore 0.75x", "recompute 9.0 ms", "restore 12.0 ms", "max GPU KV usage 97%"):
        assert figure in will_not_pay.message
    assert "preemptions 0.2/s" in will_not_pay.message
    assert "prefix-cache hit rate 35.0%" in will_not_pay.message
    # kstatus: not climbing, stalled (a person must act), not ready, not degraded
    assert condition(world, STALLED).status == "True"
    assert condition(world, STALLED).reason == Reason.OFFLOAD_WILL_NOT_PAY
    assert condition(world, RECONCILING).status == "False"
    assert condition(world, READY).status == "False"
    assert condition(world, PROGRESSING).status == "False"
    event = world.events[-1]
    assert (event.type, event.reason) == ("Warning", Reason.OFFLOAD_WILL_NOT_PAY)
    assert "recompute 9.0 ms" in event.message
    assert world.decisions()[-1] == Decision.OFFLOAD_WILL_NOT_PAY
    assert world.st.history[-1].reason == Reason.OFFLOAD_WILL_NOT_PAY
    # The baseline's figures and the verdict are in status
    assert world.st.baseline is not None
    assert world.st.baseline.prefix_cache_hit_rate == pytest.approx(0.35)
    assert world.st.baseline.prompt_tokens is not None
    assert world.st.baseline.prompt_tokens.p95 == 3000.0
    assert world.st.preflight is not None
    assert not world.st.preflight.pays
    assert world.st.preflight.refused == ["RestoreNotFaster"]
    assert world.st.preflight.ratio == pytest.approx(0.75)

    # And nothing moves on its own: hours of healthy traffic start no canary
    world.run_for("3h", traffic(PRESSED))
    assert world.fleet == (("gpu-only", 4), None)
    assert world.phase is Phase.HELD
    assert world.plan is not None
    assert world.plan.requeue_after is None


def test_OffloadWillNotPay_when_gpu_memory_is_not_the_constraint() -> None:
    world = hold_at_the_end_of_the_baseline(CHEAP_RESTORE, ROOMY)
    assert world.phase is Phase.HELD
    assert condition(world, OFFLOAD_WILL_NOT_PAY).reason == Reason.GPU_MEMORY_NOT_CONSTRAINED
    assert "max GPU KV usage 55% (kvPressure 90%); preemptions 0/s" in condition(world, OFFLOAD_WILL_NOT_PAY).message
    assert world.fleet == (("gpu-only", 4), None)


def test_OffloadWillNotPay_when_prompts_almost_never_share_a_prefix() -> None:
    world = hold_at_the_end_of_the_baseline(CHEAP_RESTORE, NO_REUSE)
    assert condition(world, OFFLOAD_WILL_NOT_PAY).reason == Reason.NO_PREFIX_REUSE
    assert world.st.preflight is not None
    assert world.st.preflight.refused == ["NoPrefixReuse", "GPUMemoryNotConstrained"]
    assert "prefix-cache hit rate 1.0% (minPrefixReuse 5%)" in world.st.message


def test_the_bounds_come_from_the_spec() -> None:
    # 55% usage is "near full" for a policy that says so; 1% reuse is enough for one that asks for less
    world = hold_at_the_end_of_the_baseline(CHEAP_RESTORE, NO_REUSE, kvPressure=0.5)
    assert world.fleet[1] == ("cpu-pilot", 1)
    world = hold_at_the_end_of_the_baseline(CHEAP_RESTORE, NO_REUSE, minPrefixReuse=0.005)
    assert condition(world, OFFLOAD_WILL_NOT_PAY).reason == Reason.GPU_MEMORY_NOT_CONSTRAINED


def test_when_offload_may_pay_the_climb_goes_on_and_the_event_has_the_figures() -> None:
    world = hold_at_the_end_of_the_baseline(CHEAP_RESTORE, PRESSED)

    assert world.fleet == (("gpu-only", 3), ("cpu-pilot", 1))
    assert world.phase is Phase.CANARY
    event = world.events[-1]
    assert (event.type, event.reason) == ("Normal", Reason.BASELINE_TAKEN)
    assert "preflight: offload may pay (recompute/restore 12.75x: recompute 51.0 ms, restore 4.0 ms" in event.message
    assert "max GPU KV usage 97%" in event.message
    assert "p50 prompt 1,480 tokens" in event.message  # the baseline's workload, too
    may_pay = condition(world, OFFLOAD_WILL_NOT_PAY)
    assert (may_pay.status, may_pay.reason) == ("False", Reason.OFFLOAD_MAY_PAY)
    assert world.st.preflight is not None
    assert world.st.preflight.pays
    assert world.st.preflight.profile == "nvidia-h200-141gb (measured)"

    # And the rest of the climb is the usual one
    world.run_until(in_phase(Phase.STABLE), traffic(PRESSED))
    assert world.fleet == (("nvme", 4), None)
    assert condition(world, OFFLOAD_WILL_NOT_PAY).reason == Reason.OFFLOAD_MAY_PAY


def test_a_baseline_without_workload_figures_is_not_refused() -> None:
    # An engine (or a Prometheus) without the figures: nothing is known, so nothing refuses.
    world = hold_at_the_end_of_the_baseline(RestorePrice(1480, error="no profile for the GPU class"), None)
    assert world.fleet[1] == ("cpu-pilot", 1)
    assert world.st.preflight is not None
    assert world.st.preflight.pays
    assert world.st.preflight.not_judged[0] == "restore vs recompute: no profile for the GPU class"


def test_without_a_preflight_there_is_no_condition_and_no_verdict() -> None:
    world = World.given(make_spec())
    world.run_for("10m", traffic(ROOMY))
    assert world.fleet[1] == ("cpu-pilot", 1)
    assert cond.find(world.st.conditions, OFFLOAD_WILL_NOT_PAY) is None
    assert world.st.preflight is None


def test_retry_takes_a_new_baseline_and_judges_again() -> None:
    world = hold_at_the_end_of_the_baseline(CHEAP_RESTORE, ROOMY)
    assert world.phase is Phase.HELD

    # When a person retries
    world.annotate(RETRY, "1")
    world.tick(traffic(ROOMY))

    # Then a new GPU-only baseline runs, and the old verdict no longer holds
    assert world.phase is Phase.BASELINE
    assert world.fleet == (("gpu-only", 4), None)
    assert world.decisions()[-1] == Decision.RETRY
    assert condition(world, OFFLOAD_WILL_NOT_PAY).status == "False"
    assert condition(world, OFFLOAD_WILL_NOT_PAY).reason == Reason.PREFLIGHT_NOT_JUDGED
    assert condition(world, STALLED).status == "False"
    assert world.st.preflight is None

    # And when the traffic has grown into the memory in the meantime, the climb goes on
    world.run_until(at_stage("cpu-pilot"), traffic(PRESSED))
    assert condition(world, OFFLOAD_WILL_NOT_PAY).reason == Reason.OFFLOAD_MAY_PAY


def test_a_new_spec_judges_again() -> None:
    world = hold_at_the_end_of_the_baseline(CHEAP_RESTORE, ROOMY)
    world.change_spec(preflight_spec(kvPressure=0.5))
    world.tick(traffic(ROOMY))
    assert world.phase is Phase.BASELINE
    assert world.decisions()[-1] == Decision.SPEC_CHANGED
    world.run_until(at_stage("cpu-pilot"), traffic(ROOMY))  # 55% is near full for this spec


def test_removing_the_preflight_from_the_spec_lets_the_ladder_climb() -> None:
    world = hold_at_the_end_of_the_baseline(CHEAP_RESTORE, ROOMY)
    world.change_spec(make_spec())
    world.run_until(at_stage("cpu-pilot"), traffic(ROOMY))
    gone = condition(world, OFFLOAD_WILL_NOT_PAY)  # written False once, so a reader sees it cleared
    assert (gone.status, gone.reason, gone.message) == (
        "False",
        Reason.PREFLIGHT_NOT_JUDGED,
        "no preflight in the spec",
    )


def test_promote_is_refused_while_OffloadWillNotPay_holds() -> None:
    world = hold_at_the_end_of_the_baseline(SLOW_RESTORE, PRESSED)
    world.annotate(PROMOTE, "1")
    world.tick(traffic(PRESSED))
    assert world.fleet == (("gpu-only", 4), None)
    assert world.phase is Phase.HELD
    event = world.events[-1]
    assert event.reason == Reason.MANUAL_ACTION_IGNORED
    assert "offload will not pay" in event.message
    assert world.st.annotations_seen[PROMOTE] == "1"

    world.annotate(PAUSE, "1")  # nothing to pause: nothing moves here on its own
    world.tick(traffic(PRESSED))
    assert world.events[-1].reason == Reason.MANUAL_ACTION_IGNORED
    assert not cond.is_true(world.st.conditions, PAUSED)
    assert world.phase is Phase.HELD


def test_a_baseline_cut_short_by_promote_is_not_judged() -> None:
    world = World.given(preflight_spec(), price=SLOW_RESTORE)
    world.run_for("2m", traffic(PRESSED))
    world.annotate(PROMOTE, "1")
    world.tick(traffic(PRESSED))
    assert world.fleet[1] == ("cpu-pilot", 1)
    assert "the preflight was not judged" in world.events[-1].message
    assert condition(world, OFFLOAD_WILL_NOT_PAY).reason == Reason.PREFLIGHT_NOT_JUDGED


def test_a_baseline_on_a_level_with_offload_is_not_judged() -> None:
    # Climbed past cpu, then the spec changes: the new ladder's baseline runs on cpu, not GPU-only.
    world = World.given(preflight_spec(), price=CHEAP_RESTORE)
    world.run_until(at_stage("nvme"), traffic(PRESSED))
    world.change_spec(preflight_spec(kvPressure=0.8))
    world.tick(traffic(ROOMY))
    assert world.fleet == (("cpu", 4), None)
    assert "not GPU-only" in condition(world, OFFLOAD_WILL_NOT_PAY).message
    world.run_until(at_stage("nvme"), traffic(ROOMY))  # ROOMY would refuse on GPU-only; here nothing judges
