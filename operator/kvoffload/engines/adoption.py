"""What an engine needs to take over a container the team already runs (``spec.workloadRef``): where its options
are in the container's command line, what they set, and how a level's offload flags replace the user's.

A flag is read by what it sets (its argparse ``dest`` in the engine's option table), not by how it is spelt: long
names with ``_`` or ``-``, ``--flag=value``, aliases and unique abbreviations, as the engine's parser reads them
(``engines/options.py`` says how). Pure: the engines' own modules subclass :class:`Adopts`.
"""

from __future__ import annotations

import posixpath
import re
import shlex
from abc import ABC, abstractmethod
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from kvoffload.api.types import KVOffloadPolicySpec
from kvoffload.engines.engine import DerivedContainer, Rung, Served, Setting
from kvoffload.engines.options import OptionTable, candidates, option_dest, option_like

_SHELLS = frozenset({"sh", "bash", "dash", "ash", "zsh", "busybox"})
_SHELL_OPERATORS = frozenset({";", "&&", "||", "|", "&", ";;", "(", ")"})
_ALL_ARGS = frozenset({"$@", "${@}"})


_HUMAN_INT = re.compile(r"^(\d+(?:\.\d+)?)([kKmMgGtT]?)$")
_DECIMAL = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_BINARY = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def whole_number(text: str) -> int | None:
    """``text`` as vLLM's ``human_readable_int`` reads it (``32768``, ``32k`` = 32000, ``32K`` = 32768); None when
    it is no such number (``auto``, ``-1``). SGLang's plain ints read the same."""
    match = _HUMAN_INT.match(text.strip())
    if match is None:
        return None
    number, suffix = match.groups()
    if not suffix:
        return int(number) if number.isdigit() else None
    if suffix in _DECIMAL:
        return int(float(number) * _DECIMAL[suffix])
    return int(number) * _BINARY[suffix] if number.isdigit() else None


@dataclass(frozen=True)
class Item:
    """One item of a command line as the engine's parser reads it: ``args[start:end]``."""

    start: int
    end: int
    dest: str | None
    """What it sets; None for a positional, or a name the engine has no single option for."""
    flag: str
    """The option string it resolves to; empty for a positional."""
    spelt: str
    """As written, without ``=value``."""
    values: tuple[str, ...]
    key: str | None = None
    """A dotted key (``--kv-transfer-config.kv_connector``)."""

    @property
    def value(self) -> str | None:
        return self.values[-1] if self.values else None

    @property
    def positional(self) -> bool:
        return not self.flag and not option_like(self.spelt)


def walk(args: Sequence[str], table: OptionTable, *, dash_o: bool = False) -> list[Item]:
    """Every item of ``args`` with what it sets, following argparse (and vLLM's ``-O`` shorthand with ``dash_o``)."""
    items: list[Item] = []
    i, n = 0, len(args)
    while i < n:
        arg, start = args[i], i
        i += 1
        if arg == "--":  # everything after it is positional
            items += [Item(j, j + 1, None, "", args[j], (args[j],)) for j in range(i, n)]
            break
        if not option_like(arg):
            items.append(Item(start, i, None, "", arg, (arg,)))
            continue
        if dash_o and arg.startswith("-O") and not arg.startswith("--"):
            level = arg[2:].lstrip("=")
            if not level and i < n and args[i] in ("0", "1", "2", "3"):
                level, i = args[i], i + 1
            items.append(Item(start, i, "optimization_level", "-O", "-O", (level,) if level else ()))
            continue
        key, eq, attached = arg.partition("=")
        base, dot, sub = key.partition(".")
        name = "--" + base[2:].replace("_", "-") if arg.startswith("--") else base
        spelt_as = candidates(table, name)
        if not name.startswith("--") and len(name) > 2 and len(spelt_as) == 1 and len(spelt_as[0]) == 2:
            # "-qfp8": argparse reads a two-character option with its value attached
            flag = spelt_as[0]
            items.append(Item(start, i, table.options[flag][0], flag, arg[:2], (arg[2:],)))
            continue
        dests = {table.options[c][0] for c in spelt_as}
        flag = spelt_as[0] if len(dests) == 1 else ""
        dest = table.options[flag][0] if flag else None
        values: tuple[str, ...] = ()
        if eq:
            values = (attached,)
        else:
            nargs = 1 if dot or not flag else table.options[flag][1]
            if nargs in (1, "?") and i < n and not option_like(args[i]):
                values, i = (args[i],), i + 1
            elif nargs in ("+", "*"):
                while i < n and not option_like(args[i]):
                    values, i = (*values, args[i]), i + 1
            elif isinstance(nargs, int) and nargs > 1:
                values, i = tuple(args[i : i + nargs]), i + nargs
        items.append(Item(start, i, dest, flag, key, values, sub if dot else None))
    return items


