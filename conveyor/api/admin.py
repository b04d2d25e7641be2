"""``/api/admin``: queue metrics, jobs, and the operator's actions, as JSON.

Every route needs the admin token (see :mod:`conveyor.api.auth`). Field
names are camelCase, as dashboards built on other queues expect
(``completedTotal``). Routes only render what the read layer
(:mod:`conveyor.inspector`) returns.
"""

from __future__ import annotations

from dataclasses import fields
from typing import TYPE_CHECKING, Annotated, Any, Literal, get_type_hints

from fastapi import APIRouter, Depends, Query
from pydantic import BaseModel, ConfigDict, Field, create_model
from pydantic.alias_generators import to_camel

from conveyor.api.auth import require_admin
from conveyor.api.deps import CursorQuery, NamePath, NameQuery, inspector
from conveyor.api.errors import UNAVAILABLE_RESPONSES
from conveyor.brokers.base import MAX_GROUP_WEIGHT, MAX_GROUPS
from conveyor.inspector import BULK_CHUNK, MAX_PAGE, AttemptView, Inspector, JobView, Where, WorkerView

router = APIRouter(
    prefix="/api/admin",
    tags=["admin"],
    dependencies=[Depends(require_admin)],
    responses={
        401: {"description": "no valid admin token"},
        403: {"description": "closed: CONVEYOR_ADMIN_TOKEN is not set"},
        **UNAVAILABLE_RESPONSES,
    },
)

State = Literal[
    "waiting",
    "delayed",
    "awaiting",  # parked until a signal of its event (ctx.wait_for)
    "active",
    "completed",
    "failed",
    "cancelled",
]


class _Out(BaseModel):
    # Read straight from the read layer's dataclasses (from_attributes), written camelCase.
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, from_attributes=True)


class QueueMetrics(_Out):
    """One queue's numbers. ``active``: jobs claimed by a worker, ``running`` (started) plus ``prefetched``
    (fetched ahead, not started). ``failed``: jobs that failed for good. ``completedTotal``/``failedTotal``
    count since the broker's data began."""

    active: int
    running: int
    prefetched: int
    waiting: int
    delayed: int
    failed: int
    completed_total: int
    failed_total: int
    paused: bool
    #: Jobs parked until a signal of their event or its timeout (``ctx.wait_for``).
    awaiting: int = 0


def schema_of(
    view: type,
    doc: str,
    *,
    types: dict[str, Any] | None = None,
    computed: tuple[str, ...] = (),
    exclude: tuple[str, ...] = (),
) -> Any:
    """The wire schema of a read-layer dataclass, generated from its fields, in their order.

    One row type per concept (issue 19): the API does not restate a job's or a worker's fields, so a
    field added to ``JobRecord`` (or ``WorkerView``) is in the API's answers and its OpenAPI schema
    with nothing else to edit. ``types`` narrows a field for the wire (a state's ``Literal``, the
    nested schema of a list); ``computed`` adds the view's read-only properties; ``exclude`` leaves out
    a store's name for a number a computed property already answers under the API's name. Every field
    is required: an answer always carries all of them.
    """
    hints = get_type_hints(view)
    spec: dict[str, Any] = {
        f.name: ((types or {}).get(f.name, hints[f.name]), ...) for f in fields(view) if f.name not in exclude
    }
    spec.update({name: (get_type_hints(getattr(view, name).fget)["return"], ...) for name in computed})
    return create_model(view.__name__.removesuffix("View"), __base__=_Out, __doc__=doc, __module__=__name__, **spec)


if TYPE_CHECKING:
    # What mypy sees; at run time each is generated from the read layer's dataclass (below).
    class Attempt(_Out): ...

    class Job(_Out): ...

    class Worker(_Out): ...

