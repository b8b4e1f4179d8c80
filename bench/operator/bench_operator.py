"""The operator itself (``kvoffload run``) over 1, 100 and 1,000 policies: cycle time, queries per cycle, RSS.

For each fleet size, on this machine:

1. a synthetic exporter (tests/support/prometheus.py: ``SyntheticFleet``, in a child process) serves the vLLM
   series of every policy's stable and canary level, labelled with the level names and config hashes the
   operator renders, and a real Prometheus scrapes it every 2 s;
2. a real kube-apiserver and etcd (``kvoffload_lab.controlplane.ControlPlane``; its controller manager and
   scheduler are stopped, so no Pod is ever made) get the CRD and the policies, in up to 10 namespaces;
3. ``kvoffload run -A --standalone --metrics-port P --prometheus-url URL`` runs as a subprocess. It renders
   every policy (a GPU-only baseline of 20 s), passes the baseline on the series, and starts each policy's
   canary, whose pods never become Ready: every policy then holds mid-canary (the progress deadline is 2 h)
   and is analysed every ``analysis.interval`` (10 s), stable and canary both;
4. once every policy is mid-canary, the bench reads the operator's own metrics for ``--measure`` seconds:
   ``kvoffload_sweep_seconds`` (one reconcile of every policy), ``kvoffload_prometheus_queries_total``,
   ``kvoffload_cycle_seconds``, ``kvoffload_workload_reads_total`` (engines read from the watch or listed), the
   API server's own count of Deployment and pod lists, and samples the process's VmRSS (VmHWM for the peak).

With ``--at-rest`` the fleet is measured at rest instead: a stand-in (``pod_standin.py``) makes every
Deployment's pods Ready, every policy climbs one 20 s step to Stable, and the API server's own counter gives the
status writes in the measured window; the restart's full cycle then ends when the operator's sweep has covered
every policy (at rest, fresh readings are not written at once, so status times cannot show it). With
``--retired-gone`` as well, the exporter then stops serving the level each policy left, whose pods a real fleet
no longer has.

    .venv/bin/python bench/operator/bench_operator.py [--sizes 1,100,1000] [--measure 60] [--at-rest [--retired-gone]]
        [--restarts N] [--json out.json]

Needs /usr/bin/prometheus and the control-plane binaries ($KVOFFLOAD_KUBE_BIN or .kube-bin).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import json
import multiprocessing
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import kubernetes.client  # noqa: E402
import kubernetes.config  # noqa: E402
from pod_standin import PodStandIn  # noqa: E402
from tests.support.prometheus import SyntheticEngine, SyntheticFleet  # noqa: E402

from kvoffload.api.conventions import API_GROUP, API_VERSION, PLURAL  # noqa: E402
from kvoffload.controller.judging import judge_resolved  # noqa: E402
from kvoffload.engines.dialect import Dialect  # noqa: E402
from kvoffload.policy.engine_config import config_hash  # noqa: E402
from kvoffload.policy.ladder import build_ladder  # noqa: E402
from kvoffload.policy.loading import parse_policy  # noqa: E402
from kvoffload_lab.controlplane import ControlPlane  # noqa: E402
from kvoffload_lab.promserver import PrometheusServer, free_port  # noqa: E402

T = TypeVar("T")

INTERVAL = "10s"
"""analysis.interval of every policy (``--interval``): 10 s is a busy fleet; the CRD's default is 30 s."""
WINDOW = "20s"
SCRAPE_INTERVAL_S = 2.0
GIB = 2**30
KVOFFLOAD = str(Path(sys.executable).parent / "kvoffload")
PY_SPY = os.environ.get("KVOFFLOAD_PY_SPY", "py-spy")
SAMPLED = (
    "kvoffload_sweep_seconds_count",
    "kvoffload_sweep_seconds_sum",
    "kvoffload_sweep_policies",
    "kvoffload_prometheus_queries_total",
    "kvoffload_cycle_seconds_count",
    "kvoffload_cycle_seconds_sum",
    "kvoffload_reconcile_errors_total",
    "kvoffload_workload_reads_total",
)


def spec(prometheus_url: str, interval: str = INTERVAL, at_rest: bool = False) -> dict[str, Any]:
    """Two replicas, GPU-only then a 1 GiB CPU tier; a 20 s baseline, then a canary that may take 2 h to be Ready
    (``at_rest``: whose pods the stand-in makes Ready, one 20 s step to 100% and then Stable)."""
    rollout = {"promotionSteps": [100], "stepDuration": "20s"} if at_rest else {"stepDuration": "1h"}
    return {
        "model": {"name": "Qwen/Qwen3-0.6B", "image": "vllm/vllm-openai:v0.32.0", "maxModelLen": 4096},
        "gpu": {"class": "nvidia-l4"},
        "replicas": 2,
        "resources": {"baseMemory": "4Gi", "headroom": "1Gi"},
        "offload": {"cpu": "1Gi"},
        "rollout": {
            "canaryReplicas": 1,
            "maxSurge": 1,
            "baselineDuration": "20s",
            "progressDeadline": "2h",
            **rollout,
        },
        "analysis": {"interval": interval, "window": WINDOW, "ttftP99": "500ms", "itlP99": "50ms", "minRequests": 5},
        "prometheus": {"url": prometheus_url},
    }


