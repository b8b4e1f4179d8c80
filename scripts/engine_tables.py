"""Write operator/kvoffload/api/data/engines.json, what the CRD knows of the serving engines, from the registered
engines (``kvoffload.engines.ENGINES``).

``api`` is the package's bottom floor and may import nothing of it, so it cannot ask the engines: it reads this file
for ``spec.engine``'s allowed values and default, and for each engine's CEL rules on ``spec.model.extraArgs`` (the
RE2 patterns of an item that spells one of its managed flags outright). ``--check`` writes nothing and exits 1 when
the committed file differs (tests/api/test_engine_tables.py runs the same comparison). After changing the file,
regenerate the CRD: ``kvoffload crd > crds/kvoffloadpolicies.kvoffload.io.yaml`` and copy it to
``charts/kvoffload/files/``.

    .venv/bin/python scripts/engine_tables.py           # rewrite the file
    .venv/bin/python scripts/engine_tables.py --check   # exit 1 if it is stale
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "operator" / "kvoffload" / "api" / "data" / "engines.json"

# The API server refuses a CRD rule it estimates past 10,000,000. It prices ``a.matches(P)`` at (a's bytes: 2,048
# characters of up to 4 bytes, times 0.1) x (P's length x 0.25), and ``all`` over 64 items 64 times that: 52,480 per
# 4 characters of pattern, so one rule's pattern must stay under 762 characters. An engine whose managed spellings
# need more gets more rules.
MAX_PATTERN = 700


def table() -> dict[str, Any]:
    """The file's content, from the registered engines in their registration order."""
    from kvoffload.engines import DEFAULT_ENGINE, ENGINES
    from kvoffload.engines.options import managed_patterns

    engines = []
    for name, engine in ENGINES.items():
        patterns = managed_patterns(engine.managed_flags, MAX_PATTERN)
        for pattern in patterns:
            # The CRD puts a pattern inside a single-quoted CEL string, which would read a quote or a backslash.
            if "'" in pattern or "\\" in pattern:
                raise ValueError(f"{name}: its managed pattern holds a quote or a backslash: {pattern}")
            if len(pattern) > MAX_PATTERN:
                raise ValueError(f"{name}: one option's spellings alone make a pattern over {MAX_PATTERN}: {pattern}")
            re.compile(pattern)
        engines.append({"name": name, "title": engine.title, "managedPatterns": patterns})
    return {
        "comment": "what the CRD knows of the engines, from kvoffload.engines.ENGINES (scripts/engine_tables.py); "
        "do not edit",
        "default": DEFAULT_ENGINE,
        "engines": engines,
    }


def text() -> str:
    """The file as written."""
    return json.dumps(table(), indent=1) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if the file is stale")
    wanted = text()
    if parser.parse_args().check:
        if not OUT.exists() or OUT.read_text(encoding="utf-8") != wanted:
            print(f"{OUT.relative_to(ROOT)} is stale: run python scripts/engine_tables.py", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(wanted, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
