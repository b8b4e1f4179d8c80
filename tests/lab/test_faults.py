"""Faults survived, nothing lost: the operator (``kvoffload run``) climbing a two-tier ladder on the real control
plane while the things it depends on misbehave (issue 22, part 6).

One control plane for the module, its own (:class:`tests.support.faults.RestartablePlane`), since two scenarios
restart its etcd and kube-apiserver. Each scenario has its own namespace, Prometheus, kubelet stand-in and
operator, runs the climb of ``tests/lab/test_e2e.py`` (gpu-only, cpu, nvme; analysis every 1 s) under load, and
injects its fault mid-canary:

1. kube-apiserver restarted (SIGTERM, SIGKILL after 5 s as a kubelet would: it waits up to 60 s for its
   watchers to hang up), started again with the same flags;
2. etcd crashed (SIGKILL) and started again on its data directory;
3. the admission webhook down during applies: nothing listening, then a webhook that accepts and never answers
   (``failurePolicy: Ignore``): creates and updates go through (the latter after the webhook's 5 s), and a bad
   policy still ends ``Invalid``, through the operator. One update does not: that of a policy whose status is
   rewritten more often than the webhook's timeout, while the webhook hangs (a strict xfail says why);
4. Prometheus answering HTTP 500, then 503, then after 5 s (:class:`tests.support.faults.PrometheusProxy`);
5. a 409 Conflict storm on the policy's status writes: a proxy in front of kube-apiserver answers 409 to every
   status write until the operator has given one up, then to two of every three, while another writer bumps the
   policy's resourceVersion at each refusal (:class:`tests.support.faults.ApiServerProxy`).

After each, the policy ends where the undisturbed climb ends (Stable on nvme, the same decisions in its history,
each once, the same the operator counted in ``kvoffload_decisions_total``), and no engine was restarted or
replaced: each level started no more pods than its Deployment ever runs, no pod restarted, and the Deployments
that lived through the fault kept their uid and pod template (revision 1). Each prints how long it took and how
long the operator needed once the fault cleared (run with ``-s``).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

import aiohttp
import pytest
import pytest_asyncio

from kvoffload.api.conventions import API_GROUP, API_VERSION, LABEL_CONFIG_HASH, LABEL_LEVEL, LABEL_POLICY, PLURAL
from kvoffload.api.webhook import CONFIGURATION_NAME, validating_webhook_configuration
from kvoffload_lab.cluster.kubeapi import APPLY_PATCH, FIELD_MANAGER, KubeAPIError, object_path
from kvoffload_lab.cluster.kubecluster import KubeCluster
from kvoffload_lab.cluster.podengine import PodEngine
from kvoffload_lab.controlplane import default_bin_dir, free_port, missing_binaries
from tests.lab.test_e2e import CLIMB, level_hash, level_index, policy_doc
from tests.support.cluster import POLICY_API_VERSION, Cluster, OperatorProcess, eventually, load_on
from tests.support.controlplane import unavailable
from tests.support.faults import ApiServerProxy, BlackHole, PrometheusProxy, RestartablePlane, scrape_counters
from tests.support.prometheus import require_prometheus

pytestmark = [pytest.mark.e2e, pytest.mark.prometheus, pytest.mark.kube, pytest.mark.timeout(180)]

KIND = "KVOffloadPolicy"
NAME = "chat"
LEVELS = ("gpu-only", "cpu", "nvme")
REPLICAS = 2
"""The policy's replicas: no level's Deployment ever runs more, so no level should start more engines."""
_NAMESPACES = itertools.count(1)


# --- fixtures -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RestartablePlane]:
    """This module's own control plane: its scenarios restart etcd and kube-apiserver."""
    missing = missing_binaries()
    if missing:
        unavailable(f"no {', '.join(missing)} in {default_bin_dir()}: run scripts/build-kube.sh")
    started = RestartablePlane(workdir=tmp_path_factory.mktemp("faults-plane"))
    with started:
        yield started


@pytest.fixture
def webhook() -> bool:
    """Whether the cluster registers the admission webhook (on a free port, for the operator to serve)."""
    return False


