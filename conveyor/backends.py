"""What each broker name means for everything that goes with it: the one place a backend is chosen.

``CONVEYOR_BROKER`` (or its default, see :attr:`Settings.broker_name`) names a broker; the
row of :data:`BACKENDS` says which store the broker's companions use (a run's stream
buffer, the fleet-wide limits), whether its workers must live in the producing process,
and whether its queue is in Postgres (so the schema is migrated before workers start).
Modules that keep state next to the broker switch on :attr:`Backend.store`, never on the
broker's name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from conveyor.settings import BrokerName, Settings

Store = Literal["redis", "postgres", "memory"]


@dataclass(frozen=True)
class Backend:
    broker: BrokerName
    #: Where state that goes with the broker lives: Redis, the database, or this process's memory.
    store: Store
    #: True when workers must run inside the process that enqueues (the inline broker).
    in_process: bool
    #: True when the broker's queue is a Postgres table: migrate before any worker starts.
    queue_in_postgres: bool


BACKENDS: dict[BrokerName, Backend] = {
    "redis": Backend("redis", "redis", in_process=False, queue_in_postgres=False),
    "postgres": Backend("postgres", "postgres", in_process=False, queue_in_postgres=True),
    "inline": Backend("inline", "memory", in_process=True, queue_in_postgres=False),
}


def backend_for(settings: Settings) -> Backend:
    """The backend ``settings`` choose."""
    return BACKENDS[settings.broker_name]
