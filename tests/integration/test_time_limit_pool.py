"""A job's time limit never leaks a pooled connection (in-process emulation of a long-lived worker).

Dramatiq's time limit raises asynchronously in the job's thread. Injected
thousands of times at random instants into threads that check connections
out of conveyor's pool and return them, it must never land inside the
checkout or the return: the pool ends with every connection it had.
"""

from __future__ import annotations

import logging
import random
import threading
import time

import pytest
from dramatiq.middleware.time_limit import TimeLimitExceeded
from psycopg_pool import PoolTimeout

from conveyor import interrupts
from conveyor.db import open_pool

#: Connections in the pool, threads using it, and injections to survive (the issue saw 0 of 4 left after ~7,000).
SIZE = 4
THREADS = 3
INJECTIONS = 6000


def test_time_limits_injected_around_pool_use_never_lose_a_connection(database_url, monkeypatch):
    # An interrupt that lands in a query leaves its connection busy and psycopg logs the failed rollback;
    # one landing inside that log call would leave the logging handler's lock held and hang every thread
    # (Python's logging is not safe against asynchronous exceptions): not what this test is about.
    monkeypatch.setattr(logging.getLogger("psycopg"), "disabled", True)
    pool = open_pool(database_url, min_size=SIZE, max_size=SIZE, name="time-limit-emulation")
    stop = threading.Event()
    counts = {"uses": 0, "landed": 0}
    idents: list[int] = []

    def job() -> None:
        idents.append(threading.get_ident())
        while not stop.is_set():
            try:
                with pool.connection(timeout=10) as conn:
                    conn.execute("SELECT 1")
                counts["uses"] += 1
            except TimeLimitExceeded:
                counts["landed"] += 1
        interrupts.reset()  # the job ends: nothing of its limit outlives it

    threads = [threading.Thread(target=job, daemon=True) for _ in range(THREADS)]
    for thread in threads:
        thread.start()
    try:
        while len(idents) < THREADS:
            time.sleep(0.01)
        deadline = time.monotonic() + 60
        for _ in range(INJECTIONS):
            interrupts.interrupt(random.choice(idents), TimeLimitExceeded)
            time.sleep(random.uniform(0, 0.001))
            assert time.monotonic() < deadline
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=20)
    try:
        assert not any(t.is_alive() for t in threads), "every job thread ended"
        # Connections an interrupt left busy mid-query were discarded and are being replaced: wait for them.
        held = []
        try:
            for _ in range(SIZE):
                held.append(pool.getconn(timeout=10))
        except PoolTimeout:
            pytest.fail(f"{SIZE - len(held)} of {SIZE} connections leaked: {pool.get_stats()}")
        finally:
            for conn in held:
                pool.putconn(conn)
        assert counts["landed"] > INJECTIONS / 10 and counts["uses"] > 0, f"the emulation exercised little: {counts}"
    finally:
        pool.close()
