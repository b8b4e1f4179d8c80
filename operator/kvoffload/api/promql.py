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
narrow the selection, never widen it. This is checked on the template's tokens by a PromQL lexer here,
walked as PromQL's grammar places them: a keyword (``sum``, ``count``, ``or``, ``offset``, ``by`` ...) is
a keyword only where the grammar reads it as one, and a bare metric name anywhere an expression starts (the
grammar's ``metric_identifier`` takes most keywords: ``sum(x) + count`` reads the series ``count`` of every
namespace). Conservative: an identifier it cannot place as a function, an aggregation or a modifier counts
as a bare metric name, and a token where the grammar wants none is refused. The real Prometheus parser is
asked too where one is reachable (``analysis/queryparse.py``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
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

# Aggregation operators: an aggregation only where followed by "(" or by/without; elsewhere Prometheus's grammar
# (metric_identifier) reads each as a bare metric name. PromQL's keywords are case-insensitive.
_AGGREGATIONS = frozenset(
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
    }
)
_SET_OPERATORS = frozenset({"and", "or", "unless"})
_KEYWORDS = (
    _AGGREGATIONS
    | _SET_OPERATORS
    | {
        "atan2",
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
        "bool",
        "offset",
        "start",
        "end",
    }
)
"""Words that are no function's name: where one stands as an operand, not as the keyword it can be, Prometheus reads
it as a metric name (``sum(x) + count`` selects every series named ``count``), so the check refuses it."""
_NUMBERS = frozenset({"inf", "nan"})
"""Lexed as numbers by Prometheus wherever they stand."""
_COMPARISONS = frozenset({"==", "!=", "<", ">", "<=", ">="})
_BINARY = _COMPARISONS | {"+", "-", "*", "/", "%", "^"}


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


