"""`kvoffload status NAME --watch --timeout D`: a pipeline waits for a rollout and reads the outcome in the exit code.

0 on Stable, 1 on RolledBack, Invalid or Held, 3 on Paused or timeout. The pure part (which phase ends a
watch, with which code, and the line each change prints) is checked over the statuses captured from real
runs of the operator (tests/data/status) and a Held one decided by decide(); the command itself runs as a
subprocess against the real kube-apiserver while the test writes those statuses through the status
subresource, as the operator does, and reads the lines it prints as they come.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from click.testing import CliRunner

from kvoffload.api.conventions import API_GROUP, API_VERSION, KIND
from kvoffload.api.status import Phase
from kvoffload.cli import watch
from kvoffload.cli.common import EXIT_BAD_INPUT, EXIT_FAIL, EXIT_INCONCLUSIVE, EXIT_OK
from kvoffload.cli.control import PolicyWatch
from kvoffload.cli.main import main
from kvoffload.cli.statusview import short_age
from tests.rollout.test_preflight import PRESSED, SLOW_RESTORE, hold_at_the_end_of_the_baseline
from tests.support.controlplane import Kube, wait_for
from tests.support.status_fixtures import load

CLI = (sys.executable, "-c", "from kvoffload.cli.main import main; main()")
NOW = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)


def held_policy() -> dict[str, Any]:
    """A policy whose status decide() wrote when the preflight found that offload cannot pay."""
    world = hold_at_the_end_of_the_baseline(SLOW_RESTORE, PRESSED)
    assert world.phase is Phase.HELD
    return {
        "metadata": {"name": "held", "namespace": "default", "generation": world.generation},
        "spec": {},
        "status": world.st.model_dump(mode="json", by_alias=True, exclude_none=True),
    }


# --- which phase ends a watch, and how ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("capture", "code"),
    [
        ("stable", EXIT_OK),
        ("rolled-back", EXIT_FAIL),
        ("invalid", EXIT_FAIL),
        ("paused-by-person", EXIT_INCONCLUSIVE),
        ("paused-inconclusive", EXIT_INCONCLUSIVE),
        ("pending", None),
        ("baseline", None),
        ("canary", None),
        ("promoting", None),
        ("generation-lag", None),  # Stable, but for the spec before the last change: not yet
    ],
)
def test_a_watch_ends_on_stable_rolled_back_invalid_and_paused_and_goes_on_otherwise(
    capture: str, code: int | None
) -> None:
    assert watch.outcome(watch.progress(load(capture))) == code


def test_held_by_the_preflight_ends_a_watch_with_1_as_the_other_stalled_phases_do() -> None:
    state = watch.progress(held_policy())
    assert state.phase == "Held"
    assert state.reason == "RestoreNotFaster"
    assert state.step == "held"
    assert watch.outcome(state) == EXIT_FAIL


def test_every_phase_that_ends_a_watch_says_what_comes_next() -> None:
    assert set(watch.EXIT_CODES) == set(watch.NEXT_STEP)
    assert {p for p in Phase if p not in watch.EXIT_CODES} == {
        Phase.PENDING,
        Phase.BASELINE,
        Phase.CANARY,
        Phase.PROMOTING,
    }


@pytest.mark.parametrize(
    ("capture", "expected"),
    [
        ("baseline", "default/climb  Baseline  level 0 gpu-only  step baseline  reason BaselineRunning: "),
        ("canary", "default/climb  Canary  level 1 cpu  step canary  reason CanaryRunning: canary cpu: "),
        ("promoting", "default/climb  Promoting  level 1 cpu  step 100%  reason PromotionRunning: "),
        ("stable", "default/climb  Stable  level 2 nvme  step ✓  reason LadderComplete: nvme at 100% passed"),
        (
            "rolled-back",
            "default/rollback  RolledBack  level 1 cpu  step -  reason AnalysisFailed: canary failed for 5s",
        ),
        (
            "paused-by-person",
            "default/paused  Paused  level 1 cpu  step canary paused  reason Paused: paused by kvoffload.io/pause",
        ),
        (
            "paused-inconclusive",
            "default/blind  Paused  level 1 cpu  step canary paused  reason TooManyInconclusive: paused: 4",
        ),
        ("invalid", "default/broken  Invalid  level -  step -  reason SpecInvalid: invalid spec: spec.gpu.class"),
        ("pending", "default/climb  Pending  level -  step -  reason -: the operator has not acted on it yet"),
        (
            "generation-lag",
            "Stable  level 2 nvme  step ✓  reason LadderComplete  (waiting for the operator to act on generation 2; "
            "the status is for 1): ",
        ),
    ],
)
def test_each_line_names_the_phase_level_step_and_reason(capture: str, expected: str) -> None:
    line = watch.progress(load(capture)).line(NOW)
    assert line.startswith("12:00:00Z  ")
    assert expected in line


def observe_only_stable_policy() -> dict[str, Any]:
    """A policy whose status decide() wrote when an observe-only climb reached the top: Stable, nothing applied."""
    from tests.rollout.test_observe import Fleet, observe_spec

    fleet = Fleet(observe_spec())
    fleet.run(240)
    assert fleet.status is not None
    assert fleet.status.phase is Phase.STABLE
    return {
        "metadata": {"name": "watched", "namespace": "llm", "generation": fleet.generation},
        "spec": fleet.spec.model_dump(mode="json", by_alias=True, exclude_none=True),
        "status": fleet.status.model_dump(mode="json", by_alias=True, exclude_none=True),
    }


def test_an_observe_only_policy_at_stable_ends_with_0_and_says_nothing_was_applied() -> None:
    state = watch.progress(observe_only_stable_policy())
    assert (state.phase, state.observe_only) == ("Stable", True)
    assert watch.outcome(state) == EXIT_OK  # Stable is where an observe-only climb ends: 0, documented
    assert "(observe-only: nothing was applied)" in state.line(NOW)
    assert json.loads(state.json_line(NOW))["observeOnly"] is True
    last = watch.final_line(state, EXIT_OK, "kvoffload")
    assert last.startswith("kvoffload status: llm/watched is Stable (observe-only: nothing was applied): ")
    assert "no pod runs its top level" in last
    assert "the top level runs on every replica" not in last
    assert last.endswith("(exit 0)")


def test_an_applied_policy_at_stable_says_its_top_level_runs() -> None:
    state = watch.progress(load("stable"))
    assert not state.observe_only
    assert "observe-only" not in state.line(NOW)
    assert json.loads(state.json_line(NOW))["observeOnly"] is False
    assert watch.final_line(state, EXIT_OK, "kvoffload") == (
        "kvoffload status: default/climb is Stable: the top level runs on every replica (exit 0)"
    )


def test_the_help_tells_that_an_observe_only_policy_ends_stable_with_0() -> None:
    result = CliRunner().invoke(main, ["status", "--help"])
    assert result.exit_code == 0
    assert "observe-only" in result.output
    assert "nothing was applied" in result.output


def test_a_new_message_alone_prints_no_new_line_but_a_new_step_does() -> None:
    before = load("canary")
    later = load("canary")
    later["status"]["message"] = "canary cpu: 4s of 6s, last verdict Pass"
    assert watch.progress(later).key() == watch.progress(before).key()
    assert watch.progress(load("promoting")).key() != watch.progress(before).key()


def test_the_json_line_carries_the_same_fields() -> None:
    doc = json.loads(watch.progress(load("generation-lag")).json_line(NOW))
    assert doc["time"] == "2026-12-05T12:00:00Z"
    assert (doc["namespace"], doc["name"], doc["phase"], doc["level"], doc["levelName"]) == (
        "default",
        "climb",
        "Stable",
        2,
        "nvme",
    )
    assert (doc["generation"], doc["observedGeneration"], doc["lagging"]) == (2, 1, True)


# --- the command's own checks ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "complaint"),
    [
        (["--watch", "--timeout", "soon"], "'soon' is not a duration"),
        (["--watch", "--timeout", "-5s"], "'-5s' is not a duration"),
        (["--timeout", "10m"], "--timeout needs --watch"),
    ],
)
def test_a_bad_timeout_is_bad_input_before_any_request(args: list[str], complaint: str) -> None:
    result = CliRunner().invoke(main, ["status", "demo", "--kubeconfig", "/nonexistent", *args])
    assert result.exit_code == EXIT_BAD_INPUT, result.output
    assert complaint in result.output


@pytest.mark.parametrize(("text", "seconds"), [("90s", 90), ("10m", 600), ("1h30m", 5400), ("45", 45), ("0", 0)])
def test_timeout_takes_go_durations_and_bare_seconds(text: str, seconds: float) -> None:
    from kvoffload.cli.common import Duration

    assert Duration().convert(text, None, None) == seconds


@pytest.mark.parametrize(
    ("ago", "shown"),
    [
        (timedelta(seconds=45), "45s"),
        (timedelta(minutes=3, seconds=12), "3m12s"),
        (timedelta(minutes=42), "42m"),
        (timedelta(hours=5, minutes=3), "5h3m"),
        (timedelta(hours=30), "30h"),
        (timedelta(days=3, hours=4), "3d4h"),
        (timedelta(days=40), "40d"),
        (timedelta(days=800), "2y"),
    ],
)
def test_ages_read_as_kubectl_prints_them(ago: timedelta, shown: str) -> None:
    assert short_age(NOW - ago, NOW) == shown


# --- against the real API server ----------------------------------------------------------------------------


class Watching:
    """``kvoffload status NAME --watch`` running as a subprocess; its lines read as they come."""

    def __init__(self, kube: Kube, namespace: str, name: str, *args: str) -> None:
        command = [*CLI, "status", name, "-n", namespace, "--watch", *args, "--kubeconfig", str(kube.kubeconfig)]
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        self.lines: queue.Queue[str] = queue.Queue()
        self.printed: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line.rstrip("\n"))

    def next_line(self, timeout: float = 30) -> str:
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            pytest.fail(f"no new line from the watch in {timeout:.0f} s; printed so far: {self.printed}")
        self.printed.append(line)
        return line

    def exit(self, timeout: float = 30) -> tuple[int, str]:
        """The exit code and stderr; the lines still unread are appended to ``printed``."""
        try:
            code = self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            pytest.fail(f"the watch did not end in {timeout:.0f} s; printed: {self.printed}")
        self._reader.join(timeout=10)
        while not self.lines.empty():
            self.printed.append(self.lines.get())
        assert self.process.stderr is not None
        return code, self.process.stderr.read()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        for pipe in (self.process.stdout, self.process.stderr):
            if pipe is not None:
                pipe.close()


@pytest.fixture(scope="module")
def namespace(kube_crd: Kube) -> str:
    return kube_crd.namespace("watch")


@pytest.fixture
def watches() -> Iterator[list[Watching]]:
    started: list[Watching] = []
    yield started
    for w in started:
        w.stop()


def create(kube: Kube, namespace: str, name: str) -> None:
    """The captured runs' policy (every duration in seconds), as `kubectl apply` creates it: generation 1."""
    policy = {
        "apiVersion": f"{API_GROUP}/{API_VERSION}",
        "kind": KIND,
        "metadata": {"name": name, "namespace": namespace},
        "spec": load("stable")["spec"],
    }
    kube.kubectl("apply", "-f", "-", stdin=json.dumps(policy))


