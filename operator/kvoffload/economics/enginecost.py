"""What a user waits for: the engine's time to first token, fitted from the engine's own measurements.

The PyTorch profiles (``profile.py``) time a forward and a copy; a real engine adds a fixed cost to every
request (scheduling, the step, sampling, the API server: about 16-20 ms with CUDA graphs and 60 ms eager on
an H100, issue 26) and runs a small model far from its FLOP bound. So the forecast is a model of the engine:

    TTFT = fixed + floor + prefill(computed) + read(cached) + restore(external)

- ``fixed``: every request, by engine mode.
- ``floor``: the launch cost of a forward that does not replay a CUDA graph, per layer: every request in
  eager mode, and prefill chunks above the largest captured batch with graphs.
- ``prefill``: the computed tokens' FLOPs (weights and attention) at a fitted throughput.
- ``read``: the computed tokens reading the cached context (the GPU hit's growth with length).
- ``restore``: the copy of issue 25 (``Profile.restore_seconds``, vLLM's own copy path) plus a fitted
  per-restore overhead (the load is asynchronous: the request waits a step for it).

Coefficients are fitted by non-negative weighted least squares on the medians of
``kvoffload calibrate --engine-url`` runs (weights 1/TTFT: the fit minimises relative error). A model the
profile measured is priced with its own fit; any other model with the class fit across the measured models,
from its parameter count, layers and KV bytes per token. Samples marked held out are stored and never fitted.

Pure: samples in, coefficients and forecasts out (numpy for the solve).
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal

import numpy as np

from kvoffload.economics.profile import VLLM_BLOCK_TOKENS, ProfileError

if TYPE_CHECKING:
    from kvoffload.api.types import KVOffloadPolicySpec

SCHEMA_VERSION: Final = 1
EngineMode = Literal["cudagraph", "eager"]
ENGINE_MODES: Final[tuple[EngineMode, ...]] = ("cudagraph", "eager")
Case = Literal["cold", "gpu_hit", "cpu_restore"]
CASES: Final[tuple[Case, ...]] = ("cold", "gpu_hit", "cpu_restore")

GRAPH_MAX_TOKENS: Final = 512
"""The largest batch vLLM captures a CUDA graph for by default (``max_cudagraph_capture_size``, 0.26):
a prefill chunk of more tokens runs the compiled forward without a graph, and pays the launch floor."""

TERMS: Final = ("fixedMs", "floorMsPerLayer", "msPerTflop", "readMsPerGb", "restoreOverheadMs")
"""The fitted coefficients, in the order of ``_features``."""
MIN_POINTS: Final = len(TERMS)
"""Medians (one per case and length) a fit needs at the least: one per coefficient."""


@dataclass(frozen=True)
class ModelCost:
    """What prices one model: its parameters, layers and KV bytes per token (one GPU, bf16 KV)."""

    name: str
    params: float
    layers: int
    kv_bytes_per_token: int

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "params": self.params,
            "layers": self.layers,
            "kvBytesPerToken": self.kv_bytes_per_token,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ModelCost:
        return cls(str(data["name"]), float(data["params"]), int(data["layers"]), int(data["kvBytesPerToken"]))


@dataclass(frozen=True)
class Sample:
    """One request's time to first token, as the engine counted it, with its token split."""

    case: Case
    prompt_tokens: int
    computed: int
    local_hit: int
    external: int
    ttft_ms: float
    restore_copy_ms: float = 0.0
    """Issue 25's copy of the external tokens, priced when measured (0 without external tokens)."""
    held_out: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "case": self.case,
            "promptTokens": self.prompt_tokens,
            "computed": self.computed,
            "localHit": self.local_hit,
            "external": self.external,
            "ttftMs": round(self.ttft_ms, 3),
            "restoreCopyMs": round(self.restore_copy_ms, 4),
            "heldOut": self.held_out,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Sample:
        case = str(data["case"])
        if case not in CASES:
            raise ProfileError(f"samples[].case: {case!r} is not one of {', '.join(CASES)}")
        return cls(
            case=case,
            prompt_tokens=int(data["promptTokens"]),
            computed=int(data["computed"]),
            local_hit=int(data["localHit"]),
            external=int(data["external"]),
            ttft_ms=float(data["ttftMs"]),
            restore_copy_ms=float(data.get("restoreCopyMs", 0.0)),
            held_out=bool(data.get("heldOut", False)),
        )


