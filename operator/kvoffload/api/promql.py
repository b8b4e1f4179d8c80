"""Custom metric query templates: a fixed set of placeholders, filled by the operator, never by the policy.

A template is PromQL with two placeholders and nothing else of a template language:

- ``{{ selector }}``: label matchers, without braces, that select one variant's engines of one policy:
  its namespace, its name and the config hash of the variant's level (the series labels the rendered
  PodMonitor copies from the pods), plus ``spec.prometheus.extraMatchers``; for an observe-only policy, the
  observed fleet's namespace and pods by name instead (its series carry none of those labels), as the
  built-in queries select it. Written inside braces:
  ``vllm:num_requests_waiting{ {{ selector }} }`` or ``...{ {{ selector }}, finished_reason="abort" }``;
- ``{{ window }}``: ``spec.analysis.window`` as a PromQL duration (``rate(x{...}[{{ window }}])``).

Why no Jinja: the template is tenant input, and a template language evaluated over it is more surface
than two substitutions need. Substitution is one pass (a value that holds ``{{ window }}`` is not
expanded again), every label value is written as an escaped PromQL string literal, label names are
checked, and ``extraMatchers`` is decoded and written again (never pasted).

What :func:`selector_problems` enforces, so that a tenant's query reads only its own engines' series:
every vector selector of the template (every ``{...}`` and every bare metric name) carries
``{{ selector }}``. Matchers within one selector are ANDed, so a matcher the tenant adds beside it can
narrow the selection, never widen it. This is checked on the template's tokens by a PromQL lexer here
(conservative: an identifier it cannot place counts as a bare metric name), after the real Prometheus
parser accepted the query where one is reachable (``analysis/promparse.py``).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

SELECTOR = "selector"
WINDOW = "window"
PLACEHOLDERS = frozenset({SELECTOR, WINDOW})
PLACEHOLDER = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")
"""``{{ name }}``; whitespace inside the braces is optional."""

SENTINEL_LABEL = "__kvoffload_selector__"
"""The matcher ``{{ selector }}`` becomes when a template is checked: a reserved (``__``) label name that no
series carries, so the check can find where the placeholder stood. A template may not spell it itself."""
CHECK_WINDOW = "1m"

LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_MATCHER = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"\s*(?:,|$)', re.DOTALL)

# Words that are never a metric name where they stand: aggregations, binary operators and modifiers
# (PromQL's keywords are case-insensitive). An identifier followed by "(" is a function call anyway.
_KEYWORDS = frozenset(
    {
        "sum",
        "min",
        "max",
        "avg",
        "group",
        "stddev",
        "stdvar",
        "count",
        "count_values",
        "bottomk",
        "topk",
        "quantile",
        "limitk",
        "limit_ratio",
        "and",
        "or",
        "unless",
        "atan2",
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
        "bool",
        "offset",
        "inf",
        "nan",
    }
)
_GROUPING = frozenset({"by", "without", "on", "ignoring", "group_left", "group_right"})


class TemplateError(ValueError):
    """A query template that cannot be used; the message says why."""


def escape_label_value(value: str) -> str:
    """``value`` as a PromQL double-quoted string literal: backslash, quote and line breaks escaped."""
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\r", "\\r")
    return f'"{escaped}"'


_ESCAPES = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v", "\\": "\\", '"': '"', "'": "'"}


def unquote(body: str) -> str:
    """The value of a PromQL double-quoted string's body (Go's escapes); TemplateError on a bad escape."""
    out: list[str] = []
    i = 0
    while i < len(body):
        ch = body[i]
        if ch != "\\":
            out.append(ch)
            i += 1
            continue
        nxt = body[i + 1 : i + 2]
        if nxt in _ESCAPES:
            out.append(_ESCAPES[nxt])
            i += 2
        elif nxt in ("x", "u", "U"):
            width = {"x": 2, "u": 4, "U": 8}[nxt]
            digits = body[i + 2 : i + 2 + width]
            if len(digits) != width or not all(c in "0123456789abcdefABCDEF" for c in digits):
                raise TemplateError(f"bad escape \\{nxt}{digits} in a label value")
            out.append(chr(int(digits, 16)))
            i += 2 + width
        elif nxt.isdigit():
            digits = body[i + 1 : i + 4]
            if len(digits) != 3 or not all(c in "01234567" for c in digits):
                raise TemplateError(f"bad octal escape \\{digits} in a label value")
            out.append(chr(int(digits, 8)))
            i += 4
        else:
            raise TemplateError(f"bad escape \\{nxt} in a label value")
    return "".join(out)


def parse_matchers(text: str) -> list[tuple[str, str, str]]:
    """``a="x", b=~"y|z"`` as (name, operator, value) with each value decoded; TemplateError when it is not that."""
    found: list[tuple[str, str, str]] = []
    pos = 0
    text = text.strip()
    while pos < len(text):
        match = _MATCHER.match(text, pos)
        if match is None:
            raise TemplateError(f"not a list of label matchers: {text[pos:][:60]!r}")
        found.append((match.group(1), match.group(2), unquote(match.group(3))))
        pos = match.end()
    return found


def render_matchers(text: str) -> str:
    """``text`` (``spec.prometheus.extraMatchers``) decoded by :func:`parse_matchers` and written again, each
    name checked and each value an escaped string literal: ``a="x", b=~"y"``. TemplateError when it is not a
    list of label matchers. Whatever a value holds stays inside its literal; nothing of ``text`` is pasted."""
    return _render_pairs(parse_matchers(text))


def _render_pairs(pairs: list[tuple[str, str, str]]) -> str:
    for name, _, _ in pairs:
        if not LABEL_NAME.match(name):
            raise TemplateError(f"{name!r} is not a label name")
    return ", ".join(f"{name}{op}{escape_label_value(value)}" for name, op, value in pairs)


@dataclass(frozen=True)
class Selection:
    """What ``{{ selector }}`` selects: one variant's engines of one policy. Label names are the operator's
    settings (``kvoffload run --policy-label`` ...); values come from the policy and are escaped."""

    namespace_label: str
    namespace: str
    policy_label: str
    policy: str
    config_hash_label: str
    config_hash: str
    extra_matchers: str | None = None
    pods: tuple[str, ...] | None = None
    """Observe-only: the observed fleet's pods. Its series carry none of the policy's labels, so it is selected
    as the built-in queries select it (``analysis/prometheus.py``'s ``fleet_matcher``): its namespace and its
    pods by name; policy and config hash are then not matched."""
    pod_label: str = "pod"

    def matchers(self) -> str:
        pairs: list[tuple[str, str, str]]
        if self.pods is not None:
            # Pod names are Kubernetes names, whose only regex metacharacter is "."; Prometheus anchors the regex.
            names = "|".join(sorted(p.replace(".", "\\.") for p in self.pods))
            pairs = [(self.namespace_label, "=", self.namespace), (self.pod_label, "=~", names)]
        else:
            pairs = [
                (self.namespace_label, "=", self.namespace),
                (self.policy_label, "=", self.policy),
                (self.config_hash_label, "=", self.config_hash),
            ]
        if self.extra_matchers:
            pairs += parse_matchers(self.extra_matchers)
        return _render_pairs(pairs)


def _substitute(template: str, values: dict[str, str]) -> str:
    def one(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in values:
            raise TemplateError(
                f"unknown placeholder {{{{ {name} }}}}: only {{{{ selector }}}} and {{{{ window }}}} are filled in"
            )
        return values[name]

    return PLACEHOLDER.sub(one, template)  # one pass: a filled-in value is never read for placeholders again


def render(template: str, selection: Selection, window: str) -> str:
    """The query for one variant: ``{{ selector }}`` and ``{{ window }}`` filled in, nothing else touched.

    ``window`` must be a PromQL duration (``analysis/prometheus.py``'s ``promql_duration``)."""
    if not re.fullmatch(r"[0-9]+(ms|s|m|h|d|w|y)", window):
        raise TemplateError(f"{window!r} is not a PromQL duration")
    return _substitute(template, {SELECTOR: selection.matchers(), WINDOW: window})


def for_checking(template: str) -> str:
    """The template with the placeholders filled by stand-ins, as PromQL a parser can judge (the stand-in
    selector is a matcher on :data:`SENTINEL_LABEL`); TemplateError for an unknown placeholder."""
    return _substitute(template, {SELECTOR: f'{SENTINEL_LABEL}="1"', WINDOW: CHECK_WINDOW})


# --- the selector check -------------------------------------------------------------------


@dataclass(frozen=True)
class _Token:
    kind: str
    """``ident``, ``string``, ``number`` or the punctuation itself."""
    text: str
    pos: int


_TOKEN = re.compile(
    r"""
    (?P<space>\s+|\#[^\n]*)
  | (?P<string>"(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*'|`[^`]*`)
  | (?P<number>(?:\d|\.\d)(?:[\w.]|(?<=[eE])[+-])*)
  | (?P<ident>[a-zA-Z_:][a-zA-Z0-9_:]*)
  | (?P<punct>=~|!~|!=|==|<=|>=|[{}()\[\],=<>+\-*/%^@:])
    """,
    re.VERBOSE | re.DOTALL,
)


def _tokens(text: str) -> Iterator[_Token]:
    pos = 0
    while pos < len(text):
        match = _TOKEN.match(text, pos)
        if match is None:
            raise TemplateError(f"unexpected character {text[pos]!r} at {pos + 1}")
        kind = match.lastgroup or ""
        if kind != "space":
            yield _Token(match.group() if kind == "punct" else kind, match.group(), pos)
        pos = match.end()


def selector_problems(template: str) -> list[str]:
    """Why this template could read series beyond its policy's engines; empty when every vector selector
    carries ``{{ selector }}`` (see the module). Raises nothing: a template it cannot read is a problem."""
    if SENTINEL_LABEL in template:
        return [f"{SENTINEL_LABEL} is reserved"]
    try:
        tokens = list(_tokens(for_checking(template)))
    except TemplateError as exc:
        return [str(exc)]
    found: list[str] = []
    depth = 0  # inside {...}
    brace_start = 0
    brace_has_selector = False
    grouping_depth = 0  # parentheses of a by (...) / on (...) label list
    paren_depth = 0
    bracket_depth = 0  # a range or subquery: durations only ([1m:10s] lexes ':10s' as a name)
    for i, token in enumerate(tokens):
        nxt = tokens[i + 1] if i + 1 < len(tokens) else None
        if token.kind == "{":
            if depth:
                found.append(f"nested braces at {token.pos + 1}")
            depth, brace_start, brace_has_selector = depth + 1, token.pos, False
        elif token.kind == "}":
            if depth and not brace_has_selector:
                found.append(f"the selector at {brace_start + 1} lacks {{{{ selector }}}}")
            depth = max(0, depth - 1)
        elif depth:
            if token.kind == "ident" and token.text == SENTINEL_LABEL:
                brace_has_selector = True
        elif token.kind in ("[", "]"):
            bracket_depth = max(0, bracket_depth + (1 if token.kind == "[" else -1))
        elif bracket_depth:
            continue
        elif token.kind == "(":
            paren_depth += 1
            prev = tokens[i - 1] if i else None
            if grouping_depth == 0 and prev is not None and prev.kind == "ident" and prev.text.lower() in _GROUPING:
                grouping_depth = paren_depth
        elif token.kind == ")":
            if grouping_depth == paren_depth:
                grouping_depth = 0
            paren_depth -= 1
        elif token.kind == "ident" and not grouping_depth:
            if token.text.lower() in _KEYWORDS or (nxt is not None and nxt.kind in ("(", "{")):
                continue  # a keyword, a function call, or a metric name whose braces are checked
            found.append(f"the metric {token.text} at {token.pos + 1} is selected without {{{{ selector }}}}")
    if not any(t.kind == "{" for t in tokens):
        found.append("the query selects no series with {{ selector }}")
    return found


def check_template(template: str) -> None:
    """TemplateError naming every reason the template may not be used (see :func:`selector_problems`)."""
    problems = selector_problems(template)
    if problems:
        raise TemplateError(
            "every vector selector must carry {{ selector }} (the operator's matchers for the policy's engines): "
            + "; ".join(problems)
        )
