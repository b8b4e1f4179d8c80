"""Sizing as data: one reconcile cycle sizes its render input once (``policy.sized``), and a cycle over an input
already judged sizes nothing but what parsing checks. Counted by wrapping ``host_memory`` and ``build_ladder``
wherever a module of the operator holds them, over cycles of the tests' usual policy against the emulated API
server."""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from kvoffload.policy import hostmemory, ladder
from tests.controller.test_controller import (
    Clock,
    CraftedProvider,
    create_policy,
    deployment,
    new_controller,
    policy_body,
    reconcile_until,
    run_pods,
)
from tests.support.kube import EmulatedCluster

pytestmark = pytest.mark.e2e


def count_calls(monkeypatch: pytest.MonkeyPatch, *functions: Callable[..., Any]) -> Counter[str]:
    """Wrap each function in every loaded ``kvoffload`` module that holds it; the counter counts their calls."""
    calls: Counter[str] = Counter()
    for function in functions:

        def counted(*args: Any, _real: Callable[..., Any] = function, **kwargs: Any) -> Any:
            calls[_real.__name__] += 1
            return _real(*args, **kwargs)

        held = [
            (module, name)
            for module_name, module in list(sys.modules.items())
            if module_name.startswith("kvoffload")
            for name, value in list(vars(module).items())
            if value is function
        ]
        assert held, f"no module holds {function.__name__}"
        for module, name in held:
            monkeypatch.setattr(module, name, counted)
    return calls


async def test_one_cycle_sizes_its_input_once_and_a_cycle_over_the_same_input_sizes_nothing(
    kube: EmulatedCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = Clock()
    controller = new_controller(kube, CraftedProvider(), clock)
    await create_policy(kube)
    calls = count_calls(monkeypatch, hostmemory.host_memory, ladder.build_ladder)
    levels = 2  # gpu-only, cpu
    # Parsing checks that the top level fits a node (``sizing.check_fits_node``, as the webhook and the CLI do):
    # one ladder and one host memory on every cycle, before the render input is known.
    parse = 1

    # The first cycle: the input is judged (sized once: one ladder, one host memory per level), the gpu-only
    # Deployment rendered from the sized plan, the status and the metrics written from it.
    plan = await controller.reconcile(policy_body(kube))
    assert plan.status.host_memory is not None
    assert plan.status.selector == "kvoffload.io/policy=chat"
    assert calls == {"build_ladder": parse + 1, "host_memory": parse + levels}

    # The baseline goes on over the same input, and the canary starts on the cpu level (rendered, its status and
    # metrics written): nothing is sized again but the parse-time check.
    calls.clear()
    await run_pods(kube, "chat-gpu-only", 4)
    cycles = await reconcile_until(controller, kube, clock, lambda: deployment(kube, "chat-cpu") is not None)
    assert cycles > 1
    assert calls == {"build_ladder": parse * cycles, "host_memory": parse * cycles}
