"""The once-guard's records: which (job, step) already applied its effect (``ctx.once``).

A step is recorded insert-first in the caller's own transaction, next to
the step's effect: the two commit together or not at all, and the primary
key (job id, step) admits one row. So whichever delivery of a job commits
first applies the step, and every later one (a retry, a recovered job's
next delivery, a paused worker that resumes) finds the row and skips it.
A delivery that reaches the row while another holds it uncommitted waits
for that transaction, then skips (it committed) or records it (it rolled back).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from conveyor.errors import EffectError, NotInTransaction
from conveyor.queries import load_queries

if TYPE_CHECKING:
    from psycopg import Connection

QUERIES = load_queries(Path(__file__).with_name("steps.sql"))

#: The longest step name (the table's CHECK says the same).
MAX_STEP = 200

#: Rows per prune statement, and statements per pass.
PRUNE_BATCH = 1000
PRUNE_BATCHES = 10


def record(conn: Connection[Any], job_id: str, step: str, delivery: int | None) -> bool:
    """Record ``step`` of ``job_id`` in ``conn``'s open transaction; True when this call is the first."""
    if not isinstance(step, str) or not 1 <= len(step) <= MAX_STEP:
        raise EffectError(f"a step is a name of 1 to {MAX_STEP} characters")
    # psycopg here, not at import: a worker whose jobs never touch Postgres does not load it (docs/bench.md).
    from psycopg.pq import TransactionStatus

    from conveyor.db import wrap_errors

    if conn.info.transaction_status != TransactionStatus.INTRANS:
        raise NotInTransaction(
            "ctx.once needs an open transaction on the connection (with conn.transaction(): ...), "
            "the one the step's effect is written in"
        )
    with wrap_errors("recording a job's step"):
        row = conn.execute(QUERIES["once"], {"job_id": job_id, "step": step, "delivery": delivery}).fetchone()
    return row is not None


def prune(conn: Connection[Any], retention: float) -> int:
    """Delete steps recorded more than ``retention`` seconds ago (server clock); returns how many."""
    from conveyor.db import wrap_errors

    total = 0
    with wrap_errors("pruning job steps"):
        for _ in range(PRUNE_BATCHES):
            count = conn.execute(QUERIES["prune"], {"retention": retention, "limit": PRUNE_BATCH}).rowcount
            total += count
            if count < PRUNE_BATCH:
                break
    return total
