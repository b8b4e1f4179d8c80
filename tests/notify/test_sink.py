"""Delivery to real local HTTP receivers: each event kind arrives as documented JSON; a receiver that is down is
retried until it comes up, or given up after the cap and counted; a slow one times out and is retried; a full
queue lets its oldest go, counted; and none of it ever holds up the caller.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from kvoffload.api.notifications import NotificationEvent, NotificationsSpec
from kvoffload.notify.config import NotificationsConfig, SinkConfig
from kvoffload.notify.derive import Notice
from kvoffload.notify.notifier import Notifier
from kvoffload.notify.sink import Delivery, Result, WebhookSink
from tests.support.receiver import Receiver, free_port

T0 = datetime(2026, 12, 5, 19, 0, tzinfo=UTC)
FAST = {"backoffSeconds": 0.05, "maxBackoffSeconds": 0.2, "timeoutSeconds": 2.0}


class Tally:
    """What the sinks report: each notification's result and each retry, as the operator's metrics count them."""

    def __init__(self) -> None:
        self.results: Counter[tuple[str, Result]] = Counter()
        self.retries: Counter[str] = Counter()
        self.retried = threading.Event()
        self._done = threading.Condition()

    def result(self, sink: str, result: Result) -> None:
        with self._done:
            self.results[(sink, result)] += 1
            self._done.notify_all()

    def retry(self, sink: str) -> None:
        self.retries[sink] += 1
        self.retried.set()

    def wait(self, sink: str, result: Result, count: int = 1, timeout: float = 10.0) -> None:
        with self._done:
            ok = self._done.wait_for(lambda: self.results[(sink, result)] >= count, timeout)
        assert ok, f"{sink}: no {count} {result} in {timeout}s: {dict(self.results)}"


def sink(url: str | None, tally: Tally, **overrides: Any) -> WebhookSink:
    where = {"url": url} if url is not None else {}
    made = WebhookSink(
        SinkConfig.model_validate({"name": "team", **where, **FAST, **overrides}), tally.result, tally.retry
    )
    made.start()
    return made


def delivery(n: int) -> Delivery:
    return Delivery(json.dumps({"n": n}).encode(), f"notification {n}")


def notice(event: NotificationEvent, **changes: Any) -> Notice:
    fields: dict[str, Any] = {
        "namespace": "llm",
        "name": "chat",
        "event": event,
        "time": T0,
        "decision": "Rollback",
        "reason": "AnalysisFailed",
        "message": "cpu canary p99 TTFT 2.50s over the 1.50s budget",
        "phase": "RolledBack",
        "level": "gpu-only",
        "step": 0,
        "stable": "gpu-only",
        "canary": None,
    }
    return Notice(**{**fields, **changes})


@pytest.fixture
def tally() -> Tally:
    return Tally()


def test_every_event_kind_reaches_a_real_receiver_as_the_generic_json(tally: Tally) -> None:
    with Receiver() as receiver:
        config = NotificationsConfig.model_validate(
            {
                "sinks": [{"name": "team", "url": receiver.url}],
                "link": "https://grafana.example/d/kv?ns={namespace}&p={name}",
            }
        )
        notifier = Notifier(config, tally.result, tally.retry)
        notifier.start()
        sent = [notice(event) for event in NotificationEvent]
        assert notifier.send(NotificationsSpec(sinks=["team"]), sent) == len(sent)
        bodies = receiver.wait_for(len(sent))
        notifier.close()
    assert [b["event"] for b in bodies] == [e.value for e in NotificationEvent]
    first = bodies[0]
    assert first["policy"] == {"namespace": "llm", "name": "chat"}
    assert first["link"] == "https://grafana.example/d/kv?ns=llm&p=chat"
    assert first["time"] == "2026-12-05T19:00:00Z"
    assert (first["level"], first["step"], first["reason"]) == ("gpu-only", 0, "AnalysisFailed")
    assert {h["Content-Type"] for h in receiver.headers} == {"application/json"}
    assert tally.results[("team", Result.DELIVERED)] == len(sent)


def test_a_policy_gets_only_the_events_and_the_sinks_it_chose(tally: Tally) -> None:
    with Receiver() as team, Receiver() as other:
        config = NotificationsConfig.model_validate(
            {"sinks": [{"name": "team", "url": team.url}, {"name": "other", "url": other.url}]}
        )
        notifier = Notifier(config, tally.result, tally.retry)
        notifier.start()
        chosen = NotificationsSpec(sinks=["team"], events=[NotificationEvent.ROLLED_BACK])
        queued = notifier.send(chosen, [notice(NotificationEvent.PROMOTED), notice(NotificationEvent.ROLLED_BACK)])
        notifier.close()
    assert queued == 1
    assert [b["event"] for b in team.bodies] == ["RolledBack"]
    assert other.arrived == 0


def test_a_sink_is_posted_to_only_for_the_namespaces_it_is_granted(tally: Tally) -> None:
    with Receiver() as receiver:
        config = NotificationsConfig.model_validate(
            {"sinks": [{"name": "team", "url": receiver.url, "namespaces": ["team-*"]}]}
        )
        notifier = Notifier(config, tally.result, tally.retry)
        notifier.start()
        chosen = NotificationsSpec(sinks=["team"])
        assert notifier.send(chosen, [notice(NotificationEvent.ROLLED_BACK, namespace="llm")]) == 0
        assert notifier.send(chosen, [notice(NotificationEvent.ROLLED_BACK, namespace="team-a")]) == 1
        (body,) = receiver.wait_for(1)
        notifier.close()
    assert body["policy"] == {"namespace": "team-a", "name": "chat"}


def test_a_slack_sink_gets_text_and_blocks(tally: Tally) -> None:
    with Receiver() as receiver:
        config = NotificationsConfig.model_validate(
            {"sinks": [{"name": "chat-ops", "url": receiver.url, "format": "slack"}]}
        )
        notifier = Notifier(config, tally.result, tally.retry)
        notifier.start()
        notifier.send(NotificationsSpec(sinks=["chat-ops"]), [notice(NotificationEvent.ROLLED_BACK)])
        (body,) = receiver.wait_for(1)
        notifier.close()
    assert body["text"] == ":rotating_light: KVOffloadPolicy llm/chat rolled back at gpu-only (AnalysisFailed)"
    assert [b["type"] for b in body["blocks"]] == ["section", "section", "context"]
    assert "2.50s over the 1.50s budget" in body["blocks"][1]["text"]["text"]


def test_a_receiver_that_is_down_is_retried_until_it_comes_up(tally: Tally) -> None:
    port = free_port()  # nothing listens: connection refused
    team = sink(f"http://127.0.0.1:{port}/hook", tally, maxAttempts=20)
    team.put(delivery(1))
    assert tally.retried.wait(10), "no retry after a refused connection"
    with Receiver(port=port) as receiver:
        tally.wait("team", Result.DELIVERED)
        assert receiver.bodies == [{"n": 1}]
    team.close(1.0)
    assert tally.retries["team"] >= 1
    assert tally.results == Counter({("team", Result.DELIVERED): 1})


def test_a_receiver_that_never_comes_up_is_given_up_after_the_cap_and_counted(tally: Tally) -> None:
    team = sink(f"http://127.0.0.1:{free_port()}/hook", tally, maxAttempts=3)
    team.put(delivery(1))
    team.put(delivery(2))
    tally.wait("team", Result.FAILED, count=2)
    team.close(1.0)
    assert tally.retries["team"] == 4  # two failed attempts before the third, for each
    assert tally.results == Counter({("team", Result.FAILED): 2})


def test_a_receiver_slower_than_the_timeout_is_retried_and_never_holds_up_the_caller(tally: Tally) -> None:
    with Receiver(hold_first=1) as receiver:
        team = sink(receiver.url, tally, timeoutSeconds=0.3)
        team.put(delivery(1))
        receiver.wait_arrived(1)
        team.put(delivery(2))  # while the first attempt hangs: queued, not waited for
        assert team.pending() == 2
        bodies = receiver.wait_for(2)
        team.close(1.0)
    assert bodies == [{"n": 1}, {"n": 2}]
    assert tally.retries["team"] == 1
    assert tally.results == Counter({("team", Result.DELIVERED): 2})


def test_a_refusal_is_not_retried(tally: Tally) -> None:
    with Receiver(status=404) as receiver:
        team = sink(receiver.url, tally, maxAttempts=5)
        team.put(delivery(1))
        tally.wait("team", Result.FAILED)
        team.close(1.0)
    assert receiver.arrived == 1
    assert tally.retries["team"] == 0


def test_a_full_queue_lets_its_oldest_go_and_counts_it(tally: Tally) -> None:
    with Receiver(hold_first=1) as receiver:
        team = sink(receiver.url, tally, queueSize=2, timeoutSeconds=5.0)
        team.put(delivery(1))
        receiver.wait_arrived(1)  # the worker holds 1; the queue is empty again
        for n in (2, 3, 4):
            team.put(delivery(n))
        assert tally.results == Counter({("team", Result.DROPPED): 1})
        receiver.release()
        bodies = receiver.wait_for(3)
        team.close(1.0)
    assert bodies == [{"n": 1}, {"n": 3}, {"n": 4}]  # 2 was the oldest waiting when 4 came


def test_a_policy_that_floods_a_sink_pushes_out_only_its_own_and_the_others_go_first(tally: Tally) -> None:
    # Issue 33: one queue per sink let one tenant's flood push out another's RolledBack.
    def told(policy: str, n: int) -> Delivery:
        return Delivery(json.dumps({"p": policy, "n": n}).encode(), f"{policy} {n}", ("llm", policy))

    with Receiver(hold_first=1) as receiver:
        team = sink(receiver.url, tally, queueSize=3, timeoutSeconds=5.0)
        team.put(told("noisy", 0))
        receiver.wait_arrived(1)  # the worker holds it; the queue is empty again
        team.put(told("chat", 1))
        for n in range(1, 51):
            team.put(told("noisy", n))
        assert tally.results == Counter({("team", Result.DROPPED): 48})
        receiver.release()
        bodies = receiver.wait_for(4)
        team.close(1.0)
    # chat's notice survived 50 of noisy's, and went out before noisy's waiting ones.
    assert bodies == [{"p": "noisy", "n": 0}, {"p": "chat", "n": 1}, {"p": "noisy", "n": 49}, {"p": "noisy", "n": 50}]


def test_policies_lines_are_served_in_turn(tally: Tally) -> None:
    with Receiver(hold_first=1) as receiver:
        team = sink(receiver.url, tally, queueSize=10, timeoutSeconds=5.0)
        team.put(Delivery(b'{"n": 0}', "0", ("llm", "a")))
        receiver.wait_arrived(1)
        for n, policy in enumerate("aaabbc", start=1):
            team.put(Delivery(json.dumps({"n": n}).encode(), str(n), ("llm", policy)))
        receiver.release()
        bodies = receiver.wait_for(7)
        team.close(1.0)
    assert [b["n"] for b in bodies] == [0, 1, 4, 6, 2, 5, 3]  # a, b, c, a, b, a


def test_what_is_still_queued_at_shutdown_is_counted_dropped(tally: Tally) -> None:
    team = sink(f"http://127.0.0.1:{free_port()}/hook", tally, maxAttempts=20)
    team.put(delivery(1))
    team.put(delivery(2))
    team.close(0.2)
    assert tally.results == Counter({("team", Result.DROPPED): 2})


def test_a_url_file_is_read_at_each_delivery_so_a_rotated_secret_needs_no_restart(tally: Tally, tmp_path: Path) -> None:
    url_file = tmp_path / "url"
    with Receiver() as old, Receiver() as new:
        url_file.write_text(old.url + "\n")
        team = sink(None, tally, urlFile=str(url_file))
        team.put(delivery(1))
        old.wait_for(1)
        url_file.write_text(new.url)
        team.put(delivery(2))
        new.wait_for(1)
        team.close(1.0)
    assert (old.bodies, new.bodies) == ([{"n": 1}], [{"n": 2}])


def test_a_redirect_is_not_followed() -> None:
    # The POST goes only where the admin said: a 3xx is a refusal, not a new address.
    tally = Tally()
    with Receiver(status=307) as receiver:
        team = sink(receiver.url, tally)
        team.put(delivery(1))
        tally.wait("team", Result.FAILED)
        team.close(1.0)
    assert receiver.arrived == 1


def test_a_stopping_notifier_gives_all_its_sinks_one_grace_together(tally: Tally) -> None:
    down = {"url": f"http://127.0.0.1:{free_port()}/hook", "maxAttempts": 20, "backoffSeconds": 0.05}
    config = NotificationsConfig.model_validate({"sinks": [{"name": f"s{i}", **down} for i in range(4)]})
    notifier = Notifier(config, tally.result, tally.retry)
    notifier.start()
    notifier.send(NotificationsSpec(sinks=[f"s{i}" for i in range(4)]), [notice(NotificationEvent.PAUSED)])
    started = time.monotonic()
    notifier.close(grace=1.0)
    took = time.monotonic() - started
    # One grace each, one after the other, would take 4 s: the bound tells the two apart, not a speed.
    assert took < 2.5, f"the sinks were waited for one grace each: {took:.1f}s"
    assert sum(tally.results[(f"s{i}", Result.DROPPED)] for i in range(4)) == 4


# --- receivers that answer badly -----------------------------------------------------------------------------


def _writes(data: bytes) -> Any:
    def answer(out: Any) -> None:
        out.write(data)
        out.flush()

    return answer


def _trickles(head: bytes, body_bytes: int, every: float) -> Any:
    """A 2xx whose body comes a byte at a time, each well within the socket's timeout."""

    def answer(out: Any) -> None:
        out.write(head)
        out.flush()
        for _ in range(body_bytes):
            time.sleep(every)
            out.write(b"x")
            out.flush()

    return answer


