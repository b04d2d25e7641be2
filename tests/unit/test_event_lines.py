"""Event lines are encoded once: one JSON object for the JSON formatter, its text for plain handlers."""

from __future__ import annotations

import io
import json
import logging

from conveyor.logs import JsonFormatter, log_event


def test_event_line_is_one_json_object_and_plain_handlers_get_its_json_text():
    events = logging.getLogger("conveyor.events")
    json_out, plain_out = io.StringIO(), io.StringIO()
    json_handler, plain_handler = logging.StreamHandler(json_out), logging.StreamHandler(plain_out)
    json_handler.setFormatter(JsonFormatter())
    old_level = events.level
    events.setLevel(logging.INFO)
    events.addHandler(json_handler)
    events.addHandler(plain_handler)
    try:
        log_event("completed", queue="critical", job="credit.consume", job_id="j1", attempt=2, duration_s=0.5)
    finally:
        events.removeHandler(json_handler)
        events.removeHandler(plain_handler)
        events.setLevel(old_level)
    line = json.loads(json_out.getvalue())
    assert {k: line[k] for k in ("level", "logger", "event", "queue", "job", "job_id", "attempt", "duration_s")} == {
        "level": "info",
        "logger": "conveyor.events",
        "event": "completed",
        "queue": "critical",
        "job": "credit.consume",
        "job_id": "j1",
        "attempt": 2,
        "duration_s": 0.5,
    }
    assert json.loads(plain_out.getvalue()) == {
        "event": "completed",
        "queue": "critical",
        "job": "credit.consume",
        "job_id": "j1",
        "attempt": 2,
        "duration_s": 0.5,
    }
