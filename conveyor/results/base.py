"""What every result store offers (memory, Postgres, Redis): write an entry, watch one job's."""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class Entry:
    """What the store holds for a job: its result (``ok``, ``value`` as JSON text), or a failure marker."""

    ok: bool
    value: str | None = None


class Watch(Protocol):
    """One reader's view of one job's entry; armed when made, so :meth:`wait` misses nothing since."""

    def read(self) -> Entry | None:
        """The job's result if one is stored, else its failure marker, else None."""

    def wait(self, timeout: float) -> None:
        """Return when something new was written for the job, or after ``timeout`` seconds."""


class ResultStore(Protocol):
    def put(self, job_id: str, job: str, entry: Entry, ttl: float) -> None:
        """Store ``entry`` for ``ttl`` seconds: a result replaces a failure marker, nothing replaces a result."""

    def watch(self, job_id: str) -> AbstractContextManager[Watch]:
        """A :class:`Watch` on ``job_id``, armed before its first read."""

    def close(self) -> None: ...