@pytest.mark.parametrize(
    "garbage",
    [
        b"THIS IS NOT HTTP\r\n\r\n",  # http.client.BadStatusLine
        b"HTTP/1.1 2OO OK\r\nContent-Length: 0\r\n\r\n",  # a status that is no number: BadStatusLine too
        b"HTTP/1.1 200 OK\r\n" + b"X-Long: " + b"a" * 70000 + b"\r\n\r\n",  # http.client.LineTooLong
    ],
    ids=["not-http", "bad-status", "line-too-long"],
)
def test_a_receiver_answering_garbage_is_retried_as_a_transient_fault(tally: Tally, garbage: bytes) -> None:
    with Receiver(script=[_writes(garbage)]) as receiver:
        team = sink(receiver.url, tally, maxAttempts=3)
        team.put(delivery(1))
        tally.wait("team", Result.DELIVERED)
        team.close(1.0)
    assert receiver.arrived == 2
    assert receiver.bodies == [{"n": 1}]
    assert tally.retries["team"] == 1
    assert tally.results == Counter({("team", Result.DELIVERED): 1})


@pytest.mark.parametrize("value", [b"\xb2", b"\xb9\xb2\xb3", b"  \xb2 ", b"soon", b"-5"])
def test_a_retry_after_that_is_no_number_nor_date_falls_back_to_the_backoff(tally: Tally, value: bytes) -> None:
    # Byte 0xB2 reads as "²" (headers are Latin-1): "²".isdigit() is True, and float("²") raises.
    answer = b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: " + value + b"\r\nContent-Length: 0\r\n\r\n"
    with Receiver(script=[_writes(answer)]) as receiver:
        team = sink(receiver.url, tally, maxAttempts=3)
        team.put(delivery(1))
        tally.wait("team", Result.DELIVERED)
        team.close(1.0)
    assert receiver.arrived == 2
    assert tally.retries["team"] == 1
    assert tally.results == Counter({("team", Result.DELIVERED): 1})


def test_a_receiver_trickling_its_answer_holds_the_sink_no_longer_than_the_timeout(tally: Tally) -> None:
    head = b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n"
    with Receiver(script=[_trickles(head, 1000, 0.05)]) as receiver:
        team = sink(receiver.url, tally, timeoutSeconds=0.5)
        began = time.monotonic()
        team.put(delivery(1))
        team.put(delivery(2))
        tally.wait("team", Result.DELIVERED, count=2, timeout=10)
        took = time.monotonic() - began
        team.close(1.0)
    # The 2xx was the delivery; the trickled body (50 s of it) was let go at the attempt's deadline.
    assert took < 3.0, took
    assert receiver.arrived == 2
    assert receiver.bodies == [{"n": 2}]
    assert tally.retries["team"] == 0
    assert tally.results == Counter({("team", Result.DELIVERED): 2})
