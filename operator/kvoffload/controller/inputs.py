"""A policy's input as one cycle reads it: the policy parsed, its ``spec.model.configMap`` and
``spec.workloadRef`` read through the gateway, and what the render input gives (its dialect and sized plan),
judged once per input (``Judged``) while the input stays the same."""

from __future__ import annotations

from dataclasses import dataclass

from kvoffload.api.errors import FieldError, PolicyError
from kvoffload.api.types import KVOffloadPolicy
from kvoffload.controller.apierrors import MissingObjectError
from kvoffload.controller.cycle import ControllerBase, Reconcile
from kvoffload.controller.judging import judge_resolved, judging
from kvoffload.controller.takeover import observed, taker_problem
from kvoffload.engines.dialect import Dialect
from kvoffload.policy.adoptwarnings import workload_warnings
from kvoffload.policy.catalog import ConfigError, architecture_from_configmap_data
from kvoffload.policy.kvshape import with_architecture
from kvoffload.policy.loading import parse_policy
from kvoffload.policy.sized import Sized
from kvoffload.policy.templating import render_input
from kvoffload.policy.tenancy import check_tenancy
from kvoffload.policy.workload import adopt


@dataclass(frozen=True)
class Judged:
    """What one policy's render input (``render_input``) was judged to give: its metric dialect and its sized plan.
    Pure functions of the input, so they are worked out once per input."""

    key: str
    dialect: Dialect
    sized: Sized


class InputReader(ControllerBase):
    """The ``Controller``'s reading and judging of a policy's input."""

    _judged: dict[str, Judged]
    """policy uid -> what its render input was judged to give, while the input stays the same."""

    async def _parse(self, ctx: Reconcile) -> tuple[KVOffloadPolicy, Judged]:
        """The policy, with a ConfigMap architecture resolved, and what its input gives (judged once per input:
        ``judge_resolved``: its dialect and sized plan); PolicyError names fields."""
        obj = {k: v for k, v in ctx.body.items() if k != "status"}  # status is ours, not input
        with judging(ctx.ref):
            policy = parse_policy(obj, f"{ctx.ref.namespace}/{ctx.ref.name}", self.settings.judged_tenancy)
        spec = policy.spec
        ref = spec.model.config_map
        if ref is not None and spec.model.architecture is None:
            path = "spec.model.configMap"
            try:
                text = await self._api(
                    "read_configmap", self.gateway.read_configmap(ctx.ref.namespace, ref.name, ref.key), ctx.ref
                )
                arch = architecture_from_configmap_data({ref.key: text}, ref.key)
            except MissingObjectError as exc:
                raise PolicyError([FieldError(path, str(exc))]) from None
            except ConfigError as exc:
                raise PolicyError([FieldError(path, f"ConfigMap {ref.name!r} key {ref.key!r}: {exc}")]) from None
            policy = policy.model_copy(update={"spec": with_architecture(spec, arch)})
        if spec.workload_ref is not None:
            policy = await self._adopted(ctx, policy)
        key = render_input(policy)
        known = self._judged.get(ctx.ref.uid)
        if known is None or known.key != key:
            with judging(ctx.ref):
                known = Judged(key, *judge_resolved(policy))
            self._judged[ctx.ref.uid] = known
            for warning in workload_warnings(policy, known.sized):  # once per input: what the derived levels change
                await self.gateway.emit_event(ctx.ref, "Warning", "WorkloadAdjusted", warning)
        return policy, known

    async def _adopted(self, ctx: Reconcile, policy: KVOffloadPolicy) -> KVOffloadPolicy:
        """The policy with the Deployment its spec.workloadRef names read in (``ctx.workload`` too)."""
        ref = policy.spec.workload_ref
        assert ref is not None
        path = "spec.workloadRef.name"
        try:
            deployment = await self._api(
                "read_deployment", self.gateway.read_deployment(ctx.ref.namespace, ref.name), ctx.ref
            )
        except MissingObjectError as exc:
            raise PolicyError([FieldError(path, str(exc))]) from None
        if (problem := taker_problem(deployment, ctx.ref.name)) is not None:
            raise PolicyError([FieldError(path, problem)])
        with judging(ctx.ref):
            policy = adopt(policy, deployment)
            # The admin's allow-lists judge the referenced pod as they judge a rendered one.
            if errors := check_tenancy(policy, self.settings.judged_tenancy):
                raise PolicyError(errors)
        ctx.workload = observed(policy, deployment)
        return policy
