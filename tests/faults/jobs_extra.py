"""Job types of two campaign kinds, each on a queue only the worker group its kind starts consumes.

- ``time-limits`` (issue 18, finding 8): ``fault.hammer`` checks connections
  out of its worker's pool and returns them in a tight loop while the real
  time-limit manager (conveyor's ``TimeLimit``, its interval shortened to
  :data:`LIMIT_INTERVAL`) interrupts it every millisecond or so: the job
  catches each ``TimeLimitExceeded`` and arms the limit again, thousands of
  limits in a few seconds where a real worker meets one per job. Then
  ``fault.census`` (same process: the group runs one) takes every connection
  its pool may hold and logs how many it got (``fault_pools``): fewer is a
  leak, and no census at all is a worker that no longer completes work.
- ``user-retries`` (finding 9): ``fault.poll`` asks to be run again
  ``polls`` times, and the user's middleware (:mod:`tests.faults.user_retries`,
  only in that kind's worker group) re-enqueues the message proxy it was
  handed, as Dramatiq's stock ``Retries`` does. Each run is logged like a
  workload job's; the last one writes the effect.

And the workload's grouped jobs (issues 18, 21): ``fault.grouped`` runs the
workload's body on :data:`GROUP_QUEUE`, a queue with a per-group cap
(:data:`GROUP_CAP`) that the near and far workers consume beside the work
queues; each run asks at its end whether it still held its job (``held``).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time

import psycopg
from dramatiq.middleware import CurrentMessage
from dramatiq.middleware.time_limit import TimeLimitExceeded
from psycopg_pool import PoolTimeout

from conveyor.blueprints import Jobs, Queue
from conveyor.errors import DatabaseUnavailable
from conveyor.middleware.time_limit import TimeLimit
from conveyor.tasks.payloads import Payload
from tests.faults.jobs import Work, cancel_hook, dead, work

LIMITS_QUEUE = "fault_limits"
POLL_QUEUE = "fault_polls"
#: The queue of the workload's grouped jobs, and its cap: at most this many jobs of one group held at once.
GROUP_QUEUE = "fault_groups"
GROUP_CAP = 2
#: The queues besides the work queues (the campaign checks they end empty too).
EXTRA_QUEUES = (LIMITS_QUEUE, POLL_QUEUE, GROUP_QUEUE)

#: Seconds between the time-limit manager's checks in the hammering group (Dramatiq's default is 1).
LIMIT_INTERVAL = 0.001

#: Message options of ``fault.poll``: the body asks for another run; the runs the middleware re-enqueued.
AGAIN = "fault_again"
POLLS = "fault_polls"

#: Seconds a census waits for each connection (a pool refilling after a server crash takes a moment).
CENSUS_WAIT = 5.0

INSERT_POOL = "INSERT INTO fault_pools (pid, what, got, size, landed, stats) VALUES (%s, %s, %s, %s, %s, %s)"

jobs = Jobs()
limits = jobs.queue(Queue(LIMITS_QUEUE, concurrency=3, max_attempts=6, min_backoff=0.2, max_backoff=1.0))
polls = jobs.queue(Queue(POLL_QUEUE, concurrency=3, max_attempts=8, min_backoff=0.2, max_backoff=1.0))
# Four threads a process, two processes (near and far): room for more than one group's cap at once.
groups = jobs.queue(
    Queue(GROUP_QUEUE, concurrency=4, max_attempts=5, min_backoff=0.2, max_backoff=1.0, group_concurrency=GROUP_CAP)
)


class Hammer(Payload):
    token: str
    seconds: float


class Census(Payload):
    token: str


class Poll(Work):
    #: Runs that ask for another (the user's middleware re-enqueues each); the next one ends the job.
    polls: int = 1


def _manager(ctx) -> threading.Thread:
    for middleware in ctx.app.broker.middleware:
        if isinstance(middleware, TimeLimit):
            manager = middleware.manager
            manager.interval = LIMIT_INTERVAL  # type: ignore[attr-defined]
            middleware.logger.setLevel(logging.ERROR)  # a warning per limit would flood the worker's log
            return manager  # type: ignore[return-value]
    raise RuntimeError("this worker runs no conveyor TimeLimit")


@jobs.job("fault.hammer", queue=limits, payload=Hammer)
def hammer(payload: Hammer, ctx) -> None:
    manager = _manager(ctx)
    ident = threading.get_ident()
    landed = uses = 0
    deadline = time.monotonic() + payload.seconds
    manager.add_timeout(ident, 1)  # type: ignore[attr-defined]
    try:
        while time.monotonic() < deadline:
            try:
                with ctx.app.pool.connection(timeout=2):
                    uses += 1
            except TimeLimitExceeded:
                landed += 1
                manager.add_timeout(ident, 1)  # type: ignore[attr-defined]
            except DatabaseUnavailable:
                break  # the pool has nothing left to hand out (the census tells)
    finally:
        manager.remove_timeout(ident)  # type: ignore[attr-defined]
        try:
            time.sleep(5 * LIMIT_INTERVAL + 0.05)  # one already on its way lands here
        except TimeLimitExceeded:
            landed += 1
    _log(ctx, "hammer", uses, 0, landed)


@jobs.job("fault.census", queue=limits, payload=Census)
def census(payload: Census, ctx) -> None:
    pool = ctx.app.pool
    held = []
    stats: dict = {}
    try:
        while len(held) < pool.max_size:
            held.append(pool.getconn(timeout=CENSUS_WAIT))
    except PoolTimeout:
        pass
    finally:
        # Read while holding: pool_size counts every connection the pool opened and did not close, so
        # pool_size - pool_available - got is what was checked out and never returned (the leak); a pool
        # that could not open more in time (a loaded machine) has pool_size near got, or is still growing.
        stats = {**pool.get_stats(), "growing": bool(getattr(pool, "_growing", False))}
        for conn in held:
            pool.putconn(conn)
    _log(ctx, payload.token, len(held), pool.max_size, 0, json.dumps(stats, sort_keys=True))


def _log(ctx, what: str, got: int, size: int, landed: int, stats: str | None = None) -> None:
    """One row of ``fault_pools``, on a connection of its own: a pool the time limits emptied must not
    keep its own census from being told."""
    with psycopg.connect(ctx.app.settings.database_url, autocommit=True, connect_timeout=10) as conn:
        conn.execute(INSERT_POOL, (os.getpid(), what, got, size, landed, stats))


@jobs.job("fault.poll", queue=polls, payload=Poll)
def poll(payload: Poll, ctx) -> None:
    message = CurrentMessage.get_current_message()
    if message is not None and message.options.get(POLLS, 0) < payload.polls:
        work(payload.model_copy(update={"effect": False}), ctx)  # a logged run without the effect
        message.options[AGAIN] = True
        return
    work(payload, ctx)


jobs.on_final_failure("fault.poll")(dead)


jobs.job("fault.grouped", queue=groups, payload=Work)(work)
jobs.on_final_failure("fault.grouped")(dead)
jobs.on_cancel("fault.grouped")(cancel_hook)