@pytest_asyncio.fixture
async def cluster(
    plane: RestartablePlane, tmp_path: Path, cluster_engine_args: list[str], webhook: bool
) -> AsyncIterator[KubeCluster]:
    """Prometheus, the kubelet stand-in and a namespace of the scenario's own, on the module's control plane."""
    require_prometheus()
    namespace = f"faults-{next(_NAMESPACES)}"
    async with KubeCluster(
        tmp_path / "cluster",
        plane=plane,
        namespaces=[namespace],
        engine_args=cluster_engine_args,
        gpu_class_pricing=False,
        webhook_port=free_port() if webhook else None,
    ) as started:
        yield started
        assert not started.kubelet.errors, f"the kubelet stand-in failed: {started.kubelet.errors}"


@dataclass
class Host:
    """What ``start_operator`` needs of a cluster, with a kubeconfig of the test's choosing (a proxy's)."""

    kubeconfig: Path
    workdir: Path
    operator_namespaces: list[str] | None


@dataclass
class Operators:
    """The scenario's operator processes (each with a metrics port); all stopped at teardown."""

    cluster: KubeCluster
    started: list[OperatorProcess] = field(default_factory=list)

    def start(self, *, kubeconfig: Path | None = None, args: list[str] | None = None) -> OperatorProcess:
        host: Any = self.cluster
        if kubeconfig is not None:
            host = Host(kubeconfig, self.cluster.workdir, self.cluster.operator_namespaces)
        process = OperatorProcess(cast(Cluster, host), args=args or (), metrics_port=free_port())
        process.start()
        self.started.append(process)
        return process


@pytest_asyncio.fixture
async def operators(cluster: KubeCluster, request: pytest.FixtureRequest) -> AsyncIterator[Operators]:
    running = Operators(cluster)
    try:
        yield running
    finally:
        for process in running.started:
            await process.stop()
        report = getattr(request.node, "rep_call", None)
        if report is None or report.failed:
            for process in running.started:
                sys.stderr.write(f"--- {process.name} log (tail) ---\n{process.log_tail(120)}\n")


# --- reading the cluster, faults or not ----------------------------------------------------------------


def policy(cluster: KubeCluster, name: str = NAME) -> dict[str, Any]:
    """The policy as stored; empty while the API server cannot say (it is restarting)."""
    try:
        return cluster.get(POLICY_API_VERSION, KIND, cluster.namespace, name) or {}
    except (OSError, ValueError):  # refused, reset, 5xx while etcd is away (HTTPError is an OSError)
        return {}


def status(cluster: KubeCluster, name: str = NAME) -> dict[str, Any]:
    return policy(cluster, name).get("status") or {}


def canary_on(cluster: KubeCluster, level: str) -> dict[str, Any] | None:
    """The status while a Ready canary of ``level`` runs."""
    current = status(cluster)
    canary, ladder = current.get("canary") or {}, current.get("ladder") or []
    if canary and ladder[canary["level"]] == level and canary.get("ready", 0) >= 1:
        return current
    return None


def finished(cluster: KubeCluster, name: str = NAME) -> dict[str, Any] | None:
    current = status(cluster, name)
    return current if current.get("phase") in ("Stable", "RolledBack", "Paused", "Invalid") else None


def analysed_after(cluster: KubeCluster, moment: datetime, *, with_evidence: bool = False) -> dict[str, Any] | None:
    """The status once it shows an analysis begun after ``moment`` (one that read Prometheus, if asked)."""
    current = status(cluster)
    last = current.get("lastAnalysis") or {}
    when = last.get("time")
    if not when or datetime.fromisoformat(when.replace("Z", "+00:00")) <= moment:
        return None
    if with_evidence and str(last.get("message", "")).startswith("no measurements"):
        return None
    return current


