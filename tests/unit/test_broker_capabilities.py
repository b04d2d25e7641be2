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


def _names_the_broker(node: ast.AST, aliases: set[str]) -> bool:
    """``….broker_name``, ``….broker`` (Settings' field, a Backend's), or a variable assigned one of them."""
    if isinstance(node, ast.Attribute):
        return node.attr in ("broker_name", "broker")
    return isinstance(node, ast.Name) and node.id in aliases


def _strings(node: ast.AST) -> bool:
    """A string, or a tuple, list or set holding one (``in ("redis", "postgres")``)."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str)
    return isinstance(node, (ast.Tuple, ast.List, ast.Set)) and any(_strings(e) for e in node.elts)


def _name_comparisons(tree: ast.AST) -> list[int]:
    """Lines comparing the broker's name with a string (``==``, ``!=``, ``in``) or matching it against one."""
    aliases = {
        target.id
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign) and _names_the_broker(node.value, set())
        for target in node.targets
        if isinstance(target, ast.Name)
    }
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(_names_the_broker(s, aliases) for s in sides) and any(_strings(s) for s in sides):
                lines.append(node.lineno)
        elif isinstance(node, ast.Match) and _names_the_broker(node.subject, aliases):
            lines.append(node.lineno)
    return lines


def test_the_name_scan_sees_every_way_of_branching_on_the_name():
    source = """
if settings.broker_name == "redis": ...
if app.settings.broker != "inline": ...
if backend.broker in ("redis", "postgres"): ...
name = settings.broker_name
if name == "postgres": ...
match settings.broker_name:
    case "redis": ...
print(settings.broker_name)
if app.capabilities.in_process: ...
"""
    assert sorted(_name_comparisons(ast.parse(source))) == [2, 3, 4, 6, 7]


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


#: Private names a broker module may read on an object other than ``self``, with why. Dramatiq's
#: MessageProxy keeps its message in ``_message`` and offers no public way to it (see base.as_message).
FOREIGN_PRIVATES_ALLOWED = {"_message"}


def _foreign_private_uses(tree: ast.AST) -> list[str]:
    """``x._name`` where x is not ``self``, ``cls`` or ``super()``: one object reaching into another's
    private members (the Redis consumer calling ten of the Redis broker's, before issue 19)."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute) or not node.attr.startswith("_") or node.attr.startswith("__"):
            continue
        owner = node.value
        if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
            continue
        if isinstance(owner, ast.Call) and isinstance(owner.func, ast.Name) and owner.func.id == "super":
            continue
        if node.attr not in FOREIGN_PRIVATES_ALLOWED:
            found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_broker_module_uses_another_objects_private_members():
    """A consumer uses its broker's public contract only (the Postgres broker's shape, issue 19.6)."""
    root = Path(conveyor.__file__).parent / "brokers"
    found = {}
    for path in sorted(root.rglob("*.py")):
        uses = _foreign_private_uses(ast.parse(path.read_text(), str(path)))
        if uses:
            found[path.relative_to(root).as_posix()] = uses
    assert found == {}, "use the other class's public, documented members"


def test_the_private_use_scan_sees_a_consumer_calling_its_brokers_private_method():
    source = "class C:\n    def ack(self):\n        self.broker._settle(1)\n        self._own()\n        super()._x()\n"
    assert _foreign_private_uses(ast.parse(source)) == ["3: self.broker._settle"]
