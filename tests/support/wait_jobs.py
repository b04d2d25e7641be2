"""Job types for the wait-for-event tests (tests/integration/test_event_waits.py), loaded with
CONVEYOR_IMPORTS=tests.support.wait_jobs.

``test.wait.waiter`` records its start, waits for its payload's event and records what the
wait returned (or that it raised WaitTimeout); ``test.wait.quick`` records one run. The
queue has one thread and one attempt: a parked job that held its thread would block the
quick one, and one that spent an attempt would fail on its resumption.
"""

from __future__ import annotations

import json

from conveyor import Jobs, Payload, Queue
from conveyor.errors import WaitTimeout

jobs = Jobs()
WAITS = Queue("waits", concurrency=1, max_attempts=1, min_backoff=0.05, max_backoff=0.2)

TABLE = """CREATE TABLE IF NOT EXISTS wait_runs (
    id SERIAL PRIMARY KEY, token TEXT NOT NULL, job_id TEXT NOT NULL, phase TEXT NOT NULL,
    data TEXT, attempt INTEGER NOT NULL, at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp())"""


class Waiter(Payload):
    token: str
    event: str
    timeout: float = 60
    raise_on_timeout: bool = False


class Quick(Payload):
    token: str


def _record(ctx, token: str, phase: str, data: object = None) -> None:
    with ctx.app.pool.connection() as conn:
        conn.execute(
            "INSERT INTO wait_runs (token, job_id, phase, data, attempt) VALUES (%s, %s, %s, %s, %s)",
            (token, ctx.job_id, phase, json.dumps(data), ctx.attempt),
        )


@jobs.job("test.wait.waiter", queue=WAITS, payload=Waiter)
def waiter(payload: Waiter, ctx) -> None:
    _record(ctx, payload.token, "start")
    try:
        data = ctx.wait_for(payload.event, timeout=payload.timeout, raise_on_timeout=payload.raise_on_timeout)
    except WaitTimeout:
        _record(ctx, payload.token, "timeout")
        return
    _record(ctx, payload.token, "resumed", data)


@jobs.job("test.wait.quick", queue=WAITS, payload=Quick)
def quick(payload: Quick, ctx) -> None:
    _record(ctx, payload.token, "quick")
