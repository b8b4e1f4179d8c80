"""``kvoffload demo``: the whole loop on this machine, no cluster needed.

One process tree holds the real Kubernetes control plane (``KubeCluster``: etcd,
kube-apiserver, its controllers and scheduler, fake GPU Nodes; or, with ``--api
emulated``, the in-process emulated API of ``LocalCluster``), a real Prometheus, a kubelet
stand-in that starts one emulated vLLM engine per replica,
the operator itself (``kvoffload run -A --standalone`` as a subprocess), and a
load generator replaying the bundled Mooncake conversation trace against the
engines the Service would route to. The demo applies the policy, shows the
rollout live, and writes a report (PNG plot, Markdown and HTML summary).

The default policy is ``examples/demo-two-tier.yaml``, the single source: a
wheel carries it as ``kvoffload_lab/data/demo-policy.yaml`` (force-included by
pyproject.toml, as the templates are); an editable install reads ``examples/``.

Scenarios:

- ``promote``: every level passes; the fleet ends Stable at the top level.
- ``regression``: once the newest tier's canary runs, its engines' TTFT is
  multiplied (``POST /emulator/faults``); the operator sees the canary fail
  for ``sustainedFor`` and rolls it back, ending RolledBack one level down.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import math
import os
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib import resources
from pathlib import Path
from typing import Any, TextIO

import yaml

from kvoffload.analysis.measurements import Measurements
from kvoffload.api.conventions import API_GROUP, API_VERSION, KIND, ROLLBACK_DECISIONS
from kvoffload.api.quantity import format_duration, parse_duration, quantity_bytes
from kvoffload.api.status import HistoryEntry, KVOffloadPolicyStatus, Phase
from kvoffload.policy.ladder import Level
from kvoffload_lab.report import Decision, Sample, summary_json

EXAMPLE_NAME = "demo-two-tier.yaml"
PACKAGED_NAME = "demo-policy.yaml"

# --fast: the same ladder with every duration shrunk. The window holds 6+ scrapes (1 s) so
# rate() has data; sustainedFor spans several analysis cycles, so one spike never rolls back.
# A 20 s window keeps a few hundred requests in every verdict at the demo's load; 30 s steps let
# a fresh canary's tiers fill in the first half and be judged in the second.
FAST_ROLLOUT = {"baselineDuration": "20s", "stepDuration": "30s"}
FAST_ANALYSIS = {"interval": "2s", "window": "20s", "sustainedFor": "6s"}

TTFT_REGRESSION = 4.0
"""The regression scenario multiplies the newest tier's canary TTFT by this."""

PROMETHEUS_HINT = (
    "kvoffload demo needs the Prometheus binary ({path} not found). Install it with `make setup`, "
    "or `sudo apt-get install -y --no-install-recommends prometheus` (Debian/Ubuntu), "
    "or point KVOFFLOAD_PROMETHEUS_BIN at a prometheus binary."
)


class DemoError(Exception):
    """The demo cannot run here; the message says what to do."""


# --- the policy -------------------------------------------------------------------------


def default_policy_path() -> Path:
    """The embedded demo policy: package data in a wheel, ``examples/`` in a source checkout."""
    packaged = resources.files("kvoffload_lab") / "data" / PACKAGED_NAME
    if packaged.is_file():
        return Path(str(packaged))
    source = Path(__file__).resolve().parents[2] / "examples" / EXAMPLE_NAME
    if source.is_file():
        return source
    raise DemoError(f"the demo policy is missing: neither {packaged} nor {source} exists; reinstall kvoffload")


def prepare_policy(doc: Mapping[str, Any], *, fast: bool, prometheus_url: str) -> dict[str, Any]:
    """The policy as the demo applies it: pointed at its own Prometheus, and with ``fast`` every
    duration shrunk."""
    out = copy.deepcopy(dict(doc))
    spec = out.setdefault("spec", {})
    spec.setdefault("prometheus", {})["url"] = prometheus_url
    if fast:
        spec.setdefault("rollout", {}).update(FAST_ROLLOUT)
        spec.setdefault("analysis", {}).update(FAST_ANALYSIS)
    return out


SGLANG_IMAGE = "lmsysorg/sglang:v0.5.23-cu129"
TRTLLM_IMAGE = "nvcr.io/nvidia/tensorrt-llm/release:1.2.0"


