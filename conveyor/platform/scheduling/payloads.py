"""Payloads of the time-triggered jobs: IDs only; the processors read the rest by id."""

from __future__ import annotations

from pydantic import AwareDatetime

from conveyor.tasks.payloads import Id, Payload


class ScheduleFire(Payload):
    """One occurrence of a schedule: enqueue its job, unless the schedule was paused or deleted since."""

    schedule_id: Id
    fire_time: AwareDatetime


class WaitAndResume(Payload):
    """Resume a paused run, unless it was cancelled since."""

    pause_id: Id


class NudgeFire(Payload):
    """Send a nudge, unless the user replied or the task closed since it was set."""

    nudge_id: Id
