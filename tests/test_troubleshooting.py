"""docs/troubleshooting.md quotes what the operator really writes.

Every quoted message in the guide (a ``> `...` `` line, ``<...>`` standing for a policy's figures)
must match, in full, the text the code produces for that failure: the rollback Events of
``rollout.decide`` for a canary OOM-killed, restarting, crash-looping or never Ready; the analysis
message and rollback for an external share of zero and an unused filesystem tier; the pause and the
PodsNotScraped condition when no series carry the policy's labels; the plan warning and the refusals around LMCache.
"""

from __future__ import annotations

import inspect
import re
from dataclasses import replace

import pytest
import yaml

from kvoffload.analysis.assess import assess
from kvoffload.analysis.measurements import Measurements, VariantSample
from kvoffload.api.crd import crd_manifest
from kvoffload.api.errors import PolicyError
from kvoffload.api.status import Phase, Verdict
from kvoffload.api.types import KVOffloadPolicy
from kvoffload.controller import children
from kvoffload.policy.ladder import build_ladder
from kvoffload.policy.loading import parse_policy
from kvoffload.policy.renderable import check_renderable
from kvoffload.policy.sizing import WarningCode, plan_spec
from tests.rollout.test_rollout import HEALTHY, Traffic, World, at_stage, in_phase, make_spec
from tests.support.paths import EXAMPLES, ROOT

GUIDE = (ROOT / "docs" / "troubleshooting.md").read_text()


def quoted() -> list[str]:
    return re.findall(r"^> `([^`]+)`", GUIDE, re.MULTILINE)


def pattern(template: str) -> re.Pattern[str]:
    """``<...>`` matches any figures; a literal ``...`` at the end matches the rest of the message."""
    parts = re.split(r"(<[^>]+>|\.\.\.)", template)
    regex = "".join(".+?" if p.startswith("<") else ".*" if p == "..." else re.escape(p) for p in parts)
    return re.compile(regex)


# --- the real messages ---------------------------------------------------------------------


def canary_failure(**fault: object) -> str:
    world = World.given(make_spec())
    world.run_until(at_stage("cpu"))
    world.tick(canary_fault=fault)
    assert world.phase is Phase.ROLLED_BACK
    return world.events[-1].message


def canary_never_ready() -> str:
    world = World.given(make_spec())
    world.run_until(at_stage("cpu"))
    world.run_until(in_phase(Phase.ROLLED_BACK), canary_ready=0, limit="1h")
    return world.events[-1].message


def no_reuse() -> tuple[str, str]:
    world = World.given(make_spec())
    world.run_until(at_stage("cpu"))
    world.run_until(in_phase(Phase.ROLLED_BACK), Traffic(canary=replace(HEALTHY, external_share=0.0)), limit="1h")
    assert world.st.last_analysis is not None
    return world.st.last_analysis.message, world.events[-1].message


def unused_filesystem_tier() -> str:
    spec = make_spec()
    nvme = next(level for level in build_ladder(spec) if level.name == "nvme")
    canary = replace(HEALTHY, tier_hits={"host": 5000.0, "disk": 0.0})
    result = assess(spec, nvme, Measurements(canary=canary, stable=HEALTHY), warmed_up=True)
    assert result.verdict is Verdict.FAIL
    return result.message


def no_labelled_series() -> tuple[str, str, str]:
    world = World.given(make_spec())
    world.run_until(in_phase(Phase.PAUSED), Traffic(canary=VariantSample(), stable=VariantSample()), limit="1h")
    (pause,) = [e for e in world.events if e.reason == "TooManyInconclusive"]
    (not_scraped,) = [e for e in world.events if e.reason == "NotScraped"]  # the PodsNotScraped condition's message
    spec = make_spec()
    cpu = next(level for level in build_ladder(spec) if level.name == "cpu")
    on_canary = assess(spec, cpu, Measurements(canary=VariantSample(), stable=HEALTHY), warmed_up=False)
    return pause.message, not_scraped.message, on_canary.message


def lmcache_policy(**model: object) -> dict[str, object]:
    doc = yaml.safe_load((EXAMPLES / "qwen3-8b-lmcache.yaml").read_text())
    doc["spec"]["model"].update(model)
    return doc


def lmcache_messages() -> list[str]:
    policy = KVOffloadPolicy.model_validate(lmcache_policy())
    warning = next(w for w in plan_spec(policy.spec).warnings if w.code is WarningCode.LMCACHE_SIZING)
    # The CRD's rule on extraArgs for vLLM policies sits on the spec, where it sees spec.engine.
    (cel,) = [
        rule["message"]
        for v in crd_manifest()["spec"]["versions"]
        for rule in v["schema"]["openAPIV3Schema"]["properties"]["spec"]["x-kubernetes-validations"]
        if rule.get("fieldPath") == ".model.extraArgs" and "self.engine != 'vllm'" in rule["rule"]
    ]
    # What kvoffload plan and the admission webhook say: the engine's own judgment (parse_policy).
    with pytest.raises(PolicyError) as refused:
        parse_policy(lmcache_policy(extraArgs=["--kv-offloading-backend", "lmcache"]))
    (error,) = refused.value.errors
    model_message = str(error)
    env = KVOffloadPolicy.model_validate(lmcache_policy(env=[{"name": "LMCACHE_MAX_LOCAL_CPU_SIZE", "value": "64"}]))
    (invalid,) = check_renderable(env)
    return [warning.message, cel, model_message, str(invalid)]


def real_messages() -> list[str]:
    share, share_rollback = no_reuse()
    paused, not_scraped, on_canary = no_labelled_series()
    pod_monitor = re.search(r'"(the PodMonitor kind is not served[^"]*)"', inspect.getsource(children))
    assert pod_monitor is not None
    return [
        canary_failure(oom_killed=True),
        canary_failure(restarts=2),
        canary_failure(crash_looping=True),
        canary_never_ready(),
        share,
        share_rollback,
        unused_filesystem_tier(),
        paused,
        not_scraped,
        on_canary,
        pod_monitor.group(1),
        *lmcache_messages(),
    ]


# --- the checks ------------------------------------------------------------------------------


def test_every_quoted_message_is_one_the_code_writes() -> None:
    messages = real_messages()
    unmatched = [t for t in quoted() if not any(pattern(t).fullmatch(m) for m in messages)]
    assert unmatched == []


def test_every_failure_the_code_writes_for_these_cases_is_quoted() -> None:
    # "no canary requests seen in the window" is quoted inline, not as a block.
    templates = [pattern(t) for t in quoted()]
    unquoted = [m for m in real_messages() if not any(p.fullmatch(m) for p in templates)]
    assert unquoted == ["no canary requests seen in the window"]
    assert "`no canary requests seen in the window`" in GUIDE


def test_a_changed_message_would_be_caught() -> None:
    oom = canary_failure(oom_killed=True)
    assert pattern("canary pod <pod> was OOMKilled at level <level> (<size> CPU tier); ...").fullmatch(oom)
    assert not pattern("canary pod <pod> was OOM-killed at level <level> (<size> CPU tier); ...").fullmatch(oom)


def test_the_guide_covers_the_six_failures() -> None:
    headings = re.findall(r"^## (.+)$", GUIDE, re.MULTILINE)
    assert headings == [
        "OOMKilled by pinned memory",
        "/dev/shm too small",
        "The external share stays at zero (no reuse)",
        "No Prometheus selects the PodMonitor",
        "The PodMonitor label mapping is missing",
        "An LMCache server sized apart from vLLM",
        "Alerts",  # a section per alert, each an alert's runbook_url (tests/observability/test_alerts.py)
    ]
