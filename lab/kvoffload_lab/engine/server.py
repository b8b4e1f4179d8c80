"""The engine over HTTP: ``/v1/completions``, ``/v1/models``, ``/health``, the Prometheus metrics (vLLM's or SGLang's
at ``/metrics``, TensorRT-LLM's at ``/prometheus/metrics`` with its iteration stats as JSON at ``/metrics``, as
``--speak`` says), and ``/emulator/*``."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import time
import uuid
from collections.abc import Mapping
from dataclasses import asdict
from typing import Any, Final

from aiohttp import web

from kvoffload_lab.engine.config import SGLANG_VERSION, SPEAK_SGLANG, SPEAK_TRTLLM, EngineConfig
from kvoffload_lab.engine.faults import Faults, apply_faults
from kvoffload_lab.engine.kvengine import KVEngine, tokenize
from kvoffload_lab.engine.registry import registry_for
from kvoffload_lab.engine.scheduler import Request, Scheduler
from kvoffload_lab.engine.trtllmmetrics import COLLECTOR_COMMIT as TRTLLM_COMMIT

log = logging.getLogger("kvoffload.emulate")

CONTENT_TYPE_CLASSIC: Final = "text/plain; version=0.0.4; charset=utf-8"


def _error(status: int, message: str, kind: str = "BadRequestError") -> web.Response:
    return web.json_response({"error": {"message": message, "type": kind, "code": status}}, status=status)


class Emulator:
    """One engine: its caches, its metrics, its faults and its aiohttp application."""

    def __init__(self, config: EngineConfig, faults: Faults | None = None) -> None:
        self.config = config
        self.engine = KVEngine(config)
        self.metrics = registry_for(config, self.engine)
        self.faults = faults or Faults()
        self.started = time.monotonic()
        self.scheduler = Scheduler(
            self.engine, max_num_batched_tokens=config.max_num_batched_tokens, max_num_seqs=config.max_num_seqs
        )
        self._progress: dict[Request, asyncio.Event] = {}
        self._wake = asyncio.Event()
        self._loop: asyncio.Task[None] | None = None

    def _ensure_loop(self) -> None:
        if self._loop is None or self._loop.done():
            self._loop = asyncio.create_task(self._run(), name="engine steps")

    async def _run(self) -> None:
        """The engine's step loop: plan a step, let it run for its modelled time, hand out its tokens."""
        sched = self.scheduler
        last_end: float | None = None
        while True:
            wall = time.monotonic()
            # The engine's time runs on the modelled steps, back to back while there is work, so a host
            # busy elsewhere delays what the clients see but does not slow the engine down step after step.
            if sched.running:
                at = wall if last_end is None else last_end
            elif sched.waiting:
                at = max(sched.waiting[0].submitted, last_end or 0.0)  # an idle engine starts when the request came
            else:
                at = wall
            at = min(max(at, sched.link.clock), wall)
            step = sched.plan(at)
            if step is None and at < wall:
                step = sched.plan(wall)
            self._set_load()
            if step is None:
                last_end = None
                wake = sched.next_event(wall)
                self._wake.clear()
                if wake is None and sched.idle:
                    await self._wake.wait()  # deadline: none; an idle engine waits for work, until cancelled
                else:
                    timeout = 0.05 if wake is None else max(0.0, wake - wall)
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(timeout):
                            await self._wake.wait()
                continue
            await _sleep_until(step.end)
            sched.finish()
            last_end = step.end
            for req, _ in step.chunks:
                self._notify(req)
            for req in step.decodes:
                self._notify(req)

    def _notify(self, req: Request) -> None:
        event = self._progress.get(req)
        if event is not None:
            event.set()

    def _set_load(self) -> None:
        sched = self.scheduler
        self.metrics.set_load(len(sched.running), sched.blocks_used, waiting=len(sched.waiting))

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._count_http, self._outage])
        app.router.add_get("/health", self.health)
        if self.metrics.serves_metrics:
            app.router.add_get(self.metrics.metrics_path, self.metrics_handler)
        if self.metrics.iteration_stats() is not None:
            app.router.add_get("/metrics", self.stats_handler)
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_get("/emulator/faults", self.get_faults)
        app.router.add_post("/emulator/faults", self.set_faults)
        app.router.add_get("/emulator/state", self.state)
        return app

    @web.middleware
    async def _count_http(self, request: web.Request, handler: Any) -> web.StreamResponse:
        """The API server's request counts, as the engine spoken counts them (``Registry.http_endpoint`` says
        which requests and under what name); the emulator's own control API is never counted."""
        route = request.match_info.route.resource
        endpoint = self.metrics.http_endpoint(route.canonical if route is not None else None, request.path)
        if endpoint is None:
            response: web.StreamResponse = await handler(request)
            return response
        self.metrics.record_http_start(handler=endpoint, method=request.method)
        status: int | None = None
        try:
            response = await handler(request)
            status = response.status
        except web.HTTPException as exc:
            status = exc.status
            raise
        finally:
            self.metrics.record_http(handler=endpoint, method=request.method, status=status)
        return response

    @web.middleware
    async def _outage(self, request: web.Request, handler: Any) -> web.StreamResponse:
        if not request.path.startswith("/emulator/") and self.faults.in_outage(time.monotonic()):
            return _error(503, "engine unavailable (emulated outage)", "ServiceUnavailableError")
        response: web.StreamResponse = await handler(request)
        return response

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def metrics_handler(self, request: web.Request) -> web.Response:
        # Always the classic format, whatever Accept says: OpenMetrics would turn ':' into '_'.
        return web.Response(body=self.metrics.exposition(), headers={"Content-Type": CONTENT_TYPE_CLASSIC})

    async def stats_handler(self, request: web.Request) -> web.Response:
        return web.json_response(self.metrics.iteration_stats())

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "object": "list",
                "data": [
                    {
                        "id": self.config.name,
                        "object": "model",
                        "created": int(time.time()),
                        "owned_by": self.config.speak,
                        "root": self.config.model,
                        "max_model_len": self.config.max_model_len,
                    }
                ],
            }
        )

    async def get_faults(self, request: web.Request) -> web.Response:
        return web.json_response(self.faults.describe(time.monotonic()))

    async def set_faults(self, request: web.Request) -> web.Response:
        """Set faults now. Times are seconds from now; ``{"clear": true}`` removes them all."""
        try:
            body = await request.json()
        except json.JSONDecodeError:
            return _error(400, "body: not JSON")
        if not isinstance(body, dict):
            return _error(400, "body: must be a JSON object")
        try:
            apply_faults(self.faults, body, time.monotonic())
        except (TypeError, ValueError) as exc:
            return _error(400, str(exc))
        return web.json_response(self.faults.describe(time.monotonic()))

    async def state(self, request: web.Request) -> web.Response:
        sched = self.scheduler
        return web.json_response(
            {
                **self.engine.state(),
                "running": len(sched.running),
                "waiting": len(sched.waiting),
                "held_for_stores": len(sched.held),
                "gpu_blocks_in_use": sched.blocks_used,
                "max_num_batched_tokens": sched.budget,
                "max_num_seqs": sched.max_seqs,
                "pinning_s": self.config.pinning_s,
                "totals": asdict(sched.totals),
                "link_busy_s": dict(sched.link.busy_s),
            }
        )

    async def completions(self, request: web.Request) -> web.StreamResponse:
        arrived = time.monotonic()
        try:
            body = await request.json()
        except json.JSONDecodeError:
            return _error(400, "body: not JSON")
        if not isinstance(body, dict):
            return _error(400, "body: must be a JSON object")
        model = body.get("model")
        if model is not None and model not in (self.config.name, self.config.model):
            return _error(404, f"The model `{model}` does not exist.", "NotFoundError")
        tokens = _prompt_tokens(body.get("prompt"))
        if tokens is None:
            return _error(400, "prompt: a string, a list of token ids, or a one-element list of either")
        max_tokens = body.get("max_tokens", 16)
        if not isinstance(max_tokens, int) or max_tokens < 1:
            return _error(400, "max_tokens: must be a positive integer")
        if len(tokens) + max_tokens > self.config.max_model_len:
            return _error(
                400,
                f"This model's maximum context length is {self.config.max_model_len} tokens. However, you "
                f"requested {len(tokens) + max_tokens} tokens ({len(tokens)} in the messages, "
                f"{max_tokens} in the completion).",
            )
        stream = bool(body.get("stream", False))

        # The API server's fixed cost (the laptop's fitted base_s) and vLLM's block hashing, then the shared scheduler.
        admission = self.config.cost.admission_seconds(len(tokens))
        if admission > 0:
            await asyncio.sleep(admission)
        req = self.scheduler.submit(tokens, max_tokens, time.monotonic())
        req.arrived = arrived
        progress = asyncio.Event()
        self._progress[req] = progress
        self._wake.set()
        self._ensure_loop()
        faults = self.faults
        ttft_factor, added, itl_factor = faults.ttft_factor(arrived), faults.added_latency_s, faults.itl_factor(arrived)
        fails = faults.fails(arrived)
        rid = f"cmpl-{uuid.uuid4().hex}"
        response: web.StreamResponse | None = None
        sent_times: list[float] = []
        recorded = False
        try:
            while len(sent_times) < max_tokens:
                if len(req.token_times) <= len(sent_times):
                    progress.clear()
                    await progress.wait()  # deadline: the step loop's next step for it; the engine's end cancels
                    continue
                if not recorded and req.admission is not None:
                    self.metrics.record_admission(req.admission, max_tokens)
                    recorded = True
                    added = faults.added_for(req.admission.local_hit_tokens, req.admission.external_tokens)
                if fails:
                    # Its prefill ran (where a KV load fails); the modelled engine still decodes its few tokens.
                    break
                i = len(sent_times)
                # Faults act on what the client sees: the first token's delay and the gaps after it, scaled.
                first = arrived + (req.token_times[0] - arrived) * ttft_factor + added
                await _sleep_until(first + (req.token_times[i] - req.token_times[0]) * itl_factor)
                sent_times.append(time.monotonic())
                if response is None and stream:
                    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
                    await response.prepare(request)
                if response is not None:
                    await _send_chunk(response, rid, self.config.name, _word(i), None)
        finally:
            self._progress.pop(req, None)
        if fails:
            # As vLLM answers a request that finished with reason error (GenerationError, a 500; streamed or not,
            # since nothing was sent yet here).
            self.metrics.record_failure(
                e2e=time.monotonic() - arrived,
                queued=(req.scheduled_at or arrived) - arrived,
                finished_reason="error",
                admission=req.admission,
                stream=stream,
            )
            return _error(500, "Internal server error", "InternalServerError")
        adm = req.admission
        assert adm is not None
        done = time.monotonic()
        ttft = sent_times[0] - arrived
        if self.metrics.itl_clock == "engine":
            # The engine's stamps are its modelled step ends, scaled as the faults scale the sends: a host busy
            # elsewhere delays the sends, not the steps.
            itls = [(b - a) * itl_factor for a, b in itertools.pairwise(req.token_times[:max_tokens])]
        else:
            itls = [b - a for a, b in itertools.pairwise(sent_times)]
        self.metrics.record_finish(
            ttft=ttft,
            itls=itls,
            e2e=done - arrived,
            generated=max_tokens,
            finished_reason="length",
            queued=(req.scheduled_at or arrived) - arrived,
            admission=adm,
            stream=stream,
        )
        admission = self.config.cost.admission_seconds(len(tokens))
        ttft_target = (admission + req.token_times[0] - req.submitted) * ttft_factor + added
        itl_target = (sum(req.itls) / len(req.itls) if req.itls else 0.0) * itl_factor
        extension = {
            "modelled_ttft_s": ttft_target,
            "measured_ttft_s": ttft,
            "modelled_itl_s": itl_target,
            "prompt_tokens": adm.prompt_tokens,
            "local_cache_hit_tokens": adm.local_hit_tokens,
            "cpu_hit_tokens": adm.cpu_hit_tokens,
            "disk_hit_tokens": adm.disk_hit_tokens,
            "computed_tokens": adm.computed_tokens,
            "stored_blocks": adm.stored_blocks,
            "price": asdict(adm.price),
        }
        usage = {
            "prompt_tokens": len(tokens),
            "completion_tokens": max_tokens,
            "total_tokens": len(tokens) + max_tokens,
            "prompt_tokens_details": {"cached_tokens": adm.cached_tokens},
        }
        if response is not None:
            await _send_chunk(response, rid, self.config.name, "", "length", usage=usage, extension=extension)
            await response.write(b"data: [DONE]\n\n")
            await response.write_eof()
            return response
        return web.json_response(
            {
                "id": rid,
                "object": "text_completion",
                "created": int(time.time()),
                "model": self.config.name,
                "choices": [
                    {
                        "index": 0,
                        "text": " ".join(_word(i) for i in range(max_tokens)),
                        "logprobs": None,
                        "finish_reason": "length",
                        "stop_reason": None,
                    }
                ],
                "usage": usage,
                "kvoffload": extension,
            }
        )


