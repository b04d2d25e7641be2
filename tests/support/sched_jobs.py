"""A job for the scheduling tests: records each run in the test database (CONVEYOR_IMPORTS=tests.support.sched_jobs)."""

from __future__ import annotations

import pytest
from psycopg.types.json import Jsonb

from conveyor.blueprints import Jobs
from conveyor.platform.queues import INDEXING
from conveyor.tasks.payloads import Id, Payload
from tests.support.brokers import ALL_BROKERS

#: The table the job writes to; tests create it with RECORDS_DDL.
RECORDS_DDL = "CREATE TABLE IF NOT EXISTS test_job_runs (id BIGSERIAL PRIMARY KEY, job_id TEXT, payload JSONB)"

#: This module's blueprint: an App whose CONVEYOR_IMPORTS names the module includes it.
jobs = Jobs()


class Note(Payload):
    """Something to record."""

    note: Id


@jobs.job("test.record", queue=INDEXING, payload=Note)
def record(payload: Note, ctx) -> None:
    with ctx.app.pool.connection() as conn:
        conn.execute(
            "INSERT INTO test_job_runs (job_id, payload) VALUES (%s, %s)", (ctx.job_id, Jsonb(payload.model_dump()))
        )


def runs(app) -> list[dict]:
    """Every recorded run's payload, in order."""
    with app.pool.connection() as conn:
        return [row[0] for row in conn.execute("SELECT payload FROM test_job_runs ORDER BY id")]


def make_app(database_url: str, redis_url: str | None = None, broker: str | None = None, **settings):
    """An App on the test's database and ``broker`` (default: redis with a Redis URL, else inline), with the
    test job loaded and the table it writes to."""
    from conveyor.app import App
    from conveyor.settings import Settings

    broker = broker or ("redis" if redis_url else "inline")
    settings = {
        "shutdown_timeout": 5,
        "pg_poll_seconds": 0.2,
        "pg_recovery_seconds": 0.5,
        "pg_lease_seconds": 2,
        **settings,
    }
    app = App(
        Settings(
            broker=broker,
            redis_url=redis_url,
            database_url=database_url,
            imports="tests.support.sched_jobs",
            **settings,
        )
    )
    with app.pool.connection() as conn:
        conn.execute(RECORDS_DDL)
    return app


@pytest.fixture(params=ALL_BROKERS)
def any_broker_app(request, database_url):
    """An App (see make_app) on each broker in turn."""
    redis_url = request.getfixturevalue("redis_url") if request.param == "redis" else None
    app = make_app(database_url, redis_url, broker=request.param)
    yield app
    app.close()
