"""What fair shares cost the Redis broker's fetch (issue 21.2).

    .venv/bin/python -m bench.redis_groups [--jobs 10000] [--fetches 400] [--room 8]

Starts a private Redis (tests/support/servers.py), and for each case, on a
flushed Redis, enqueues ``--jobs`` jobs, then times ``--fetches`` calls of
jobs.lua's ``fetch`` for ``--room`` jobs each (the consumer's call); each
fetch's jobs are acked right after, untimed, so held jobs stay few as in a
running fleet. Cases: no groups (the plain fetch); one group holding every job
but ten (the A-10,000 / B-10 case); a hundred groups; a hundred groups under a
cap of 4; then no groups, A/B and a hundred groups again with priorities 0-9 in
turn (within a group, jobs are taken by rank); then a hundred groups, uncapped and
capped, with weights 1, 2 and 3 in turn (``set_group_weight``: weighted round-robin),
with the share each weight got (a release without weights skips these, to compare
the two). Prints one JSON line per case
(fetch p50 / p95 / mean in ms as the client sees it, its mean per job handed
out in µs, the fetch script's own time per job in µs as Redis counts it, and
for the A/B case how many fetches served all of B).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
QUEUE = "bench"


def weight_of(group: str) -> int:
    """1, 2, 3 in turn over g0, g1, ..."""
    return 1 + int(group[1:]) % 3


def run(
    url: str,
    jobs: int,
    fetches: int,
    room: int,
    groups: list[str],
    tail: int,
    cap: int,
    priorities: bool = False,
    weighted: bool = False,
) -> dict | None:
    from dramatiq import Message

    from conveyor.brokers.base import PRIORITY, EnqueueItem
    from conveyor.brokers.redis import RedisBroker
    from conveyor.brokers.redis.jobs import SCRIPT
    from conveyor.settings import Settings

    settings = Settings(broker="redis", redis_url=url)
    broker = RedisBroker(
        url=url, middleware=[], namespace="bench", heartbeat_timeout=30, retention=3600, settings=settings
    )
    broker.client.flushall()
    broker.group_caps = {QUEUE: cap} if cap else {}
    if weighted:
        if not hasattr(broker, "set_group_weight"):
            broker.close()
            return None  # a release without weights
        for group in groups:
            broker.set_group_weight(QUEUE, group, weight_of(group))
    by_weight: dict[int, int] = {}
    items = []
    for i in range(jobs):
        group = ("b" if i >= jobs - tail else groups[i % len(groups)]) if groups else None
        options: dict[str, object] = {"group": group} if group else {}
        if priorities:
            options[PRIORITY] = i % 10
        message = Message(queue_name=QUEUE, actor_name="bench.job", args=({"n": i},), kwargs={}, options=options)
        items.append(EnqueueItem(message))
    for start in range(0, jobs, 1000):
        broker.enqueue_jobs(items[start : start + 1000], dedup_ttl=60)
    times, served_b_by = [], None
    seen_b = 0
    # The fetches go by EVALSHA, the acks by EVAL: Redis's own count of EVALSHA time is the fetch script's
    # cost alone, without the round trip (usec_per_call in INFO commandstats).
    scope = broker.keys.scope(QUEUE).ns
    broker.client.config_resetstat()
    for n in range(fetches):
        began = time.perf_counter()
        rows = broker.jobs.call("fetch", QUEUE, room, int(broker.priority_aging * 1000), cap)
        times.append((time.perf_counter() - began) * 1000)
        acks: list[object] = []
        for i in range(0, len(rows), 5):
            message = Message.decode(rows[i + 1])
            seen_b += message.options.get("group") == "b"
            if weighted:
                w = weight_of(message.options["group"])
                by_weight[w] = by_weight.get(w, 0) + 1
            acks += [rows[i], message.message_id, rows[i + 2]]
        if tail and served_b_by is None and seen_b == tail:
            served_b_by = n + 1
        broker.client.eval(SCRIPT, 1, scope, "acks", QUEUE, broker.broker_id, 3_600_000, len(acks) // 3, *acks)
    script = broker.client.info("commandstats").get("cmdstat_evalsha", {})
    broker.close()
    times.sort()
    out = {
        "groups": len(groups),
        "cap": cap,
        "priorities": "0-9" if priorities else "0",
        "p50_ms": round(statistics.median(times), 3),
        "p95_ms": round(times[int(len(times) * 0.95)], 3),
        "mean_ms": round(statistics.fmean(times), 3),
        "us_per_job": round(statistics.fmean(times) * 1000 / room, 1),
        "script_us_per_job": round(float(script.get("usec_per_call", 0)) / room, 1),
    }
    if tail:
        out["all_of_b_within_fetches"] = served_b_by
    if weighted:
        out["weights"] = "1-3"
        # Fetched per group of each weight (34 groups of weight 1, 33 of 2, 33 of 3): about 1:2:3.
        out["per_group_by_weight"] = {w: round(n / (34 if w == 1 else 33), 1) for w, n in sorted(by_weight.items())}
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--fetches", type=int, default=400)
    parser.add_argument("--room", type=int, default=8)
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    from tests.support.servers import RedisServer

    with tempfile.TemporaryDirectory() as tmp:
        server = RedisServer(tmp)
        try:
            hundred = [f"g{i}" for i in range(100)]
            cases = [([], 0, 0, False), (["a"], 10, 0, False), (hundred, 0, 0, False), (hundred, 0, 4, False)]
            cases += [([], 0, 0, True), (["a"], 10, 0, True), (hundred, 0, 0, True)]
            for groups, tail, cap, priorities in cases:
                row = run(server.url, args.jobs, args.fetches, args.room, groups, tail, cap, priorities)
                print(json.dumps(row), flush=True)
            for cap in (0, 4):
                row = run(server.url, args.jobs, args.fetches, args.room, hundred, 0, cap, weighted=True)
                if row is not None:
                    print(json.dumps(row), flush=True)
        finally:
            server.stop()


if __name__ == "__main__":
    main()