def write_status(kube: Kube, namespace: str, name: str, capture: str, **changes: Any) -> None:
    """The captured status, written whole through the status subresource as the operator writes it."""
    status = {**load(capture)["status"], **changes}
    patch = [{"op": "add", "path": "/status", "value": status}]
    kube.kubectl("patch", "kvop", name, "-n", namespace, "--subresource=status", "--type=json", "-p", json.dumps(patch))


def start(kube: Kube, watches: list[Watching], namespace: str, name: str, *args: str) -> Watching:
    w = Watching(kube, namespace, name, *args)
    watches.append(w)
    return w


@pytest.mark.kube
@pytest.mark.parametrize(
    ("name", "climb", "code", "said"),
    [
        ("climbs", ["baseline", "canary", "promoting", "stable"], EXIT_OK, "is Stable: the top level runs"),
        ("rolls-back", ["canary", "rolled-back"], EXIT_FAIL, "is RolledBack: a rollback or an abort halted the ladder"),
        ("turns-invalid", ["baseline", "invalid"], EXIT_FAIL, "is Invalid: the spec fails validation"),
        ("paused", ["canary", "paused-by-person"], EXIT_INCONCLUSIVE, "nothing advances until `kvoffload resume"),
        ("inconclusive", ["canary", "paused-inconclusive"], EXIT_INCONCLUSIVE, "is Paused"),
    ],
)
def test_the_watch_prints_each_change_the_operator_writes_and_exits_with_the_outcome(
    kube_crd: Kube, namespace: str, watches: list[Watching], name: str, climb: list[str], code: int, said: str
) -> None:
    # Given a policy the operator has started on
    create(kube_crd, namespace, name)
    write_status(kube_crd, namespace, name, climb[0])

    # When a pipeline watches it while the operator writes each next status
    w = start(kube_crd, watches, namespace, name, "--timeout", "60s")
    for capture in climb:
        if capture != climb[0]:
            write_status(kube_crd, namespace, name, capture)
        phase = load(capture)["status"]["phase"]
        assert f"  {namespace}/{name}  {phase}  " in w.next_line()

    # Then it ends by itself on the last one, with its exit code
    exit_code, stderr = w.exit()
    assert exit_code == code, stderr
    assert said in stderr
    assert len(w.printed) == len(climb)  # one line per change, none repeated