@dataclass(frozen=True)
class Run:
    """One calibration run: one model on one engine in one mode, and what it measured."""

    model: ModelCost
    mode: EngineMode
    samples: tuple[Sample, ...]
    device: str = ""
    engine_version: str = ""
    date: str = ""
    command: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.model.to_json(),
            "mode": self.mode,
            "device": self.device,
            "engineVersion": self.engine_version,
            "date": self.date,
            "command": self.command,
            "samples": [s.to_json() for s in self.samples],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Run:
        mode = str(data["mode"])
        if mode not in ENGINE_MODES:
            raise ProfileError(f"runs[].mode: {mode!r} is not one of {', '.join(ENGINE_MODES)}")
        return cls(
            model=ModelCost.from_json(data["model"]),
            mode=mode,
            samples=tuple(Sample.from_json(s) for s in data["samples"]),
            device=str(data.get("device", "")),
            engine_version=str(data.get("engineVersion", "")),
            date=str(data.get("date", "")),
            command=str(data.get("command", "")),
        )


@dataclass(frozen=True)
class Fit:
    """Coefficients of the TTFT model (``TERMS``), and how well they reproduce what they were fitted to."""

    coefficients: tuple[float, ...]
    points: int
    worst_relative_error: float

    def coefficient(self, term: str) -> float:
        return self.coefficients[TERMS.index(term)]

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {t: round(c, 6) for t, c in zip(TERMS, self.coefficients, strict=True)}
        out["points"] = self.points
        out["worstRelativeError"] = round(self.worst_relative_error, 4)
        return out


# --- the model -------------------------------------------------------------------------------------------


def prefill_tflop(model: ModelCost, computed: int, context: int) -> float:
    """TFLOPs of computing ``computed`` tokens after ``context`` cached ones.

    Weights: 2 x params a token. Attention: each computed token's scores and values against what precedes
    it, priced through the KV width (GQA's query heads are a per-family multiple the fit absorbs).
    """
    kv_width = model.kv_bytes_per_token / 4 / model.layers  # kv_heads x head_dim (bf16 K and V)
    attention = 4.0 * model.layers * kv_width * computed * (context + computed / 2)
    return (2.0 * model.params * computed + attention) / 1e12


def case_of(computed: int, local_hit: int, external: int) -> Case:
    """The case a request's split shows: where most of its prompt came from. (A GPU hit of a block-aligned prompt
    takes its last block from the CPU tier, as vLLM 0.26 did in issue 26: 3,184 tokens hit, 16 loaded.)"""
    if external > max(local_hit, computed):
        return "cpu_restore"
    return "gpu_hit" if local_hit > computed else "cold"


def _features(model: ModelCost, mode: EngineMode, computed: int, cached: int, external: int) -> list[float]:
    graphed = mode == "cudagraph" and computed <= GRAPH_MAX_TOKENS
    return [
        1.0,
        0.0 if graphed else float(model.layers),
        prefill_tflop(model, computed, cached),
        cached * model.kv_bytes_per_token / 1e9,
        1.0 if external > cached - external else 0.0,  # a restore, not a hit's last block
    ]


