"""The engine over HTTP: vLLM's ``/v1/completions``, ``/v1/models``, ``/health``, ``/metrics``, and ``/emulator/*``."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import time
import uuid
from collections.abc import Mapping
from dataclasses import asdict
from typing import Any, Final

from aiohttp import web

from kvoffload.lab.engine.config import EngineConfig
from kvoffload.lab.engine.faults import Faults, apply_faults
from kvoffload.lab.engine.kvengine import KVEngine, tokenize
from kvoffload.lab.engine.metrics import EngineMetrics

log = logging.getLogger("kvoffload.emulate")

CONTENT_TYPE_CLASSIC: Final = "text/plain; version=0.0.4; charset=utf-8"


def _error(status: int, message: str, kind: str = "BadRequestError") -> web.Response:
    return web.json_response({"error": {"message": message, "type": kind, "code": status}}, status=status)


class Emulator:
    """One engine: its caches, its metrics, its faults and its aiohttp application."""

    def __init__(self, config: EngineConfig, faults: Faults | None = None) -> None:
        self.config = config
        self.engine = KVEngine(config)
        self.metrics = EngineMetrics(config)
        self.faults = faults or Faults()
        self.started = time.monotonic()
        self.running = 0
        self.used_blocks = 0

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._outage])
        app.router.add_get("/health", self.health)
        app.router.add_get("/metrics", self.metrics_handler)
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_get("/emulator/faults", self.get_faults)
        app.router.add_post("/emulator/faults", self.set_faults)
        app.router.add_get("/emulator/state", self.state)
        return app

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

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "object": "list",
                "data": [
                    {
                        "id": self.config.name,
                        "object": "model",
                        "created": int(time.time()),
                        "owned_by": "vllm",
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
        return web.json_response({**self.engine.state(), "running": self.running})

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

        adm = self.engine.admit(tokens)
        self.metrics.record_admission(adm, max_tokens)
        faults = self.faults
        ttft_target = adm.price.ttft_s * faults.ttft_factor(arrived) + faults.added_latency_s
        itl_target = self.config.cost.itl_seconds(self.running + 1) * faults.itl_factor(arrived)
        blocks = math.ceil((len(tokens) + max_tokens) / self.config.block_size)
        self.running += 1
        self.used_blocks += blocks
        self.metrics.set_load(self.running, self.used_blocks)
        rid = f"cmpl-{uuid.uuid4().hex}"
        response: web.StreamResponse | None = None
        try:
            await _sleep_until(arrived + ttft_target)
            first = time.monotonic()
            if stream:
                response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
                await response.prepare(request)
                await _send_chunk(response, rid, self.config.name, _word(0), None)
            itls: list[float] = []
            last = first
            for i in range(1, max_tokens):
                await _sleep_until(last + itl_target)
                now = time.monotonic()
                itls.append(now - last)
                last = now
                if response is not None:
                    await _send_chunk(response, rid, self.config.name, _word(i), None)
        finally:
            self.running -= 1
            self.used_blocks -= blocks
            self.metrics.set_load(self.running, self.used_blocks)
        done = time.monotonic()
        ttft = first - arrived
        self.metrics.record_finish(
            ttft=ttft, itls=itls, e2e=done - arrived, generated=max_tokens, finished_reason="length"
        )
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
    """Run the engine until cancelled. The port opens after the startup delay, as pinning delays vLLM's."""
    if emulator.config.startup_delay_s > 0:
        await asyncio.sleep(emulator.config.startup_delay_s)
    runner = web.AppRunner(emulator.app(), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    log.info(
        "emulated vLLM %s serving %s on http://%s:%d", emulator.config.vllm_version, emulator.config.name, host, port
    )
    if ready is not None:
        ready.set()
    try:
        await asyncio.Event().wait()
    finally:
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