@pytest.mark.kube
def test_the_timeout_ends_a_watch_that_does_not_come_to_rest_with_3(
    kube_crd: Kube, namespace: str, watches: list[Watching]
) -> None:
    create(kube_crd, namespace, "slow")
    write_status(kube_crd, namespace, "slow", "canary")
    began = time.monotonic()

    w = start(kube_crd, watches, namespace, "slow", "--timeout", "2s")

    exit_code, stderr = w.exit()
    assert exit_code == EXIT_INCONCLUSIVE, stderr
    assert time.monotonic() - began >= 2
    assert f"timed out after 2s waiting for {namespace}/slow to come to rest (still Canary)" in stderr
    assert len(w.printed) == 1
    assert "Canary  level 1 cpu  step canary" in w.printed[0]


@pytest.mark.kube
def test_a_stable_status_for_the_previous_spec_does_not_end_the_watch_until_the_operator_acts_on_the_new_one(
    kube_crd: Kube, namespace: str, watches: list[Watching]
) -> None:
    # Given a Stable policy whose spec a pipeline has just changed (generation 2, status still for 1)
    create(kube_crd, namespace, "applied")
    write_status(kube_crd, namespace, "applied", "stable")
    kube_crd.kubectl(
        "patch", "kvop", "applied", "-n", namespace, "--type=merge", "-p", '{"spec":{"analysis":{"ttftP99":"400ms"}}}'
    )
    assert kube_crd.get("kvop", "applied", "-n", namespace)["metadata"]["generation"] == 2

    # When the pipeline watches it, it waits
    w = start(kube_crd, watches, namespace, "applied", "--timeout", "60s")
    waiting = "(waiting for the operator to act on generation 2; the status is for 1): "
    assert f"Stable  level 2 nvme  step ✓  reason LadderComplete  {waiting}" in w.next_line()

    # and the operator's new ladder, then its Stable for generation 2, end it with 0
    write_status(kube_crd, namespace, "applied", "baseline", observedGeneration=2)
    assert "  Baseline  level 0 gpu-only  step baseline" in w.next_line()
    write_status(kube_crd, namespace, "applied", "stable", observedGeneration=2)
    assert "  Stable  level 2 nvme  step ✓  reason LadderComplete: " in w.next_line()
    exit_code, stderr = w.exit()
    assert exit_code == EXIT_OK, stderr


