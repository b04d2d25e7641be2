"""Worker processes SIGKILLed after a job's effect but before its ack (the campaign kills at random instants).

The supervisor restarts a killed process; the killed process's jobs must
come back after the lease (heartbeat timeout) and run to their end once
more, their effects (a charge through the real ledger) applied once.
"""

from __future__ import annotations

import pytest

from tests.faults.checker import Checker
from tests.faults.harness import kill_holders
from tests.faults.workload import Producer, holding_charges, holding_jobs, mixed
from tests.support.brokers import SERVER_BROKERS


def start_two_groups(cluster):
    groups = [cluster.start_workers(name, wait=False) for name in ("a", "b")]
    for group in groups:
        group.wait_ready()
    return groups


@pytest.mark.parametrize("broker", SERVER_BROKERS)
def test_worker_sigkill_after_effect_before_ack(world, broker):
    fault = "worker SIGKILL after its effect, before its ack"
    cluster = world(broker, fault)
    start_two_groups(cluster)
    holders = holding_jobs(3, "hold")
    plan = mixed(40, "effect") + holders
    producer = Producer(cluster.app, plan, spread=2.0)
    producer.start()
    killed_at = kill_holders(cluster, {h.payload["token"] for h in holders})
    checker = Checker(cluster, plan, fault=fault)
    checker.check(killed_at, producer=producer)
    runs = checker.runs()
    for holder in holders:
        mine = [r for r in runs if r.token == holder.payload["token"]]
        assert len(mine) >= 2 and mine[0].effect_at is not None and any(r.ok for r in mine), mine


@pytest.mark.parametrize("broker", SERVER_BROKERS)
def test_worker_sigkill_after_charge_before_ack_charges_once(world, broker):
    """The charge is in the ledger when the worker dies; the rerun charges nothing more."""
    fault = "worker SIGKILL after a charge, before its ack"
    cluster = world(broker, fault)
    start_two_groups(cluster)
    holders = holding_charges(4, "charged")
    plan = mixed(30, "charge") + holders
    producer = Producer(cluster.app, plan, spread=1.5)
    producer.start()
    killed_at = kill_holders(cluster, {h.payload["token"] for h in holders})
    checker = Checker(cluster, plan, fault=fault)
    checker.check(killed_at, producer=producer)  # the ledger holds each charge once, balances exact
    runs = checker.runs()
    for holder in holders:
        mine = [r for r in runs if r.token == holder.payload["token"]]
        assert mine[0].effect_at is not None and not mine[0].ok, "the first run charged, then died"
        assert any(r.ok for r in mine[1:]), "a later run ran to its end"