def _on_sglang(spec: dict[str, Any]) -> None:
    """SGLang: its image, and each CPU size in whole decimal gigabytes per TP rank (``--hicache-size``), rounded
    down but at least 1 GB a rank; a pilot no smaller than the tier after rounding is left out."""
    model = spec.setdefault("model", {})
    model["image"] = SGLANG_IMAGE
    ranks = int(model.get("tensorParallelSize", 1))

    def whole(size: str) -> str:
        return f"{max(1, quantity_bytes(size) // (10**9 * ranks)) * ranks}G"

    offload = spec.setdefault("offload", {})
    offload["cpu"] = whole(offload["cpu"])
    rollout = spec.setdefault("rollout", {})
    if "pilotCpu" in rollout:
        rollout["pilotCpu"] = whole(rollout["pilotCpu"])
        if quantity_bytes(rollout["pilotCpu"]) >= quantity_bytes(offload["cpu"]):
            del rollout["pilotCpu"]


def _on_trtllm(spec: dict[str, Any]) -> None:
    """TensorRT-LLM: its image, and its host cache as the one tier (no file tier, no vLLM-only offload fields)."""
    spec.setdefault("model", {})["image"] = TRTLLM_IMAGE
    offload = spec.setdefault("offload", {})
    for vllm_only in ("secondaryTiers", "evictionPolicy", "blockSize", "storeThreshold"):
        offload.pop(vllm_only, None)


ENGINE_DOCS: Mapping[str, Callable[[dict[str, Any]], None]] = {"sglang": _on_sglang, "trtllm": _on_trtllm}
"""How the demo policy (a vLLM one) is moved onto each other engine (``kvoffload demo --engine``)."""
DEMO_ENGINES = ("vllm", *ENGINE_DOCS)


def on_engine(doc: Mapping[str, Any], engine: str) -> dict[str, Any]:
    """The demo policy on ``engine`` (:data:`ENGINE_DOCS` says what changes for each)."""
    out = copy.deepcopy(dict(doc))
    spec = out.setdefault("spec", {})
    on = spec.get("engine", "vllm")
    if engine == on:
        return out
    if engine not in ENGINE_DOCS or on != "vllm":
        raise DemoError(f"--engine {engine}: this policy runs on {on}; give a policy for {engine} with --policy")
    spec["engine"] = engine
    spec.setdefault("model", {}).pop("vllmVersion", None)
    ENGINE_DOCS[engine](spec)
    return out


def load_policy_doc(path: Path) -> dict[str, Any]:
    """The one KVOffloadPolicy document of a YAML file, validated (PolicyError names every bad field)."""
    from kvoffload.policy.loading import load_policy
    from kvoffload_lab.cluster.laboperator import LAB_TENANCY

    policy = load_policy(path, LAB_TENANCY)  # raises PolicyError
    docs = [d for d in yaml.safe_load_all(path.read_text()) if isinstance(d, dict) and d.get("kind") == KIND]
    doc: dict[str, Any] = docs[0]
    doc.setdefault("metadata", {}).setdefault("namespace", policy.metadata.namespace)
    return doc


def prometheus_binary() -> str:
    """The Prometheus binary the demo starts; DemoError with install advice if there is none."""
    from kvoffload_lab.promserver import PROMETHEUS_BIN

    found = shutil.which(PROMETHEUS_BIN) or (PROMETHEUS_BIN if os.access(PROMETHEUS_BIN, os.X_OK) else None)
    if found is None:
        raise DemoError(PROMETHEUS_HINT.format(path=PROMETHEUS_BIN))
    return found


# --- scenarios ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Expectation:
    """How a scenario must end."""

    phase: Phase
    level: Level
    rollback: bool
    """A Rollback decision must be in the history."""

    def describe(self) -> str:
        return f"{self.phase.value} at {self.level.name}" + (" after a rollback" if self.rollback else "")


@dataclass(frozen=True)
class Scenario:
    name: str
    summary: str
    ttft_regression: float | None = None
    """Multiply the TTFT of the top level's canary engines by this, once they run."""

    def expectation(self, ladder: Sequence[Level]) -> Expectation:
        top = ladder[-1]
        if self.ttft_regression is None:
            return Expectation(Phase.STABLE, top, rollback=False)
        below = next((lv for lv in reversed(ladder[:-1]) if not lv.canary_only), ladder[0])
        return Expectation(Phase.ROLLED_BACK, below, rollback=True)


