"""An engine's command line as its own argparse parser reads it: which ``extraArgs`` would set a value the
operator manages, or turn on an option that loads code.

A flag is judged by what it sets (its argparse ``dest``), not by how it is spelt. vLLM's
``FlexibleArgumentParser`` turns ``_`` into ``-`` in a flag's name, takes ``--flag=value``, folds dotted keys
(``--kv-transfer-config.kv_role=…``) into the JSON of their base flag, and argparse accepts short aliases
(``-tp``), other long names for the same setting (``--device-memory-utilization``) and unique abbreviations
(``--max-model 4096``). Each engine ships its option table in its package's ``data`` folder (taken from its own
parsers by ``scripts/*_options.py``), so the walk below needs no engine installed. The engines' own modules
(``engines/vllm/flags.py``, ``engines/sglang/command.py``) say which dests are managed and which load code.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

_NEGATIVE_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+$")  # argparse reads these as values, not options


@dataclass(frozen=True)
class OptionTable:
    """An engine's options: each option string's dest and how many values it takes."""

    versions: tuple[str, ...]
    allow_abbrev: bool
    options: Mapping[str, tuple[str, int | str]]

    def flags_of(self, dest: str) -> list[str]:
        """Every option string that sets ``dest``, long names first and negations (``--no-x``) after them."""
        found = [o for o, (d, _) in self.options.items() if d == dest]
        return sorted(found, key=lambda o: (not o.startswith("--"), o.startswith(("--no-", "--disable-")), o))


def load_option_table(package: str, name: str) -> OptionTable:
    """An option table shipped in ``package``'s ``data`` folder (written by ``scripts/*_options.py``)."""
    raw: dict[str, Any] = json.loads((resources.files(package) / "data" / name).read_text(encoding="utf-8"))
    return OptionTable(
        versions=tuple(raw["versions"]),
        allow_abbrev=bool(raw["allowAbbrev"]),
        options={o: (e["dest"], e["nargs"]) for o, e in raw["options"].items()},
    )


@dataclass(frozen=True)
class ArgProblem:
    """One ``extraArgs`` item that may not stand: its index and why."""

    index: int
    message: str


def option_like(arg: str) -> bool:
    """Whether argparse reads ``arg`` as an option (not a value such as -1)."""
    return arg.startswith("-") and arg != "-" and not _NEGATIVE_NUMBER.match(arg)


def candidates(table: OptionTable, name: str) -> list[str]:
    """The option strings argparse may take ``name`` for: itself, else its unique-prefix expansions."""
    if name in table.options:
        return [name]
    if name.startswith("--"):
        return sorted(o for o in table.options if o.startswith(name)) if table.allow_abbrev else []
    # One dash: argparse also reads "-tp8" as "-tp" "8"... only for options of two characters ("-h5").
    return sorted(o for o in table.options if o.startswith(name) or (len(o) == 2 and name.startswith(o)))


def _name(arg: str) -> tuple[str, bool, bool]:
    """The option name the engine's parser looks up for ``arg``; whether a value is attached (``=``); and whether
    it is a dotted key (``--flag.key``, also ``-cc.key``), which always takes a value."""
    key, eq, _ = arg.partition("=")
    base, dot, _ = key.partition(".")
    if arg.startswith("--"):
        return "--" + base[2:].replace("_", "-"), bool(eq), bool(dot)
    return base, bool(eq), bool(dot)


def option_dest(name: str) -> str:
    """A dest as the admin may name it: ``--trust-remote-code``, ``trust-remote-code`` or ``trust_remote_code``."""
    return name.lstrip("-").replace("-", "_")


def _code_problem(table: OptionTable, dest: str, spelled: str, why: str) -> str:
    flag = table.flags_of(dest)[0]
    return (
        f"sets {flag}{spelled}, which loads code the image allow-list does not vouch for: {why}; "
        f"only a cluster admin can allow it (--allowed-code-option {flag})"
    )


