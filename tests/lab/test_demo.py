"""`kvoffload demo`: the scenario judgement, the progress view, and both scenarios end to end.

The end-to-end tests run `kvoffload demo ... --fast -o json` as a subprocess: the control plane,
a real Prometheus, emulated engines, the operator and the load generator, all real. The promote
scenario runs on the real control plane (the demo's default, marker ``kube``), the regression one
on the emulated API (``--api emulated``), so each path is run once without doubling the time.
"""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from kvoffload.analysis.measurements import Measurements, VariantSample
from kvoffload.api.status import HistoryEntry, KVOffloadPolicyStatus, Phase
from kvoffload.api.types import KVOffloadPolicy
from kvoffload.policy.ladder import build_ladder
from kvoffload_lab.demo import (
    SCENARIOS,
    Progress,
    decisions_from,
    default_policy_path,
    judge,
    load_policy_doc,
    planned_seconds,
    prepare_policy,
    progress_line,
    sample_from,
)
from tests.support import paths
from tests.support.controlplane import Kube

ROOT = paths.ROOT
T0 = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)
KVOFFLOAD = (sys.executable, "-c", "from kvoffload.cli.main import main; main()")


def demo_spec() -> Any:
    doc = load_policy_doc(default_policy_path())
    return KVOffloadPolicy.model_validate(doc).spec


LADDER = build_ladder(demo_spec())  # gpu-only, cpu-pilot, cpu, nvme


def status(
    phase: str,
    stable: tuple[int, int, int],
    canary: tuple[int, int, int] | None = None,
    decisions: tuple[str, ...] = (),
) -> KVOffloadPolicyStatus:
    """stable/canary: (level, replicas, ready)."""

    def variant(level: int, replicas: int, ready: int) -> dict[str, Any]:
        return {"configHash": f"h{level}", "level": level, "replicas": replicas, "ready": ready}

    return KVOffloadPolicyStatus.model_validate(
        {
            "phase": phase,
            "ladder": [lv.name for lv in LADDER],
            "stage": {"index": (canary or stable)[0], "name": LADDER[(canary or stable)[0]].name, "step": 0},
            "stable": variant(*stable),
            "canary": variant(*canary) if canary else None,
            "history": [
                {"time": T0.isoformat(), "stage": "cpu", "decision": d, "reason": d, "message": ""} for d in decisions
            ],
        }
    )


# --- the policy and the scenarios -------------------------------------------------------------


def test_the_embedded_policy_is_the_example_in_a_source_checkout() -> None:
    assert default_policy_path() == ROOT / "examples" / "demo-two-tier.yaml"


def test_fast_shrinks_every_duration_and_points_the_policy_at_the_demos_prometheus() -> None:
    raw = load_policy_doc(default_policy_path())
    slow = KVOffloadPolicy.model_validate(prepare_policy(raw, fast=False, prometheus_url="http://127.0.0.1:1"))
    fast = KVOffloadPolicy.model_validate(prepare_policy(raw, fast=True, prometheus_url="http://127.0.0.1:1"))
    assert fast.spec.prometheus.url == "http://127.0.0.1:1"
    assert planned_seconds(fast.spec, LADDER) < planned_seconds(slow.spec, LADDER)
    # On 2 replicas the canary already is 50%: baseline + pilot canary + cpu (canary, 100%) + nvme (canary, 100%)
    assert planned_seconds(fast.spec, LADDER) == 20 + 5 * 30
    assert raw == load_policy_doc(default_policy_path())  # the source is not changed


def test_promote_expects_stable_at_the_top_and_regression_rolled_back_one_level_down() -> None:
    promote = SCENARIOS["promote"].expectation(LADDER)
    regression = SCENARIOS["regression"].expectation(LADDER)
    assert (promote.phase, promote.level.name, promote.rollback) == (Phase.STABLE, "nvme", False)
    assert (regression.phase, regression.level.name, regression.rollback) == (Phase.ROLLED_BACK, "cpu", True)


