"""Redis paused longer than the client's timeout (CLIENT PAUSE) under running workers: acknowledged
enqueues survive; no outcome is lost or applied twice. (The campaign, test_campaign.py, crashes Redis.)"""

from __future__ import annotations

import time

from tests.faults.checker import Checker
from tests.faults.workload import Producer, mixed
from tests.support.waiting import wait_for

#: The Redis client timeout the pause test asks for (CONVEYOR_REDIS_SOCKET_TIMEOUT): short, so a
#: pause longer than it stays short too.
CLIENT_TIMEOUT = 2.0

#: The client timeout of a build whose settings do not name one (redis-py's pool built from the URL).
DEFAULT_CLIENT_TIMEOUT = 5.0


def runs_logged(cluster) -> int:
    import psycopg

    with psycopg.connect(cluster.settings.database_url, autocommit=True) as conn:
        return conn.execute("SELECT count(*) FROM fault_runs").fetchone()[0]


def start(cluster, n: int = 70, prefix: str = "r"):
    groups = [cluster.start_workers(name, wait=False) for name in ("a", "b")]
    for group in groups:
        group.wait_ready()
    plan = mixed(n, prefix)
    producer = Producer(cluster.app, plan, spread=3.0)
    producer.start()
    wait_for(lambda: runs_logged(cluster) >= 12, timeout=60, message="the workload under way")
    return plan, producer


def test_redis_paused_longer_than_the_client_timeout(world, fault_redis):
    fault = "Redis paused longer than the client timeout (CLIENT PAUSE)"
    cluster = world("redis", fault, redis_socket_timeout=CLIENT_TIMEOUT)
    timeout = getattr(cluster.settings, "redis_socket_timeout", None) or DEFAULT_CLIENT_TIMEOUT
    pause = timeout + 3
    plan, producer = start(cluster, prefix="rpause")
    fault_redis.pause(pause)
    healed_at = time.time() + pause
    time.sleep(pause)
    Checker(cluster, plan, fault=fault).check(healed_at, producer=producer)