def judge_extra_args(
    args: Sequence[str],
    table: OptionTable,
    *,
    managed: Mapping[str, str],
    code: Mapping[str, str],
    allowed: Collection[str] = (),
    engine: str,
    levels: Mapping[str, Sequence[str]] | None = None,
) -> list[ArgProblem]:
    """Every ``extraArgs`` item that would set a ``managed`` value, that would turn on a ``code``-loading option
    the admin has not ``allowed`` (dests or flags, :func:`option_dest`), that the engine has no option for, or
    that it would read as a positional argument (the model); empty when all may stand. ``engine`` names the
    engine in messages; ``levels`` are one-dash shorthands the engine's parser reads before argparse does, with
    the values a bare one takes (vLLM's ``-O3``, ``-O=3`` or ``-O 3``). ``_`` in a name is read as ``-`` for every
    engine (SGLang's plain argparse does not, which can only refuse more).

    The walk follows ``FlexibleArgumentParser.parse_args`` and argparse: names normalised, dotted keys
    reduced to their base flag, aliases and abbreviations resolved, and each option's values skipped."""
    known = ", ".join(table.versions)
    permitted = {option_dest(a) for a in allowed}
    shorthands = levels or {}
    found: list[ArgProblem] = []
    i = 0
    while i < len(args):
        arg = args[i]
        i += 1
        if arg == "--":
            found.append(ArgProblem(i - 1, f"'--' ends {engine}'s options: what follows would be read as the model"))
            break
        if not option_like(arg):
            found.append(
                ArgProblem(
                    i - 1,
                    f"{arg!r} is no option's value: {engine} would read it as a positional argument, the model "
                    "(give values right after their flag, or as --flag=value)",
                )
            )
            continue
        shorthand = next((s for s in shorthands if arg.startswith(s) and not arg.startswith("--")), None)
        if shorthand is not None:
            # Attached (-O3, -O=3) it stands; bare, only before one of its values.
            if arg != shorthand:
                continue
            values = shorthands[shorthand]
            if i < len(args) and args[i] in values:
                i += 1
                continue
            found.append(
                ArgProblem(
                    i - 1,
                    f"{engine} reads a bare {shorthand} only before a level, {values[0]} to {values[-1]} "
                    f"(or write {shorthand}{values[-1]})",
                )
            )
            continue
        name, attached, dotted = _name(arg)
        spelt_as = candidates(table, name)
        if not name.startswith("--") and len(name) > 2 and len(spelt_as) == 1 and len(spelt_as[0]) == 2:
            attached = True  # "-qfp8": argparse reads a two-character option with its value attached
        hits = [c for c in spelt_as if table.options[c][0] in managed]
        # "--no-trust-remote-code" turns the option off: it loads nothing.
        code_hits = [
            c
            for c in spelt_as
            if table.options[c][0] in code and table.options[c][0] not in permitted and not c.startswith("--no-")
        ]
        if hits:
            dest = table.options[hits[0]][0]
            spelled = "" if name == hits[0] else f" ({arg.partition('=')[0]} is read as {hits[0]})"
            found.append(
                ArgProblem(
                    i - 1,
                    f"sets {table.flags_of(dest)[0]}{spelled}, which the operator manages: {managed[dest]}",
                )
            )
        elif code_hits:
            dest = table.options[code_hits[0]][0]
            spelled = "" if name == code_hits[0] else f" ({arg.partition('=')[0]} is read as {code_hits[0]})"
            found.append(ArgProblem(i - 1, _code_problem(table, dest, spelled, code[dest])))
        elif not spelt_as:
            found.append(ArgProblem(i - 1, f"{engine} {known} has no option {name}"))
        elif len(spelt_as) > 1:
            found.append(ArgProblem(i - 1, f"{name} is ambiguous in {engine}: it could be {', '.join(spelt_as[:4])}"))
        if attached:
            continue
        nargs = 1 if dotted or len(spelt_as) != 1 else table.options[spelt_as[0]][1]
        if nargs in (1, "?") and i < len(args) and not option_like(args[i]):
            i += 1
        elif nargs in ("+", "*"):
            while i < len(args) and not option_like(args[i]):
                i += 1
        elif isinstance(nargs, int) and nargs > 1:
            i += nargs
    return found


