"""Print the option table of ``vllm serve``'s own parser as JSON: every option string with its dest and
how many values it takes. Run with a vLLM venv's python (PYTHONPATH first for 0.33/0.34 sources):

    .venv-vllm/bin/python scripts/vllm_options.py > table-0.32.json

``scripts/vllm_options.py --merge A.json B.json ...`` merges such tables into the one the operator
ships (``operator/kvoffload/engines/vllm/data/vllm-options.json``), judging ``extraArgs`` with it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

# What argparse reads after an option, as the operator's walker needs it: 0 (a switch), 1 (one
# value), "?" (an optional value), "*" or "+" (values up to the next option).
_SWITCHES = (
    argparse._StoreTrueAction,
    argparse._StoreFalseAction,
    argparse._StoreConstAction,
    argparse._AppendConstAction,
    argparse._CountAction,
    argparse._HelpAction,
    argparse._VersionAction,
)


def nargs(action: argparse.Action) -> int | str:
    if isinstance(action, _SWITCHES):
        return 0
    if action.nargs is None:
        return 1
    if isinstance(action.nargs, int):
        return action.nargs
    return str(action.nargs)


def table() -> dict[str, Any]:
    import vllm
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    try:  # 0.33 moved the serve parser to entrypoints/common
        from vllm.entrypoints.common.cli_args import make_arg_parser
    except ImportError:  # 0.32
        from vllm.entrypoints.launchers.cli_args import make_arg_parser  # type: ignore[no-redef]

    parser = make_arg_parser(FlexibleArgumentParser(prog="vllm serve"))
    # Every option string argparse matches, abbreviations included: the registered ones, not each action's
    # option_strings, which 0.33's EnableDisableAction trims to those shown in --help (--no-enable-x and
    # --no-disable-x stay accepted).
    options = {
        option: {"dest": action.dest, "nargs": nargs(action)}
        for option, action in parser._option_string_actions.items()
    }
    return {"version": vllm.__version__.split("+")[0], "allowAbbrev": parser.allow_abbrev, "options": options}


def merge(paths: list[str]) -> dict[str, Any]:
    tables = [json.loads(Path(p).read_text()) for p in paths]
    options: dict[str, Any] = {}
    for t in tables:
        for option, entry in t["options"].items():
            seen = options.setdefault(option, {**entry, "versions": []})
            if (seen["dest"], seen["nargs"]) != (entry["dest"], entry["nargs"]):
                sys.exit(f"{option}: {seen} in one version, {entry} in {t['version']}")
            seen["versions"].append(t["version"])
    return {
        "comment": "vllm serve's options, from vLLM's own parsers (scripts/vllm_options.py); do not edit",
        "versions": [t["version"] for t in tables],
        "allowAbbrev": any(t["allowAbbrev"] for t in tables),
        "options": dict(sorted(options.items())),
    }


if __name__ == "__main__":
    out = merge(sys.argv[2:]) if sys.argv[1:2] == ["--merge"] else table()
    json.dump(out, sys.stdout, indent=1, sort_keys=False)
    sys.stdout.write("\n")
