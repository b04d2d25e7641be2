"""Postgres recovery and a stepped server clock: no live worker declared dead, no dead one kept alive.

Liveness is judged on the server's clock (heartbeats stamped and compared
with ``now()``). A step of that clock moves every comparison at once; each
recovery pass compares the server's clock with its own monotonic clock since
its previous pass and, after a step, declares nobody dead for a lease. The
step is simulated in the data, as the house does: recovery takes ``now``
(``coalesce(%(now)s, now())``) and its monotonic clock is moved with it.
"""

from __future__ import annotations

from datetime import datetime, timedelta

import psycopg
import pytest

from conveyor.app import App
from tests.support.harness import make_settings

LEASE = 2.0


class Monotonic:
    """A monotonic clock the test moves together with the server's ``now`` it passes."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def sql(database_url: str, query: str, params=None) -> list[tuple]:
    with psycopg.connect(database_url, autocommit=True) as conn:
        cur = conn.execute(query, params)
        return cur.fetchall() if cur.description else []


@pytest.fixture
def app(clean_env, database_url):
    app = App(make_settings("postgres", None, database_url, pg_lease_seconds=LEASE))
    yield app
    app.close()


def _held(app, database_url, worker: str, heartbeat_at: datetime) -> tuple[str, datetime]:
    """A job held by ``worker`` whose last heartbeat was stamped ``heartbeat_at``; returns its id and the
    server's clock now."""
    ref = app.jobs.enqueue("test.probe.nudge", {"token": "held"})
    sql(
        database_url,
        "INSERT INTO conveyor_workers (id, hostname, pid, heartbeat_at) VALUES (%s, 'test', 0, %s)",
        (worker, heartbeat_at),
    )
    sql(
        database_url,
        "UPDATE conveyor_jobs SET status = 'in_progress', worker_id = %s, delivery = 1, picked_at = %s WHERE id = %s",
        (worker, heartbeat_at, ref.id),
    )
    return ref.id


def _server_now(database_url) -> datetime:
    return sql(database_url, "SELECT now()")[0][0]


def test_a_forward_clock_step_declares_no_live_worker_dead(app, database_url):
    recovery, clock = app.broker.recovery, Monotonic()
    recovery.monotonic = clock
    base = _server_now(database_url)
    job_id = _held(app, database_url, "live-worker", base)
    assert recovery.recover(own_rows=False, now=base) == {}, "a live worker's job stays"

    # One second later by every clock but the server's, stepped a minute ahead: the heartbeat looks 61 s old.
    clock.t += 1
    assert recovery.recover(own_rows=False, now=base + timedelta(seconds=61)) == {}, "nobody dead after a step"
    # The live worker heartbeats on the new clock and keeps its job.
    sql(database_url, "UPDATE conveyor_workers SET heartbeat_at = %s", (base + timedelta(seconds=61.5),))
    clock.t += 1.5
    assert recovery.recover(own_rows=False, now=base + timedelta(seconds=62.5)) == {}
    # Then it dies: a lease later, on the new clock, its job comes back.
    clock.t += LEASE + 1
    recovered = recovery.recover(own_rows=False, now=base + timedelta(seconds=62.5 + LEASE + 1))
    assert recovered == {"nudge": [job_id]}, "the guard re-arms for one lease, not for good"


def test_a_backward_clock_step_keeps_no_dead_worker_alive(app, database_url):
    recovery, clock = app.broker.recovery, Monotonic()
    recovery.monotonic = clock
    base = _server_now(database_url)
    job_id = _held(app, database_url, "dead-worker", base)
    assert recovery.recover(own_rows=False, now=base) == {}

    # The server's clock goes back an hour; the worker died at `base` and never beats again.
    back = base - timedelta(hours=1)
    clock.t += 1
    assert recovery.recover(own_rows=False, now=back + timedelta(seconds=1)) == {}
    clock.t += LEASE + 1
    recovered = recovery.recover(own_rows=False, now=back + timedelta(seconds=LEASE + 2))
    assert recovered == {"nudge": [job_id]}, "a dead worker is recovered a lease after the step, not an hour"


def test_no_step_no_rearm(app, database_url):
    recovery, clock = app.broker.recovery, Monotonic()
    recovery.monotonic = clock
    base = _server_now(database_url)
    job_id = _held(app, database_url, "dead-worker", base)
    assert recovery.recover(own_rows=False, now=base) == {}
    clock.t += LEASE + 1
    assert recovery.recover(own_rows=False, now=base + timedelta(seconds=LEASE + 1)) == {"nudge": [job_id]}
    assert sql(database_url, "SELECT count(*) FROM conveyor_recovery_clock")[0][0] == 0


def test_a_process_that_starts_after_a_step_declares_nobody_dead_for_a_lease(app, database_url):
    """Its first check has no earlier one to compare with: a step just before it is one it cannot see."""
    recovery, clock = app.broker.recovery, Monotonic()
    recovery.monotonic = clock
    base = _server_now(database_url)
    job_id = _held(app, database_url, "live-worker", base)
    # The server's clock was stepped a minute ahead just before this process's first pass.
    assert recovery.recover(own_rows=False, now=base + timedelta(seconds=61)) == {}, "a live worker's job stays"
    clock.t += LEASE / 2
    assert recovery.recover(own_rows=False, now=base + timedelta(seconds=61 + LEASE / 2)) == {}
    # The live worker died without a beat on the new clock: once this process has watched for a lease, it is.
    clock.t += LEASE / 2 + 0.1
    recovered = recovery.recover(own_rows=False, now=base + timedelta(seconds=61 + LEASE + 0.1))
    assert recovered == {"nudge": [job_id]}


def test_a_recover_statement_on_another_clock_takes_nothing(app, database_url):
    """The step check and the statement may run on different connections (a failover, a server whose
    clock some sessions see stepped before others): the statement acts only on the clock just checked."""
    base = _server_now(database_url)
    job_id = _held(app, database_url, "dead-worker", base)
    later = base + timedelta(seconds=LEASE + 5)
    jobs = app.broker.jobs
    assert jobs.recover(LEASE, 10, later, clock=(base.timestamp(), 0.5)) == []
    rows = jobs.recover(LEASE, 10, later, clock=(later.timestamp(), 0.5))
    assert [r[0] for r in rows] == [job_id]