@pytest.mark.parametrize(
    ("scenario", "seen", "done", "ok"),
    [
        pytest.param("promote", status("Stable", (3, 4, 4)), True, True, id="promote-stable-at-top"),
        pytest.param("promote", status("Stable", (3, 4, 3)), False, False, id="promote-waits-for-ready"),
        pytest.param("promote", status("Promoting", (2, 2, 2), (3, 2, 2)), False, False, id="promote-climbing"),
        pytest.param(
            "promote", status("RolledBack", (2, 4, 4), decisions=("Rollback",)), True, False, id="promote-rolled-back"
        ),
        pytest.param(
            "regression", status("RolledBack", (2, 4, 4), decisions=("Rollback",)), True, True, id="regression-ok"
        ),
        pytest.param("regression", status("RolledBack", (2, 4, 4)), True, False, id="regression-without-rollback"),
        pytest.param("regression", status("Stable", (3, 4, 4)), True, False, id="regression-not-caught"),
        pytest.param("regression", status("Paused", (2, 3, 3), (3, 1, 1)), False, False, id="regression-paused"),
    ],
)
def test_judging_when_a_scenario_has_ended_and_how(
    scenario: str, seen: KVOffloadPolicyStatus, done: bool, ok: bool
) -> None:
    verdict = judge(SCENARIOS[scenario].expectation(LADDER), seen, replicas=4)
    assert (verdict.done, verdict.ok) == (done, ok)


# --- the timeline and the progress view ---------------------------------------------------------


def test_a_sample_takes_replicas_from_the_status_and_figures_from_prometheus() -> None:
    seen = status("Promoting", (2, 2, 2), (3, 2, 1))
    measured = Measurements(
        canary=VariantSample(ttft_p99=0.21, external_share=0.31), stable=VariantSample(ttft_p99=0.38)
    )
    sample = sample_from(72.304, seen, measured)
    assert sample.t == 72.3
    assert dict(sample.replicas) == {"stable": 2, "canary": 2}
    assert dict(sample.ready) == {"stable": 2, "canary": 1}
    assert dict(sample.levels) == {"stable": "cpu", "canary": "nvme"}
    assert dict(sample.ttft_p99) == {"stable": 0.38, "canary": 0.21}
    assert dict(sample.external_share) == {"stable": None, "canary": 0.31}
    line = progress_line(sample)
    assert line.split()[:4] == ["1:12", "Promoting", "nvme", "canary"]
    assert "stable 2/2 cpu  canary 1/2 nvme" in line
    assert "TTFT 380ms/210ms" in line
    assert "ext -/31%" in line


def test_a_sample_keeps_what_offload_bought_for_the_variants_that_run() -> None:
    from kvoffload_lab.demo import Bought

    bought = Bought(
        ttft_p50={"stable": 0.05, "canary": 0.03, "ghost": 1.0},
        avoided_tokens_per_s={"stable": 0.0, "canary": 900.0},
        gpu_s_saved_per_s={"canary": 0.2},
    )
    sample = sample_from(1.0, status("Promoting", (2, 2, 2), (3, 2, 1)), None, bought)
    assert dict(sample.ttft_p50) == {"stable": 0.05, "canary": 0.03}
    assert dict(sample.avoided_tokens_per_s) == {"stable": 0.0, "canary": 900.0}
    assert dict(sample.gpu_s_saved_per_s) == {"canary": 0.2}
    assert sample_from(1.0, None, None, bought).ttft_p50 == {}  # no status: no variant runs yet


def test_decisions_are_placed_on_the_demos_clock_and_older_ones_left_out() -> None:
    history = [
        HistoryEntry(time=T0 - timedelta(seconds=5), stage="gpu-only", decision="Old", reason="Old"),
        HistoryEntry(time=T0 + timedelta(seconds=21.5), stage="cpu-pilot", decision="BaselineTaken", reason="B"),
    ]
    (only,) = decisions_from(history, T0)
    assert (only.t, only.decision) == (21.5, "BaselineTaken")


def test_on_a_terminal_the_status_line_is_redrawn_and_decisions_keep_their_own_lines() -> None:
    out = io.StringIO()
    view = Progress(out, tty=True)
    seen = status("Canary", (0, 3, 3), (1, 1, 1))
    view.sample(sample_from(1, seen, None))
    view.sample(sample_from(2, seen, None))
    (decision,) = decisions_from(
        [HistoryEntry(time=T0 + timedelta(seconds=3), stage="cpu", decision="PilotPassed", reason="P")], T0
    )
    view.decision(decision)
    view.close()
    text = out.getvalue()
    assert text.count("\r\x1b[2K") == 3  # two redraws, one clear before the decision
    assert text.endswith("0:03 => PilotPassed (P) at cpu: \n")


def test_without_a_terminal_each_cycle_is_one_line() -> None:
    out = io.StringIO()
    view = Progress(out, tty=False)
    seen = status("Canary", (0, 3, 3), (1, 1, 1))
    for t in (1, 2, 3):
        view.sample(sample_from(t, seen, None))
    view.close()
    assert len(out.getvalue().splitlines()) == 3
    assert "\x1b" not in out.getvalue()


