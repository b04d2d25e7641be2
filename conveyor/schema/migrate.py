"""``conveyor migrate``: apply ``migrations/NNNN_*.sql`` in order, each exactly once.

A transaction-level advisory lock serialises concurrent runs: each
migration is applied in a transaction of its own that takes the lock and
looks again whether it was applied, so two replicas starting at once cannot
both apply one, and no lock outlives its transaction (a session lock would
stay on whichever server connection a transaction-mode pooler such as
PgBouncer gave it).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from conveyor.db import connect, load_queries

MIGRATIONS = Path(__file__).parent / "migrations"
QUERIES = load_queries(Path(__file__).with_name("migrate.sql"))

#: Arbitrary but fixed: the advisory lock id every conveyor migrator takes.
_LOCK_ID = 0x636F6E76  # "conv"

logger = logging.getLogger(__name__)


def migration_files() -> list[Path]:
    files = sorted(MIGRATIONS.glob("[0-9][0-9][0-9][0-9]_*.sql"))
    numbers = [f.name[:4] for f in files]
    if len(numbers) != len(set(numbers)):
        raise RuntimeError(f"two migrations share a number in {MIGRATIONS}")
    return files


def migrate(
    database_url: str,
    *,
    on_pending: Callable[[list[str]], None] | None = None,
    on_applied: Callable[[str], None] | None = None,
) -> list[str]:
    """Apply pending migrations; return the names applied by this call.

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
        pending = [path for path in migration_files() if path.name not in done]
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
