"""The /metrics registry the engine fills, whichever engine it speaks as (``--speak``).

``server`` reports each event of a request to it, the same for every personality: the admission (where
the prompt's tokens came from, what was restored and stored), the finish or failure, the load of every
engine step, and each HTTP request. ``metrics.EngineMetrics`` turns them into vLLM's families,
``sglangmetrics.SGLangMetrics`` into SGLang 0.5.23's and ``trtllmmetrics.TRTLLMMetrics`` into TensorRT-LLM's; the
caches and prices behind them are the same. :data:`REGISTRIES` holds one per ``--speak`` name (the engines' names in
``kvoffload.engines.ENGINES``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any, Final, Protocol

from kvoffload_lab.engine.config import SPEAK_SGLANG, SPEAK_TRTLLM, SPEAK_VLLM, EngineConfig, ItlClock
from kvoffload_lab.engine.kvengine import Admission, KVEngine
from kvoffload_lab.engine.metrics import EngineMetrics
from kvoffload_lab.engine.sglangmetrics import SGLangMetrics
from kvoffload_lab.engine.trtllmmetrics import TRTLLMMetrics


class Registry(Protocol):
    """What the server reports to the /metrics registry, and what it asks of it."""

    @property
    def itl_clock(self) -> ItlClock:
        """Whose clock times the ``itls`` handed to :meth:`record_finish` (the TTFT is the frontend's for all)."""
        ...

    @property
    def serves_metrics(self) -> bool:
        """Whether the engine serves its Prometheus metrics at all (SGLang only with ``--enable-metrics``,
        TensorRT-LLM only with ``return_perf_metrics``)."""
        ...

    @property
    def metrics_path(self) -> str:
        """Where the Prometheus text is served (``/metrics``; TensorRT-LLM's ``/prometheus/metrics``)."""
        ...

    def iteration_stats(self) -> list[dict[str, Any]] | None:
        """What ``/metrics`` answers as JSON where the Prometheus text is elsewhere (TensorRT-LLM's iteration
        stats); None where ``/metrics`` is the Prometheus text."""
        ...

    def http_endpoint(self, route: str | None, path: str) -> str | None:
        """The endpoint label a request to ``path`` (matching ``route``, None if none) counts under; None when the
        engine does not count it."""
        ...

    def record_http_start(self, *, handler: str, method: str) -> None:
        """A counted request arrived (before its handler runs)."""
        ...

    def record_http(self, *, handler: str, method: str, status: int | None) -> None:
        """A counted request was answered with ``status`` (None: its handler raised, no answer)."""
        ...

    def record_admission(self, adm: Admission, max_tokens: int) -> None:
        """A request's prefill was scheduled: its cache hits, restores and stores."""
        ...

    def record_finish(
        self,
        *,
        ttft: float,
        itls: Sequence[float],
        e2e: float,
        generated: int,
        finished_reason: str,
        queued: float = 0.0,
        admission: Admission | None = None,
        stream: bool = False,
    ) -> None:
        """A request finished with all its tokens."""
        ...

    def record_failure(
        self,
        *,
        e2e: float,
        queued: float,
        finished_reason: str,
        admission: Admission | None = None,
        stream: bool = False,
    ) -> None:
        """A request the engine failed before its first token (``--error-share``: an HTTP 500)."""
        ...

    def set_load(self, running: int, used_blocks: int, waiting: int = 0) -> None:
        """The scheduler's state after a step: running and waiting requests, GPU blocks in use."""
        ...

    def exposition(self) -> bytes:
        """The /metrics body, in Prometheus' classic text format."""
        ...


REGISTRIES: Final[Mapping[str, Callable[[EngineConfig, KVEngine], Registry]]] = MappingProxyType(
    {
        SPEAK_VLLM: lambda config, engine: EngineMetrics(config),
        SPEAK_SGLANG: SGLangMetrics,
        SPEAK_TRTLLM: TRTLLMMetrics,
    }
)
"""The registry of each ``--speak`` name, over an engine's caches."""


def registry_for(config: EngineConfig, engine: KVEngine) -> Registry:
    """The registry ``config.speak`` names, over ``engine``'s caches."""
    return REGISTRIES[config.speak](config, engine)
