"""The "environment:" section of ``conveyor --help``, kept in a cache file so --help needs no pydantic.

The section lists every setting with its default, read from the settings model
(:func:`conveyor.settings.env_help`). Importing that model costs pydantic and
pydantic-settings, about half a second: more than all the rest of ``--help``.
So the text is written once to ``$XDG_CACHE_HOME/conveyor/`` (default
``~/.cache/conveyor/``) and read from there by later calls. Its file name
carries a hash of everything the text depends on — the source of
``conveyor/settings.py``, the conveyor and Python versions, and what the data
directory's default is computed from (uid, ``XDG_DATA_HOME``, ``HOME``) — so
an upgrade or an edit of the settings is never shown stale. Where the cache
cannot be written (a read-only home), --help computes the text every time.
"""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

from conveyor.version import __version__

#: The settings module whose source the cache key hashes.
SETTINGS_SOURCE = Path(__file__).resolve().parent.parent / "settings.py"

#: Cache files are named ``env-help-<key>.txt``; others of that prefix are older keys', removed on write.
PREFIX = "env-help-"


def environment_help() -> str:
    """The epilog of ``conveyor --help``: one line per variable, with its description and default."""
    key = cache_key()
    path = cache_dir() / f"{PREFIX}{key}.txt"
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        pass
    text = render()
    _write(path, text)
    return text


def render() -> str:
    """The section computed from the settings model (imports pydantic)."""
    from conveyor.settings import env_help

    return "environment:\n" + "\n".join(f"  {name:<34} {text}" for name, text in env_help())


def cache_key() -> str:
    """A hash of every input of :func:`render` (see the module doc)."""
    digest = hashlib.sha256()
    try:
        digest.update(SETTINGS_SOURCE.read_bytes())
    except OSError:  # no source beside the package (a zipped install): a key that never matches twice
        digest.update(os.urandom(16))
    for part in (__version__, sys.version, str(os.geteuid()), os.environ.get("XDG_DATA_HOME", ""), str(Path.home())):
        digest.update(b"\0" + part.encode("utf-8", "surrogateescape"))
    return digest.hexdigest()[:16]


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "conveyor"


def _write(path: Path, text: str) -> None:
    """Write the cache file whole (a temporary file renamed), drop older keys' files; never fail --help."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f".{path.name}.{os.getpid()}")
        partial.write_text(text, encoding="utf-8")
        os.replace(partial, path)
        for old in path.parent.glob(f"{PREFIX}*.txt"):
            if old != path:
                old.unlink(missing_ok=True)
    except OSError:
        pass
