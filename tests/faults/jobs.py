"""The fault suite's job types, loaded into workers with CONVEYOR_IMPORTS=tests.faults.jobs.

``fault.work.<queue>`` sleeps, fails once, fails for good, charges through
the real ledger (``credits.consume``, the code ``credit.consume`` runs), or
writes its effect and then waits to be killed before it can be acked. Each
run first inserts a row into the run log (``fault_runs``, see faults.sql)
and records how it ended, first in a spool file (``FAULT_SPOOL``/<pid>.jsonl,
local, so it is there even when the database is away or the host is cut
off), then in the row; the checker merges the two. A cancel hook
(``on_cancel``) logs each of its runs to ``fault_cancels``.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import socket
import threading
import time
import uuid

from dramatiq.middleware import CurrentMessage

from conveyor.blueprints import DEFAULT
from conveyor.errors import PermanentError
from conveyor.ledger import credits
from conveyor.platform.queues import QUEUES
from conveyor.tasks.payloads import Payload
from conveyor.tasks.registry import job, on_final_failure

#: The queues the workload spreads over: different concurrencies and retry budgets.
WORK_QUEUES = ("critical", "indexing", "nudge")

#: How long a holding run waits to be killed before it gives up and finishes (a harness bug, not a pass).
HOLD_SECONDS = 45.0

#: Error texts a database or a JSON encoder may refuse: a NUL, and a lone surrogate (not encodable as UTF-8).
BAD_TEXTS = {"nul": "bad\x00text", "surrogate": "bad\ud800text", "both": "nul\x00 and \udcff surrogate"}

INSERT_RUN = (
    "INSERT INTO fault_runs (run_id, job_id, token, attempt, delivery, host, pid, fenced, started_up)"
    " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)"
)
END_RUN = (
    "UPDATE fault_runs SET ended_at = started_at + make_interval(secs => %s), ok = %s, ended_up = %s, held = %s"
    " WHERE run_id = %s"
)
INSERT_CANCEL = "INSERT INTO fault_cancels (job_id, token, pid) VALUES (%s, %s, %s)"
EFFECT = "UPDATE fault_runs SET effect_at = clock_timestamp() WHERE run_id = %s"
INSERT_DEAD = "INSERT INTO fault_dead (job_id, token, error, pid, ended_at) VALUES (%s, %s, %s, %s, %s) RETURNING id"
END_DEAD = "UPDATE fault_dead SET ended_at = clock_timestamp() WHERE id = %s"
INSERT_WAIT = "INSERT INTO fault_waits (run_id, job_id, token, delivery, data) VALUES (%s, %s, %s, %s, %s)"
INSERT_EFFECT = "INSERT INTO fault_effects (run_id, job_id, token, delivery, fenced) VALUES (%s, %s, %s, %s, %s)"

_spool_lock = threading.Lock()


class Work(Payload):
    token: str
    sleep: float = 0
    fail_times: int = 0
    permanent: bool = False
    #: Write the effect (and the charge), then wait to be killed; first attempt only.
    hold: bool = False
    #: Key of BAD_TEXTS: the errors this job raises carry that text.
    bad_text: str | None = None
    #: A charge through the real ledger, when user_id is set.
    user_id: str | None = None
    task_id: str | None = None
    message_id: str | None = None
    total_tokens: int = 0
    #: Write a row to the effect log when the run succeeds (the campaign's non-idempotent effect).
    effect: bool = False
    #: Seconds the final-failure hook takes (the campaign kills workers inside hooks).
    hook_sleep: float = 0
    #: Keyed child jobs this body enqueues in one batch (``<token>.k<i>``, key ``child:<token>:<i>``), then
    #: it lingers 0.3 s before its ack: the campaign kills workers mid-fan-out.
    children: int = 0
    #: After its work, ask the broker whether this delivery is still the job's current one (``held`` in
    #: the run log): the campaign's grouped jobs, whose runs the group-cap rule counts.
    check_held: bool = False
    #: ``ctx.wait_for(event, timeout=wait_timeout)`` before the work (the campaign's waiters): the run that
    #: gets past it logs what the wait returned (``fault_waits``), then does the work as any other.
    event: str | None = None
    wait_timeout: float = 0


#: /proc/uptime counts in hundredths of a second: an elapsed time less this is never longer than the truth.
UPTIME_RESOLUTION = 0.01


def uptime() -> float:
    """Seconds since boot from /proc/uptime: a real clock libfaketime does not move (the campaign steps
    workers' clocks, the monotonic one included, and a run's length must stay true)."""
    with open("/proc/uptime") as f:
        return float(f.read().split()[0])


def host() -> str:
    return os.environ.get("FAULT_HOST") or socket.gethostname()


def delivery_of(message) -> int | None:
    """The broker's delivery number (its fence), whatever the broker calls it."""
    if message is None:
        return None
    for name, value in message.options.items():
        if name.endswith("delivery") and not isinstance(value, bool):
            try:
                return int(value)
            except (TypeError, ValueError):
                continue
    return None