@dataclass(frozen=True)
class PolicyPlan:
    namespace: str
    name: str
    manifest: dict[str, Any]
    levels: tuple[tuple[str, str, str], ...]
    """(level name, config hash, kv_offloading_size as vLLM shows it) of ladder levels 0 and 1."""


def plan_fleet(
    policies: int, namespaces: int, prometheus_url: str, interval: str = INTERVAL, at_rest: bool = False
) -> tuple[list[PolicyPlan], Dialect]:
    """The policies, and what the operator will render for them (by the package's own functions)."""
    plans: list[PolicyPlan] = []
    dialect: Dialect | None = None
    for i in range(policies):
        namespace, name = f"bench-{i % namespaces:02d}", f"policy-{i:04d}"
        manifest = {
            "apiVersion": f"{API_GROUP}/{API_VERSION}",
            "kind": "KVOffloadPolicy",
            "metadata": {"name": name, "namespace": namespace},
            "spec": spec(prometheus_url, interval, at_rest),
        }
        policy = parse_policy(json.loads(json.dumps(manifest)), f"{namespace}/{name}")
        dialect, _ = judge_resolved(policy)
        ladder = build_ladder(policy.spec)
        levels = tuple(
            (
                level.name,
                config_hash(policy, level),
                "None" if level.cpu_bytes is None else repr(level.cpu_bytes / GIB),
            )
            for level in ladder[:2]
        )
        plans.append(PolicyPlan(namespace, name, manifest, levels))
    assert dialect is not None
    return plans, dialect


def engines_for(plans: list[PolicyPlan]) -> list[SyntheticEngine]:
    engines: list[SyntheticEngine] = []
    for i, p in enumerate(plans):
        (stable_level, stable_hash, stable_size), (canary_level, canary_hash, canary_size) = p.levels
        common = {"namespace": p.namespace, "ttft_s": 0.2}
        engines.append(
            SyntheticEngine(
                p.name,
                "stable",
                requests_per_s=15 + i % 5,
                level=stable_level,
                config_hash=stable_hash,
                offloading_size=stable_size,
                **common,  # type: ignore[arg-type]
            )
        )
        engines.append(
            SyntheticEngine(
                p.name,
                "canary",
                requests_per_s=5 + i % 7,
                external_share=0.2,
                host_tokens_per_s=100,
                load_bytes_per_s=1e9,
                level=canary_level,
                config_hash=canary_hash,
                offloading_size=canary_size,
                **common,  # type: ignore[arg-type]
            )
        )
    return engines


def serve_fleet(engines: list[SyntheticEngine], dialect: Dialect, address: Any) -> None:
    """Child process: the exporter, kept out of the operator's and the bench's CPU. Told a variant over the pipe,
    it stops serving that variant's series and answers how many went."""
    fleet = SyntheticFleet(engines, dialect)
    address.send((fleet.address, fleet.series))
    while True:
        address.send(fleet.stop_serving(address.recv()))


def wait_until(check: Callable[[], T | None], deadline_s: float, what: str, poll: float = 1.0) -> T:
    end = time.monotonic() + deadline_s
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > end:
            raise TimeoutError(f"timed out after {deadline_s:.0f} s waiting for {what} (last: {got!r})")
        time.sleep(poll)


