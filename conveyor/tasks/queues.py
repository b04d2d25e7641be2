"""Queues: a name and how its jobs run and retry, declared by whoever owns the jobs.

A user's job module and the agent platform declare queues the same way,
with :class:`Queue` passed to :func:`~conveyor.tasks.registry.job` (or
:func:`declare_queue`). Each queue gets its own worker group, so slow work on
one never starves another. Every field can be overridden from the environment
(``CONVEYOR_QUEUES__<QUEUE>__CONCURRENCY=4``).
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from conveyor.settings import Settings

#: A queue name: it becomes part of environment variable names and broker keys.
QUEUE_NAME = re.compile(r"^[a-z][a-z0-9_]{0,63}$")

#: Attempts a job gets when neither its job type nor its queue says otherwise.
DEFAULT_MAX_ATTEMPTS = 3


@dataclass(frozen=True)
class Queue:
    """One queue: how many jobs run at once per worker process, and how jobs retry.

    Times are in seconds. ``max_attempts`` counts every start of a job:
    runs that raised and deliveries whose worker died alike.
    """

    name: str
    concurrency: int = 4
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    min_backoff: float = 1.0
    max_backoff: float = 60.0
    time_limit: float = 10 * 60
    why: str = ""

    def __post_init__(self) -> None:
        if not QUEUE_NAME.match(self.name):
            raise ValueError(f"queue name {self.name!r} must match {QUEUE_NAME.pattern}")
        if self.concurrency < 1 or self.max_attempts < 1 or self.time_limit <= 0:
            raise ValueError(f"queue {self.name!r}: concurrency and max_attempts must be >= 1, time_limit > 0")


#: The earlier name of :class:`Queue`.
QueueSpec = Queue

#: Every queue declared in this process, in declaration order, and the module that declared it.
DECLARED: dict[str, Queue] = {}
OWNERS: dict[str, str] = {}


def declare_queue(queue: Queue, *, module: str | None = None) -> Queue:
    """Declare ``queue`` (again, harmlessly, if it is the same); a second, different queue of that name is an error."""
    known = DECLARED.get(queue.name)
    if known is not None:
        if known != queue:
            raise ValueError(f"queue {queue.name!r} is declared twice with different settings")
        return known
    DECLARED[queue.name] = queue
    OWNERS[queue.name] = module or sys._getframe(1).f_globals.get("__name__", "")
    return queue


def queue_specs(settings: "Settings", queues: dict[str, Queue]) -> dict[str, Queue]:
    """``queues`` with the environment's overrides applied; an override of a queue not in it is an error."""
    from conveyor.errors import ConfigurationError

    unknown = sorted(set(settings.queues) - set(queues))
    if unknown:
        raise ConfigurationError(f"unknown queue(s) {unknown} in CONVEYOR_QUEUES__*; known: {sorted(queues)}")
    specs = {}
    for name, spec in queues.items():
        override = settings.queues.get(name)
        if override:
            spec = replace(spec, **override.model_dump(exclude_none=True))
        specs[name] = spec
    return specs