def deployments(cluster: KubeCluster) -> dict[str, dict[str, Any]]:
    """The policy's Deployments by name: uid, pod template revision, the template itself (as JSON)."""
    try:
        listed = cluster.read(
            f"/apis/apps/v1/namespaces/{cluster.namespace}/deployments?labelSelector={LABEL_POLICY}%3D{NAME}"
        )
    except (OSError, ValueError):
        return {}
    return {
        d["metadata"]["name"]: {
            "uid": d["metadata"]["uid"],
            "revision": (d["metadata"].get("annotations") or {}).get("deployment.kubernetes.io/revision"),
            "template": json.dumps(d["spec"]["template"], sort_keys=True),
        }
        for d in (listed or {}).get("items", [])
    }


def decisions_counted(operator: OperatorProcess) -> Counter[str]:
    """What the operator says it decided: ``kvoffload_decisions_total`` by decision."""
    samples = scrape_counters(operator.metrics_port, "kvoffload_decisions_total")
    counted: Counter[str] = Counter()
    for labels, value in samples.items():
        decision = labels.split('decision="', 1)[1].split('"', 1)[0]
        counted[decision] += int(value)
    return counted


def api_errors(operator: OperatorProcess, operation: str) -> int:
    samples = scrape_counters(operator.metrics_port, "kvoffload_api_errors_total")
    return int(sum(value for labels, value in samples.items() if f'operation="{operation}"' in labels))  # every code


def now() -> datetime:
    return datetime.now(UTC)


# --- what every scenario must end with -----------------------------------------------------------------


@dataclass
class Timings:
    """One scenario's figures, printed and recorded as test properties."""

    scenario: str
    began: float = field(default_factory=time.monotonic)
    figures: dict[str, float] = field(default_factory=dict)

    def mark(self, name: str, seconds: float) -> None:
        self.figures[name] = round(seconds, 2)

    def report(self, record: Callable[[str, object], None]) -> None:
        self.mark("scenario_s", time.monotonic() - self.began)
        for name, value in self.figures.items():
            record(name, value)
        shown = ", ".join(f"{name} {value:.1f}" for name, value in self.figures.items())
        print(f"\nFAULT {self.scenario}: {shown}")


def unchanged_through_the_fault(before: dict[str, dict[str, Any]], after: dict[str, dict[str, Any]]) -> None:
    """Each Deployment that lived through the fault is the same object running the same pod template."""
    for name, seen in before.items():
        if name in after:  # a level the climb has since drained may be gone
            assert after[name] == seen, f"Deployment {name} changed through the fault"
        assert seen["revision"] == "1", f"Deployment {name} rolled out {seen['revision']} pod templates"


async def climbed_as_undisturbed(
    cluster: KubeCluster, doc: dict[str, Any], operator: OperatorProcess, others: Counter[str] | None = None
) -> None:
    """The policy ends as the undisturbed climb does, with every decision recorded once and no engine restarted.
    ``others``: the decisions the operator took for the namespace's other policies."""
    final = await eventually(lambda: finished(cluster), "the ladder to finish", 120)
    assert final["phase"] == "Stable", final.get("message")
    assert final["stable"]["level"] == level_index(doc, "nvme")
    assert final["stable"]["configHash"] == level_hash(doc, "nvme")
    assert final.get("canary") is None
    history = final["history"]
    assert [entry["decision"] for entry in history] == CLIMB, history
    # What the operator decided is what the status recorded: nothing decided that was lost, nothing twice.
    # The operator counts a decision once its status write has returned, a moment after the status is readable.
    expected = Counter(CLIMB) + (others or Counter())
    with contextlib.suppress(pytest.fail.Exception):  # the assert below shows what differs
        await eventually(lambda: decisions_counted(operator) == expected, "the operator's count", 10)
    assert decisions_counted(operator) == expected

    await eventually(lambda: set(deployments(cluster)) == {f"{NAME}-nvme"}, "the lower levels drained", 30)
    (top,) = deployments(cluster).values()
    assert top["revision"] == "1"
    template = json.loads(top["template"])
    assert template["metadata"]["labels"][LABEL_CONFIG_HASH] == level_hash(doc, "nvme")
    census = cluster.kubelet.census.started
    started = {level: census[f"{NAME}/{level}"] for level in LEVELS}
    assert started == dict.fromkeys(LEVELS, REPLICAS), f"engines started per level: {started}"

    def on_nvme() -> list[PodEngine] | None:  # the drained levels' engines stop a moment after their pods go
        engines = cluster.pods(f"{LABEL_POLICY}={NAME}")
        return engines if sorted(e.labels.get(LABEL_LEVEL, "") for e in engines) == ["nvme", "nvme"] else None

    engines = await eventually(on_nvme, "only the two nvme engines running", 30)
    assert [e.restart_count for e in engines] == [0, 0]


