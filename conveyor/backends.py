"""Which broker class each broker name means: the one place a name is looked up.

``CONVEYOR_BROKER`` (or its default, see :attr:`Settings.broker_name`) names a broker; the
row of :data:`BACKENDS` names its class, imported on first use. What goes with the
broker (which store its companions use, whether its workers must live in the producing
process, whether its queue is in Postgres) is the class's own
:class:`~conveyor.brokers.base.Capabilities`, readable without building a broker. Modules
that keep state next to the broker switch on :attr:`Capabilities.store`, never on the
broker's name.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

from conveyor.settings import BrokerName, Settings

if TYPE_CHECKING:
    from conveyor.brokers.base import Capabilities, ConveyorBroker


@dataclass(frozen=True)
class Backend:
    broker: BrokerName
    #: ``module:Class`` of the broker; imported only when its class or capabilities are asked for.
    path: str

    @property
    def broker_class(self) -> type[ConveyorBroker]:
        """The broker's class (its module imported now, once)."""
        module, _, name = self.path.partition(":")
        cls: type[ConveyorBroker] = getattr(importlib.import_module(module), name)
        return cls

    @property
    def capabilities(self) -> Capabilities:
        """What the broker declares it can do (its class's ``capabilities``)."""
        return self.broker_class.capabilities


BACKENDS: dict[BrokerName, Backend] = {
    "redis": Backend("redis", "conveyor.brokers.redis:RedisBroker"),
    "postgres": Backend("postgres", "conveyor.brokers.postgres:PostgresBroker"),
    "inline": Backend("inline", "conveyor.brokers.inline:InlineBroker"),
}


def backend_for(settings: Settings) -> Backend:
    """The backend ``settings`` choose."""
    return BACKENDS[settings.broker_name]
