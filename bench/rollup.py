"""What the charts' rollup costs a job: drain rate with it on (flushing every 2 s) and off.

    .venv/bin/python bench/rollup.py [--jobs 3000] [--threads 8] [--rounds 3] [--brokers redis,postgres]

On private servers (tests/support/servers.py: Redis without persistence,
Postgres with its defaults), one worker process of ``--threads`` threads
drains ``--jobs`` no-op jobs enqueued first, with
``CONVEYOR_ROLLUP_FLUSH_SECONDS=2`` (on) and ``0`` (off), variants taking
turns for ``--rounds`` rounds on fresh data. The median drain per variant is
printed, one JSON line each, with the cost per job of "on" (ms and per
cent) and how many batched writes the rollup made. The machine's other load
moves these figures: compare within one run.
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
from conveyor.brokers.rollup import rollup_store  # noqa: E402
from conveyor.schema.migrate import migrate  # noqa: E402
from conveyor.settings import Settings  # noqa: E402
from conveyor.tasks.context import JobContext  # noqa: E402
from conveyor.tasks.jobqueue import JobRequest  # noqa: E402
from conveyor.tasks.payloads import Payload  # noqa: E402
from conveyor.tasks.queues import Queue  # noqa: E402
from conveyor.tasks.registry import job  # noqa: E402
from conveyor.tasks.worker import ProcessWorker  # noqa: E402

QUEUE = "bench_rollup"
BENCH = Queue(QUEUE, concurrency=8)
VARIANTS = {"off": 0.0, "on": 2.0}


class Tick(Payload):
    n: int


@job("bench.rollup.noop", queue=BENCH, payload=Tick)
def noop(payload: Tick, ctx: JobContext) -> None:
    pass


class CountingStore:
    """The real store, its batched writes counted."""

    def __init__(self, store) -> None:  # type: ignore[no-untyped-def]
        self.store = store
        self.writes = 0

    def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
        return getattr(self.store, name)

    def write(self, flush_id, groups):  # type: ignore[no-untyped-def]
        self.writes += 1
        return self.store.write(flush_id, groups)


def drain(settings: Settings, jobs: int, threads: int) -> tuple[float, int, int]:
    """(seconds to drain, batched rollup writes, jobs the rollup counted completed)."""
    app = App(settings)
    try:
        from conveyor.brokers import rollup as rollup_package

        counting = CountingStore(rollup_store(app))
        rollup_package._stores[app.broker] = counting  # type: ignore[assignment]
        for first in range(0, jobs, 500):  # outside the timing
            app.jobs.enqueue_many(
                [JobRequest("bench.rollup.noop", {"n": i}) for i in range(first, min(jobs, first + 500))]
            )
        counting.writes = 0
        start_total = app.broker.queue_counts(QUEUE).completed_total
        worker = ProcessWorker(app, QUEUE, threads=threads)
        started = time.perf_counter()
        worker.start()
        while app.broker.queue_counts(QUEUE).completed_total - start_total < jobs:
            time.sleep(0.01)
        elapsed = time.perf_counter() - started
        worker.stop()
        writes = counting.writes
        completed = 0
        if settings.rollup_flush_seconds:
            from conveyor.middleware.rollup import find_rollup

            rollup = find_rollup(app.broker)
            assert rollup is not None
            rollup.flush()
            completed = sum(r.tally.completed for r in counting.read(QUEUE, 3600)[1])
        return elapsed, writes, completed
    finally:
        app.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=3000)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--brokers", default="redis,postgres")
    args = parser.parse_args()

    from tests.support.servers import PostgresServer, RedisServer

    for broker in args.brokers.split(","):
        seconds: dict[str, list[float]] = {v: [] for v in VARIANTS}
        writes: list[int] = []
        with (
            RedisServer(tempfile.mkdtemp(prefix="conveyor-bench-rollup-"))
            if broker == "redis"
            else PostgresServer(tempfile.mkdtemp(prefix="conveyor-bench-rollup-"))
        ) as server:
            for _ in range(args.rounds):
                for variant, flush in VARIANTS.items():
                    if broker == "redis":
                        ns = f"bench{uuid.uuid4().hex[:6]}"
                        settings = Settings(
                            broker="redis",
                            redis_url=server.url,
                            redis_namespace=ns,
                            rollup_flush_seconds=flush,
                            platform=False,
                        )
                    else:
                        db = f"bench_{uuid.uuid4().hex[:6]}"
                        server.create_database(db)
                        migrate(server.url(db))
                        settings = Settings(
                            broker="postgres", database_url=server.url(db), rollup_flush_seconds=flush, platform=False
                        )
                    elapsed, n, completed = drain(settings, args.jobs, args.threads)
                    seconds[variant].append(elapsed)
                    if flush:
                        writes.append(n)
                        assert completed == args.jobs, f"the rollup counted {completed} of {args.jobs}"
        base = statistics.median(seconds["off"]) / args.jobs
        for variant in VARIANTS:
            per_job = statistics.median(seconds[variant]) / args.jobs
            line = {
                "broker": broker,
                "rollup": variant,
                "jobs": args.jobs,
                "threads": args.threads,
                "jobs_per_s": round(1 / per_job),
                "ms_per_job": round(per_job * 1000, 4),
                "cost_ms_per_job": round((per_job - base) * 1000, 4),
                "cost_pct": round((per_job / base - 1) * 100, 1),
                "rounds_s": [round(s, 2) for s in seconds[variant]],
            }
            if variant == "on":
                line["batched_writes_per_drain"] = writes
            print(json.dumps(line), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
