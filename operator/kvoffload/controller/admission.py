"""The validating admission webhook: what the CRD's schema and CEL rules cannot judge, judged at apply time.

The CRD refuses what it can see in the object alone: types, ranges, patterns, and the
cross-field rules it has in CEL. It cannot see the catalogs or the sizing: an unknown GPU
class, a model outside the catalog with no shape, a tier larger than the GPU class's node,
a level that does not render. The operator judges those for status ``Invalid``; this webhook
runs the same judgement (:func:`problems`) when the policy is applied, so ``kubectl apply``
refuses it with the same message as the ``Invalid`` condition would carry.

The webhook is served by kopf (``@kopf.on.validate``, :func:`register`) on the operator's
``kopf.WebhookServer``, with a certificate the deployment provides (the Helm chart makes one;
``kvoffload cluster`` its own). kopf does not manage the registration: the chart renders the
ValidatingWebhookConfiguration, and :func:`validating_webhook_configuration` (``api/webhook.py``,
so that the lab's ``kvoffload cluster`` registers the same object) builds it for a URL and CA bundle.
``failurePolicy: Ignore``: when the operator (and so its
webhook) is down, apply still works, and status ``Invalid`` remains the backstop.

Only what can be judged without reading the cluster is judged here: a ``model.configMap`` is
not read, so what depends on the model's shape from it waits for the operator. An update
that leaves the spec as it was (kopf's finalizer, an annotation, a deletion) is always
allowed, so a policy that got in while the webhook was down can still be changed and deleted.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from typing import Any

import aiohttp.web
import kopf

from kvoffload.api.conventions import API_GROUP, API_VERSION, PLURAL
from kvoffload.api.errors import FieldError, PolicyError, printable, summary
from kvoffload.api.webhook import (
    ADMISSION_CODE,
    CONFIGURATION_NAME,
    TIMEOUT_SECONDS,
    WEBHOOK_ID,
    WEBHOOK_NAME,
    WEBHOOK_PATH,
    validating_webhook_configuration,
)
from kvoffload.controller.bodies import plain_body
from kvoffload.controller.judging import judge_resolved, judging
from kvoffload.policy.loading import parse_policy
from kvoffload.policy.tenancy import DEFAULT_TENANCY, Tenancy


def problems(obj: Mapping[str, Any], tenancy: Tenancy = DEFAULT_TENANCY) -> list[FieldError]:
    """Everything status ``Invalid`` would report for this policy object that needs no read of the
    cluster (see the module), judged against what the admin allows (``tenancy``); empty when it may be
    admitted. Never raises: a policy this cannot judge is refused, naming the failure, not answered 500."""
    body = {k: v for k, v in obj.items() if k != "status"}
    try:
        with judging("the admission webhook"):
            policy = parse_policy(body, tenancy=tenancy)
    except PolicyError as exc:
        return exc.errors
    if policy.spec.workload_ref is not None:
        return []  # its levels derive from the referenced Deployment: the operator judges them once it read it
    try:
        with judging("the admission webhook"):
            judge_resolved(policy)
    except PolicyError as exc:
        # Sizing that needs the ConfigMap's model shape is the operator's to judge, once it has read it.
        return [e for e in exc.errors if e.path != "spec.model.configMap"]
    # Custom metric queries were parsed with the policy (api/promql.py, PromQL's grammar): nothing a tenant
    # names is contacted at admission.
    return []


def message(errors: list[FieldError]) -> str:
    """The refusal: the ``Invalid`` condition's message for the same errors (bounded: ``api/errors.py``)."""
    return summary(errors)


def _spec_changed(body: Mapping[str, Any], old: Mapping[str, Any] | None) -> bool:
    return old is None or dict(body.get("spec") or {}) != dict(old.get("spec") or {})


def register(registry: kopf.OperatorRegistry, tenancy: Tenancy = DEFAULT_TENANCY) -> None:
    """Add the validating handler to ``registry``, judging against ``tenancy`` (the operator must then run a
    webhook server)."""

    @kopf.on.validate(
        API_GROUP,
        API_VERSION,
        PLURAL,
        id=WEBHOOK_ID,
        registry=registry,
        operations=["CREATE", "UPDATE"],
        ignore_failures=True,
    )
    def validate_policy(body: kopf.Body, **kwargs: Any) -> None:
        meta = body.get("metadata") or {}
        old = kwargs.get("old")  # kopf passes the admission request's oldObject and operation
        if kwargs.get("operation") == "UPDATE" and (meta.get("deletionTimestamp") or not _spec_changed(body, old)):
            return
        found = problems(plain_body(body), tenancy)
        if found:
            raise kopf.AdmissionError(message(found), code=ADMISSION_CODE)


