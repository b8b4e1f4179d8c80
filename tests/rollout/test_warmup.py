"""A canary is judged once its cache is warm (analysis.warmup), like Argo Rollouts' initialDelay, and warm means warm.

The scenario of issue 9: a fixed fleet of warm stable engines (p99 TTFT 20 ms) and a fresh cpu canary
whose first request for each shared document misses an empty cache (p99 92 ms). The 15 s window holds
those misses for 16 s after the step starts, longer than sustainedFor. Every cycle is judged by the
real assess() from what Prometheus would show at that moment.

Issue 37 (part 3): nothing measured during the warm-up counts after it (no Fail run, no window that overlaps it:
the canary is judged from ``judgedFrom`` = ``warmAt`` + one window), and warm is a property of the cache: the
warm-up holds until the canary's prefix-cache hit rate reaches ``cacheParity`` of the stable's, or ``maxDuration``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from datetime import timedelta

from kvoffload.analysis.assess import assess
from kvoffload.analysis.measurements import Measurements, VariantSample
from kvoffload.api.conventions import Reason
from kvoffload.api.status import AnalysisStatus, KVOffloadPolicyStatus, MetricResult, Mode, Phase, Verdict, WarmupStatus
from kvoffload.api.types import KVOffloadPolicySpec
from kvoffload.policy.ladder import build_ladder
from kvoffload.rollout.decide import decide
from kvoffload.rollout.record import evidence_of
from kvoffload.rollout.warmup import analysis_subject
from tests.rollout.test_rollout import T0, World, make_spec

WARM = VariantSample(requests=120, request_rate=8.0, ttft_p99=0.020, itl_p99=0.010, external_share=0.30)
COLD = replace(WARM, ttft_p99=0.092, external_share=0.0)  # every first request for a document misses
COLD_FOR_S = 16  # the 15 s window holds the cold misses this long after the canary's first request
WINDOW_S = 15
STABLE_HITS = 0.80
"""The warm stable engines' GPU prefix-cache hit rate."""

Canary = Callable[[float], VariantSample]
"""What the canary shows, by seconds since its step started."""


def spec(*, surge: int = 0, step: str = "2m", **warmup: object) -> KVOffloadPolicySpec:
    return make_spec(
        replicas=4,
        **{
            "offload.secondaryTiers": [],
            "rollout.pilotCpu": None,
            "rollout.maxSurge": surge,
            "rollout.baselineDuration": "30s",
            "rollout.stepDuration": step,
            "rollout.promotionSteps": [100],
            "analysis.interval": "2s",
            "analysis.window": f"{WINDOW_S}s",
            "analysis.sustainedFor": "10s",
            "analysis.minRequests": 50,
            "analysis.warmup": warmup,
        },
    )


def issue_9(elapsed: float) -> VariantSample:
    return COLD if elapsed < COLD_FOR_S else WARM


def climb(world: World, canary_of: Canary = issue_9, stable: VariantSample = WARM, limit: int = 400) -> World:
    """Tick every 2 s until Stable or RolledBack; the canary shows ``canary_of(seconds since its step started)``."""
    for _ in range(limit):
        st = world.status
        if st is not None and st.phase in (Phase.STABLE, Phase.ROLLED_BACK):
            return world
        tick(world, canary_of, stable)
    raise AssertionError(f"neither Stable nor RolledBack: {world.st.message}")


def tick(world: World, canary_of: Canary = issue_9, stable: VariantSample = WARM) -> None:
    st = world.status
    world.now += timedelta(seconds=2)
    canary = None
    if st is not None and st.canary is not None and st.stage is not None and st.stage.started_at is not None:
        canary = canary_of((world.now - st.stage.started_at).total_seconds())
    has_stable = st is None or st.stable is None or st.stable.replicas > 0
    measurements = Measurements(canary=canary, stable=stable if has_stable else None)
    subject = analysis_subject(world.spec, build_ladder(world.spec), st, world.now)
    assessment = assess(
        world.spec,
        subject.level,
        measurements,
        warmed_up=subject.warmed_up,
        baseline=st.baseline if st is not None else None,
        stable_side=subject.stable_side,
        comparing=subject.comparing,
    )
    plan = decide(world.spec, st, world.observe(assessment, measurements), world.now)
    world.status, world.plan = plan.status, plan
    world.events += plan.events
    world.plans.append(plan)


