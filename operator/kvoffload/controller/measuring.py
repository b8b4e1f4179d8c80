"""Measuring a policy: when a cycle is due an analysis, its Prometheus source and bearer token (a Secret the
operator may not read is a condition, asked again only now and then), and the preflight's and payoff's prices
from the shipped engine profiles."""

from __future__ import annotations

import logging
from dataclasses import replace
from datetime import datetime, timedelta
from functools import lru_cache

from kvoffload.analysis.hub import MeasurementHub, PrometheusSource
from kvoffload.analysis.measurements import Measurements
from kvoffload.analysis.queries import Target
from kvoffload.api.conventions import Reason
from kvoffload.api.quantity import parse_duration
from kvoffload.api.status import Verdict
from kvoffload.api.types import KVOffloadPolicy, KVOffloadPolicySpec
from kvoffload.controller.apierrors import ApiRejectedError, MissingObjectError
from kvoffload.controller.cycle import ControllerBase, Reconcile
from kvoffload.controller.gateway import PolicyRef
from kvoffload.controller.settings import SecretLocation
from kvoffload.economics.breakeven import DEFAULT_PROMPT_TOKENS, breakeven
from kvoffload.economics.enginecost import saving_us_per_token
from kvoffload.economics.profile import Profile, ProfileError
from kvoffload.economics.profileload import shipped_profile
from kvoffload.engines.dialect import confirm_dialect
from kvoffload.policy.kvshape import SizingError, kv_bytes_per_token
from kvoffload.policy.tenancy import url_under
from kvoffload.rollout.observations import TokenCheck
from kvoffload.rollout.preflight import RestorePrice

log = logging.getLogger(__name__)


