"""An async job type for tests of worker processes (CONVEYOR_IMPORTS=tests.support.jobs,tests.support.async_jobs).

``test.aprobe`` records its start and its finish in ``probe_runs`` (as ``test.probe.*`` does) around an
``asyncio.sleep``; its queue ``aio_proc`` has only async jobs, so its workers run on a few threads.
"""

from __future__ import annotations

import asyncio
import os

import psycopg

from conveyor.blueprints import Jobs, Queue
from conveyor.tasks.payloads import Payload
from tests.support.jobs import FINISH_RUN, INSERT_RUN

jobs = Jobs()
AIO_PROC = Queue("aio_proc", concurrency=50, max_attempts=3, min_backoff=0.05, max_backoff=0.2, time_limit=60)


class Nap(Payload):
    token: str
    sleep: float = 0


def _write(sql: str, *args: object) -> object:
    with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as conn:
        row = conn.execute(sql, args).fetchone() if "RETURNING" in sql else conn.execute(sql, args)
    return row[0] if isinstance(row, tuple) else None


@jobs.job("test.aprobe", queue=AIO_PROC, payload=Nap)
async def aprobe(payload: Nap, ctx) -> None:
    run_id = await asyncio.to_thread(_write, INSERT_RUN, payload.token, ctx.job_id, ctx.attempt, os.getpid())
    await asyncio.sleep(payload.sleep)
    await asyncio.to_thread(_write, FINISH_RUN, run_id)
