"""The chart's notifications: the sinks reach ``kvoffload run --notifications-config`` as a ConfigMap the operator
loads, a Secret's URL only as a mounted key (never in the ConfigMap or the arguments), and the schema refuses a sink
with no URL or two."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest
import yaml

from kvoffload.cli.run import run
from kvoffload.notify.config import SinkFormat, load_config
from tests.support import paths

CHART = paths.ROOT / "charts" / "kvoffload"
SLACK_URL = "https://hooks.slack.com/services/T000/B000/XXXX"
VALUES: dict[str, Any] = {
    "notifications": {
        "sinks": [
            {"name": "llm-oncall", "format": "slack", "urlSecret": {"name": "slack-webhook", "key": "url"}},
            {
                "name": "incidents",
                "url": "http://alert-gateway.monitoring.svc:8080/kvoffload",
                "maxAttempts": 3,
                "namespaces": ["llm", "team-*"],
            },
        ],
        "link": "https://grafana.example.com/d/kvoffload?var-namespace={namespace}&var-policy={name}",
    }
}

Obj = dict[str, Any]


@pytest.fixture(scope="module")
def chart() -> Iterator[helm.Chart]:
    with helm.Chart.load(CHART) as loaded:
        yield loaded


def render(chart: helm.Chart, values: Obj) -> list[Obj]:
    rendered = chart.render(values, name="kvo", namespace="kvoffload-system")
    return [
        obj
        for path, text in sorted(rendered.items())
        if path.endswith(".yaml")
        for obj in yaml.safe_load_all(text)
        if obj
    ]


def pod_of(objs: list[Obj]) -> Obj:
    (deployment,) = (o for o in objs if o["kind"] == "Deployment")
    pod: Obj = deployment["spec"]["template"]
    return pod


def test_the_sinks_reach_the_operator_as_a_config_it_loads_and_the_secret_url_as_a_mounted_key(
    chart: helm.Chart, tmp_path: Path
) -> None:
    objs = render(chart, VALUES)
    pod = pod_of(objs)
    (operator,) = pod["spec"]["containers"]
    with run.make_context("run", list(operator["args"])) as context:
        config_path = PurePosixPath(context.params["notifications_config"])
    mounts = {m["mountPath"]: m["name"] for m in operator["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}

    # The ConfigMap is mounted where the flag points, and the operator loads what it holds.
    (config_map,) = (
        o for o in objs if o["kind"] == "ConfigMap" and o["metadata"]["name"] == "kvo-kvoffload-notifications"
    )
    assert volumes[mounts[str(config_path.parent)]]["configMap"]["name"] == config_map["metadata"]["name"]
    (tmp_path / config_path.name).write_text(config_map["data"][config_path.name])
    config = load_config(tmp_path / config_path.name)
    assert config.names == ("llm-oncall", "incidents")
    assert config.link == VALUES["notifications"]["link"]
    slack, incidents = config.sinks
    assert (slack.format, slack.url) == (SinkFormat.SLACK, None)
    assert (incidents.url, incidents.max_attempts) == ("http://alert-gateway.monitoring.svc:8080/kvoffload", 3)
    assert (slack.namespaces, incidents.namespaces) == (["*"], ["llm", "team-*"])
    assert [incidents.grants(n) for n in ("llm", "team-a", "billing")] == [True, True, False]

    # The Slack URL is the Secret's key, mounted at the urlFile the config names: the operator reads it there.
    assert slack.url_file is not None
    secret_volume = volumes[mounts[str(slack.url_file.parent)]]["secret"]
    assert secret_volume == {"secretName": "slack-webhook", "items": [{"key": "url", "path": slack.url_file.name}]}
    assert "slack-webhook" not in config_map["data"][config_path.name]

    # A change of the sinks restarts the operator, which reads them at start.
    assert re.fullmatch(r"[0-9a-f]{64}", pod["metadata"]["annotations"]["checksum/notifications"])
    other = pod_of(render(chart, {"notifications": {**VALUES["notifications"], "link": ""}}))
    assert (
        other["metadata"]["annotations"]["checksum/notifications"]
        != pod["metadata"]["annotations"]["checksum/notifications"]
    )
    for obj in objs:
        kubernetes_validate.validate(obj, kubernetes_validate.latest_version(), strict=True)


def test_no_sinks_means_no_flag_no_config_map_and_no_policy_may_ask_for_notifications(chart: helm.Chart) -> None:
    objs = render(chart, {})
    (operator,) = pod_of(objs)["spec"]["containers"]
    assert not [a for a in operator["args"] if a.startswith("--notifications-config")]
    assert not [o for o in objs if o["kind"] == "ConfigMap" and o["metadata"]["name"].endswith("-notifications")]


@pytest.mark.parametrize(
    ("sink", "complaint"),
    [
        ({"name": "team"}, "/notifications/sinks/0"),  # no URL at all
        (
            {"name": "team", "url": "http://a.example/", "urlSecret": {"name": "s", "key": "url"}},
            "/notifications/sinks/0",
        ),
        ({"name": "Team", "url": "http://a.example/"}, "/notifications/sinks/0/name"),
        ({"name": "team", "url": "ftp://a.example/"}, "/notifications/sinks/0/url"),
        ({"name": "team", "url": "http://a.example/", "format": "teams"}, "/notifications/sinks/0/format"),
        ({"name": "team", "url": "http://a.example/", "namespaces": ["a/b"]}, "/notifications/sinks/0/namespaces/0"),
    ],
)
def test_the_schema_refuses_a_sink_that_cannot_work(chart: helm.Chart, sink: Obj, complaint: str) -> None:
    with pytest.raises(helm.HelmValuesError, match=re.escape(complaint)):
        chart.validate_schema({"notifications": {"sinks": [sink]}})


@pytest.mark.parametrize(
    "sink",
    [
        {"name": "pager", "format": "apprise", "url": "pagerduty://integration@api-key"},
        {"name": "am", "format": "alertmanager", "url": "http://alertmanager.monitoring.svc:9093"},
    ],
)
def test_the_schema_takes_an_apprise_url_and_an_alertmanager(chart: helm.Chart, sink: Obj) -> None:
    chart.validate_schema({"notifications": {"sinks": [sink]}})
    if sink["format"] != "apprise":  # only Apprise's sinks take another scheme than http(s)
        with pytest.raises(helm.HelmValuesError, match=re.escape("/notifications/sinks/0/url")):
            chart.validate_schema({"notifications": {"sinks": [{**sink, "url": "pagerduty://a@b"}]}})
