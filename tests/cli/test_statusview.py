"""`kvoffload status`: a person's view of one policy, rendered from crafted status objects."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pydantic import ValidationError

from kvoffload.api.status import KVOffloadPolicyStatus
from kvoffload.cli.statusview import ladder_line, render, to_json

NOW = datetime(2025, 6, 1, 12, 10, tzinfo=UTC)
LADDER = ["gpu-only", "cpu-pilot", "cpu", "nvme"]


def ago(seconds: float) -> str:
    return (NOW - timedelta(seconds=seconds)).isoformat().replace("+00:00", "Z")


def cond(type_: str, status: str, reason: str, since: float = 60, message: str = "") -> dict[str, Any]:
    return {"type": type_, "status": status, "reason": reason, "message": message, "lastTransitionTime": ago(since)}


def variant(level: int, replicas: int, ready: int, hash_: str, tiers: list[str], cpu: str | None) -> dict[str, Any]:
    return {"configHash": hash_, "level": level, "tiers": tiers, "cpuSize": cpu, "replicas": replicas, "ready": ready}


def history(*entries: tuple[float, str, str, str, str]) -> list[dict[str, Any]]:
    return [
        {"time": ago(t), "stage": stage, "decision": decision, "reason": reason, "message": message}
        for t, stage, decision, reason, message in entries
    ]


CLIMB = history(
    (600, "gpu-only", "NewLadder", "NewLadder", "ladder gpu-only → cpu-pilot → cpu → nvme"),
    (580, "cpu-pilot", "BaselineTaken", "BaselineTaken", "baseline of gpu-only taken"),
    (560, "cpu", "PilotPassed", "PilotPassed", "canary cpu-pilot passed"),
)

ANALYSIS = {
    "time": ago(5),
    "verdict": "Pass",
    "message": "every metric within budget",
    "metrics": [
        {"name": "ttftP99", "canary": 0.212, "stable": 0.388, "threshold": 0.5, "passed": True},
        {"name": "ttftP99Ratio", "canary": 0.546, "threshold": 1.5, "passed": True},
        {"name": "externalShare", "canary": 0.31, "threshold": 0.02, "passed": True},
    ],
    "consecutiveFailures": 0,
    "consecutiveInconclusive": 0,
}


def policy(status: dict[str, Any] | None, steps: list[int] | None = None) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "apiVersion": "kvoffload.io/v1alpha1",
        "kind": "KVOffloadPolicy",
        "metadata": {"name": "chat", "namespace": "llm", "generation": 1, "creationTimestamp": ago(725)},
        "spec": {"rollout": {"promotionSteps": steps or [50, 100]}},
    }
    if status is not None:
        obj["status"] = status
    return obj


def status_at(phase: str, stage: tuple[int, str, int], **extra: Any) -> dict[str, Any]:
    index, name, step = stage
    return {
        "phase": phase,
        "observedGeneration": 1,
        "ladder": LADDER,
        "stage": {"index": index, "name": name, "step": step, "startedAt": ago(20)},
        **extra,
    }


BASELINE = status_at(
    "Baseline",
    (0, "gpu-only", 0),
    stable=variant(0, 4, 4, "h0", [], None),
    conditions=[cond("Progressing", "True", "BaselineRunning")],
)
PROMOTING = status_at(
    "Promoting",
    (2, "cpu", 1),
    stable=variant(0, 2, 2, "h0", [], None),
    canary=variant(2, 2, 1, "h2", ["cpu"], "1Gi"),
    lastAnalysis=ANALYSIS,
    baseline={"ttftP99": 0.388, "itlP99": 0.011, "requestRate": 3.2, "gpuKvUsage": 0.93, "takenAt": ago(580)},
    hostMemory={"pinned": "1Gi", "shm": "2Gi", "request": "7Gi", "limit": "7Gi"},
    conditions=[cond("Progressing", "True", "PromotionRunning"), cond("Ready", "False", "RolloutInProgress")],
    history=CLIMB,
    message="cpu at 50%: 20s of 20s",
)
STABLE = status_at(
    "Stable",
    (3, "nvme", 0),
    stable=variant(3, 4, 4, "h3", ["cpu", "nvme"], "1Gi"),
    conditions=[cond("Ready", "True", "LadderComplete")],
)
ROLLED_BACK = status_at(
    "RolledBack",
    (2, "cpu", 0),
    stable=variant(2, 4, 4, "h2", ["cpu"], "1Gi"),
    conditions=[cond("Degraded", "True", "AnalysisFailed", 10, "canary failed for 6s")],
    history=[
        *CLIMB,
        *history(
            (60, "nvme", "LevelPromoted", "LevelPromoted", "cpu is stable; canary nvme"),
            (10, "cpu", "Rollback", "AnalysisFailed", "canary failed for 6s: ttftP99 canary 1.6s / stable 390.0ms"),
        ),
    ],
)
PAUSED_CANARY = status_at(
    "Paused",
    (1, "cpu-pilot", 0),
    stable=variant(0, 3, 3, "h0", [], None),
    canary=variant(1, 1, 1, "h1", ["cpu"], "256Mi"),
    conditions=[cond("Paused", "True", "Paused")],
)


HELD = status_at(
    "Held",
    (0, "gpu-only", 0),
    stable=variant(0, 4, 4, "h0", [], None),
    baseline={
        "ttftP99": 0.4,
        "takenAt": ago(30),
        "promptTokens": {"p50": 916.7, "p95": 1875.0, "p99": 1975.0},
        "ttft": {"p50": 0.125, "p95": 0.2375, "p99": 0.2475},
        "e2eLatency": {"p50": 0.9, "p95": 1.5, "p99": 1.62},
        "concurrency": 6.5,
        "prefixCacheHitRate": 0.3,
        "gpuKvUsageMax": 0.55,
        "preemptionRate": 0.0,
    },
    preflight={
        "judgedAt": ago(30),
        "pays": False,
        "refused": ["GPUMemoryNotConstrained"],
        "message": "offload will not pay: GPU memory is not the constraint (max GPU KV usage 55% (kvPressure 90%))",
    },
    conditions=[cond("OffloadWillNotPay", "True", "GPUMemoryNotConstrained"), cond("Stalled", "True", "Held")],
)


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        pytest.param(BASELINE, "[gpu-only baseline] → cpu-pilot → cpu → nvme", id="baseline"),
        pytest.param(HELD, "[gpu-only held: offload will not pay] → cpu-pilot → cpu → nvme", id="held"),
        pytest.param(PAUSED_CANARY, "gpu-only ✓ → [cpu-pilot canary paused] → cpu → nvme", id="paused-canary"),
        pytest.param(PROMOTING, "gpu-only ✓ → cpu-pilot ✓ → [cpu 50%] → nvme", id="promoting"),
        pytest.param(STABLE, "gpu-only ✓ → cpu-pilot ✓ → cpu ✓ → [nvme ✓]", id="stable-at-top"),
        pytest.param(ROLLED_BACK, "gpu-only ✓ → cpu-pilot ✓ → [cpu] → nvme ✗", id="rolled-back"),
    ],
)
def test_the_ladder_marks_where_the_rollout_stands(status: dict[str, Any], expected: str) -> None:
    assert ladder_line(KVOffloadPolicyStatus.model_validate(status), [50, 100]) == expected
    assert f"Ladder: {expected}" in render(policy(status), now=NOW)


def test_a_promoting_policy_shows_header_variants_baseline_analysis_memory_conditions_and_history() -> None:
    text = render(policy(PROMOTING), now=NOW)
    lines = text.splitlines()
    assert lines[0] == "llm/chat  phase Promoting  stage 2 cpu (50%, for 20s)  age 12m5s"
    assert lines[1] == "  cpu at 50%: 20s of 20s"
    # Variants: level, tiers, replicas ready/desired, config hash.
    assert any(line.split() == ["stable", "0", "gpu-only", "none", "-", "2/2", "h0"] for line in lines)
    assert any(line.split() == ["canary", "2", "cpu", "cpu", "1Gi", "1/2", "h2"] for line in lines)
    assert "Baseline: p99 TTFT 388.0ms, p99 ITL 11.0ms, 3.20 req/s, GPU KV usage 93% (taken 9m40s ago)" in text
    assert "Last analysis: Pass 5s ago (failures in a row 0, inconclusive in a row 0)" in text
    assert any(line.split() == ["ttftP99", "212.0ms", "388.0ms", "<=", "500.0ms", "pass"] for line in lines)
    assert any(line.split()[:5] == ["externalShare", "31.0%", "-", ">=", "2.0%"] for line in lines)
    assert "Host memory per replica: pinned 1Gi, /dev/shm 2Gi, request 7Gi, limit 7Gi" in text
    assert any(line.split()[:4] == ["Progressing", "True", "PromotionRunning", "1m"] for line in lines)
    history_rows = lines[lines.index("History (oldest first):") + 2 :]
    assert [row.split()[:4] for row in history_rows] == [
        ["12:00:00Z", "gpu-only", "NewLadder", "NewLadder"],
        ["12:00:20Z", "cpu-pilot", "BaselineTaken", "BaselineTaken"],
        ["12:00:40Z", "cpu", "PilotPassed", "PilotPassed"],
    ]


def test_a_failed_metric_reads_fail_and_the_streak_is_shown() -> None:
    failing = {
        **ANALYSIS,
        "verdict": "Fail",
        "message": "ttftP99 over budget",
        "metrics": [{"name": "ttftP99", "canary": 1.6, "stable": 0.39, "threshold": 0.5, "passed": False}],
        "consecutiveFailures": 3,
        "failingSince": ago(6),
    }
    text = render(policy({**PROMOTING, "lastAnalysis": failing}), now=NOW)
    assert "Last analysis: Fail 5s ago (failures in a row 3, inconclusive in a row 0, failing for 6s)" in text
    assert any(
        line.split() == ["ttftP99", "1600.0ms", "390.0ms", "<=", "500.0ms", "FAIL"] for line in text.splitlines()
    )


def test_a_rollback_shows_in_the_history_with_its_figures() -> None:
    text = render(policy(ROLLED_BACK), now=NOW)
    assert text.splitlines()[0] == "llm/chat  phase RolledBack  stage 2 cpu (for 20s)  age 12m5s"
    rollback = next(line for line in text.splitlines() if "Rollback" in line)
    assert rollback.split()[:4] == ["12:09:50Z", "cpu", "Rollback", "AnalysisFailed"]
    assert "ttftP99 canary 1.6s / stable 390.0ms" in rollback
    assert "Baseline: not taken yet" in text
    assert "Last analysis: none" in text


def test_a_policy_the_operator_has_not_seen_says_so() -> None:
    text = render(policy(None), now=NOW)
    assert text.startswith("llm/chat: no status yet (age 12m5s)")
    assert "kvoffload run" in text


def test_a_spec_change_not_yet_acted_on_is_pointed_out() -> None:
    obj = policy(STABLE)
    obj["metadata"]["generation"] = 2
    assert "spec generation 2 not yet acted on; status is for 1" in render(obj, now=NOW)


def test_a_status_the_model_cannot_read_raises_a_validation_error() -> None:
    with pytest.raises(ValidationError, match="phase"):
        render(policy({**BASELINE, "phase": "Exploding"}), now=NOW)


def test_json_carries_the_status_as_the_model_reads_it() -> None:
    doc = to_json(policy(PROMOTING))
    assert (doc["name"], doc["namespace"], doc["generation"]) == ("chat", "llm", 1)
    assert doc["status"]["phase"] == "Promoting"
    assert doc["status"]["canary"]["ready"] == 1
    assert doc["status"]["lastAnalysis"]["metrics"][0]["canary"] == 0.212
    assert to_json(policy(None))["status"] is None


def test_a_held_policy_shows_the_workload_and_the_preflight_verdict() -> None:
    text = render(policy(HELD), now=NOW)
    assert "phase Held" in text
    assert (
        "  workload: p50 / p95 / p99 prompt tokens 917 / 1,875 / 1,975, TTFT 125.0ms / 237.5ms / 247.5ms, "
        "end-to-end 900.0ms / 1.50s / 1.62s, 6.5 running per engine, prefix-cache hits 30.0%, "
        "max GPU KV usage 55%, 0 preemptions/s"
    ) in text
    assert "Preflight (30s ago): offload will not pay: GPU memory is not the constraint" in text


# --- how sure each row is (issue 37) -----------------------------------------------------------------

SURE = {
    **ANALYSIS,
    "verdict": "Fail",
    "message": "ttftP99Ratio over maxRegression",
    "metrics": [
        {"name": "requests", "canary": 412, "threshold": 50, "passed": True},
        # The interval here bounds the share of requests over the budget, not the p99: not shown.
        {
            "name": "ttftP99",
            "canary": 0.412,
            "stable": 0.388,
            "threshold": 0.5,
            "passed": True,
            "pValue": 0.93,
            "alpha": 8.3e-05,
            "interval": [0.002, 0.031],
        },
        {
            "name": "ttftP99Ratio",
            "canary": 1.31,
            "threshold": 1.2,
            "passed": False,
            "message": "canary p99 1.31x the stable's",
            "pValue": 3e-05,
            "alpha": 8e-05,
            "interval": [1.18, 1.45],
        },
        {
            "name": "itlP99Ratio",
            "canary": 1.25,
            "threshold": 1.2,
            "passed": None,
            "message": "over 1.20x, not yet sure",
            "pValue": 0.0021,
            "alpha": 8.3e-05,
            "interval": [1.02, 1.61],
            "requestsNeeded": 12400,
        },
        {
            "name": "errorShare",
            "canary": 0.004,
            "threshold": 0.01,
            "passed": True,
            "pValue": 0.99,
            "alpha": 8.3e-05,
            "interval": [0.001, 0.012],
        },
        {"name": "externalShare", "canary": 0.31, "threshold": 0.02, "passed": True},
    ],
}


def metric_table(text: str) -> dict[str, str]:
    """The metric table's lines by their first cell (the header under METRIC)."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.split()[:1] == ["METRIC"])
    table = {}
    for line in lines[start:]:
        if not line.startswith("  ") or not line.strip():
            break
        table[line.split()[0]] = line
    return table


