"""``conveyor migrate``: apply ``migrations/NNNN_*.sql`` in order, each exactly once.

The library's own, then, merged in by number, those of each blueprint the App includes
(``jobs.add_migrations(directory)``: the agent platform's tables come with it, never without it).
Each is recorded by its file name, so numbers are unique across the library and the blueprints.

A transaction-level advisory lock serialises concurrent runs: each
migration is applied in a transaction of its own that takes the lock and
looks again whether it was applied, so two replicas starting at once cannot
both apply one, and no lock outlives its transaction (a session lock would
stay on whichever server connection a transaction-mode pooler such as
PgBouncer gave it).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from conveyor.db import connect, load_queries

if TYPE_CHECKING:
    from conveyor.blueprints import Jobs

MIGRATIONS = Path(__file__).parent / "migrations"
QUERIES = load_queries(Path(__file__).with_name("migrate.sql"))

#: Arbitrary but fixed: the advisory lock id every conveyor migrator takes.
_LOCK_ID = 0x636F6E76  # "conv"

logger = logging.getLogger(__name__)


def migration_directories(blueprints: Iterable[Jobs] = ()) -> list[Path]:
    """The library's migrations directory, then each of ``blueprints``' (once each, in order)."""
    return list(dict.fromkeys([MIGRATIONS, *(d for blueprint in blueprints for d in blueprint.migrations)]))


def migration_files(blueprints: Iterable[Jobs] = ()) -> list[Path]:
    """Every migration of the library and of ``blueprints``, in the order they apply (by number)."""
    directories = migration_directories(blueprints)
    files = sorted((f for d in directories for f in d.glob("[0-9][0-9][0-9][0-9]_*.sql")), key=lambda f: f.name)
    numbers = [f.name[:4] for f in files]
    if len(numbers) != len(set(numbers)):
        clash = sorted({n for n in numbers if numbers.count(n) > 1})
        raise RuntimeError(f"two migrations share a number ({', '.join(clash)}) in {', '.join(map(str, directories))}")
    return files


def migrate(
    database_url: str,
    blueprints: Iterable[Jobs] = (),
    *,
    on_pending: Callable[[list[str]], None] | None = None,
    on_applied: Callable[[str], None] | None = None,
) -> list[str]:
    """Apply pending migrations, the library's and ``blueprints``'; return the names applied by this call.

    ``on_pending`` hears the names about to be applied, in order, once the
    lock is held; ``on_applied`` each name once it is committed:
    ``conveyor migrate`` draws its progress from them.
    """
    applied_now = []
    # No prepared statements (they would not survive a transaction-mode pooler); migrations are rare.
    with connect(database_url, autocommit=True, prepare_threshold=None) as conn:
        with conn.transaction():
            conn.execute(QUERIES["lock"], {"lock": _LOCK_ID})
            conn.execute(QUERIES["create_table"])
            done = {row[0] for row in conn.execute(QUERIES["applied"])}
        pending = [path for path in migration_files(blueprints) if path.name not in done]
        if on_pending:
            on_pending([path.name for path in pending])
        for path in pending:
            with conn.transaction():
                conn.execute(QUERIES["lock"], {"lock": _LOCK_ID})
                if conn.execute(QUERIES["is_applied"], {"name": path.name}).fetchone():
                    continue  # another migrator applied it meanwhile
                conn.execute(path.read_text())
                conn.execute(QUERIES["record"], {"name": path.name})
            logger.info("applied migration %s", path.name)
            applied_now.append(path.name)
            if on_applied:
                on_applied(path.name)
    return applied_now
