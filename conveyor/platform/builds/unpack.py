"""Putting a source tree on disk within caps: unpacking archives and copying directories.

Every way in counts entries and bytes as it writes and stops at
``CONVEYOR_BUILD_MAX_SOURCE_FILES`` / ``CONVEYOR_BUILD_MAX_SOURCE_BYTES``:
a zip's declared sizes are not trusted (each member is copied through a
counter), a tar member's size is its header's, which tarfile enforces. Any
reason a source cannot be used -- missing, not an archive, corrupt, an entry
that climbs out, too large -- raises :class:`SourceUnusable` with one and the
same message, so a build request cannot tell "does not exist" from "not an
archive" about a host file. Corrupt input can never succeed, so it is a
permanent error: the build fails at once instead of being retried.
"""

from __future__ import annotations

import errno
import lzma
import os
import shutil
import tarfile
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from conveyor.platform.builds.builder import Deadline
from conveyor.platform.builds.paths import inside
from conveyor.platform.errors import SourceUnusable, UnsafePath

#: The one answer to every unusable source.
UNUSABLE = (
    "the build's source cannot be used: give an uploaded archive (upload_id), or an archive, directory "
    "or git repository under CONVEYOR_BUILD_SOURCE_ROOTS that is within the size limits"
)

_CHUNK = 1 << 20


@dataclass(frozen=True)
class Caps:
    """How much one source tree may hold."""

    max_bytes: int
    max_files: int


class _Counter:
    def __init__(self, caps: Caps) -> None:
        self.caps, self.bytes, self.files = caps, 0, 0

    def entry(self) -> None:
        self.files += 1
        if self.files > self.caps.max_files:
            raise SourceUnusable(UNUSABLE)

    def add(self, n: int) -> None:
        self.bytes += n
        if self.bytes > self.caps.max_bytes:
            raise SourceUnusable(UNUSABLE)


#: OSErrors that say something about this host, not the archive: a retry (elsewhere, later) may succeed.
TRANSIENT_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.ENOMEM, errno.EMFILE, errno.ENFILE})


def _format_error(exc: BaseException) -> bool:
    """True for what a corrupt or hostile archive raises; False for the host's own trouble (a full disk).

    An OSError without errno is a codec's (gzip, bz2); one with errno is the archive's too
    (a name too long, a file where a directory must be) unless it is in :data:`TRANSIENT_ERRNOS`.
    """
    if isinstance(
        exc,
        (
            zipfile.BadZipFile,
            tarfile.TarError,
            zlib.error,
            lzma.LZMAError,
            EOFError,
            NotImplementedError,
            ValueError,
            UnsafePath,
        ),
    ):
        return True
    return isinstance(exc, OSError) and exc.errno not in TRANSIENT_ERRNOS


def unpack(archive: Path, dest: Path, caps: Caps, deadline: Deadline) -> None:
    """Unpack a zip or tar archive (gz, bz2, xz) into ``dest``, which must not exist."""
    if not archive.is_file():
        raise SourceUnusable(UNUSABLE)
    dest.mkdir(parents=True)
    counter = _Counter(caps)
    try:
        if zipfile.is_zipfile(archive):
            _unzip(archive, dest, counter, deadline)
        else:
            _untar(archive, dest, counter, deadline)
    except SourceUnusable:
        raise
    except Exception as exc:
        if _format_error(exc):
            raise SourceUnusable(UNUSABLE) from None
        raise  # the disk, not the archive: a retry may succeed


def _unzip(archive: Path, dest: Path, counter: _Counter, deadline: Deadline) -> None:
    with zipfile.ZipFile(archive) as zf:
        for member in zf.infolist():
            deadline.check()
            counter.entry()
            parts = _parts(member.filename)
            target = inside(dest, *parts)
            if member.is_dir():
                target.mkdir(parents=True, exist_ok=True)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            with zf.open(member) as src, open(target, "wb") as out:
                # Count what comes out, not what the header says.
                while chunk := src.read(_CHUNK):
                    counter.add(len(chunk))
                    out.write(chunk)


def _untar(archive: Path, dest: Path, counter: _Counter, deadline: Deadline) -> None:
    with tarfile.open(archive) as tf:
        # Iterated, not getmembers(): a tar of a million empty entries stops at the cap.
        for member in tf:
            deadline.check()
            counter.entry()
            counter.add(member.size)
            # The "data" filter refuses absolute paths, "..", device files and links out of dest.
            tf.extract(member, dest, filter="data")


def _parts(name: str) -> tuple[str, ...]:
    path = PurePosixPath(name)
    if path.is_absolute() or ".." in path.parts or not path.parts or "\x00" in name:
        raise SourceUnusable(UNUSABLE)
    return path.parts


def copy_tree(src: Path, dest: Path, caps: Caps, deadline: Deadline) -> None:
    """Copy the directory ``src`` (links as links, without .git) into ``dest``, which must not exist."""
    if not src.is_dir():
        raise SourceUnusable(UNUSABLE)
    counter = _Counter(caps)
    dest.mkdir(parents=True)
    for dirpath, dirnames, filenames in os.walk(src):
        dirnames[:] = [d for d in dirnames if d != ".git"]
        here = Path(dirpath)
        there = dest / here.relative_to(src)
        for name in dirnames + filenames:
            deadline.check()
            counter.entry()
            source, target = here / name, there / name
            if source.is_symlink():
                os.symlink(os.readlink(source), target)
                if name in dirnames:
                    dirnames.remove(name)  # a linked directory is the link, not its content
            elif name in dirnames:
                target.mkdir()
            elif source.is_file():
                counter.add(source.stat().st_size)
                shutil.copyfile(source, target)
                os.chmod(target, source.stat().st_mode & 0o777)  # no setuid, setgid or sticky bits
            # sockets, fifos and devices are not source code: left out


def check_tree(tree: Path, caps: Caps) -> None:
    """Raise :class:`SourceUnusable` when ``tree`` (a fresh clone, say) is past the caps."""
    counter = _Counter(caps)
    for dirpath, dirnames, filenames in os.walk(tree):
        for name in dirnames + filenames:
            counter.entry()
            path = Path(dirpath) / name
            if path.is_file() and not path.is_symlink():
                counter.add(path.stat().st_size)
