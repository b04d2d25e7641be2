"""Job types for tests, loaded into workers with CONVEYOR_IMPORTS=tests.support.jobs.

``test.probe.<queue>`` records every start and finish in ``probe_runs`` and can
sleep, fail, fail permanently or kill its own process, so tests can observe
from outside what ran where and how often.
With TEST_FLAKY_CREDIT_PERCENT=N, the real credit.consume fails on its first
attempt for N % of tasks (chosen by a stable hash of the task id).
``test.pg.bad`` fails with an error text Postgres cannot store as it is.
"""

from __future__ import annotations

import hashlib
import os
import time
from dataclasses import replace

import psycopg

from conveyor.blueprints import Jobs
from conveyor.brokers.postgres.jobs import storable
from conveyor.errors import DatabaseUnavailable, DeliveryFenced, PermanentError
from conveyor.ledger import credits
from conveyor.platform.payloads import CreditConsume
from conveyor.platform.queues import CRITICAL, QUEUES
from conveyor.tasks.payloads import Payload

INSERT_RUN = "INSERT INTO probe_runs (token, job_id, attempt, pid) VALUES (%s, %s, %s, %s) RETURNING id"
FINISH_RUN = "UPDATE probe_runs SET finished_at = clock_timestamp() WHERE id = %s"
INSERT_DEAD = "INSERT INTO probe_dead (job_id, token, error) VALUES (%s, %s, %s)"


class Probe(Payload):
    token: str
    sleep: float = 0
    fail_times: int = 0
    permanent: bool = False
    crash_times: int = 0
    api_key: str | None = None
    #: Seconds the final-failure hook takes; its runs are recorded in probe_runs as "hook:<token>".
    hook_sleep: float = 0
    #: The hook's first N runs find the database away (DatabaseUnavailable), recorded as "blip:<token>".
    hook_blips: int = 0
    #: The body's first N runs find the database away (DatabaseUnavailable: a server restarting).
    outages: int = 0

    secret_fields = frozenset({"api_key"})


def probe(payload: Probe, ctx) -> None:
    if ctx.attempt <= payload.crash_times:
        os._exit(17)  # dies like a segfault would: no cleanup, no ack
    with ctx.app.pool.connection() as conn:
        run_id = conn.execute(INSERT_RUN, (payload.token, ctx.job_id, ctx.attempt, os.getpid())).fetchone()[0]
    if payload.sleep:
        time.sleep(payload.sleep)
    if payload.permanent:
        raise PermanentError(f"probe {payload.token} can never work")
    if ctx.attempt <= payload.outages:
        raise DatabaseUnavailable("Postgres is unavailable (injected for the test)")
    if ctx.attempt <= payload.fail_times:
        raise RuntimeError(f"probe {payload.token} fails on attempt {ctx.attempt}")
    with ctx.app.pool.connection() as conn:
        conn.execute(FINISH_RUN, (run_id,))


def probe_dead(payload: Probe | None, error: str, ctx) -> None:
    if payload is not None and payload.hook_blips:
        with ctx.app.pool.connection() as conn:
            conn.execute(INSERT_RUN, (f"blip:{payload.token}", ctx.job_id, ctx.attempt, os.getpid()))
            runs = conn.execute("SELECT count(*) FROM probe_runs WHERE token = %s", (f"blip:{payload.token}",))
            if runs.fetchone()[0] <= payload.hook_blips:
                raise DatabaseUnavailable("Postgres is unavailable (injected for the test)")
    if payload is not None and payload.hook_sleep:
        with ctx.app.pool.connection() as conn:
            run_id = conn.execute(
                INSERT_RUN, (f"hook:{payload.token}", ctx.job_id, ctx.attempt, os.getpid())
            ).fetchone()
        time.sleep(payload.hook_sleep)
        with ctx.app.pool.connection() as conn:
            conn.execute(FINISH_RUN, (run_id[0],))
    with ctx.app.pool.connection() as conn:
        conn.execute(INSERT_DEAD, (ctx.job_id, payload.token if payload else None, error))


#: This module's blueprint: an App whose CONVEYOR_IMPORTS names the module includes it.
jobs = Jobs()

for _queue in QUEUES.values():
    jobs.job(f"test.probe.{_queue.name}", queue=_queue, payload=Probe)(probe)
    jobs.on_final_failure(f"test.probe.{_queue.name}")(probe_dead)


class SlowCredit(CreditConsume):
    sleep: float = 0


