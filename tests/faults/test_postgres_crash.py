"""Postgres's postmaster SIGKILLed under running workers (fsync and synchronous_commit on) and restarted
on the same data directory and port: its backends are orphaned, not told to quit.

The campaign (test_campaign.py) crashes Postgres the ``pg_ctl -m immediate`` way on both brokers; this
is the other way a server dies. An acknowledged job ends once, its charge applied once.
"""

from __future__ import annotations

import time

from tests.faults.checker import Checker
from tests.faults.test_redis_faults import start

FAULT = "Postgres crash (SIGKILL postmaster) + restart, fsync on"


def test_postgres_postmaster_sigkill_and_restart_under_load(world, fault_pg):
    cluster = world("postgres", FAULT)
    plan, producer = start(cluster, prefix="pgcrash")
    fault_pg.kill()
    fault_pg.start()
    Checker(cluster, plan, fault=FAULT).check(time.time(), producer=producer)