def cells(line: str) -> list[str]:
    """A table line's cells: columns are two spaces apart at least, and no cell holds two spaces."""
    return re.split(r" {2,}", line.strip())


def test_each_row_says_how_sure_it_is_in_an_evidence_column() -> None:
    rows = metric_table(render(policy({**PROMOTING, "lastAnalysis": SURE}), now=NOW))
    header = rows["METRIC"]
    assert cells(header) == ["METRIC", "CANARY", "STABLE", "THRESHOLD", "RESULT", "EVIDENCE", "WHY"]
    column = header.index("EVIDENCE")
    assert all(line[column - 2 : column] == "  " for line in rows.values())  # one column for every row
    assert cells(rows["ttftP99Ratio"]) == [
        "ttftP99Ratio", "1.31x", "-", "<= 1.20x", "FAIL", "[1.18x, 1.45x] p=3e-05 (alpha 8e-05)",
        "canary p99 1.31x the stable's",
    ]  # fmt: skip
    # A p99 row: the p-value of its budget test, and no interval in another unit beside its milliseconds.
    assert cells(rows["ttftP99"])[5:] == ["p=0.93 (alpha 8.3e-05)"]
    assert cells(rows["errorShare"])[5:] == ["[0.1%, 1.2%] p=0.99 (alpha 8.3e-05)"]
    # Inconclusive: the requests the breach would need, after its reason.
    assert cells(rows["itlP99Ratio"])[4:] == [
        "-", "[1.02x, 1.61x] p=0.0021 (alpha 8.3e-05)", "over 1.20x, not yet sure; needs ~12,400 canary requests"
    ]  # fmt: skip
    assert cells(rows["requests"])[5:] == ["-"]
    assert cells(rows["externalShare"]) == ["externalShare", "31.0%", "-", ">= 2.0%", "pass", "-"]
    # The fixed columns leave the reason room on a 120-column terminal.
    assert header.index("WHY") <= 100