else:
    Attempt = schema_of(
        AttemptView,
        """One attempt: when it started, on which worker (``host:pid:tag``), how it ended.

    ``outcome``: completed, failed, deferred (RetryLater), skipped, running,
    or lost (its worker died during it). Error and traceback are scrubbed of
    secret values.
    """,
        types={"outcome": str},
        computed=("run_seconds",),
    )
    Job = schema_of(
        JobView,
        "A job: its payload's secret fields are redacted, its error scrubbed of secret values. Times are UNIX "
        "seconds. ``history``: every attempt, oldest first; empty in lists (ask for the one job). ``event``: "
        "what an ``awaiting`` job waits for (``ctx.wait_for``), else null. ``priority``: 0-9, higher runs first "
        "(with aging: CONVEYOR_PRIORITY_AGING_SECONDS). ``group``: its fair-share group; null: the default group.",
        types={"state": State, "history": list[Attempt]},
        computed=("wait_seconds", "run_seconds"),
    )
    Worker = schema_of(
        WorkerView,
        """One worker process. ``state``: alive, late (heartbeat overdue) or gone (stopped, or recovered: it
    stopped heartbeating and its jobs went back to their queues, at ``goneAt``). Ages use the broker
    server's clock; ``attemptsCompleted``/``attemptsFailed`` count its attempts since the process started
    (a failed attempt may have been retried: jobs that failed for good are a queue's ``failed``).""",
        types={"state": Literal["alive", "late", "gone"]},
        computed=("attempts_completed", "attempts_failed"),
        # The registry's done/failed, under the names the API has always given them.
        exclude=("done", "failed"),
    )


class JobList(_Out):
    """A page of jobs, newest first; pass ``nextCursor`` as ``cursor`` for the next page (null: last page)."""

    queue: str
    state: State
    jobs: list[Job]
    next_cursor: str | None


class SearchResult(_Out):
    jobs: list[Job]


class Retried(_Out):
    retried: int


class Deleted(_Out):
    deleted: str


class BulkRequest(BaseModel):
    """Which jobs a bulk action touches: a queue and a state, optionally a job type and a minimum age.

    ``dryRun`` only counts them and lists their ids; with ``ids`` (at most a chunk of them), the action
    touches only those, each while it still matches the filter.
    """

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")

    queue: str = Field(min_length=1, max_length=200, pattern=r"^[^\x00-\x1f\x7f]+$")
    state: State
    job: str | None = Field(None, max_length=200)
    older_than: float | None = Field(None, ge=0, le=10**9, description="seconds since the job entered its state")
    dry_run: bool = False
    ids: list[Annotated[str, Field(min_length=1, max_length=200)]] | None = Field(None, max_length=BULK_CHUNK)


class BulkResult(_Out):
    """``count`` jobs matched (dry run) or looked at; ``done`` acted on; ``skipped`` had moved on. ``ids``:
    what a dry run matched, to send back in chunks."""

    action: str
    count: int
    done: int
    skipped: int
    ids: list[str]


@router.get("/queue-metrics", response_model=dict[str, QueueMetrics], summary="Counts of every queue")
def queue_metrics(inspect: Inspector = Depends(inspector)) -> dict[str, QueueMetrics]:
    return {q.name: QueueMetrics.model_validate(q) for q in inspect.queues()}


@router.get(
    "/jobs",
    response_model=JobList,
    summary="Jobs of a queue in a state, newest first",
    responses={404: {"description": "no such queue (the answer lists the queues)"}},
)
def list_jobs(
    queue: NameQuery,
    state: State,
    limit: int = Query(50, ge=1, le=MAX_PAGE),
    cursor: CursorQuery = None,
    job: str | None = Query(None, max_length=200, description="only jobs of this type"),
    inspect: Inspector = Depends(inspector),
) -> JobList:
    return JobList.model_validate(inspect.jobs(queue, state, limit=limit, cursor=cursor, job=job))


@router.get("/workers", response_model=list[Worker], summary="Every worker process, live ones first")
def workers(inspect: Inspector = Depends(inspector)) -> list[Worker]:
    return [Worker.model_validate(w) for w in inspect.workers()]


@router.get("/search", response_model=SearchResult, summary="Jobs by id or by enqueue key (exact)")
def search(q: str = Query(..., min_length=1, max_length=1000), inspect: Inspector = Depends(inspector)) -> SearchResult:
    return SearchResult(jobs=[Job.model_validate(j) for j in inspect.search(q)])


