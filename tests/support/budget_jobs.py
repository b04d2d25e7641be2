"""Job types for the budget tests (tests/integration/test_budgets.py), loaded with
CONVEYOR_IMPORTS=tests.support.budget_jobs.

``test.budget.weighed`` takes its payload's ``weight`` from a budget keyed by
``tenant``; ``test.budget.reported`` is admitted with weight 0 and reports what
it used afterwards with ``ctx.spend``. Both record each run in ``budget_runs``
with the database's clock, the run's attempt and how often it was deferred.
"""

from __future__ import annotations

import os

from conveyor import Budget, Jobs, Payload, Queue

#: Weight units per window, and the window (s): the test's load spans about four windows, and the test's
#: watcher of the Redis window (tests/integration/test_budgets.py) may stall up to a window without missing one.
LIMIT = 40
PER = 2.0
#: Spent by a reported job: the whole window at once.
REPORTED_LIMIT = 10
REPORTED_PER = 1.5

jobs = Jobs()
#: One attempt: a throttled job that spent an attempt would fail, and the test would see it.
BUDGETED = Queue("budgeted", concurrency=4, max_attempts=1, min_backoff=0.05, max_backoff=0.2)

WEIGHED = Budget("test-weight", limit=LIMIT, per=PER, key="tenant", weight="weight")
REPORTED = Budget("test-reported", limit=REPORTED_LIMIT, per=REPORTED_PER, key=lambda p: p.tenant, weight=0)

TABLE = """CREATE TABLE IF NOT EXISTS budget_runs (
    id SERIAL PRIMARY KEY, token TEXT NOT NULL, job_id TEXT NOT NULL, weight INTEGER NOT NULL,
    attempt INTEGER NOT NULL, deferrals INTEGER NOT NULL, pid INTEGER NOT NULL,
    at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(), spent_at TIMESTAMPTZ)"""
INSERT = (
    "INSERT INTO budget_runs (token, job_id, weight, attempt, deferrals, pid) VALUES (%s, %s, %s, %s, %s, %s) "
    "RETURNING id"
)


class Weighed(Payload):
    token: str
    tenant: str = "a"
    weight: int = 1
    spend: int = 0


def _record(payload: Weighed, ctx) -> int:
    deferrals = ctx.message.options.get("deferrals", 0) if ctx.message else 0
    with ctx.app.pool.connection() as conn:
        row = conn.execute(
            INSERT, (payload.token, ctx.job_id, payload.weight, ctx.attempt, deferrals, os.getpid())
        ).fetchone()
    return int(row[0])


@jobs.job("test.budget.weighed", queue=BUDGETED, payload=Weighed, budgets=[WEIGHED])
def weighed(payload: Weighed, ctx) -> None:
    _record(payload, ctx)


@jobs.job("test.budget.reported", queue=BUDGETED, payload=Weighed, budgets=[REPORTED])
def reported(payload: Weighed, ctx) -> None:
    run = _record(payload, ctx)
    if payload.spend:
        ctx.spend("test-reported", payload.spend)
        with ctx.app.pool.connection() as conn:
            conn.execute("UPDATE budget_runs SET spent_at = clock_timestamp() WHERE id = %s", (run,))
