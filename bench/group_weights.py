"""What weighted shares cost the grouped claim (issue 21.2), before and after, claim by claim.

    .venv/bin/python -m bench.group_weights [--claims 300] [--jobs 6000] [--before REV]

On a shared machine the load moves a run's figures by more than the change being
measured, so this bench alternates: one private server each (tests/support/servers.py),
three stores side by side on it, and every round claims once from each, in a random
order, timing each claim as its client sees it. The stores:

* ``before``: the release before weights (``--before``, default: the commit before
  migration 0077 was added), its own claim SQL (postgres: jobs.sql, on a database
  with 0077 undone) or its own jobs.lua (redis);
* ``after``: this tree, no weight set;
* ``weighted``: this tree, weights 1, 2 and 3 in turn over the groups.

Each claim's jobs are marked done (acked) right after, untimed. Cases: one group of
``--jobs`` - 10 and one of 10; 100 groups; 100 groups under a cap of 4. Prints, per
broker and case, the median claim time of each store in ms and the median of the
paired ratios after/before and weighted/before (the same round's claims: the load is
shared), and for postgres the buffers each store's claim touched (load-independent).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent
QUEUE = "bench"
STORES = ("before", "after", "weighted")
MIGRATION = "conveyor/schema/migrations/0077_group_weights.sql"
#: Undoes 0077 on a database for the release before it (its claim orders by last_served).
UNDO_0077 = """
ALTER TABLE conveyor_job_groups DROP COLUMN weight, DROP COLUMN pass, DROP COLUMN vstart;
CREATE INDEX conveyor_job_groups_rotation ON conveyor_job_groups (queue, last_served);
"""


def before_rev() -> str:
    added = subprocess.run(
        ["git", "log", "--diff-filter=A", "--format=%H", "-1", "--", MIGRATION],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    return f"{added}^"


def at_rev(rev: str, path: str) -> str:
    return subprocess.run(["git", "show", f"{rev}:{path}"], cwd=ROOT, capture_output=True, text=True, check=True).stdout


def groups_of(case: str) -> tuple[list[str], int | None]:
    hundred = [f"g{i}" for i in range(100)]
    return {"a/b": (["a", "b"], None), "100": (hundred, None), "100 cap 4": (hundred, 4)}[case]


def weight_of(group: str) -> int:
    return 1 + (int(group[1:]) if group[1:].isdigit() else ord(group[0])) % 3


def group_list(groups: list[str], jobs: int) -> list[str]:
    if groups == ["a", "b"]:
        return ["a"] * (jobs - 10) + ["b"] * 10
    return [groups[i % len(groups)] for i in range(jobs)]


def paired(claims: int, run: dict[str, Callable[[], float]]) -> dict[str, Any]:
    times: dict[str, list[float]] = {s: [] for s in STORES}
    for _ in range(claims):
        order = list(STORES)
        random.shuffle(order)
        for store in order:
            times[store].append(run[store]())
    rounds = list(zip(*(times[s] for s in STORES)))
    return {
        **{f"{s}_p50_ms": round(statistics.median(times[s]), 3) for s in STORES},
        "after_vs_before": round(statistics.median(a / b for b, a, _ in rounds), 3),
        "weighted_vs_before": round(statistics.median(w / b for b, _, w in rounds), 3),
    }


# -- postgres -----------------------------------------------------------------


def pg_case(pg: Any, case: str, jobs: int, claims: int, old_sql: str) -> dict[str, Any]:
    import psycopg

    from conveyor.brokers.postgres.jobs import QUERIES, Jobs
    from conveyor.db import load_queries
    from conveyor.schema.migrate import migrate

    with tempfile.NamedTemporaryFile("w", suffix=".sql", delete=False) as f:
        f.write(old_sql)
    old = load_queries(Path(f.name))
    groups, cap = groups_of(case)
    urls: dict[str, str] = {}
    for store in STORES:
        db = f"bench_{uuid.uuid4().hex[:8]}"
        pg.create_database(db)
        urls[store] = pg.url(db)
        migrate(urls[store])
        enqueuer = Jobs(urls[store], "bench-enqueue")
        rows = []
        for i, group in enumerate(group_list(groups, jobs)):
            rows.append(
                {
                    "id": str(uuid.uuid4()),
                    "queue": QUEUE,
                    "job": "bench.job",
                    "priority": 0,
                    "rank_lead": 0.0,
                    "max_attempts": 3,
                    "key": None,
                    "message": json.dumps({"args": [{"n": i}]}),
                    "error": None,
                    "delay": 0.0,
                    "group": group,
                }
            )
        for start in range(0, len(rows), 1000):
            enqueuer.enqueue(rows[start : start + 1000], dedup_ttl=60)
        if store == "weighted":
            for group in groups:
                enqueuer.set_group_weight(QUEUE, group, weight_of(group))
        enqueuer.close()
    conns = {s: psycopg.connect(urls[s], autocommit=True) for s in STORES}
    conns["before"].execute(UNDO_0077)
    for conn in conns.values():
        conn.execute("VACUUM ANALYZE")
    buffers: dict[str, list[float]] = {s: [] for s in STORES}

    def claim(store: str) -> float:
        conn, queries = conns[store], (old if store == "before" else QUERIES)
        params = {"queue": QUEUE, "limit": 8, "worker": "bench", "cap": cap, "configured": None}
        rotation = queries["lock_groups" if cap is not None else "pick_groups"]
        began = time.perf_counter()
        with conn.transaction():
            turns = conn.execute(rotation, params).fetchall()
            picks: dict[str, Any] = {"groups": [t[0] for t in turns]}
            if store != "before":
                picks.update(starts=[t[1] for t in turns], weights=[t[2] for t in turns])
            ids = [r[0] for r in conn.execute(queries["claim_groups"], {**params, **picks})]
        took = (time.perf_counter() - began) * 1000
        conn.execute(
            "UPDATE conveyor_jobs SET status = 'done', completed_at = now(), worker_id = NULL WHERE id = ANY(%s)",
            (ids,),
        )
        if len(buffers[store]) < 20:  # the same two statements under EXPLAIN, undone: what they touch
            with conn.transaction(force_rollback=True):
                total = 0
                for sql, values in ((rotation, params), (queries["claim_groups"], {**params, **picks})):
                    plan = conn.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql, values).fetchone()[0][0]
                    total += plan["Plan"]["Shared Hit Blocks"] + plan["Plan"]["Shared Read Blocks"]
                buffers[store].append(total)
        return took

    out = paired(claims, {s: (lambda s=s: claim(s)) for s in STORES})
    out.update({f"{s}_buffers": round(statistics.median(buffers[s]), 1) for s in STORES})
    for conn in conns.values():
        conn.close()
    return out


# -- redis --------------------------------------------------------------------


def redis_case(url: str, case: str, jobs: int, claims: int, old_lua: str) -> dict[str, Any]:
    from dramatiq import Message

    from conveyor.brokers.base import EnqueueItem
    from conveyor.brokers.redis import RedisBroker
    from conveyor.settings import Settings

    groups, cap = groups_of(case)
    brokers = {}
    for store in STORES:
        broker = RedisBroker(
            url=url,
            middleware=[],
            namespace=f"bench-{store}",
            heartbeat_timeout=30,
            retention=3600,
            settings=Settings(broker="redis", redis_url=url),
        )
        if store == "before":
            broker.jobs.script = broker.client.register_script(old_lua)
        items = [
            EnqueueItem(Message(queue_name=QUEUE, actor_name="bench.job", args=({},), kwargs={}, options={"group": g}))
            for g in group_list(groups, jobs)
        ]
        for start in range(0, len(items), 1000):
            broker.enqueue_jobs(items[start : start + 1000], dedup_ttl=60)
        if store == "weighted":
            for group in groups:
                broker.set_group_weight(QUEUE, group, weight_of(group))
        brokers[store] = broker

    def fetch(store: str) -> float:
        broker = brokers[store]
        began = time.perf_counter()
        rows = broker.jobs.call("fetch", QUEUE, 8, int(broker.priority_aging * 1000), cap or 0)
        took = (time.perf_counter() - began) * 1000
        acks: list[Any] = []
        for i in range(0, len(rows), 5):
            acks += [rows[i], Message.decode(rows[i + 1]).message_id, rows[i + 2]]
        broker.jobs.call("acks", QUEUE, 3_600_000, len(acks) // 3, *acks)
        return took

    out = paired(claims, {s: (lambda s=s: fetch(s)) for s in STORES})
    for broker in brokers.values():
        broker.client.flushall()
        broker.close()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--claims", type=int, default=300)
    parser.add_argument("--jobs", type=int, default=6000)
    parser.add_argument("--before", default=None, help="the release before weights (a git revision)")
    parser.add_argument("--brokers", default="postgres,redis")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    from tests.support.servers import PostgresServer, RedisServer

    rev = args.before or before_rev()
    cases = ["a/b", "100", "100 cap 4"]
    if "postgres" in args.brokers:
        old_sql = at_rev(rev, "conveyor/brokers/postgres/jobs.sql")
        with PostgresServer(tempfile.mkdtemp(prefix="conveyor-bench-weights-")) as pg:
            for case in cases:
                row = pg_case(pg, case, args.jobs, args.claims, old_sql)
                print(json.dumps({"broker": "postgres", "case": case, **row}), flush=True)
    if "redis" in args.brokers:
        old_lua = at_rev(rev, "conveyor/brokers/redis/jobs.lua")
        with tempfile.TemporaryDirectory() as tmp:
            server = RedisServer(tmp)
            try:
                for case in cases:
                    row = redis_case(server.url, case, args.jobs, args.claims, old_lua)
                    print(json.dumps({"broker": "redis", "case": case, **row}), flush=True)
            finally:
                server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
