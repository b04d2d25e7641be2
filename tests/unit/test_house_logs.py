"""The job-less error event (``log_error``) writes the same line as ``log_event`` spelled out:
every event line keeps the queue, job, job id and attempt keys. No servers."""

from __future__ import annotations

import io
import json
import logging

import pytest

from conveyor import logs
from conveyor.logs import configure_logging, log_error


@pytest.fixture
def stream():
    root = logging.getLogger()
    handlers, level, direct = root.handlers[:], root.level, logs._direct
    out = io.StringIO()
    configure_logging("INFO", stream=out, secrets=[])
    yield out
    root.handlers[:], logs._direct = handlers, direct
    root.setLevel(level)


def test_log_error_is_an_error_event_of_no_job(stream):
    log_error("acks not sent yet", queue="emails")
    log_error("scrape failed", level="error")
    first, second = (json.loads(line) for line in stream.getvalue().splitlines())
    assert {k: first[k] for k in ("event", "level", "queue", "job", "job_id", "attempt", "error")} == {
        "event": "error",
        "level": "warning",
        "queue": "emails",
        "job": None,
        "job_id": None,
        "attempt": None,
        "error": "acks not sent yet",
    }
    assert (second["level"], second["queue"], second["error"]) == ("error", None, "scrape failed")
