"""A budget (a weighted rate limit kept fleet-wide) and the interface of the stores that keep it.

Every store keeps a sliding-window log per key: the weights admitted or spent
in the last ``per`` seconds, each with the time it was taken on the store
server's clock. A job of weight ``w`` is admitted when the window's sum ``s``
is below the limit and ``s + w`` stays within it; a job heavier than the whole
limit is admitted alone, into an empty window. So the weight admitted in any
window of ``per`` seconds is at most ``limit`` (``limit`` plus that one job's
weight for a job heavier than the limit); what jobs report after the fact
(``ctx.spend``) is added on top and delays the jobs that follow.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Callable, Sequence

#: A budget name: it becomes part of Redis keys, rows and metric labels.
BUDGET_NAME = re.compile(r"^[a-z][a-z0-9_.-]{0,63}$")

#: Longest key value kept (a key taken from a payload is the caller's; a longer one is cut).
MAX_KEY_CHARS = 200

#: The longest window (s): the Postgres store prunes rows older than a day, whatever their key.
MAX_PER = 24 * 3600.0

#: Where a key or weight comes from: a payload field's name, or a function of the payload.
FromPayload = str | Callable[[Any], Any]


@dataclass(frozen=True)
class Budget:
    """At most ``limit`` units of weight per ``per`` seconds, per value of ``key``, across the fleet.

    ``key``: a payload field's name or a function of the payload (``lambda p: p.provider_key``);
    None: one budget for every job that declares it. ``weight``: a field's name, a function,
    a number, or None for 1 per job (a request count). A weight of 0 admits a job while the window is
    not full; the job then reports what it used with ``ctx.spend(name, amount)``.
    """

    name: str
    limit: float
    per: float = 60.0
    key: FromPayload | None = None
    weight: FromPayload | float | None = None

    def __post_init__(self) -> None:
        if not BUDGET_NAME.match(self.name):
            raise ValueError(f"budget name {self.name!r} must match {BUDGET_NAME.pattern}")
        if not self.limit > 0 or not 0 < self.per <= MAX_PER:
            raise ValueError(f"budget {self.name!r}: limit must be > 0 and per within (0, {MAX_PER:g}] seconds")

    def key_of(self, payload: Any) -> str:
        """The budget's key for ``payload``: ``name`` alone, or ``name:<key value>``."""
        if self.key is None:
            return self.name
        value = _read(self.key, payload)
        return f"{self.name}:{str(value)[:MAX_KEY_CHARS]}"

    def weight_of(self, payload: Any) -> float:
        """What admitting ``payload``'s job takes from the budget (>= 0)."""
        if self.weight is None:
            return 1.0
        raw = self.weight if isinstance(self.weight, (int, float)) else _read(self.weight, payload)
        value = float(raw or 0)
        if value < 0 or value != value:
            raise ValueError(f"budget {self.name!r}: weight must be a number >= 0")
        return value


def _read(source: FromPayload, payload: Any) -> Any:
    return getattr(payload, source) if isinstance(source, str) else source(payload)


@dataclass(frozen=True)
class Take:
    """One budget's part of an admission: its store key, limit, window and the weight asked for."""

    key: str
    limit: float
    per: float
    weight: float


@dataclass(frozen=True)
class KeyUsage:
    """What one key of a budget holds in its window now: the store key (``name`` or ``name:<value>``)."""

    key: str
    used: float


@dataclass(frozen=True)
class BudgetUsage:
    """A budget's keys with weight in their window, most used first (at most the limit asked for).

    ``total`` counts every such key; ``capped``: the store stopped looking after :data:`MAX_USAGE_KEYS`
    keys, so ``total`` is a lower bound.
    """

    keys: list[KeyUsage]
    total: int
    capped: bool = False


#: Most keys of one budget a usage read looks through (a key per user can mean very many).
MAX_USAGE_KEYS = 10_000


def key_prefix(name: str) -> str:
    """What the store keys of budget ``name``'s key values start with (:meth:`Budget.key_of`)."""
    return f"{name}:"


class BudgetStore(ABC):
    """Keeps the windows. Both calls are atomic across the fleet, on the store server's clock."""

    @abstractmethod
    def take(self, takes: Sequence[Take]) -> list[float]:
        """Admit all of ``takes`` or none: all zeros when admitted (each weight recorded), else the
        seconds each refusing budget needs before it would admit (0 for those that would)."""

    @abstractmethod
    def spend(self, take: Take) -> None:
        """Record ``take.weight`` as used now, whatever the window holds (reported after the fact)."""

    @abstractmethod
    def usage(self, name: str, per: float, limit: int) -> BudgetUsage:
        """The keys of budget ``name`` (windows of ``per`` s) with weight in their window now, the
        ``limit`` most used first: a read, on the store server's clock."""

    def close(self) -> None:
        """Release connections of its own."""


def admits(total: float, weight: float, limit: float) -> bool:
    """The admission rule (every store implements the same): below the limit, and within it after ``weight``
    unless the window is empty."""
    return total < limit and (total <= 0 or total + weight <= limit)