def _nnls(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Least squares with every coefficient >= 0: drop the most negative column until none is left.

    A handful of columns, so the simple active-set loop is exact enough and obviously correct.
    """
    active = list(range(a.shape[1]))
    x = np.zeros(a.shape[1])
    while active:
        sol, *_ = np.linalg.lstsq(a[:, active], b, rcond=None)
        if (sol >= 0).all():
            x[:] = 0
            x[active] = sol
            return x
        active.pop(int(np.argmin(sol)))
    return x


def _medians(samples: Iterable[Sample]) -> list[Sample]:
    """One sample per (case, prompt length): the median TTFT, so one slow request does not steer the fit."""
    groups: dict[tuple[str, int, bool], list[Sample]] = {}
    for s in samples:
        groups.setdefault((s.case, s.prompt_tokens, s.held_out), []).append(s)
    out = []
    for group in groups.values():
        ordered = sorted(group, key=lambda s: s.ttft_ms)
        out.append(ordered[(len(ordered) - 1) // 2])
    return sorted(out, key=lambda s: (s.held_out, s.prompt_tokens, CASES.index(s.case)))


def fit(points: Sequence[tuple[ModelCost, EngineMode, Sample]]) -> Fit:
    """The coefficients that reproduce ``points`` best, in relative terms (held-out samples excluded)."""
    used = [(m, mode, s) for m, mode, s in points if not s.held_out]
    if len(used) < MIN_POINTS:
        raise ProfileError(
            f"too few medians to fit ({len(used)}, one a case and length): {MIN_POINTS} at least; measure more lengths"
        )
    a = np.array([_features(m, mode, s.computed, s.local_hit + s.external, s.external) for m, mode, s in used])
    y = np.array([s.ttft_ms - s.restore_copy_ms for _, _, s in used])
    w = 1.0 / np.array([s.ttft_ms for _, _, s in used])
    coefficients = _nnls(a * w[:, None], y * w)
    predicted = a @ coefficients + np.array([s.restore_copy_ms for _, _, s in used])
    errors = np.abs(predicted - np.array([s.ttft_ms for _, _, s in used])) / np.array([s.ttft_ms for _, _, s in used])
    return Fit(tuple(float(c) for c in coefficients), len(used), float(errors.max()))


def predict_ms(
    fitted: Fit, model: ModelCost, mode: EngineMode, computed: int, cached: int, external: int, restore_copy_ms: float
) -> float:
    """The model's TTFT of one request, in milliseconds."""
    x = _features(model, mode, computed, cached, external)
    return float(sum(c * v for c, v in zip(fitted.coefficients, x, strict=True))) + restore_copy_ms


def split(prompt_tokens: int, block_tokens: int = VLLM_BLOCK_TOKENS) -> tuple[int, int]:
    """(computed, cached) of a prompt whose prefix is cached: whole blocks, and never the last token
    (vLLM computes at least one token to sample from)."""
    cached = (prompt_tokens - 1) // block_tokens * block_tokens
    return prompt_tokens - cached, cached


# --- the profile -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class EngineProfile:
    """One GPU class's engine measurements (one engine, one version), per mode: the runs and their fits."""

    gpu_class: str
    engine: str
    engine_version: str
    runs: tuple[Run, ...]
    notes: tuple[str, ...] = ()
    fits: dict[tuple[EngineMode, str], Fit] = field(default_factory=dict, compare=False)
    """(mode, model name or ``""`` for the class) -> fit, worked out from ``runs``."""

    def __post_init__(self) -> None:
        if not self.fits:
            object.__setattr__(self, "fits", _fit_all(self.runs))

    @property
    def name(self) -> str:
        return f"{self.gpu_class} {self.engine} {self.engine_version}"

    def modes(self) -> tuple[EngineMode, ...]:
        return tuple(m for m in ENGINE_MODES if (m, "") in self.fits)

    def fit_for(self, mode: EngineMode, model: str) -> tuple[Fit, bool]:
        """The fit that prices ``model`` in ``mode``, and whether it is the model's own (else the class's)."""
        own = self.fits.get((mode, model))
        if own is not None:
            return own, True
        found = self.fits.get((mode, ""))
        if found is None:
            measured = ", ".join(self.modes()) or "none"
            raise ProfileError(f"the {self.name} profile has no {mode} measurements (it has: {measured})")
        return found, False

    def with_run(self, run: Run) -> EngineProfile:
        """This profile with ``run`` added (replacing an earlier run of the same model and mode)."""
        kept = tuple(r for r in self.runs if (r.model.name, r.mode) != (run.model.name, run.mode))
        return replace(self, runs=(*kept, run), fits={})

    def to_json(self) -> dict[str, Any]:
        fits: dict[str, dict[str, Any]] = {}
        for (mode, model), f in sorted(self.fits.items()):
            fits.setdefault(mode, {})[model or "class"] = f.to_json()
        return {
            "schemaVersion": SCHEMA_VERSION,
            "kind": "engine",
            "gpuClass": self.gpu_class,
            "engine": self.engine,
            "engineVersion": self.engine_version,
            "graphMaxTokens": GRAPH_MAX_TOKENS,
            "fits": fits,
            "notes": list(self.notes),
            "runs": [r.to_json() for r in self.runs],
        }

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=1) + "\n"


