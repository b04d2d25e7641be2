"""Waiting for an event (issue 21, item 5): ``ctx.wait_for(name)`` and ``app.events.signal(name, data)``.

A job that calls ``ctx.wait_for("approval:run-7", timeout=3600)`` ends its
attempt there (no attempt spent, no thread held): the broker parks it in the
state ``awaiting`` until a signal of that name, or until the timeout. It then
runs again from the top (durable replay, as in Inngest or Hatchet), and
``ctx.wait_for`` with the same name returns at once: the signal's data, or
None after a timeout (or raises :class:`~conveyor.errors.WaitTimeout` when
asked to). Steps before the wait belong in ``ctx.once`` so they apply once.

The broker stores, all in one atomic step each (one Lua script on Redis; one
transaction under the event's advisory lock on Postgres):

- the signal: it resumes every job awaiting the name (each once: the move
  from ``awaiting`` to ``waiting`` is conditional on the job still awaiting,
  so a second signal or the timeout finds nothing to move), and is kept for
  ``CONVEYOR_EVENT_TTL_SECONDS`` so a job that starts waiting later gets it
  at once (the first signal's data wins while it is kept);
- each job's resolution of each name it waited for, insert-first: whichever
  delivery asks again reads the same answer, so a replay is deterministic.
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any

from conveyor.errors import EventError, InvalidEventName, PayloadTooLarge

if TYPE_CHECKING:
    from conveyor.app import App

#: Message option the Retries middleware sets on the copy that parks a job: the event it awaits. The
#: brokers take it off before the message is stored (it belongs to that one retry, not to later ones).
PARK = "conveyor_park"

#: Message option kept on the stored message: the last event the job was parked on. A run that comes
#: back with it and finds no resolution was woken by the timeout (or an operator's promotion).
WAITED_FOR = "conveyor_waited_for"

#: What a wait that ended by its timeout stores as its resolution.
TIMED_OUT = '{"timeout":true}'

#: Event names: what fits in a Redis key, a URL path segment and a log line without escaping.
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9:._@-]{0,199}")


def check_name(name: object) -> str:
    """``name`` when it is a valid event name, else InvalidEventName (the name is not quoted back)."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise InvalidEventName(
            "event name: 1-200 characters, letters, digits and ':._@-', starting with a letter or digit"
        )
    return name


def encode_signal(data: Any, limit: int) -> str:
    """The resolution a signal stores: its data as JSON, at most ``limit`` bytes."""
    try:
        text = json.dumps({"data": data}, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise EventError(f"signal data: not JSON-serialisable ({type(exc).__name__})") from None
    if len(text.encode()) > limit:
        raise PayloadTooLarge(f"signal data: larger than {limit} bytes encoded")
    return text


def decode_resolution(text: str) -> tuple[bool, Any]:
    """``(timed_out, data)`` of a stored resolution."""
    value = json.loads(text)
    if value.get("timeout"):
        return True, None
    return False, value.get("data")


class Events:
    """``app.events``: signals to jobs waiting with ``ctx.wait_for``."""

    def __init__(self, app: App) -> None:
        self._app = app

    def signal(self, name: str, data: Any = None) -> int:
        """Resume every job awaiting ``name`` with ``data`` (each exactly once); returns how many.

        The signal is also kept for ``CONVEYOR_EVENT_TTL_SECONDS``: a job that
        starts waiting for ``name`` meanwhile gets ``data`` at once. ``data``
        must be JSON-serialisable and at most ``CONVEYOR_MAX_PAYLOAD_BYTES``.
        """
        check_name(name)
        settings = self._app.settings
        resolution = encode_signal(data, settings.max_payload_bytes)
        return self._app.broker.signal_event(name, resolution, settings.event_ttl_seconds)
