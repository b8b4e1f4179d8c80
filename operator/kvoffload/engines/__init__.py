"""The engine seam: the serving engine a policy names (``spec.engine``), as the rest of the operator sees it.

Rendering, sizing, the tenancy checks, analysis, rollout and the controller reach an engine only through
:func:`engine_for`; each engine's own package (``engines/vllm``, ``engines/sglang``) owns its command
line, environment, managed flags and the checks only it can make, and how it reads and derives a container the
team already runs (``spec.workloadRef``, on ``engines/adoption.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from kvoffload.api.serving import EngineName
from kvoffload.api.types import KVOffloadPolicySpec
from kvoffload.engines.engine import PORT, SHM_PATH, Engine, Rung
from kvoffload.engines.sglang.command import ENGINE as _SGLANG
from kvoffload.engines.vllm.command import ENGINE as _VLLM

ENGINES: Mapping[EngineName, Engine] = MappingProxyType({EngineName.VLLM: _VLLM, EngineName.SGLANG: _SGLANG})


def engine_for(spec: KVOffloadPolicySpec) -> Engine:
    """The engine ``spec.engine`` names."""
    return ENGINES[spec.engine]


__all__ = ["ENGINES", "PORT", "SHM_PATH", "Engine", "Rung", "engine_for"]
