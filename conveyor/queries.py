"""Named SQL queries, read from a module's ``.sql`` file once, at import.

Apart from :mod:`conveyor.db` because it imports nothing: a module that owns queries loads them at
import without pulling in psycopg, so a worker whose jobs never touch Postgres (on the Redis broker)
does not hold the driver (~10 MiB per process; see docs/bench.md, "Memory").
"""

from __future__ import annotations

import re
from pathlib import Path

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
