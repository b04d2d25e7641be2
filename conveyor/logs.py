"""Structured JSON logs: one line per event, each with queue, job, job id and attempt.

Events: ``active``, ``completed``, ``failed``, ``retry``, ``stalled``, ``error``
(and ``skipped`` for deleted or superseded jobs). Payloads are never logged,
so no secret value can reach a log line.

Other libraries log too, and some print what conveyor keeps secret (httpx's
INFO line names the URL of every request, a chat webhook's included). So
:func:`configure_logging` keeps the chatty third-party loggers
(:data:`QUIET_LOGGERS`) at WARNING or above, and every line that goes
through the handler, any logger's, is scrubbed of every secret setting
(:class:`RedactingFilter`).
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any, Callable, Iterable, Literal
from urllib.parse import urlsplit

from conveyor.redaction import scrub

logger = logging.getLogger("conveyor.events")

Level = Literal["debug", "info", "warning", "error"]

_LEVELS: dict[Level, int] = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}


#: Set by :func:`configure_logging`: the handler event lines are written to directly.
_direct: logging.StreamHandler[Any] | None = None

#: Set when OpenTelemetry is on (conveyor.middleware.tracing): the current span's ``trace_id`` and
#: ``span_id``, added to every line written inside a span. None: tracing is off and costs nothing here.
trace_fields: Callable[[], dict[str, str]] | None = None


def log_event(
    event: str,
    *,
    level: Level = "info",
    queue: str | None,
    job: str | None,
    job_id: str | None,
    attempt: int | None,
    **fields: Any,
) -> None:
    """Write one event line. Extra fields must hold no secret values."""
    lvl = _LEVELS[level]
    if not logger.isEnabledFor(lvl):
        return
    if trace_fields is not None:
        fields.update(trace_fields())
    handler = _direct
    if handler is not None and len(logger.root.handlers) == 1 and logger.root.handlers[0] is handler:
        # A worker writes two lines per job: skip the LogRecord and formatter
        # machinery and write the same JSON line under the handler's lock.
        now = time.time()
        record = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now % 1 * 1000):03d}Z",
            "level": level,
            "logger": logger.name,
            "event": event,
            "queue": queue,
            "job": job,
            "job_id": job_id,
            "attempt": attempt,
            **fields,
        }
        text = json.dumps(record, default=str, separators=(",", ":")) + "\n"
        handler.acquire()
        try:
            handler.stream.write(text)
            handler.stream.flush()
        finally:
            handler.release()
        return
    line = _EventLine({"event": event, "queue": queue, "job": job, "job_id": job_id, "attempt": attempt, **fields})
    # What Logger.log does, minus its stack walk for the caller's file and
    # line, which no conveyor formatter prints: a worker logs twice per job.
    logger.handle(logger.makeRecord(logger.name, lvl, "(unknown file)", 0, "%s", (line,), None))


def log_error(error: str, *, level: Level = "warning", queue: str | None = None) -> None:
    """An ``error`` event of no one job: a connection lost, a flush or a scrape that failed.

    :func:`log_event` with the job's fields empty; ``error`` must hold no secret value.
    """
    log_event("error", level=level, queue=queue, job=None, job_id=None, attempt=None, error=error)


def log_job_error(message: Any, error: str, *, level: Level = "error") -> None:
    """An ``error`` event of one job, with the ids of its ``message`` (Dramatiq's Message or MessageProxy);
    ``error`` must hold no secret value."""
    log_event(
        "error",
        level=level,
        queue=message.queue_name,
        job=message.actor_name,
        job_id=message.message_id,
        attempt=message.options.get("attempt"),
        error=error,
    )


class _EventLine:
    """An event's fields, turned into JSON only when a handler formats the line.

    :class:`JsonFormatter` merges the fields directly (one encoding per
    line); any other formatter gets the JSON text through ``%s``.
    """

    __slots__ = ("fields",)

    def __init__(self, fields: dict[str, Any]) -> None:
        self.fields = fields

    def __str__(self) -> str:
        return json.dumps(self.fields, default=str, separators=(",", ":"))


class JsonFormatter(logging.Formatter):
    """Every log line as one JSON object; conveyor events are merged in, not nested."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
        }
        args = record.args
        if isinstance(args, tuple) and len(args) == 1 and isinstance(args[0], _EventLine):
            out.update(args[0].fields)
        else:
            message = record.getMessage()
            if record.name == logger.name and message.startswith("{"):
                out.update(json.loads(message))
            else:
                out["message"] = message
        if trace_fields is not None and "trace_id" not in out:
            out.update(trace_fields())
        if record.exc_info:
            out["exc"] = record.exc_text or self.formatException(record.exc_info)
        return json.dumps(out, default=str, separators=(",", ":"))


#: Third-party loggers kept at WARNING or above: their INFO lines name URLs (a
#: webhook's path is its secret), request lines and connection details.
QUIET_LOGGERS = ("httpx", "httpcore", "urllib3", "uvicorn.access", "uvicorn.error", "dramatiq", "selenium")


def secret_fragments(secrets: Iterable[str]) -> list[str]:
    """What to scrub for each secret: the value, and for a URL its path and query too
    (a library may log the URL rebuilt, with another host form or port)."""
    out = set()
    for secret in secrets:
        if not secret:
            continue
        out.add(secret)
        parts = urlsplit(secret) if "://" in secret else None
        if parts is not None:
            if len(parts.path) > 1:
                out.add(parts.path)
            if parts.query:
                out.add(parts.query)
            if parts.password:
                out.add(parts.password)
    return sorted(out, key=len, reverse=True)


class RedactingFilter(logging.Filter):
    """Scrubs every secret from a record's message, arguments and traceback before any handler writes it."""

    def __init__(self, secrets: Iterable[str]) -> None:
        super().__init__()
        self.secrets = secret_fragments(secrets)

    def filter(self, record: logging.LogRecord) -> bool:
        if not self.secrets or (
            record.args
            and isinstance(record.args, tuple)
            and len(record.args) == 1
            and isinstance(record.args[0], _EventLine)
        ):
            return True  # conveyor's own events carry no secret values (see log_event)
        try:
            message = record.getMessage()
        except Exception:  # a malformed call: logging reports it when the handler formats the line
            return True
        clean = scrub(message, self.secrets)
        if clean != message:
            record.msg, record.args = clean, None
        if record.exc_info:
            # Formatters print exc_text when it is set: the traceback, scrubbed.
            record.exc_text = scrub(logging.Formatter().formatException(record.exc_info), self.secrets)
        return True


def _settings_secrets() -> list[str]:
    try:
        from conveyor.redaction import settings_secrets
        from conveyor.settings import get_settings

        return settings_secrets(get_settings())
    except Exception:  # settings that do not validate are reported elsewhere; nothing to scrub yet
        return []


def configure_logging(level: str = "INFO", stream: Any = None, secrets: Iterable[str] | None = None) -> None:
    """Send every log line to ``stream`` (stderr) as JSON, scrubbed of ``secrets`` (default: every
    secret setting of the environment). Third-party chatter (:data:`QUIET_LOGGERS`) is kept at WARNING."""
    global _direct
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter())
    handler.addFilter(RedactingFilter(_settings_secrets() if secrets is None else secrets))
    _direct = handler
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(max(logging.WARNING, root.level))
    # Dramatiq logs every failed run with its traceback at ERROR; conveyor's
    # own retry/failed events already say it once, with the job's ids.
    logging.getLogger("dramatiq.worker.WorkerThread").setLevel(logging.CRITICAL)
