"""``kvoffload run --log-format``: one format per process. A fresh Python configured as ``run`` configures it writes
every record to stderr as one JSON object, kopf's and the operator's, a warning, a traceback and an exception that
ends a thread included (the real operator's log is checked in test_get_e2e.py)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from click.testing import CliRunner

from kvoffload.cli.logs import configure_logging
from kvoffload.cli.main import main

PROGRAM = """
import logging, threading, warnings
from kvoffload.cli.logs import configure_logging
configure_logging({format!r})
logging.getLogger("kvoffload.controller.reconcile").info("llm/chat: promoted to %s", "cpu")
ref = {{"kind": "KVOffloadPolicy", "name": "chat"}}
logging.getLogger("kopf.objects").warning("retrying", extra={{"k8s_ref": ref}})
logging.getLogger("kvoffload.controller.reconcile").debug("not at INFO")
warnings.warn("an old option")
try:
    1 / 0
except ZeroDivisionError:
    logging.getLogger("kvoffload.controller.handlers").exception("reconcile failed")
worker = threading.Thread(target=lambda: 1 / 0, name="notifier")
worker.start()
worker.join()
"""


def stderr_of(log_format: str) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM.format(format=log_format)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""
    return done.stderr.splitlines()


def test_json_writes_every_record_as_one_object_with_level_and_message() -> None:
    records = [json.loads(line) for line in stderr_of("json")]
    assert [(r["level"], r["logger"]) for r in records] == [
        ("INFO", "kvoffload.controller.reconcile"),
        ("WARNING", "kopf.objects"),
        ("WARNING", "py.warnings"),
        ("ERROR", "kvoffload.controller.handlers"),
        ("CRITICAL", "kvoffload"),
    ]
    assert records[0]["message"] == "llm/chat: promoted to cpu"
    assert records[1]["object"] == {"kind": "KVOffloadPolicy", "name": "chat"}
    assert "an old option" in records[2]["message"]
    assert "ZeroDivisionError" in records[3]["exc_info"]
    assert records[4]["message"] == "uncaught exception in thread notifier"
    assert all(r["time"].endswith("Z") and "T" in r["time"] for r in records)


def test_text_stays_kopfs_layout() -> None:
    lines = stderr_of("text")
    assert lines[0].endswith("kvoffload.controller [INFO    ] llm/chat: promoted to cpu")  # kopf cuts at 20
    assert lines[1].endswith("kopf.objects         [WARNING ] retrying")
    with pytest.raises(json.JSONDecodeError):
        json.loads(lines[0])


def test_an_unknown_format_is_refused() -> None:
    with pytest.raises(ValueError, match="want one of text, json"):
        configure_logging("xml")
    result = CliRunner().invoke(main, ["run", "-A", "--log-format", "xml"])
    assert result.exit_code == 2
    assert "'xml' is not one of 'text', 'json'" in result.output