def warmups(world: World) -> list[WarmupStatus]:
    """Each step's warm-up as it was when it ended (or last seen)."""
    out: dict[object, WarmupStatus] = {}
    for p in world.plans:
        if p.status.warmup is not None:
            out[p.status.warmup.since] = p.status.warmup
    return list(out.values())


def test_with_the_default_warm_up_a_cold_but_healthy_cpu_canary_climbs_to_stable() -> None:
    world = climb(World.given(spec()))

    assert world.phase is Phase.STABLE, world.st.message
    assert world.fleet == (("cpu", 4), None)
    warmed = [e for e in world.events if e.reason == "WarmedUp"]
    assert warmed, [e.reason for e in world.events]
    assert "warm after" in warmed[0].message
    assert "judged 15s from now" in warmed[0].message
    started = next(e for e in world.events if e.reason == "BaselineTaken")
    assert "warm-up: the canary's latency" in started.message  # the reason, in the step's Event
    assert "the error gate and hard failures act at once" in started.message
    # before the canary was judged its cold ratio was reported, not gated
    cold_cycles = [
        p.status.last_analysis
        for p in world.plans
        if p.status.warmup is not None and p.status.warmup.warm_at is None and p.status.last_analysis is not None
    ]
    ratios = [m for a in cold_cycles for m in a.metrics if m.name == "ttftP99Ratio" and m.canary is not None]
    assert any((m.canary or 0.0) > 1.2 and m.passed is None for m in ratios), ratios


def test_without_a_warm_up_the_same_canary_is_rolled_back() -> None:
    world = climb(World.given(spec(enabled=False)))

    assert world.phase is Phase.ROLLED_BACK
    assert world.st.history[-1].reason == "AnalysisFailed"
    assert "4.60" in world.st.history[-1].message  # canary/stable p99: 92 ms / 20 ms
    assert world.fleet == (("gpu-only", 4), None)


# --- issue 37: warm means warm, and nothing measured cold counts after the warm-up -------------------


FILL_S = 20.0
"""How long a fresh canary's prefix cache takes to fill: its hit rate climbs from 0 to the stable's meanwhile."""


def filling(elapsed: float) -> float:
    """The canary's prefix-cache hit rate over the window ending ``elapsed`` s after its step started: the mean of a
    rate rising linearly from 0 to the stable's over FILL_S, then flat."""
    start = max(0.0, elapsed - WINDOW_S)

    def area(t: float) -> float:  # integral of the instantaneous hit rate from 0 to t
        if t <= FILL_S:
            return STABLE_HITS * t * t / (2 * FILL_S)
        return STABLE_HITS * (FILL_S / 2 + t - FILL_S)

    span = elapsed - start
    return (area(elapsed) - area(start)) / span if span > 0 else 0.0


STABLE = replace(WARM, prefix_cache_hit_rate=STABLE_HITS)


def cold_start(elapsed: float) -> VariantSample:
    """A fresh canary, as on the real kube-apiserver run of issue 37: its cache fills over FILL_S, and while the window
    holds requests served before it was full its p99 TTFT (2.5 s) is over the 1500 ms budget; healthy after."""
    over = elapsed < FILL_S + WINDOW_S
    return replace(WARM if not over else replace(WARM, ttft_p99=2.5), prefix_cache_hit_rate=filling(elapsed))


