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
against ``plain`` (ms and per cent). ``--work-ms`` gives each job that much
waiting (a provider call, say) before its effect: the same tools against a
job that does something. The machine's other load moves these figures:
compare within one run.

Then the tools alone (``"variant": "micro:…"``), on one connection, per
call, against the same effect's transaction: the once-guard's insert, the
completion's update (on rows held ``in_progress``), the fence's read.
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


#: Milliseconds each job waits before its effect (--work-ms).
WORK_MS = 0.0


def _effect(conn, ctx: JobContext) -> None:
    conn.execute(INSERT, (ctx.job_id, ctx.delivery))


def _work() -> None:
    if WORK_MS:
        time.sleep(WORK_MS / 1000)


@job("bench.effect.plain", queue=BENCH, payload=Tick)
def plain(payload: Tick, ctx: JobContext) -> None:
    _work()
    with ctx.app.pool.connection() as conn, conn.transaction():
        _effect(conn, ctx)


@job("bench.effect.once", queue=BENCH, payload=Tick)
def once(payload: Tick, ctx: JobContext) -> None:
    _work()
    with ctx.app.pool.connection() as conn, conn.transaction():
        if ctx.once(conn, "effect"):
            _effect(conn, ctx)


@job("bench.effect.transactional", queue=BENCH, payload=Tick)
def transactional(payload: Tick, ctx: JobContext) -> None:
    _work()
    with ctx.transaction() as conn:
        _effect(conn, ctx)


@job("bench.effect.check_fence", queue=BENCH, payload=Tick)
def check_fence(payload: Tick, ctx: JobContext) -> None:
    _work()
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


def micro(url: str, calls: int) -> dict[str, float]:
    """Milliseconds per call of each tool alone, on one connection, against the effect's own transaction."""
    from psycopg import connect

    from conveyor.brokers.postgres.jobs import Jobs
    from conveyor.tasks import steps

    migrate(url)
    jobs = Jobs(url, "bench")
    with connect(url, autocommit=True) as conn:
        conn.execute(EFFECTS)
        conn.execute(
            "INSERT INTO conveyor_jobs (id, queue, job, status, delivery, worker_id, message, picked_at) "
            "SELECT 'j' || i, 'q', 'bench', 'in_progress', 1, 'w', '{}'::jsonb, now() "
            "FROM generate_series(1, %s) AS i",
            (calls,),
        )

        def plain_tx(job_id: str) -> None:
            with conn.transaction():
                conn.execute(INSERT, (job_id, 1))

        def once_tx(job_id: str) -> None:
            with conn.transaction():
                if steps.record(conn, job_id, "effect", 1):
                    conn.execute(INSERT, (job_id, 1))

        def complete_tx(job_id: str) -> None:
            with conn.transaction():
                conn.execute(INSERT, (job_id, 1))
                jobs.complete_in(conn, job_id, 1)

        def fence(job_id: str) -> None:
            jobs.is_current(job_id, 1)

        # Interleaved, call by call, and compared by medians: a commit's fsync varies far more
        # than what the tools add, and the machine's load drifts.
        bodies = {"plain": plain_tx, "once": once_tx, "transactional": complete_tx, "check_fence": fence}
        times: dict[str, list[float]] = {name: [] for name in bodies}
        for i in range(1, calls + 1):
            for name, body in bodies.items():
                started = time.perf_counter()
                body(f"j{i}")
                times[name].append((time.perf_counter() - started) * 1000)
        base = statistics.median(times["plain"])
        figures = {
            "once": statistics.median(times["once"]) - base,
            "transactional": statistics.median(times["transactional"]) - base,
            "check_fence": statistics.median(times["check_fence"]),
        }
    jobs.close()
    return {"effect_transaction": base, **figures}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--work-ms", type=float, default=0.0)
    parser.add_argument("--micro-calls", type=int, default=2000)
    args = parser.parse_args()
    global WORK_MS
    WORK_MS = args.work_ms

    from tests.support.servers import PostgresServer

    seconds: dict[str, list[float]] = {v: [] for v in VARIANTS}
    with PostgresServer(tempfile.mkdtemp(prefix="conveyor-bench-effects-"), settings=DURABLE) as pg:
        for _ in range(args.rounds):
            for variant in VARIANTS:
                db = f"bench_{variant}_{uuid.uuid4().hex[:6]}"
                pg.create_database(db)
                seconds[variant].append(drain(pg.url(db), variant, args.jobs, args.threads))
                pg.drop_database(db)
        db = f"bench_micro_{uuid.uuid4().hex[:6]}"
        pg.create_database(db)
        figures = micro(pg.url(db), args.micro_calls)
    base = statistics.median(seconds["plain"]) / args.jobs
    for variant in VARIANTS:
        per_job = statistics.median(seconds[variant]) / args.jobs
        print(
            json.dumps(
                {
                    "variant": variant,
                    "jobs": args.jobs,
                    "threads": args.threads,
                    "work_ms": args.work_ms,
                    "jobs_per_s": round(1 / per_job),
                    "ms_per_job": round(per_job * 1000, 3),
                    "cost_ms_per_job": round((per_job - base) * 1000, 3),
                    "cost_pct": round((per_job / base - 1) * 100, 1),
                    "rounds_s": [round(s, 2) for s in seconds[variant]],
                }
            ),
            flush=True,
        )
    for name, ms in figures.items():
        print(json.dumps({"variant": f"micro:{name}", "calls": args.micro_calls, "ms_per_call": round(ms, 3)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