@jobs.job("test.slow_credit", queue=CRITICAL, payload=SlowCredit)
def slow_credit(payload: SlowCredit, ctx) -> None:
    """A charge that takes a while, so a test can kill its worker mid-job."""
    with ctx.app.pool.connection() as conn:
        conn.execute(INSERT_RUN, (payload.message_id, ctx.job_id, ctx.attempt, os.getpid()))
    time.sleep(payload.sleep)
    with ctx.app.pool.connection() as conn:
        credits.consume(
            conn,
            user_id=payload.user_id,
            task_id=payload.task_id,
            message_id=payload.message_id,
            total_tokens=payload.total_tokens,
            price_per_1k=ctx.app.settings.price_per_1k_tokens,
        )


def flaky(task_id: str, percent: int) -> bool:
    return int(hashlib.sha256(task_id.encode()).hexdigest(), 16) % 100 < percent


_PERCENT = int(os.environ.get("TEST_FLAKY_CREDIT_PERCENT", "0"))
if _PERCENT:
    from conveyor.platform.jobs import jobs as platform_jobs

    _real = platform_jobs.job_types["credit.consume"]

    def _flaky_consume(payload, ctx):
        if ctx.attempt == 1 and flaky(payload.task_id, _PERCENT):
            raise ConnectionError(f"injected transient failure for task {payload.task_id}")
        return _real.run(payload, ctx)

    # Only in the worker subprocesses this variable is set for: the platform blueprint is theirs.
    platform_jobs.job_types["credit.consume"] = replace(_real, run=_flaky_consume)


# -- texts Postgres cannot store as they are (tests/integration/test_pg_faults.py) ----------------

#: A NUL and lone surrogates: Postgres refuses them in text, so the broker must make them storable.
BAD_TEXT = "bad \x00 text \ud800 and \udcff"

#: What ``test.pg.bad`` raises: the bad text, or a word a test makes the table refuse.
ERRORS = {"nul": BAD_TEXT, "poison": "poison"}


class Bad(Payload):
    token: str
    fail_times: int = 0
    permanent: bool = False
    error: str = "nul"


def _write(database_url: str, query: str, params: tuple) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(query, params)


@jobs.job("test.pg.bad", queue=CRITICAL, payload=Bad)
def bad(payload: Bad, ctx) -> None:
    """Records its start, then raises an error with a NUL and lone surrogates (or the forbidden word)."""
    _write(
        ctx.app.settings.database_url,
        "INSERT INTO probe_runs (token, job_id, attempt, pid) VALUES (%s, %s, %s, 0)",
        (payload.token, ctx.job_id, ctx.attempt),
    )
    if payload.permanent:
        raise PermanentError(ERRORS[payload.error])
    if ctx.attempt <= payload.fail_times:
        raise RuntimeError(ERRORS[payload.error])


@jobs.on_final_failure("test.pg.bad")
def bad_dead(payload: Bad | None, error: str, ctx) -> None:
    _write(
        ctx.app.settings.database_url,
        "INSERT INTO probe_dead (job_id, token, error) VALUES (%s, %s, %s)",
        (ctx.job_id, payload.token if payload else None, storable(error)),
    )


# -- a job's own effects, fenced or not (tests/integration/test_effects.py) ------------------------

INSERT_EFFECT = "INSERT INTO effect_log (token, job_id, delivery, attempt, pid, kind) VALUES (%s, %s, %s, %s, %s, %s)"


class Effect(Payload):
    token: str
    #: Seconds the first attempt waits between its start and its effects (a test pauses its worker there).
    hold: float = 0
    #: Attempts that raise after their effects (the next delivery then meets them).
    fail_times: int = 0


@jobs.job("test.effect", queue=QUEUES["nudge"], payload=Effect)
def effect(payload: Effect, ctx) -> None:
    """Writes one effect four ways: unguarded, once-guarded, with the job's completion (postgres), fence-checked.

    Every step lands in ``effect_log`` (kind: started, naive, once, transactional, rolled_back,
    fence_raised, ended), so a test sees from outside which delivery applied what.
    """

    def log(conn, kind: str) -> None:
        conn.execute(INSERT_EFFECT, (payload.token, ctx.job_id, ctx.delivery, ctx.attempt, os.getpid(), kind))

    with ctx.app.pool.connection() as conn:
        log(conn, "started")
    if ctx.attempt == 1 and payload.hold:
        time.sleep(payload.hold)
    with ctx.app.pool.connection() as conn:
        log(conn, "naive")  # no guard: a paused worker that resumes writes it again
        with conn.transaction():
            if ctx.once(conn, "effect"):
                log(conn, "once")
    if ctx.attempt <= payload.fail_times:
        raise RuntimeError(f"effect {payload.token} fails on attempt {ctx.attempt}")
    fenced: DeliveryFenced | None = None
    if ctx.can_complete_in_transaction:
        try:
            with ctx.transaction() as conn:
                log(conn, "transactional")
        except DeliveryFenced as exc:
            fenced = exc
            with ctx.app.pool.connection() as conn:
                log(conn, "rolled_back")
    try:
        ctx.check_fence()
    except DeliveryFenced as exc:
        fenced = exc
        with ctx.app.pool.connection() as conn:
            log(conn, "fence_raised")
    with ctx.app.pool.connection() as conn:
        log(conn, "ended")
    if fenced is not None:
        raise fenced