def managed_flags(table: OptionTable, managed: Iterable[str]) -> list[str]:
    """Every spelling ``table`` gives the ``managed`` dests (long names and aliases), for messages and CEL."""
    return sorted({o for dest in managed for o in table.flags_of(dest)})


_SEGMENT = re.compile(r"^[A-Za-z0-9]+$")
# Where a name breaks into words: vLLM's and SGLang's flags use "-", click-based ones (trtllm-serve) "_".
_WORD_BREAK = re.compile(r"[-_]")


def _alternatives(names: Iterable[tuple[str, ...]]) -> list[str]:
    """``names`` (each split into its words) as regular-expression alternatives sharing their leading words:
    ``kv-cache-dtype`` and ``kv-offloading-size`` become ``kv[-_](cache[-_]dtype|offloading[-_]size)``."""
    following: dict[str, list[tuple[str, ...]]] = {}
    for name in sorted(set(names)):
        if not _SEGMENT.match(name[0]):
            raise ValueError(f"option word {name[0]!r} is not letters and digits: the pattern would need escapes")
        following.setdefault(name[0], []).append(name[1:])
    found = []
    for head, rests in following.items():
        tails = [rest for rest in rests if rest]
        if not tails:
            found.append(head)
            continue
        inner = _alternatives(tails)
        body = inner[0] if len(inner) == 1 else f"({'|'.join(inner)})"
        found.append(f"{head}([-_]{body})?" if () in rests else f"{head}[-_]{body}")
    return found


def managed_patterns(flags: Iterable[str], max_length: int | None = None) -> list[str]:
    """Regular expressions (RE2) that together match an ``extraArgs`` item spelling one of ``flags`` outright: any
    mix of ``-`` and ``_``, with ``=value`` or a dotted key. The CRD's CEL rules use them (``api/data/engines.json``,
    written by ``scripts/engine_tables.py``); abbreviations and the walk over values are the webhook's and the
    operator's to judge (:func:`judge_extra_args`). Names share their leading words, and no pattern is longer than
    ``max_length`` (one pattern when None): the API server prices a rule by its pattern's length."""
    long_names = _alternatives(tuple(_WORD_BREAK.split(f[2:])) for f in flags if f.startswith("--"))
    short = _alternatives(tuple(_WORD_BREAK.split(f[1:])) for f in flags if not f.startswith("--"))
    parts = [f"--({alternative})([=.].*)?" for alternative in long_names]
    parts += [f"-({'|'.join(short)})(=.*)?"] if short else []
    patterns: list[list[str]] = [[]]
    for part in parts:
        if patterns[-1] and max_length is not None and len(_anchored(patterns[-1] + [part])) > max_length:
            patterns.append([])
        patterns[-1].append(part)
    # Long names together, as one alternation, read better in the CRD than one group each.
    return [_anchored(_joined(group)) for group in patterns]


def _joined(parts: list[str]) -> list[str]:
    """``--(a)([=.].*)?`` parts as one ``--(a|b)([=.].*)?``, the short-flag part left apart."""
    long_parts = [p[3 : -len(")([=.].*)?")] for p in parts if p.startswith("--")]
    joined = [f"--({'|'.join(long_parts)})([=.].*)?"] if long_parts else []
    return joined + [p for p in parts if not p.startswith("--")]


def _anchored(parts: list[str]) -> str:
    return f"^({'|'.join(_joined(parts))})$"


def managed_pattern(table: OptionTable, managed: Iterable[str]) -> str:
    """One regular expression matching an ``extraArgs`` item that spells a ``managed`` dest outright
    (:func:`managed_patterns`)."""
    (pattern,) = managed_patterns(managed_flags(table, managed))
    return pattern


__all__ = [
    "ArgProblem",
    "OptionTable",
    "candidates",
    "judge_extra_args",
    "load_option_table",
    "managed_flags",
    "managed_pattern",
    "managed_patterns",
    "option_dest",
    "option_like",
]
