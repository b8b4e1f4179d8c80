"""Measure a running engine's TTFT phases through its own HTTP API and ``/metrics``
(``kvoffload calibrate --engine-url``).

For each prompt length: a cold request (a prompt never seen), the same prompt again (a GPU hit), then
fillers of fresh prompts until the GPU cache has turned over, then the prompt once more (restored from the
CPU tier). Each request is sent alone and timed by the engine itself: the change of its TTFT histogram's
sum across the request, with the token split from its own counters (computed, GPU hit, external). A
request whose split is not the one intended (the CPU tier had dropped the prompt, say) is kept under the
case its split shows.

I/O only: the series names come from the caller (the CLI reads them from the metric dialects), the fit
from ``enginecost``.
"""

from __future__ import annotations

import json
import math
import random
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from prometheus_client.parser import text_string_to_metric_families

from kvoffload.economics.enginecost import Case, Sample, case_of
from kvoffload.economics.profile import ProfileError

TOKEN_IDS: Final = (1000, 30000)
"""Random prompts draw token ids from here: inside every common vocabulary, above the special tokens."""
SETTLE_S: Final = 0.5
"""Pause before a restore, so the fillers' stores to the CPU tier have finished."""


@dataclass(frozen=True)
class EngineSeries:
    """Where one engine's /metrics keeps what the probe reads (sample names, with ``_sum``/``_total``)."""

    ttft_sum: str
    ttft_count: str
    by_source: str | None
    """Prompt tokens by source (vLLM): ``source`` = computed, local hit, external."""
    source_computed: str
    source_local_hit: str
    source_external: str
    prompt_tokens: str | None
    """Prompt tokens in all, where the split is cached tokens by tier (SGLang)."""
    cached_by_source: str | None
    """Its label is ``cache_source``, which ``scrape`` keys on beside vLLM's ``source``."""
    cached_device: str
    cached_host: tuple[str, ...]


@dataclass(frozen=True)
class Engine:
    """A running engine's address and what is known of it."""

    url: str
    model: str
    """The served model name the API answers to."""
    gpu_tokens: int
    """GPU KV cache capacity in tokens: how much filler turns the cache over."""
    version: str


class ProbeError(ProfileError):
    """The engine did not answer as a calibration needs."""


def _get(url: str, timeout: float = 10.0) -> bytes:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            body: bytes = response.read()
            return body
    except (urllib.error.URLError, OSError) as exc:
        raise ProbeError(f"GET {url}: {exc}") from None


def scrape(url: str) -> dict[tuple[str, str], float]:
    """Every sample of ``/metrics``, summed over all labels but one that tells sources apart."""
    text = _get(url + "/metrics").decode()
    out: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            key = (s.name, s.labels.get("source", s.labels.get("cache_source", "")))
            out[key] = out.get(key, 0.0) + s.value
            total = (s.name, "*")
            out[total] = out.get(total, 0.0) + s.value
    return out


def discover(
    url: str, series: EngineSeries, served_model: str | None, gpu_tokens: int | None, version: str | None
) -> Engine:
    """The engine at ``url``: its served model, GPU token capacity and version, asked of the engine where the
    caller did not say."""
    url = url.rstrip("/")
    if served_model is None:
        models = json.loads(_get(url + "/v1/models"))
        try:
            served_model = str(models["data"][0]["id"])
        except (KeyError, IndexError, TypeError):
            raise ProbeError(f"{url}/v1/models names no model: pass --served-model-name") from None
    if version is None:
        try:
            version = str(json.loads(_get(url + "/version", timeout=3))["version"])
        except (ProbeError, KeyError, TypeError, ValueError):
            version = "unknown"
    if gpu_tokens is None:
        gpu_tokens = _gpu_tokens(_get(url + "/metrics").decode())
    return Engine(url, served_model, gpu_tokens, version)


def _gpu_tokens(text: str) -> int:
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name.endswith("cache_config_info") and "num_gpu_blocks" in s.labels:
                try:
                    return int(s.labels["num_gpu_blocks"]) * int(s.labels.get("block_size", "16"))
                except ValueError:
                    break
    raise ProbeError("the engine's /metrics does not say its GPU cache size: pass --gpu-tokens")


