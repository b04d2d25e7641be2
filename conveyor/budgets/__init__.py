"""Budgets: weighted rate limits kept fleet-wide, declared on a job type or a queue.

``Budget("provider-tokens", limit=90_000, per=60, key=lambda p: p.provider_key,
weight=lambda p: p.max_tokens)`` on ``jobs.job(..., budgets=[...])`` or
``Queue(..., budgets=[...])``. Before a job's body runs, every budget it has
is asked for the job's weight under the job's key, all at once and atomically
on the store beside the broker (Redis, Postgres, or this process for the inline
broker), on the store server's clock. A job that would exceed one waits: it
raises :class:`~conveyor.errors.RetryLater` with the time until the window has
room, which re-runs it later without spending an attempt. A job may report
what it used after the fact (``ctx.spend("provider-tokens", used)``): the
weight is recorded as taken now, and the jobs that follow wait for it.

Metrics: ``conveyor_budget_throttled_total`` and ``conveyor_budget_wait_seconds_total``,
labelled ``budget``, ``queue`` and ``job``.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, Any, Sequence

from conveyor.appcache import per_app
from conveyor.budgets.base import Budget, BudgetStore, Take
from conveyor.errors import BudgetThrottled, BudgetUnknown, ConfigurationError

if TYPE_CHECKING:
    from conveyor.app import App
    from conveyor.tasks.context import JobContext

__all__ = ["Budget", "BudgetStore", "Take", "admit", "budget_store", "spend"]

#: A throttled job comes back after the computed wait plus up to this share of it (at least
#: :data:`MIN_JITTER` s): waiting jobs do not all return in the same millisecond.
JITTER = 0.1
MIN_JITTER = 0.05


def build_store(app: "App") -> BudgetStore:
    """The budget store beside ``app``'s broker (``conveyor.backends``)."""
    store = app.capabilities.store
    if store == "redis":
        from conveyor.budgets.redis import RedisBudgets
        from conveyor.redis_client import client

        if not app.settings.redis_url:
            raise ConfigurationError("CONVEYOR_BROKER=redis needs REDIS_URL")
        from conveyor.brokers.redis.keys import shared_namespace
        from conveyor.redis_client import is_cluster

        redis_client = client(app.settings.redis_url, app.settings)
        # A take spans several budgets' keys in one script call: on a cluster they share one slot.
        namespace = shared_namespace(app.settings.redis_namespace, cluster=is_cluster(redis_client))
        return RedisBudgets(redis_client, namespace)
    if store == "postgres":
        from conveyor.budgets.postgres import PostgresBudgets

        return PostgresBudgets(app.pool)
    from conveyor.budgets.memory import MemoryBudgets

    return MemoryBudgets()


budget_store = per_app(build_store)
"""The App's budget store, built once per App."""


def admit(ctx: "JobContext", payload: Any, budgets: Sequence[Budget]) -> None:
    """Take the job's weight from each of ``budgets``, all or none; raise BudgetThrottled (a RetryLater) when one is spent.

    Called before the job's body runs (``conveyor.tasks.actors``): a throttled job has done nothing.
    """
    if not budgets:
        return
    takes = [Take(b.key_of(payload), b.limit, b.per, b.weight_of(payload)) for b in budgets]
    waits = budget_store(ctx.app).take(takes)
    wait = max(waits, default=0.0)
    if wait <= 0:
        return
    delay = wait + max(MIN_JITTER, wait * JITTER * random.random())
    refused = [b.name for b, w in zip(budgets, waits) if w > 0]
    from conveyor.middleware.metrics import find_metrics

    metrics = find_metrics(ctx.app.broker)
    if metrics is not None:
        for name in refused:
            metrics.budget_throttled(name, ctx.queue, ctx.job, delay)
    raise BudgetThrottled(f"budget {', '.join(refused)} spent for now; waiting {delay:.2f}s", delay=delay)


def spend(ctx: "JobContext", payload: Any, budgets: Sequence[Budget], name: str, amount: float) -> None:
    """Record ``amount`` of budget ``name`` as used now, under the running job's key (``ctx.spend``)."""
    budget = next((b for b in budgets if b.name == name), None)
    if budget is None:
        raise BudgetUnknown(f"job {ctx.job!r} has no budget {name!r}")
    if not amount > 0:
        return
    budget_store(ctx.app).spend(Take(budget.key_of(payload), budget.limit, budget.per, float(amount)))