# --- the scenarios -------------------------------------------------------------------------------------


async def restart_mid_canary(
    cluster: KubeCluster,
    plane: RestartablePlane,
    operators: Operators,
    component: str,
    *,
    kill: bool,
    record_property: Callable[[str, object], None],
) -> None:
    timings = Timings(f"{component} {'killed' if kill else 'restarted'} mid-canary")
    operator = operators.start()
    doc = policy_doc(NAME, cluster)
    await cluster.apply(doc)
    async with load_on(cluster, NAME):
        await eventually(lambda: canary_on(cluster, "cpu"), "the cpu canary", 60)
        before = deployments(cluster)
        assert set(before) == {f"{NAME}-gpu-only", f"{NAME}-cpu"}
        restart = await asyncio.to_thread(plane.restart, component, kill=kill)
        ready = now()
        timings.mark("stopped_s", restart.stopped_s)
        timings.mark(f"{component}_healthy_s", restart.healthy_s)
        timings.mark("api_ready_s", restart.api_ready_s)
        await eventually(lambda: analysed_after(cluster, ready), "the operator to analyse again", 60)
        timings.mark("operator_recovered_s", time.monotonic() - restart.ready_at)
        unchanged_through_the_fault(before, deployments(cluster))
        await climbed_as_undisturbed(cluster, doc, operator)
    assert operator.alive()
    assert operator.starts == 1
    timings.report(record_property)


async def test_kube_apiserver_restarted_mid_canary_the_climb_ends_as_undisturbed(
    cluster: KubeCluster,
    plane: RestartablePlane,
    operators: Operators,
    record_property: Callable[[str, object], None],
) -> None:
    await restart_mid_canary(cluster, plane, operators, "kube-apiserver", kill=False, record_property=record_property)


async def test_etcd_crashed_and_restarted_mid_canary_the_climb_ends_as_undisturbed(
    cluster: KubeCluster,
    plane: RestartablePlane,
    operators: Operators,
    record_property: Callable[[str, object], None],
) -> None:
    await restart_mid_canary(cluster, plane, operators, "etcd", kill=True, record_property=record_property)