@pytest.mark.kube
def test_a_policy_deleted_during_the_watch_ends_it_with_1(
    kube_crd: Kube, namespace: str, watches: list[Watching]
) -> None:
    create(kube_crd, namespace, "deleted")
    write_status(kube_crd, namespace, "deleted", "canary")
    w = start(kube_crd, watches, namespace, "deleted", "--timeout", "60s")
    assert "  Canary  " in w.next_line()

    kube_crd.kubectl("delete", "kvop", "deleted", "-n", namespace)

    exit_code, stderr = w.exit()
    assert exit_code == EXIT_FAIL
    assert f"{KIND} {namespace}/deleted was deleted" in stderr


@pytest.mark.kube
def test_a_missing_policy_ends_the_watch_at_once_with_1(
    kube_crd: Kube, namespace: str, watches: list[Watching]
) -> None:
    w = start(kube_crd, watches, namespace, "nobody", "--timeout", "60s")
    exit_code, stderr = w.exit()
    assert exit_code == EXIT_FAIL
    assert f"no {KIND} 'nobody' in namespace '{namespace}'" in stderr
    assert w.printed == []


@pytest.mark.kube
def test_with_o_json_each_change_is_one_json_object_per_line(
    kube_crd: Kube, namespace: str, watches: list[Watching]
) -> None:
    create(kube_crd, namespace, "as-json")
    write_status(kube_crd, namespace, "as-json", "promoting")
    w = start(kube_crd, watches, namespace, "as-json", "-o", "json", "--timeout", "60s")
    first = json.loads(w.next_line())
    write_status(kube_crd, namespace, "as-json", "stable")
    last = json.loads(w.next_line())

    assert w.exit()[0] == EXIT_OK
    assert (first["phase"], first["level"], first["step"], first["reason"]) == (
        "Promoting",
        1,
        "100%",
        "PromotionRunning",
    )
    assert (last["phase"], last["levelName"], last["reason"], last["lagging"]) == (
        "Stable",
        "nvme",
        "LadderComplete",
        False,
    )


