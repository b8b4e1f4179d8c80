"""Hatch build hook: a wheel that carries the lab also carries the demo's default policy.

examples/demo-two-tier.yaml stays the one source. The operator image builds its wheel from a
context without ``operator/kvoffload/lab`` (see .dockerignore), and then ships neither.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

DEMO_POLICY = "examples/demo-two-tier.yaml"
PACKAGED_AS = "kvoffload/lab/data/demo-policy.yaml"


class LabDataHook(BuildHookInterface):  # type: ignore[type-arg]
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if self.target_name == "wheel" and (Path(self.root) / "operator" / "kvoffload" / "lab").is_dir():
            build_data["force_include"][str(Path(self.root) / DEMO_POLICY)] = PACKAGED_AS
