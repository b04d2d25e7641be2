"""What fair shares cost the Postgres broker's claim (issue 21.2).

    .venv/bin/python bench/pg_groups.py [--jobs 10000] [--claims 400] [--limit 8]

Starts a private Postgres (tests/support/servers.py), and for each case, on a
fresh migrated database, enqueues ``--jobs`` jobs, then times ``--claims``
claims of ``--limit`` jobs each through ``Jobs.claim`` (the consumer's call);
each claim's jobs are marked done right after, untimed, so held rows stay
few as in a running fleet. Cases: no groups (the plain claim); one group
holding every job but ten (the A-10,000 / B-10 case); a hundred groups; and
a hundred groups under a cap of 4; the last two again with weights (1, 2 and 3
in turn over the hundred groups, ``set_group_weight``: stride scheduling,
migration 0077), with the share each weight got. Prints one JSON line per case
(claim p50 / p95 / mean in ms) and the EXPLAIN ANALYZE of one grouped claim.
A release without weights skips the weighted cases (to compare the two).
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
QUEUE = "bench"


def rows_for(jobs: int, groups: list[str]) -> list[dict]:
    from dramatiq import Message

    out = []
    for i in range(jobs):
        group = groups[i % len(groups)] if groups else ""
        message = Message(queue_name=QUEUE, actor_name="bench.job", args=({"n": i},), kwargs={}, options={})
        out.append(
            {
                "id": message.message_id,
                "queue": QUEUE,
                "job": "bench.job",
                "priority": 0,
                "rank_lead": 0.0,
                "max_attempts": 3,
                "key": None,
                "message": message.encode().decode(),
                "error": None,
                "delay": 0.0,
                "group": group,
            }
        )
    return out


def weight_of(group: str) -> int:
    """1, 2, 3 in turn over tenant-0, tenant-1, ..."""
    return 1 + int(group.rsplit("-", 1)[1]) % 3


def case(
    url: str, name: str, groups: list[str], jobs: int, claims: int, limit: int, cap: int | None, weighted: bool
) -> dict | None:
    import psycopg

    from conveyor.brokers.postgres.jobs import Jobs
    from conveyor.schema.migrate import migrate

    migrate(url)
    store = Jobs(url, "bench-worker")
    if weighted:
        if not hasattr(store, "set_group_weight"):
            store.close()
            return None  # a release without weights
        for group in groups:
            store.set_group_weight(QUEUE, group, weight_of(group))
    by_weight: dict[int, int] = {}
    batch = rows_for(jobs, groups)
    if groups == ["a"]:  # A's backlog first, then B's ten
        batch = rows_for(jobs - 10, ["a"]) + rows_for(10, ["b"])
    for start in range(0, len(batch), 1000):
        store.enqueue(batch[start : start + 1000], dedup_ttl=60)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE conveyor_jobs")
        times = []
        b_done_at = None
        for n in range(claims):
            t0 = time.perf_counter()
            got = store.claim(QUEUE, limit, synchronous=False, group_cap=cap)
            times.append((time.perf_counter() - t0) * 1000)
            ids = [g[0] for g in got]
            if weighted:
                for group in conn.execute("SELECT job_group FROM conveyor_jobs WHERE id = ANY(%s)", (ids,)):
                    by_weight[weight_of(group[0])] = by_weight.get(weight_of(group[0]), 0) + 1
            conn.execute(
                "UPDATE conveyor_jobs SET status = 'done', completed_at = now(), worker_id = NULL WHERE id = ANY(%s)",
                (ids,),
            )
            if b_done_at is None and groups == ["a"]:
                left = conn.execute(
                    "SELECT count(*) FROM conveyor_jobs WHERE job_group = 'b' AND status = 'pending'"
                ).fetchone()[0]
                if left == 0:
                    b_done_at = n + 1
    store.close()
    statements = server_cost(url, limit, cap, claims=50) if groups else None
    times.sort()
    out = {
        "case": name,
        "jobs": jobs,
        "limit": limit,
        "claims": claims,
        "p50_ms": round(statistics.median(times), 3),
        "p95_ms": round(times[int(len(times) * 0.95)], 3),
        "mean_ms": round(statistics.fmean(times), 3),
    }
    if statements is not None:
        out["server"] = statements
    if b_done_at is not None:
        out["b_all_claimed_after_claims"] = b_done_at
    if weighted:
        # Claims per group of each weight (34 groups of weight 1, 33 of 2, 33 of 3): about 1:2:3.
        out["claims_per_group_by_weight"] = {
            w: round(n / (34 if w == 1 else 33), 1) for w, n in sorted(by_weight.items())
        }
    return out


def server_cost(url: str, limit: int, cap: int | None, claims: int) -> dict:
    """The grouped claim's two statements as the server counts them, over ``claims`` more claims: buffers
    touched (shared hit + read: the same whatever the machine's load) and execution ms, per claim (each
    statement run once more under EXPLAIN ANALYZE, in the claim's own transaction, for its counts)."""
    import psycopg

    from conveyor.brokers.postgres.jobs import QUERIES

    weighted = "%(starts)s" in QUERIES["claim_groups"]  # a release without weights passes the groups only
    params = {"queue": QUEUE, "limit": limit, "worker": "bench-cost", "cap": cap, "configured": None}
    rotation = QUERIES["lock_groups" if cap is not None else "pick_groups"]
    buffers = ms = 0.0

    def measured(conn: psycopg.Connection, sql: str, values: dict) -> None:
        nonlocal buffers, ms
        plan = conn.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql, values).fetchone()[0][0]
        buffers += plan["Plan"]["Shared Hit Blocks"] + plan["Plan"]["Shared Read Blocks"]
        ms += plan["Execution Time"]

    with psycopg.connect(url) as conn:
        for _ in range(claims):
            with conn.transaction():
                turns = conn.execute(rotation, params).fetchall()
                measured(conn, rotation, params)
                picks = {"groups": [t[0] for t in turns]}
                if weighted:
                    picks.update(starts=[t[1] for t in turns], weights=[t[2] for t in turns])
                conn.execute("SAVEPOINT s")
                measured(conn, QUERIES["claim_groups"], {**params, **picks})  # its work, then undone
                conn.execute("ROLLBACK TO SAVEPOINT s")
                ids = [r[0] for r in conn.execute(QUERIES["claim_groups"], {**params, **picks})]
                done = "UPDATE conveyor_jobs SET status = 'done', completed_at = now(), worker_id = NULL WHERE id = ANY(%s)"
                conn.execute(done, (ids,))
    return {"buffers_per_claim": round(buffers / claims, 1), "exec_ms_per_claim": round(ms / claims, 3)}


