"""A vLLM engine container as ``kvoffload emulate`` options: the emulator takes ``vllm serve``'s own flags, so the
translation is only finding them after any shell wrapper."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

from kvoffload.engines.vllm.command import ENGINE


class VLLMArgsError(ValueError):
    """A container whose ``vllm serve`` arguments cannot be told."""


class VLLMSpeaker:
    """``vllm serve`` as the emulator runs it: its arguments as they are, the emulator speaking vLLM."""

    name: Final = "vllm"
    title: Final = "vLLM"
    metrics_path: Final = ENGINE.metrics_path

    def emulate_args(self, container: Mapping[str, Any], files: Mapping[str, str]) -> list[str]:
        """The ``vllm serve`` arguments of an engine container, after any shell wrapper: the emulator's options.

        Understood forms: no ``command`` (the vLLM image's entrypoint is ``vllm serve``),
        ``command: [vllm, serve, ...]``, and ``command: [sh, -c, '...; exec vllm serve "$@"', NAME]``
        with the arguments in ``args`` (``$0`` is NAME, ``$@`` the rest), as kvoffload renders it.
        vLLM reads no config file the operator mounts, so ``files`` is not read.
        """
        command = [str(c) for c in container.get("command") or []]
        args = [str(a) for a in container.get("args") or []]
        if not command:
            return args[1:] if args[:1] == ["serve"] else args
        if Path(command[0]).name == "vllm" and command[1:2] == ["serve"]:
            return [*command[2:], *args]
        if Path(command[0]).name in ("sh", "bash") and command[1:2] == ["-c"] and len(command) >= 3:
            script = command[2]
            if 'vllm serve "$@"' in script:
                positional = [*command[3:], *args]
                return positional[1:]  # positional[0] is $0
        raise VLLMArgsError(f"cannot tell the vllm serve arguments of command {command!r}")


SPEAKER: Final = VLLMSpeaker()