SCENARIOS: dict[str, Scenario] = {
    "promote": Scenario("promote", "every level passes analysis; the fleet climbs to the top level and stays"),
    "regression": Scenario(
        "regression",
        f"the newest tier's canary gets a ×{TTFT_REGRESSION:g} TTFT regression; the operator rolls it back",
        ttft_regression=TTFT_REGRESSION,
    ),
}


@dataclass(frozen=True)
class ScenarioCheck:
    """Whether the run has ended, and how."""

    done: bool
    ok: bool
    outcome: str
    problems: tuple[str, ...] = ()


def judge(expect: Expectation, status: KVOffloadPolicyStatus | None, replicas: int) -> ScenarioCheck:
    """Has the scenario ended, and as expected?

    It ends as expected when the phase and the stable level are the expected ones with every
    replica Ready on it (and, when required, a rollback in the history). It ends unexpectedly in
    Stable, RolledBack or Held anywhere else (nothing moves on its own from there), or when Invalid.
    """
    if status is None or status.stable is None or status.stage is None:
        return ScenarioCheck(False, False, "no status yet")
    level = status.ladder[status.stable.level] if 0 <= status.stable.level < len(status.ladder) else "?"
    outcome = f"{status.phase.value} at {level}"
    rolled_back = any(h.decision in ROLLBACK_DECISIONS for h in status.history)
    problems: list[str] = []
    if status.phase is not expect.phase:
        problems.append(f"phase {status.phase.value}, expected {expect.phase.value}")
    if status.stable.level != expect.level.index:
        problems.append(f"stable level {level}, expected {expect.level.name}")
    if expect.rollback and not rolled_back:
        problems.append("no rollback in the history")
    settled = status.canary is None and status.stable.ready == status.stable.replicas == replicas
    if not problems and settled:
        return ScenarioCheck(True, True, outcome)
    if not problems:
        return ScenarioCheck(False, False, outcome, (f"waiting for {replicas} Ready replicas",))
    final = status.phase in (Phase.STABLE, Phase.ROLLED_BACK, Phase.HELD, Phase.INVALID)
    return ScenarioCheck(final, False, outcome, tuple(problems))


# --- the timeline -------------------------------------------------------------------------


def sample_from(
    t: float,
    status: KVOffloadPolicyStatus | None,
    measured: Measurements | None,
    bought: Bought | None = None,
) -> Sample:
    """One timeline sample: the status's phase, stage and replicas; Prometheus's figures per variant;
    and what offload bought per variant (``bought``), for the variants that exist."""
    replicas: dict[str, int] = {}
    ready: dict[str, int] = {}
    levels: dict[str, str] = {}
    if status is not None:
        for who, variant in (("stable", status.stable), ("canary", status.canary)):
            if variant is None:
                continue
            replicas[who], ready[who] = variant.replicas, variant.ready
            in_ladder = 0 <= variant.level < len(status.ladder)
            levels[who] = status.ladder[variant.level] if in_ladder else str(variant.level)
    ttft: dict[str, float | None] = {}
    share: dict[str, float | None] = {}
    if measured is not None:
        for who, got in (("stable", measured.stable), ("canary", measured.canary)):
            if got is None or who not in replicas:
                continue
            ttft[who], share[who] = _finite(got.ttft_p99), _finite(got.external_share)
    b = bought or Bought()
    return Sample(
        ttft_p50={k: v for k, v in b.ttft_p50.items() if k in replicas},
        avoided_tokens_per_s={k: v for k, v in b.avoided_tokens_per_s.items() if k in replicas},
        gpu_s_saved_per_s={k: v for k, v in b.gpu_s_saved_per_s.items() if k in replicas},
        t=round(t, 2),
        phase=status.phase.value if status is not None else Phase.PENDING.value,
        stage=status.stage.name if status is not None and status.stage is not None else "",
        step=status.stage.step if status is not None and status.stage is not None else 0,
        replicas=replicas,
        ready=ready,
        levels=levels,
        ttft_p99=ttft,
        external_share=share,
        verdict=status.last_analysis.verdict.value if status is not None and status.last_analysis else None,
    )


