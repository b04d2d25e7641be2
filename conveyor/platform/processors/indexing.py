"""resource.index: chunk a resource's text and index it in Postgres full-text search.

Indexing is one transaction holding the resource's row lock: the old
chunks go, the new ones come, and ``indexed_version`` moves, together. A
resource whose current version is already indexed is left alone, so the
same version twice is a no-op.
"""

from __future__ import annotations

import re

from conveyor.errors import PermanentError, RecordNotFound
from conveyor.logs import log_event
from conveyor.platform import records
from conveyor.platform.blueprint import jobs
from conveyor.platform.faults import maybe_fail
from conveyor.platform.payloads import ResourceIndex
from conveyor.platform.queues import INDEXING
from conveyor.tasks.context import JobContext

#: Words per chunk, and words shared with the previous chunk so a phrase cut
#: at a boundary is still found whole in one of the two.
CHUNK_WORDS = 120
CHUNK_OVERLAP = 20


@jobs.job("resource.index", queue=INDEXING, payload=ResourceIndex)
def index_resource(payload: ResourceIndex, ctx: JobContext) -> None:
    maybe_fail(ctx, payload.idempotency_key(), "before indexing")
    with ctx.app.pool.connection() as conn, conn.transaction():
        try:
            resource = records.lock_resource(conn, payload.resource_id, payload.user_id)
        except RecordNotFound as exc:
            raise PermanentError(str(exc)) from None
        version = resource.version
        if resource.indexed_version == version:
            log_event(
                "index_unchanged",
                queue=ctx.queue,
                job=ctx.job,
                job_id=ctx.job_id,
                attempt=ctx.attempt,
                resource_id=payload.resource_id,
                version=version,
            )
            return
        # The current version is indexed, even when a newer one arrived after this job was enqueued.
        chunks = chunk_text(f"{resource.title}\n{resource.body}" if resource.title else resource.body)
        records.replace_chunks(conn, payload.resource_id, version, chunks, user_id=resource.user_id)
        records.mark_indexed(conn, payload.resource_id, version, user_id=resource.user_id)
    log_event(
        "indexed",
        queue=ctx.queue,
        job=ctx.job,
        job_id=ctx.job_id,
        attempt=ctx.attempt,
        resource_id=payload.resource_id,
        version=version,
        chunks=len(chunks),
    )


def chunk_text(text: str, words: int = CHUNK_WORDS, overlap: int = CHUNK_OVERLAP) -> list[str]:
    """Overlapping windows of ``words`` words; an empty text gives no chunk."""
    tokens = re.findall(r"\S+", text)
    if not tokens:
        return []
    step = max(1, words - overlap)
    return [" ".join(tokens[start : start + words]) for start in range(0, max(1, len(tokens) - overlap), step)]