class Hog(Payload):
    token: str
    mib: int = 0


#: What test.hog keeps: memory a leaky job would never give back (until its process is recycled).
_hoard: list[bytes] = []


@jobs.job("test.hog", queue=QUEUES["nudge"], payload=Hog)
def hog(payload: Hog, ctx) -> None:
    """A probe run (probe_runs) that first keeps ``mib`` MiB of touched memory in its process."""
    _hoard.append(b"x" * (payload.mib * 1024 * 1024))
    probe(Probe(token=payload.token), ctx)


class Cancellable(Payload):
    """``test.cancellable``: runs until cancelled; ``cooperative`` stops by itself once it sees ``ctx.cancelled``,
    else it ignores it and is interrupted after the grace. Each step is a row of effect_log (kind)."""

    token: str
    cooperative: bool = False
    #: Once it sees ``ctx.cancelled``, complete in its own transaction (``ctx.transaction``, postgres) and return.
    commit: bool = False
    #: As ``commit``, but through ``ctx.complete_in`` in a transaction of the job's own making.
    complete_in: bool = False


def _cancel_log(ctx, token: str, kind: str) -> None:
    with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as conn:
        conn.execute(
            "INSERT INTO effect_log (token, job_id, delivery, attempt, pid, kind) VALUES (%s, %s, %s, %s, %s, %s)",
            (token, ctx.job_id, ctx.delivery, ctx.attempt, os.getpid(), kind),
        )


@jobs.job("test.cancellable", queue=QUEUES["nudge"], payload=Cancellable)
def cancellable(payload: Cancellable, ctx) -> None:
    from conveyor.interrupts import JobCancelled

    _cancel_log(ctx, payload.token, "started")
    seen = False
    try:
        while True:
            if ctx.cancelled and not seen:
                seen = True
                _cancel_log(ctx, payload.token, "seen")
                if payload.cooperative:
                    _cancel_log(ctx, payload.token, "stopped")
                    return
                if payload.commit:
                    with ctx.transaction() as conn:
                        conn.execute(
                            "INSERT INTO effect_log (token, job_id, delivery, attempt, pid, kind)"
                            " VALUES (%s, %s, %s, %s, %s, 'committed')",
                            (payload.token, ctx.job_id, ctx.delivery, ctx.attempt, os.getpid()),
                        )
                    return
                if payload.complete_in:
                    with ctx.app.pool.connection() as conn, conn.transaction():
                        conn.execute(
                            "INSERT INTO effect_log (token, job_id, delivery, attempt, pid, kind)"
                            " VALUES (%s, %s, %s, %s, %s, 'committed')",
                            (payload.token, ctx.job_id, ctx.delivery, ctx.attempt, os.getpid()),
                        )
                        ctx.complete_in(conn)
                    return
            time.sleep(0.005)
    except JobCancelled:
        _cancel_log(ctx, payload.token, "interrupted")
        raise


@jobs.on_cancel("test.cancellable")
def cancellable_hook(payload: Cancellable | None, ctx) -> None:
    _cancel_log(ctx, payload.token if payload else "?", "hook")


class Grouped(Payload):
    grp: str
    sleep: float = 0


GROUP_ENTER = (
    "INSERT INTO group_load AS g (grp, running, peak) VALUES (%s, 1, 1) ON CONFLICT (grp) DO UPDATE "
    "SET running = g.running + 1, peak = greatest(g.peak, g.running + 1)"
)
GROUP_LEAVE = "UPDATE group_load SET running = running - 1 WHERE grp = %s"
GROUP_DONE = "INSERT INTO group_done (job_id, grp) VALUES (%s, %s) ON CONFLICT DO NOTHING"


@jobs.job("test.grouped", queue=QUEUES["indexing"], payload=Grouped)
def grouped(payload: Grouped, ctx) -> None:
    """Counts its group's jobs running at once (group_load.peak) and records its finish (group_done)."""
    with ctx.app.pool.connection() as conn:
        conn.execute(GROUP_ENTER, (payload.grp,))
    try:
        time.sleep(payload.sleep)
    finally:
        with ctx.app.pool.connection() as conn:
            conn.execute(GROUP_LEAVE, (payload.grp,))
    with ctx.app.pool.connection() as conn:
        conn.execute(GROUP_DONE, (ctx.job_id, payload.grp))