@dataclass
class Bought:
    """What offload bought per variant at one cycle: p50 TTFT, prompt tokens avoided/s, GPU-seconds saved/s."""

    ttft_p50: dict[str, float | None] = field(default_factory=dict)
    avoided_tokens_per_s: dict[str, float | None] = field(default_factory=dict)
    gpu_s_saved_per_s: dict[str, float | None] = field(default_factory=dict)


def bought_queries(dialect: Any, namespace: str, policy: str, window: str) -> dict[str, str]:
    """PromQL per config hash: p50 TTFT (vLLM's histogram) and external prompt tokens per second (by source)."""
    from kvoffload.analysis.queries import LabelNames, promql_duration
    from kvoffload.engines.dialect import SOURCE_EXTERNAL_KV_TRANSFER

    labels = LabelNames()
    sel = f'{labels.namespace}="{namespace}", {labels.policy}="{policy}"'
    w = promql_duration(window)
    rate = f"rate({dialect.ttft_bucket}{{{sel}}}[{w}])"
    out = {"ttft_p50": f"histogram_quantile(0.5, sum by (le, {labels.config_hash}) ({rate}))"}
    if dialect.prompt_tokens_by_source:
        source = f'source="{SOURCE_EXTERNAL_KV_TRANSFER}"'
        out["avoided_tokens_per_s"] = (
            f"sum by ({labels.config_hash}) (rate({dialect.prompt_tokens_by_source}{{{sel}, {source}}}[{w}]))"
        )
    return out


def query_by_variant(prometheus_url: str, expr: str, roles: Mapping[str, str]) -> dict[str, float | None]:
    """An instant query's value per role (``roles``: config hash to stable or canary); empty when Prometheus
    has nothing (or cannot be reached)."""
    import requests

    from kvoffload.analysis.queries import LabelNames

    try:
        response = requests.get(f"{prometheus_url}/api/v1/query", params={"query": expr}, timeout=5)
        result = response.json()["data"]["result"]
    except (requests.RequestException, ValueError, KeyError):
        return {}
    out: dict[str, float | None] = {}
    for item in result:
        role = roles.get(item.get("metric", {}).get(LabelNames().config_hash, ""))
        if role:
            out[role] = _finite(float(item["value"][1]))
    return out


class SavedMeter:
    """GPU-seconds saved per second per variant, from each engine's cumulative ``/emulator/state`` total."""

    def __init__(self) -> None:
        self.last: dict[str, tuple[float, float]] = {}

    def update(self, now: float, readings: Sequence[tuple[str, str, float]]) -> dict[str, float | None]:
        """``readings``: (variant, pod, saved GPU-seconds so far). A pod seen for the first time gives no rate yet."""
        out: dict[str, float | None] = {}
        for variant, pod, saved in readings:
            before = self.last.get(pod)
            self.last[pod] = (now, saved)
            if before is None or now <= before[0]:
                continue
            out[variant] = (out.get(variant) or 0.0) + max(0.0, saved - before[1]) / (now - before[0])
        return out


async def engine_savings(
    cluster: Any, policy: str, namespace: str, roles: Mapping[str, str]
) -> list[tuple[str, str, float]]:
    """(role, pod, saved GPU-seconds so far) of every serving engine of ``policy`` whose config hash has a role."""
    import aiohttp

    from kvoffload.api.conventions import LABEL_CONFIG_HASH, LABEL_POLICY

    out: list[tuple[str, str, float]] = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as session:
        for engine in cluster.pods(f"{LABEL_POLICY}={policy}", namespace):
            if not engine.opened:
                continue
            try:
                async with session.get(f"{engine.url}/emulator/state") as response:
                    state = await response.json()
            except (aiohttp.ClientError, TimeoutError, OSError, ValueError):
                continue
            totals = state.get("totals") if isinstance(state, dict) else None
            role = roles.get(engine.labels.get(LABEL_CONFIG_HASH, ""))
            if role and isinstance(totals, dict) and "saved_gpu_s" in totals:
                out.append((role, engine.key, float(totals["saved_gpu_s"])))
    return out


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def decisions_from(history: Sequence[HistoryEntry], started: datetime) -> list[Decision]:
    """The status history as decisions on the demo's clock (seconds since ``started``)."""
    return [
        Decision(
            t=round(max(0.0, (h.time - started).total_seconds()), 2),
            stage=h.stage,
            decision=h.decision,
            reason=h.reason,
            message=h.message,
        )
        for h in history
        if h.time >= started
    ]


