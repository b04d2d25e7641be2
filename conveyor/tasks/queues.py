"""Queues: the environment's overrides of the queues an App's blueprints declare.

A queue is a value (:class:`~conveyor.blueprints.Queue`) registered on a blueprint by the
jobs that use it. Each queue gets its own worker group, so slow work on one never starves
another. Every field can be overridden from the environment
(``CONVEYOR_QUEUES__<QUEUE>__CONCURRENCY=4``).
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import TYPE_CHECKING

from conveyor.blueprints import DEFAULT, DEFAULT_MAX_ATTEMPTS, QUEUE_NAME, JobType, Queue
from conveyor.budgets.base import Budget

if TYPE_CHECKING:
    from conveyor.settings import Settings

__all__ = [
    "DEFAULT_MAX_ATTEMPTS",
    "QUEUE_NAME",
    "Queue",
    "QueueSpec",
    "declare_queue",
    "queue_specs",
    "with_budget_overrides",
]

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


def env_name(budget: str) -> str:
    """How a budget's name is spelt in CONVEYOR_BUDGETS__<NAME>__...: lower case, dashes and dots as underscores."""
    return re.sub(r"[-.]", "_", budget.lower())


def with_budget_overrides(
    settings: "Settings", queues: dict[str, Queue], job_types: dict[str, JobType]
) -> tuple[dict[str, Queue], dict[str, JobType]]:
    """``queues`` and ``job_types`` with CONVEYOR_BUDGETS__<NAME>__LIMIT/__PER applied to every budget of that
    name; an override of a budget none declares is an error."""
    from conveyor.errors import ConfigurationError

    overrides = {env_name(name): o for name, o in settings.budgets.items()}
    declared = {b.name for q in queues.values() for b in q.budgets} | {
        b.name for t in job_types.values() for b in t.budgets
    }
    unknown = sorted(set(overrides) - {env_name(n) for n in declared})
    if unknown:
        raise ConfigurationError(
            f"unknown budget(s) {unknown} in CONVEYOR_BUDGETS__*; known: {sorted(env_name(n) for n in declared)}"
        )
    if not overrides:
        return queues, job_types

    def apply(budgets: tuple[Budget, ...]) -> tuple[Budget, ...]:
        out = []
        for b in budgets:
            o = overrides.get(env_name(b.name))
            out.append(replace(b, **o.model_dump(exclude_none=True)) if o else b)
        return tuple(out)

    return (
        {n: replace(q, budgets=apply(q.budgets)) for n, q in queues.items()},
        {n: replace(t, budgets=apply(t.budgets)) for n, t in job_types.items()},
    )
