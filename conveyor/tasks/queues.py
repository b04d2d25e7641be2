"""The six queues and their settings, in one table.

Each queue gets its own worker group, so slow work on one never starves
another. Every field can be overridden from the environment
(``CONVEYOR_QUEUES__LLM__CONCURRENCY=4``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..settings import Settings


@dataclass(frozen=True)
class QueueSpec:
    """One queue: how many jobs run at once per worker process, and how jobs retry.

    Times are in seconds. ``max_attempts`` counts every start of a job:
    runs that raised and deliveries whose worker died alike.
    """

    name: str
    concurrency: int
    max_attempts: int
    min_backoff: float
    max_backoff: float
    time_limit: float
    why: str


QUEUES: dict[str, QueueSpec] = {
    spec.name: spec
    for spec in (
        # Agent runs mostly wait on the model provider: many threads are cheap.
        # 30 min limit: the longest agent build observed takes ~15 min.
        QueueSpec("agent", 16, 3, 2.0, 60.0, 30 * 60, "long runs must not starve the rest"),
        # Charges are tiny and must never wait behind LLM work; retried
        # quickly and often because the ledger makes a repeat harmless.
        QueueSpec("critical", 10, 10, 0.5, 30.0, 60, "charges are consumed fast"),
        # Provider rate limits and token cost: two at a time per process.
        QueueSpec("llm", 2, 5, 5.0, 300.0, 10 * 60, "provider rate limits and token cost"),
        QueueSpec("indexing", 5, 5, 2.0, 120.0, 10 * 60, "CPU/DB bound, scaled on its own"),
        # Cron fires and resumptions only enqueue other work: few threads suffice.
        QueueSpec("scheduling", 4, 5, 1.0, 60.0, 60, "cron fires and resumptions"),
        QueueSpec("nudge", 2, 5, 1.0, 60.0, 60, "time-triggered nudges"),
    )
}


def queue_specs(settings: Settings) -> dict[str, QueueSpec]:
    """The queue table with the environment's overrides applied."""
    specs = {}
    for name, spec in QUEUES.items():
        override = settings.queues.get(name)
        if override:
            spec = replace(spec, **override.model_dump(exclude_none=True))
        specs[name] = spec
    return specs
