"""The agent platform's records in Postgres: tasks, messages, runs, memories, resources and who owns them.

Users and API keys are the library's access layer, in :mod:`conveyor.access`.

Plain functions over a connection, returning dataclasses; the SQL is in
``records.sql``. Every record is found by its ID. Processors, the API and
the demo all go through here.
"""

from __future__ import annotations

import hashlib
import html
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from conveyor.errors import RecordConflict, RecordNotFound
from conveyor.queries import load_queries

if TYPE_CHECKING:
    from psycopg import Connection

QUERIES = load_queries(Path(__file__).with_name("records.sql"))

#: Run states after which nothing changes.
TERMINAL = frozenset({"completed", "failed", "cancelled"})


@dataclass(frozen=True)
class Task:
    id: str
    user_id: str
    kind: str
    title: str
    instructions: str
    created_at: datetime


@dataclass(frozen=True)
class Message:
    id: str
    task_id: str
    role: str
    content: str
    run_id: str | None
    prompt_tokens: int | None
    completion_tokens: int | None
    created_at: datetime


@dataclass(frozen=True)
class Run:
    id: str
    task_id: str
    job: str
    user_message_id: str
    assistant_message_id: str
    status: str
    attempts: int
    prompt_tokens: int | None
    completion_tokens: int | None
    total_tokens: int | None
    error: str | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    finalized_at: datetime | None

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL


@dataclass(frozen=True)
class Resource:
    id: str
    user_id: str
    task_id: str | None
    title: str
    body: str
    version: str
    indexed_version: str | None
    indexed_at: datetime | None


@dataclass(frozen=True)
class LockedResource:
    """A resource's text and versions, its row locked until the transaction ends (see :func:`lock_resource`)."""

    user_id: str
    title: str
    body: str
    version: str
    indexed_version: str | None


@dataclass(frozen=True)
class SearchHit:
    resource_id: str
    title: str
    seq: int
    snippet: str
    rank: float


# -- tasks and messages -------------------------------------------------------


def create_task(
    conn: Connection[Any], *, id: str, user_id: str, kind: str = "chat", title: str = "", instructions: str = ""
) -> Task:
    """Create a task; the same ID again returns the existing task if it matches, else :class:`RecordConflict`."""
    conn.execute(
        QUERIES["create_task"],
        {"id": id, "user_id": user_id, "kind": kind, "title": title, "instructions": instructions},
    )
    task = get_task(conn, id)
    if (task.user_id, task.kind) != (user_id, kind):
        raise RecordConflict(f"task {id!r} exists with another user or kind")
    return task


def get_task(conn: Connection[Any], task_id: str) -> Task:
    row = conn.execute(QUERIES["get_task"], {"id": task_id}).fetchone()
    if row is None:
        raise RecordNotFound(f"no task {task_id!r}")
    return Task(*row)


def add_message(conn: Connection[Any], *, id: str, task_id: str, role: str, content: str) -> Message:
    """Add a message by its ID; the same ID with the same content is a no-op, other content a conflict."""
    conn.execute(QUERIES["add_message"], {"id": id, "task_id": task_id, "role": role, "content": content})
    message = get_message(conn, id)
    if (message.task_id, message.role, message.content) != (task_id, role, content):
        raise RecordConflict(f"message {id!r} exists with other content")
    return message


def get_message(conn: Connection[Any], message_id: str) -> Message:
    row = conn.execute(QUERIES["get_message"], {"id": message_id}).fetchone()
    if row is None:
        raise RecordNotFound(f"no message {message_id!r}")
    return Message(*row)


def conversation(conn: Connection[Any], upto_message_id: str) -> list[tuple[str, str]]:
    """(role, content) of the task's messages up to and including ``upto_message_id``, oldest first."""
    return [tuple(row) for row in conn.execute(QUERIES["conversation"], {"message_id": upto_message_id})]


# -- runs -----------------------------------------------------------------------


def create_run(
    conn: Connection[Any], *, id: str, task_id: str, job: str, user_message_id: str, assistant_message_id: str
) -> None:
    conn.execute(
        QUERIES["create_run"],
        {
            "id": id,
            "task_id": task_id,
            "job": job,
            "user_message_id": user_message_id,
            "assistant_message_id": assistant_message_id,
        },
    )


def get_run(conn: Connection[Any], run_id: str) -> Run:
    row = conn.execute(QUERIES["get_run"], {"id": run_id}).fetchone()
    if row is None:
        raise RecordNotFound(f"no run {run_id!r}")
    return Run(*row)


def run_of_task(conn: Connection[Any], *, run_id: str, task_id: str) -> tuple[Run, Task]:
    """The run and its task, as a payload names them; :class:`RecordNotFound` if either is missing or they differ."""
    run, task = get_run(conn, run_id), get_task(conn, task_id)
    if run.task_id != task.id:
        raise RecordNotFound(f"run {run_id!r} is not a run of task {task_id!r}")
    return run, task


