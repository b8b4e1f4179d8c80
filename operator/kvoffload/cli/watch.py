"""What ``kvoffload status NAME --watch`` decides and prints: pure, over policy objects as the API server serves them.

A watch ends when the policy comes to rest in a phase that no longer moves by itself, with the exit code
:data:`EXIT_CODES` gives it; until then it prints one :class:`Progress` line each time the phase, the
level, the step or the reason changes. A status written for an older generation than the spec's never
ends a watch (the operator has not acted on the new spec yet), as Argo CD's health check and kstatus
read it too.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

from kvoffload.api.conventions import (
    ANALYSIS_INCONCLUSIVE,
    DEGRADED,
    INVALID,
    OFFLOAD_WILL_NOT_PAY,
    PAUSED,
    PROGRESSING,
    READY,
)
from kvoffload.api.status import KVOffloadPolicyStatus, Phase
from kvoffload.cli.common import EXIT_FAIL, EXIT_INCONCLUSIVE, EXIT_OK, dump, resource_name
from kvoffload.cli.statusview import promotion_steps, step_text
from kvoffload.rollout import conditions as cond

EXIT_CODES: Mapping[Phase, int] = {
    Phase.STABLE: EXIT_OK,
    Phase.ROLLED_BACK: EXIT_FAIL,
    Phase.INVALID: EXIT_FAIL,
    Phase.HELD: EXIT_FAIL,
    Phase.PAUSED: EXIT_INCONCLUSIVE,
}
"""The phases that end a watch, and its exit code in each. Held goes with RolledBack and Invalid: the three are
``Stalled`` (the climb cannot go on by itself; Argo CD reads them Degraded). Every other phase (Pending,
Baseline, Canary, Promoting) is still moving: the watch goes on."""

NEXT_STEP: Mapping[Phase, str] = {
    Phase.STABLE: "the top level runs on every replica",
    Phase.ROLLED_BACK: "a rollback or an abort halted the ladder; `{me} retry {name} -n {namespace}` starts it again",
    Phase.INVALID: "the spec fails validation; fix it and apply it again",
    Phase.HELD: "the preflight found that offload cannot pay; `{me} retry {name} -n {namespace}` judges it again",
    Phase.PAUSED: "nothing advances until `{me} resume {name} -n {namespace}`",
}
"""What a watch that ended in each phase says next (str.format with ``me``, ``name`` and ``namespace``)."""

OBSERVE_ONLY = "observe-only: nothing was applied"
"""What every line of an observe-only policy's watch says: its ladder climbs in status alone."""

OBSERVE_ONLY_STABLE = (
    "the ladder passed over the observed fleet, in status only: no pod runs its top level; "
    "set spec.rollout.observeOnly to false to apply it"
)
"""What a watch that ended in Stable says next when the policy only observes. The exit code stays 0 (Stable is
where an observe-only climb ends), so a pipeline that must know reads this line or ``observeOnly`` in -o json."""

REASON_OF: Mapping[Phase, tuple[str, ...]] = {
    Phase.INVALID: (INVALID,),
    Phase.PAUSED: (PAUSED, ANALYSIS_INCONCLUSIVE),
    Phase.ROLLED_BACK: (DEGRADED,),
    Phase.HELD: (OFFLOAD_WILL_NOT_PAY,),
    Phase.BASELINE: (PROGRESSING,),
    Phase.CANARY: (PROGRESSING,),
    Phase.PROMOTING: (PROGRESSING,),
    Phase.STABLE: (READY,),
}
"""Whose reason a phase shows: the first of these conditions that is True (the one that explains the phase)."""


