"""The fleet's records and the store interface each broker's fleet store implements.

Apart from :mod:`conveyor.brokers.fleet` so the stores can import them without
importing the package that chooses among them (no ``__init__`` loop).
"""

from __future__ import annotations

from dataclasses import dataclass, field

#: How long a worker's entry is kept after its last heartbeat (s).
FORGET_AFTER = 24 * 3600.0

#: Largest traceback kept per attempt (characters; the tail is kept: it names the raise).
TRACEBACK_LIMIT = 16000


@dataclass
class WorkerInfo:
    """One worker process as the registry holds it. Times are UNIX seconds of the store's clock."""

    id: str
    host: str
    pid: int
    queues: list[str]
    threads: int
    version: str
    started_at: float | None
    heartbeat_at: float | None
    in_flight: list[str] = field(default_factory=list)
    done: int = 0
    failed: int = 0
    #: When it left: stopped cleanly, or found dead (its jobs recovered). None while it runs.
    gone_at: float | None = None
    #: "stopped" (clean shutdown), "died" (its supervisor reaped it: killed or crashed; its jobs go back
    #: when their lease runs out) or "recovered" (stopped heartbeating; its jobs went back).
    gone_reason: str | None = None


@dataclass
class AttemptInfo:
    """One attempt of a job: when and where it started, how it ended."""

    attempt: int
    worker: str
    started_at: float | None
    ended_at: float | None = None
    #: "completed", "failed", "deferred" (RetryLater), "skipped"; None while running or if the worker died.
    outcome: str | None = None
    error: str | None = None
    traceback: str | None = None


@dataclass(frozen=True)
class AttemptEvent:
    """A start or an end of an attempt, as the worker buffers it before writing.

    ``age`` is how long before the write it happened (s, from the worker's
    monotonic clock): the store dates it ``server_now - age``.
    """

    kind: str  # "start" | "end" | "full" (a start and its end in one write)
    job_id: str
    token: str
    attempt: int
    worker: str
    #: Seconds before the write that it happened: the start's for "start", the end's for "end" and "full".
    age: float = 0.0
    outcome: str | None = None
    error: str | None = None
    traceback: str | None = None
    #: "full" only: seconds before the write that the attempt started.
    start_age: float | None = None


class FleetStore:
    """Where the registry and the attempt history live; one implementation per broker."""

    #: The broker counts each new job in its enqueue itself (exactly, no write of its own): no
    #: ``count_enqueued`` call is needed.
    counts_enqueues = False

    def beat(self, info: WorkerInfo, *, keep: float) -> None:
        """Register or refresh a worker (heartbeat = the server's now); clears an earlier gone mark."""
        raise NotImplementedError

    def leave(self, info: WorkerInfo, reason: str) -> None:
        """Mark a worker gone now, with its last counts."""
        raise NotImplementedError

    def sweep(self, gone_after: float) -> int:
        """Mark gone ("recovered") every worker silent for ``gone_after`` s; forget old ones. Returns how many."""
        raise NotImplementedError

    def workers(self) -> tuple[float, list[WorkerInfo]]:
        """(the server's now, every known worker)."""
        raise NotImplementedError

    def write_attempts(self, events: list[AttemptEvent], *, keep: float) -> None:
        """Write buffered starts and ends, in order."""
        raise NotImplementedError

    def attempts(self, job_id: str) -> list[AttemptInfo]:
        """A job's attempts, oldest first."""
        raise NotImplementedError

    def count_enqueued(self, counts: dict[tuple[str, str], int]) -> None:
        """Add to the fleet's enqueue totals by (queue, job); a no-op where the broker counts them itself
        (``counts_enqueues``)."""
        raise NotImplementedError

    def enqueued_totals(self) -> dict[tuple[str, str], int]:
        """The fleet's enqueue totals by (queue, job), since the broker's data began."""
        raise NotImplementedError

    def find_by_key(self, key: str) -> list[str]:
        """Ids of the jobs whose enqueue key is ``key`` (a key is held by one job while its TTL runs)."""
        raise NotImplementedError