def complete(engine: Engine, ids: list[int], timeout: float = 300.0) -> None:
    """One completion of one token for the prompt ``ids``."""
    body = json.dumps(
        {"model": engine.model, "prompt": ids, "max_tokens": 1, "temperature": 0, "ignore_eos": True}
    ).encode()
    request = urllib.request.Request(
        engine.url + "/v1/completions", data=body, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            response.read()
    except urllib.error.HTTPError as exc:
        raise ProbeError(f"POST {engine.url}/v1/completions: HTTP {exc.code}: {exc.read()[:300]!r}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise ProbeError(f"POST {engine.url}/v1/completions: {exc}") from None


@dataclass(frozen=True)
class Measured:
    """One request as the engine counted it."""

    ttft_ms: float
    computed: int
    local_hit: int
    external: int

    @property
    def case(self) -> Case:
        return case_of(self.computed, self.local_hit, self.external)


def timed(engine: Engine, series: EngineSeries, ids: list[int], wait_s: float = 5.0) -> Measured:
    """Send ``ids`` alone and read back what the engine recorded for it."""
    before = scrape(engine.url)
    complete(engine, ids)
    deadline = time.monotonic() + wait_s
    while True:  # the engine may publish a request's figures a moment after answering it
        after = scrape(engine.url)
        count = _delta(before, after, series.ttft_count)
        if count >= 1 or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    if count != 1:
        raise ProbeError(
            f"the engine counted {count:g} first tokens for one request: is it serving other traffic, "
            f"or does it not export {series.ttft_count}?"
        )
    ttft_ms = _delta(before, after, series.ttft_sum) * 1e3
    if series.by_source is not None:
        computed = _delta(before, after, series.by_source, series.source_computed)
        local = _delta(before, after, series.by_source, series.source_local_hit)
        external = _delta(before, after, series.by_source, series.source_external)
    else:
        total = _delta(before, after, series.prompt_tokens or "")
        cached = series.cached_by_source or ""
        local = _delta(before, after, cached, series.cached_device)
        external = sum(_delta(before, after, cached, h) for h in series.cached_host)
        computed = total - local - external
    return Measured(ttft_ms, round(computed), round(local), round(external))


def _delta(a: dict[tuple[str, str], float], b: dict[tuple[str, str], float], name: str, label: str = "*") -> float:
    return b.get((name, label), 0.0) - a.get((name, label), 0.0)


@dataclass(frozen=True)
class Plan:
    """What to measure."""

    lengths: tuple[int, ...]
    held_out: tuple[int, ...]
    reps: int = 3
    filler_tokens: int = 2048
    max_fillers: int = 64
    seed: int = 0

    def fillers(self, gpu_tokens: int) -> int:
        """Fresh prompts that turn a cache of ``gpu_tokens`` over (a quarter more, for blocks still in use)."""
        return math.ceil(1.25 * gpu_tokens / self.filler_tokens) + 1


def measure(
    engine: Engine,
    series: EngineSeries,
    plan: Plan,
    restore_copy_ms: Callable[[int], float],
    progress: Callable[[str], None] = lambda _line: None,
) -> tuple[list[Sample], list[dict[str, Any]]]:
    """Samples of every length and case (one warm-up round first, discarded), and the raw record."""
    fillers = plan.fillers(engine.gpu_tokens)
    if fillers > plan.max_fillers:
        raise ProbeError(
            f"turning over a GPU cache of {engine.gpu_tokens:,} tokens takes {fillers} fillers of "
            f"{plan.filler_tokens:,} tokens (--max-fillers {plan.max_fillers}): run the engine with a small "
            "GPU cache (vLLM: --num-gpu-blocks-override) or raise --max-fillers"
        )
    rng = random.Random(plan.seed)

    def prompt(n: int) -> list[int]:
        return [rng.randrange(*TOKEN_IDS) for _ in range(n)]

    samples: list[Sample] = []
    raw: list[dict[str, Any]] = []
    everything = sorted({*plan.lengths, *plan.held_out})
    if not everything:
        raise ProbeError("no prompt lengths to measure")
    rounds = [(everything[0], -1, False)] + [
        (n, rep, n in plan.held_out) for rep in range(plan.reps) for n in everything
    ]
    for n, rep, held_out in rounds:
        target = prompt(n)
        cold = timed(engine, series, target)
        hit = timed(engine, series, target)
        filled = [timed(engine, series, prompt(plan.filler_tokens)).ttft_ms for _ in range(fillers)]
        time.sleep(SETTLE_S)
        restore = timed(engine, series, target)
        raw.append(
            {
                "promptTokens": n,
                "rep": rep,
                "heldOut": held_out,
                "fillersTtftMs": [round(x, 3) for x in filled],
                **{k: vars(m) for k, m in (("cold", cold), ("gpuHit", hit), ("cpuRestore", restore))},
            }
        )
        if rep < 0:
            progress(f"warm-up ({n:,} tokens): cold {cold.ttft_ms:.1f} ms, discarded")
            continue
        for m in (cold, hit, restore):
            samples.append(
                Sample(
                    case=m.case,
                    prompt_tokens=n,
                    computed=m.computed,
                    local_hit=m.local_hit,
                    external=m.external,
                    ttft_ms=m.ttft_ms,
                    restore_copy_ms=restore_copy_ms(m.external) if m.external else 0.0,
                    held_out=held_out,
                )
            )
        progress(
            f"{n:,} tokens, rep {rep + 1}/{plan.reps}{' (held out)' if held_out else ''}: cold {cold.ttft_ms:.1f} ms,"
            f" GPU hit {hit.ttft_ms:.1f} ms, CPU restore {restore.ttft_ms:.1f} ms"
            f" ({restore.external:,} tokens from the tier)"
        )
    if not any(s.case == "cpu_restore" for s in samples):
        raise ProbeError(
            f"no prompt came back from the CPU tier: it must hold the {fillers} fillers of {plan.filler_tokens:,} "
            "tokens and the prompt (a larger tier, or fewer GPU blocks), and the engine must offload"
        )
    return samples, raw
