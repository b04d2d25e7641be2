"""Quick figures for the Postgres broker, and the same figures for its peers on the same Postgres.

    .venv/bin/python bench/pg_quick.py [--jobs 5000] [--threads 8] [--samples 200]
        [--peer dramatiq-postgres=/path/to/venv/bin/python] [--peer dramatiq-pg=/path/to/python]

It starts a private, durable Postgres (fsync and synchronous_commit on;
tests/support/servers.py), then for each system, on a fresh database:

- enqueue: ``--jobs`` single enqueues, one after the other (jobs/s);
- throughput: one worker process with ``--threads`` threads drains that
  backlog of no-op jobs; jobs/s from the worker's start to the last ack;
- latency: with the worker idle, ``--samples`` jobs one at a time; the
  time from the enqueue call to the job starting (p50 / p95).

A peer runs in its own interpreter (its own virtualenv: dramatiq-pg needs
Dramatiq 1.x), which runs this file with ``--system``. One JSON line per system.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: Durable: what a production Postgres does at commit.
DURABLE = {"fsync": "on", "synchronous_commit": "on", "full_page_writes": "on"}

QUEUE = "critical"


class Probe:
    """What the no-op job reports: when each job started, and a wake-up for the latency loop."""

    def __init__(self) -> None:
        self.started: dict[str, float] = {}
        self.event = threading.Event()

    def hit(self, token: str) -> None:
        self.started[token] = time.time()
        self.event.set()


def remaining(url: str, query: str) -> int:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        return conn.execute(query).fetchone()[0]


def measure(
    url: str, enqueue, start_worker, stop_worker, remaining_query: str, probe: Probe, jobs: int, samples: int
) -> dict:
    t0 = time.perf_counter()
    for i in range(jobs):
        enqueue(f"bulk-{i}")
    enqueue_s = time.perf_counter() - t0

    t0 = time.perf_counter()
    start_worker()
    while remaining(url, remaining_query):
        time.sleep(0.02)
    drain_s = time.perf_counter() - t0

    latencies = []
    time.sleep(1.0)  # idle: every consumer back asleep
    for i in range(samples):
        token = f"lat-{i}"
        probe.event.clear()
        t0 = time.time()
        enqueue(token)
        if not probe.event.wait(10):
            raise RuntimeError(f"job {token} did not start within 10 s")
        latencies.append(probe.started[token] - t0)
        time.sleep(0.03)  # let its ack land and the consumer sleep again
    stop_worker()
    latencies.sort()
    return {
        "jobs": jobs,
        "enqueue_jobs_per_s": round(jobs / enqueue_s),
        "claim_ack_jobs_per_s": round(jobs / drain_s),
        "latency_p50_ms": round(statistics.median(latencies) * 1000, 2),
        "latency_p95_ms": round(latencies[int(len(latencies) * 0.95) - 1] * 1000, 2),
    }


# -- the systems -------------------------------------------------------------------


def run_conveyor(url: str, threads: int, jobs: int, samples: int, sync_worker_commits: bool = False) -> dict:
    sys.path.insert(0, str(ROOT))
    import conveyor.brokers.postgres.jobs
    from conveyor.app import App
    from conveyor.schema.migrate import migrate
    from conveyor.settings import Settings
    from conveyor.tasks.payloads import Payload
    from conveyor.tasks.registry import job
    from conveyor.tasks.worker import ProcessWorker

    conveyor.brokers.postgres.jobs.WORKER_SYNCHRONOUS_COMMIT = sync_worker_commits
    probe = Probe()

    class Noop(Payload):
        token: str

    @job("bench.noop", queue=QUEUE, payload=Noop)
    def noop(payload: Noop, ctx) -> None:
        probe.hit(payload.token)

    migrate(url)
    app = App(Settings(broker="postgres", database_url=url))
    worker = ProcessWorker(app, QUEUE, threads=threads)
    try:
        return measure(
            url,
            lambda token: app.jobs.enqueue("bench.noop", {"token": token}),
            worker.start,
            worker.stop,
            "SELECT count(*) FROM conveyor_jobs WHERE status <> 'done'",
            probe,
            jobs,
            samples,
        )
    finally:
        app.close()


def run_dramatiq_postgres(url: str, threads: int, jobs: int, samples: int) -> dict:
    import dramatiq
    import psycopg
    from dramatiq_postgres import PostgresBroker
    from dramatiq_postgres.schema import init

    with psycopg.connect(url, autocommit=True) as conn, conn.cursor() as cur:
        init(cur)
    broker = PostgresBroker(url=url, results=False)
    return _run_dramatiq(
        broker, dramatiq, url, threads, jobs, samples, "SELECT count(*) FROM dramatiq.queue WHERE state <> 'rejected'"
    )


def run_dramatiq_pg(url: str, threads: int, jobs: int, samples: int) -> dict:
    import dramatiq
    import psycopg2
    from dramatiq_pg import PostgresBroker
    from dramatiq_pg.schema import generate_init_sql

    with psycopg2.connect(url) as conn, conn.cursor() as cur:
        cur.execute(generate_init_sql())
    broker = PostgresBroker(url=url, results=False)
    return _run_dramatiq(
        broker,
        dramatiq,
        url,
        threads,
        jobs,
        samples,
        "SELECT count(*) FROM dramatiq.queue WHERE state IN ('queued', 'consumed')",
    )


def _run_dramatiq(broker, dramatiq, url, threads, jobs, samples, remaining_query) -> dict:
    probe = Probe()
    dramatiq.set_broker(broker)

    @dramatiq.actor(queue_name=QUEUE, broker=broker)
    def noop(token):
        probe.hit(token)

    worker = dramatiq.Worker(broker, worker_threads=threads, worker_timeout=1000)

    def start():
        broker.emit_after("process_boot")
        worker.start()

    try:
        return measure(url, lambda token: noop.send(token), start, worker.stop, remaining_query, probe, jobs, samples)
    finally:
        broker.close()


SYSTEMS = {
    "conveyor": run_conveyor,
    # The same, with the worker's claims, starts and acks waiting for the WAL flush.
    "conveyor-sync": lambda *args: run_conveyor(*args, sync_worker_commits=True),
    "dramatiq-postgres": run_dramatiq_postgres,
    "dramatiq-pg": run_dramatiq_pg,
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument(
        "--peer",
        action="append",
        default=[],
        metavar="NAME=PYTHON",
        help="also measure a peer (dramatiq-postgres, dramatiq-pg) with that interpreter",
    )
    parser.add_argument("--system", choices=sorted(SYSTEMS), help="(internal) measure one system on --url")
    parser.add_argument("--url", help="(internal) the database of --system")
    args = parser.parse_args()

    if args.system:
        result = SYSTEMS[args.system](args.url, args.threads, args.jobs, args.samples)
        print(json.dumps({"system": args.system, "threads": args.threads, **result}), flush=True)
        return 0

    sys.path.insert(0, str(ROOT))
    from tests.support.servers import PostgresServer

    runs = [("conveyor", sys.executable), ("conveyor-sync", sys.executable)]
    runs += [tuple(p.split("=", 1)) for p in args.peer]
    with PostgresServer(tempfile.mkdtemp(prefix="conveyor-bench-pg-"), settings=DURABLE) as pg:
        for name, python in runs:
            db = f"bench_{name.replace('-', '_')}_{uuid.uuid4().hex[:6]}"
            pg.create_database(db)
            out = subprocess.run(
                [
                    python,
                    __file__,
                    "--system",
                    name,
                    "--url",
                    pg.url(db),
                    "--jobs",
                    str(args.jobs),
                    "--threads",
                    str(args.threads),
                    "--samples",
                    str(args.samples),
                ],
                capture_output=True,
                text=True,
                cwd=ROOT,
                timeout=1800,
            )
            lines = [line for line in out.stdout.splitlines() if line.startswith('{"system"')]
            if out.returncode or not lines:
                print(json.dumps({"system": name, "error": out.stderr.strip().splitlines()[-5:]}), flush=True)
                continue
            print(lines[-1], flush=True)
            pg.drop_database(db)
    return 0


if __name__ == "__main__":
    sys.exit(main())
