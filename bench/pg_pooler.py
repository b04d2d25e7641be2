"""The Postgres broker through PgBouncer (transaction pooling): what the pooler and polling cost.

    .venv/bin/python -m bench.pg_pooler [--jobs 2000] [--threads 8] [--samples 100] [--poll 0.5]

A private durable Postgres and a private PgBouncer in transaction mode in
front of it (tests/support/servers.py); for each way in, on a fresh
database, bench/pg_quick.py's three figures (single enqueues, one worker
draining the backlog, enqueue -> start latency with the worker idle):

- direct: DATABASE_URL names Postgres (LISTEN on it, prepared statements);
- pgbouncer+listen: through PgBouncer (``CONVEYOR_DATABASE_POOLED``), LISTEN on a
  direct ``CONVEYOR_LISTEN_DATABASE_URL``;
- pgbouncer+poll: through PgBouncer, no listen URL: the worker polls every ``--poll`` s.

One JSON line per way in.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

WAYS = ("direct", "pgbouncer+listen", "pgbouncer+poll")


def run(way: str, url: str, direct: str, threads: int, jobs: int, samples: int, poll: float) -> dict:
    sys.path.insert(0, str(ROOT))
    from bench.pg_quick import QUEUE, Probe, measure
    from conveyor.app import App
    from conveyor.schema.migrate import migrate
    from conveyor.settings import Settings
    from conveyor.tasks.payloads import Payload
    from conveyor.tasks.registry import job
    from conveyor.tasks.worker import ProcessWorker

    probe = Probe()

    class Noop(Payload):
        token: str

    @job("bench.noop", queue=QUEUE, payload=Noop)
    def noop(payload: Noop, ctx) -> None:
        probe.hit(payload.token)

    migrate(direct)  # migrations hold a session advisory lock: never through the pooler
    pooled = way != "direct"
    settings = Settings(
        broker="postgres",
        database_url=url,
        database_pooled=pooled,
        listen_database_url=direct if way == "pgbouncer+listen" else None,
        pg_poll_seconds=poll,
    )
    app = App(settings)
    worker = ProcessWorker(app, QUEUE, threads=threads)
    try:
        return measure(
            direct,
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--samples", type=int, default=100)
    parser.add_argument("--poll", type=float, default=0.5, help="pg_poll_seconds (default 0.5)")
    parser.add_argument("--way", choices=WAYS, help="(internal) measure one way in")
    parser.add_argument("--url", help="(internal) the database URL of --way")
    parser.add_argument("--direct", help="(internal) the same database, directly")
    args = parser.parse_args()

    if args.way:
        result = run(args.way, args.url, args.direct, args.threads, args.jobs, args.samples, args.poll)
        print(json.dumps({"way": args.way, "threads": args.threads, "poll_s": args.poll, **result}), flush=True)
        return 0

    sys.path.insert(0, str(ROOT))
    from bench.pg_quick import DURABLE
    from tests.support.servers import PgBouncerServer, PostgresServer

    with (
        PostgresServer(tempfile.mkdtemp(prefix="conveyor-bench-pg-"), settings=DURABLE) as pg,
        PgBouncerServer(pg) as bouncer,
    ):
        for way in WAYS:
            db = f"bench_pooler_{uuid.uuid4().hex[:8]}"
            pg.create_database(db)
            url = pg.url(db) if way == "direct" else bouncer.url(db)
            argv = [sys.executable, "-m", "bench.pg_pooler", "--way", way, "--url", url, "--direct", pg.url(db)]
            argv += ["--jobs", str(args.jobs), "--threads", str(args.threads), "--samples", str(args.samples)]
            argv += ["--poll", str(args.poll)]
            out = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, timeout=1800)
            lines = [line for line in out.stdout.splitlines() if line.startswith('{"way"')]
            if out.returncode or not lines:
                print(json.dumps({"way": way, "error": out.stderr.strip().splitlines()[-5:]}), flush=True)
                continue
            print(lines[-1], flush=True)
            pg.terminate_connections(db)
            pg.drop_database(db)
    return 0


if __name__ == "__main__":
    sys.exit(main())