async def test_prometheus_failing_then_slow_mid_canary_the_climb_ends_as_undisturbed(
    cluster: KubeCluster,
    operators: Operators,
    record_property: Callable[[str, object], None],
) -> None:
    timings = Timings("Prometheus 500, 503, then 5 s slow, mid-canary")
    async with PrometheusProxy(cluster.prometheus.url) as proxy:
        operator = operators.start()
        doc = policy_doc(NAME, cluster)
        doc["spec"]["prometheus"]["url"] = proxy.url
        await cluster.apply(doc)
        async with load_on(cluster, NAME):

            def conclusive_canary() -> dict[str, Any] | None:
                current = canary_on(cluster, "cpu") or canary_on(cluster, "nvme")
                last = (current or {}).get("lastAnalysis") or {}
                return current if last.get("verdict") == "Pass" and last.get("consecutiveInconclusive") == 0 else None

            await eventually(conclusive_canary, "a canary with conclusive evidence", 90)
            before = deployments(cluster)
            seen: dict[str, str] = {}
            for status_code in (500, 503):
                proxy.fail(status_code)
                since, began = now(), time.monotonic()
                noticed = await eventually(
                    lambda since=since: analysed_after(cluster, since),  # type: ignore[misc]
                    f"an analysis through HTTP {status_code}",
                    30,
                )
                timings.mark(f"http_{status_code}_s", time.monotonic() - began)
                assert noticed["lastAnalysis"]["verdict"] == "Inconclusive", noticed["lastAnalysis"]
                seen[str(status_code)] = noticed["lastAnalysis"]["message"]
                # The status code itself may be cut off: a 503, retried, is told as "Max retries exceeded with url:
                # <the whole query>", truncated to 300 characters before its reason ("too many 503 error responses").
                assert "Prometheus answered with an error" in seen[str(status_code)], seen
            proxy.slow(5.0)
            since, began = now(), time.monotonic()
            slowed = await eventually(lambda: analysed_after(cluster, since), "an analysis through slow answers", 90)
            timings.mark("slow_analysis_s", time.monotonic() - began)
            assert not str(slowed["lastAnalysis"]["message"]).startswith("no measurements"), slowed["lastAnalysis"]
            proxy.pass_through()
            cleared, began = now(), time.monotonic()
            await eventually(
                lambda: analysed_after(cluster, cleared, with_evidence=True), "an analysis with evidence again", 30
            )
            timings.mark("operator_recovered_s", time.monotonic() - began)
            unchanged_through_the_fault(before, deployments(cluster))
            await climbed_as_undisturbed(cluster, doc, operator)
        assert all(proxy.served[mode] >= 1 for mode in ("500", "503", "slow")), proxy.served
        print(f"\nPrometheus proxy answered {dict(proxy.served)}; the operator read: {seen}")
    timings.report(record_property)


async def test_a_409_storm_on_status_writes_mid_canary_the_climb_ends_as_undisturbed(
    cluster: KubeCluster,
    plane: RestartablePlane,
    operators: Operators,
    tmp_path: Path,
    record_property: Callable[[str, object], None],
) -> None:
    timings = Timings("409 Conflict storm on status writes, mid-canary")
    async with ApiServerProxy(plane, tmp_path / "apiserver-proxy") as proxy:
        bumps = itertools.count(1)

        async def another_writer(namespace: str, name: str) -> None:
            path = f"/apis/{API_GROUP}/{API_VERSION}/namespaces/{namespace}/{PLURAL}/{name}"
            await cluster.api.merge_patch(path, {"metadata": {"labels": {"faults.test/bumped": str(next(bumps))}}})

        proxy.on_conflict = another_writer
        operator = operators.start(kubeconfig=proxy.kubeconfig)
        doc = policy_doc(NAME, cluster)
        await cluster.apply(doc)
        async with load_on(cluster, NAME):
            await eventually(lambda: canary_on(cluster, "cpu"), "the cpu canary", 60)
            before = deployments(cluster)
            # Every status write refused, until the operator has given one write up (its retries spent).
            proxy.refuse(lambda n: True)
            began = time.monotonic()
            await eventually(lambda: api_errors(operator, "patch_status") >= 1, "the operator to give up a write", 60)
            refused_all = proxy.status_writes["refused"]
            timings.mark("all_refused_s", time.monotonic() - began)
            # Then two of every three, for twelve refusals more: each write gets through on its third attempt.
            proxy.refuse(lambda n: n % 3 != 0)
            ok_before = proxy.status_writes["200"]
            began = time.monotonic()
            await eventually(
                lambda: proxy.status_writes["refused"] >= refused_all + 12, "twelve more refused status writes", 60
            )
            timings.mark("two_in_three_refused_s", time.monotonic() - began)
            assert proxy.status_writes["200"] > ok_before, "no status write got through two refusals in three"
            proxy.refuse(None)
            cleared, began = now(), time.monotonic()
            await eventually(lambda: analysed_after(cluster, cleared), "a status written after the storm", 30)
            timings.mark("operator_recovered_s", time.monotonic() - began)
            unchanged_through_the_fault(before, deployments(cluster))
            await climbed_as_undisturbed(cluster, doc, operator)
        gave_up = api_errors(operator, "patch_status")
        print(f"\nstatus writes through the proxy: {dict(proxy.status_writes)}; writes the operator gave up: {gave_up}")
        assert refused_all >= 6
        assert policy(cluster)["metadata"]["labels"]["faults.test/bumped"] == str(proxy.status_writes["refused"])
        assert policy(cluster)["metadata"]["generation"] == 1  # the operator never wrote the spec
    timings.report(record_property)


