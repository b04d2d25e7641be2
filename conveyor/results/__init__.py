"""Job results: a job type with ``store_result=True`` keeps its processor's JSON return value.

The value is written by the worker before the job is acked (a store that fails fails the
attempt, which is retried), beside the broker's own data: a Redis stream per job, a Postgres
table, or memory for the inline broker. The first success stored is the job's result: a
repeat run (a delivery given up on that finished anyway) cannot change a value a reader saw.
A reader waits on the store's wake-up (Redis ``XREAD BLOCK``, Postgres ``LISTEN``, a
condition in memory), armed before it looks, so a result written in between is not missed.

Whether a job failed for good is the broker's record, not this store's: the final-failure
path writes a marker only to wake readers, and a reader whose wait ends reads the job's
state before it gives up, so a marker that was never written delays a :class:`JobFailed`
until the timeout, never loses it. The marker is written just before the broker records
the failure, so a reader that finds it re-reads the record on a short backoff.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from conveyor.appcache import per_app
from conveyor.errors import JobFailed, JobNotFound, PermanentError, ResultNotStored, ResultTimeout
from conveyor.results.base import Entry, ResultStore, Watch

__all__ = ["Entry", "ResultStore", "Watch", "mark_failed", "results_store", "store_result", "wait_result"]

if TYPE_CHECKING:
    from conveyor.app import App
    from conveyor.blueprints import JobType


#: A failure marker can be read before the broker's record says failed (the final-failure hook
#: runs first): the record is looked at again after this long, doubling up to the maximum.
MARKER_RECHECK = 0.05
MARKER_RECHECK_MAX = 1.0


@per_app
def results_store(app: App) -> ResultStore:
    """The App's result store, beside its broker's data (the backend's store)."""
    store = app.capabilities.store
    if store == "redis":
        from conveyor.redis_client import client
        from conveyor.results.redis import RedisResults

        assert app.settings.redis_url  # the redis backend is chosen by it
        return RedisResults(client(app.settings.redis_url, app.settings), app.settings)
    if store == "postgres":
        from conveyor.results.postgres import PostgresResults

        return PostgresResults(app)
    from conveyor.results.memory import MemoryResults

    return MemoryResults()


def encode(job_type: JobType, value: Any, limit: int) -> str:
    """``value`` as JSON text; not JSON, or larger than ``limit`` bytes, is a :class:`PermanentError`.

    A pydantic model is stored as its JSON form. Not retried: the same run returns the same kind of value.
    """
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json")
    try:
        text = json.dumps(value, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError):
        raise PermanentError(
            f"job {job_type.name!r} returned a {type(value).__name__}, not JSON: store_result keeps JSON values only"
        ) from None
    if len(text.encode()) > limit:
        raise PermanentError(
            f"job {job_type.name!r} returned {len(text.encode())} bytes of JSON; "
            f"the limit is {limit} (CONVEYOR_MAX_PAYLOAD_BYTES)"
        )
    return text


def store_result(app: App, job_type: JobType, job_id: str, value: Any) -> None:
    """Keep ``value`` as ``job_id``'s result (the worker, before the ack); errors fail the attempt."""
    text = encode(job_type, value, app.settings.max_payload_bytes)
    results_store(app).put(job_id, job_type.name, Entry(True, text), app.settings.result_ttl)


def mark_failed(app: App, job_type: JobType, job_id: str) -> None:
    """Wake the job's readers: it failed for good (they read why from the broker's record)."""
    results_store(app).put(job_id, job_type.name, Entry(False), app.settings.result_ttl)


def wait_result(app: App, job_id: str, timeout: float) -> Any:
    """``job_id``'s stored result, waiting up to ``timeout`` seconds for it.

    Raises :class:`JobFailed` (with the job's last error, scrubbed of secrets) once the job
    failed for good, :class:`ResultTimeout` when neither happened in time,
    :class:`ResultNotStored` for a job type without ``store_result``, and
    :class:`JobNotFound` for a job that neither the broker nor the store knows.
    """
    from conveyor.inspector import Inspector

    deadline = time.monotonic() + max(0.0, timeout)
    with results_store(app).watch(job_id) as watch:
        entry = watch.read()
        if entry is None or not entry.ok:
            record = app.broker.get_job(job_id)
            if record is None:
                raise JobNotFound(f"no job {job_id!r}")
            job_type = app.job_types.get(record.job)
            if job_type is None or not job_type.store_result:
                raise ResultNotStored(f"job {record.job!r} does not store its result (store_result=True does)")
        recheck = MARKER_RECHECK
        while True:
            if entry is not None and entry.ok:
                return json.loads(entry.value or "null")
            remaining = deadline - time.monotonic()
            marked = entry is not None  # the job failed for good, or did before an operator retried it
            if marked or remaining <= 0:
                view = Inspector(app).job(job_id)
                if view.state in ("failed", "cancelled"):  # cancelled: it will never have a result
                    raise JobFailed(view.job, job_id, view.error or view.state)
                if remaining <= 0:
                    raise ResultTimeout(
                        f"job {job_id!r} ({view.job}) has no result after {timeout:g} s: it is {view.state}"
                    )
            if marked:
                # The hook that writes the marker runs just before the broker records the failure:
                # look again soon, as well as on the next write.
                watch.wait(min(remaining, recheck))
                recheck = min(MARKER_RECHECK_MAX, recheck * 2)
            else:
                watch.wait(remaining)
            entry = watch.read()