@dataclass(frozen=True)
class CommandLine:
    """Where an engine's options are in a container: ``command + args`` from ``start`` on; or, for a shell script
    (``sh -c '... vllm serve ... "$@"'``), the script's own (read, never edited) around the args it passes on."""

    command: tuple[str, ...] | None
    args: tuple[str, ...] | None
    start: int | None
    """Where the options begin in ``command + args``; None when they are in a shell script."""
    positional_model: bool
    script_before: tuple[str, ...] = ()
    script_after: tuple[str, ...] = ()
    passes_args: bool = True
    """False for a script that does not hand its arguments (``"$@"``) to the engine."""

    @property
    def tokens(self) -> list[str]:
        return [*(self.command or ()), *(self.args or ())]

    @property
    def script(self) -> bool:
        return self.start is None

    @property
    def options(self) -> list[str]:
        if self.start is not None:
            return self.tokens[self.start :]
        return [*self.script_before, *(self.args or ()), *self.script_after]


def _strings(value: Any) -> tuple[str, ...] | None:
    if not isinstance(value, list):
        return None
    return tuple(str(v) for v in value)


def _script_tokens(script: str) -> list[str]:
    lexer = shlex.shlex(script, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    try:
        return list(lexer)
    except ValueError:  # an unbalanced quote: no engine found in it
        return []


def image_repository(image: str) -> str:
    """The last path segment of an image's repository, without tag or digest (``vllm/vllm-openai:v1`` ->
    ``vllm-openai``)."""
    name = image.partition("@")[0]
    last = name.rsplit("/", 1)[-1]
    return last.partition(":")[0]


class Adopts(ABC):
    """An engine's side of ``spec.workloadRef``: the engine subclasses it with its option table, its launch
    commands and its offload flags and variables."""

    title: ClassVar[str]
    OFFLOAD_DESTS: ClassVar[frozenset[str]]
    """What the level's offload sets: the user's own are replaced."""
    OFFLOAD_ENV_PREFIX: ClassVar[str]
    DEFAULT_PORT: ClassVar[int]
    MODEL_DEST: ClassVar[str]
    MAX_MODEL_LEN_DEST: ClassVar[str]
    TP_DEST: ClassVar[str]
    IMAGE_WORD: ClassVar[str]
    POSITIONAL_WINS: ClassVar[bool]
    """Whether a positional model wins over the model flag (``vllm serve MODEL``) or yields to it."""
    CODE_DESTS: ClassVar[Mapping[str, str]]
    DASH_O: ClassVar[bool] = False

    @abstractmethod
    def table(self) -> OptionTable: ...

    @abstractmethod
    def launch(self, tokens: Sequence[str]) -> tuple[int, bool] | None:
        """Where the engine's options begin in ``tokens`` that launch it, and whether a positional is the model;
        None when they do not launch it."""

    @abstractmethod
    def offload_args(self, spec: KVOffloadPolicySpec, rung: Rung) -> list[str]: ...

    @abstractmethod
    def offload_env(self, spec: KVOffloadPolicySpec, rung: Rung) -> list[dict[str, Any]]: ...

    def adopted_problems(self, items: Sequence[Item]) -> list[str]:
        """The engine's own reasons not to take over a command line (its items, walked)."""
        return []

    # --- reading ---

    def command_line(self, container: Mapping[str, Any], *, named: bool = False) -> CommandLine | None:
        """Where this engine's options are in ``container``; None when it does not run the engine. A container
        without a command runs its image's entry point: the engine's when its image is (or ``named``, when the
        policy names the engine), its args then being the options."""
        command, args = _strings(container.get("command")), _strings(container.get("args"))
        tokens = [*(command or ()), *(args or ())]
        found = self.launch(tokens)
        if found is not None:
            return CommandLine(command, args, found[0], found[1])
        for i, token in enumerate(command or ()):
            if posixpath.basename(token) in _SHELLS and i + 2 < len(command or ()) and tokens[i + 1] == "-c":
                return self._script(command or (), args, i + 2)
        image = str(container.get("image") or "")
        if command is None and (named or self.IMAGE_WORD in image_repository(image)):
            return CommandLine(command, args, 0, self.POSITIONAL_WINS)
        return None

    def _script(self, command: tuple[str, ...], args: tuple[str, ...] | None, at: int) -> CommandLine | None:
        tokens = _script_tokens(command[at])
        found = self.launch(tokens)
        if found is None:
            return None
        start, positional = found
        end = next((j for j in range(start, len(tokens)) if tokens[j] in _SHELL_OPERATORS), len(tokens))
        options = tokens[start:end]
        if not any(t in _ALL_ARGS for t in options):
            return CommandLine(command, args, None, positional, tuple(options), (), passes_args=False)
        cut = next(j for j, t in enumerate(options) if t in _ALL_ARGS)
        # "$@" is what follows $0 (the token after the script) in command, then args.
        before = (*options[:cut], *command[at + 2 :])
        return CommandLine(command, args, None, positional, tuple(before), tuple(options[cut + 1 :]))

    def recognises(self, container: Mapping[str, Any]) -> bool:
        return self.command_line(container) is not None

    def _items(self, options: Sequence[str]) -> list[Item]:
        return walk(options, self.table(), dash_o=self.DASH_O)

    def served(self, container: Mapping[str, Any]) -> Served:
        line = self.command_line(container, named=True)
        if line is None:
            return Served(None, None, None, None, self.DEFAULT_PORT)
        items = self._items(line.options)
        last: dict[str, Setting] = {}
        positional: Setting | None = None
        for item in items:
            if item.positional:
                if positional is None and line.positional_model:
                    positional = Setting("its positional argument", item.spelt)
            elif item.dest is not None and item.value is not None and item.key is None:
                last[item.dest] = Setting(item.spelt, item.value, whole_number(item.value))
        model = last.get(self.MODEL_DEST)
        if positional is not None and (self.POSITIONAL_WINS or model is None):
            model = positional
        port = last.get("port")
        return Served(
            model=model,
            max_model_len=last.get(self.MAX_MODEL_LEN_DEST),
            tensor_parallel_size=last.get(self.TP_DEST),
            kv_cache_dtype=last.get("kv_cache_dtype"),
            port=port.number if port is not None and port.number is not None else self.DEFAULT_PORT,
        )

    def adoption_problems(self, container: Mapping[str, Any]) -> list[str]:
        name = container.get("name")
        line = self.command_line(container, named=True)
        if line is None:
            return [
                f"container {name!r} does not launch {self.title} where its options can be read (its command "
                "neither runs the engine nor is absent)"
            ]
        problems: list[str] = []
        if line.script:
            _, set_in_script = self.split_offload([*line.script_before, *line.script_after])
            if set_in_script:
                problems.append(
                    f"container {name!r} sets {', '.join(self._flags(set_in_script))} in its shell script, which "
                    "the operator cannot edit: pass them in args, where each level's offload flags replace them"
                )
            if not line.passes_args:
                problems.append(
                    f"container {name!r} launches {self.title} from a shell script that does not pass its args on "
                    '("$@"): the operator appends each level\'s offload flags to args'
                )
        if "--" in line.options:
            problems.append(
                f"container {name!r} ends its options with '--': the offload flags appended after it would be read "
                "as positional arguments"
            )
        return problems + [f"container {name!r} {p}" for p in self.adopted_problems(self._items(line.options))]

    # --- deriving ---

    def split_offload(self, args: Sequence[str]) -> tuple[list[str], list[str]]:
        removed = self._offload_indices(args)
        return [a for i, a in enumerate(args) if i not in removed], [a for i, a in enumerate(args) if i in removed]

    def _offload_indices(self, args: Sequence[str]) -> set[int]:
        return {j for item in self._items(args) if item.dest in self.OFFLOAD_DESTS for j in range(item.start, item.end)}

    def _flags(self, removed: Sequence[str]) -> list[str]:
        """The flags among removed items (their values left out), each once."""
        flags = [i.spelt for i in self._items(removed) if i.flag]
        return list(dict.fromkeys(flags))

    def derive(self, container: Mapping[str, Any], spec: KVOffloadPolicySpec, rung: Rung) -> DerivedContainer:
        line = self.command_line(container, named=True)
        if line is None:  # adopt() refused it already
            raise ValueError(f"container {container.get('name')!r} does not launch {self.title}")
        command = list(line.command) if line.command is not None else None
        args = list(line.args) if line.args is not None else None
        if line.start is not None:
            tokens = line.tokens
            cut = {line.start + j for j in self._offload_indices(tokens[line.start :])}
            removed = [t for j, t in enumerate(tokens) if j in cut]
            size = len(command or ())
            if command is not None:
                command = [t for j, t in enumerate(command) if j not in cut]
            if args is not None:
                args = [t for j, t in enumerate(args, size) if j not in cut]
        elif args is not None:  # a script: only the args it passes on are ours to edit
            args, removed = self.split_offload(args)
        else:
            removed = []
        extra = self.offload_args(spec, rung)
        if extra:
            args = [*(args or ()), *extra]
        env, removed_env = self._derive_env(container.get("env"), spec, rung)
        return DerivedContainer(command, args, env, tuple(self._flags(removed)), removed_env)

    def _derive_env(
        self, env: Any, spec: KVOffloadPolicySpec, rung: Rung
    ) -> tuple[list[dict[str, Any]] | None, tuple[str, ...]]:
        user = [dict(e) for e in env] if isinstance(env, list) else None
        ours = self.offload_env(spec, rung)
        kept = [e for e in user or () if not str(e.get("name", "")).startswith(self.OFFLOAD_ENV_PREFIX)]
        removed = tuple(str(e.get("name")) for e in user or () if e not in kept)
        if user is None and not ours:
            return None, ()
        return [*kept, *ours], removed

    def adopted_options(self, spec: KVOffloadPolicySpec) -> list[str]:
        """The options of the container ``spec.workload`` adopted; empty without one."""
        workload = spec.workload
        if workload is None:
            return []
        containers = (workload.template.get("spec") or {}).get("containers") or []
        container = next((c for c in containers if c.get("name") == workload.container), None)
        line = self.command_line(container, named=True) if container is not None else None
        return line.options if line is not None else []

    def last_switch(self, options: Sequence[str], dest: str) -> bool:
        """Whether a boolean option is on after ``options`` (its last item wins; ``--no-x`` and ``=false`` turn it
        off)."""
        on = False
        for item in self._items(options):
            if item.dest == dest:
                negated = item.flag.startswith("--no-") or (item.value or "").lower() in ("false", "0", "no")
                on = not negated
        return on

    def code_problems(self, container: Mapping[str, Any], *, allowed: Collection[str] = ()) -> list[str]:
        line = self.command_line(container, named=True)
        if line is None:
            return []
        permitted = {option_dest(a) for a in allowed}
        table = self.table()
        found = []
        for item in self._items(line.options):
            dest = item.dest
            if dest is None or dest not in self.CODE_DESTS or dest in permitted or item.flag.startswith("--no-"):
                continue
            flag = table.flags_of(dest)[0]
            found.append(
                f"container {container.get('name')!r} sets {item.spelt}, which loads code the image allow-list does "
                f"not vouch for: {self.CODE_DESTS[dest]}; only a cluster admin can allow it "
                f"(--allowed-code-option {flag})"
            )
        return found


__all__ = ["Adopts", "CommandLine", "Item", "image_repository", "walk", "whole_number"]
