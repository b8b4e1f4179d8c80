"""What the admin lets a policy ask for (policy/tenancy.py), as a tenant may write it (issue 33): spec.prometheus.url
a base URL only, judged as the operator's HTTP client reads it, under the admin's allowed prefixes by whole path
segments, and never at a private or metadata address; the analysis interval and window above the admin's floors."""

from __future__ import annotations

import pytest
import requests
from pydantic import ValidationError

from kvoffload.api.baseurl import base_url_problem
from kvoffload.api.types import PrometheusSpec
from kvoffload.policy.tenancy import Tenancy, analysis_floor_problems, private_host, prometheus_url_problem, url_under
from tests.policy.render_policies import make_policy

BASE_URLS = [
    "http://prometheus-operated.monitoring.svc:9090",
    "https://prom.example.com/",
    "https://prom.example.com/team-a/prom",
    "http://[2001:db8::1]:9090/",
    "http://10.0.0.7:9090",
]

NOT_BASE_URLS = [
    # The tenant picks the path: admission once POSTed format_query here, and the admin API deleted every series.
    ("http://prom:9090/api/v1/admin/tsdb/delete_series?match[]={__name__=~'.+'}#", "no query (?) or fragment"),
    ("http://prom:9090/-/quit?", "no query"),
    ("http://prom:9090/#", "fragment"),
    ("http://user:pass@prom:9090/", "user or password"),
    ("http://prom/team-a/../team-b", "'..'"),
    ("http://prom/team-a/%2e%2e/team-b", "'%2e%2e'"),
    ("http://prom/team-a/./x", "'.'"),
    ("http://prom//team-a", "empty path segment"),
    ("HTTP://prom/", "is read as http://prom/"),
    ("http://Prom/", "is read as http://prom/"),
    ("http://prom\\@evil/", "is read as http://prom/%5C@evil/"),
    ("ftp://prom/", "http:// or https://"),
    ("http://prom:99999/", "is not a URL"),
]


@pytest.mark.parametrize("url", BASE_URLS)
def test_a_base_url_is_taken(url: str) -> None:
    assert base_url_problem(url) is None
    PrometheusSpec.model_validate({"url": url})


@pytest.mark.parametrize(("url", "why"), NOT_BASE_URLS)
def test_anything_more_than_a_base_url_is_refused_saying_why(url: str, why: str) -> None:
    problem = base_url_problem(url)
    assert problem is not None
    assert why in problem, problem
    with pytest.raises(ValidationError, match="url"):
        PrometheusSpec.model_validate({"url": url})


def test_what_is_judged_is_what_the_client_asks() -> None:
    # requests (urllib3) removes dot segments before it sends: /team-a/../team-b is team-b's, whatever it says.
    prepared = requests.Request("GET", "http://prom/team-a/../team-b/api/v1/query").prepare()
    assert prepared.url == "http://prom/team-b/api/v1/query"
    assert base_url_problem("http://prom/team-a/../team-b") is not None


@pytest.mark.parametrize(
    ("url", "prefix", "under"),
    [
        ("https://prom/team-a", "https://prom/team-a", True),
        ("https://prom/team-a/", "https://prom/team-a", True),
        ("https://prom/team-a/sub", "https://prom/team-a/", True),
        ("https://prom:443/team-a", "https://prom/team-a", True),
        ("https://prom/team-ab", "https://prom/team-a", False),
        ("https://prom/team-a/../team-b", "https://prom/team-a", False),  # escapes with ..
        ("https://prom/team-a/%2e%2e/team-b", "https://prom/team-a", False),
        ("https://x@prom/team-a", "https://prom/team-a", False),
        ("http://prom/team-a", "https://prom/team-a", False),
        ("https://prom:8443/team-a", "https://prom/team-a", False),
        ("https://prom.evil/team-a", "https://prom/team-a", False),
    ],
)
def test_the_allowed_prefix_covers_whole_path_segments_of_a_base_url(url: str, prefix: str, under: bool) -> None:
    assert url_under(url, prefix) is under


@pytest.mark.parametrize(
    "host",
    [
        "127.0.0.1",
        "localhost",
        "169.254.169.254",  # AWS, GCP, Azure, Oracle, DigitalOcean, OpenStack
        "2852039166",  # the same, as a number
        "fd00:ec2::254",  # AWS's IPv6 metadata service: unique-local, fc00::/7
        "fc00::1",
        "100.100.100.200",  # Alibaba Cloud
        "192.0.0.192",  # Oracle Cloud's older one
        "metadata.google.internal",
        "metadata.tencentyun.com",
        "::ffff:169.254.169.254",
        "::1",
    ],
)
def test_private_and_metadata_addresses_are_private(host: str) -> None:
    assert private_host(host)


@pytest.mark.parametrize("host", ["10.0.0.7", "prometheus.monitoring.svc", "2001:db8::1", "100.100.100.201"])
def test_cluster_addresses_are_not(host: str) -> None:
    assert not private_host(host)


def test_a_policy_may_not_name_the_ipv6_metadata_service() -> None:
    problem = prometheus_url_problem("http://[fd00:ec2::254]/", Tenancy(), own_token=False)
    assert problem is not None
    assert "fd00:ec2::254 is the node itself, a link-local or unique-local address" in problem
    assert prometheus_url_problem("http://[fd00:ec2::254]/", Tenancy(private_prometheus=True), own_token=False) is None


def test_the_admins_floors_hold_the_analysis_interval_and_window() -> None:
    floors = Tenancy(min_analysis_interval=10, min_analysis_window=60)
    fast = make_policy(analysis={"interval": "1s", "window": "30s"})
    assert [(e.path, e.message) for e in analysis_floor_problems(fast, floors)] == [
        ("spec.analysis.interval", "1s is shorter than the 10s this cluster allows (--min-analysis-interval)"),
        ("spec.analysis.window", "30s is shorter than the 1m this cluster allows (--min-analysis-window)"),
    ]
    assert analysis_floor_problems(make_policy(analysis={"interval": "10s", "window": "1m"}), floors) == []
    assert analysis_floor_problems(fast, Tenancy()) == []  # no flag: no floor (the lab scrapes every second)