# --- the progress view --------------------------------------------------------------------


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.0f}ms"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def _elapsed(t: float) -> str:
    minutes, seconds = divmod(int(t), 60)
    return f"{minutes}:{seconds:02d}"


def _where(sample: Sample, steps: Sequence[int]) -> str:
    if "canary" not in sample.replicas:
        return sample.stage
    if sample.step == 0:
        return f"{sample.stage} canary"
    pct = steps[sample.step - 1] if 0 < sample.step <= len(steps) else sample.step
    return f"{sample.stage} {pct}%"


def progress_line(sample: Sample, steps: Sequence[int] = (50, 100)) -> str:
    """One line per cycle: elapsed, phase, stage, replicas per variant, p99 TTFT, external share, verdict.

    e.g. ``1:12 Promoting  cpu 50%       stable 2/2 gpu-only  canary 2/2 cpu   TTFT 380ms/210ms  ext 0%/31%  Pass``
    """
    variants = []
    for who in ("stable", "canary"):
        if who in sample.replicas:
            variants.append(f"{who} {sample.ready.get(who, 0)}/{sample.replicas[who]} {sample.levels.get(who, '')}")
    ttft = "/".join(_ms(sample.ttft_p99.get(who)) for who in ("stable", "canary") if who in sample.replicas)
    share = "/".join(_pct(sample.external_share.get(who)) for who in ("stable", "canary") if who in sample.replicas)
    return (
        f"{_elapsed(sample.t):>5} {sample.phase:<10} {_where(sample, steps):<16} {'  '.join(variants):<34} "
        f"TTFT {ttft or '-':<13} ext {share or '-':<8} {sample.verdict or '-'}"
    ).rstrip()


PROGRESS_HEADER = "elapsed phase     stage            replicas (ready/desired level)     TTFT s/c      ext s/c  verdict"


def decision_line(d: Decision) -> str:
    """A decision as the progress view prints it, marked when it is a rollback."""
    mark = "!!" if d.decision in ROLLBACK_DECISIONS else "=>"
    return f"{_elapsed(d.t):>5} {mark} {d.decision} ({d.reason}) at {d.stage}: {d.message}"


