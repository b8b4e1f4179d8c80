"""The admin's sinks file: every fault named by its path, and ``kvoffload run`` refuses to start on one."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from kvoffload.cli.common import EXIT_BAD_INPUT
from kvoffload.cli.main import main
from kvoffload.notify.config import ConfigError, load_config


def write(tmp_path: Path, config: object) -> Path:
    path = tmp_path / "notifications.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.mark.parametrize(
    ("config", "complaint"),
    [
        ({"sinks": [{"name": "team"}]}, "sinks[0]: give url or urlFile, not both and not neither"),
        ({"sinks": [{"name": "team", "url": "file:///etc/passwd"}]}, "sinks[0].url"),
        ({"sinks": [{"name": "team", "url": "http://a/", "format": "teams"}]}, "sinks[0].format"),
        ({"sinks": [{"name": "team", "url": "http://a/", "maxAttempts": 0}]}, "sinks[0].maxAttempts"),
        ({"sinks": [{"name": "team", "url": "http://a/", "namespaces": ["team/a"]}]}, "sinks[0].namespaces[0]"),
        ({"sinks": [{"name": "team", "url": "http://a/", "namespaces": ["Team"]}]}, "sinks[0].namespaces[0]"),
        (
            {"sinks": [{"name": "team", "url": "http://a/"}, {"name": "team", "url": "http://b/"}]},
            "sink names must be unique",
        ),
        ({"sink": []}, "sink"),
    ],
)
def test_a_bad_sinks_file_is_refused_naming_the_field(tmp_path: Path, config: object, complaint: str) -> None:
    with pytest.raises(ConfigError) as refused:
        load_config(write(tmp_path, config))
    assert complaint in str(refused.value)


def test_kvoffload_run_will_not_start_on_a_bad_sinks_file(tmp_path: Path) -> None:
    path = write(tmp_path, {"sinks": [{"name": "team", "url": "http://a/", "urlFile": "/etc/url"}]})
    result = CliRunner().invoke(main, ["run", "-A", "--notifications-config", str(path)])
    assert result.exit_code == EXIT_BAD_INPUT
    assert "sinks[0]: give url or urlFile, not both and not neither" in result.output


def test_kvoffload_run_will_not_start_on_a_missing_sinks_file(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["run", "-A", "--notifications-config", str(tmp_path / "nothing.yaml")])
    assert result.exit_code == EXIT_BAD_INPUT
    assert "No such file or directory" in result.output
