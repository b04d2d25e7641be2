"""The builder interface: fetch a source, run its build script, package it as a content-addressed artifact.

:class:`~conveyor.platform.builds.local.LocalBuilder` is the real implementation on
this host's disk. Another builder (a remote BuildKit, object storage for
artifacts) implements the same five methods; the agent.build processor and
its executors only talk to this interface.
"""

from __future__ import annotations

import threading
import time
from abc import ABC, abstractmethod
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path

from conveyor.platform.errors import BuildTimeout
from conveyor.redaction import Scrubber

#: A build's log keeps its last this many characters (the builds row is not a log store).
LOG_LIMIT = 64 * 1024


@dataclass(frozen=True)
class UploadSource:
    """An archive stored by the upload route, named by its server-made id."""

    upload_id: str


@dataclass(frozen=True)
class ArchiveSource:
    """An archive on the build host (under a configured root): .zip, .tar, .tar.gz, .tgz, .tar.bz2, .tar.xz."""

    path: str


@dataclass(frozen=True)
class DirectorySource:
    """A directory on the build host."""

    path: str


@dataclass(frozen=True)
class GitSource:
    """A git repository; ``ref`` is a branch or tag (None: the default branch)."""

    url: str
    ref: str | None = None


Source = UploadSource | ArchiveSource | DirectorySource | GitSource


@dataclass(frozen=True)
class Artifact:
    """A packaged build, named by the sha256 of its bytes."""

    sha256: str
    path: Path
    size: int


class Deadline:
    """A variant's time limit, checked between steps and handed to subprocesses as their timeout."""

    def __init__(self, seconds: float, kind: str) -> None:
        self.seconds = seconds
        self.kind = kind
        self._end = time.monotonic() + seconds

    def remaining(self) -> float:
        """Seconds left; raises :class:`BuildTimeout` when there are none."""
        left = self._end - time.monotonic()
        if left <= 0:
            raise BuildTimeout(f"{self.kind} build exceeded its time limit of {self.seconds:g}s")
        return left

    def check(self) -> None:
        self.remaining()


class BuildLog:
    """A build's log: thread-safe, bounded, every secret value scrubbed before it is stored.

    ``scrubber`` knows every settings secret and the build's env values
    (:meth:`Scrubber.for_settings`); :meth:`mask` applies it to any other
    text the build stores (its error, its events).
    """

    def __init__(self, scrubber: Scrubber | None = None) -> None:
        self._scrubber = scrubber or Scrubber()
        self._lock = threading.Lock()
        self._text = ""

    def mask(self, text: str) -> str:
        """``text`` with every secret value replaced by ``[redacted]``."""
        return self._scrubber(text) or ""

    def write(self, line: str) -> None:
        line = self.mask(line.rstrip("\n")) + "\n"
        with self._lock:
            self._text = (self._text + line)[-LOG_LIMIT:]

    @property
    def text(self) -> str:
        with self._lock:
            return self._text

    def tail(self, lines: int = 20) -> str:
        return "\n".join(self.text.splitlines()[-lines:])


class Builder(ABC):
    """Turns sources into artifacts. Every method honours ``deadline`` and writes what it does to ``log``."""

    @abstractmethod
    def workspace(self, build_id: str, claim: int) -> AbstractContextManager[Path]:
        """A fresh, empty working directory for one claim of a build, removed afterwards."""

    @abstractmethod
    def fetch(self, source: Source, dest: Path, deadline: Deadline, log: BuildLog) -> str | None:
        """Put the source tree in ``dest`` (which must not exist); return the git commit when there is one."""

    @abstractmethod
    def run_build_script(self, tree: Path, env: dict[str, str], deadline: Deadline, log: BuildLog) -> None:
        """Run the tree's build script, if it has one, with ``env``; a failing script raises BuildFailed."""

    @abstractmethod
    def package(self, tree: Path, deadline: Deadline, log: BuildLog) -> Artifact:
        """Package ``tree`` reproducibly; the same tree always gives the same sha256."""

    @abstractmethod
    def artifact(self, sha256: str) -> Artifact | None:
        """The stored artifact with this digest, or None."""
