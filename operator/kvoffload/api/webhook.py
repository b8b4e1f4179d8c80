"""The validating admission webhook's registration: the ValidatingWebhookConfiguration, beside the CRD.

The webhook itself is the operator's (``controller/admission.py``); its registration is plain data,
here so that the Helm chart's test, the operator and the lab's ``kvoffload cluster`` build the same
object.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Any

from kvoffload.api.conventions import API_GROUP, API_VERSION, COMPONENT, PLURAL

WEBHOOK_ID = "validate-policy"
"""The kopf handler id: the last segment of the webhook's URL path."""
WEBHOOK_PATH = f"/{WEBHOOK_ID}"
WEBHOOK_NAME = f"policies.{API_GROUP}"
"""The webhook's name in the configuration (a qualified name, as the API server requires)."""
CONFIGURATION_NAME = COMPONENT
TIMEOUT_SECONDS = 5
"""How long the API server waits for an answer before it ignores the webhook."""
ADMISSION_CODE = 422


def validating_webhook_configuration(
    *,
    url: str | None = None,
    service: Mapping[str, Any] | None = None,
    ca_bundle: bytes,
    name: str = CONFIGURATION_NAME,
    namespace_selector: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The ValidatingWebhookConfiguration for the operator's webhook, reached at ``url`` (the server's
    base, e.g. ``https://127.0.0.1:9443``: :data:`WEBHOOK_PATH` is appended) or through an in-cluster
    ``service`` (``{"namespace", "name", "port"}``), trusting the PEM ``ca_bundle``; for the policies
    of every namespace, or of those ``namespace_selector`` (a label selector) picks.

    The Helm chart renders the same object (tests/test_chart.py compares them)."""
    if (url is None) == (service is None):
        raise ValueError("give url or service, not both")
    client: dict[str, Any] = {"caBundle": base64.b64encode(ca_bundle).decode("ascii")}
    if url is not None:
        client["url"] = url.rstrip("/") + WEBHOOK_PATH
    else:
        assert service is not None
        client["service"] = {**dict(service), "path": WEBHOOK_PATH}
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/name": COMPONENT}},
        "webhooks": [
            {
                "name": WEBHOOK_NAME,
                "admissionReviewVersions": ["v1"],
                "clientConfig": client,
                "rules": [
                    {
                        "apiGroups": [API_GROUP],
                        "apiVersions": [API_VERSION],
                        "resources": [PLURAL],
                        "operations": ["CREATE", "UPDATE"],
                        "scope": "Namespaced",
                    }
                ],
                # Down or slow, the webhook is skipped: status Invalid is the backstop.
                "failurePolicy": "Ignore",
                "matchPolicy": "Equivalent",
                "sideEffects": "None",
                "timeoutSeconds": TIMEOUT_SECONDS,
                **({"namespaceSelector": dict(namespace_selector)} if namespace_selector is not None else {}),
            }
        ],
    }


__all__ = [
    "ADMISSION_CODE",
    "CONFIGURATION_NAME",
    "TIMEOUT_SECONDS",
    "WEBHOOK_ID",
    "WEBHOOK_NAME",
    "WEBHOOK_PATH",
    "validating_webhook_configuration",
]
