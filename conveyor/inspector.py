"""The read layer: jobs, queues and workers as plain dataclasses, no HTTP.

It asks the broker (any :class:`~conveyor.brokers.base.ConveyorBroker`)
and returns what people may see: payload secrets redacted, errors
scrubbed of secret values. The admin API and dashboard routes
(``api/admin.py``, ``api/dashboard.py``) only render what it returns, and
the library's ``app.jobs.get(job_id)`` returns its :class:`JobView`;
operator actions go through it too, so the HTTP side never touches the broker.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING

from conveyor.brokers.base import JOB_STATES, MAX_GROUPS, CancelOutcome, ConveyorBroker, JobRecord, check_state
from conveyor.brokers.fleet import AttemptInfo, WorkerInfo, fleet_store, late_after, recovery_after
from conveyor.brokers.rollup import rollup_store
from conveyor.budgets import budget_store
from conveyor.budgets.base import Budget
from conveyor.errors import InvalidQuery, JobNotFound, JobStateConflict, UnknownQueue
from conveyor.history import QueueHistory, check_window, read_history
from conveyor.logs import log_error, log_event
from conveyor.middleware.metrics import budget_totals
from conveyor.redaction import payload_secrets, redact_payload, scrub, settings_secrets

if TYPE_CHECKING:
    from conveyor.app import App

#: Most jobs one page lists.
MAX_PAGE = 500

#: Most records a job-name filter looks through for one page (the brokers list by state, not by name).
MAX_FILTER_SCAN = 5000

#: Records fetched per step of that scan.
_SCAN_STEP = 250


@dataclass
class WorkerView(WorkerInfo):
    """One worker process as the Workers page shows it: its registry entry (:class:`WorkerInfo`, every
    field of it) and what the read layer works out from the store server's clock.

    It derives from the entry so a field added there shows here and in the admin API's ``Worker``
    schema, generated from these fields. ``gone_at``/``gone_reason`` may be the read layer's (a worker
    silent past recovery reads as recovered before anyone swept it), and a gone worker's ``in_flight``
    is empty: its jobs went back.
    """

    #: Seconds since its last heartbeat, by the server's clock.
    heartbeat_age: float | None = None
    #: "alive", "late" (heartbeat overdue) or "gone" (stopped, or silent past recovery: its jobs went back).
    state: str = "alive"

    @property
    def attempts_completed(self) -> int:
        """Attempts this process ran to completion since it started (the registry's ``done``)."""
        return self.done

    @property
    def attempts_failed(self) -> int:
        """Attempts of it that failed, retried or failed for good (the registry's ``failed``). Not jobs:
        a job that failed for good is counted by its queue's ``failed``."""
        return self.failed


@dataclass
class AttemptView(AttemptInfo):
    """One attempt of a job as people may see it: the registry's :class:`AttemptInfo`, every field of
    it, with error and traceback scrubbed and ``outcome`` always set: completed, failed, deferred,
    skipped; "running" while its worker lives; "lost" when its worker died."""

    @property
    def run_seconds(self) -> float | None:
        if self.started_at and self.ended_at and self.ended_at >= self.started_at:
            return self.ended_at - self.started_at
        return None


@dataclass(frozen=True)
class QueueView:
    """One queue's counts and settings, as the dashboard's overview shows them."""

    name: str
    concurrency: int
    max_attempts: int
    waiting: int
    delayed: int
    #: Claimed by a worker: ``running`` (started) plus ``prefetched`` (fetched ahead, not started).
    active: int
    running: int
    prefetched: int
    #: Jobs that failed for good (not failed attempts, which a worker's ``attempts_failed`` counts).
    failed: int
    completed_total: int
    failed_total: int
    paused: bool
    #: Seconds the oldest waiting job has waited; None when none waits.
    oldest_waiting_seconds: float | None
    #: Jobs that ended cancelled, still kept (retention).
    cancelled: int = 0
    #: Jobs parked until a signal of their event or its timeout (``ctx.wait_for``).
    awaiting: int = 0


@dataclass(frozen=True)
class GroupView:
    """One named group of a queue: its waiting jobs, those a worker holds (what the cap counts), its oldest wait."""

    group: str
    waiting: int
    active: int
    #: Seconds its oldest waiting job has waited; None when none waits.
    oldest_waiting_seconds: float | None
    #: Its turns per round of the queue's groups (``app.jobs.set_group_weight``, ``group_weights``).
    weight: int = 1


@dataclass(frozen=True)
class GroupsView:
    """A queue's busiest named groups (most waiting first); ``total`` counts every group with jobs now."""

    queue: str
    #: Most jobs of one group held at once (``group_concurrency``); None: no cap.
    cap: int | None
    groups: list[GroupView]
    total: int

    @property
    def more(self) -> int:
        """Groups with jobs that are not listed."""
        return max(0, self.total - len(self.groups))


@dataclass(frozen=True)
class BudgetKeyView:
    """One key of a budget with weight in its window: the key's value (None: the budget has no key)."""

    key: str | None
    used: float


@dataclass(frozen=True)
class BudgetView:
    """A declared budget: its limit per window, who declares it, its keys' use now, what it throttled.

    ``throttled``/``waited_seconds``: starts it refused and the seconds it told them to wait, as
    ``/metrics`` counts them (the worker processes this process can see); None when it sees none.
    ``keys`` holds the most used keys; ``total_keys`` counts all (a lower bound when ``capped``).
    ``unavailable``: the store could not be read (the usage is then unknown, not zero).
    """

    name: str
    limit: float
    per: float
    keyed: bool
    declared_by: list[str]
    keys: list[BudgetKeyView]
    total_keys: int
    capped: bool
    throttled: float | None
    waited_seconds: float | None
    unavailable: bool = False

    @property
    def more_keys(self) -> int:
        return max(0, self.total_keys - len(self.keys))


@dataclass
class JobView(JobRecord):
    """A job as people may see it: its stored :class:`JobRecord`, every field of it, with the payload's
    secret fields redacted and the error scrubbed, plus what the read layer knows beside the record.

    It derives from the record rather than repeating its fields, so a field added to the record is
    here too, and in the admin API's ``Job`` schema, which is generated from these fields
    (``conveyor.api.admin``). It stays a type of its own because it is not what the broker stored:
    its payload is redacted. That is safe to pass around as a record: no broker call takes a record,
    only job ids, so a view is never written back.
    """

    #: The job type's attempt budget; None for a job type this process does not know.
    max_attempts: int | None = None
    #: Every attempt, oldest first (filled for one job, empty in lists).
    history: list[AttemptView] = field(default_factory=list)

    @property
    def run_seconds(self) -> float | None:
        """Run time of the last attempt, once it finished."""
        if self.started_at and self.finished_at and self.finished_at >= self.started_at:
            return self.finished_at - self.started_at
        return None

    @property
    def wait_seconds(self) -> float | None:
        """Time from first enqueue to the last start (retries' backoff included)."""
        if self.enqueued_at and self.started_at and self.started_at >= self.enqueued_at:
            return self.started_at - self.enqueued_at
        return None


@dataclass(frozen=True)
class Where:
    """Which jobs a bulk action touches: one queue and state, optionally one job type and a minimum age."""

    queue: str
    state: str
    job: str | None = None
    #: Only jobs that entered their state (finished, or were enqueued) at least this many seconds ago.
    older_than: float | None = None


#: The state each bulk action applies to; None: any state but active (a running job is never touched).
BULK_STATES: dict[str, str | None] = {
    "retry": "failed",
    "promote": "delayed",
    "delete": None,
    "purge": None,
    "cancel": None,
}
#: The states a job can be cancelled in (a bulk cancel's --where names one of them).
CANCELLABLE = ("waiting", "delayed", "active")

#: Most job ids one bulk request acts on: the dashboard sends a big action in chunks of this many.
BULK_CHUNK = 100


@dataclass(frozen=True)
class BulkOutcome:
    """What a bulk action touched: ``count`` jobs looked at, ``done`` acted on, ``skipped`` had moved on.

    A dry run acts on nothing and lists the ``ids`` the filter matches (what the action would touch).
    """

    action: str
    count: int
    done: int
    skipped: int
    ids: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class JobPage:
    """One page of a queue's jobs in one state, newest first. ``next_cursor`` is None on the last page."""

    queue: str
    state: str
    jobs: list[JobView]
    cursor: str | None
    next_cursor: str | None
    #: The job-name filter of this page, if any.
    job: str | None = None


class Inspector:
    """What the admin side may see and do, on the app's broker."""

    def __init__(self, app: "App") -> None:
        self.app = app
        self._settings_secrets = settings_secrets(*app.all_settings)

    @property
    def broker(self) -> ConveyorBroker:
        return self.app.broker

    # -- reading -----------------------------------------------------------------

    def config_warnings(self) -> list[str]:
        """What in the broker's configuration can lose jobs, one sentence each (a banner); [] when unknown."""
        try:
            return self.broker.config_warnings()
        except Exception:  # the broker is down: the queue counts say so already
            return []

    def history(self, queue: str | None, window: str = "1h", *, job: str | None = None) -> QueueHistory:
        """The charts' history of one queue (or, None, of every queue) over ``window`` ("1h" or "24h").

        The last point's depth is read live (workers sample it once a minute).
        """
        if queue is not None:
            self._check_queue(queue)
        check_window(window)
        names = [queue] if queue is not None else list(self.app.queues)
        try:
            depth_now: int | None = sum(self.broker.queue_counts(q).waiting for q in names)
        except Exception:  # the broker is down: the queue counts say so already
            depth_now = None
        return read_history(rollup_store(self.app), queue, window, job=job, depth_now=depth_now)

    def queues(self) -> list[QueueView]:
        """Every queue with its counts, in the queue table's order."""
        now = time.time()
        views = []
        for name, spec in self.app.queues.items():
            c = self.broker.queue_counts(name)
            views.append(
                QueueView(
                    name=name,
                    concurrency=spec.concurrency,
                    max_attempts=spec.max_attempts,
                    waiting=c.waiting,
                    delayed=c.delayed,
                    active=c.active,
                    running=c.running,
                    prefetched=c.prefetched,
                    failed=c.failed,
                    completed_total=c.completed_total,
                    failed_total=c.failed_total,
                    paused=c.paused,
                    oldest_waiting_seconds=max(0.0, now - c.oldest_waiting_at) if c.oldest_waiting_at else None,
                    cancelled=c.cancelled,
                    awaiting=c.awaiting,
                )
            )
        return views

    def groups(self, queue: str, *, limit: int = 50) -> GroupsView:
        """The queue's named groups with jobs waiting or held now, busiest first, ``limit`` of them."""
        self._check_queue(queue)
        found = self.broker.group_counts(queue, limit=max(1, min(limit, MAX_GROUPS)))
        weights = self.broker.effective_group_weights(queue)
        now = time.time()
        views = [
            GroupView(
                group=g.group,
                waiting=g.waiting,
                active=g.active,
                oldest_waiting_seconds=max(0.0, now - g.oldest_waiting_at) if g.oldest_waiting_at else None,
                weight=weights.get(g.group, 1),
            )
            for g in found.groups
        ]
        return GroupsView(queue, self.app.queues[queue].group_concurrency, views, found.total)

    def budgets(self, *, keys: int = 20) -> list[BudgetView]:
        """Every declared budget (by name; one declared twice with other limits is listed twice), with
        the ``keys`` most used keys in their window now, in name order."""
        declared: dict[tuple[str, float, float, bool], tuple[Budget, list[str]]] = {}
        owners = [(f"queue {q.name}", q.budgets) for q in self.app.queues.values()]
        owners += [(f"job {t.name}", t.budgets) for t in self.app.job_types.values()]
        for owner, budgets in owners:
            for b in budgets:
                declared.setdefault((b.name, b.limit, b.per, b.key is not None), (b, []))[1].append(owner)
        try:
            counted = budget_totals(self.app)
        except Exception as exc:  # a metrics file being rewritten: the counts are left out, not the page
            log_error(f"budget metrics not read: {type(exc).__name__}: {exc}", queue=None)
            counted = None
        views = []
        store = budget_store(self.app) if declared else None
        unavailable = False  # once a read failed, the rest are not tried (each would wait out the same outage)
        for (name, limit, per, keyed), (budget, owned) in sorted(declared.items()):
            assert store is not None
            usage = None
            if not unavailable:
                try:
                    usage = store.usage(name, per, keys)
                except Exception as exc:  # the store is down: the use is unknown (not 0), the page still shows
                    log_error(f"budget usage not read: {type(exc).__name__}: {exc}", queue=None)
                    unavailable = True
            throttled, waited = counted.get(name, (0.0, 0.0)) if counted is not None else (None, None)
            views.append(
                BudgetView(
                    name=name,
                    limit=limit,
                    per=per,
                    keyed=keyed,
                    declared_by=owned,
                    keys=[
                        BudgetKeyView(k.key[len(name) + 1 :] if k.key != name else None, k.used)
                        for k in (usage.keys if usage else [])
                    ],
                    total_keys=usage.total if usage else 0,
                    capped=usage.capped if usage else False,
                    throttled=throttled,
                    waited_seconds=waited,
                    unavailable=unavailable,
                )
            )
        return views

    def queue(self, name: str) -> QueueView:
        self._check_queue(name)
        return next(q for q in self.queues() if q.name == name)

    def jobs(
        self, queue: str, state: str, *, limit: int = 50, cursor: str | None = None, job: str | None = None
    ) -> JobPage:
        """A page of jobs. ``cursor`` is the ``next_cursor`` of the page before (opaque to callers).

        With ``job``, only jobs of that type: up to :data:`MAX_FILTER_SCAN`
        records are looked through per page, and the cursor goes on from
        where the scan stopped.
        """
        self._check_queue(queue)
        check_state(state)  # InvalidQuery, not echoing the state
        limit = max(1, min(limit, MAX_PAGE))
        offset = _offset(cursor)
        if job:
            return self._filtered(queue, state, job, limit, offset, cursor)
        # One more than asked: whether it comes back says if there is a next page.
        records = self.broker.list_jobs(queue, state, limit=limit + 1, offset=offset)
        more = len(records) > limit
        return JobPage(
            queue, state, [self._view(r) for r in records[:limit]], cursor, str(offset + limit) if more else None
        )

    def _filtered(self, queue: str, state: str, job: str, limit: int, offset: int, cursor: str | None) -> JobPage:
        found: list[JobRecord] = []
        scanned = 0
        position = offset
        while scanned < MAX_FILTER_SCAN:
            records = self.broker.list_jobs(queue, state, limit=_SCAN_STEP, offset=position)
            for i, record in enumerate(records):
                if record.job == job:
                    found.append(record)
                    if len(found) == limit:
                        # Resume after this record; more may follow if the batch went on.
                        rest = i + 1 < len(records) or len(records) == _SCAN_STEP
                        return JobPage(
                            queue,
                            state,
                            [self._view(r) for r in found],
                            cursor,
                            str(position + i + 1) if rest else None,
                            job,
                        )
            scanned += len(records)
            position += len(records)
            if len(records) < _SCAN_STEP:
                return JobPage(queue, state, [self._view(r) for r in found], cursor, None, job)
        return JobPage(queue, state, [self._view(r) for r in found], cursor, str(position), job)

    def job(self, job_id: str) -> JobView:
        """One job with its attempt history; :class:`JobNotFound` when there is none."""
        record = self.broker.get_job(job_id)
        if record is None:
            raise JobNotFound(f"no job {job_id!r}")
        view = self._view(record)
        return replace(view, history=self._history(record, view))

    def search(self, text: str) -> list[JobView]:
        """Jobs whose id is ``text``, or whose enqueue key is ``text`` (exact; newest first)."""
        text = text.strip()
        if not text or len(text) > 1000:
            return []
        ids = [text] + [i for i in fleet_store(self.app).find_by_key(text) if i != text]
        views = []
        for job_id in ids:
            record = self.broker.get_job(job_id)
            if record is not None:
                views.append(self._view(record))
        return views

    def workers(self) -> list[WorkerView]:
        """Every worker process the registry knows: live ones first, then the gone, newest first."""
        now, infos = fleet_store(self.app).workers()
        late, gone_after = late_after(self.app), recovery_after(self.app)
        views = []
        for w in infos:
            beat = w.heartbeat_at
            age = max(0.0, now - beat) if beat else None
            gone_at, reason = w.gone_at, w.gone_reason
            if gone_at is None and gone_after is not None and beat and age is not None and age > gone_after:
                # No live worker has swept it yet: its jobs are due for recovery since then.
                gone_at, reason = beat + gone_after, "recovered"
            state = "gone" if gone_at else ("late" if age is not None and age > late else "alive")
            entry = {f.name: getattr(w, f.name) for f in fields(WorkerInfo)}
            entry.update(gone_at=gone_at, gone_reason=reason, in_flight=[] if state == "gone" else w.in_flight)
            views.append(WorkerView(**entry, heartbeat_age=age, state=state))
        order = {"alive": 0, "late": 0, "gone": 1}
        views.sort(key=lambda v: (order[v.state], -(v.gone_at or 0), v.host, v.pid))
        return views

    def select(self, where: Where) -> list[JobView]:
        """Every job ``where`` matches, newest first: what a bulk action would touch, counted before it acts.

        A snapshot: the action then goes job by job and the broker re-checks each one's state, so a job
        that moved on meanwhile is skipped, never acted on in its new state.
        """
        self._check_queue(where.queue)
        check_state(where.state)
        cutoff = time.time() - where.older_than if where.older_than is not None else None
        found: list[JobView] = []
        seen: set[str] = set()  # a job that moved while we paged may show up twice
        offset = 0
        while True:
            records = self.broker.list_jobs(where.queue, where.state, limit=MAX_PAGE, offset=offset)
            for record in records:
                if record.id in seen or (where.job and record.job != where.job):
                    continue
                entered = record.finished_at or record.enqueued_at
                if cutoff is not None and (entered is None or entered > cutoff):
                    continue
                seen.add(record.id)
                found.append(self._view(record))
            if len(records) < MAX_PAGE:
                return found
            offset += len(records)

    def job_counts(self, queue: str, job: str) -> dict[str, tuple[int, bool]]:
        """Per state, how many retained jobs of type ``job`` the queue holds, and whether the count stopped
        at :data:`MAX_FILTER_SCAN` records looked through (then it is a lower bound)."""
        self._check_queue(queue)
        counts: dict[str, tuple[int, bool]] = {}
        for state in JOB_STATES:
            found = position = 0
            while position < MAX_FILTER_SCAN:
                records = self.broker.list_jobs(queue, state, limit=_SCAN_STEP, offset=position)
                found += sum(1 for r in records if r.job == job)
                position += len(records)
                if len(records) < _SCAN_STEP:
                    break
            counts[state] = (found, position >= MAX_FILTER_SCAN)
        return counts

    # -- acting ------------------------------------------------------------------

    def bulk(self, action: str, where: Where, *, dry_run: bool = False, ids: list[str] | None = None) -> BulkOutcome:
        """``action`` (retry, delete, promote, purge: delete by filter) on the jobs ``where`` matches.

        A dry run only counts them (and lists their ids). With ``ids`` (a chunk of a dry run's), only
        those: each is re-read and acted on only while it still matches ``where``'s queue, state and
        job type (and age), so a job that moved on since the count is skipped, never acted on in its new state.
        """
        self._check_queue(where.queue)
        check_state(where.state)
        if action not in BULK_STATES:
            raise InvalidQuery(f"action: one of {', '.join(BULK_STATES)}")
        need = BULK_STATES[action]
        if action == "cancel":
            if where.state not in CANCELLABLE:
                raise InvalidQuery(f"cancel applies to {', '.join(CANCELLABLE)} jobs only")
        elif (need is not None and where.state != need) or where.state == "active":
            raise InvalidQuery(f"{action} applies to {need or 'waiting, delayed, completed or failed'} jobs only")
        if ids is None:
            matched = [v.id for v in self.select(where)]
            if dry_run:
                return BulkOutcome(action, len(matched), 0, 0, matched)
            ids = matched
        elif dry_run:
            return BulkOutcome(action, len(ids), 0, 0, list(ids))
        acts = {
            "retry": self.retry,
            "promote": self.promote,
            "delete": self.delete,
            "purge": self.delete,
            "cancel": self.cancel,
        }
        act = acts[action]
        cutoff = time.time() - where.older_than if where.older_than is not None else None
        done = skipped = 0
        for job_id in dict.fromkeys(ids):
            record = self.broker.get_job(job_id)
            entered = record and (record.finished_at or record.enqueued_at)
            if (
                record is None
                or (record.queue, record.state) != (where.queue, where.state)
                or (where.job is not None and record.job != where.job)
                or (cutoff is not None and (not entered or entered > cutoff))
            ):
                skipped += 1
                continue
            try:
                act(job_id)
                done += 1
            except (JobNotFound, JobStateConflict):  # moved on between the read and the act
                skipped += 1
        log_event(f"admin_bulk_{action}", queue=where.queue, job=where.job, job_id=None, attempt=None, count=done)
        return BulkOutcome(action, done + skipped, done, skipped)

    def retry(self, job_id: str) -> JobView:
        """Put a failed job back in its queue with a fresh attempt budget."""
        before = self.job(job_id)
        if before.state != "failed":
            raise JobStateConflict(f"job {job_id} is {before.state}: only failed jobs can be retried")
        if not self.broker.retry_job(job_id):
            raise JobStateConflict(f"job {job_id} changed state before it could be retried")
        self._audit("admin_retry", before)
        return self.job(job_id)

    def retry_failed(self, queue: str) -> int:
        """Retry every failed job of ``queue``; returns how many."""
        self._check_queue(queue)
        count = self.broker.retry_failed(queue)
        log_event("admin_retry_failed", queue=queue, job=None, job_id=None, attempt=None, count=count)
        return count

    def delete(self, job_id: str) -> None:
        """Remove a job that is not running."""
        before = self.job(job_id)
        if before.state == "active":
            raise JobStateConflict(f"job {job_id} is running: it can be deleted once it has finished")
        if not self.broker.delete_job(job_id):
            raise JobStateConflict(f"job {job_id} changed state before it could be deleted")
        self._audit("admin_delete", before)

    def promote(self, job_id: str) -> JobView:
        """Run a delayed job now: it becomes waiting at once (its delay is cut short, it runs once)."""
        before = self.job(job_id)
        if before.state != "delayed":
            raise JobStateConflict(f"job {job_id} is {before.state}: only delayed jobs can be promoted")
        if not self.broker.promote_job(job_id):
            raise JobStateConflict(f"job {job_id} changed state before it could be promoted")
        self._audit("admin_promote", before)
        return self.job(job_id)

    def cancel(self, job_id: str) -> JobView:
        """Cancel a job: a waiting or delayed one ends ``cancelled`` now and never starts; a running one is
        asked to stop (``ctx.cancelled``, interrupted after the grace) and ends ``cancelled``.

        JobNotFound for an unknown id; JobStateConflict for a job that had already ended.
        """
        before = self.job(job_id)
        outcome = self.broker.cancel_job(job_id)
        if outcome is None:
            raise JobNotFound(f"no job {job_id}")
        if outcome == CancelOutcome.FINISHED:
            raise JobStateConflict(f"job {job_id} has ended ({before.state}): there is nothing to cancel")
        self._audit("admin_cancel", before)
        return self.job(job_id)

    def pause(self, queue: str) -> QueueView:
        self._check_queue(queue)
        self.broker.pause_queue(queue)
        log_event("admin_pause", queue=queue, job=None, job_id=None, attempt=None)
        return self.queue(queue)

    def set_group_weight(self, queue: str, group: str, weight: int) -> GroupsView:
        """Store a named group's weight (``app.jobs.set_group_weight``); returns the queue's groups view."""
        self.app.jobs.set_group_weight(queue, group, weight)
        # The group's name is a tenant's: the audit line carries the queue and the weight only.
        log_event("admin_group_weight", queue=queue, job=None, job_id=None, attempt=None, weight=weight)
        return self.groups(queue)

    def resume(self, queue: str) -> QueueView:
        self._check_queue(queue)
        self.broker.resume_queue(queue)
        log_event("admin_resume", queue=queue, job=None, job_id=None, attempt=None)
        return self.queue(queue)

    # -- helpers -----------------------------------------------------------------

    def _check_queue(self, name: str) -> None:
        if name not in self.app.queues:
            known = ", ".join(self.app.queues)
            raise UnknownQueue(f"no queue {name!r}; queues: {known}", known)

    def _view(self, record: JobRecord) -> JobView:
        job_type = self.app.job_types.get(record.job)
        model = job_type.payload if job_type else None
        secrets = [*self._settings_secrets, *payload_secrets(record.payload, model)]
        max_attempts = self.app.max_attempts(job_type) if job_type else None
        stored = {f.name: getattr(record, f.name) for f in fields(JobRecord)}
        stored.update(payload=redact_payload(record.payload, model), error=scrub(record.error, secrets))
        return JobView(**stored, max_attempts=max_attempts)

    def _history(self, record: JobRecord, view: JobView) -> list[AttemptView]:
        """The job's attempts, scrubbed; an attempt without an end is running, or lost with its worker."""
        attempts: list[AttemptInfo] = fleet_store(self.app).attempts(record.id)
        if not attempts:
            return []
        states = {w.id: w.state for w in self.workers()} if any(a.ended_at is None for a in attempts) else {}
        secrets = self._secrets(record)
        out = []
        for i, a in enumerate(attempts):
            outcome = a.outcome
            if outcome is None:
                last = i == len(attempts) - 1
                alive = states.get(a.worker) in ("alive", "late")
                outcome = "running" if last and alive and view.state == "active" else "lost"
            entry = {f.name: getattr(a, f.name) for f in fields(AttemptInfo)}
            entry.update(outcome=outcome, error=scrub(a.error, secrets), traceback=scrub(a.traceback, secrets))
            out.append(AttemptView(**entry))
        return out

    def _secrets(self, record: JobRecord) -> list[str]:
        job_type = self.app.job_types.get(record.job)
        return [*self._settings_secrets, *payload_secrets(record.payload, job_type.payload if job_type else None)]

    def _audit(self, event: str, job: JobView) -> None:
        log_event(event, queue=job.queue, job=job.job, job_id=job.id, attempt=job.attempts, state=job.state)


#: Largest page offset a cursor may hold: far past any real list, well inside a BIGINT.
MAX_OFFSET = 10**9


def _offset(cursor: str | None) -> int:
    # The message never quotes the cursor: whatever a client sent is not echoed back.
    if not cursor:
        return 0
    if not (cursor.isascii() and cursor.isdigit() and len(cursor) <= 10) or int(cursor) > MAX_OFFSET:
        raise InvalidQuery("cursor: not a cursor this API gave out (pass nextCursor as it came)")
    return int(cursor)
