"""One analysis cycle end to end: emulated engines scraped by the real Prometheus, read by the
provider, judged by assess(), and printed by `kvoffload analyze`.

Both variants get the same reuse workload (A A B C A N: a few shared prefixes, then a new one).
The GPU cache holds one prompt, so a prefix that comes back after two others has been evicted:
the canary (CPU tier on) loads it back from the offload tier, the stable variant recomputes it.
Windows are 10 s and Prometheus scrapes every second, so each scenario takes seconds.
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pytest
from click.testing import CliRunner

from kvoffload.analysis.assess import EXTERNAL_SHARE, TTFT_RATIO, Assessment, assess, record_verdict, sustained
from kvoffload.analysis.prometheus import PrometheusProvider
from kvoffload.analysis.queries import Target
from kvoffload.api.status import AnalysisStatus, Verdict
from kvoffload.api.types import KVOffloadPolicy
from kvoffload.cli.main import main
from kvoffload.engines.vllm.dialect import NEWEST
from kvoffload.policy.engine_config import config_hash
from kvoffload.policy.ladder import build_ladder
from kvoffload.policy.loading import load_policy
from kvoffload_lab.cluster.laboperator import LAB_TENANCY
from tests.support.engines import Engine, start_engines, stop_engines
from tests.support.prometheus import PrometheusServer, require_prometheus, synthetic_target, wait_until

pytestmark = pytest.mark.prometheus

WINDOW_S = 10
SUSTAINED_FOR_S = 3.0
ENGINE_ARGS = ["--max-model-len", "2048", "--gpu-kv-blocks", "48"]  # 48 blocks of 16: one 528-token prompt
OFFLOAD_ARGS = ["--kv-offloading-size", "0.5", "--kv-offloading-backend", "native"]

# The lab's leave on the command line: its Prometheus is on 127.0.0.1.
LAB = ("--prometheus-allow-private",)
POLICY_YAML = """\
apiVersion: kvoffload.io/v1alpha1
kind: KVOffloadPolicy
metadata: {{name: {name}, namespace: llm}}
spec:
  model: {{name: Qwen/Qwen3-0.6B, image: "vllm/vllm-openai:v0.32.0", maxModelLen: 2048}}
  gpu: {{class: nvidia-h100-80gb}}
  replicas: 2
  resources: {{baseMemory: 8Gi}}
  offload: {{cpu: 512Mi}}
  analysis: {{window: {window}s, interval: 1s, ttftP99: 5s, itlP99: 1s, minRequests: 30, sustainedFor: {sustained}s}}
  prometheus: {{url: "{url}"}}
