"""What the exactly-once tools cost a job: the once-guard, the completion in the job's transaction, the fence check.

    .venv/bin/python bench/effects.py [--jobs 2000] [--threads 8] [--rounds 3]

On a private, durable Postgres (fsync and synchronous_commit on), the
postgres broker drains ``--jobs`` jobs with one worker process of
``--threads`` threads, once per variant of the same job, each writing one
effect row in its own transaction (the smallest job with an effect):

- ``plain``: the effect in its transaction; the ordinary ack.
- ``once``: the same, plus ``ctx.once(conn, "effect")`` in that transaction.
- ``transactional``: ``with ctx.transaction() as conn:`` the effect, the job
  completed in the same commit (the ack then writes nothing).
- ``check_fence``: ``plain`` plus one ``ctx.check_fence()`` (uncached: one read).

Variants take turns for ``--rounds`` rounds, each on a fresh database; the
median per variant is printed, one JSON line each, with its cost per job
against ``plain`` (ms and per cent). The machine's other load moves these
figures by a few per cent: compare within one run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from conveyor.app import App  # noqa: E402
from conveyor.schema.migrate import migrate  # noqa: E402
from conveyor.settings import Settings  # noqa: E402
from conveyor.tasks.context import JobContext  # noqa: E402
from conveyor.tasks.jobqueue import JobRequest  # noqa: E402
from conveyor.tasks.payloads import Payload  # noqa: E402
from conveyor.tasks.queues import Queue  # noqa: E402
from conveyor.tasks.registry import job  # noqa: E402
from conveyor.tasks.worker import ProcessWorker  # noqa: E402

DURABLE = {"fsync": "on", "synchronous_commit": "on", "full_page_writes": "on"}
QUEUE = "bench_effects"
EFFECTS = "CREATE TABLE bench_effects (job_id TEXT NOT NULL, delivery INT)"
INSERT = "INSERT INTO bench_effects (job_id, delivery) VALUES (%s, %s)"
VARIANTS = ("plain", "once", "transactional", "check_fence")


BENCH = Queue(QUEUE, concurrency=8)


class Tick(Payload):
    n: int


def _effect(conn, ctx: JobContext) -> None:
    conn.execute(INSERT, (ctx.job_id, ctx.delivery))


@job("bench.effect.plain", queue=BENCH, payload=Tick)
def plain(payload: Tick, ctx: JobContext) -> None:
    with ctx.app.pool.connection() as conn, conn.transaction():
        _effect(conn, ctx)


@job("bench.effect.once", queue=BENCH, payload=Tick)
def once(payload: Tick, ctx: JobContext) -> None:
    with ctx.app.pool.connection() as conn, conn.transaction():
        if ctx.once(conn, "effect"):
            _effect(conn, ctx)


@job("bench.effect.transactional", queue=BENCH, payload=Tick)
def transactional(payload: Tick, ctx: JobContext) -> None:
    with ctx.transaction() as conn:
        _effect(conn, ctx)


@job("bench.effect.check_fence", queue=BENCH, payload=Tick)
def check_fence(payload: Tick, ctx: JobContext) -> None:
    ctx.check_fence()
    with ctx.app.pool.connection() as conn, conn.transaction():
        _effect(conn, ctx)


def drain(url: str, variant: str, jobs: int, threads: int) -> float:
    """Seconds one worker process takes to run ``jobs`` jobs of ``variant`` (enqueued first)."""
    migrate(url)
    app = App(Settings(broker="postgres", database_url=url, platform=False))
    try:
        with app.pool.connection() as conn:
            conn.execute(EFFECTS)
        for first in range(0, jobs, 500):  # outside the timing
            app.jobs.enqueue_many(
                [JobRequest(f"bench.effect.{variant}", {"n": i}) for i in range(first, min(jobs, first + 500))]
            )
        worker = ProcessWorker(app, QUEUE, threads=threads)
        started = time.perf_counter()
        worker.start()
        with app.pool.connection() as conn:
            while conn.execute("SELECT count(*) FROM conveyor_jobs WHERE status <> 'done'").fetchone()[0]:
                time.sleep(0.01)
        elapsed = time.perf_counter() - started
        worker.stop()
        with app.pool.connection() as conn:
            written = conn.execute("SELECT count(*) FROM bench_effects").fetchone()[0]
        assert written == jobs, f"{variant}: {written} effects for {jobs} jobs"
        return elapsed
    finally:
        app.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    from tests.support.servers import PostgresServer

    seconds: dict[str, list[float]] = {v: [] for v in VARIANTS}
    with PostgresServer(tempfile.mkdtemp(prefix="conveyor-bench-effects-"), settings=DURABLE) as pg:
        for _ in range(args.rounds):
            for variant in VARIANTS:
                db = f"bench_{variant}_{uuid.uuid4().hex[:6]}"
                pg.create_database(db)
                seconds[variant].append(drain(pg.url(db), variant, args.jobs, args.threads))
                pg.drop_database(db)
    base = statistics.median(seconds["plain"]) / args.jobs
    for variant in VARIANTS:
        per_job = statistics.median(seconds[variant]) / args.jobs
        print(
            json.dumps(
                {
                    "variant": variant,
                    "jobs": args.jobs,
                    "threads": args.threads,
                    "jobs_per_s": round(1 / per_job),
                    "ms_per_job": round(per_job * 1000, 3),
                    "cost_ms_per_job": round((per_job - base) * 1000, 3),
                    "cost_pct": round((per_job / base - 1) * 100, 1),
                    "rounds_s": [round(s, 2) for s in seconds[variant]],
                }
            ),
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
