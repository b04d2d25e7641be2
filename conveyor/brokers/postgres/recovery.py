"""Recovery for the Postgres broker: dead workers' jobs, this worker's orphans, pruning.

Every statement here is safe to run from many worker processes at once;
liveness is judged on the server's clock (heartbeats are stamped with the
server's ``now()`` and compared with it).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from datetime import datetime

from conveyor.brokers.postgres.deliveries import Deliveries
from conveyor.brokers.postgres.jobs import Jobs
from conveyor.brokers.postgres.listen import Listener
from conveyor.logs import log_event

#: Rows per recovery or prune statement, and statements per pass: both stay off the hot path.
BATCH = 1000
BATCHES_PER_PASS = 10

#: Seconds between prune passes (the retention is days; no need to hurry). A pass that ends on a
#: full batch is behind (jobs finish faster than a pass deletes them): the next maintenance pass
#: prunes again, so a busy queue's history stays bounded.
PRUNE_INTERVAL = 60.0

#: Seconds the server's clock may drift from a process's monotonic clock between two of its recovery
#: passes, beyond the passes' own round trips, before it counts as a step (see :meth:`Recovery.clock_stepped`).
#: Heartbeats come every sixth of the lease, so a step recovery misses leaves every live worker's
#: heartbeat younger than the lease while this stays under five sixths of it.
STEP_SLACK = 1.0

#: Seconds after which a worker row that stopped heartbeating is forgotten.
FORGET_WORKERS_AFTER = 24 * 3600.0


class Recovery:
    """``maintain()`` and what it calls, for one worker process."""

    def __init__(self, jobs: Jobs, deliveries: Deliveries, *, lease: float, interval: float, retention: float) -> None:
        self.jobs = jobs
        self.deliveries = deliveries
        self.lease = lease
        self.interval = interval
        self.retention = retention
        self._running = threading.Lock()
        self._last_recovery = -math.inf
        self._last_prune = -math.inf
        #: (server clock, monotonic clock, round trip) at this process's previous pass: the step check's base.
        self._clock_base: tuple[float, float, float] | None = None
        #: This process's monotonic clock at its first step check: every step since then is seen.
        self._watching_since: float | None = None
        #: The monotonic clock; tests that pass the server a ``now`` move this one with it.
        self.monotonic: Callable[[], float] = time.monotonic

    def maintain(self, listener: Listener) -> dict[str, list[str]]:
        """Recovery (every ``CONVEYOR_PG_RECOVERY_SECONDS``) and pruning (every minute).

        Skipped while this process's own connection came back less than a
        lease ago: after an outage every worker's heartbeat looks stale until
        each has had the time to write one. A process that never lost its
        connection (a fresh one) recovers at once, but the ``recover``
        statement itself takes nothing until the server has been up for a
        lease, on the server's clock, so a fresh process started right after
        a Postgres restart does not take the jobs of live workers still
        reconnecting.
        """
        if not self._running.acquire(blocking=False):
            return {}
        try:
            now = time.monotonic()
            recovered: dict[str, list[str]] = {}
            up_since = listener.up_since
            settled = up_since is not None and now - up_since >= self.lease
            if now - self._last_recovery >= self.interval and settled:
                self._last_recovery = now
                recovered = self.recover(own_rows=listener.ready.is_set())
            if now - self._last_prune >= PRUNE_INTERVAL:
                self._last_prune = now
                if self.prune() >= BATCH * BATCHES_PER_PASS:
                    self._last_prune = -math.inf
                self.jobs.forget_dead_workers(FORGET_WORKERS_AFTER)
            return recovered
        finally:
            self._running.release()

    def clock_stepped(self, now: datetime | None = None) -> bool:
        """Whether the server's clock moved by more or less than this process's monotonic clock since its
        previous pass; if so, no pass (of any process) declares anyone dead for a lease.

        A step forward makes every live worker's heartbeat look old at once (a job would run twice
        beside itself); a step back makes a dead worker's look young for as long as the step. The
        Redis scripts guard the same way (a gap between passes). Heartbeats ahead of the server's
        clock are brought back to it on every pass (``server_clock``).
        """
        return self._check_clock(now)[0]

    def _check_clock(self, now: datetime | None) -> tuple[bool, float]:
        """The step check; returns (stepped, the server's clock it read, UNIX s)."""
        sent = self.monotonic()
        server, _ = self.jobs.server_clock(self._slack, now)
        back = self.monotonic()
        base, self._clock_base = self._clock_base, (server, (sent + back) / 2, back - sent)
        if self._watching_since is None:
            self._watching_since = sent
        if base is None:
            return False, server
        drift = (server - base[0]) - ((sent + back) / 2 - base[1])
        if abs(drift) <= self._slack + (back - sent + base[2]) / 2:
            return False, server
        self.jobs.rearm_recovery(self.lease, now)
        log_event(
            "clock_step",
            level="warning",
            queue=None,
            job=None,
            job_id=None,
            attempt=None,
            step_s=round(drift, 3),
            reason="the database server's clock was stepped: nobody is declared dead for one lease",
        )
        return True, server

    @property
    def _slack(self) -> float:
        return min(STEP_SLACK, self.lease / 6)

    def recover(self, *, own_rows: bool = True, now: datetime | None = None) -> dict[str, list[str]]:
        """One recovery pass now; returns the ids put back to pending, by queue.

        Hooks are never run here: a row whose attempts are spent, or whose
        final-failure hooks were claimed and never marked done, goes back to
        pending with its claim, and a worker of its queue runs the hooks as
        a finalize delivery (fenced and recoverable like any other).

        ``own_rows``: also hand back this worker's rows claimed over a lease
        ago that it no longer owns (a claim whose answer was lost with its
        connection, an outcome Postgres refused).
        """
        requeued: dict[str, list[str]] = {}
        # A step re-arms: the recover statement then takes nothing for a lease.
        _, checked = self._check_clock(now)
        checked_at = time.monotonic()
        # Nobody is declared dead until this process has watched the server's clock for a lease: a step
        # just before its first check (a process started or restarted then) is one it cannot see, and
        # by a lease later every live worker has heartbeated on the new clock.
        watching = self._watching_since
        passes = BATCHES_PER_PASS if watching is not None and self.monotonic() - watching >= self.lease else 0
        for _ in range(passes):
            # The statement takes nothing unless its clock is the one just checked (another pooled
            # connection may reach a server whose clock differs: a failover, a step not yet seen).
            clock = (checked, time.monotonic() - checked_at + self._slack)
            rows = self.jobs.recover(self.lease, BATCH, now, clock=clock)
            for job_id, queue, job, _finalizing, lost, attempt, error in rows:
                requeued.setdefault(queue, []).append(job_id)
                if lost:
                    log_event(
                        "failed", level="error", queue=queue, job=job, job_id=job_id, attempt=attempt, error=error
                    )
            if len(rows) < BATCH:
                break
        if own_rows:
            # owned() includes outcomes being written right now: a job that ran
            # past the lease is never handed back just before its done lands.
            for job_id, queue in self.jobs.release_orphans(self.lease, self.deliveries.owned()):
                requeued.setdefault(queue, []).append(job_id)
        return requeued

    def prune(self) -> int:
        """Delete finished jobs older than the retention, in batches; returns how many."""
        total = 0
        for _ in range(BATCHES_PER_PASS):
            count = self.jobs.prune(self.retention, BATCH)
            total += count
            if count < BATCH:
                break
        for _ in range(BATCHES_PER_PASS):  # once-guarded steps of jobs deleted by hand, or of another broker
            if self.jobs.prune_orphan_steps(self.retention, BATCH) < BATCH:
                break
        for _ in range(BATCHES_PER_PASS):  # tenants' groups idle for a retention, with nothing left to run
            if self.jobs.prune_groups(self.retention, BATCH) < BATCH:
                break
        return total
