"""The Postgres worker's heartbeat leaves its self-fence room for one slow heartbeat.

The soak (issue 18) found jobs failing for good on ``WorkerLost`` on a
loaded host: with a heartbeat every third of the lease and the self-fence
at 0.6 of it, one heartbeat 0.27 of the lease late (a starved thread, a
commit queued behind others) ended a healthy worker's process, its jobs
came back and each start spent an attempt. Here one heartbeat is held up
for 0.28 of the lease; the worker's heartbeat age must stay under its
self-fence threshold (red with heartbeats every third of the lease).
"""

from __future__ import annotations

import threading
import time

import psycopg

from conveyor.app import App
from tests.support.harness import make_settings
from tests.support.waiting import wait_for

LEASE = 3.0


def test_one_slow_heartbeat_does_not_reach_the_self_fence(clean_env, database_url):
    app = App(make_settings("postgres", None, database_url, pg_lease_seconds=LEASE))
    broker = app.broker
    threshold = app.settings.self_fence_threshold
    stall = 0.28 * LEASE
    beats: list[float] = []
    write = broker.jobs.heartbeat

    def slow_heartbeat(conn: psycopg.Connection, *args, **kwargs) -> None:
        beats.append(time.monotonic())
        if len(beats) == 3:
            time.sleep(stall)  # this one is late: the thread starved, the commit queued
        write(conn, *args, **kwargs)

    broker.jobs.heartbeat = slow_heartbeat  # type: ignore[method-assign]
    consumer = broker.consume("critical", prefetch=1, timeout=100)
    ages: list[float] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.01):
            age = broker.heartbeat_age()
            if age is not None:
                ages.append(age)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        wait_for(lambda: len(beats) >= 5, timeout=20, message="five heartbeats")
    finally:
        stop.set()
        sampler.join()
        consumer.close()
        app.close()
    worst = max(ages)
    assert worst >= stall, "the slow heartbeat was not measured"
    assert worst < threshold, (
        f"one heartbeat {stall:.2f}s late left {worst:.2f}s without one (fence at {threshold:.2f}s)"
    )
