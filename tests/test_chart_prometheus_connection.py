"""The chart's Prometheus connection values (issue 23): headers, basic auth from a Secret, a CA from a Secret or a
ConfigMap, and the opt-in skip-verify, rendered by the real Helm into the operator's Deployment."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest

from kvoffload.cli.run import run
from tests.test_chart import CHART, K8S_VERSION, NAMESPACE, RELEASE, container, only, render

Obj = dict[str, Any]

MIMIR = "https://mimir.monitoring.svc/prometheus"


@pytest.fixture(scope="module")
def chart() -> Iterator[helm.Chart]:
    with helm.Chart.load(CHART) as loaded:
        yield loaded


def connection_values(**overrides: Any) -> Obj:
    values: Obj = {
        "prometheusUrl": MIMIR,
        "prometheusHeaders": {"X-Scope-OrgID": "platform", "X-Note": "a: b # not a comment"},
        "prometheusAuth": {
            "tokenSecret": {"name": "", "key": "token"},
            "policySecrets": [],
            "basicAuth": {"secret": "prom-basic", "usernameKey": "user", "passwordKey": "pass"},
        },
        "prometheusTLS": {
            "ca": {"secret": "prom-ca", "configMap": "", "key": "bundle.pem"},
            "insecureSkipVerify": False,
        },
    }
    values.update(overrides)
    return values


def pod(objs: list[Obj]) -> Obj:
    spec: Obj = only(objs, "Deployment")["spec"]["template"]["spec"]
    return spec


def mounted_at(objs: list[Obj], volume: str) -> Path:
    (mount,) = [m for m in container(objs)["volumeMounts"] if m["name"] == volume]
    assert mount["readOnly"] is True
    return Path(mount["mountPath"])


def test_headers_basic_auth_and_a_secret_ca_reach_the_operator_as_kvoffload_run_reads_them(chart: helm.Chart) -> None:
    objs = render(chart, connection_values())
    for obj in objs:
        if obj["kind"] == "Deployment":
            kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    args = list(container(objs)["args"])
    with run.make_context("run", args) as context:
        params = context.params
    assert params["prometheus_headers"] == (("X-Note", "a: b # not a comment"), ("X-Scope-OrgID", "platform"))
    volumes = {v["name"]: v for v in pod(objs)["volumes"]}

    # The CA: the chosen key of the Secret, at the path the flag names.
    ca_dir = mounted_at(objs, "prometheus-ca")
    (ca_item,) = volumes["prometheus-ca"]["secret"]["items"]
    assert volumes["prometheus-ca"]["secret"]["secretName"] == "prom-ca"
    assert ca_item == {"key": "bundle.pem", "path": "ca.crt"}
    assert params["prometheus_ca_file"] == ca_dir / ca_item["path"]

    # The password: a file from the Secret; the username: an environment variable from it. Neither in the args.
    auth_dir = mounted_at(objs, "prometheus-basic-auth")
    (password_item,) = volumes["prometheus-basic-auth"]["secret"]["items"]
    assert volumes["prometheus-basic-auth"]["secret"]["secretName"] == "prom-basic"
    assert password_item == {"key": "pass", "path": "password"}
    assert params["prometheus_password_file"] == auth_dir / password_item["path"]
    (username,) = [e for e in container(objs)["env"] if e["name"] == "KVOFFLOAD_PROMETHEUS_USERNAME"]
    assert username["valueFrom"] == {"secretKeyRef": {"name": "prom-basic", "key": "user"}}
    assert params["prometheus_insecure_skip_verify"] is False
    assert not any("pass" in arg.split("=", 1)[0] and "file" not in arg for arg in args)


def test_a_ca_from_a_config_map(chart: helm.Chart) -> None:
    values = connection_values(
        prometheusTLS={"ca": {"secret": "", "configMap": "prom-ca", "key": "ca.crt"}, "insecureSkipVerify": False}
    )
    objs = render(chart, values)
    (volume,) = [v for v in pod(objs)["volumes"] if v["name"] == "prometheus-ca"]
    assert volume["configMap"] == {"name": "prom-ca", "items": [{"key": "ca.crt", "path": "ca.crt"}]}
    assert "--prometheus-ca-file=/etc/kvoffload/prometheus-ca/ca.crt" in container(objs)["args"]


def test_nothing_is_mounted_or_passed_by_default(chart: helm.Chart) -> None:
    objs = render(chart)
    assert not [
        a
        for a in container(objs)["args"]
        if a.startswith(("--prometheus-header", "--prometheus-ca", "--prometheus-pass", "--prometheus-insecure"))
    ]
    assert {v["name"] for v in pod(objs)["volumes"]} == {"tmp"}


def test_skipping_verification_is_an_explicit_value_and_the_notes_warn(chart: helm.Chart) -> None:
    values = connection_values(
        prometheusTLS={"ca": {"secret": "", "configMap": "", "key": "ca.crt"}, "insecureSkipVerify": True}
    )
    rendered = chart.render(values, name=RELEASE, namespace=NAMESPACE)
    notes = next(text for path, text in rendered.items() if path.endswith("NOTES.txt"))
    assert "WARNING: prometheusTLS.insecureSkipVerify is on" in notes
    assert "--prometheus-insecure-skip-verify" in container(render(chart, values))["args"]
    assert "WARNING" not in next(
        text
        for path, text in chart.render(connection_values(), name=RELEASE, namespace=NAMESPACE).items()
        if path.endswith("NOTES.txt")
    )


@pytest.mark.parametrize(
    ("case", "values", "complaint"),
    [
        (
            "headers with no fixed or allowed Prometheus",
            {"prometheusUrl": ""},
            "need prometheusUrl or tenancy.prometheusAllowedUrls",
        ),
        (
            "a CA and skip-verify",
            {
                "prometheusTLS": {
                    "ca": {"secret": "prom-ca", "configMap": "", "key": "ca.crt"},
                    "insecureSkipVerify": True,
                }
            },
            "not both",
        ),
    ],
)
def test_settings_that_could_leak_or_contradict_are_refused_at_render(
    chart: helm.Chart, case: str, values: Obj, complaint: str
) -> None:
    with pytest.raises(helm.errors.HelmRenderError, match=re.escape(complaint)):
        render(chart, connection_values(**values))


@pytest.mark.parametrize(
    ("case", "values", "complaint"),
    [
        (
            "an Authorization header",
            {"prometheusHeaders": {"Authorization": "Bearer x"}},
            "invalid propertyName 'Authorization'",
        ),
        ("a header name with a space", {"prometheusHeaders": {"X Scope": "1"}}, "invalid propertyName 'X Scope'"),
        (
            "a header value with a line break",
            {"prometheusHeaders": {"X-Scope-OrgID": "a\r\nHost: evil"}},
            "/prometheusHeaders/X-Scope-OrgID",
        ),
        (
            "a CA from a Secret and a ConfigMap",
            {"prometheusTLS": {"ca": {"secret": "a", "configMap": "b", "key": "ca.crt"}, "insecureSkipVerify": False}},
            "/prometheusTLS/ca",
        ),
        (
            "skip-verify as a string",
            {"prometheusTLS": {"ca": {"secret": "", "configMap": "", "key": "ca.crt"}, "insecureSkipVerify": "yes"}},
            "/prometheusTLS/insecureSkipVerify",
        ),
    ],
)
def test_bad_connection_values_are_refused_by_the_schema(
    chart: helm.Chart, case: str, values: Obj, complaint: str
) -> None:
    with pytest.raises(helm.HelmValuesError, match=re.escape(complaint)):
        chart.validate_schema(connection_values(**values))