def explain(url: str) -> str:
    import psycopg

    from conveyor.brokers.postgres.jobs import QUERIES

    params = {
        "queue": QUEUE,
        "limit": 8,
        "worker": "explain",
        "cap": None,
        "groups": ["a", "b"],
        "starts": [0.0, 0.0],
        "weights": [1, 1],
    }
    with psycopg.connect(url) as conn:
        plan = conn.execute("EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF) " + QUERIES["claim_groups"], params).fetchall()
        conn.rollback()
    return "\n".join(r[0] for r in plan)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--claims", type=int, default=400)
    parser.add_argument("--limit", type=int, default=8)
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    from tests.support.servers import PostgresServer

    hundred = [f"tenant-{i}" for i in range(100)]
    cases = [
        ("no groups", [], None, False),
        ("one group of 9,990 + one of 10", ["a"], None, False),
        ("100 groups", hundred, None, False),
        ("100 groups, weights 1-3", hundred, None, True),
        ("100 groups, cap 4", hundred, 4, False),
        ("100 groups, cap 4, weights 1-3", hundred, 4, True),
    ]
    with PostgresServer(tempfile.mkdtemp(prefix="conveyor-bench-groups-")) as pg:
        for name, groups, cap, weighted in cases:
            db = f"bench_{uuid.uuid4().hex[:8]}"
            pg.create_database(db)
            row = case(pg.url(db), name, groups, args.jobs, args.claims, args.limit, cap, weighted)
            if row is not None:
                print(json.dumps(row), flush=True)
            if groups == ["a"]:
                print(explain(pg.url(db)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