def test_a_cold_canary_over_the_absolute_budget_during_the_warm_up_and_healthy_after_climbs() -> None:
    world = climb(World.given(spec(surge=1)), cold_start, STABLE)

    assert world.phase is Phase.STABLE, world.st.message
    assert "Rollback" not in world.decisions(), world.decisions()
    # it was over the budget while cold: reported, not gated
    over = [
        m
        for p in world.plans
        if p.status.last_analysis is not None
        for m in p.status.last_analysis.metrics
        if m.name == "ttftP99" and m.canary is not None and m.canary > 1.5
    ]
    assert over, "the canary was never over budget"
    assert all(m.passed is None for m in over), over
    # cache parity held each warm-up past the least 15 s until the canary's hit rate caught up with the stable's
    for w in warmups(world):
        assert w.warm_at is not None
        assert w.judged_from == w.warm_at + timedelta(seconds=WINDOW_S)
        assert (w.warm_at - w.since).total_seconds() > WINDOW_S
        assert w.canary_hit_rate is not None
        assert w.cache_parity == 0.9
        assert w.stable_hit_rate == STABLE_HITS
        assert w.canary_hit_rate >= 0.9 * STABLE_HITS
        # the first judged window held no request served cold
        assert (w.judged_from - w.since).total_seconds() >= FILL_S + WINDOW_S
    warmed = [e.message for e in world.events if e.reason == Reason.WARMED_UP]
    assert len(warmed) == 2, warmed
    assert all("(90% of the stable's 80%)" in m for m in warmed), warmed


def test_judged_from_the_analysis_window_after_the_warm_up_end() -> None:
    world = World.given(spec(surge=1))
    world.run_until(lambda w: w.st.canary is not None, limit="2m")
    while world.st.warmup is None or world.st.warmup.warm_at is None:
        tick(world, cold_start, STABLE)
    w = world.st.warmup
    assert w is not None
    assert w.warm_at == world.now
    assert w.judged_from == world.now + timedelta(seconds=WINDOW_S)
    # neither at the end of the warm-up nor one second before judgedFrom; from judgedFrom on
    assert not analysis_subject(world.spec, build_ladder(world.spec), world.st, world.now).comparing
    assert not analysis_subject(
        world.spec, build_ladder(world.spec), world.st, w.judged_from - timedelta(seconds=1)
    ).comparing
    assert analysis_subject(world.spec, build_ladder(world.spec), world.st, w.judged_from).comparing
    while world.now + timedelta(seconds=2) < w.judged_from:
        tick(world, cold_start, STABLE)
        last = world.st.last_analysis
        assert last is not None
        assert last.verdict is not Verdict.FAIL, last.message  # the cold TTFT is reported, not gated
    assert "warm, judged in" in world.st.message


def test_a_step_is_not_over_before_its_canary_is_judged() -> None:
    # A 20 s step, a 15 s warm-up and a 15 s window: the step holds until judgedFrom (at least 30 s) and a Pass then.
    world = World.given(spec(step="20s"))
    world.run_until(lambda w: w.st.canary is not None, limit="2m")
    started = world.st.stage.started_at if world.st.stage is not None else None
    assert started is not None
    stage = world.stage
    while world.stage == stage:
        world.tick(verdict=Verdict.PASS, advance="2s")
    promoted = world.now
    first = next(p.status.warmup for p in world.plans if p.status.warmup is not None and p.status.warmup.warm_at)
    assert first is not None
    assert first.judged_from is not None
    assert promoted >= first.judged_from
    assert (promoted - started).total_seconds() >= 2 * WINDOW_S
    held = [p.status.message for p in world.plans if "step over, warm, judged in" in p.status.message]
    assert held, [p.status.message for p in world.plans[-10:]]


def test_cache_parity_holds_the_warm_up_until_the_canary_catches_up() -> None:
    world = World.given(spec(surge=1))
    world.run_until(lambda w: w.st.canary is not None, limit="2m")
    half = replace(WARM, prefix_cache_hit_rate=0.4)
    for _ in range(20):  # 40 s: past the least 15 s and 50 requests, short of the longest (1m)
        tick(world, lambda _: half, STABLE)
    w = world.st.warmup
    assert w is not None
    assert w.warm_at is None
    assert (w.canary_hit_rate, w.stable_hit_rate, w.cache_parity) == (0.4, STABLE_HITS, 0.9)
    assert "prefix-cache hit rate 40%, needs 72% (90% of the stable's 80%)" in world.st.message

    caught_up = replace(WARM, prefix_cache_hit_rate=0.75)
    tick(world, lambda _: caught_up, STABLE)

    w = world.st.warmup
    assert w is not None
    assert w.warm_at == world.now
    warmed = [e.message for e in world.plan.events if e.reason == Reason.WARMED_UP] if world.plan else []
    assert len(warmed) == 1
    assert "prefix-cache hit rate 75%, at least 72% (90% of the stable's 80%)" in warmed[0]


