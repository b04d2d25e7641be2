"""The "environment:" section of ``conveyor --help``, kept in a cache file so --help needs no pydantic.

The section lists every setting with its default, read from the settings model
(:func:`conveyor.settings.env_help`), then, each under its own heading, the
settings of the blueprints an App built from the environment holds
(``jobs.add_settings``: the agent platform's, unless ``CONVEYOR_PLATFORM=false``).
Importing those models costs pydantic and pydantic-settings, about half a
second (and the blueprints' modules more): more than all the rest of ``--help``.
So the text is written once to ``$XDG_CACHE_HOME/conveyor/`` (default
``~/.cache/conveyor/``) and read from there by later calls. Its file name
carries a hash of everything the text depends on — the source of
``conveyor/settings.py``, the conveyor and Python versions, what the data
directory's default is computed from (uid, ``XDG_DATA_HOME``, ``HOME``) and
which blueprints the environment loads (``CONVEYOR_PLATFORM``,
``CONVEYOR_IMPORTS``, ``CONVEYOR_PATH``) — and its first line the digest of
each blueprint settings module's source, checked on every read, so an upgrade
or an edit of any settings is never shown stale. Where the cache cannot be
written (a read-only home), --help computes the text every time.
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


#: The cache file's first line: the blueprint settings modules the text was made from, with their digests.
SOURCES = "#sources"


def environment_help() -> str:
    """The epilog of ``conveyor --help``: one line per variable, with its description and default."""
    key = cache_key()
    path = cache_dir() / f"{PREFIX}{key}.txt"
    try:
        header, _, text = path.read_text(encoding="utf-8").partition("\n")
        if _fresh(header):
            return text
    except (OSError, UnicodeDecodeError):
        pass
    text, sources = _render()
    header = SOURCES + "".join("\t" + source + "\t" + _digest(Path(source)) for source in sources)
    _write(path, header + "\n" + text)
    return text


def render() -> str:
    """The section computed from the settings models (imports pydantic and the blueprints' modules)."""
    return _render()[0]


def _render() -> tuple[str, list[str]]:
    """The text, and the source files of the blueprint settings classes it lists."""
    from conveyor.app import environment_blueprints
    from conveyor.settings import env_help

    def lines(rows: list[tuple[str, str]]) -> str:
        return "\n".join(f"  {name:<34} {text}" for name, text in rows)

    sections = ["environment:\n" + lines(env_help())]
    sources: list[str] = []
    seen: list[type] = []
    for blueprint in environment_blueprints():
        for model, title in blueprint.settings_classes:
            if any(model is known for known in seen):
                continue
            seen.append(model)
            sections.append(f"environment of {title}:\n" + lines(env_help(model)))
            source = getattr(sys.modules.get(model.__module__), "__file__", None)
            sources.append(source or "")
    return "\n\n".join(sections), sources


def _digest(path: Path) -> str:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()[:16]
    except OSError:  # no source to compare (a zipped install): never the same twice
        return os.urandom(8).hex()


def _fresh(header: str) -> bool:
    """Whether every blueprint settings module the cached text lists is still the source it was made from."""
    if not header.startswith(SOURCES):
        return False
    parts = header[len(SOURCES) :].split("\t")[1:]
    return len(parts) % 2 == 0 and all(_digest(Path(p)) == d for p, d in zip(parts[::2], parts[1::2]))


def cache_key() -> str:
    """A hash of every input of :func:`render` (see the module doc)."""
    digest = hashlib.sha256()
    try:
        digest.update(SETTINGS_SOURCE.read_bytes())
    except OSError:  # no source beside the package (a zipped install): a key that never matches twice
        digest.update(os.urandom(16))
    # Which blueprints an App built from the environment holds (whose settings the text lists too).
    imports = os.environ.get("CONVEYOR_IMPORTS", "")
    chosen = [os.environ.get(name, "") for name in ("CONVEYOR_PLATFORM", "CONVEYOR_PATH")]
    where = os.getcwd() if imports.strip() else ""  # a module of CONVEYOR_IMPORTS may be found from here
    for part in (
        __version__,
        sys.version,
        str(os.geteuid()),
        os.environ.get("XDG_DATA_HOME", ""),
        str(Path.home()),
        imports,
        *chosen,
        where,
    ):
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