# --- the webhook ---------------------------------------------------------------------------------------


def bad_policy(cluster: KubeCluster, name: str) -> dict[str, Any]:
    """A policy the schema and CEL accept and the webhook refuses: a GPU class no catalog knows."""
    return policy_doc(name, cluster, gpu_class="nvidia-imaginary-9000")


WEBHOOK_CONFIGURATIONS = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations"


async def point_webhook_at(cluster: KubeCluster, port: int) -> None:
    configuration = validating_webhook_configuration(
        url=f"https://127.0.0.1:{port}", ca_bundle=cluster.plane.ca_file.read_bytes()
    )
    await cluster.api.apply(configuration)


async def dry_run_refused(cluster: KubeCluster, doc: dict[str, Any]) -> str | None:
    """The webhook's refusal of a server-side dry-run apply of ``doc`` (nothing is stored either way); None when
    it was accepted."""
    path = object_path(doc["apiVersion"], doc["kind"], doc["metadata"]["namespace"], doc["metadata"]["name"])
    params = {"fieldManager": FIELD_MANAGER, "force": "true", "dryRun": "All"}
    try:
        await cluster.api.request("PATCH", path, body=doc, params=params, content_type=APPLY_PATCH)
    except KubeAPIError as exc:
        return str(exc) if exc.status == 422 or "denied" in str(exc) else None
    return None


async def timed_apply(cluster: KubeCluster, doc: dict[str, Any]) -> float:
    began = time.monotonic()
    await cluster.apply(doc)
    return time.monotonic() - began


def labelled(doc: dict[str, Any], value: str) -> dict[str, Any]:
    """``doc`` with the label ``faults.test/touched: VALUE``: an update that leaves the spec as it is."""
    return {**doc, "metadata": {**doc["metadata"], "labels": {"faults.test/touched": value}}}


