"""Structured JSON logs: one line per event, each with queue, job, job id and attempt.

Events: ``active``, ``completed``, ``failed``, ``retry``, ``stalled``, ``error``
(and ``skipped`` for deleted or superseded jobs). Payloads are never logged,
so no secret value can reach a log line.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

logger = logging.getLogger("conveyor.events")

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}


def log_event(event: str, *, level: str = "info", queue: str | None, job: str | None,
              job_id: str | None, attempt: int | None, **fields: Any) -> None:
    """Write one event line. Extra fields must hold no secret values."""
    lvl = _LEVELS[level]
    if not logger.isEnabledFor(lvl):
        return
    record = {"event": event, "queue": queue, "job": job, "job_id": job_id, "attempt": attempt, **fields}
    logger.log(lvl, "%s", json.dumps(record, default=str, separators=(",", ":")))


class JsonFormatter(logging.Formatter):
    """Every log line as one JSON object; conveyor events are merged in, not nested."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
        }
        message = record.getMessage()
        if record.name == logger.name and message.startswith("{"):
            out.update(json.loads(message))
        else:
            out["message"] = message
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str, separators=(",", ":"))


def configure_logging(level: str = "INFO") -> None:
    """Send every log line to stderr as JSON. Dramatiq's own chatter is kept at WARNING."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    logging.getLogger("dramatiq").setLevel(max(logging.WARNING, root.level))
    # Dramatiq logs every failed run with its traceback at ERROR; conveyor's
    # own retry/failed events already say it once, with the job's ids.
    logging.getLogger("dramatiq.worker.WorkerThread").setLevel(logging.CRITICAL)
