"""What priorities cost a claim: N jobs drained through each broker directly, priorities off vs on.

    .venv/bin/python -m bench.priority [--jobs 20000] [--prefetch 32] [--reps 3]

Private Redis and Postgres (bench/servers.py). Per broker and mode, on a
fresh store: ``--jobs`` jobs enqueued in batches of 500 (not timed), then
one consumer drains them (fetch/claim + ack, no job body, no middleware);
the drain's jobs/s is the figure, and again for the claims alone (the
fetch script, the claim statement: no start, no ack). ``off``: every job priority 0 (Redis: the
plain FIFO list alone); ``on``: priorities 0-9 in turn (Redis: ten level
lists compared at every fetch; Postgres: the same index either way). The
drain is checked to be in rank order. Median (min-max) of ``--reps``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import dramatiq
from dramatiq import Message

from conveyor.brokers.base import PRIORITY, EnqueueItem
from conveyor.schema.migrate import migrate
from conveyor.settings import Settings

from .servers import Servers

QUEUE = "bench"
JOB = "bench.noop"


def _broker(kind: str, servers: Servers, n: int) -> Any:
    if kind == "redis":
        from conveyor.brokers.redis import RedisBroker

        servers.flush_redis()
        settings = Settings(broker="redis", redis_url=servers.redis_url)
        broker: Any = RedisBroker(
            url=servers.redis_url,
            middleware=[],
            namespace=f"prio{n}",
            heartbeat_timeout=60,
            retention=3600,
            settings=settings,
        )
    else:
        from conveyor.brokers.postgres import PostgresBroker

        url = servers.fresh_database("prio")
        migrate(url)
        broker = PostgresBroker(url, middleware=[], settings=Settings(broker="postgres", database_url=url))
    dramatiq.actor(lambda payload: None, broker=broker, actor_name=JOB, queue_name=QUEUE)
    return broker


def _claim_all(kind: str, broker: Any, jobs: int, prefetch: int) -> float:
    """Claims alone: the fetch script (Redis) or the claim statement (Postgres), ``prefetch`` at a time."""
    t0 = time.perf_counter()
    got = 0
    while got < jobs:
        if kind == "redis":
            rows = broker.jobs.call("fetch", QUEUE, prefetch, int(broker.priority_aging * 1000))
            got += len(rows) // 5
        else:
            got += len(broker.jobs.claim(QUEUE, prefetch, synchronous=True))
    return jobs / (time.perf_counter() - t0)


def run_once(kind: str, servers: Servers, jobs: int, prefetch: int, on: bool, n: int, claims: bool) -> float:
    broker = _broker(kind, servers, n)
    try:
        for start in range(0, jobs, 500):
            items = []
            for i in range(start, min(jobs, start + 500)):
                options = {PRIORITY: i % 10} if on and i % 10 else {}
                message = Message(queue_name=QUEUE, actor_name=JOB, args=({"i": i},), kwargs={}, options=options)
                items.append(EnqueueItem(message))
            broker.enqueue_jobs(items, dedup_ttl=60)
        if claims:
            return _claim_all(kind, broker, jobs, prefetch)
        consumer = broker.consume(QUEUE, prefetch=prefetch, timeout=100)
        seen: list[int] = []
        t0 = time.perf_counter()
        while len(seen) < jobs:
            message = next(consumer)
            if message is None:
                continue
            broker.start_job(message)
            consumer.ack(message)
            seen.append(message.args[0]["i"])
        elapsed = time.perf_counter() - t0
        consumer.close()
        if on:  # within the default aging (60 s) all of a batch is ready at once: strictly by priority
            order = [9 - (i % 10) for i in seen]
            late = sum(1 for a, b in zip(order, order[1:]) if b < a)
            assert late <= prefetch * 10, f"{kind}: {late} jobs out of priority order"
        return jobs / elapsed
    finally:
        broker.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20000)
    parser.add_argument("--prefetch", type=int, default=32)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--only", default="redis,postgres")
    args = parser.parse_args()
    n = 0
    with Servers.start() as servers:
        for kind in args.only.split(","):
            for claims in (True, False):
                rates: dict[bool, list[float]] = {False: [], True: []}
                for _ in range(args.reps):
                    for on in (False, True):  # interleaved, so drift hits both modes alike
                        n += 1
                        rates[on].append(run_once(kind, servers, args.jobs, args.prefetch, on, n, claims))
                for on in (False, True):
                    r = rates[on]
                    print(
                        f"{kind:9} {'claims only' if claims else 'full drain '} priorities {'on ' if on else 'off'}: "
                        f"{statistics.median(r):8.0f} jobs/s ({min(r):.0f}-{max(r):.0f}), "
                        f"{1e6 / statistics.median(r):6.1f} us/job, {args.jobs} jobs, prefetch {args.prefetch}",
                        flush=True,
                    )


if __name__ == "__main__":
    main()
