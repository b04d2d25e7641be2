"""Resource routes: store a resource's text (indexed by a resource.index job) and search the index.

``PUT /api/resources/{resource_id}`` stores the text and enqueues its
indexing (202); the same text again is a no-op. ``GET
/api/resources/search?q=`` is Postgres full-text search over the indexed
chunks, best first; snippets are HTML-escaped text with the matches in
``<b>``, never markup from a resource's body.

Every route needs a user's API key and touches only that user's resources.
A resource id is the user's own (migration 0062): two users may both have a
``doc1``, each their own, so no answer tells one whether the other has it,
and nobody can take an id before its owner does.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Query, Response
from pydantic import BaseModel, Field

from conveyor.api.auth import UserId
from conveyor.api.deps import ConveyorApp
from conveyor.api.errors import UNAVAILABLE_RESPONSES
from conveyor.platform import records
from conveyor.platform.api.runs import AUTH_RESPONSES, IdPath
from conveyor.platform.payloads import ResourceIndex
from conveyor.tasks.payloads import Id

router = APIRouter(prefix="/api/resources", tags=["resources"], responses=UNAVAILABLE_RESPONSES)
#: A resource's text (up to 5,000,000 characters) may be a longer JSON body than other routes take:
#: up to CONVEYOR_API_MAX_BODY_BYTES (conveyor.api.app reads this).
LONG_TEXT_PREFIXES = ("/api/resources/",)


class PutResource(BaseModel):
    #: Optional and only ever the caller: a resource belongs to the key's user.
    user_id: Id | None = None
    task_id: Id | None = None
    title: str = Field("", max_length=500)
    body: str = Field(min_length=1, max_length=5_000_000)


class ResourceAccepted(BaseModel):
    resource_id: str
    version: str
    job_id: str
    deduplicated: bool


class ResourceState(BaseModel):
    id: str
    user_id: str
    task_id: str | None
    title: str
    version: str
    indexed_version: str | None
    indexed: bool


class SearchResult(BaseModel):
    resource_id: str
    title: str
    seq: int
    snippet: str
    rank: float


class SearchResults(BaseModel):
    query: str
    results: list[SearchResult]


@router.get("/search", response_model=SearchResults, responses=AUTH_RESPONSES)
def search(
    q: Annotated[str, Query(min_length=1, max_length=500, description='words, "a phrase", -not, or')],
    app: ConveyorApp,
    caller: UserId,
    user_id: Annotated[Id | None, Query(description="only ever you: another user finds nothing")] = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
) -> SearchResults:
    """Full-text search over your indexed resources (API key), best match first.

    ``snippet`` is HTML: escaped text with the matching words in ``<b>``.
    """
    if user_id is not None and user_id != caller:
        return SearchResults(query=q, results=[])
    with app.pool.connection() as conn:
        hits = records.search_resources(conn, q, user_id=caller, limit=limit)
    return SearchResults(query=q, results=[SearchResult(**hit.__dict__) for hit in hits])


@router.put(
    "/{resource_id}",
    status_code=202,
    response_model=ResourceAccepted,
    responses={
        **AUTH_RESPONSES,
        404: {"description": "no such task of yours"},
        422: {"description": "user_id is not you"},
        503: {"description": "the broker is unavailable; stored but not yet indexed"},
    },
)
def put_resource(
    resource_id: IdPath,
    body: PutResource,
    response: Response,
    app: ConveyorApp,
    user_id: UserId,
) -> ResourceAccepted:
    """Store your resource's text (API key) and enqueue its indexing; unchanged text enqueues nothing new."""
    if body.user_id is not None and body.user_id != user_id:
        raise HTTPException(422, [{"loc": ["body", "user_id"], "msg": "a resource belongs to the key's user"}])
    with app.pool.connection() as conn:
        if body.task_id is not None:
            records.get_task_of(conn, body.task_id, user_id)
        version = records.upsert_resource(
            conn, id=resource_id, user_id=user_id, task_id=body.task_id, title=body.title, body=body.body
        )
    payload = ResourceIndex(resource_id=resource_id, version=version, user_id=user_id)
    ref = app.jobs.enqueue("resource.index", payload, key=payload.idempotency_key())  # BrokerUnavailable: 503
    response.headers["Location"] = f"/api/resources/{resource_id}"
    return ResourceAccepted(resource_id=resource_id, version=version, job_id=ref.id, deduplicated=ref.deduplicated)


@router.get(
    "/{resource_id}",
    response_model=ResourceState,
    responses={**AUTH_RESPONSES, 404: {"description": "no such resource of yours"}},
)
def get_resource(resource_id: IdPath, app: ConveyorApp, user_id: UserId) -> ResourceState:
    """Your resource's current version and whether that version is indexed (its body is not returned)."""
    with app.pool.connection() as conn:
        r = records.get_resource_of(conn, resource_id, user_id)
    return ResourceState(
        id=r.id,
        user_id=r.user_id,
        task_id=r.task_id,
        title=r.title,
        version=r.version,
        indexed_version=r.indexed_version,
        indexed=r.indexed_version == r.version,
    )