# --- end to end ---------------------------------------------------------------------------------


def demo_replicas() -> int:
    return KVOffloadPolicy.model_validate(load_policy_doc(default_policy_path())).spec.replicas


GIVE_UP_AFTER = 300
"""Seconds the demo may take after its operator starts: inside the subprocess's 400 s, so a run that does
not end reports where it stood (its JSON, progress view and operator log) instead of being killed mute."""


def run_demo(scenario: str, out: Path, *args: str) -> tuple[dict[str, Any], subprocess.CompletedProcess[str]]:
    command = [*KVOFFLOAD, "demo", "--scenario", scenario, "--fast", "-o", "json", "--out", str(out)]
    done = subprocess.run(
        [*command, "--give-up-after", f"{GIVE_UP_AFTER}s", *args],
        capture_output=True,
        text=True,
        timeout=400,
        cwd=ROOT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        doc = json.loads(done.stdout)
    except json.JSONDecodeError:
        pytest.fail(f"stdout is not JSON (exit {done.returncode}):\n{done.stdout[-2000:]}\n{why(done, out)}")
    return doc, done


def why(done: subprocess.CompletedProcess[str], out: Path) -> str:
    """The end of the progress view and of the operator's log: where a run that went wrong stood."""
    log = out / "operator.log"
    tail = "\n".join(log.read_text(errors="replace").splitlines()[-40:]) if log.is_file() else "(no operator.log)"
    return f"{done.stderr[-6000:]}\n--- operator.log, last lines ---\n{tail}"


def pinned_kubernetes_version() -> str:
    match = re.search(r"^require k8s\.io/kubernetes (v\S+)$", (ROOT / "tools/kube/go.mod").read_text(), re.M)
    assert match
    return match.group(1)


@pytest.mark.kube
@pytest.mark.e2e
@pytest.mark.prometheus
@pytest.mark.timeout(420)
def test_demo_promote_climbs_to_the_top_and_ends_stable_with_every_replica_there(
    control_plane: Kube, tmp_path: Path
) -> None:
    # control_plane: only so that the test skips (or fails under CI) without the binaries; the demo
    # starts a control plane of its own.
    doc, done = run_demo("promote", tmp_path / "out")
    assert done.returncode == 0, why(done, tmp_path / "out")
    assert doc["cluster"] == {"api": "real", "apiServerVersion": pinned_kubernetes_version()}
    print(f"\ndemo on kube-apiserver {doc['cluster']['apiServerVersion']}, {doc['elapsed']} s")
    final = doc["status"]
    assert final["phase"] == "Stable"
    assert final["stable"]["level"] == len(final["ladder"]) - 1 == 3
    assert final["stable"]["replicas"] == final["stable"]["ready"] == demo_replicas()
    assert "canary" not in final
    assert not any(h["decision"] == "Rollback" for h in final["history"])
    # Issue 9: counted by the kubelet stand-in, not by the operator. Roles move, not pods: 2 gpu-only engines,
    # the pilot, and 2 of each level above it (9 when each promotion to 100% restarted the stable pods).
    policy = KVOffloadPolicy.model_validate(load_policy_doc(default_policy_path())).spec
    print(f"engines started {doc['summary']['podsStarted']}, fewest Ready {doc['summary']['minReadyReplicas']}")
    assert doc["summary"]["podsStarted"] == 7
    assert doc["summary"]["minReadyReplicas"] >= policy.replicas - policy.rollout.canary_replicas
    assert doc["timeline"]["samples"]
    assert Path(doc["report"]["png"]).read_bytes()[:4] == b"\x89PNG"


@pytest.mark.e2e
@pytest.mark.prometheus
@pytest.mark.timeout(420)
def test_demo_regression_rolls_the_newest_tier_back_one_level_down(tmp_path: Path) -> None:
    doc, done = run_demo("regression", tmp_path / "out", "--api", "emulated")
    assert done.returncode == 0, why(done, tmp_path / "out")
    assert doc["cluster"] == {"api": "emulated", "apiServerVersion": None}
    final = doc["status"]
    assert final["phase"] == "RolledBack"
    assert final["ladder"][final["stable"]["level"]] == "cpu"
    assert final["stable"]["replicas"] == final["stable"]["ready"] == demo_replicas()
    rollback = [h for h in final["history"] if h["decision"] == "Rollback"]
    assert rollback
    assert "ttftP99" in rollback[-1]["message"]
    assert "Rollback" in Path(doc["report"]["markdown"]).read_text()
