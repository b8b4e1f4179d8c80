"""An engine that reads its options from a config file, for the tests of the ConfigMap rendering and writing.

It is vLLM in everything but ``config_files``, which gives one YAML file per level holding the level's CPU tier
and a ``note`` the test sets; it stands in for ``spec.engine`` through ``kvoffload.engines.ENGINES``, which
``engine_for`` reads at every call.
"""

from __future__ import annotations

from types import MappingProxyType

import pytest

from kvoffload import engines
from kvoffload.api.types import KVOffloadPolicy
from kvoffload.engines.engine import Rung
from kvoffload.engines.vllm.command import VLLM

FILE = "options.yaml"


class FilesEngine(VLLM):
    """vLLM, plus one config file per level."""

    note: str | None = "first"
    """What the file says besides the tier; None: no file at all (vLLM as it is)."""

    def config_files(self, policy: KVOffloadPolicy, rung: Rung) -> dict[str, str]:
        if self.note is None:
            return {}
        cpu = rung.cpu_bytes if rung.cpu_bytes is not None else 0
        return {FILE: f"# {policy.metadata.name}\nhost_cache_size: {cpu}\nnote: {self.note}\n"}


@pytest.fixture
def files_engine(monkeypatch: pytest.MonkeyPatch) -> FilesEngine:
    """Every policy naming vLLM gets the files engine while the test runs."""
    fake = FilesEngine()
    name = VLLM().name
    monkeypatch.setattr(engines, "ENGINES", MappingProxyType({**engines.ENGINES, name: fake}))
    return fake