def spool(record: dict) -> None:
    """Append to this process's spool file: read by the checker when the database could not be written."""
    directory = os.environ.get("FAULT_SPOOL")
    if not directory:
        return
    line = json.dumps(record) + "\n"
    with _spool_lock, open(os.path.join(directory, f"{os.getpid()}.jsonl"), "a") as f:
        f.write(line)


def fenced(ctx) -> bool:
    """Whether this worker's conveyor can fence a job's own effect (``ctx.once``, issue 18)."""
    return callable(getattr(ctx, "once", None))


def write_effect(ctx, payload: Work, run_id: str, delivery: int | None) -> None:
    """The effect: one row per application. Fenced, it applies once per job whichever delivery gets there
    first (``ctx.once``) and, on the postgres broker, commits with the job's completion only while this
    delivery is current (``ctx.transaction``): a paused or cut-off delivery's effect rolls back."""
    if not fenced(ctx):
        with ctx.app.pool.connection() as conn:
            conn.execute(INSERT_EFFECT, (run_id, ctx.job_id, payload.token, delivery, False))
        return
    if getattr(ctx, "can_complete_in_transaction", False):
        with ctx.transaction() as conn:
            if ctx.once(conn, "effect"):
                conn.execute(INSERT_EFFECT, (run_id, ctx.job_id, payload.token, delivery, True))
        return
    with ctx.app.pool.connection() as conn, conn.transaction():
        if ctx.once(conn, "effect"):
            conn.execute(INSERT_EFFECT, (run_id, ctx.job_id, payload.token, delivery, True))


def child(token: str, i: int, queue: str) -> dict:
    """The i-th child job a fan-out body enqueues: keyed, so a rerun of the body adds none."""
    return {
        "job": f"fault.work.{queue}",
        "payload": {"token": f"{token}.k{i}", "sleep": 0.02, "effect": True},
        "key": f"child:{token}:{i}",
    }