MAX_REVIEW_BYTES = 8 * 1024 * 1024
"""The largest AdmissionReview read: the API server stores objects of up to 1.5 MiB by default (3 MiB at most
in a request), and a review carries the object and the old object."""
JUDGE_SECONDS = TIMEOUT_SECONDS - 1.0
"""The webhook's own deadline, below the API server's timeout, so the answer is ours and names why."""


class AdmissionServer(kopf.WebhookServer):
    """kopf's HTTPS server, answering every review it can read with a review: never a 500.

    kopf's own ``_serve`` (replaced here, with the same call of ``fn``) answers 500 for whatever its handling
    raises before or around the handler (its diff of a document nested thousands deep raises RecursionError),
    and leaves a slow judgement to the API server's timeout. Both then fall to ``failurePolicy: Ignore``:
    admitted unjudged, with nothing said. Here a review whose uid can be read gets a refusal naming the
    failure, within :data:`JUDGE_SECONDS`; one that cannot be read at all (too large, not JSON, nested past the
    parser) gets a 4xx, as kopf gives for bad JSON, and the operator's ``Invalid`` is the backstop."""

    async def _serve(self, fn: Any, request: aiohttp.web.Request) -> aiohttp.web.Response:  # type: ignore[override]
        if request.content_length is not None and request.content_length > MAX_REVIEW_BYTES:
            raise aiohttp.web.HTTPRequestEntityTooLarge(max_size=MAX_REVIEW_BYTES, actual_size=request.content_length)
        try:
            async with asyncio.timeout(JUDGE_SECONDS):
                text = await _bounded_text(request)
        except TimeoutError:
            raise aiohttp.web.HTTPRequestTimeout(reason="the review did not arrive in time") from None
        try:
            data = json.loads(text)
        except (ValueError, RecursionError) as exc:
            raise aiohttp.web.HTTPBadRequest(reason=f"not a readable AdmissionReview: {printable(str(exc))}") from None
        uid = _uid(data)
        if uid is None:
            raise aiohttp.web.HTTPBadRequest(reason="an AdmissionReview without request.uid")
        sslpeer = request.transport.get_extra_info("peercert") if request.transport else None
        try:
            async with asyncio.timeout(JUDGE_SECONDS):
                answer = await fn(
                    data, webhook=request.match_info.get("id"), sslpeer=sslpeer, headers=dict(request.headers)
                )
            return aiohttp.web.json_response(answer)
        except TimeoutError:
            why = f"the policy was not judged within {JUDGE_SECONDS:g}s"
        except RecursionError:
            why = "the policy could not be judged: it is nested too deep"
        except Exception as exc:
            why = f"the policy could not be judged: {type(exc).__name__}: {exc}"
        return aiohttp.web.json_response(_refusal(data, uid, printable(why)))


async def _bounded_text(request: aiohttp.web.Request) -> str:
    """The body, refused past :data:`MAX_REVIEW_BYTES` however it is sent (chunked bodies have no length)."""
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.content.iter_chunked(65536):
        size += len(chunk)
        if size > MAX_REVIEW_BYTES:
            raise aiohttp.web.HTTPRequestEntityTooLarge(max_size=MAX_REVIEW_BYTES, actual_size=size)
        chunks.append(chunk)
    return b"".join(chunks).decode("utf-8", errors="replace")


def _uid(data: Any) -> str | None:
    request = data.get("request") if isinstance(data, dict) else None
    uid = request.get("uid") if isinstance(request, dict) else None
    return uid if isinstance(uid, str) else None


def _refusal(data: dict[str, Any], uid: str, message: str) -> dict[str, Any]:
    return {
        "apiVersion": data.get("apiVersion") or "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": {"uid": uid, "allowed": False, "status": {"code": ADMISSION_CODE, "message": message}},
    }


def webhook_server(
    *, address: str, port: int, certfile: str, keyfile: str, host: str | None = None
) -> kopf.WebhookServer:
    """The HTTPS server for the webhook (:class:`AdmissionServer`), with the deployment's certificate (reloaded
    when it changes)."""
    return AdmissionServer(addr=address, port=port, host=host, certfile=certfile, pkeyfile=keyfile)


__all__ = [
    "ADMISSION_CODE",
    "CONFIGURATION_NAME",
    "JUDGE_SECONDS",
    "MAX_REVIEW_BYTES",
    "TIMEOUT_SECONDS",
    "WEBHOOK_ID",
    "WEBHOOK_NAME",
    "WEBHOOK_PATH",
    "AdmissionServer",
    "message",
    "problems",
    "register",
    "validating_webhook_configuration",
    "webhook_server",
]