@pytest.mark.parametrize("webhook", [True], ids=["registered"])
async def test_the_webhook_down_during_applies_applies_go_through_and_a_bad_policy_still_ends_invalid(
    cluster: KubeCluster,
    operators: Operators,
    record_property: Callable[[str, object], None],
) -> None:
    timings = Timings("webhook down during applies")
    webhook_port = cluster.webhook_port
    assert webhook_port is not None
    operator = operators.start(args=cluster.webhook_args)
    await eventually(lambda: dry_run_refused(cluster, bad_policy(cluster, "probe")), "the webhook to refuse", 30)
    try:
        async with BlackHole() as hung:
            # Down: nothing listens where the webhook is registered (its pod is gone).
            await point_webhook_at(cluster, free_port())
            await eventually(
                lambda: _accepted(dry_run_refused(cluster, bad_policy(cluster, "probe"))), "the webhook gone", 30
            )
            doc = policy_doc(NAME, cluster)
            timings.mark("create_webhook_down_s", await timed_apply(cluster, doc))
            applied_broken = time.monotonic()
            timings.mark("create_bad_webhook_down_s", await timed_apply(cluster, bad_policy(cluster, "broken")))
            async with load_on(cluster, NAME):
                await eventually(lambda: canary_on(cluster, "cpu"), "the cpu canary", 60)
                invalid = await eventually(lambda: finished(cluster, "broken"), "broken to end Invalid", 30)
                timings.mark("bad_policy_invalid_s", time.monotonic() - applied_broken)
                before = deployments(cluster)
                timings.mark("update_mid_canary_webhook_down_s", await timed_apply(cluster, labelled(doc, "down")))
                # Hung: the webhook takes the API server's connection and never answers (timeoutSeconds 5).
                await point_webhook_at(cluster, hung.port)
                resting = labelled(bad_policy(cluster, "broken"), "hung")
                timings.mark("update_resting_webhook_hung_s", await timed_apply(cluster, resting))
                applied_broken = time.monotonic()
                timings.mark("create_bad_webhook_hung_s", await timed_apply(cluster, bad_policy(cluster, "broken-2")))
                assert hung.accepted >= 2, "the API server did not call the hung webhook"
                # Up again: the operator's webhook refuses a bad policy at apply time once more.
                await point_webhook_at(cluster, webhook_port)
                back = time.monotonic()
                refusal = await eventually(
                    lambda: dry_run_refused(cluster, bad_policy(cluster, "probe")), "the webhook to refuse again", 30
                )
                timings.mark("webhook_back_s", time.monotonic() - back)
                invalid_2 = await eventually(lambda: finished(cluster, "broken-2"), "broken-2 to end Invalid", 30)
                timings.mark("bad_policy_2_invalid_s", time.monotonic() - applied_broken)
                unchanged_through_the_fault(before, deployments(cluster))
                await climbed_as_undisturbed(cluster, doc, operator, others=Counter(Invalid=2))
    finally:
        await cluster.api.delete(f"{WEBHOOK_CONFIGURATIONS}/{CONFIGURATION_NAME}")

    for broken in (invalid, invalid_2):
        assert broken["phase"] == "Invalid", broken
        condition = next(c for c in broken["conditions"] if c["type"] == "Invalid")
        assert condition["status"] == "True"
        assert "spec.gpu.class" in condition["message"]
    assert "spec.gpu.class" in refusal  # the webhook says what the operator's condition says
    for name in ("broken", "broken-2"):
        assert not cluster.kubelet.census.pods_started(name), f"{name} got engines"
    assert policy(cluster, "broken")["metadata"]["labels"]["faults.test/touched"] == "hung"
    stored = policy(cluster)
    assert stored["metadata"]["labels"]["faults.test/touched"] == "down"  # the mid-canary update took
    assert stored["metadata"]["generation"] == 1
    assert policy(cluster, "probe") == {}  # dry runs only
    timings.report(record_property)


@pytest.mark.xfail(
    strict=True,
    raises=(KubeAPIError, aiohttp.ClientError),  # 504, or the connection closed at the API server's timeout
    reason=(
        "an update of a policy whose status the operator rewrites more often than the webhook's timeoutSeconds "
        "(5 s; analysis every 1 s here) never lands while the webhook hangs: kube-apiserver runs validating "
        "admission inside its optimistic update, each try waits out the webhook, meets a newer status write "
        "(a conflict) and starts over, until the request times out"
    ),
)
@pytest.mark.parametrize("webhook", [True], ids=["registered"])
async def test_an_update_of_a_climbing_policy_lands_while_the_webhook_hangs(
    cluster: KubeCluster, operators: Operators, record_property: Callable[[str, object], None]
) -> None:
    timings = Timings("update of a climbing policy, webhook hung")
    operators.start(args=cluster.webhook_args)
    doc = policy_doc(NAME, cluster)
    await cluster.apply(doc)
    await eventually(lambda: status(cluster).get("lastAnalysis"), "the operator analysing every second", 60)
    try:
        async with BlackHole() as hung:
            await point_webhook_at(cluster, hung.port)
            path = object_path(doc["apiVersion"], doc["kind"], cluster.namespace, NAME)
            params = {"fieldManager": FIELD_MANAGER, "force": "true", "timeout": "12s"}  # the API server's own limit
            began = time.monotonic()
            try:
                await cluster.api.request(
                    "PATCH", path, body=labelled(doc, "hung"), params=params, content_type=APPLY_PATCH
                )
            finally:
                timings.mark("update_s", time.monotonic() - began)
                timings.mark("webhook_calls", hung.accepted)  # one per try of the API server's update
                timings.report(record_property)
    finally:
        await cluster.api.delete(f"{WEBHOOK_CONFIGURATIONS}/{CONFIGURATION_NAME}")
    assert policy(cluster)["metadata"]["labels"]["faults.test/touched"] == "hung"


async def _accepted(refused: Any) -> bool:
    return await refused is None
