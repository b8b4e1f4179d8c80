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
expanded again), and every label value is written as an escaped PromQL string literal.

PromQL is parsed, never lexed by hand: by promql-parser, a Python binding of the Rust crate of the same name,
which follows Prometheus' grammar (``tests/api/test_promql_prometheus.py`` checks it against Prometheus 2.42's
own parser, with queries made to be hostile). On the syntax tree, every vector selector (a range's, a subquery's
and a bare metric name's too) must carry ``{{ selector }}``. Matchers within one selector are ANDed, so what a
tenant adds beside it can narrow the selection, never widen it; ``or`` between matchers (Prometheus 3) is refused,
and so is a matcher on the namespace label, which the operator sets.

:func:`render` checks the filled query again, on its own tree: every selector must carry each of the operator's
matchers, decoded, so what Prometheus runs is exactly what was checked. The operator sends the tenant's text
with the placeholders filled, never a query printed from the tree: promql-parser 0.12 prints string literals
without their escapes and ``x[5m:]`` as ``x[5m]``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

import promql_parser

SELECTOR = "selector"
WINDOW = "window"
PLACEHOLDERS = frozenset({SELECTOR, WINDOW})
PLACEHOLDER = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")
"""``{{ name }}``; whitespace inside the braces is optional."""

SENTINEL_LABEL = "__kvoffload_selector__"
"""The matcher ``{{ selector }}`` becomes when a template is checked: a reserved (``__``) label name that no
series carries, so the check can find where the placeholder stood. A template may not spell it itself."""
SENTINEL = (SENTINEL_LABEL, "=", "1")
CHECK_WINDOW = "1m"
NAMESPACE_LABEL = "namespace"
"""The label a check at admission refuses in a template's own matchers (the operator's default namespace label)."""

LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")

Matcher = tuple[str, str, str]
"""(label name, operator, decoded value)."""

_OPERATORS = {"Equal": "=", "NotEqual": "!=", "Re": "=~", "NotRe": "!~"}
"""promql_parser.MatchOp's members (unhashable) by name."""


def _decoded(matchers: promql_parser.Matchers) -> list[Matcher]:
    """A selector's matchers (the first set, before any ``or``) as (name, operator, decoded value)."""
    return [(m.name, _OPERATORS[str(m.op).removeprefix("MatchOp.")], m.value) for m in matchers.matchers]


def _written(pairs: Iterable[Matcher]) -> str:
    """Matchers as PromQL: ``a="x", b=~"y"``, each value an escaped string literal."""
    return ", ".join(f"{name}{op}{escape_label_value(value)}" for name, op, value in pairs)


class TemplateError(ValueError):
    """A query template that cannot be used; the message says why."""


def escape_label_value(value: str) -> str:
    """``value`` as a PromQL double-quoted string literal: backslash, quote and line breaks escaped."""
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\r", "\\r")
    return f'"{escaped}"'


# --- parsing -------------------------------------------------------------------------------------


def parse(query: str) -> promql_parser.Expr:
    """The query's syntax tree; TemplateError with the parser's message when it is not PromQL."""
    try:
        return promql_parser.parse(query)
    except (ValueError, RuntimeError) as exc:
        raise TemplateError(f"not PromQL: {exc}") from None


@dataclass(frozen=True)
class VectorSelector:
    """One vector selector of a query, as the parser read it."""

    name: str | None
    matchers: tuple[Matcher, ...]
    alternatives: int
    """Matcher sets joined by ``or`` inside the braces (Prometheus 3); 0 for none."""

    def __str__(self) -> str:
        return f"{self.name or ''}{{{_written(self.matchers)}}}"


def vector_selectors(query: str) -> list[VectorSelector]:
    """Every vector selector of ``query`` in the order written, those of ranges and subqueries included."""
    found: list[VectorSelector] = []

    def visit(node: promql_parser.Expr) -> None:
        if isinstance(node, promql_parser.VectorSelector):
            matchers = node.matchers
            found.append(VectorSelector(node.name or None, tuple(_decoded(matchers)), len(matchers.or_matchers)))

    promql_parser.walk(parse(query), visit)
    return found


def parse_matchers(text: str) -> list[Matcher]:
    """``a="x", b=~"y|z"`` as (name, operator, value) with each value decoded; TemplateError when it is not that.

    Parsed as the braces of a selector: anything that ends them early (``a="x"} or up{b="y"``) is no selector."""
    try:
        expr = parse("{" + text + "}")
    except TemplateError as exc:
        raise TemplateError(f"not a list of label matchers: {exc}") from None
    if (
        not isinstance(expr, promql_parser.VectorSelector)
        or expr.offset is not None
        or expr.at is not None
        or expr.name
        or expr.matchers.or_matchers
    ):
        raise TemplateError(f"not a list of label matchers: {text[:60]!r}")
    return _decoded(expr.matchers)


def render_matchers(text: str) -> str:
    """``text`` (``spec.prometheus.extraMatchers``) decoded by :func:`parse_matchers` and written again, each
    name checked and each value an escaped string literal: ``a="x", b=~"y"``. TemplateError when it is not a
    list of label matchers. Whatever a value holds stays inside its literal; nothing of ``text`` is pasted."""
    return _render_pairs(parse_matchers(text))


def _render_pairs(pairs: list[Matcher]) -> str:
    for name, _, _ in pairs:
        if not LABEL_NAME.match(name):
            raise TemplateError(f"{name!r} is not a label name")
    return _written(pairs)


def pods_regex(pods: Iterable[str]) -> str:
    """A regex for exactly these pods, as Prometheus anchors it. Pod names are Kubernetes names, whose only regex
    metacharacter is ``.``. No pods: ``-``, a name no pod can have (an empty regex would match every series
    without the label)."""
    return "|".join(sorted(p.replace(".", "\\.") for p in pods)) or "-"


# --- filling in ----------------------------------------------------------------------------------


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
    as the built-in queries select it (``analysis/queries.py``'s ``fleet_matcher``): its namespace and its
    pods by name; policy and config hash are then not matched."""
    pod_label: str = "pod"

    def pairs(self) -> list[Matcher]:
        """The matchers, decoded: the operator's, then ``extra_matchers``."""
        pairs: list[Matcher]
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
        return pairs


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
    """The query for one variant: ``{{ selector }}`` and ``{{ window }}`` filled in, nothing else touched, then
    checked on its syntax tree: TemplateError unless every selector carries each of the selection's matchers.

    ``window`` must be a PromQL duration (``analysis/queries.py``'s ``promql_duration``)."""
    if not re.fullmatch(r"[0-9]+(ms|s|m|h|d|w|y)", window):
        raise TemplateError(f"{window!r} is not a PromQL duration")
    pairs = selection.pairs()
    query = _substitute(template, {SELECTOR: _render_pairs(pairs), WINDOW: window})
    problems = _confinement_problems(query, pairs, selection.namespace_label)
    if problems:
        raise TemplateError("; ".join(problems))
    return query


def for_checking(template: str) -> str:
    """The template with the placeholders filled by stand-ins, as PromQL a parser can judge (the stand-in
    selector is a matcher on :data:`SENTINEL_LABEL`); TemplateError for an unknown placeholder."""
    return _substitute(template, {SELECTOR: f'{SENTINEL_LABEL}="1"', WINDOW: CHECK_WINDOW})


# --- the selector check -------------------------------------------------------------------------


def _confinement_problems(query: str, required: list[Matcher], guarded: str) -> list[str]:
    """Why ``query`` could read series beyond ``required``: a selector without each of them, ``or`` between
    matchers, or a matcher of its own on the ``guarded`` label."""
    selectors = vector_selectors(query)
    if not selectors:
        return ["the query selects no series with {{ selector }}"]
    found: list[str] = []
    for selector in selectors:
        what = f"the metric {selector.name}" if selector.name else f"the selector {selector}"
        if selector.alternatives:
            found.append(f"{what} joins matchers with or, which {{{{ selector }}}} cannot confine")
        if not set(required) <= set(selector.matchers):
            found.append(f"{what} is selected without {{{{ selector }}}}")
        own = [m for m in selector.matchers if m[0] == guarded and m not in required]
        if own:
            found.append(f"{what} names its own {guarded} ({_render_pairs(own)}); {{{{ selector }}}} sets it")
    return found


def _template_problems(template: str) -> list[str]:
    """Why the template could read beyond its policy's engines; TemplateError when it is not PromQL (or spells
    the stand-in)."""
    if SENTINEL_LABEL in template:
        raise TemplateError(f"{SENTINEL_LABEL} is reserved")
    return _confinement_problems(for_checking(template), [SENTINEL], NAMESPACE_LABEL)


def selector_problems(template: str) -> list[str]:
    """Why this template could read series beyond its policy's engines; empty when every vector selector
    carries ``{{ selector }}`` (see the module). Raises nothing: a template it cannot read is a problem."""
    try:
        return _template_problems(template)
    except TemplateError as exc:
        return [str(exc)]


def check_template(template: str) -> None:
    """TemplateError naming every reason the template may not be used (see :func:`selector_problems`); one that
    is not PromQL says so in the parser's words."""
    problems = _template_problems(template)
    if problems:
        raise TemplateError(
            "every vector selector must carry {{ selector }} (the operator's matchers for the policy's engines): "
            + "; ".join(problems)
        )
