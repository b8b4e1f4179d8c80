"""Print the option table of SGLang's own ``launch_server`` parser as JSON, in the format the operator ships
(``operator/kvoffload/engines/sglang/data/sglang-options.json``), judging an SGLang policy's ``extraArgs``
with it. Run with the vLLM venv's python and SGLang's sources first on the path (``make setup`` installs both):

    PYTHONPATH=.sglang-05 .venv-vllm/bin/python scripts/sglang_options.py > table.json
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from vllm_options import nargs  # what argparse reads after an option, as the walker needs it

# SGLang imports triton and IPython at module level: the checker's stubs (tests/sglang_argcheck.py says which).
_CHECKER = Path(__file__).resolve().parents[1] / "tests" / "sglang_argcheck.py"


def _install_stubs() -> None:
    spec = importlib.util.spec_from_file_location("sglang_argcheck", _CHECKER)
    assert spec is not None
    assert spec.loader is not None
    checker = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(checker)
    checker.install_stubs()


def table() -> dict[str, Any]:
    _install_stubs()
    from sglang.srt.server_args import ServerArgs

    import sglang

    # As sglang.srt.server_args.prepare_server_args builds it for `python3 -m sglang.launch_server`.
    parser = argparse.ArgumentParser(prog="sglang serve")
    ServerArgs.add_cli_args(parser)
    options = {
        option: {"dest": action.dest, "nargs": nargs(action)}
        for option, action in sorted(parser._option_string_actions.items())
    }
    return {
        "comment": "sglang.launch_server's options, from SGLang's own parser (scripts/sglang_options.py); do not edit",
        "versions": [sglang.__version__],
        "allowAbbrev": parser.allow_abbrev,
        "options": options,
    }


if __name__ == "__main__":
    json.dump(table(), sys.stdout, indent=1)
    sys.stdout.write("\n")
