"""Judging a policy: what is left to check of a parsed policy once its ``model.configMap`` is read
(``judge_resolved``), and the guard that turns a failure of ours into a PolicyError (``judging``). No I/O: the
reconcile cycle and the admission webhook both run them."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

from kvoffload.api.errors import FieldError, PolicyError
from kvoffload.api.types import KVOffloadPolicy
from kvoffload.engines import engine_for
from kvoffload.engines.dialect import Dialect
from kvoffload.policy.kvshape import SizingError
from kvoffload.policy.renderable import check_renderable
from kvoffload.policy.sized import Sized, size_policy

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


def judge_resolved(policy: KVOffloadPolicy) -> tuple[Dialect, Sized]:
    """What is left to judge of a parsed policy (``parse_policy``: the models and ``check_policy``)
    once its ``model.configMap`` is read: that it renders, its vLLM version, and that every level
    can be sized. Returns the metric dialect and the sized plan (``policy.sized``: every ladder level's host
    memory, capacity, deadlines and config hash); raises PolicyError naming the fields. No I/O: the admission
    webhook runs it too."""
    problems = check_renderable(policy)
    if problems:
        raise PolicyError(problems)
    dialect = engine_for(policy.spec).dialect(policy.spec)  # a PolicyError names the field it cannot read
    try:
        sized = size_policy(policy)
    except SizingError as exc:
        raise PolicyError([FieldError(exc.path, str(exc).removeprefix(f"{exc.path}: "))]) from None
    return dialect, sized
