"""The engine seam: an engine is one folder under ``engines/``, and the core never names one.

``analysis``, ``rollout``, ``controller`` and ``policy`` reach an engine only through ``kvoffload.engines`` (the
protocol, the dialect type and ``engine_for``: tests/test_layout.py checks the imports). This reads their source: no
string in their code (docstrings and comments aside: prose may say "vLLM") that spells an engine's name, one of its
command-line options, one of its config keys or one of its series.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Callable, Iterator

import pytest

from kvoffload.engines import ENGINES
from tests.support import paths

PACKAGE = paths.PACKAGE
ENGINES_DIR = PACKAGE / "engines"
CORE = ("analysis", "rollout", "controller", "policy")
ENGINE_FOLDERS = sorted(p.name for p in ENGINES_DIR.iterdir() if (p / "__init__.py").is_file())
# What else names an engine in prose turned code: its product name, however cased.
OTHER_NAMES = ("tensorrt",)


def engine_words() -> re.Pattern[str]:
    names = {*ENGINE_FOLDERS, *ENGINES, *OTHER_NAMES}
    return re.compile("|".join(sorted(map(re.escape, names))), re.IGNORECASE)


def options_tables() -> Iterator[dict[str, object]]:
    for path in sorted(ENGINES_DIR.glob("*/data/*-options.json")):
        yield json.loads(path.read_text())


def engine_flags() -> set[str]:
    """Every option every engine's parser has (``--max-model-len``, ``--tp_size``...), from the tables."""
    flags: set[str] = set()
    for table in options_tables():
        options = table.get("options")
        assert isinstance(options, dict)
        flags |= {flag for flag in options if flag.startswith("--")}
    return flags


def engine_config_keys() -> set[str]:
    """The keys of engines' config files (TensorRT-LLM's ``KvCacheConfig``): those spelt as identifiers with an
    underscore, which no core module has a reason to write."""
    keys: set[str] = set()
    for table in options_tables():
        for section in ("kvCacheConfig", "llmArgs"):
            fields = table.get(section)
            if isinstance(fields, dict) and isinstance(fields.get("fields"), dict):
                keys |= {key for key in fields["fields"] if "_" in key}
    return keys


def docstrings(tree: ast.AST) -> set[int]:
    """The string constants that are docstrings (of a module, class or function, or after an assignment)."""
    found: set[int] = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if not isinstance(body, list):
            continue
        for i, statement in enumerate(body):
            is_doc = isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant)
            if is_doc and (i == 0 or isinstance(body[i - 1], ast.Assign | ast.AnnAssign)):
                found.add(id(statement.value))
    return found


def core_strings() -> Iterator[tuple[str, int, str]]:
    """(file, line, text) of every string constant in the core's code, docstrings aside."""
    for floor in CORE:
        for path in sorted((PACKAGE / floor).rglob("*.py")):
            tree = ast.parse(path.read_text())
            skip = docstrings(tree)
            for node in ast.walk(tree):
                if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
                    yield str(path.relative_to(PACKAGE)), node.lineno, node.value


def spells_an_engine() -> Callable[[str], bool]:
    """Whether a string names an engine, or spells one of its flags (``--flag`` or ``--flag=value``) or config keys."""
    words, flags, keys = engine_words(), engine_flags(), engine_config_keys()
    return lambda text: bool(words.search(text)) or text.split("=", 1)[0] in flags or text in keys


def test_the_core_spells_no_engine_name_flag_config_key_or_series() -> None:
    spells = spells_an_engine()
    found = [f"{where}:{line}: {text[:80]!r}" for where, line, text in core_strings() if spells(text)]
    assert found == []


@pytest.mark.parametrize(
    ("source", "caught"),
    [
        ('x = "vllm:time_to_first_token_seconds"', True),
        ('x = f"no {series} for the pod"', False),
        ('x = "--max-model-len=4096"', True),
        ('x = "host_cache_size"', True),
        ('"""A docstring may say vLLM."""\nx = 1', False),
        ('def f():\n    """vLLM, in prose."""\n    return "SGLang speaks"', True),
    ],
)
def test_the_check_catches_what_it_means_to(source: str, caught: bool) -> None:
    # Proves the checks above are live: the same reading applied to small sources.
    tree = ast.parse(source)
    skip = docstrings(tree)
    texts = [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and id(n) not in skip]
    spells = spells_an_engine()
    assert any(spells(t) for t in texts if isinstance(t, str)) is caught
