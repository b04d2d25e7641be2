"""Job types for the dashboard's groups and budgets tests (CONVEYOR_IMPORTS=tests.support.dashboard_jobs).

``dash.work`` runs on ``tenants``, a queue whose groups hold one job each at most and which has a
budget of its own (the tests keep it paused: its groups' jobs stay waiting). ``dash.metered`` runs on
``metered``; both job types take from ``dash-tokens``, keyed by the payload's ``tenant`` and weighed by
its ``weight``.
"""

from __future__ import annotations

import time

from conveyor import Budget, Jobs, Payload, Queue

jobs = Jobs()

#: One job of a group held at once: a group's second job waits for the first.
TENANTS = Queue(
    "tenants",
    concurrency=4,
    group_concurrency=1,
    max_attempts=1,
    min_backoff=0.05,
    max_backoff=0.2,
    budgets=[Budget("dash-starts", limit=1000, per=60)],
)
#: 50 per 30 s per tenant: a second job of weight 30 within the window waits.
TOKENS = Budget("dash-tokens", limit=50, per=30, key="tenant", weight="weight")


class Work(Payload):
    tenant: str = "a"
    weight: int = 1
    sleep: float = 0


def _run(payload: Work) -> None:
    until = time.monotonic() + payload.sleep
    while time.monotonic() < until:
        time.sleep(min(0.05, max(0.0, until - time.monotonic())))


@jobs.job("dash.work", queue=TENANTS, payload=Work, budgets=[TOKENS])
def work(payload: Work, ctx) -> None:
    _run(payload)


METERED = Queue("metered", concurrency=2, max_attempts=1, min_backoff=0.05, max_backoff=0.2)


@jobs.job("dash.metered", queue=METERED, payload=Work, budgets=[TOKENS])
def metered(payload: Work, ctx) -> None:
    _run(payload)
