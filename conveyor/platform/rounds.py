"""A round: the user's message, the run that answers it, and the job that runs it.

The producer side of the agent platform: the API's ``POST
/api/tasks/{task_id}/runs`` and the demo both start rounds here.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING

from conveyor.errors import EnqueueError, EnqueueOutcomeUnknown
from conveyor.platform import quotas, records
from conveyor.platform.payloads import run_key
from conveyor.platform.quotas import RunQuota

if TYPE_CHECKING:
    from conveyor.app import App

#: The job that runs a round, by the task's kind.
RUN_JOBS = {"task": "task.run", "chat": "chat.run"}


@dataclass(frozen=True)
class StartedRound:
    """What starting a round returns: the run and its messages' IDs, and the enqueued job."""

    run_id: str
    task_id: str
    user_message_id: str
    assistant_message_id: str
    job_id: str
    created: bool


def new_id(prefix: str) -> str:
    """A fresh record ID such as ``run_3f2a...``."""
    return f"{prefix}_{uuid.uuid4().hex}"


def start_round(
    app: "App", *, task_id: str, content: str, message_id: str | None = None, quota: RunQuota | None = None
) -> StartedRound:
    """Add the user's message and a queued run, then enqueue its job (keyed by :func:`~conveyor.platform.payloads.run_key`).

    With a caller-given ``message_id``, starting the same round again returns
    the first run (``created=False``) and enqueues nothing new: a client may
    retry its POST safely. Raises :class:`~conveyor.errors.RecordNotFound` for
    an unknown task and :class:`~conveyor.errors.RecordConflict` when the
    message ID is taken by other content; with a ``quota`` (the API's, per user),
    :class:`~conveyor.platform.errors.QuotaExceeded` when the task's user has no room for
    a new run, counted in the transaction that creates it (nothing is kept then).
    """
    message_id = message_id or new_id("msg")
    with app.pool.connection() as conn:
        task = records.get_task(conn, task_id)
        with conn.transaction():
            records.add_message(conn, id=message_id, task_id=task_id, role="user", content=content)
            found = records.find_run_by_user_message(conn, message_id)
            created = found is None
            run_id = found or new_id("run")
            if created:
                if quota is not None:
                    quotas.check_new_run(conn, task.user_id, quota)
                records.create_run(
                    conn,
                    id=run_id,
                    task_id=task_id,
                    job=RUN_JOBS[task.kind],
                    user_message_id=message_id,
                    assistant_message_id=new_id("msg"),
                )
        run = records.get_run(conn, run_id)
        try:
            # Keyed: a retried POST of a run still queued enqueues nothing new.
            ref = app.jobs.enqueue(run.job, {"task_id": task_id, "run_id": run_id}, key=run_key(run_id))
        except EnqueueOutcomeUnknown:
            # The job may exist: failing the run would fail a round that runs. It stays queued, as after a
            # process that died before its enqueue; the client's retry (same message id) enqueues it keyed.
            raise
        except EnqueueError as exc:
            # Nothing will run it: end it now rather than leave it queued forever.
            records.fail_run(conn, run_id, f"could not be enqueued: {exc}")
            raise
    return StartedRound(run_id, task_id, message_id, run.assistant_message_id, ref.id, created)


#: Seconds a run may stay queued before the scheduler enqueues its job again (keyed: a job that is there
#: already is not doubled). Longer than any enqueue's retries; a run waiting behind a backlog costs one
#: deduplicated enqueue per pass.
STRANDED_AFTER = 120

#: Most stranded runs one pass looks at.
STRANDED_BATCH = 100


def requeue_stranded_runs(app: "App", *, older_than: float = STRANDED_AFTER) -> int:
    """Enqueue (keyed) the job of every run queued for longer than ``older_than``; returns how many were new.

    A run's row commits before its job is enqueued, so a process that died in between, or an enqueue whose
    outcome was unknown, leaves a run queued with no job: it would wait for good and hold one of its
    user's active-run places. The key (:func:`run_key`) makes this a no-op for a run whose job exists.
    """
    with app.pool.connection() as conn:
        stranded = records.stranded_runs(conn, older_than=older_than, limit=STRANDED_BATCH)
    enqueued = 0
    for run_id, task_id, job in stranded:
        ref = app.jobs.enqueue(job, {"task_id": task_id, "run_id": run_id}, key=run_key(run_id))
        enqueued += not ref.deduplicated
    return enqueued


def cancel_round(app: App, run: records.Run) -> None:
    """Stop a run: its job is cancelled (a queued run's never starts; a running one is interrupted where it runs
    and its cancel hook ends the run ``cancelled`` with the partial reply); a run still queued ends here."""
    from conveyor.inspector import Inspector
    from conveyor.platform.streams import buffer_for

    for view in Inspector(app).search(run_key(run.id)):
        if view.state in ("waiting", "delayed", "active"):
            app.jobs.cancel(view.id)
    with app.pool.connection() as conn:
        ended = records.cancel_run(conn, run, running=False)
    if ended:
        buffer_for(app).end(run.id, "cancelled")
