"""The engine seam: the serving engine a policy names (``spec.engine``), as the rest of the operator sees it.

Rendering, sizing, the tenancy checks, analysis, rollout and the controller reach an engine only through
:func:`engine_for`; each engine's own package (``engines/vllm`` and the others) owns its
command line, environment, config files, managed flags, metric dialect, host-memory rule and the checks only it can
make, and how it reads and derives a container the team already runs (``spec.workloadRef``, on
``engines/adoption.py``).

An engine is one folder: a subpackage here whose ``command`` module exports ``ENGINE``. Adding one registers it; the
CRD then learns its name from ``api/data/engines.json`` (``scripts/engine_tables.py``).
"""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
from collections.abc import Mapping
from types import MappingProxyType

from kvoffload.api.types import KVOffloadPolicySpec
from kvoffload.engines.engine import PORT, SHM_PATH, Engine, Rung
from kvoffload.engines.options import option_dest


def _registered() -> dict[str, Engine]:
    found: dict[str, Engine] = {}
    for package in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        command = f"{__name__}.{package.name}.command"
        if package.ispkg and importlib.util.find_spec(command) is not None:
            engine: Engine = importlib.import_module(command).ENGINE
            found[engine.name] = engine
    return found


ENGINES: Mapping[str, Engine] = MappingProxyType(_registered())
"""Every engine by ``spec.engine``. The CRD learns their names and managed-flag patterns from
``api/data/engines.json``, which ``scripts/engine_tables.py`` writes from this mapping (api may not import it)."""
DEFAULT_ENGINE = "vllm"
"""``spec.engine`` where a policy names none (written to ``api/data/engines.json`` too)."""


def engine_for(spec: KVOffloadPolicySpec) -> Engine:
    """The engine ``spec.engine`` names."""
    return ENGINES[spec.engine]


__all__ = ["DEFAULT_ENGINE", "ENGINES", "PORT", "SHM_PATH", "Engine", "Rung", "engine_for", "option_dest"]