def test_max_duration_ends_the_warm_up_of_a_canary_that_stays_cold() -> None:
    world = World.given(spec(surge=1, maxDuration="40s"))
    world.run_until(lambda w: w.st.canary is not None, limit="2m")
    started = world.st.stage.started_at if world.st.stage is not None else None
    assert started is not None
    cold = replace(WARM, prefix_cache_hit_rate=0.1)
    while world.st.warmup is None or world.st.warmup.warm_at is None:
        tick(world, lambda _: cold, STABLE)
        assert (world.now - started).total_seconds() <= 42

    assert (world.now - started).total_seconds() >= 40
    warmed = [e.message for e in world.events if e.reason == Reason.WARMED_UP]
    assert len(warmed) == 1
    assert "judged while still cold" in warmed[0]
    assert "prefix-cache hit rate 10%, under 72% (90% of the stable's 80%)" in warmed[0]
    assert "longest warm-up (40s" in warmed[0]


def test_a_tier_that_keeps_the_cache_cold_and_slow_is_rolled_back_once_judged() -> None:
    # Default maxDuration: half the 2 m step. Over the budget throughout, its cache never catching up.
    world = World.given(spec(surge=1))
    world.run_until(lambda w: w.st.canary is not None, limit="2m")
    started = world.st.stage.started_at if world.st.stage is not None else None
    assert started is not None
    slow = replace(WARM, ttft_p99=2.5, prefix_cache_hit_rate=0.1)
    climb(world, lambda _: slow, STABLE)

    assert world.phase is Phase.ROLLED_BACK
    assert world.st.history[-1].reason == "AnalysisFailed"
    assert "1500ms" in world.st.history[-1].message
    w = next(p.status.warmup for p in reversed(world.plans) if p.status.warmup is not None)
    assert w.warm_at is not None
    assert w.judged_from is not None
    assert (w.warm_at - started).total_seconds() >= 60  # the longest warm-up: half the step
    last = world.st.last_analysis
    assert last is not None
    assert last.failing_since is not None
    assert last.failing_since >= w.judged_from  # the Fail run began once judged


def test_parity_off_or_unknown_does_not_hold_the_warm_up() -> None:
    cold = replace(WARM, prefix_cache_hit_rate=0.1)
    for policy, stable, words in (
        (spec(surge=1, cacheParity=0), STABLE, "cache parity not required"),
        (spec(surge=1), WARM, "cache parity not checked: no stable prefix-cache hit rate"),
    ):
        world = World.given(policy)
        world.run_until(lambda w: w.st.canary is not None, limit="2m")
        for _ in range(10):
            tick(world, lambda _: cold, stable)
        w = world.st.warmup
        assert w is not None
        assert w.warm_at is not None, words
        warmed = [e.message for e in world.events if e.reason == Reason.WARMED_UP]
        assert words in warmed[0]


def test_the_error_gate_acts_at_once_during_the_warm_up() -> None:
    # A canary failing half its requests is not excused by the warm-up, whatever its latency.
    world = World.given(spec(duration="10m"))
    world.run_until(lambda w: w.st.canary is not None, limit="10m")
    failing = replace(WARM, finished={"stop": 200.0, "error": 200.0})
    healthy = replace(WARM, finished={"stop": 400.0, "error": 0.0})
    for _ in range(20):
        subject = analysis_subject(world.spec, build_ladder(world.spec), world.st, world.now + timedelta(seconds=2))
        assert not subject.comparing  # still warming: 10 minutes
        tick(world, lambda _: failing, healthy)
        if world.phase is Phase.ROLLED_BACK:
            break
    assert world.phase is Phase.ROLLED_BACK
    assert "errorShare" in world.st.history[-1].message or "failed" in world.st.history[-1].message