@pytest.mark.kube
def test_the_watch_resumes_from_its_last_version_after_the_api_server_ends_a_stream(
    kube_crd: Kube, namespace: str
) -> None:
    # Given a watch whose every stream the API server ends after 1 s
    create(kube_crd, namespace, "long")
    write_status(kube_crd, namespace, "long", "canary")
    follower = PolicyWatch(kube_crd.api_client, namespace, "long", deadline=time.monotonic() + 60, window_s=1)
    phases: queue.Queue[str] = queue.Queue()

    def follow() -> None:
        for obj in follower:
            phases.put(obj["status"]["phase"])
            if obj["status"]["phase"] == "Stable":
                return

    thread = threading.Thread(target=follow, daemon=True)
    thread.start()
    assert phases.get(timeout=30) == "Canary"

    # When two streams have ended with nothing to tell, and only then the operator writes Stable
    wait_for(lambda: follower.streams >= 3, "a third watch stream", timeout=30, poll=0.1)
    write_status(kube_crd, namespace, "long", "stable")

    # Then the watch still sees it, once, from where it left off
    assert phases.get(timeout=30) == "Stable"
    thread.join(timeout=10)
    assert phases.empty()


class ScriptedWatch:
    """Stands in for ``kubernetes.watch.Watch``: each stream() plays the next scripted answer."""

    def __init__(self, script: list[Any], calls: list[dict[str, Any]]) -> None:
        self.script, self.calls = script, calls

    def stream(self, func: Any, *args: Any, **kwargs: Any) -> Iterator[dict[str, Any]]:
        self.calls.append(kwargs)
        answer = self.script.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        yield from answer


def obj(version: str, phase: str) -> dict[str, Any]:
    return {"metadata": {"name": "p", "namespace": "ns", "resourceVersion": version}, "status": {"phase": phase}}