def pods_regex(pods: Iterable[str]) -> str:
    """A regex for exactly these pods, as Prometheus anchors it. Pod names are Kubernetes names, whose only regex
    metacharacter is ``.``. No pods: ``-``, a name no pod can have (an empty regex would match every series
    without the label)."""
    return "|".join(sorted(p.replace(".", "\\.") for p in pods)) or "-"


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
            pairs = [(self.namespace_label, "=", self.namespace), (self.pod_label, "=~", pods_regex(self.pods))]
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
    carries ``{{ selector }}`` (see the module). Raises nothing: a template it cannot read is a problem.

    The tokens are walked as PromQL's grammar reads them, knowing at each token whether an operand (an
    expression) or an operator must come. A keyword counts as one only where the grammar reads it as that
    keyword: an aggregation where ``(`` or ``by``/``without`` follows, ``bool`` right after a comparison,
    ``on``/``ignoring`` and ``group_left``/``group_right`` right after a binary operator, ``by``/``without``
    after an aggregation's body, ``offset`` and ``and``/``or``/``unless``/``atan2`` after an operand. Anywhere
    else an identifier in an operand's place is a metric name (Prometheus reads ``sum(x) + count`` as the
    series named ``count``, of every namespace) and refused unless braces with ``{{ selector }}`` follow it;
    a token that stands where the grammar wants none is refused too (conservative: the real parser refuses it
    anyway, where it is asked)."""
    if SENTINEL_LABEL in template:
        return [f"{SENTINEL_LABEL} is reserved"]
    try:
        tokens = list(_tokens(for_checking(template)))
    except TemplateError as exc:
        return [str(exc)]
    found: list[str] = []
    n = len(tokens)

    def kind(k: int) -> str:
        return tokens[k].kind if k < n else ""

    def word(k: int) -> str:
        return tokens[k].text.lower() if k < n and tokens[k].kind == "ident" else ""

    def unexpected(k: int, where: str = "") -> None:
        found.append(f"unexpected {tokens[k].text} at {tokens[k].pos + 1}{where}")

    def label_list(k: int) -> int:
        """``tokens[k]`` is the ``(`` of a by/without/on/ignoring/group_left/group_right list: past its ``)``."""
        k += 1
        while k < n and tokens[k].kind != ")":
            if tokens[k].kind not in ("ident", "string", ","):
                unexpected(k, " in a list of label names")
            k += 1
        if k >= n:
            found.append("a list of label names is not closed")
        return k + 1

    def braces(k: int) -> int:
        """``tokens[k]`` is the ``{`` of a selector, checked for ``{{ selector }}``: past its ``}``."""
        start, has_selector = tokens[k], False
        k += 1
        while k < n and tokens[k].kind != "}":
            if tokens[k].kind == "{":
                found.append(f"nested braces at {tokens[k].pos + 1}")
            elif tokens[k].kind == "ident" and tokens[k].text == SENTINEL_LABEL:
                has_selector = True
            k += 1
        if not has_selector:
            found.append(f"the selector at {start.pos + 1} lacks {{{{ selector }}}}")
        if k >= n:
            found.append(f"the selector at {start.pos + 1} is not closed")
        return k + 1

    stack: list[str] = []  # per open "(": "agg" (an aggregation's body, no by/without yet), "call" or "paren"
    operand = True  # an expression must start here; else an operator, a modifier, "," or ")"
    modifiers = ""  # right after a binary operator: "bool" (a comparison), "on", then "group" after on (...)
    agg_closed = False  # the ")" just read closed an aggregation's body that had no by/without
    i = 0
    while i < n:
        token, name = tokens[i], word(i)
        if operand:
            if name == "bool" and modifiers == "bool":
                modifiers, i = "on", i + 1
                continue
            if name in ("on", "ignoring") and modifiers in ("bool", "on") and kind(i + 1) == "(":
                modifiers, i = "group", label_list(i + 1)
                continue
            if name in ("group_left", "group_right") and modifiers == "group":
                modifiers, i = "", i + 1
                if kind(i) == "(":
                    i = label_list(i)
                continue
            modifiers = ""
            if token.kind in ("+", "-"):  # a unary sign
                i += 1
            elif token.kind in ("number", "string") or name in _NUMBERS:
                operand, i = False, i + 1
            elif token.kind == "{":
                operand, i = False, braces(i)
            elif token.kind == "(":
                stack.append("paren")
                i += 1
            elif token.kind == "ident" and kind(i + 1) == "{":  # a metric name, its braces checked
                operand, i = False, braces(i + 1)
            elif name in _AGGREGATIONS and kind(i + 1) == "(":
                stack.append("agg")
                i += 2
            elif name in _AGGREGATIONS and word(i + 1) in ("by", "without") and kind(i + 2) == "(":
                i = label_list(i + 2)
                if kind(i) == "(":
                    stack.append("call")
                    i += 1
                else:
                    found.append(f"the aggregation {token.text} at {token.pos + 1} has no body")
                    operand = False
            elif token.kind == "ident" and name not in _KEYWORDS and kind(i + 1) == "(":  # a function call
                stack.append("call")
                i += 2
            elif token.kind == "ident":
                found.append(f"the metric {token.text} at {token.pos + 1} is selected without {{{{ selector }}}}")
                operand, i = False, i + 1
            else:
                unexpected(i, " where an expression must start")
                i += 1
            continue
        closed, agg_closed = agg_closed, False
        if token.kind == ")":
            if stack:
                agg_closed = stack.pop() == "agg"
            else:
                unexpected(i)
            i += 1
        elif token.kind == "," and stack and stack[-1] != "paren":
            operand, i = True, i + 1
        elif token.kind == "[":  # a range or a subquery: durations only ([1m:10s] lexes ':10s' as a name)
            while i < n and tokens[i].kind != "]":
                i += 1
            if i >= n:
                found.append("a range is not closed")
            i += 1
        elif token.kind in _BINARY or name in _SET_OPERATORS or name == "atan2":
            operand, modifiers = True, ("bool" if token.kind in _COMPARISONS else "on")
            i += 1
        elif name == "offset" or token.kind == "@":
            k = i + 1 + (kind(i + 1) in ("+", "-"))
            if kind(k) == "number":
                i = k + 1
            elif token.kind == "@" and word(k) in ("start", "end") and kind(k + 1) == "(" and kind(k + 2) == ")":
                i = k + 3
            else:
                found.append(f"{token.text} at {token.pos + 1} is not followed by a duration or a time")
                i = k + 1
        elif name in ("by", "without") and closed and kind(i + 1) == "(":
            i = label_list(i + 1)
        else:
            unexpected(i, " where an operator must stand")
            i += 1
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
