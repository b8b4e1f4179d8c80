"""Judging a policy: what is left to check of a parsed policy once its ``model.configMap`` is read
(``judge_resolved``), and the guard that turns a failure of ours into a PolicyError (``judging``). No I/O: the
reconcile cycle and the admission webhook both run them."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

from kvoffload.analysis.dialects import Dialect, policy_dialect
from kvoffload.api.errors import FieldError, PolicyError
from kvoffload.api.types import KVOffloadPolicy
from kvoffload.policy.engine_config import config_hash
from kvoffload.policy.hostmemory import host_memory
from kvoffload.policy.kvshape import SizingError, tier_capacity_tokens
from kvoffload.policy.ladder import build_ladder
from kvoffload.policy.renderable import check_renderable

log = logging.getLogger(__name__)


@contextlib.contextmanager
def judging(who: object) -> Iterator[None]:
    """Judge a policy inside: a failure of ours (a bug, not a bad field) becomes a PolicyError naming
    ``(object)``, logged with ``who``, so the policy goes Invalid once and the webhook refuses it: never a
    crash loop, never an answer of 500."""
    try:
        yield
    except PolicyError:
        raise
    except Exception as exc:
        log.exception("%s: the policy could not be judged", who)
        raise PolicyError([FieldError("(object)", f"the operator could not judge this policy: {exc!r}")]) from None


def judge_resolved(policy: KVOffloadPolicy) -> tuple[Dialect, dict[int, str]]:
    """What is left to judge of a parsed policy (``parse_policy``: the models and ``check_policy``)
    once its ``model.configMap`` is read: that it renders, its vLLM version, and that every level
    can be sized. Returns the metric dialect and the config hash of each ladder level (by index);
    raises PolicyError naming the fields. No I/O: the admission webhook runs it too."""
    problems = check_renderable(policy)
    if problems:
        raise PolicyError(problems)
    try:
        dialect = policy_dialect(policy.spec)
    except ValueError as exc:
        raise PolicyError([FieldError("spec.model.vllmVersion", str(exc))]) from None
    hashes: dict[int, str] = {}
    try:
        for level in build_ladder(policy.spec):
            hashes[level.index] = config_hash(policy, level)
            host_memory(policy.spec, level)
            tier_capacity_tokens(policy.spec, level)
    except SizingError as exc:
        raise PolicyError([FieldError(exc.path, str(exc).removeprefix(f"{exc.path}: "))]) from None
    return dialect, hashes