def _fit_all(runs: Sequence[Run]) -> dict[tuple[EngineMode, str], Fit]:
    fits: dict[tuple[EngineMode, str], Fit] = {}
    for mode in ENGINE_MODES:
        in_mode = [r for r in runs if r.mode == mode]
        pooled: list[tuple[ModelCost, EngineMode, Sample]] = []
        for run in in_mode:
            points = [(run.model, mode, s) for s in _medians(run.samples) if not s.held_out]
            pooled += points
            if len(points) >= MIN_POINTS:  # else the run prices through the class fit (or only checks it)
                fits[(mode, run.model.name)] = fit(points)
        if len(pooled) >= MIN_POINTS:
            fits[(mode, "")] = fit(pooled)
    return fits


def engine_profile_from_json(data: Any, origin: str = "engine profile") -> EngineProfile:
    """An ``EngineProfile`` from its JSON (the fits are worked out again from the runs, never trusted)."""
    try:
        if data.get("schemaVersion") != SCHEMA_VERSION or data.get("kind") != "engine":
            raise ProfileError(f"{origin}: not an engine profile of schema version {SCHEMA_VERSION}")
        return EngineProfile(
            gpu_class=str(data["gpuClass"]),
            engine=str(data["engine"]),
            engine_version=str(data["engineVersion"]),
            runs=tuple(Run.from_json(r) for r in data["runs"]),
            notes=tuple(str(n) for n in data.get("notes", ())),
        )
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        if isinstance(exc, ProfileError):
            raise
        raise ProfileError(f"{origin}: {type(exc).__name__}: {exc}") from None


def load_engine_profile(path: Path) -> EngineProfile:
    try:
        return engine_profile_from_json(json.loads(path.read_text()), str(path))
    except (OSError, json.JSONDecodeError) as exc:
        raise ProfileError(f"{path}: {exc}") from None


_SHIPPED: Final = "profiles/engine"


@lru_cache(maxsize=16)
def shipped_engine_profile(gpu_class: str, engine: str = "vllm") -> EngineProfile:
    """The shipped engine profile of a GPU class (``profiles/engine/CLASS.ENGINE.json``)."""
    name = f"{gpu_class}.{engine}.json"
    node = resources.files("kvoffload.economics").joinpath(f"{_SHIPPED}/{name}")
    if not node.is_file():
        folder = resources.files("kvoffload.economics").joinpath(_SHIPPED)
        have = sorted(p.name for p in folder.iterdir() if p.name.endswith(".json")) if folder.is_dir() else []
        raise ProfileError(f"no engine profile for {gpu_class!r} ({engine}); shipped: {', '.join(have) or 'none'}")
    return engine_profile_from_json(json.loads(node.read_text()), f"{_SHIPPED}/{name}")


# --- the forecast ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Forecast:
    """TTFT of one prompt recomputed, found on the GPU, and restored from the CPU tier."""

    prompt_tokens: int
    gpu_class: str
    engine_mode: EngineMode
    cold_ms: float
    gpu_hit_ms: float
    cpu_restore_ms: float
    source: str
    basis: str
    """``measured`` (the model's own fit) or ``parameter count`` (the class fit across measured models)."""

    @property
    def saving_ms(self) -> float:
        """What restoring saves against recomputing: positive when the tier pays."""
        return self.cold_ms - self.cpu_restore_ms

    def to_json(self) -> dict[str, Any]:
        return {
            "promptTokens": self.prompt_tokens,
            "gpuClass": self.gpu_class,
            "engineMode": self.engine_mode,
            "ttftMs": {
                "cold": round(self.cold_ms, 2),
                "gpuHit": round(self.gpu_hit_ms, 2),
                "cpuRestore": round(self.cpu_restore_ms, 2),
            },
            "savingMs": round(self.saving_ms, 2),
            "source": self.source,
            "basis": self.basis,
        }


