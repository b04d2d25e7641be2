"""Postgres crashes under running workers (fsync and synchronous_commit on) and restarts on the same
data directory and port: the way a power cut or an OOM kill ends it, not a clean shutdown.

On the Postgres broker the queue itself crashes; on the Redis broker the ledger and the jobs' own
writes do. Either way an acknowledged job ends once, its charge applied once.
"""

from __future__ import annotations

import time

import pytest

from tests.faults.checker import Checker
from tests.faults.test_redis_faults import start
from tests.support.brokers import SERVER_BROKERS


@pytest.mark.parametrize("broker,how", [*((b, "immediate") for b in SERVER_BROKERS), ("postgres", "SIGKILL")])
def test_postgres_crash_and_restart_under_load(world, fault_pg, broker, how):
    fault = (
        "Postgres crash (immediate) + restart, fsync on"
        if how == "immediate"
        else "Postgres crash (SIGKILL postmaster) + restart, fsync on"
    )
    cluster = world(broker, fault)
    plan, producer = start(cluster, prefix="pgcrash")
    if how == "immediate":
        fault_pg.crash_immediate()
    else:
        fault_pg.kill()
    fault_pg.start()
    Checker(cluster, plan, fault=fault).check(time.time(), producer=producer)