@router.get("/jobs/{job_id}", response_model=Job, summary="One job")
def get_job(job_id: NamePath, inspect: Inspector = Depends(inspector)) -> Job:
    return Job.model_validate(inspect.job(job_id))


@router.post("/jobs/{job_id}/retry", response_model=Job, summary="Retry a failed job (409 if it has not failed)")
def retry_job(job_id: NamePath, inspect: Inspector = Depends(inspector)) -> Job:
    return Job.model_validate(inspect.retry(job_id))


@router.post(
    "/jobs/{job_id}/promote",
    response_model=Job,
    summary="Run a delayed job now (409 if it is not delayed)",
    responses={409: {"description": "the job is not delayed (waiting, running or finished)"}},
)
def promote_job(job_id: NamePath, inspect: Inspector = Depends(inspector)) -> Job:
    return Job.model_validate(inspect.promote(job_id))


@router.post(
    "/bulk/{action}",
    response_model=BulkResult,
    summary="Retry, delete, promote, purge or cancel the jobs a filter matches (dryRun: count them first)",
    responses={404: {"description": "no such queue (the answer lists the queues)"}},
)
def bulk(
    action: Literal["retry", "delete", "promote", "purge", "cancel"],
    body: BulkRequest,
    inspect: Inspector = Depends(inspector),
) -> BulkResult:
    where = Where(queue=body.queue, state=body.state, job=body.job or None, older_than=body.older_than)
    return BulkResult.model_validate(inspect.bulk(action, where, dry_run=body.dry_run, ids=body.ids))


@router.post(
    "/jobs/{job_id}/cancel",
    response_model=Job,
    summary="Cancel a job: a waiting or delayed one never starts, a running one is stopped (409 if it has ended)",
)
def cancel_job(job_id: NamePath, inspect: Inspector = Depends(inspector)) -> Job:
    return Job.model_validate(inspect.cancel(job_id))


@router.delete("/jobs/{job_id}", response_model=Deleted, summary="Delete a job that is not running (409 if it is)")
def delete_job(job_id: NamePath, inspect: Inspector = Depends(inspector)) -> Deleted:
    inspect.delete(job_id)
    return Deleted(deleted=job_id)


@router.post("/queues/{queue}/retry-failed", response_model=Retried, summary="Retry every failed job of a queue")
def retry_failed(queue: NamePath, inspect: Inspector = Depends(inspector)) -> Retried:
    return Retried(retried=inspect.retry_failed(queue))


@router.post("/queues/{queue}/pause", response_model=QueueMetrics, summary="Workers stop taking jobs from the queue")
def pause(queue: NamePath, inspect: Inspector = Depends(inspector)) -> QueueMetrics:
    return QueueMetrics.model_validate(inspect.pause(queue))


@router.post("/queues/{queue}/resume", response_model=QueueMetrics, summary="Workers take jobs from the queue again")
def resume(queue: NamePath, inspect: Inspector = Depends(inspector)) -> QueueMetrics:
    return QueueMetrics.model_validate(inspect.resume(queue))


class HistoryPoint(_Out):
    """One point of a queue's chart history: counts in ``[at, at + step)``; times in seconds (null: none)."""

    at: int
    enqueued: int
    completed: int
    failed: int
    retried: int
    wait_p50: float | None
    wait_p95: float | None
    run_p50: float | None
    run_p95: float | None
    depth: int | None


class History(_Out):
    """A queue's per-minute rollup over the window, oldest point first. ``failed``: jobs failed for good;
    ``retried``: retries scheduled; percentiles from log-scale buckets (within ~19 %). Times: the broker
    server's clock."""

    queue: str
    job: str | None
    window: Literal["1h", "24h"]
    step: int
    now: int
    points: list[HistoryPoint]


