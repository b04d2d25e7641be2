"""The job types: name -> queue, payload model, processor, final-failure hook.

A processor module registers its job with :func:`job`; the worker loop
never changes when a job type is added.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Callable

from .payloads import Payload
from .queues import QUEUES

if TYPE_CHECKING:
    from .context import JobContext

Processor = Callable[[Payload, "JobContext"], Any]
FinalFailureHook = Callable[[Payload | None, str, "JobContext"], None]


@dataclass(frozen=True)
class JobType:
    """One kind of job. ``time_limit`` and ``max_attempts`` override the queue's when set."""

    name: str
    queue: str
    payload: type[Payload]
    run: Processor
    on_final_failure: FinalFailureHook | None = None
    time_limit: float | None = None
    max_attempts: int | None = None


JOB_TYPES: dict[str, JobType] = {}

#: Modules holding conveyor's own job types, imported by :func:`load_job_types`.
BUILTIN_MODULES = (
    "conveyor.tasks.processors.credit",
    "conveyor.tasks.processors.agent_run",
    "conveyor.tasks.processors.finalize",
    "conveyor.tasks.processors.memory",
    "conveyor.tasks.processors.indexing",
    "conveyor.tasks.processors.schedule",
    "conveyor.tasks.processors.resume",
    "conveyor.tasks.processors.nudge",
    "conveyor.tasks.processors.build",
)


def job(name: str, *, queue: str, payload: type[Payload], time_limit: float | None = None,
        max_attempts: int | None = None) -> Callable[[Processor], Processor]:
    """Register the decorated function as the processor of job ``name``."""
    if queue not in QUEUES:
        raise ValueError(f"job {name!r}: unknown queue {queue!r}")

    def register(fn: Processor) -> Processor:
        previous = JOB_TYPES.get(name)
        JOB_TYPES[name] = JobType(name, queue, payload, fn, previous.on_final_failure if previous else None,
                                  time_limit, max_attempts)
        return fn

    return register


def on_final_failure(name: str) -> Callable[[FinalFailureHook], FinalFailureHook]:
    """Register the decorated function to run once when job ``name`` has spent its attempts.

    It drives the job's target to a terminal state (a build to ``failed``, say).
    The payload is None when the message could not be read at all.
    """

    def register(fn: FinalFailureHook) -> FinalFailureHook:
        JOB_TYPES[name] = replace(JOB_TYPES[name], on_final_failure=fn)
        return fn

    return register


def load_job_types(extra_modules: tuple[str, ...] | list[str] = ()) -> dict[str, JobType]:
    """Import conveyor's job modules and the user's (``CONVEYOR_IMPORTS``); return the table."""
    for module in (*BUILTIN_MODULES, *extra_modules):
        importlib.import_module(module)
    return JOB_TYPES