class Progress:
    """The live view: one line per cycle, or, on a terminal, one status line redrawn in place.

    Decisions always get their own lines, so the story stays on screen.
    """

    def __init__(self, stream: TextIO, *, tty: bool | None = None, steps: Sequence[int] = (50, 100)) -> None:
        self.stream = stream
        self.tty = stream.isatty() if tty is None else tty
        self.steps = steps
        self._pending = False  # a redrawn status line is on screen

    def header(self, text: str) -> None:
        self._clear()
        self.stream.write(text + "\n")
        self.stream.flush()

    def sample(self, sample: Sample) -> None:
        line = progress_line(sample, self.steps)
        if self.tty:
            self.stream.write("\r\x1b[2K" + line)
            self._pending = True
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def decision(self, d: Decision) -> None:
        self._clear()
        self.stream.write(decision_line(d) + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self._pending:
            self.stream.write("\n")
            self._pending = False
        self.stream.flush()

    def _clear(self) -> None:
        if self._pending:
            self.stream.write("\r\x1b[2K")
            self._pending = False


def duration_text(seconds: float) -> str:
    return format_duration(seconds) if seconds >= 1 else "0s"


# --- the run ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Load:
    """How the bundled Mooncake conversation trace is replayed on two cores."""

    speedup: float = 24.0
    """Trace time runs 24 times faster, so a 30 s step spans 12 minutes of Kimi's traffic and a
    conversation's next turn (a median 422 requests, about 2 minutes later) falls inside it."""
    sessions: int = 4
    """One conversation in four, whole: about 20 requests/s in all, each conversation keeping its timing."""
    scale: float = 1 / 32
    """512-token trace blocks become 16 tokens (one engine block), so the reuse pattern is kept."""
    max_prompt_tokens: int = 1024
    """Prompts past 32k trace tokens (the longest 6%) are cut there, as a 32k context would: a p99
    over one engine's few hundred requests is then the cost of a full-length prompt, not whichever
    of the trace's rare 100k-token prompts happened to land on that engine."""
    max_tokens: int = 4
    max_in_flight: int = 64


ENGINE_GPU_KV_BLOCKS = 64
"""The engines' GPU KV cache: 1,024 tokens, about three prompts, so a conversation's earlier turns
are evicted from the GPU before it comes back and return from the offload tiers, or are recomputed."""


@dataclass
class DemoResult:
    """What ``kvoffload demo`` reports at the end."""

    scenario: str
    ok: bool
    outcome: str
    expected: str
    elapsed: float
    status: dict[str, Any] | None
    timeline: Any  # report.Timeline
    report_files: dict[str, str]
    problems: list[str]
    summary: dict[str, Any] | None = None
    """What the kubelet stand-in counted: podsStarted, minReadyReplicas, Ready engines per level over time."""
    api: str = "real"
    """``real`` (kube-apiserver) or ``emulated`` (kubeemu)."""
    api_server_version: str | None = None
    """The real API server's gitVersion; None on the emulated API."""

    def to_json(self) -> dict[str, Any]:
        return {
            "scenario": self.scenario,
            "cluster": {"api": self.api, "apiServerVersion": self.api_server_version},
            "ok": self.ok,
            "outcome": self.outcome,
            "expected": self.expected,
            "elapsed": round(self.elapsed, 1),
            "problems": self.problems,
            "report": self.report_files,
            "status": self.status,
            "summary": {**summary_json(self.timeline), **(self.summary or {})},
            "timeline": self.timeline.to_json(),
        }


def planned_seconds(spec: Any, ladder: Sequence[Level]) -> float:
    """How long the climb takes if every step passes on time: the baseline plus every step."""
    from kvoffload.rollout.replicas import next_step

    steps = 0
    for level in ladder[1:]:
        steps += 1  # the canary
        step = 0
        while not level.canary_only and (following := next_step(spec, step)) is not None:
            steps, step = steps + 1, following
    return parse_duration(spec.rollout.baseline_duration) + steps * parse_duration(spec.rollout.step_duration)


async def run_demo(
    scenario: Scenario,
    *,
    fast: bool,
    out_dir: Path,
    policy_path: Path | None,
    progress: Progress,
    load: Load | None = None,
    deadline: float | None = None,
    api: str = "real",
    engine: str | None = None,
) -> DemoResult:
    """Run one scenario end to end and write the report; everything started is stopped on return or cancel.

    ``api``: ``real`` runs it on kube-apiserver (building the control plane first when its binaries are
    missing), ``emulated`` on the in-process kubeemu. ``engine``: run the policy on that engine
    (:func:`on_engine`); None: as the policy says."""
    from kvoffload.analysis.prometheus import PrometheusProvider
    from kvoffload.analysis.queries import Target
    from kvoffload.api.conventions import LABEL_LEVEL, LABEL_POLICY
    from kvoffload.api.types import KVOffloadPolicy
    from kvoffload.engines import engine_for
    from kvoffload.policy.ladder import build_ladder
    from kvoffload_lab import load as loadgen
    from kvoffload_lab.capacity import Capacity
    from kvoffload_lab.cluster.apis import lab_cluster
    from kvoffload_lab.cluster.laboperator import start_operator, stop_operator
    from kvoffload_lab.report import Timeline, write_report

    prometheus_binary()
    source = policy_path or default_policy_path()
    raw = load_policy_doc(source) if engine is None else on_engine(load_policy_doc(source), engine)
    load = load or Load()
    trace = loadgen.read_trace()
    out_dir.mkdir(parents=True, exist_ok=True)

    cluster = lab_cluster(
        "kube" if api == "real" else api,  # `--api real` runs the lab cluster's kube API
        engine_args=["--gpu-kv-blocks", str(ENGINE_GPU_KV_BLOCKS)],
        # On kube-apiserver: built first if need be, and priced as on the emulated API (the seed's laptop, not
        # the L4 the policy names): the demo's budgets and its story are set for those engines.
        kube={
            "gpu_class_pricing": False,
            "build": True,
            "progress": lambda line: progress.header(f"cluster: {line}"),
        },
    )
    async with cluster:
        doc = prepare_policy(raw, fast=fast, prometheus_url=cluster.prometheus.url)
        policy = KVOffloadPolicy.model_validate(doc)
        spec, name, namespace = policy.spec, policy.metadata.name, policy.metadata.namespace
        ladder = build_ladder(spec)
        expect = scenario.expectation(ladder)
        limit = deadline if deadline is not None else 2 * planned_seconds(spec, ladder) + 90
        steps = spec.rollout.promotion_steps
        progress.steps = steps
        progress.header(
            f"kvoffload demo --scenario {scenario.name}{' --fast' if fast else ''}: {scenario.summary}\n"
            f"policy {namespace}/{name} from {source}; ladder {' → '.join(lv.name for lv in ladder)}; "
            f"{spec.replicas} replicas (maxSurge {spec.rollout.max_surge}); steps of {spec.rollout.step_duration}; "
            f"expecting {expect.describe()} "
            f"(giving up after {duration_text(limit)})\n"
            f"Prometheus {cluster.prometheus.url}, Kubernetes API {cluster.url} "
            f"({cluster.api_server_version or 'emulated'}); load: Mooncake conversation "
            f"trace ×{load.speedup:g}, 1 conversation in {load.sessions}, prompts ×{load.scale:g}, "
            "routed by conversation"
        )
        progress.header(PROGRESS_HEADER)
        provider = PrometheusProvider(cluster.prometheus.url, timeout=5.0)
        target = Target(
            namespace,
            name,
            spec.analysis.window,
            dialect=engine_for(spec).dialect(spec),
            extra_matchers=spec.prometheus.extra_matchers,
        )
        interval = parse_duration(spec.analysis.interval)
        bought_exprs = bought_queries(target.dialect, namespace, name, spec.analysis.window)
        saved_meter = SavedMeter()
        census, replicas = cluster.kubelet.census, spec.replicas
        started_wall = datetime.now(UTC)
        start = time.monotonic()
        operator = start_operator(cluster)
        load_task: asyncio.Task[loadgen.LoadStats] | None = None
        timeline = Timeline(
            policy=f"{namespace}/{name}",
            scenario=scenario.name,
            ladder=[lv.name for lv in ladder],
            ttft_budget=parse_duration(spec.analysis.ttft_p99),
            min_external_share=spec.analysis.min_external_share,
            expected=expect.describe(),
        )
        status: KVOffloadPolicyStatus | None = None
        verdict = ScenarioCheck(False, False, "no status yet")
        seen = 0
        try:
            await cluster.apply(doc)
            load_task = asyncio.create_task(
                loadgen.replay(
                    lambda: cluster.endpoints(name, namespace),
                    trace,
                    model=spec.model.served_model_name or name,
                    speedup=load.speedup,
                    duration=limit + 30,
                    scale=load.scale,
                    sessions=load.sessions,
                    max_prompt_tokens=load.max_prompt_tokens,
                    max_tokens=load.max_tokens,
                    max_in_flight=load.max_in_flight,
                ),
                name="demo load",
            )
            injected = False
            while True:
                now = time.monotonic() - start
                if operator.poll() is not None:
                    raise DemoError(f"the operator exited with status {operator.returncode}; see its log")
                if load_task.done():
                    load_task.result()  # raises what the load generator failed with
                obj = cluster.get(f"{API_GROUP}/{API_VERSION}", KIND, namespace, name) or {}
                raw_status = obj.get("status")
                status = KVOffloadPolicyStatus.model_validate(raw_status) if raw_status else None
                if status is not None:  # stable and canary are the config hashes status gives those roles
                    target = dataclasses.replace(
                        target,
                        stable_hash=status.stable.config_hash if status.stable is not None else None,
                        canary_hash=status.canary.config_hash if status.canary is not None else None,
                    )
                measured = (await asyncio.to_thread(provider.measure, [target])).get(target.key)
                roles = {h: role for role, h in (("stable", target.stable_hash), ("canary", target.canary_hash)) if h}
                savings = await engine_savings(cluster, name, namespace, roles)
                bought = Bought(gpu_s_saved_per_s=saved_meter.update(now, savings))
                for key, expr in bought_exprs.items():
                    setattr(bought, key, await asyncio.to_thread(query_by_variant, cluster.prometheus.url, expr, roles))
                sample = sample_from(now, status, measured, bought)
                timeline.samples.append(sample)
                ready = census.sample(now, name, cluster.kubelet.engines.values())
                timeline.capacity.append(Capacity(now, ready))
                if status is not None:
                    fresh = decisions_from(status.history, started_wall)
                    for d in fresh[seen:]:
                        progress.decision(d)
                    seen = len(fresh)
                    timeline.decisions = fresh
                progress.sample(sample)
                if (
                    scenario.ttft_regression is not None
                    and not injected
                    and status is not None
                    and status.canary is not None
                    and status.canary.level == ladder[-1].index
                ):
                    # the top level's engines: its canary in this scenario, which never promotes it
                    selector = f"{LABEL_POLICY}={name},{LABEL_LEVEL}={ladder[-1].name}"
                    await cluster.set_faults(
                        selector, {"ttft_multiplier": scenario.ttft_regression}, namespace=namespace, sticky=True
                    )
                    injected = True
                    note = (
                        f"Injected a ×{scenario.ttft_regression:g} TTFT regression into the {ladder[-1].name} "
                        f"canary engines at {duration_text(now)}."
                    )
                    timeline.notes.append(note)
                    progress.header(f"{_elapsed(now):>5} ** {note}")
                verdict = judge(expect, status, spec.replicas)
                if verdict.done or now >= limit:
                    break
                await asyncio.sleep(max(0.2, interval - (time.monotonic() - start - now)))
        finally:
            if load_task is not None and not load_task.done():
                load_task.cancel()
            stats = None
            if load_task is not None:
                try:
                    stats = await load_task
                except (asyncio.CancelledError, Exception):
                    stats = None
            await stop_operator(operator)
            progress.close()
            with contextlib.suppress(OSError):
                shutil.copyfile(cluster.workdir / "operator.log", out_dir / "operator.log")
        elapsed = time.monotonic() - start
        if stats is not None:
            timeline.notes.append(
                f"Load: {stats.sent} requests sent ({stats.ok} ok, {stats.failed} failed, "
                f"{stats.skipped} shed at the in-flight limit)."
            )
    problems = list(verdict.problems)
    if not verdict.done:
        problems.insert(0, f"did not end within {duration_text(limit)}")
    timeline.outcome, timeline.ok = verdict.outcome, verdict.ok
    files = write_report(timeline, out_dir)
    return DemoResult(
        scenario=scenario.name,
        ok=verdict.ok,
        outcome=verdict.outcome,
        expected=expect.describe(),
        elapsed=elapsed,
        status=status.model_dump(mode="json", by_alias=True, exclude_none=True) if status is not None else None,
        timeline=timeline,
        report_files={"png": str(files.png), "markdown": str(files.markdown), "html": str(files.html)},
        problems=problems if not verdict.ok else [],
        summary=census.to_json(name, replicas),
        api=api,
        api_server_version=cluster.api_server_version,
    )


def final_summary(result: DemoResult) -> str:
    """The closing lines of the table output: outcome, decisions, where the report is."""
    verdict = "as expected" if result.ok else "NOT as expected"
    lines = [
        "",
        f"{result.scenario}: ended {result.outcome} after {duration_text(result.elapsed)} "
        f"({verdict}; expected {result.expected})",
    ]
    lines += [f"  problem: {p}" for p in result.problems]
    rollbacks = result.timeline.rollbacks
    for d in rollbacks:
        lines.append(f"  rollback at {_elapsed(d.t)} ({d.reason}): {d.message}")
    lines += [f"  {note}" for note in result.timeline.notes]
    lines.append(f"report: {result.report_files['html']} (plot {result.report_files['png']})")
    return "\n".join(lines)


async def run_until_signalled(*args: Any, **kwargs: Any) -> DemoResult:
    """:func:`run_demo`, cancelled (so everything it started is stopped) on SIGTERM as on Ctrl-C."""
    import signal

    task = asyncio.current_task()
    loop = asyncio.get_running_loop()
    assert task is not None
    with contextlib.suppress(NotImplementedError):  # not on Windows
        loop.add_signal_handler(signal.SIGTERM, task.cancel)
    try:
        return await run_demo(*args, **kwargs)
    finally:
        with contextlib.suppress(NotImplementedError):
            loop.remove_signal_handler(signal.SIGTERM)
