"""What a managed cron schedule must be before it is stored, and still be when it fires.

Messages name the field and the rule, never the value given: a name, cron or payload may have
been typed by anyone with the admin token, and an answer or a log line does not echo it.
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ValidationError

from conveyor.errors import ConfigurationError, InvalidSchedule
from conveyor.scheduling.cron import Cron, parse_zone

if TYPE_CHECKING:
    from conveyor.app import App
    from conveyor.settings import Settings

#: A managed schedule's name: it becomes part of each occurrence's enqueue key (``cron:<name>:<time>``).
NAME = re.compile(r"[a-z0-9][a-z0-9._:-]{0,99}")
NAME_RULE = "1-100 characters of a-z, 0-9, '.', '_', ':' and '-', starting with a letter or a digit"

#: Longest cron expression or zone name taken.
MAX_FIELD = 200


def check_grace(settings: Settings) -> None:
    """Refuse settings under which an occurrence's key may expire while it can still be fired."""
    if settings.scheduler_misfire_grace >= min(settings.dedup_ttl, settings.retention):
        # A key holds only while its job's record is kept (Redis frees a key whose record is gone).
        raise ConfigurationError(
            "CONVEYOR_SCHEDULER_MISFIRE_GRACE must be shorter than CONVEYOR_DEDUP_TTL and "
            "CONVEYOR_RETENTION: an occurrence's key must outlive the time it may still be fired"
        )


def check_name(app: App, name: Any) -> str:
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise InvalidSchedule(f"name: {NAME_RULE}")
    if name in app.schedules:
        raise InvalidSchedule("name: a schedule declared in code (jobs.schedule) has it; choose another")
    return name


def check_cron(cron: Any, tz: Any) -> Cron:
    """The parsed cron of a schedule, or InvalidSchedule naming what is wrong (not quoting it)."""
    if not isinstance(tz, str) or not 0 < len(tz) <= MAX_FIELD:
        raise InvalidSchedule("timezone: an IANA zone name such as UTC or Europe/Berlin")
    try:
        parse_zone(tz)
    except InvalidSchedule:
        raise InvalidSchedule("timezone: not a known IANA zone name (such as UTC or Europe/Berlin)") from None
    if not isinstance(cron, str) or not 0 < len(cron) <= MAX_FIELD:
        raise InvalidSchedule(f"cron: a cron expression of at most {MAX_FIELD} characters")
    try:
        return Cron.parse(cron, tz)
    except InvalidSchedule:
        raise InvalidSchedule(
            "cron: not a cron expression that fires (five fields: minute hour day-of-month month "
            "day-of-week, or an alias such as @daily)"
        ) from None


def check_job(app: App, job: Any, payload: Any) -> dict[str, Any]:
    """``payload`` as the JSON object to store, once it validates against ``job``'s payload model."""
    job_type = app.job_types.get(job) if isinstance(job, str) else None
    if job_type is None:
        raise InvalidSchedule("job: no job type of this app has this name")
    if getattr(job_type.payload, "secret_fields", None):
        raise InvalidSchedule(
            "job: its payload has secret fields; a stored schedule keeps its payload in plain JSON, so it cannot "
            "hold secrets (schedule it in code, or have the job read the secret itself)"
        )
    if isinstance(payload, BaseModel):
        payload = payload.model_dump(mode="json")
    if payload is None:
        payload = {}
    if not isinstance(payload, dict):
        raise InvalidSchedule("payload: a JSON object")
    try:
        job_type.payload.model_validate(payload)
    except ValidationError as exc:
        # Location and message only: the value may be a secret.
        fields = "; ".join(f"{'.'.join(map(str, e['loc'])) or '<payload>'}: {e['msg']}" for e in exc.errors())
        raise InvalidSchedule(f"payload: does not fit the job's model: {fields}") from None
    try:
        size = len(json.dumps(payload, separators=(",", ":"), allow_nan=False).encode())
    except (TypeError, ValueError):
        raise InvalidSchedule("payload: a JSON object (its values JSON too)") from None
    if size > app.settings.max_payload_bytes:
        raise InvalidSchedule(
            f"payload: {size} bytes of JSON; the limit is {app.settings.max_payload_bytes} (CONVEYOR_MAX_PAYLOAD_BYTES)"
        )
    return payload