def test_rows_without_evidence_read_as_before() -> None:
    # No EVIDENCE column at all; an Inconclusive row's needs still follow its reason.
    text = render(policy(PROMOTING), now=NOW)
    assert metric_table(text) == {
        "METRIC": "  METRIC         CANARY   STABLE   THRESHOLD   RESULT  WHY",
        "ttftP99": "  ttftP99        212.0ms  388.0ms  <= 500.0ms  pass",
        "ttftP99Ratio": "  ttftP99Ratio   0.55x    -        <= 1.50x    pass",
        "externalShare": "  externalShare  31.0%    -        >= 2.0%     pass",
    }
    waiting = {
        **ANALYSIS,
        "metrics": [{"name": "ttftP99Ratio", "canary": 1.3, "threshold": 1.2, "requestsNeeded": 640}],
    }
    rows = metric_table(render(policy({**PROMOTING, "lastAnalysis": waiting}), now=NOW))
    assert cells(rows["METRIC"]) == ["METRIC", "CANARY", "STABLE", "THRESHOLD", "RESULT", "WHY"]
    assert cells(rows["ttftP99Ratio"]) == ["ttftP99Ratio", "1.30x", "-", "<= 1.20x", "-", "needs ~640 canary requests"]


def test_json_carries_the_evidence_where_there_is_some() -> None:
    metrics = to_json(policy({**PROMOTING, "lastAnalysis": SURE}))["status"]["lastAnalysis"]["metrics"]
    by_name = {m["name"]: m for m in metrics}
    assert {k: by_name["itlP99Ratio"][k] for k in ("pValue", "alpha", "interval", "requestsNeeded")} == {
        "pValue": 0.0021,
        "alpha": 8.3e-05,
        "interval": [1.02, 1.61],
        "requestsNeeded": 12400,
    }
    assert by_name["ttftP99"]["interval"] == [0.002, 0.031]  # the JSON is the model's: every field, as written
    assert not {"pValue", "alpha", "interval", "requestsNeeded"} & set(by_name["externalShare"])


def test_the_requests_needed_are_said_once_when_the_message_says_them() -> None:
    said = "over maxRegression 1.2, not yet beyond chance; about 12400 canary requests would settle it"
    row = {"name": "itlP99Ratio", "canary": 1.25, "threshold": 1.2, "message": said, "requestsNeeded": 12400}
    rows = metric_table(render(policy({**PROMOTING, "lastAnalysis": {**ANALYSIS, "metrics": [row]}}), now=NOW))
    assert cells(rows["itlP99Ratio"])[-1] == said
