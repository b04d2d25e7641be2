"""resource.index: chunk a resource's text and index it in Postgres full-text search.

Indexing is one transaction holding the resource's row lock: the old
chunks go, the new ones come, and ``indexed_version`` moves, together. A
resource whose current version is already indexed is left alone, so the
same version twice is a no-op.
"""

from __future__ import annotations

import re

from conveyor.errors import PermanentError
from conveyor.logs import log_event
from conveyor.platform import records
from conveyor.platform.payloads import ResourceIndex
from conveyor.platform.queues import INDEXING
from conveyor.tasks.context import JobContext
from conveyor.tasks.faults import maybe_fail
from conveyor.tasks.registry import job

#: Words per chunk, and words shared with the previous chunk so a phrase cut
#: at a boundary is still found whole in one of the two.
CHUNK_WORDS = 120
CHUNK_OVERLAP = 20


@job("resource.index", queue=INDEXING, payload=ResourceIndex)
def index_resource(payload: ResourceIndex, ctx: JobContext) -> None:
    maybe_fail(ctx, f"index:{payload.resource_id}:{payload.version}", "before indexing")
    with ctx.app.pool.connection() as conn, conn.transaction():
        row = conn.execute(records.QUERIES["lock_resource"], {"id": payload.resource_id}).fetchone()
        if row is None:
            raise PermanentError(f"no resource {payload.resource_id!r}")
        title, body, version, indexed_version = row
        if indexed_version == version:
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
        chunks = chunk_text(f"{title}\n{body}" if title else body)
        conn.execute(records.QUERIES["delete_resource_chunks"], {"id": payload.resource_id})
        with conn.cursor() as cur:
            cur.executemany(
                records.QUERIES["insert_resource_chunk"],
                [
                    {"id": payload.resource_id, "seq": n, "version": version, "body": chunk}
                    for n, chunk in enumerate(chunks, 1)
                ],
            )
        conn.execute(records.QUERIES["mark_indexed"], {"id": payload.resource_id, "version": version})
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