class Measuring(ControllerBase):
    """The ``Controller``'s measuring: when, from which Prometheus, with which token."""

    hub: MeasurementHub
    _forbidden: dict[SecretLocation, tuple[float, TokenCheck]]

    def _analysis_due(self, policy: KVOffloadPolicy, ctx: Reconcile, generation: int | None) -> bool:
        status = ctx.status
        if status is None or status.stable is None or status.stage is None:
            return False  # a new ladder starts; there is nothing to judge yet
        if status.observed_generation != generation:
            return False  # a new spec starts a new ladder
        last = status.last_analysis
        if last is None:
            return True
        interval = parse_duration(policy.spec.analysis.interval)
        if (ctx.now - last.time).total_seconds() >= self.settings.analysis_due_fraction * interval:
            return True
        # The cycle a Fail run's sustainedFor brings (the plan's requeue_after) judges afresh, however soon after the
        # last verdict: a rollback stands on a verdict of the moment the breach fell due, not on an older one.
        since = last.failing_since
        if last.verdict is not Verdict.FAIL or since is None:
            return False
        due = since + timedelta(seconds=parse_duration(policy.spec.analysis.sustained_for))
        return last.time < due <= ctx.now

    async def _measure(
        self, target: Target, spec: KVOffloadPolicySpec, ref: PolicyRef, now: datetime, *, patience: float
    ) -> tuple[Measurements, TokenCheck | None, PrometheusSource | None]:
        """This cycle's measurements, in the dialect confirmed against the series Prometheus holds, and how
        reading the bearer token went; a token that cannot be read makes them inconclusive, with the reason.
        ``patience``: how long the request may wait for others to share its batch (``MeasurementHub.measure``).
        Also the Prometheus source asked (None when the token could not be read), for the custom metrics."""
        token, check = await self._bearer_token(spec, ref)
        if check is not None and check.problem is not None:
            return Measurements(canary=None, stable=None, error=check.message), check, None
        connection = self.settings.prometheus_connection if self._token_may_go(spec) else None
        source = PrometheusSource(self.settings.prometheus_url or spec.prometheus.url, token, connection)
        self.hub.assign(ref.uid, source)  # the source it asked before, now asked by no one, is closed
        present = await self.hub.present_names(source, now.timestamp())
        target = replace(target, dialect=confirm_dialect(target.dialect, present))
        return await self.hub.measure(target, source, patience=patience), check, source

    async def _bearer_token(self, spec: KVOffloadPolicySpec, ref: PolicyRef) -> tuple[str | None, TokenCheck | None]:
        """The policy's own token Secret, else the operator's; (None, None) when neither is set.

        A Secret the operator may not read (403) is a condition on the policy, not an API error to retry:
        only RBAC can change it, so it is logged once and asked for again every ``forbidden_retry_seconds``.
        """
        own = spec.prometheus.bearer_token_secret
        if own is not None:
            where, field_path = SecretLocation(ref.namespace, own.name, own.key), "spec.prometheus.bearerTokenSecret"
        elif self.settings.prometheus_token is not None and self._token_may_go(spec):
            where, field_path = self.settings.prometheus_token, "the operator's --prometheus-token-secret"
        else:
            return None, None
        refused = self._forbidden.get(where)
        if refused is not None and self._monotonic() - refused[0] < self.settings.forbidden_retry_seconds:
            return None, refused[1]

        async def read() -> str | TokenCheck:
            try:
                return await self.gateway.read_secret(where.namespace, where.name, where.key)
            except ApiRejectedError as exc:
                if exc.status != 403:
                    raise
                self.metrics.count_api_error("read_secret", exc)
                hint = (
                    f"grant it get on secrets in namespace {where.namespace} (chart value prometheusAuth.policySecrets)"
                    if own is not None
                    else "check the operator's Role in its own namespace"
                )
                return TokenCheck(
                    Reason.SECRET_FORBIDDEN,
                    f"{field_path}: the operator's service account may not get Secret {where}: {hint}",
                )

        try:
            got = await self._api("read_secret", read(), ref)
        except MissingObjectError as exc:
            return None, TokenCheck(Reason.SECRET_NOT_FOUND, f"{field_path}: {exc}")
        if isinstance(got, TokenCheck):
            if where not in self._forbidden:
                log.warning(
                    "%s: %s (403 Forbidden; asked again every %.0fs)",
                    ref,
                    got.message,
                    self.settings.forbidden_retry_seconds,
                )
            self._forbidden[where] = (self._monotonic(), got)
            return None, got
        if self._forbidden.pop(where, None) is not None:
            log.info("%s: Secret %s can be read again", ref, where)
        return str(got), TokenCheck(None)

    def _token_may_go(self, spec: KVOffloadPolicySpec) -> bool:
        """Whether the operator's own token may go to this policy's Prometheus: its fixed one, or a URL the admin
        allowed. ``parse_policy`` refuses the rest as Invalid already; this keeps the token home regardless."""
        if self.settings.prometheus_url is not None:
            return True
        return any(url_under(spec.prometheus.url, p) for p in self.settings.tenancy.prometheus_url_prefixes)


@lru_cache(maxsize=32)
def _profile(gpu_class: str) -> Profile:
    return shipped_profile(gpu_class)


def restore_price(spec: KVOffloadPolicySpec, prompt_tokens: int) -> RestorePrice:
    """The preflight's price: recompute against restore of a ``prompt_tokens`` prompt, by ``economics.breakeven``
    on the shipped profile of the policy's GPU class and the KV bytes per token ``kvoffload plan`` prices with.

    A class without a profile, or a model without a prefill curve in it, gives the reason instead: the
    preflight then leaves that rule unjudged."""
    try:
        found = breakeven(_profile(spec.gpu.class_), spec.model.name, kv_bytes_per_token(spec), prompt_tokens)
    except (ProfileError, SizingError) as exc:
        return RestorePrice(prompt_tokens, error=str(exc))
    return RestorePrice(
        prompt_tokens,
        recompute_ms=found.recompute_ms,
        restore_ms=found.restore_ms,
        profile=found.profile,
        profile_kind=found.profile_kind,
    )


def forecast_saving(spec: KVOffloadPolicySpec) -> float | None:
    """The forecast saving of a restored token (µs) on the class's engine profile, for the live payoff's row: at
    the preflight's prompt when it names one, else the seed's 1,480 tokens."""
    preflight = spec.rollout.preflight
    tokens = preflight.prompt_tokens if preflight is not None and preflight.prompt_tokens else DEFAULT_PROMPT_TOKENS
    return saving_us_per_token(spec.gpu.class_, spec, tokens)
