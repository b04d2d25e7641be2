"""Where the exactly-once tools' time goes on the server: bench/effects.py's drains, profiled.

    .venv/bin/python bench/effects_profile.py [plain once transactional check_fence] [--jobs 3000]

Each named variant of bench/effects.py drains ``--jobs`` jobs on a private,
durable Postgres with pg_stat_statements loaded; printed per variant: the
statements by total server time (calls, mean ms, total ms), then what the
active sessions waited on, sampled every 2 ms (``cpu``: not waiting). A
completion queued behind another transaction's row lock shows as
``Lock:transactionid`` and in its statement's mean. The sampling costs a
little throughput: compare variants within one run.
"""

from __future__ import annotations

import argparse
import collections
import sys
import tempfile
import threading
import time
import uuid

import effects
from psycopg import connect

from tests.support.servers import PostgresServer

STATEMENTS = """
SELECT calls, mean_exec_time, total_exec_time, regexp_replace(left(query, 70), '\\s+', ' ', 'g')
FROM pg_stat_statements WHERE calls >= 100 ORDER BY total_exec_time DESC LIMIT 12
"""
WAITS = """
SELECT coalesce(wait_event_type || ':' || wait_event, 'cpu'), left(query, 40)
FROM pg_stat_activity WHERE datname = current_database() AND state = 'active' AND pid <> pg_backend_pid()
"""


def profile(url: str, variant: str, jobs: int) -> None:
    with connect(url, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        conn.execute("SELECT pg_stat_statements_reset()")
    waits: collections.Counter[tuple[str, str]] = collections.Counter()
    done = threading.Event()

    def sample() -> None:
        with connect(url, autocommit=True) as conn:
            while not done.is_set():
                waits.update(tuple(row) for row in conn.execute(WAITS))
                time.sleep(0.002)

    sampler = threading.Thread(target=sample)
    sampler.start()
    seconds = effects.drain(url, variant, jobs, 8)
    done.set()
    sampler.join()
    print(f"== {variant}: {seconds / jobs * 1000:.3f} ms per job (sampled)")
    with connect(url, autocommit=True) as conn:
        for calls, mean, total, query in conn.execute(STATEMENTS):
            print(f"  {calls:6d} {mean:7.3f} ms {total:8.1f} ms  {query}")
    for (event, query), count in waits.most_common(10):
        print(f"  wait {count:5d} {event:28s} {query}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("variants", nargs="*", default=list(effects.VARIANTS))
    parser.add_argument("--jobs", type=int, default=3000)
    args = parser.parse_args()
    settings = {**effects.DURABLE, "shared_preload_libraries": "pg_stat_statements"}
    with PostgresServer(tempfile.mkdtemp(prefix="conveyor-bench-profile-"), settings=settings) as pg:
        for variant in args.variants:
            db = f"profile_{variant}_{uuid.uuid4().hex[:6]}"
            pg.create_database(db)
            profile(pg.url(db), variant, args.jobs)
            pg.drop_database(db)
    return 0


if __name__ == "__main__":
    sys.exit(main())
