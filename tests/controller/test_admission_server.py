"""The webhook's server answers every review it can read with a review, never a 500 (issue 33): a handler that
raises (RecursionError included) or overruns the deadline gets a refusal naming why, carrying the review's uid;
a request that is no readable review (too large, not JSON, nested past the parser) gets a 4xx.

Served for real by :class:`AdmissionServer` (kopf's server, its ``_serve`` replaced) over HTTP on 127.0.0.1;
the real kopf handling behind it runs in tests/controller/test_admission_webhook.py."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest

from kvoffload.controller import admission
from kvoffload.controller.admission import AdmissionServer

Fn = Callable[..., Awaitable[Any]]


def review(uid: str = "u-1", **request: Any) -> dict[str, Any]:
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {"uid": uid, **request}}


class Served:
    """An AdmissionServer on a free port with ``fn`` as kopf's handling."""

    def __init__(self) -> None:
        self.fn: Fn = self.allow

    @staticmethod
    async def allow(data: dict[str, Any], **_: Any) -> dict[str, Any]:
        return {**data, "response": {"uid": data["request"]["uid"], "allowed": True}}

    async def call(self, data: dict[str, Any], **_: Any) -> Any:
        return await self.fn(data)


@pytest.fixture
async def served() -> AsyncIterator[tuple[Served, str]]:
    state = Served()
    server = AdmissionServer(addr="127.0.0.1", host="127.0.0.1", insecure=True)
    serving = server(state.call)
    config = await anext(serving)
    try:
        yield state, config["url"]
    finally:
        await serving.aclose()


async def post(url: str, body: bytes, **headers: str) -> tuple[int, Any]:
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session,
        session.post(f"{url}/validate", data=body, headers=headers) as answer,
    ):
        text = await answer.text()
        return answer.status, (json.loads(text) if answer.content_type == "application/json" else text)


async def test_a_review_the_handler_answers_is_passed_through(served: tuple[Served, str]) -> None:
    _, url = served
    status, answer = await post(url, json.dumps(review()).encode())
    assert (status, answer["response"]) == (200, {"uid": "u-1", "allowed": True})


@pytest.mark.parametrize(
    ("failure", "why"),
    [
        (RecursionError("maximum recursion depth exceeded"), "the policy could not be judged: it is nested too deep"),
        (KeyError("object"), "the policy could not be judged: KeyError: 'object'"),
    ],
)
async def test_a_handler_that_raises_gets_a_refusal_with_the_uid_not_a_500(
    served: tuple[Served, str], failure: Exception, why: str
) -> None:
    state, url = served

    async def raises(_: dict[str, Any]) -> Any:
        raise failure

    state.fn = raises
    status, answer = await post(url, json.dumps(review("u-2")).encode())
    assert status == 200
    assert answer["response"] == {"uid": "u-2", "allowed": False, "status": {"code": 422, "message": why}}


async def test_a_judgement_past_the_deadline_is_refused_in_time(
    served: tuple[Served, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    state, url = served
    monkeypatch.setattr(admission, "JUDGE_SECONDS", 0.5)

    async def slow(_: dict[str, Any]) -> Any:
        await asyncio.sleep(30)

    state.fn = slow
    loop = asyncio.get_running_loop()
    started = loop.time()
    status, answer = await post(url, json.dumps(review("u-3")).encode())
    assert (status, answer["response"]["allowed"]) == (200, False)
    assert answer["response"]["status"]["message"] == "the policy was not judged within 0.5s"
    assert loop.time() - started < 10  # the 30 s handler was not waited for: the deadline, not a speed


async def test_the_webhooks_own_deadline_is_below_the_api_servers() -> None:
    assert admission.JUDGE_SECONDS < admission.TIMEOUT_SECONDS


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (b"{not json", 400),
        (b"[" * 100_000 + b"]" * 100_000, 400),  # past the JSON parser's depth: RecursionError at the decode
        (json.dumps({"request": {}}).encode(), 400),  # no uid to answer
        (b"x" * (admission.MAX_REVIEW_BYTES + 1), 413),
    ],
    ids=["not-json", "nested-past-the-parser", "no-uid", "too-large"],
)
async def test_what_is_no_readable_review_gets_a_4xx_not_a_500(
    served: tuple[Served, str], body: bytes, expected: int
) -> None:
    state, url = served
    called: list[Any] = []

    async def record(data: dict[str, Any]) -> Any:
        called.append(data)

    state.fn = record
    status, _ = await post(url, body)
    assert (status, called) == (expected, [])


async def test_a_chunked_body_is_cut_at_the_cap(served: tuple[Served, str]) -> None:
    _, url = served

    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(admission.MAX_REVIEW_BYTES // 65536 + 2):
            yield b" " * 65536

    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session,
        session.post(f"{url}/validate", data=chunks()) as answer,
    ):
        assert answer.status == 413