def find_run_by_user_message(conn: Connection[Any], user_message_id: str) -> str | None:
    row = conn.execute(QUERIES["find_run_by_user_message"], {"user_message_id": user_message_id}).fetchone()
    return row[0] if row else None


def stranded_runs(conn: Connection[Any], *, older_than: float, limit: int) -> list[tuple[str, str, str]]:
    """(run id, task id, job) of runs queued for longer than ``older_than`` seconds, oldest first."""
    rows = conn.execute(QUERIES["stranded_runs"], {"older_than": older_than, "limit": limit}).fetchall()
    return [(str(r[0]), str(r[1]), str(r[2])) for r in rows]


def start_run(conn: Connection[Any], run_id: str) -> int | None:
    """Count an attempt and mark the run running; None when it has already ended."""
    row = conn.execute(QUERIES["start_run"], {"id": run_id}).fetchone()
    return row[0] if row else None


def complete_run(conn: Connection[Any], run: Run, *, content: str, prompt_tokens: int, completion_tokens: int) -> bool:
    """Write the assistant message by its ID and complete the run, in one transaction.

    False when the run had already ended (another attempt finished it first).
    """
    with conn.transaction():
        done = conn.execute(
            QUERIES["complete_run"],
            {"id": run.id, "prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens},
        ).fetchone()
        if done is None:
            return False
        conn.execute(
            QUERIES["write_assistant_message"],
            {
                "id": run.assistant_message_id,
                "task_id": run.task_id,
                "content": content,
                "run_id": run.id,
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
            },
        )
    return True


def fail_run(conn: Connection[Any], run_id: str, error: str) -> bool:
    """Drive a live run to ``failed``; False when it had already ended."""
    return conn.execute(QUERIES["fail_run"], {"id": run_id, "error": error[:2000]}).fetchone() is not None


def cancel_run(conn: Connection[Any], run: Run, *, running: bool, partial: str | None = None) -> bool:
    """Drive a live run to ``cancelled`` (only a queued one unless ``running``), keeping ``partial``, the reply
    streamed so far, as its assistant message, in one transaction; False when it had already ended (or runs)."""
    with conn.transaction():
        done = conn.execute(QUERIES["cancel_run"], {"id": run.id, "running": running, "error": "cancelled"}).fetchone()
        if done is None:
            return False
        if partial:
            conn.execute(
                QUERIES["write_assistant_message"],
                {
                    "id": run.assistant_message_id,
                    "task_id": run.task_id,
                    "content": partial,
                    "run_id": run.id,
                    "prompt_tokens": None,
                    "completion_tokens": None,
                },
            )
    return True


def mark_finalized(conn: Connection[Any], run_id: str) -> None:
    conn.execute(QUERIES["mark_finalized"], {"id": run_id})


def round_of(conn: Connection[Any], *, task_id: str, message_id: str) -> tuple[str, str, str]:
    """(run id, user's message, assistant's reply) of the round that ``message_id`` answered."""
    row = conn.execute(QUERIES["round"], {"task_id": task_id, "message_id": message_id}).fetchone()
    if row is None:
        raise RecordNotFound(f"no finished round with assistant message {message_id!r} in task {task_id!r}")
    run_id, user_text, reply = row
    return str(run_id), str(user_text), str(reply)


# -- memories -------------------------------------------------------------------


def upsert_memory(conn: Connection[Any], *, user_id: str, key: str, value: str, task_id: str, message_id: str) -> None:
    conn.execute(
        QUERIES["upsert_memory"],
        {"user_id": user_id, "key": key, "value": value, "task_id": task_id, "message_id": message_id},
    )


def record_extraction(
    conn: Connection[Any], *, user_id: str, task_id: str, message_id: str, memories: int, started_at: datetime
) -> None:
    conn.execute(
        QUERIES["record_extraction"],
        {
            "user_id": user_id,
            "task_id": task_id,
            "message_id": message_id,
            "memories": memories,
            "started_at": started_at,
        },
    )


def clock(conn: Connection[Any]) -> datetime:
    """The database's clock: one clock for every worker process and host."""
    row = conn.execute(QUERIES["clock"]).fetchone()
    assert row is not None  # a SELECT without FROM has one row
    moment: datetime = row[0]
    return moment


def memories(conn: Connection[Any], user_id: str) -> list[tuple[Any, ...]]:
    return conn.execute(QUERIES["memories"], {"user_id": user_id}).fetchall()


# -- resources ------------------------------------------------------------------


def resource_version(title: str, body: str) -> str:
    """A resource's version: a digest of what gets indexed."""
    return hashlib.sha256(f"{title}\x1f{body}".encode()).hexdigest()[:32]


def upsert_resource(conn: Connection[Any], *, id: str, user_id: str, task_id: str | None, title: str, body: str) -> str:
    """Store a resource's text; returns its version (unchanged text keeps its version and index).

    A resource is ``(user_id, id)``: another user's resource of the same id is another resource.
    """
    version = resource_version(title, body)
    conn.execute(
        QUERIES["upsert_resource"],
        {"id": id, "user_id": user_id, "task_id": task_id, "title": title, "body": body, "version": version},
    )
    return version


def get_resource(conn: Connection[Any], resource_id: str, user_id: str | None = None) -> Resource:
    """``user_id``'s resource ``resource_id`` (without a user: the oldest of that id, for jobs enqueued before
    ids were each user's own)."""
    row = conn.execute(QUERIES["get_resource"], {"id": resource_id, "user_id": user_id}).fetchone()
    if row is None:
        raise RecordNotFound(f"no resource {resource_id!r}")
    return Resource(*row)


def lock_resource(conn: Connection[Any], resource_id: str, user_id: str | None = None) -> LockedResource:
    """Lock the resource for this transaction, so two index jobs of one resource take turns (``user_id``: see
    :func:`get_resource`)."""
    row = conn.execute(QUERIES["lock_resource"], {"id": resource_id, "user_id": user_id}).fetchone()
    if row is None:
        raise RecordNotFound(f"no resource {resource_id!r}")
    return LockedResource(*row)


def replace_chunks(
    conn: Connection[Any], resource_id: str, version: str, chunks: Sequence[str], *, user_id: str
) -> None:
    """The resource's indexed chunks become ``chunks`` (numbered from 1), all of ``version``."""
    key = {"id": resource_id, "user_id": user_id}
    conn.execute(QUERIES["delete_resource_chunks"], key)
    with conn.cursor() as cur:
        cur.executemany(
            QUERIES["insert_resource_chunk"],
            [{**key, "seq": n, "version": version, "body": chunk} for n, chunk in enumerate(chunks, 1)],
        )


def mark_indexed(conn: Connection[Any], resource_id: str, version: str, *, user_id: str) -> None:
    conn.execute(QUERIES["mark_indexed"], {"id": resource_id, "version": version, "user_id": user_id})


#: Where ts_headline marks a match (search_resources): control characters, so
#: the marks survive HTML escaping of the text around them.
_START_SEL, _STOP_SEL = "\x02", "\x03"


def safe_snippet(headline: str) -> str:
    """A headline as HTML: the resource's text escaped first, then its matches put in ``<b>``.

    ts_headline's own ``<b>`` marks would sit in raw text, so a body holding
    ``<img onerror=...>`` came back live; its text is escaped here instead.
    """
    return html.escape(headline, quote=True).replace(_START_SEL, "<b>").replace(_STOP_SEL, "</b>")


def search_resources(conn: Connection[Any], q: str, *, user_id: str | None = None, limit: int = 20) -> list[SearchHit]:
    """Full-text search over indexed chunks (web-search syntax: words, "phrases", -exclusions, or).

    Each snippet is safe HTML (:func:`safe_snippet`).
    """
    rows = conn.execute(QUERIES["search_resources"], {"q": q, "user_id": user_id, "limit": limit}).fetchall()
    return [
        SearchHit(resource_id, title, seq, safe_snippet(snippet), rank)
        for resource_id, title, seq, snippet, rank in rows
    ]


# -- ownership --------------------------------------------------------------------
#
# A producer reads and writes only its own records. Each lookup below answers
# RecordNotFound with the same text for a record of another user as for one
# that does not exist, so an id cannot be probed.


def get_task_of(conn: Connection[Any], task_id: str, user_id: str) -> Task:
    row = conn.execute(QUERIES["get_task_of_user"], {"id": task_id, "user_id": user_id}).fetchone()
    if row is None:
        raise RecordNotFound(f"no task {task_id!r}")
    return Task(*row)


def get_run_of(conn: Connection[Any], run_id: str, user_id: str) -> Run:
    row = conn.execute(QUERIES["get_run_of_user"], {"id": run_id, "user_id": user_id}).fetchone()
    if row is None:
        raise RecordNotFound(f"no run {run_id!r}")
    return Run(*row)


def get_resource_of(conn: Connection[Any], resource_id: str, user_id: str) -> Resource:
    """The user's own resource of that id (resource ids are each user's own: another user's is another)."""
    return get_resource(conn, resource_id, user_id)


def scoped_id(kind: str, user_id: str, client_id: str) -> str:
    """The stored id of a client-chosen id: one user's ``m1`` is not another's.

    Ids are one namespace in the database; without this, an id another user
    took would answer 409 (or their record) to a stranger, and so tell them
    it exists. Letters and digits only: safe in a path and in any id pattern.
    """
    digest = hashlib.sha256(f"{kind}\x1f{user_id}\x1f{client_id}".encode()).hexdigest()[:32]
    return f"{kind[:5]}c{digest}"


def scoped_message_id(user_id: str, message_id: str) -> str:
    """The stored id of a client-chosen message id (see :func:`scoped_id`; this form predates it)."""
    digest = hashlib.sha256(f"{user_id}\x1f{message_id}".encode()).hexdigest()[:32]
    return f"msgc_{digest}"
