"""How ``kvoffload run`` logs: one format for the whole process, kopf's loggers and the operator's alike.

``text`` is kopf's own layout (``[time] logger [LEVEL] message``). ``json`` is one object per line with
``time``, ``level``, ``logger`` and ``message`` (kopf's ``severity`` and, for a record about a policy,
``object``: its apiVersion, kind, namespace, name and uid), and ``exc_info`` with the traceback when there is
one, so a log pipeline (Loki, Cloud Logging, Elasticsearch) reads every line without a parser of ours.
Python warnings and uncaught exceptions in threads go through the same handler, so nothing else reaches
stderr in another shape.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
import types
from typing import Final

LOG_FORMATS: Final = ("text", "json")
JSON_FIELDS: Final = {"asctime": "time", "levelname": "level", "name": "logger"}
"""python-json-logger's record attributes, renamed to what log pipelines look for."""


def configure_logging(log_format: str, *, verbose: bool = False) -> None:
    """Configure the root logger as kopf does (its one handler, its levels), in ``log_format``."""
    if log_format not in LOG_FORMATS:
        raise ValueError(f"log format {log_format!r}: want one of {', '.join(LOG_FORMATS)}")
    import kopf  # here: the CLI's other commands start without it

    if log_format == "text":
        kopf.configure(verbose=verbose)
        return
    kopf.configure(verbose=verbose, log_format=kopf.LogFormat.JSON)
    # kopf's JSON formatter with our field names: the same class, so its object reference and severity stay.
    from kopf._core.actions.loggers import ObjectJsonFormatter  # kopf exports the enum, not the class

    formatter = ObjectJsonFormatter(
        "%(asctime)s %(levelname)s %(name)s %(message)s", rename_fields=dict(JSON_FIELDS), timestamp=False
    )
    formatter.converter = time.gmtime
    formatter.default_time_format = "%Y-%m-%dT%H:%M:%S"
    formatter.default_msec_format = "%s.%03dZ"
    for handler in logging.getLogger().handlers:
        handler.setFormatter(formatter)
    logging.captureWarnings(True)  # warnings.warn() would write plain text to stderr
    threading.excepthook = _log_thread_exception
    sys.excepthook = _log_exception


def _log_exception(exc_type: type[BaseException], exc: BaseException, traceback: types.TracebackType | None) -> None:
    logging.getLogger("kvoffload").critical("the operator stopped: %s", exc, exc_info=(exc_type, exc, traceback))


def _log_thread_exception(args: threading.ExceptHookArgs) -> None:
    if args.exc_type is SystemExit or args.exc_value is None:
        return
    thread = args.thread.name if args.thread is not None else "?"
    exc_info = (args.exc_type, args.exc_value, args.exc_traceback)
    logging.getLogger("kvoffload").critical("uncaught exception in thread %s", thread, exc_info=exc_info)