def _word(i: int) -> str:
    return f"tok{i}"


async def _sleep_until(deadline: float) -> None:
    delay = deadline - time.monotonic()
    if delay > 0:
        await asyncio.sleep(delay)


async def _send_chunk(
    response: web.StreamResponse,
    rid: str,
    model: str,
    text: str,
    finish_reason: str | None,
    *,
    usage: Mapping[str, Any] | None = None,
    extension: Mapping[str, Any] | None = None,
) -> None:
    chunk: dict[str, Any] = {
        "id": rid,
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}],
    }
    if usage is not None:
        chunk["usage"] = usage
    if extension is not None:
        chunk["kvoffload"] = extension
    await response.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")


def _prompt_tokens(prompt: Any) -> list[int] | None:
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return tokenize(prompt)
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return list(prompt)
    return None


async def serve(emulator: Emulator, host: str, port: int, *, ready: asyncio.Event | None = None) -> None:
    """Run the engine until cancelled. The port (``/health`` with it) opens only once the CPU tier is pinned."""
    delay = emulator.config.ready_delay_s
    if delay > 0:
        log.info("pinning the CPU tier: %.2f s before serving", delay)
        await asyncio.sleep(delay)
    runner = web.AppRunner(emulator.app(), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    config = emulator.config
    speaks = {
        SPEAK_SGLANG: f"SGLang {SGLANG_VERSION}",
        SPEAK_TRTLLM: f"TensorRT-LLM's metrics at {TRTLLM_COMMIT[:8]}",
    }.get(config.speak, f"vLLM {config.vllm_version}")
    log.info("emulated %s serving %s on http://%s:%d", speaks, config.name, host, port)
    if ready is not None:
        ready.set()
    try:
        await asyncio.Event().wait()  # deadline: none; it serves until cancelled (SIGINT, SIGTERM)
    finally:
        if emulator._loop is not None:
            emulator._loop.cancel()
        await runner.cleanup()


def run(emulator: Emulator, host: str, port: int) -> None:
    """Serve until SIGINT/SIGTERM."""
    import signal

    async def main() -> None:
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, task.cancel)
        with contextlib.suppress(asyncio.CancelledError):
            await serve(emulator, host, port)

    asyncio.run(main())
