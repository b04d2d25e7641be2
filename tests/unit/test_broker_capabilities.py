"""The broker contract's one declaration: each broker class's Capabilities, read by everything else.

No servers: the classes are read, and the inline broker is built; what the redis and
postgres brokers build is run by tests/integration (fleet, rollup) and tests/contract.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path
from typing import get_args

import pytest

import conveyor
from conveyor import App
from conveyor.backends import BACKENDS
from conveyor.brokers.base import Capabilities, ConveyorBroker, Store
from conveyor.brokers.fleet import fleet_store, recovery_after, store_without_broker
from conveyor.brokers.fleet.memory_store import MemoryFleetStore
from conveyor.brokers.rollup import rollup_store
from conveyor.brokers.rollup.memory_store import MemoryRollupStore
from conveyor.errors import ConfigurationError
from conveyor.inspector import Inspector
from conveyor.settings import Settings


@pytest.mark.parametrize("name", list(BACKENDS))
def test_each_broker_class_declares_capabilities_its_methods_keep(name):
    cls = BACKENDS[name].broker_class  # type: ignore[index]
    caps = cls.capabilities
    assert isinstance(caps, Capabilities) and caps.store in get_args(Store)
    # The transactional capabilities are the methods the Protocols describe, no more and no less.
    assert caps.transactional_completion == (hasattr(cls, "complete_in") and hasattr(cls, "completed_in_transaction"))
    assert caps.transactional_enqueue == ("connection" in inspect.signature(cls.enqueue_jobs).parameters)
    # Every broker builds itself from the settings, and its own companion stores.
    assert cls.from_settings.__func__ is not ConveyorBroker.from_settings.__func__
    assert cls.fleet_store is not ConveyorBroker.fleet_store
    assert cls.rollup_store is not ConveyorBroker.rollup_store


def test_the_inline_broker_builds_its_stores_in_memory_and_has_no_lease():
    app = App(Settings(broker="inline", database_url="postgresql://unused/db"))
    try:
        assert app.capabilities is type(app.broker).capabilities
        assert isinstance(fleet_store(app), MemoryFleetStore) and fleet_store(app) is fleet_store(app)
        assert isinstance(rollup_store(app), MemoryRollupStore) and rollup_store(app) is rollup_store(app)
        assert store_without_broker(app) is None
        assert recovery_after(app) is None
        # Declared on the base, not probed for: a broker with nothing to warn about says so.
        assert Inspector(app).config_warnings() == [] and app.broker.config_warning_reasons() == {}
    finally:
        app.close()


@pytest.mark.parametrize(("name", "lease"), [("redis", 30.0), ("postgres", 45.0)])
def test_a_broker_with_recovery_leases_workers_for_its_own_setting(name, lease):
    settings = Settings(
        broker=name, redis_url="redis://unused:1", database_url="postgresql://unused/db", heartbeat_timeout=30.0,
        pg_lease_seconds=45.0,
    )  # fmt: skip
    app = App(settings)
    try:
        assert recovery_after(app) == lease
    finally:
        app.close()


#: The one module that may compare the broker's name: the settings (a leaf, it imports no broker: it picks
#: which of its own values is the lease). The App builds ``backends``' class for the name (from_settings);
#: everything else reads the capabilities.
MAY_NAME_THE_BROKER = {"settings.py"}


def _name_comparisons(tree: ast.AST) -> list[int]:
    """Lines comparing ``….broker_name`` or ``….backend.broker`` with a string."""
    lines = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare):
            continue
        sides = [node.left, *node.comparators]
        names = [
            s
            for s in sides
            if isinstance(s, ast.Attribute)
            and (s.attr == "broker_name" or (s.attr == "broker" and getattr(s.value, "attr", None) == "backend"))
        ]
        strings = [s for s in sides if isinstance(s, ast.Constant) and isinstance(s.value, str)]
        if names and strings:
            lines.append(node.lineno)
    return lines


def test_nothing_outside_the_composition_root_branches_on_the_broker_name():
    root = Path(conveyor.__file__).parent
    found = {}
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root).as_posix()
        if relative in MAY_NAME_THE_BROKER:
            continue
        lines = _name_comparisons(ast.parse(path.read_text(), relative))
        if lines:
            found[relative] = lines
    assert found == {}, "branch on the broker's Capabilities (conveyor.brokers.base), not its name"


def test_the_redis_broker_refuses_to_build_without_redis_url():
    app = App(Settings(broker="redis", database_url="postgresql://unused/db"))
    try:
        with pytest.raises(ConfigurationError, match="needs REDIS_URL"):
            app.broker
    finally:
        app.close()