@router.get("/queues/{queue}/history", response_model=History, summary="A queue's chart history (1h or 24h)")
def queue_history(
    queue: NamePath,
    window: Literal["1h", "24h"] = "1h",
    job: str | None = Query(None, max_length=200),
    inspect: Inspector = Depends(inspector),
) -> History:
    return History.model_validate(inspect.history(queue, window, job=job))


class Group(_Out):
    """One named group of a queue (``enqueue(..., group=...)``). ``active``: its jobs a worker holds
    (running or prefetched), what the queue's ``groupConcurrency`` caps; ``oldestWaitingSeconds``: the
    wait of its oldest waiting job (null: none waits)."""

    group: str
    waiting: int
    active: int
    oldest_waiting_seconds: float | None
    #: Its turns per round of the queue's groups (1 unless set: PUT .../groups/{group}/weight, group_weights).
    weight: int = 1


class QueueGroups(_Out):
    """A queue's named groups with jobs waiting or held now, most waiting first; ``total`` counts them all,
    ``more`` those not listed. ``groupConcurrency``: the cap per group (null: none). Jobs without a group
    (the default group, never capped) are the rest of the queue's counts."""

    queue: str
    group_concurrency: int | None = Field(validation_alias="cap")
    groups: list[Group]
    total: int
    more: int


@router.get(
    "/queues/{queue}/groups",
    response_model=QueueGroups,
    summary="A queue's fair-share groups: waiting and held jobs per group, busiest first",
    responses={404: {"description": "no such queue (the answer lists the queues)"}},
)
def queue_groups(
    queue: NamePath,
    limit: int = Query(50, ge=1, le=MAX_GROUPS, description="most groups listed"),
    inspect: Inspector = Depends(inspector),
) -> QueueGroups:
    return QueueGroups.model_validate(inspect.groups(queue, limit=limit))


class GroupWeight(BaseModel):
    """A named group's weight: its turns per round of the queue's groups (1, every group's default, to 1000)."""

    model_config = ConfigDict(extra="forbid")

    weight: int = Field(ge=1, le=MAX_GROUP_WEIGHT, strict=True)


@router.put(
    "/queues/{queue}/groups/{group:path}/weight",
    response_model=QueueGroups,
    summary="Set a fair-share group's weight: with backlogs, weights 3, 2 and 1 get 3, 2 and 1 turns per round",
    responses={
        404: {"description": "no such queue (the answer lists the queues)"},
        422: {"description": "not a weight of 1-1000, not a group name, or a weight the queue's settings give"},
    },
)
def set_group_weight(
    queue: NamePath, group: NamePath, body: GroupWeight, inspect: Inspector = Depends(inspector)
) -> QueueGroups:
    """The group is the rest of the path up to ``/weight``, so a name with a slash (``org/42``) is one too."""
    return QueueGroups.model_validate(inspect.set_group_weight(queue, group, body.weight))


class BudgetKey(_Out):
    """One key of a budget with weight in its window now; ``key`` null: the budget has no key (one window)."""

    key: str | None
    used: float


class BudgetStatus(_Out):
    """A declared budget: at most ``limit`` per ``per`` seconds per key. ``keys``: the most used keys now
    (``totalKeys`` counts all, a lower bound when ``capped``). ``throttled``/``waitedSeconds``: starts it
    refused and the seconds it told them to wait, as ``/metrics`` of this process counts them (every worker
    process sharing its PROMETHEUS_MULTIPROC_DIR); null when it counts none. ``unavailable``: the store
    could not be read (the use is unknown, not 0)."""

    name: str
    limit: float
    per: float
    keyed: bool
    declared_by: list[str]
    keys: list[BudgetKey]
    total_keys: int
    capped: bool
    throttled: float | None
    waited_seconds: float | None
    unavailable: bool


@router.get("/budgets", response_model=list[BudgetStatus], summary="Every declared budget and its use now")
def budgets(
    keys: int = Query(20, ge=1, le=500, description="most keys listed per budget"),
    inspect: Inspector = Depends(inspector),
) -> list[BudgetStatus]:
    return [BudgetStatus.model_validate(b) for b in inspect.budgets(keys=keys)]
