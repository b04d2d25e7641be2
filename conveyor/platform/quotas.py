"""Per-user quotas of the producer API: active runs, open SSE streams, stream data kept.

Each is counted in Postgres, in the transaction that would take the place,
under a per-user advisory lock, so two requests cannot both take the last
one and nothing is kept in an API process's memory: a process that dies
leaks nothing. Active runs are the user's ``runs`` rows still queued or
running (a run that fails for good ends ``failed``, freeing its place);
stream data kept is the streamed text of the user's runs that ended within
``CONVEYOR_STREAM_RETENTION`` (a run in progress adds at most its own reply
past the cap, and there are at most ``CONVEYOR_USER_MAX_ACTIVE_RUNS`` of
those); an open stream holds a lease that its reader renews and a dead
process's lets run out (``CONVEYOR_USER_STREAM_LEASE``).

Past a limit: :class:`~conveyor.platform.errors.QuotaExceeded`, 429 naming the limit
and its setting.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from conveyor.platform.errors import QuotaExceeded
from conveyor.queries import load_queries

if TYPE_CHECKING:
    from psycopg import Connection

    from conveyor.platform.settings import PlatformSettings

QUERIES = load_queries(Path(__file__).with_name("quotas.sql"))


@dataclass(frozen=True)
class RunQuota:
    """What a user's new run must fit in (from the settings: :meth:`of`)."""

    max_active_runs: int
    max_stream_bytes: int
    retention: float

    @classmethod
    def of(cls, settings: PlatformSettings) -> RunQuota:
        return cls(settings.user_max_active_runs, settings.user_max_stream_bytes, settings.stream_retention)


def check_new_run(conn: Connection[Any], user_id: str, quota: RunQuota) -> None:
    """Inside the transaction that creates the run: :class:`QuotaExceeded` when the user has no room for it.

    The lock holds until that transaction ends, so the count stays true until the run's row is in.
    """
    conn.execute(QUERIES["lock_user"], {"purpose": "runs", "user_id": user_id})
    row = conn.execute(QUERIES["run_usage"], {"user_id": user_id, "retention": quota.retention}).fetchone()
    assert row is not None  # scalar subqueries: one row
    active, kept = int(row[0]), int(row[1])
    if active >= quota.max_active_runs:
        raise QuotaExceeded(
            f"too many runs at once: at most {quota.max_active_runs} queued or running "
            "(CONVEYOR_USER_MAX_ACTIVE_RUNS); try again when one ends"
        )
    if kept >= quota.max_stream_bytes:
        raise QuotaExceeded(
            f"too much stream data kept: at most {quota.max_stream_bytes} bytes of your runs' streams "
            "(CONVEYOR_USER_MAX_STREAM_BYTES); try again when older streams expire"
        )


def open_stream(conn: Connection[Any], user_id: str, run_id: str, *, limit: int, lease: float) -> str:
    """A lease on one of the user's ``limit`` open streams (its id); :class:`QuotaExceeded` when all are held."""
    with conn.transaction():
        conn.execute(QUERIES["lock_user"], {"purpose": "streams", "user_id": user_id})
        conn.execute(QUERIES["prune_stream_leases"], {"user_id": user_id})
        row = conn.execute(QUERIES["count_stream_leases"], {"user_id": user_id}).fetchone()
        assert row is not None  # an aggregate has one row
        if int(row[0]) >= limit:
            raise QuotaExceeded(
                f"too many open streams: at most {limit} at once (CONVEYOR_USER_MAX_STREAMS); close one first"
            )
        lease_id = f"sl_{uuid.uuid4().hex}"
        conn.execute(
            QUERIES["open_stream_lease"], {"id": lease_id, "user_id": user_id, "run_id": run_id, "lease": lease}
        )
        return lease_id


def renew_stream(conn: Connection[Any], lease_id: str, *, lease: float) -> bool:
    """Keep the stream's place ``lease`` seconds more; False when it had run out already (and was taken back)."""
    return conn.execute(QUERIES["renew_stream_lease"], {"id": lease_id, "lease": lease}).fetchone() is not None


def close_stream(conn: Connection[Any], lease_id: str) -> None:
    """Give the stream's place back."""
    conn.execute(QUERIES["close_stream_lease"], {"id": lease_id})
