"""The gateway's errors: what it raises when an API operation the operator asked for did not happen, and the API
server's message for a log line or an Event. A leaf: it imports nothing of the operator."""

from __future__ import annotations

import json
import re


class GatewayError(Exception):
    """An API operation the operator asked for did not happen; ``reason`` names it for an Event."""

    reason = "ApiError"


class NotOwnedError(GatewayError):
    """The object exists but belongs to someone else: kvoffload neither adopts nor touches it."""

    reason = "NotOwned"


class MissingObjectError(GatewayError):
    """An object (or a key in it) that the policy refers to does not exist."""

    reason = "NotFound"


class ApiRejectedError(GatewayError):
    """The API server refused the request (a 4xx other than a conflict)."""

    reason = "Rejected"

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


class FieldConflictError(ApiRejectedError):
    """A server-side apply that was not forced touched fields another field manager owns."""

    reason = "FieldConflict"


class ApiUnavailableError(GatewayError):
    """Conflicts or transient failures lasted longer than the retry budget."""

    reason = "ApiUnavailable"


def api_message(exc: BaseException) -> str:
    """The API server's message from a Status body (it names the verb and resource refused), else the HTTP
    reason, else the error itself, without object addresses so that one failure reads the same each time."""
    try:
        return str(json.loads(getattr(exc, "body", None) or "")["message"])
    except (ValueError, KeyError, TypeError):
        pass
    reason = getattr(exc, "reason", None)
    return re.sub(r" at 0x[0-9a-f]+", "", str(reason if reason is not None else exc))
