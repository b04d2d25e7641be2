"""A worker whose clock is 120 s behind (libfaketime), far more than the heartbeat timeout.

Liveness must be judged on the server's clock: the skewed worker is alive
and keeps its jobs; nothing it runs is handed to another worker meanwhile.
"""

from __future__ import annotations

import os
import time

import pytest

from tests.faults.checker import Checker
from tests.faults.harness import FAKETIME_LIB
from tests.faults.workload import Producer, long_jobs, mixed
from tests.support.brokers import SERVER_BROKERS

FAULT = "worker clock 120 s behind (libfaketime)"

#: Seconds the workload runs with the skewed worker in it: several heartbeat timeouts.
SKEWED_FOR = 8.0


@pytest.mark.parametrize("broker", SERVER_BROKERS)
def test_worker_with_a_clock_120s_behind(world, broker):
    assert os.path.exists(FAKETIME_LIB), "libfaketime is needed (Debian: apt-get install libfaketime)"
    cluster = world(broker, FAULT)
    # Every clock moves back, the monotonic one too: with FAKETIME_DONT_FAKE_MONOTONIC libfaketime
    # breaks time.sleep (clock_nanosleep fails with EINVAL), which is not what is under test.
    skewed = cluster.start_workers("skewed", wait=False, LD_PRELOAD=FAKETIME_LIB, FAKETIME="-120s")
    normal = cluster.start_workers("normal", wait=False)
    skewed.wait_ready()
    normal.wait_ready()
    plan = mixed(60, "clock", slow=1.5) + long_jobs(10, "clocklong", sleep=1.5)
    producer = Producer(cluster.app, plan, spread=SKEWED_FOR)
    producer.start()
    producer.wait()
    healed_at = time.time()
    Checker(cluster, plan, fault=FAULT).check(healed_at, producer=producer)
    assert any(e["pid"] for e in skewed.events("worker_started")), "the skewed worker ran"
