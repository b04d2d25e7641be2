"""Queues: the environment's overrides of the queues an App's blueprints declare.

A queue is a value (:class:`~conveyor.blueprints.Queue`) registered on a blueprint by the
jobs that use it. Each queue gets its own worker group, so slow work on one never starves
another. Every field can be overridden from the environment
(``CONVEYOR_QUEUES__<QUEUE>__CONCURRENCY=4``).
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from conveyor.blueprints import DEFAULT, DEFAULT_MAX_ATTEMPTS, QUEUE_NAME, Queue

if TYPE_CHECKING:
    from conveyor.settings import Settings

__all__ = ["DEFAULT_MAX_ATTEMPTS", "QUEUE_NAME", "Queue", "QueueSpec", "declare_queue", "queue_specs"]

#: The earlier name of :class:`Queue`.
QueueSpec = Queue


def declare_queue(queue: Queue) -> Queue:
    """Declare ``queue`` on the default blueprint (the module-level ``job``'s); see :meth:`Jobs.queue`."""
    return DEFAULT.queue(queue)


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
