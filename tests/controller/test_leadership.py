"""Leader election over a Lease (``controller/leadership.py``), two candidates in one process on the emulated
API; the failover of two ``kvoffload run`` processes on both APIs is in ``tests/lab/test_e2e.py``."""

from __future__ import annotations

import asyncio
import logging

import kubernetes
import pytest

from kvoffload.controller.leadership import Leadership, LeaseSettings
from kvoffload_lab.promserver import free_port
from tests.support.kube import EmulatedCluster, kube, wait_for

__all__ = ("kube",)


def test_the_timing_follows_the_lease_duration_and_bad_timing_names_the_rule() -> None:
    settings = LeaseSettings.for_duration("ops", 8)
    assert (settings.lease_duration, settings.renew_deadline, settings.retry_period) == (8, 5, 1)
    assert settings.takeover_bound == 10
    assert LeaseSettings.for_duration("ops", 3).renew_deadline == 2
    with pytest.raises(ValueError, match=r"duration > renew deadline > 1\.2 × retry period"):
        LeaseSettings("ops", lease_duration=5, renew_deadline=5)


def test_each_candidate_has_its_own_identity_named_by_the_pod(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POD_NAME", "kvoffload-7d9f-abcde")
    first, second = LeaseSettings("ops"), LeaseSettings("ops")
    assert first.identity.startswith("kvoffload-7d9f-abcde_")
    assert first.identity != second.identity  # a restarted container is not the leader it replaces


def lease(kube: EmulatedCluster) -> dict[str, object]:
    return (kube.emulator.read_object("coordination.k8s.io/v1", "Lease", "ops", "kvoffload-leader") or {}).get(
        "spec"
    ) or {}


async def test_one_candidate_leads_and_hands_the_lease_to_the_other_when_released(kube: EmulatedCluster) -> None:
    lost: list[str] = []
    first = Leadership(LeaseSettings("ops", identity="a"), kube.api_client, on_lost=lambda: lost.append("a"))
    second = Leadership(LeaseSettings("ops", identity="b"), kube.api_client, on_lost=lambda: lost.append("b"))
    first.start()
    await asyncio.wait_for(first.wait_leading(), 10)
    second.start()
    await asyncio.sleep(2.5)  # two retry periods: b has looked, and found a's Lease renewed
    assert not second.leading
    assert lease(kube)["holderIdentity"] == "a"
    assert lease(kube)["leaseDurationSeconds"] == 8

    assert await kube.call(first.release)  # blocking calls, to the emulator this loop serves
    await asyncio.wait_for(second.wait_leading(), 5)  # at b's next try, not after a's 8 s
    assert lease(kube)["holderIdentity"] == "b"
    await asyncio.sleep(1.5)
    assert lease(kube)["holderIdentity"] == "b", "a released Lease is not renewed again"
    assert not await kube.call(first.release), "not a's to hand back any more"
    assert lost == []
    await kube.call(second.release)
    await wait_for(lambda: not lease(kube).get("holderIdentity"), "b's release", 5)


async def test_an_unreachable_api_server_is_retried_and_said_once_not_a_dead_election_thread(
    caplog: pytest.LogCaptureFixture,
) -> None:
    configuration = kubernetes.client.Configuration()
    configuration.host = f"http://127.0.0.1:{free_port()}"  # nothing listens
    configuration.retries = 0
    candidate = Leadership(LeaseSettings("ops", identity="a"), kubernetes.client.ApiClient(configuration), lambda: None)
    with caplog.at_level(logging.WARNING, logger="kvoffload.controller.leadership"):
        candidate.start()
        await asyncio.sleep(3.5)  # three tries
        assert candidate._thread is not None
        assert candidate._thread.is_alive()
        assert not candidate.leading
        warnings = [record.getMessage() for record in caplog.records]
        assert len(warnings) == 1, warnings
        assert warnings[0].startswith("cannot read the Lease ops/kvoffload-leader (retrying):")
        assert not await asyncio.to_thread(candidate.release)  # nothing to hand back; the thread ends
        await asyncio.sleep(1.5)
        assert not candidate._thread.is_alive()
