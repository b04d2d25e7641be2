"""Paths made from requests: names that cannot climb out, and one check that a path stays under its root.

Every value that becomes part of a path on the build host is either made by
the server (a UUID) or matches :data:`SAFE_NAME` (no dots, no slashes), and
every path built from one goes through :func:`inside`, which resolves it
(symlinks included) and refuses anything that is not strictly below its
root. A build id of ``..`` once made the workspace the data directory
itself, and cleaning it up removed everything in it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated

from pydantic import StringConstraints

from conveyor.platform.errors import UnsafePath

#: A name that is safe as one path component: letters, digits, ``_`` and ``-``; never ``.`` or ``/``.
SAFE_NAME = r"^[A-Za-z0-9_-]{1,128}$"

#: A request value that becomes a directory or file name (a build id).
SafeName = Annotated[str, StringConstraints(min_length=1, max_length=128, pattern=SAFE_NAME)]

_SAFE = re.compile(SAFE_NAME)


def safe_name(value: str, what: str) -> str:
    """``value`` when it matches :data:`SAFE_NAME`; raises :class:`UnsafePath` naming ``what``, never the value."""
    if not isinstance(value, str) or not _SAFE.fullmatch(value):
        raise UnsafePath(f"{what} may hold only letters, digits, '_' and '-'")
    return value


def inside(root: Path, *parts: str) -> Path:
    """``root / parts``, resolved, when it lies strictly under the resolved ``root``; else :class:`UnsafePath`."""
    base = Path(root).resolve()
    path = base.joinpath(*parts).resolve()
    if path == base or not path.is_relative_to(base):
        raise UnsafePath("a path would leave the directory it belongs in")
    return path


def under_roots(path: str | Path, roots: Iterable[Path]) -> Path | None:
    """``path`` resolved, when it is absolute and lies under (or is) one of ``roots``; else None."""
    candidate = Path(path)
    if not candidate.is_absolute():
        return None
    resolved = candidate.resolve()
    for root in roots:
        base = Path(root).resolve()
        if resolved == base or resolved.is_relative_to(base):
            return resolved
    return None
