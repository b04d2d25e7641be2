"""SIGTERM under load: a worker supervisor drains (finishes what runs, hands back what it prefetched)
while the workload goes on; nothing is lost and, since nothing died, nothing runs twice."""

from __future__ import annotations

import time

import pytest

from tests.faults.checker import Checker
from tests.faults.harness import open_runs
from tests.faults.workload import Producer, long_jobs, mixed
from tests.support.brokers import SERVER_BROKERS
from tests.support.waiting import wait_for

FAULT = "SIGTERM drain under load"


@pytest.mark.parametrize("broker", SERVER_BROKERS)
def test_sigterm_drain_under_load_loses_none_and_runs_none_twice(world, broker):
    cluster = world(broker, FAULT)
    draining, staying = (cluster.start_workers(name, wait=False) for name in ("drain", "stay"))
    draining.wait_ready()
    staying.wait_ready()
    plan = mixed(70, "drain", slow=1.2) + long_jobs(8, "dlong", sleep=1.2)
    producer = Producer(cluster.app, plan, spread=2.5)
    producer.start()
    pids = set(draining.child_pids())
    wait_for(
        lambda: len([r for r in open_runs(cluster, "") if r[1] in pids]) >= 2,
        timeout=60,
        message="jobs in flight in the draining supervisor",
    )
    assert draining.terminate(timeout=60) == 0, "a drain exits 0"
    healed_at = time.time()
    checker = Checker(cluster, plan, fault=FAULT)
    unfinished = [r for r in checker.runs() if r.pid in pids and not r.end_known]
    cluster.start_workers("after")
    checker.check(
        healed_at,
        producer=producer,
        expect_no_reruns=True,
        extra_problems=[f"in-flight run not finished by the drain: {r}" for r in unfinished],
    )
