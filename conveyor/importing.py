"""Importing a user's job modules from where the command was started (``--path``, ``CONVEYOR_PATH``).

Celery's ``-A``, Dramatiq's ``--path`` and RQ's ``--path`` do the same: the console script's
own ``sys.path`` holds its bin directory, not the directory the user stands in.
"""

from __future__ import annotations

import importlib
import os
import sys
from types import ModuleType
from typing import Iterable

from conveyor.errors import ConfigurationError, JobModuleNotFound


def add_paths(paths: Iterable[str]) -> list[str]:
    """Put ``paths`` (made absolute) first on ``sys.path``, in order, once each; return them.

    Spawned worker processes inherit the parent's ``sys.path`` (multiprocessing passes it),
    and :func:`conveyor.app.run_worker_process` applies ``CONVEYOR_PATH`` again besides.
    """
    added = [os.path.abspath(p) for p in paths]
    for path in reversed(added):
        if path in sys.path:
            sys.path.remove(path)
        sys.path.insert(0, path)
    return added


def import_job_module(name: str, paths: Iterable[str] = ()) -> ModuleType:
    """Import ``name``; a module that is not there, or fails while it loads, is one clear error line.

    Only the module itself (or a package above it) missing is :class:`JobModuleNotFound`; a module
    that imports but raises inside (its own missing dependency, a syntax error) names what it raised.
    """
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        parts = name.split(".")
        if exc.name in {".".join(parts[:i]) for i in range(1, len(parts) + 1)}:
            searched = ", ".join(paths) or "the Python path"
            raise JobModuleNotFound(
                f"job module {name!r} (CONVEYOR_IMPORTS) not found; searched {searched} and the installed "
                f"packages (add a directory with --path or CONVEYOR_PATH)"
            ) from None
        raise ConfigurationError(f"job module {name!r} failed to import: {_one_line(exc)}") from None
    except ConfigurationError:
        raise
    except Exception as exc:
        raise ConfigurationError(f"job module {name!r} failed to import: {_one_line(exc)}") from None


def _one_line(exc: BaseException) -> str:
    where = ""
    if isinstance(exc, SyntaxError) and exc.filename:
        where = f" ({exc.filename}, line {exc.lineno})"
    return f"{type(exc).__name__}: {exc}".splitlines()[0] + where