def test_a_fail_run_begun_during_the_warm_up_does_not_survive_its_end() -> None:
    # Crafted verdicts: Pass, then Fail from 6 s before judgedFrom on. The run restarts at judgedFrom, so the
    # rollback comes sustainedFor (10 s) after it, not 4 s after it.
    world = World.given(spec(step="5m"))
    world.run_until(lambda w: w.st.canary is not None, limit="2m")
    while world.st.warmup is None or world.st.warmup.warm_at is None:
        world.tick(verdict=Verdict.PASS, advance="2s")
    judged = world.st.warmup.judged_from
    assert judged is not None
    while world.now + timedelta(seconds=2) < judged - timedelta(seconds=6):
        world.tick(verdict=Verdict.PASS, advance="2s")
    while world.now + timedelta(seconds=2) < judged:
        world.tick(verdict=Verdict.FAIL, advance="2s")
    last = world.st.last_analysis
    assert last is not None
    assert last.failing_since is not None
    assert last.failing_since < judged
    assert last.consecutive_failures >= 2

    world.tick(verdict=Verdict.FAIL, advance="2s")  # the first judged cycle

    last = world.st.last_analysis
    assert last is not None
    assert world.now >= judged
    assert last.failing_since == world.now
    assert last.consecutive_failures == 1
    fresh = world.now
    world.run_until(lambda w: w.phase is Phase.ROLLED_BACK, verdict=Verdict.FAIL, limit="1m")
    assert (world.now - fresh).total_seconds() >= 10


def test_evidence_drops_the_fail_runs_not_the_inconclusive_count_at_judged_from() -> None:
    judged = T0 + timedelta(minutes=2)
    custom = MetricResult(name="queue", passed=False, dry_run=False, failing_since=T0, sustained=True)
    last = AnalysisStatus(
        time=judged - timedelta(seconds=2),
        verdict=Verdict.FAIL,
        metrics=[custom],
        consecutive_failures=5,
        consecutive_inconclusive=0,
        failing_since=T0 + timedelta(seconds=10),
    )
    status = KVOffloadPolicyStatus(
        mode=Mode.STEP,
        warmup=WarmupStatus(
            since=T0, duration="15s", requests=50, warm_at=judged - timedelta(seconds=15), judged_from=judged
        ),
        last_analysis=last,
    )

    before = evidence_of(status, None, judged - timedelta(seconds=1))
    assert before == last  # still before judgedFrom: the run stands (the error gate acts during the warm-up)

    after = evidence_of(status, None, judged)
    assert after is not None
    assert after.failing_since is None
    assert after.consecutive_failures == 0
    assert after.metrics[0].failing_since is None
    assert after.metrics[0].sustained is False

    inconclusive = last.model_copy(
        update={"verdict": Verdict.INCONCLUSIVE, "consecutive_inconclusive": 7, "failing_since": None}
    )
    kept = evidence_of(status.model_copy(update={"last_analysis": inconclusive}), None, judged)
    assert kept is not None
    assert kept.consecutive_inconclusive == 7  # missing evidence is missing either way


def test_a_promotion_steps_warm_up_waits_for_its_fresh_pods_to_be_ready() -> None:
    # At 100% three fresh pods join a warm one: until they are Ready the warm one alone meets every condition.
    world = World.given(spec(surge=1))
    world.run_until(lambda w: w.st.stage is not None and w.st.stage.step == 1, limit="10m")
    for _ in range(20):  # 40 s: past the least 15 s
        world.tick(advance="2s", canary_ready=1)
    w = world.st.warmup
    assert w is not None
    assert w.warm_at is None
    assert "1/4 canaries Ready" in world.st.message

    for _ in range(10):  # the plan adds the rest as they become Ready (paced)
        world.tick(advance="2s")
        if world.st.warmup is not None and world.st.warmup.warm_at is not None:
            break

    w = world.st.warmup
    assert w is not None
    assert w.warm_at == world.now
    assert world.plan is not None
    assert world.plan.variants is not None
    assert world.plan.variants.canary is not None
    assert world.plan.variants.canary.replicas == 4
