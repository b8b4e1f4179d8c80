"""The cluster admin's notification sinks: ``kvoffload run --notifications-config FILE`` (the chart's
``notifications`` values, rendered into a ConfigMap).

A sink's URL is either in the file (``url``: an in-cluster receiver, say) or in a file of its own
(``urlFile``: a Secret's key mounted into the pod, as a Slack webhook URL must be, since the URL is the
credential). A ``urlFile`` is read at every delivery, so a rotated Secret takes effect without a restart.
A sink's ``format`` says what is sent: the generic JSON or a Slack message POSTed to an http(s) URL, alerts
POSTed to an Alertmanager's API v2, or a message handed to Apprise, whose URL names the service
(``msteams://``, ``pagerduty://``, ``mailto://``, ...). An Apprise ``url`` that Apprise cannot load is refused
here, naming ``sinks[i].url``; so is one in a ``urlFile`` that can be read when the file is loaded.
A sink's ``namespaces`` are those whose policies may name it: one team cannot post into another's channel.
"""

from __future__ import annotations

import fnmatch
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator
from pydantic.alias_generators import to_camel

from kvoffload.api.errors import FieldError, errors_from
from kvoffload.api.fields import DnsLabel
from kvoffload.notify import via_apprise

NamespacePattern = Annotated[str, Field(min_length=1, max_length=63, pattern=r"^[-a-z0-9*?]+$")]
"""A namespace, or a shell pattern over namespaces (``*``, ``team-*``)."""


class SinkFormat(StrEnum):
    JSON = "json"
    """The generic payload (docs/notifications.md)."""
    SLACK = "slack"
    """A Slack incoming-webhook message: ``text`` and ``blocks`` (Mattermost and others take it too)."""
    ALERTMANAGER = "alertmanager"
    """Alerts POSTed to an Alertmanager's ``/api/v2/alerts``; the URL is the Alertmanager's own."""
    APPRISE = "apprise"
    """A title and a text handed to Apprise; the URL is an Apprise URL (Teams, PagerDuty, Opsgenie, email, ...)."""

    @property
    def over_http(self) -> bool:
        """Whether the operator POSTs itself (to an http(s) URL), rather than Apprise."""
        return self is not SinkFormat.APPRISE


class _Config(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True)


class SinkConfig(_Config):
    """One webhook the operator may POST to."""

    name: DnsLabel = Field(description="What policies call it in spec.notifications.sinks.")
    format: SinkFormat = Field(default=SinkFormat.JSON, description="json, slack, alertmanager or apprise.")
    url: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z][A-Za-z0-9+.-]*://[^\s]+$",
        max_length=2048,
        description="Its URL: http(s), or an Apprise URL for format apprise.",
    )
    url_file: Path | None = Field(default=None, description="A file holding its URL (a mounted Secret key).")
    timeout_seconds: float = Field(default=5.0, gt=0, le=60, description="Each attempt's limit.")
    max_attempts: int = Field(default=5, ge=1, le=20, description="Attempts before a notification is given up.")
    backoff_seconds: float = Field(default=1.0, gt=0, le=300, description="The wait after the first failure.")
    max_backoff_seconds: float = Field(default=60.0, gt=0, le=3600, description="The longest wait; doubling stops.")
    queue_size: int = Field(
        default=100,
        ge=1,
        le=10_000,
        description="Notifications waiting, all policies together; a full queue lets the oldest of the policy "
        "with the most waiting go.",
    )
    namespaces: list[NamespacePattern] = Field(
        default_factory=lambda: ["*"],
        max_length=256,
        description="The namespaces whose policies may name it, as shell patterns (team-*); every namespace when "
        "left out.",
    )

    @field_validator("url")
    @classmethod
    def _url_fits_format(cls, url: str | None, info: ValidationInfo) -> str | None:
        form = info.data.get("format")
        if url is None or form is None:  # no format: its own error is reported
            return url
        problem = url_problem(form, url)
        if problem is not None:
            raise ValueError(problem)
        return url

    def grants(self, namespace: str) -> bool:
        """Whether the policies of ``namespace`` may name this sink."""
        return any(fnmatch.fnmatchcase(namespace, pattern) for pattern in self.namespaces)

    @model_validator(mode="after")
    def _one_url(self) -> SinkConfig:
        if (self.url is None) == (self.url_file is None):
            raise ValueError("give url or urlFile, not both and not neither")
        return self


def url_problem(form: SinkFormat, url: str) -> str | None:
    """Why ``url`` cannot serve a sink of format ``form``, or None; never repeats the URL (a credential)."""
    if form.over_http:
        return None if url.startswith(("http://", "https://")) else "must be an http:// or https:// URL"
    return via_apprise.url_problem(url)


class NotificationsConfig(_Config):
    """Every sink, and the link each notification carries."""

    sinks: list[SinkConfig] = Field(default_factory=list, max_length=64)
    link: str | None = Field(
        default=None,
        max_length=2048,
        description="A URL for each notification, with {namespace} and {name} put in, e.g. a dashboard's.",
    )

    @model_validator(mode="after")
    def _unique(self) -> NotificationsConfig:
        names = [s.name for s in self.sinks]
        if len(set(names)) != len(names):
            raise ValueError("sink names must be unique")
        return self

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.sinks)

    def link_for(self, namespace: str, name: str) -> str | None:
        if self.link is None:
            return None
        return self.link.replace("{namespace}", namespace).replace("{name}", name)


class ConfigError(ValueError):
    """A notifications configuration that cannot be used, with every offending field."""

    def __init__(self, path: Path, errors: list[FieldError]) -> None:
        self.errors = errors
        super().__init__(f"{path}: " + "; ".join(str(e) for e in errors))


def load_config(path: Path) -> NotificationsConfig:
    """The sinks in a YAML (or JSON) file; ConfigError naming every bad field."""
    try:
        raw = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ConfigError(path, [FieldError("(file)", exc.strerror or str(exc))]) from None
    except yaml.YAMLError as exc:
        raise ConfigError(path, [FieldError("(file)", f"not valid YAML: {exc}")]) from None
    try:
        config = NotificationsConfig.model_validate(raw if raw is not None else {})
    except ValidationError as exc:
        raise ConfigError(path, errors_from(exc)) from None
    faults = [
        FieldError(f"sinks[{i}].urlFile", problem)
        for i, sink in enumerate(config.sinks)
        if (problem := _url_file_problem(sink)) is not None
    ]
    if faults:
        raise ConfigError(path, faults)
    return config


def _url_file_problem(sink: SinkConfig) -> str | None:
    """A urlFile that can be read now and holds no URL its sink can use; one that cannot be read yet is let
    pass (it is read again at each delivery, as a Secret may be mounted late or rotated)."""
    if sink.url_file is None:
        return None
    try:
        url = sink.url_file.read_text().strip()
    except OSError:
        return None
    return url_problem(sink.format, url)


__all__ = [
    "ConfigError",
    "NamespacePattern",
    "NotificationsConfig",
    "SinkConfig",
    "SinkFormat",
    "load_config",
    "url_problem",
]
