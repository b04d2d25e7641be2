"""Postgres access shared by the ledger and the Postgres broker: pools and named queries.

SQL lives in ``.sql`` files beside the module that runs it, as named
blocks (``-- name: consume``), loaded once at import.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import psycopg
from psycopg_pool import ConnectionPool

from conveyor.errors import DatabaseUnavailable

_NAME = re.compile(r"^--\s*name:\s*([\w.]+)\s*$", re.MULTILINE)


def load_queries(path: Path) -> dict[str, str]:
    """Parse a file of ``-- name: x`` blocks into {name: sql}."""
    text = path.read_text()
    parts = _NAME.split(text)
    queries = {}
    for name, body in zip(parts[1::2], parts[2::2]):
        sql = body.strip()
        if name in queries:
            raise ValueError(f"{path}: query {name!r} defined twice")
        queries[name] = sql
    return queries


def open_pool(
    url: str, *, min_size: int = 1, max_size: int = 20, name: str = "conveyor"
) -> ConnectionPool[psycopg.Connection[Any]]:
    """An autocommit pool; callers open ``conn.transaction()`` where they need one.

    No ping on checkout (it would add a round trip to every query): a
    connection broken by a server restart fails once, the job retries, and
    the pool discards it.
    """
    pool = ConnectionPool(
        url,
        min_size=min_size,
        max_size=max_size,
        name=name,
        open=False,
        kwargs={"autocommit": True},
        reconnect_timeout=60,
    )
    try:
        pool.open(wait=True, timeout=30)
    except psycopg.Error as exc:
        raise DatabaseUnavailable(f"cannot connect to Postgres: {exc}") from exc
    except Exception as exc:  # psycopg_pool.PoolTimeout
        pool.close()
        raise DatabaseUnavailable(f"cannot connect to Postgres: {exc}") from exc
    return pool


def connect(url: str, **kwargs: Any) -> psycopg.Connection[Any]:
    """One connection, with connection errors translated."""
    try:
        return psycopg.connect(url, **kwargs)
    except psycopg.OperationalError as exc:
        raise DatabaseUnavailable(f"cannot connect to Postgres: {exc}") from exc
