"""The /metrics registry the engine fills, whichever engine it speaks as (``--speak``).

``server`` reports each event of a request to it, the same for every personality: the admission (where
the prompt's tokens came from, what was restored and stored), the finish or failure, the load of every
engine step, and each HTTP request. ``metrics.EngineMetrics`` turns them into vLLM's families and
``sglangmetrics.SGLangMetrics`` into SGLang 0.5.23's; the caches and prices behind them are the same.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from kvoffload.lab.engine.config import SPEAK_SGLANG, EngineConfig
from kvoffload.lab.engine.kvengine import Admission, KVEngine
from kvoffload.lab.engine.metrics import EngineMetrics
from kvoffload.lab.engine.sglangmetrics import SGLangMetrics


class Registry(Protocol):
    """What the server reports to the /metrics registry, and what it asks of it."""

    @property
    def serves_metrics(self) -> bool:
        """Whether the engine serves /metrics at all (SGLang only with ``--enable-metrics``)."""
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


def registry_for(config: EngineConfig, engine: KVEngine) -> Registry:
    """The registry ``config.speak`` names: vLLM's (the default) or SGLang's, over ``engine``'s caches."""
    if config.speak == SPEAK_SGLANG:
        return SGLangMetrics(config, engine)
    return EngineMetrics(config)