def test_the_watch_reconnects_after_errors_relists_after_410_and_resumes_from_the_last_version(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import urllib3.exceptions
    from kubernetes.client.exceptions import ApiException

    from kvoffload.cli import control

    reads = iter([obj("10", "Baseline"), obj("20", "Canary")])
    monkeypatch.setattr(control, "read_policy", lambda *args: next(reads))
    calls: list[dict[str, Any]] = []
    script: list[Any] = [
        [{"type": "MODIFIED", "object": obj("11", "Baseline")}, {"type": "BOOKMARK", "object": obj("15", "")}],
        urllib3.exceptions.ProtocolError("connection reset"),
        ApiException(status=500, reason="etcd leader changed"),
        ApiException(status=410, reason="Expired: too old resource version"),
        [{"type": "MODIFIED", "object": obj("21", "Stable")}],
    ]
    monkeypatch.setattr(control.kubernetes.watch, "Watch", lambda: ScriptedWatch(script, calls))
    slept: list[float] = []

    follower = control.PolicyWatch(object(), "ns", "p", deadline=1e9, clock=lambda: 0.0, sleep=slept.append)  # type: ignore[arg-type]
    seen = []
    for o in follower:
        seen.append((o["metadata"]["resourceVersion"], o["status"]["phase"]))
        if o["status"]["phase"] == "Stable":
            break

    # Every version once, the bookmark skipped; the relisted object counts as a version too
    assert seen == [("10", "Baseline"), ("11", "Baseline"), ("20", "Canary"), ("21", "Stable")]
    # each stream resumed from the newest version seen: the bookmark's after the stream it ended
    assert [c["resource_version"] for c in calls] == ["10", "15", "15", "15", "20"]
    assert all(c["field_selector"] == "metadata.name=p" and c["allow_watch_bookmarks"] for c in calls)
    # a backoff after each failed stream (0.5 s, then 1 s), none after a stream the server ended or a 410
    assert slept == [0.5, 1.0]
    assert (follower.streams, follower.relists) == (5, 1)


@pytest.mark.parametrize("status", [401, 403, 404])
def test_an_answer_no_reconnect_can_change_ends_the_watch(monkeypatch: pytest.MonkeyPatch, status: int) -> None:
    from kubernetes.client.exceptions import ApiException

    from kvoffload.cli import control

    monkeypatch.setattr(control, "read_policy", lambda *args: obj("1", "Canary"))
    script: list[Any] = [ApiException(status=status, reason="no")]
    monkeypatch.setattr(control.kubernetes.watch, "Watch", lambda: ScriptedWatch(script, []))
    follower = control.PolicyWatch(object(), "ns", "p", deadline=1e9, clock=lambda: 0.0, sleep=lambda s: None)  # type: ignore[arg-type]
    with pytest.raises(control.ControlError, match=f"the API server answered {status}"):
        list(follower)


def test_the_deadline_ends_the_watch_between_streams(monkeypatch: pytest.MonkeyPatch) -> None:
    from kvoffload.cli import control

    now = [0.0]
    monkeypatch.setattr(control, "read_policy", lambda *args: obj("1", "Canary"))

    def stream_until_the_deadline(*args: Any, **kwargs: Any) -> Iterator[dict[str, Any]]:
        now[0] += kwargs["timeout_seconds"]  # the API server ends the stream after timeoutSeconds
        return iter(())

    watcher = type("W", (), {"stream": staticmethod(stream_until_the_deadline)})
    monkeypatch.setattr(control.kubernetes.watch, "Watch", watcher)
    follower = control.PolicyWatch(object(), "ns", "p", deadline=700.0, clock=lambda: now[0], sleep=lambda s: None)  # type: ignore[arg-type]

    assert [o["metadata"]["resourceVersion"] for o in follower] == ["1"]
    assert follower.streams == 3  # 300 s, 300 s, then the 100 s left
    assert now[0] == 700.0
