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

from collections.abc import Mapping
from typing import Any

import kopf

from kvoffload.api.conventions import API_GROUP, API_VERSION, PLURAL
from kvoffload.api.errors import FieldError, PolicyError, summary
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
from kvoffload.controller.reconcile import judge_resolved, judging
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


def webhook_server(
    *, address: str, port: int, certfile: str, keyfile: str, host: str | None = None
) -> kopf.WebhookServer:
    """kopf's HTTPS server for the webhook, with the deployment's certificate (reloaded when it changes)."""
    return kopf.WebhookServer(addr=address, port=port, host=host, certfile=certfile, pkeyfile=keyfile)


__all__ = [
    "ADMISSION_CODE",
    "CONFIGURATION_NAME",
    "TIMEOUT_SECONDS",
    "WEBHOOK_ID",
    "WEBHOOK_NAME",
    "WEBHOOK_PATH",
    "message",
    "problems",
    "register",
    "validating_webhook_configuration",
    "webhook_server",
]