def status_of(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM of a process, in bytes."""
    found: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            found[key] = int(value.split()[0]) * 1024
    return found


def operator_metrics(port: int) -> dict[str, float]:
    """The few samples the bench reads, from the operator's /metrics (only those families are asked for)."""
    names = "&".join(f"name[]={n}" for n in SAMPLED)
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics?{names}", timeout=30) as answer:
        text = answer.read().decode()
    values: dict[str, float] = {"kvoffload_workload_reads_total:watch": 0.0, "kvoffload_workload_reads_total:list": 0.0}
    for line in text.splitlines():
        match = re.match(r'^([a-z_]+)(?:\{source="([a-z]+)"\})? ([0-9.e+-]+|NaN)$', line)
        if match and match.group(1) in SAMPLED:
            key = f"{match.group(1)}:{match.group(2)}" if match.group(2) else match.group(1)
            values[key] = float(match.group(3))
    return values


def api_requests(api: kubernetes.client.ApiClient) -> dict[str, float]:
    """Requests the API server has answered since it started (its own counter): KVOffloadPolicy status writes
    (``status``) and lists of Deployments and pods (``lists``)."""
    method, url, headers, body, post = api.param_serialize("GET", "/metrics", auth_settings=["BearerToken"])
    answer = api.call_api(method, url, headers, body, post)
    totals = {"status": 0.0, "lists": 0.0}
    for line in answer.read().decode().splitlines():
        if not line.startswith("apiserver_request_total{"):
            continue
        if all(label in line for label in ('resource="kvoffloadpolicies"', 'subresource="status"', 'verb="PATCH"')):
            totals["status"] += float(line.rsplit(" ", 1)[1])
        elif 'verb="LIST"' in line and ('resource="pods"' in line or 'resource="deployments"' in line):
            totals["lists"] += float(line.rsplit(" ", 1)[1])
    return totals


def apply_policies(api: kubernetes.client.ApiClient, plans: list[PolicyPlan]) -> float:
    core = kubernetes.client.CoreV1Api(api)
    for namespace in sorted({p.namespace for p in plans}):
        core.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    custom = kubernetes.client.CustomObjectsApi(api)
    start = time.perf_counter()

    def create(p: PolicyPlan) -> None:
        custom.create_namespaced_custom_object(API_GROUP, API_VERSION, p.namespace, PLURAL, p.manifest)

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        list(pool.map(create, plans))
    return time.perf_counter() - start


def body_bytes(api: kubernetes.client.ApiClient) -> dict[str, float]:
    """The mean size of one policy as the API server serves it (what kopf decodes and keeps per policy), in bytes
    of JSON: whole, its metadata.managedFields, and its status."""
    items = kubernetes.client.CustomObjectsApi(api).list_cluster_custom_object(API_GROUP, API_VERSION, PLURAL)["items"]

    def size(value: Any) -> int:
        return len(json.dumps(value, separators=(",", ":")))

    n = max(1, len(items))
    return {
        "whole": sum(size(i) for i in items) / n,
        "managedFields": sum(size(i["metadata"].get("managedFields", [])) for i in items) / n,
        "status": sum(size(i.get("status", {})) for i in items) / n,
    }


def modes(api: kubernetes.client.ApiClient) -> dict[str, int]:
    custom = kubernetes.client.CustomObjectsApi(api)
    listed = custom.list_cluster_custom_object(API_GROUP, API_VERSION, PLURAL)
    counts: dict[str, int] = {}
    for item in listed["items"]:
        status = item.get("status") or {}
        key = str(status.get("mode") or "none")
        if status.get("canary") is None and key == "Step":
            key = "Step without canary"
        if status.get("retiring"):  # a level still draining: its pods go, and each change is written
            key += ", draining"
        history, analysis = status.get("history") or [], status.get("lastAnalysis") or {}
        analysed = datetime.fromisoformat(analysis["time"]) if "time" in analysis else None
        decided = datetime.fromisoformat(history[-1]["time"]) if history else None
        if key == "Stable" and decided is not None and (analysed is None or analysed <= decided):
            # The first guard analysis (stable against its baseline, not canary against stable) is a new shape
            # of analysis, written once: the climb's last write.
            key += ", guard not yet analysed"
        counts[key] = counts.get(key, 0) + 1
    return counts


def verdicts(api: kubernetes.client.ApiClient) -> dict[str, int]:
    """How many policies' latest analysis is each verdict, and how many carry a run of Inconclusive or Fail."""
    listed = kubernetes.client.CustomObjectsApi(api).list_cluster_custom_object(API_GROUP, API_VERSION, PLURAL)
    counts: dict[str, int] = {}
    for item in listed["items"]:
        analysis = (item.get("status") or {}).get("lastAnalysis") or {}
        keys = [str(analysis.get("verdict"))]
        keys += [f"{k} > 0" for k in ("consecutiveInconclusive", "consecutiveFailures") if analysis.get(k)]
        for key in keys:
            counts[key] = counts.get(key, 0) + 1
    return counts


def bench_size(
    policies: int,
    namespaces: int,
    measure_s: float,
    workdir: Path,
    tracemalloc: Path | None = None,
    interval: str = INTERVAL,
    at_rest: bool = False,
    mallinfo: Path | None = None,
    py_spy: Path | None = None,
    restarts: int = 1,
    retired_gone: bool = False,
) -> dict[str, Any]:
    work = workdir / f"size-{policies}"
    work.mkdir()
    server = PrometheusServer(work / "prometheus", scrape_interval=SCRAPE_INTERVAL_S)
    server.workdir.mkdir()
    server.start()
    plans, dialect = plan_fleet(policies, min(namespaces, policies), server.url, interval, at_rest)
    settled = "Stable" if at_rest else "Step"  # the mode every policy sits in while measured
    interval_s = float(interval.removesuffix("s"))
    parent, child = multiprocessing.Pipe()
    exporter = multiprocessing.Process(target=serve_fleet, args=(engines_for(plans), dialect, child), daemon=True)
    exporter.start()
    operator: subprocess.Popen[bytes] | None = None
    plane = ControlPlane(workdir=work / "kube")
    pods: PodStandIn | None = None
    try:
        address, series = parent.recv()
        server.add_targets([(address, {})])
        plane.start()
        for name, pid in plane.pids.items():  # no kubelet: Deployments need no ReplicaSets, Pods or scheduling
            if name in ("kube-controller-manager", "kube-scheduler"):
                os.kill(pid, signal.SIGTERM)
        configuration = kubernetes.client.Configuration()
        kubernetes.config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=str(plane.kubeconfig), client_configuration=configuration
        )
        api = kubernetes.client.ApiClient(configuration)
        subprocess.run(
            [str(Path(sys.executable).parent / "kubectl"), f"--kubeconfig={plane.kubeconfig}", "apply", "-f",
             str(ROOT / "crds")],
            check=True, capture_output=True,
        )  # fmt: skip
        wait_until(
            lambda: _served(api), 60, "the KVOffloadPolicy resource to be served", poll=0.5
        )  # Established, then served
        apply_s = apply_policies(api, plans)
        if at_rest:
            pods = PodStandIn(api, sorted({p.namespace for p in plans}))
            pods.start()
        # Every series with a full window of samples before the operator judges a baseline.
        server.wait_for_series(
            f"count(count_over_time(vllm:time_to_first_token_seconds_count[{WINDOW}]) >= 10)",
            deadline=300,
            check=lambda r: float(r[0]["value"][1]) >= 2 * policies,
        )
        port = free_port()
        log = (work / "operator.log").open("wb")
        env = {**os.environ, "KUBECONFIG": str(plane.kubeconfig)}
        traced = dict(env)
        if tracemalloc is not None or mallinfo is not None:  # the first operator only: tracing slows it
            traced["PYTHONPATH"] = os.pathsep.join(
                filter(None, [str(Path(__file__).parent / "memtrace"), env.get("PYTHONPATH")])
            )
            for name, path in (("KVOFFLOAD_TRACEMALLOC", tracemalloc), ("KVOFFLOAD_MALLINFO", mallinfo)):
                if path is not None:
                    traced[name] = str(path)
        command = [KVOFFLOAD, "run", "-A", "--standalone", "--metrics-port", str(port), "--prometheus-url", server.url]
        began = time.monotonic()
        operator = subprocess.Popen(command, env=traced, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        rss: list[tuple[float, int]] = []

        def sample_rss() -> None:
            assert operator is not None
            while operator.poll() is None:
                try:
                    rss.append((time.monotonic() - began, status_of(operator.pid)["VmRSS"]))
                except (FileNotFoundError, KeyError):
                    return
                time.sleep(0.5)

        sampler = threading.Thread(target=sample_rss, daemon=True)
        sampler.start()

        def all_settled() -> dict[str, int] | None:
            if operator is not None and operator.poll() is not None:
                raise RuntimeError(f"the operator exited {operator.returncode}; see {work / 'operator.log'}")
            counts = modes(api)
            made = f"  pods made {pods.made}, deleted {pods.deleted}" if pods is not None else ""
            print(f"      {time.monotonic() - began:6.1f} s  {counts}{made}", flush=True)
            return counts if counts.get(settled) == policies else None

        wait_until(all_settled, 1200, f"every policy in {settled}", poll=5.0)
        mid_canary_s = time.monotonic() - began
        retired_series = 0
        if retired_gone:  # the level each policy left: its pods are gone, its series stale at the next scrape
            parent.send("stable")
            retired_series = parent.recv()
            print(f"      {retired_series} series of the levels left are no longer served", flush=True)
        time.sleep(interval_s)  # one more interval: the moves' own writes are done (and the window passes the retired)
        first = operator_metrics(port)
        requests_before = api_requests(api)
        measure_began = time.monotonic()
        cpu_began = cpu_seconds(operator.pid)
        sweeps: list[float] = []
        covered: list[float] = []
        previous = first
        while time.monotonic() - measure_began < measure_s:
            time.sleep(2.0)
            now = operator_metrics(port)
            done = now["kvoffload_sweep_seconds_count"] - previous["kvoffload_sweep_seconds_count"]
            if done == 1:  # one sweep since the last poll: its own length
                sweeps.append(now["kvoffload_sweep_seconds_sum"] - previous["kvoffload_sweep_seconds_sum"])
                covered.append(now["kvoffload_sweep_policies"])
            elif done > 1:
                print(f"      {done:.0f} sweeps in one poll: their mean only is known", flush=True)
            previous = now
        last = previous
        cpu_measured = cpu_seconds(operator.pid) - cpu_began
        requests_after = api_requests(api)
        patches = requests_after["status"] - requests_before["status"]
        lists = requests_after["lists"] - requests_before["lists"]
        in_window = [value for when, value in rss if when >= measure_began - began]
        peak = status_of(operator.pid)["VmHWM"]
        n_sweeps = last["kvoffload_sweep_seconds_count"] - first["kvoffload_sweep_seconds_count"]
        queries = last["kvoffload_prometheus_queries_total"] - first["kvoffload_prometheus_queries_total"]
        cycles = last["kvoffload_cycle_seconds_count"] - first["kvoffload_cycle_seconds_count"]
        cycle_sum = last["kvoffload_cycle_seconds_sum"] - first["kvoffload_cycle_seconds_sum"]
        final_modes = modes(api)
        final_verdicts = verdicts(api)
        print(f"      at the end: {final_modes}, latest verdicts {final_verdicts}", flush=True)
        body = body_bytes(api)
        print(f"      a policy as served: {body}", flush=True)
        malloc_held = None
        if mallinfo is not None:  # after the measured window: the trim must not change what was measured
            operator.send_signal(signal.SIGUSR1)
            wait_until(lambda: mallinfo.exists() or None, 60, "the malloc report")
            malloc_held = mallinfo.read_text()
            print("      malloc: " + "; ".join(malloc_held.splitlines()), flush=True)
        if tracemalloc is not None:
            operator.send_signal(signal.SIGUSR2)
            wait_until(lambda: tracemalloc.exists() or None, 120, "the allocation dump")
        operator.terminate()
        operator.wait(60)
        stopped = time.monotonic()
        floor_s = status_write_floor(api, plans)
        print(f"      the API server's floor: {policies} status writes in {floor_s:.2f} s", flush=True)
        runs: list[Restart] = []
        for i in range(restarts):  # each an analysis interval after the last one stopped, so every policy is due
            runs.append(
                restart_cycle(
                    stopped, interval_s, operator, command, env, work, port, api, policies, at_rest,
                    py_spy if i == 0 else None,
                )
            )  # fmt: skip
            stopped = time.monotonic()
        operator = None  # restart_cycle stopped it and the ones it started
        # The run of the median own sweep (of the median full cycle where there is none): a run that happened.
        restart = sorted(runs, key=lambda r: r.sweeps_s if r.sweeps_s is not None else r.cycle_s)[len(runs) // 2]
        return {
            "policies": policies,
            "interval": interval,
            "mode": settled,
            "malloc_arena_max": os.environ.get("MALLOC_ARENA_MAX"),
            "namespaces": min(namespaces, policies),
            "series": series,
            "retired_series_gone": retired_series,
            "apply_s": apply_s,
            "to_mid_canary_s": mid_canary_s,
            "measured_s": measure_s,
            "sweeps": n_sweeps,
            "sweep_runs_s": sweeps,
            "sweep_policies": sorted(set(covered)),
            "sweep_median_s": statistics.median(sweeps) if sweeps else None,
            "sweep_mean_s": (last["kvoffload_sweep_seconds_sum"] - first["kvoffload_sweep_seconds_sum"]) / n_sweeps
            if n_sweeps
            else None,
            "queries": queries,
            "status_writes": patches,
            "status_writes_per_sweep": patches / n_sweeps if n_sweeps else None,
            "deployment_and_pod_lists": lists,
            **{
                f"workload_reads_{source}": last[f"kvoffload_workload_reads_total:{source}"]
                - first[f"kvoffload_workload_reads_total:{source}"]
                for source in ("watch", "list")
            },
            "queries_per_sweep": queries / n_sweeps if n_sweeps else None,
            "reconciles": cycles,
            "reconciles_per_sweep": cycles / n_sweeps if n_sweeps else None,
            "reconcile_mean_s": cycle_sum / cycles if cycles else None,
            "operator_cpu_per_sweep_s": cpu_measured / n_sweeps if n_sweeps else None,
            "reconcile_errors": last["kvoffload_reconcile_errors_total"] - first["kvoffload_reconcile_errors_total"],
            "rss_steady_median_bytes": statistics.median(in_window) if in_window else None,
            "rss_steady_max_bytes": max(in_window) if in_window else None,
            "rss_peak_bytes": peak,
            "modes_at_end": final_modes,
            "verdicts_at_end": final_verdicts,
            "policy_json_bytes": body,
            "status_write_floor_s": floor_s,
            "malloc_report": malloc_held,
            "restart_to_all_analysed_s": restart.to_all_analysed_s,
            "restart_to_first_reconcile_s": restart.to_first_reconcile_s,
            "full_cycle_s": restart.cycle_s,
            "full_cycle_operator_cpu_s": restart.operator_cpu_s,
            "restart_cycle_queries": restart.queries,
            "restart_rss_peak_bytes": restart.rss_peak_bytes,
            "full_cycle_own_sweeps_s": restart.sweeps_s,
            "full_cycle_own_sweeps": restart.sweeps,
            "restart_listed_reads": restart.listed_reads,
            "restart_operator_cpu_total_s": restart.operator_cpu_total_s,
            "restart_status_writes": restart.status_writes,
            "restarts": [dataclasses.asdict(run) for run in runs],
        }
    finally:
        if operator is not None and operator.poll() is None:
            operator.terminate()
            try:
                operator.wait(30)
            except subprocess.TimeoutExpired:
                operator.kill()
                operator.wait()
        if pods is not None:
            pods.stop()
        plane.stop()
        server.stop()
        exporter.terminate()
        exporter.join(timeout=10)


def cpu_seconds(pid: int) -> float:
    """User plus system CPU seconds a process has used (/proc/PID/stat, fields 14 and 15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def status_write_floor(api: kubernetes.client.ApiClient, plans: list[PolicyPlan], threads: int = 8) -> float:
    """Seconds the API server here takes for one merge patch of every policy's status (``status.message``), from
    ``threads`` plain client threads: the floor for any cycle that records each policy's analysis in its status.
    Run while no operator runs; the next operator rewrites the message."""
    custom = kubernetes.client.CustomObjectsApi(api)
    stamp = datetime.now(UTC).isoformat()

    def patch(p: PolicyPlan) -> None:
        body = {"status": {"message": f"bench: status write floor {stamp}"}}
        custom.patch_namespaced_custom_object_status(API_GROUP, API_VERSION, p.namespace, PLURAL, p.name, body)

    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        list(pool.map(patch, plans))
    return time.perf_counter() - start


@dataclass(frozen=True)
class Restart:
    """One full cycle with every policy due at once, after a restart."""

    to_all_analysed_s: float
    """From the process's start until every policy holds an analysis newer than the restart."""
    to_first_reconcile_s: float
    """From the process's start until its first reconcile finished (Python, kopf, the first list)."""
    cycle_s: float
    """From the first reconcile finished until every policy analysed: the full cycle itself."""
    operator_cpu_s: float
    """CPU the operator used in that cycle."""
    queries: float
    rss_peak_bytes: int
    sweeps_s: float | None = None
    """At rest: the operator's own time for it (``kvoffload_sweep_seconds``), summed over the sweeps it took to
    cover every policy (the first ones cover only the policies known by then)."""
    sweeps: float | None = None
    listed_reads: float = 0.0
    """Reads of a policy's engines by two lists, not from the watch: before the watch's first list is in."""
    operator_cpu_total_s: float = 0.0
    """CPU the operator used from its start until every policy was analysed (imports and first lists too)."""
    status_writes: float = 0.0
    """Policy status writes the API server took in it: none while every stored analysis is younger than the
    operator's resting refresh (5 minutes); a restart later than that rewrites every status."""


def restart_cycle(
    stopped: float,
    interval_s: float,
    operator: subprocess.Popen[bytes],
    command: list[str],
    env: dict[str, str],
    work: Path,
    port: int,
    api: kubernetes.client.ApiClient,
    policies: int,
    at_rest: bool = False,
    py_spy: Path | None = None,
) -> Restart:
    """One full cycle with every policy due at once: once the operator stopped at ``stopped`` (monotonic) has been
    gone an analysis interval, start a new one (as a failover does) and time it until every policy holds an
    analysis newer than the restart (``at_rest``, where fresh readings are not written at once: until the
    operator's own sweep metric has covered every policy). ``py_spy``: profile the restarted operator from its
    start to the end of the cycle into this file (raw, collapsed stacks)."""
    operator.terminate()
    operator.wait(60)
    # Every policy due at once: an analysis is due once half an interval has passed since the last one, so wait a
    # whole interval since the old operator stopped. Status times are whole seconds: 1.1 s more, and nothing the
    # old operator wrote can look newer than `since`.
    time.sleep(max(0.0, stopped + interval_s - time.monotonic()) + 1.1)
    since = datetime.now(UTC).replace(microsecond=0)
    custom = kubernetes.client.CustomObjectsApi(api)

    def analysed() -> bool:
        # From the API server's watch cache (resourceVersion 0), every 2 s: listing 1,000 policies with their
        # status is work for the same 2 cores, and a tighter loop of it slowed the cycle it measures.
        items = custom.list_cluster_custom_object(API_GROUP, API_VERSION, PLURAL, resource_version="0")["items"]
        times = [((item.get("status") or {}).get("lastAnalysis") or {}).get("time") for item in items]
        return len(times) == policies and all(t and datetime.fromisoformat(t) >= since for t in times)

    def swept() -> bool:
        found = operator_metrics(port)
        return found.get("kvoffload_sweep_seconds_count", 0) >= 1 and found.get("kvoffload_sweep_policies") == policies

    def first_reconcile() -> float | None:
        try:
            done = operator_metrics(port).get("kvoffload_cycle_seconds_count", 0.0)
        except OSError:
            return None  # not listening yet
        return time.monotonic() if done > 0 else None

    requests_before = api_requests(api)
    with (work / "operator-restarted.log").open("wb") as log:
        began = time.monotonic()
        restarted = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        profiler = None
        if py_spy is not None:
            profiler = subprocess.Popen(
                [PY_SPY, "record", "--pid", str(restarted.pid), "-r", "100", "--nonblocking", "--format", "raw",
                 "-o", str(py_spy)],
                stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
        try:
            first = wait_until(first_reconcile, 120, "the restarted operator's first reconcile", poll=0.05)
            cpu_at_first = cpu_seconds(restarted.pid)
            # At rest the poll reads a few families of the operator's metrics: cheap, so 0.25 s.
            poll = 0.25 if at_rest else 2.0
            wait_until(lambda: (swept() if at_rest else analysed()) or None, 600, "every policy analysed", poll=poll)
            done = time.monotonic()
            cpu_total = cpu_seconds(restarted.pid)
            cpu = cpu_total - cpu_at_first
            found_metrics = operator_metrics(port)
            queries = found_metrics["kvoffload_prometheus_queries_total"]
            peak = status_of(restarted.pid)["VmHWM"]
            if profiler is not None:
                profiler.send_signal(signal.SIGINT)  # py-spy writes what it has on SIGINT
                profiler.wait(60)
        finally:
            restarted.terminate()
            try:
                restarted.wait(30)
            except subprocess.TimeoutExpired:
                restarted.kill()
                restarted.wait()
    writes = api_requests(api)["status"] - requests_before["status"]
    swept_by: dict[str, float] = {}
    if at_rest:
        swept_by["sweeps_s"] = found_metrics["kvoffload_sweep_seconds_sum"]
        swept_by["sweeps"] = found_metrics["kvoffload_sweep_seconds_count"]
    listed = found_metrics["kvoffload_workload_reads_total:list"]
    found = Restart(
        done - began, first - began, done - first, cpu, queries, peak, **swept_by, listed_reads=listed,
        operator_cpu_total_s=cpu_total, status_writes=writes,
    )  # fmt: skip
    own = f", by its own sweeps {found.sweeps_s:.1f} s in {found.sweeps:.0f}" if found.sweeps_s is not None else ""
    print(
        f"      restart: first reconcile {found.to_first_reconcile_s:.1f} s after the start, every policy analysed "
        f"{found.cycle_s:.1f} s later ({found.operator_cpu_s:.1f} s of the operator's CPU{own}; "
        f"{found.to_all_analysed_s:.1f} s and {cpu_total:.1f} s CPU from the start), {queries:.0f} queries, "
        f"{listed:.0f} reads of the engines by list, {writes:.0f} status writes",
        flush=True,
    )
    return found


def _served(api: kubernetes.client.ApiClient) -> bool:
    try:
        kubernetes.client.CustomObjectsApi(api).list_cluster_custom_object(API_GROUP, API_VERSION, PLURAL, limit=1)
    except kubernetes.client.ApiException:
        return False
    return True


def mib(value: float | None) -> str:
    return "-" if value is None else f"{value / 2**20:.1f} MiB"


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--sizes", default="1,100,1000")
    parser.add_argument("--namespaces", type=int, default=10)
    parser.add_argument("--interval", default=INTERVAL, help="analysis.interval of every policy, in seconds (10s)")
    parser.add_argument("--measure", type=float, default=60.0, help="Seconds of steady state read per size.")
    parser.add_argument(
        "--at-rest",
        action="store_true",
        help="Measure a resting fleet: a stand-in makes every Deployment's pods Ready, every policy climbs to Stable.",
    )
    parser.add_argument("--json", type=Path, default=None, help="Also write the figures here.")
    parser.add_argument("--keep", type=Path, default=None, help="Keep logs (operator, Prometheus, kube) here.")
    parser.add_argument(
        "--tracemalloc",
        type=Path,
        default=None,
        help="Trace the first operator's allocations and write the largest sites here (slows it; RSS figures then "
        "include the tracing).",
    )
    parser.add_argument(
        "--py-spy",
        type=Path,
        default=None,
        help="Profile the restarted operator's full cycle with py-spy ($KVOFFLOAD_PY_SPY or py-spy on PATH) into "
        "this file, as collapsed stacks.",
    )
    parser.add_argument(
        "--mallinfo",
        type=Path,
        default=None,
        help="After the measured window, write the first operator's malloc figures and its RSS before and after "
        "malloc_trim(0) here: how much of the RSS is freed memory malloc still holds.",
    )
    parser.add_argument(
        "--restarts",
        type=int,
        default=1,
        help="Restart the operator this many times, each an analysis interval after the last stopped; the figures "
        "are the run of the median full cycle, every run is in the JSON (these machines are noisy).",
    )
    parser.add_argument(
        "--retired-gone",
        action="store_true",
        help="With --at-rest: once every policy is Stable, stop serving the series of the level each one left, as "
        "when its pods are gone (without it they stay served: twice the series a resting fleet has).",
    )
    args = parser.parse_args()
    if args.retired_gone and not args.at_rest:
        parser.error("--retired-gone needs --at-rest: mid-canary, both levels serve")
    rows = []
    with tempfile.TemporaryDirectory(prefix="kvoffload-bench-operator-") as tmp:
        workdir = args.keep or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        for size in (int(s) for s in args.sizes.split(",")):
            print(f"{size} policies", flush=True)
            traced = args.tracemalloc.with_suffix(f".{size}.txt") if args.tracemalloc else None
            held = args.mallinfo.with_suffix(f".{size}.txt") if args.mallinfo else None
            spied = args.py_spy.with_suffix(f".{size}.txt") if args.py_spy else None
            row = bench_size(
                size, args.namespaces, args.measure, workdir, traced, args.interval, args.at_rest, held, spied,
                args.restarts, args.retired_gone,
            )  # fmt: skip
            rows.append(row)
            median = row["sweep_median_s"]
            print(
                f"{size:>5} policies  {row['series']:>7} series  sweeps {row['sweeps']:.0f}  "
                f"sweep median {'-' if median is None else f'{median * 1000:.0f} ms'} "
                f"(runs {[round(s, 2) for s in row['sweep_runs_s']]})  "
                f"queries/sweep {row['queries_per_sweep']}  status writes/sweep {row['status_writes_per_sweep']}  "
                f"Deployment and pod lists {row['deployment_and_pod_lists']:.0f} (reads: "
                f"{row['workload_reads_watch']:.0f} from the watch, {row['workload_reads_list']:.0f} listed)  "
                f"reconcile mean "
                f"{(row['reconcile_mean_s'] or 0) * 1000:.1f} ms  "
                f"operator CPU/sweep {row['operator_cpu_per_sweep_s'] or 0:.1f} s  "
                f"RSS steady {mib(row['rss_steady_median_bytes'])} (max {mib(row['rss_steady_max_bytes'])}) "
                f"peak {mib(row['rss_peak_bytes'])}  errors {row['reconcile_errors']:.0f}  "
                f"full cycle {row['full_cycle_s']:.1f} s ({row['full_cycle_operator_cpu_s']:.1f} s CPU; "
                f"status-write floor {row['status_write_floor_s']:.1f} s)",
                flush=True,
            )
            if args.json:  # after every size, so a later failure keeps what was measured
                args.json.write_text(json.dumps(rows, indent=2) + "\n")
    if len(rows) > 1 and rows[0]["sweep_median_s"] and rows[-1]["sweep_median_s"]:
        ratio = rows[-1]["sweep_median_s"] / rows[0]["sweep_median_s"]
        print(f"sweep ratio {rows[-1]['policies']}/{rows[0]['policies']} policies: {ratio:.1f}x")
    for row in rows:
        if row["policies"] == 1000:
            # A full cycle: every policy due at once (as after a restart or a failover), all reconciled. At rest it
            # is the operator's own sweep, from its first reconcile's start: the time from the first one finished
            # says nothing once the reconciles wait for one batch together and all finish at once.
            own = row.get("full_cycle_own_sweeps_s")
            cycle_ok = (own if own is not None else row["full_cycle_s"]) < 2.0
            rss_ok = row["rss_peak_bytes"] < 200 * 2**20
            print(f"goals at 1,000 policies: cycle < 2 s {'MET' if cycle_ok else 'NOT MET'}; "
                  f"RSS < 200 MiB {'MET' if rss_ok else 'NOT MET'} (peak)")  # fmt: skip


if __name__ == "__main__":
    main()