@dataclass(frozen=True)
class Progress:
    """Where one policy stands, as one line of a watch."""

    namespace: str
    name: str
    phase: str
    level: int | None
    level_name: str
    step: str
    reason: str
    message: str
    generation: int | None
    observed_generation: int | None
    observe_only: bool = False
    """Whether the policy only observes (``status.observe`` set): nothing it climbs is applied."""

    @property
    def lagging(self) -> bool:
        """Whether the status is for an older spec than the one stored (the operator has not acted on it yet)."""
        return self.generation is not None and (
            self.observed_generation is None or self.observed_generation < self.generation
        )

    def key(self) -> tuple[Any, ...]:
        """What a new line is printed for: the message alone changes every cycle, and is not in it."""
        return (self.phase, self.level, self.step, self.reason, self.lagging, self.observe_only)

    def line(self, now: datetime) -> str:
        level = "-" if self.level is None else f"{self.level} {self.level_name}"
        text = f"{now:%H:%M:%SZ}  {self.namespace}/{self.name}  {self.phase}  level {level}  step {self.step}"
        text += f"  reason {self.reason or '-'}"
        if self.observe_only:
            text += f"  ({OBSERVE_ONLY})"
        if self.lagging and self.phase != Phase.PENDING:
            text += (
                f"  (waiting for the operator to act on generation {self.generation}; "
                f"the status is for {self.observed_generation or 0})"
            )
        return f"{text}: {self.message}" if self.message else text

    def document(self, now: datetime) -> dict[str, Any]:
        """The line's fields as -o json and -o yaml print them."""
        doc = {"time": now.strftime("%Y-%m-%dT%H:%M:%SZ"), **asdict(self), "lagging": self.lagging}
        keys = {"level_name": "levelName", "observed_generation": "observedGeneration", "observe_only": "observeOnly"}
        return {keys.get(k, k): v for k, v in doc.items()}

    def json_line(self, now: datetime) -> str:
        return json.dumps(self.document(now), ensure_ascii=False)


def change(state: Progress, output: str, now: datetime) -> str:
    """What a watch prints for one change in each -o format: a line (table, wide), a JSON object on one line
    (json), a YAML document after ``---`` (yaml, as ``kubectl get -w -o yaml`` separates them), or the policy's
    name (name)."""
    if output == "json":
        return state.json_line(now)
    if output == "yaml":
        return "---\n" + dump(state.document(now), "yaml")
    if output == "name":
        return resource_name(state.name)
    return state.line(now)


def progress(policy_obj: Mapping[str, Any]) -> Progress:
    """The policy's progress; pydantic's ValidationError when its status does not fit the model."""
    meta = policy_obj.get("metadata") or {}
    raw = policy_obj.get("status") or {}
    status = KVOffloadPolicyStatus.model_validate(raw)
    generation = meta.get("generation")
    observed = status.observed_generation
    if "phase" not in raw:  # the CRD's default status: the operator has written nothing yet
        return Progress(
            meta.get("namespace", ""), meta.get("name", ""), Phase.PENDING.value, None, "", "-",
            "", "the operator has not acted on it yet", generation, observed,
        )  # fmt: skip
    stage = status.stage
    reason = next(
        (
            c.reason
            for t in REASON_OF.get(status.phase, ())
            if (c := cond.find(status.conditions, t)) and c.status == "True"
        ),
        "",
    )
    return Progress(
        namespace=meta.get("namespace", ""),
        name=meta.get("name", ""),
        phase=status.phase.value,
        level=None if stage is None else stage.index,
        level_name="" if stage is None else stage.name,
        step=step_text(status, promotion_steps(policy_obj.get("spec") or {})),
        reason=reason,
        message=status.message,
        generation=generation,
        observed_generation=observed,
        observe_only=status.observe is not None,
    )


def outcome(state: Progress) -> int | None:
    """The exit code a watch ends with at this progress; None while the policy still moves (or lags its spec)."""
    if state.lagging:
        return None
    return EXIT_CODES.get(Phase(state.phase))


def final_line(state: Progress, code: int, me: str) -> str:
    """What a watch that ended prints last (on stderr): the phase, what comes next, and the exit code. An
    observe-only policy says so, Stable above all: its exit 0 means the ladder would pass, not that it runs."""
    phase = Phase(state.phase)
    then = NEXT_STEP[phase]
    where = phase.value
    if state.observe_only:
        where += f" ({OBSERVE_ONLY})"
        if phase is Phase.STABLE:
            then = OBSERVE_ONLY_STABLE
    then = then.format(me=me, name=state.name, namespace=state.namespace)
    return f"{me} status: {state.namespace}/{state.name} is {where}: {then} (exit {code})"