"""


class ReuseWorkload:
    """Sends A A B C A N ... to one engine until stopped; every prompt has a unique 16-token tail."""

    PATTERN = ("A", "A", "B", "C", "A", "N")

    def __init__(self, engine: Engine, seed: int) -> None:
        self.engine = engine
        self.rng = random.Random(seed)
        self.prefixes = {k: [self.rng.randrange(1, 150_000) for _ in range(512)] for k in "ABC"}
        self.stop = threading.Event()
        self.sent = 0
        self.errors: list[str] = []
        self.thread = threading.Thread(target=self._run, name=f"load-{engine.port}", daemon=True)

    def _run(self) -> None:
        i = 0
        while not self.stop.is_set():
            key = self.PATTERN[i % len(self.PATTERN)]
            prefix = self.prefixes[key] if key != "N" else [self.rng.randrange(1, 150_000) for _ in range(512)]
            tail = [self.rng.randrange(1, 150_000) for _ in range(16)]
            try:
                self.engine.complete(prefix + tail, max_tokens=2)
                self.sent += 1
            except OSError as exc:  # keep the load going; the test asserts on what Prometheus saw
                self.errors.append(str(exc))
            i += 1


@dataclass
class Fleet:
    """A canary (CPU tier on) and a stable engine of one policy, under load, scraped by Prometheus."""

    name: str
    prometheus: PrometheusServer
    canary: Engine
    stable: Engine
    policy_file: Path
    loads: list[ReuseWorkload]

    def target(self, **kwargs: object) -> Target:
        ladder = build_ladder(self.policy.spec)
        return Target(
            "llm",
            self.name,
            f"{WINDOW_S}s",
            dialect=NEWEST,
            stable_hash=config_hash(self.policy, ladder[0]),
            canary_hash=config_hash(self.policy, ladder[-1]),
            **kwargs,  # type: ignore[arg-type]
        )

    @property
    def policy(self) -> KVOffloadPolicy:
        return load_policy(self.policy_file, LAB_TENANCY)

    def cycle(self, provider: PrometheusProvider, *, warmed_up: bool = True) -> Assessment:
        policy = load_policy(self.policy_file, LAB_TENANCY)
        level = build_ladder(policy.spec)[-1]  # the CPU tier
        measured = provider.measure([self.target()])[("llm", self.name)]
        return assess(policy.spec, level, measured, warmed_up=warmed_up)


def start_fleet(name: str, prometheus: PrometheusServer, tmp_path: Path) -> Iterator[Fleet]:
    policy_file = tmp_path / f"{name}.yaml"
    policy_file.write_text(
        POLICY_YAML.format(name=name, window=WINDOW_S, sustained=int(SUSTAINED_FOR_S), url=prometheus.url)
    )
    policy = load_policy(policy_file, LAB_TENANCY)
    gpu_only, cpu = build_ladder(policy.spec)[0], build_ladder(policy.spec)[-1]
    canary, stable = start_engines([[*ENGINE_ARGS, *OFFLOAD_ARGS], ENGINE_ARGS], log_dir=tmp_path)
    # labelled as the PodMonitor labels the pods: level and config hash, as `analyze` selects them
    prometheus.add_engine(canary.target, policy=name, level=cpu.name, config_hash=config_hash(policy, cpu))
    prometheus.add_engine(stable.target, policy=name, level=gpu_only.name, config_hash=config_hash(policy, gpu_only))
    loads = [ReuseWorkload(canary, seed=1), ReuseWorkload(stable, seed=1)]  # the same prompts on both
    for load in loads:
        load.thread.start()
    try:
        # increase() needs samples across the whole window, or it extrapolates from a part of it.
        prometheus.wait_for_series(
            f'count_over_time(vllm:time_to_first_token_seconds_count{{kvoffload_io_policy="{name}"}}[{WINDOW_S}s])'
            f" >= {WINDOW_S}",
            deadline=60,
            count=2,
        )
        yield Fleet(name, prometheus, canary, stable, policy_file, loads)
    finally:
        for load in loads:
            load.stop.set()
        for load in loads:
            load.thread.join(timeout=10)
        stop_engines([canary, stable])


@pytest.fixture(scope="module")
def healthy_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    """One fleet for the read-only scenarios (no faults), to pay its start-up once."""
    require_prometheus()
    prometheus = PrometheusServer(tmp_path_factory.mktemp("prometheus"))
    prometheus.start()
    try:
        yield from start_fleet("chat", prometheus, tmp_path_factory.mktemp("fleet"))
    finally:
        prometheus.stop()


@pytest.fixture
def fleet(prometheus: PrometheusServer, tmp_path: Path) -> Iterator[Fleet]:
    """A fleet of its own, for a scenario that injects a fault."""
    yield from start_fleet("chat", prometheus, tmp_path)


def test_a_healthy_canary_passes_and_only_the_offload_side_loads_tokens(healthy_fleet: Fleet) -> None:
    fleet = healthy_fleet
    result = fleet.cycle(PrometheusProvider(fleet.prometheus.url))

    assert result.verdict is Verdict.PASS, result.message
    share = result.metric(EXTERNAL_SHARE)
    assert share is not None
    assert share.canary is not None
    assert share.canary > 0.1  # B, C and both A after an eviction come back from the CPU tier
    assert share.stable == 0.0  # no offload: an evicted prefix is recomputed
    assert share.passed is True
    assert all(load.errors == [] for load in fleet.loads)


def test_analyze_prints_every_metric_and_exits_by_verdict(healthy_fleet: Fleet) -> None:
    fleet = healthy_fleet
    runner = CliRunner()
    table = runner.invoke(main, ["analyze", str(fleet.policy_file), "--prometheus", fleet.prometheus.url, *LAB])
    assert table.exit_code == 0, table.output
    for name in ("requests", "ttftP99", "ttftP99Ratio", "itlP99", "externalShare", "kvUsage", "liveConfig"):
        assert name in table.output
    assert "verdict: Pass" in table.output
    assert "kv_offloading_size=0.5" in table.output

    as_json = runner.invoke(
        main, ["analyze", str(fleet.policy_file), "--prometheus", fleet.prometheus.url, "-o", "json", *LAB]
    )
    doc = json.loads(as_json.output)
    assert as_json.exit_code == 0
    assert doc["verdict"] == "Pass"
    ttft = next(m for m in doc["metrics"] if m["name"] == "ttftP99")
    assert 0 < ttft["canary"] < ttft["threshold"] == 5.0

    # The guard judges the stable variant alone; nobody is named "absent", so there is no evidence.
    absent = fleet.policy_file.read_text().replace("name: chat,", "name: absent,")
    (fleet.policy_file.parent / "absent.yaml").write_text(absent)
    missing = runner.invoke(main, ["analyze", str(fleet.policy_file.parent / "absent.yaml"), "--guard", *LAB])
    assert missing.exit_code == 3, missing.output
    assert "no stable requests" in missing.output


def test_a_canary_whose_ttft_triples_fails_within_sustained_for(fleet: Fleet) -> None:
    provider = PrometheusProvider(fleet.prometheus.url)
    first = record_verdict(None, fleet.cycle(provider), datetime.now(UTC))
    assert first.verdict is Verdict.PASS, first.message
    status: AnalysisStatus | None = first

    fleet.canary.set_faults(ttft_multiplier=3.0)
    fault_at = time.monotonic()

    def rolled_back() -> bool:
        nonlocal status
        status = record_verdict(status, fleet.cycle(provider), datetime.now(UTC))
        return sustained(status, SUSTAINED_FOR_S, datetime.now(UTC))

    wait_until(rolled_back, deadline=30, what="a sustained Fail", poll=0.25)
    took = time.monotonic() - fault_at
    assert status is not None
    ratio = next(m for m in status.metrics if m.name == TTFT_RATIO)
    assert ratio.passed is False
    assert ratio.canary is not None
    assert ratio.canary > 1.5  # well past maxRegression 1.2; the stable side's host overhead is not tripled
    scrape = fleet.prometheus.scrape_interval
    # sustainedFor, plus two scrapes for the slow requests to reach Prometheus, plus one polling step, plus the time
    # for the evidence to form: a breach counts once enough of the window holds slow requests for the rank test to
    # pass alpha (2.2e-06 here: a 15-minute step's 900 looks at 1 s), up to half of it (8.0 s seen, 2026-12-06).
    assert ratio.p_value is not None
    assert ratio.alpha is not None
    assert ratio.p_value < ratio.alpha
    assert took <= SUSTAINED_FOR_S + WINDOW_S / 2 + 2 * scrape + 0.5, f"took {took:.1f}s"

    result = CliRunner().invoke(main, ["analyze", str(fleet.policy_file), *LAB])
    assert result.exit_code == 1, result.output
    assert "FAIL" in result.output


def test_a_stopped_prometheus_is_inconclusive_not_a_failure(prometheus: PrometheusServer, tmp_path: Path) -> None:
    policy_file = tmp_path / "chat.yaml"
    policy_file.write_text(POLICY_YAML.format(name="chat", window=WINDOW_S, sustained=3, url=prometheus.url))
    policy = load_policy(policy_file, LAB_TENANCY)
    provider = PrometheusProvider(prometheus.url, retries=0, timeout=2)
    target = synthetic_target("llm", "chat", f"{WINDOW_S}s")
    assert provider.measure([target])[target.key].error is None

    prometheus.stop()
    measured = provider.measure([target])[target.key]
    result = assess(policy.spec, build_ladder(policy.spec)[-1], measured, warmed_up=True)
    assert result.verdict is Verdict.INCONCLUSIVE
    assert "unreachable" in result.message
    status = record_verdict(record_verdict(None, result, datetime.now(UTC)), result, datetime.now(UTC))
    assert status.consecutive_inconclusive == 2
    cli = CliRunner().invoke(main, ["analyze", str(policy_file), *LAB])
    assert cli.exit_code == 3, cli.output
    assert "unreachable" in cli.output
