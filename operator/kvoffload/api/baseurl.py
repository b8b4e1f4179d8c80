"""``spec.prometheus.url`` is a base URL: a scheme, a host, an optional port and an optional path, nothing else.

The operator builds every request to Prometheus itself (``/api/v1/query`` under the base), so a base URL needs
no userinfo, query or fragment, and with them a tenant would choose the path: ``http://prom/api/v1/admin/tsdb/
delete_series?match[]=...#`` once made admission delete every series (issue 33). Dot segments, plain or
percent-encoded, would escape the admin's allowed prefix: ``.../team-a/../team-b`` is team-b's once a client
normalises it. So the path is plain segments of unreserved characters, none of them ``.`` or ``..``.

The URL is read by urllib3's parser (RFC 3986), the one that parses it again when the operator's client
(requests) sends the query, and it must already be in the form that parser gives back (it removes dot segments
and escapes what it must): what is judged is what is asked.
"""

from __future__ import annotations

import re

from urllib3.exceptions import LocationParseError
from urllib3.util import parse_url

SCHEMES = ("http", "https")
PATH_SEGMENT = re.compile(r"^[A-Za-z0-9._~-]+$")
"""RFC 3986's unreserved characters: no percent-encoding, so no encoded dot or slash."""
CRD_PATTERN = r"^https?://[^\s/?#@\\]+(/[A-Za-z0-9._~-]+)*/?$"
"""The CRD's own check, which holds with the webhook down (Go's RE2: no look-ahead, so dot segments are a CEL
rule beside it, :data:`CRD_DOT_SEGMENT`)."""
CRD_DOT_SEGMENT = r"/[.][.]?(/|$)"


def base_url_problem(url: str) -> str | None:
    """Why ``url`` is not a base URL (see the module); None when it is."""
    try:
        parts = parse_url(url)
    except LocationParseError as exc:
        return f"is not a URL: {exc}"
    if parts.scheme not in SCHEMES or not parts.host:
        return "must be http:// or https:// with a host"
    if parts.auth is not None:
        return "may not carry a user or password (name a bearerTokenSecret)"
    if parts.query is not None or parts.fragment is not None:
        return "is a base URL: no query (?) or fragment (#); the operator adds the API paths itself"
    segments = url.split("://", 1)[-1].split("/")[1:]
    for i, segment in enumerate(segments):
        if segment == "" and i < len(segments) - 1:
            return "has an empty path segment (//)"
        if segment in (".", "..") or (segment and not PATH_SEGMENT.match(segment)):
            return f"has the path segment {segment!r}: only letters, digits, '-', '.', '_' and '~', never . or .."
    if parts.url != url:
        return f"is read as {parts.url} by the HTTP client: write it so"
    return None


__all__ = ("CRD_DOT_SEGMENT", "CRD_PATTERN", "base_url_problem")