def forecast(
    profile: EngineProfile,
    model: ModelCost,
    prompt_tokens: int,
    mode: EngineMode,
    restore_copy_ms: Callable[[int], float],
) -> Forecast:
    """The engine's TTFT of a ``prompt_tokens`` prompt of ``model``: cold, GPU hit, CPU restore.

    ``restore_copy_ms(tokens)`` prices issue 25's copy of that many tokens' KV from pinned memory.
    """
    if prompt_tokens < 1:
        raise ValueError("prompt_tokens must be >= 1")
    fitted, own = profile.fit_for(mode, model.name)
    computed, cached = split(prompt_tokens)
    copy = restore_copy_ms(cached)
    return Forecast(
        prompt_tokens=prompt_tokens,
        gpu_class=profile.gpu_class,
        engine_mode=mode,
        cold_ms=predict_ms(fitted, model, mode, prompt_tokens, 0, 0, 0.0),
        gpu_hit_ms=predict_ms(fitted, model, mode, computed, cached, 0, 0.0),
        cpu_restore_ms=predict_ms(fitted, model, mode, computed, cached, cached, copy),
        source=f"engine profile {profile.name}"
        + (f", {model.name} measured" if own else f", {model.name} priced from its parameter count"),
        basis="measured" if own else "parameter count",
    )


def median_ms(samples: Iterable[Sample], case: Case, prompt_tokens: int) -> float | None:
    """The median TTFT of one case and length among ``samples`` (None when none was measured)."""
    xs = [s.ttft_ms for s in samples if s.case == case and s.prompt_tokens == prompt_tokens]
    return statistics.median(xs) if xs else None


def relative_error(predicted: float, measured: float) -> float:
    return abs(predicted - measured) / measured if measured > 0 else math.inf


def model_cost(name: str) -> ModelCost:
    """``ModelCost`` of a catalog model (one GPU, bf16 KV); ProfileError when the catalog has none."""
    # Imported here: the calibration Job's image imports this package without pydantic.
    from kvoffload.policy.catalog import find_model
    from kvoffload.policy.kvshape import bytes_per_token

    entry = find_model(name)
    if entry is None:
        raise ProfileError(f"{name!r} is not in the model catalog: its parameter count is unknown")
    arch = entry.architecture
    return ModelCost(entry.name, entry.params, arch.num_layers, bytes_per_token(arch, 2))


def copy_pricer(gpu_class: str, model: ModelCost) -> Callable[[int], float]:
    """Issue 25's restore copy of ``tokens`` tokens' KV on the class's PyTorch profile, in ms (0 without one:
    the fitted per-restore overhead then carries the whole restore)."""
    from kvoffload.economics.breakeven import vllm_page_bytes
    from kvoffload.economics.profileload import shipped_profile

    try:
        profile = shipped_profile(gpu_class)
    except ProfileError:
        return lambda _tokens: 0.0
    page = vllm_page_bytes(model.kv_bytes_per_token, model.layers)

    def price(tokens: int) -> float:
        return profile.restore_seconds(tokens * model.kv_bytes_per_token, page, model.layers) * 1e3

    return price


def plan_forecast(gpu_class: str, spec: KVOffloadPolicySpec, prompt_tokens: int) -> dict[str, Any]:
    """``kvoffload plan``'s ``forecast`` for a policy's model and engine mode on a GPU class's shipped engine
    profile, or ``{"error": why}``."""
    from kvoffload.engines import engine_for

    engine = engine_for(spec)
    mode: EngineMode = "eager" if engine.eager(spec) else "cudagraph"
    try:
        profile = shipped_engine_profile(gpu_class, engine.name)
        cost = model_cost(spec.model.name)
        return forecast(profile, cost, prompt_tokens, mode, copy_pricer(gpu_class, cost)).to_json()
    except ProfileError as exc:
        return {"error": str(exc)}


def saving_us_per_token(gpu_class: str, spec: KVOffloadPolicySpec, prompt_tokens: int) -> float | None:
    """The forecast saving of a restored token (µs) for the live payoff's row; None where it cannot be priced."""
    found = plan_forecast(gpu_class, spec, prompt_tokens)
    cached = split(prompt_tokens)[1]
    if "error" in found or cached < 1:
        return None
    return float(found["savingMs"]) * 1e3 / cached