def work(payload: Work, ctx) -> None:
    message = CurrentMessage.get_current_message()
    run_id = str(uuid.uuid4())
    delivery = delivery_of(message)
    started_up = uptime()  # the host's boot clock, before the row exists: never later than the truth
    try:
        with ctx.app.pool.connection() as conn:
            conn.execute(
                INSERT_RUN,
                (
                    run_id,
                    ctx.job_id,
                    payload.token,
                    ctx.attempt,
                    delivery,
                    host(),
                    os.getpid(),
                    fenced(ctx),
                    started_up,
                ),
            )
    except BaseException:
        # The row may or may not be there (an error at commit): if it is, the run ended as it began.
        spool({"run_id": run_id, "elapsed": 0.0, "ok": False, "ended_up": uptime() + UPTIME_RESOLUTION})
        raise
    # Counted from the moment the row is known written: its start is the server's clock at the
    # insert, so the end (start + elapsed) is never later than the truth (a wait for a pooled
    # connection or for a cut-off network does not stretch the run).
    began = uptime()
    ok = False
    try:
        if payload.event:
            # The first run parks here (WaitForEvent ends it, not ok); the resumed one gets past.
            data = ctx.wait_for(payload.event, timeout=payload.wait_timeout)
            with ctx.app.pool.connection() as conn:
                conn.execute(INSERT_WAIT, (run_id, ctx.job_id, payload.token, delivery, json.dumps(data)))
        if payload.sleep:
            time.sleep(payload.sleep)
        if payload.children:
            ctx.app.jobs.enqueue_many([child(payload.token, i, ctx.queue) for i in range(payload.children)])
            time.sleep(0.3)
        if payload.user_id:
            with ctx.app.pool.connection() as conn:
                credits.consume(
                    conn,
                    user_id=payload.user_id,
                    task_id=payload.task_id,
                    message_id=payload.message_id,
                    total_tokens=payload.total_tokens,
                    price_per_1k=ctx.app.settings.price_per_1k_tokens,
                )
        if payload.hold and ctx.attempt == 1:
            with ctx.app.pool.connection() as conn:
                conn.execute(EFFECT, (run_id,))
            deadline = time.monotonic() + HOLD_SECONDS
            while time.monotonic() < deadline:  # the harness SIGKILLs this process now
                time.sleep(0.05)
        text = BAD_TEXTS.get(payload.bad_text or "", "")
        if payload.permanent:
            raise PermanentError(f"fault job {payload.token} can never work {text}")
        if ctx.attempt <= payload.fail_times:
            raise RuntimeError(f"fault job {payload.token} fails on attempt {ctx.attempt} {text}")
        if payload.effect:
            write_effect(ctx, payload, run_id, delivery)
        ok = True
    finally:
        # The end is measured before it is written, and spooled first: a write that hangs on a
        # cut-off network must neither stretch the run nor leave its end unknown meanwhile.
        now = uptime()
        elapsed = max(0.0, now - began - UPTIME_RESOLUTION)
        ended_up = now + UPTIME_RESOLUTION  # never earlier than the truth
        # Asked after the end was measured: "current" now means it held its slot up to that end.
        held = still_held(ctx, message) if payload.check_held else None
        spool({"run_id": run_id, "elapsed": elapsed, "ok": ok, "ended_up": ended_up, "held": held})
        with contextlib.suppress(Exception):
            with ctx.app.pool.connection() as conn:
                conn.execute(END_RUN, (elapsed, ok, ended_up, held, run_id))


def still_held(ctx, message) -> bool | None:
    """Whether this delivery is still its job's current one (None: no answer). A delivery taken back
    (lease recovered) or handed on never becomes current again, so True means it held the job, and its
    group slot, from its claim until now."""
    if message is None:
        return None
    try:
        return bool(ctx.app.broker.is_current(message))
    except Exception:  # noqa: BLE001 - a server away: unknown, the rule does not count the run
        return None


def cancel_hook(payload: Work | None, ctx) -> None:
    """The cancel hook: one row of ``fault_cancels`` per run (the rule: at most once, only if cancelled)."""
    with ctx.app.pool.connection() as conn:
        conn.execute(INSERT_CANCEL, (ctx.job_id, payload.token if payload else None, os.getpid()))


def dead(payload: Work | None, error: str, ctx) -> None:
    """The final-failure hook: its effect is a row of ``fault_dead`` with ``ended_at`` set, applied once per
    job through ``ctx.once`` where the worker has it (hooks are at least once; their effects need not be).
    A slow hook first logs that it started (``ended_at`` NULL): the campaign kills workers inside it."""
    # The hook's own table cannot hold a NUL or a lone surrogate: keep a printable copy.
    printable = error.replace("\x00", "\\x00").encode("utf-8", "backslashreplace").decode()
    token = payload.token if payload else None
    if payload is None or not payload.hook_sleep:
        with ctx.app.pool.connection() as conn, conn.transaction():
            if not fenced(ctx) or ctx.once(conn, "hook"):
                conn.execute(INSERT_DEAD, (ctx.job_id, token, printable, os.getpid(), dt.datetime.now(dt.UTC)))
        return
    with ctx.app.pool.connection() as conn:
        row = conn.execute(INSERT_DEAD, (ctx.job_id, token, printable, os.getpid(), None)).fetchone()
    time.sleep(payload.hook_sleep)  # the campaign may SIGKILL this process now
    with ctx.app.pool.connection() as conn, conn.transaction():
        if not fenced(ctx) or ctx.once(conn, "hook"):
            conn.execute(END_DEAD, (row[0],))


for _queue in WORK_QUEUES:
    job(f"fault.work.{_queue}", queue=QUEUES[_queue], payload=Work)(work)
    on_final_failure(f"fault.work.{_queue}")(dead)
    DEFAULT.on_cancel(f"fault.work.{_queue}")(cancel_hook)
