"""Uploaded archives: streamed to ``<data_dir>/uploads`` under a server-made id, never held whole in memory.

The upload route writes chunks as they arrive through :meth:`Uploads.writer`;
past ``CONVEYOR_UPLOAD_MAX_BYTES`` the partial file is removed and nothing is
stored. A finished upload is checked to be a zip (its central directory
opens) and renamed into place in one step, so a build only ever sees a whole
file. Builds name uploads by id (``upl_`` and 32 hex digits), and the path is
made from the id through :func:`~conveyor.platform.builds.paths.inside`.
"""

from __future__ import annotations

import os
import re
import time
import uuid
import zipfile
from pathlib import Path
from typing import Annotated

from pydantic import StringConstraints

from conveyor.platform.builds.paths import inside
from conveyor.platform.builds.unpack import UNUSABLE
from conveyor.platform.errors import SourceUnusable, UploadRefused, UploadTooLarge

UPLOAD_ID = r"^upl_[0-9a-f]{32}$"

#: Seconds after which a partial upload is taken to be abandoned (its writer died): an upload
#: streaming for an hour would be a 100 MB upload at 28 kB/s.
PART_MAX_AGE = 3600

#: An upload's id as a payload field.
UploadId = Annotated[str, StringConstraints(pattern=UPLOAD_ID)]

_ID = re.compile(UPLOAD_ID)


class Uploads:
    """The uploads directory of one data directory."""

    def __init__(self, data_dir: Path) -> None:
        self.root = Path(data_dir).expanduser().resolve() / "uploads"

    def path(self, upload_id: str) -> Path:
        """Where an upload is stored; :class:`SourceUnusable` for an id the server could not have made."""
        if not isinstance(upload_id, str) or not _ID.fullmatch(upload_id):
            raise SourceUnusable(UNUSABLE)
        self.root.mkdir(parents=True, exist_ok=True)
        return inside(self.root, upload_id)

    def writer(self, max_bytes: int) -> "UploadWriter":
        self.root.mkdir(parents=True, exist_ok=True)
        self._sweep()
        return UploadWriter(self, max_bytes)

    def _sweep(self) -> None:
        """Remove partial files an API process left when it died mid-upload (older than :data:`PART_MAX_AGE`)."""
        cutoff = time.time() - PART_MAX_AGE
        for part in self.root.glob(".part-*"):
            try:
                if part.stat().st_mtime < cutoff:
                    part.unlink()
            except FileNotFoundError:
                pass

    def remove(self, upload_id: str) -> None:
        """Drop an upload once its build has ended (a missing one is fine)."""
        try:
            self.path(upload_id).unlink(missing_ok=True)
        except SourceUnusable:
            pass


class UploadWriter:
    """One upload being received: :meth:`write` chunks, then :meth:`finish` (or :meth:`abort`)."""

    def __init__(self, uploads: Uploads, max_bytes: int) -> None:
        self.uploads, self.max_bytes, self.size = uploads, max_bytes, 0
        self.upload_id = f"upl_{uuid.uuid4().hex}"
        self._tmp = inside(uploads.root, f".part-{uuid.uuid4().hex}")
        self._file = open(self._tmp, "xb")

    def write(self, chunk: bytes) -> None:
        """Append a chunk; :class:`UploadTooLarge` (and nothing kept) past the cap."""
        self.size += len(chunk)
        if self.size > self.max_bytes:
            self.abort()
            raise UploadTooLarge(f"file: the upload is larger than {self.max_bytes} bytes")
        self._file.write(chunk)

    def finish(self) -> str:
        """Check the upload is a zip archive and store it; its id. :class:`UploadRefused` when it is not."""
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        try:
            if not zipfile.is_zipfile(self._tmp):
                raise UploadRefused("file: not a zip archive")
            try:
                with zipfile.ZipFile(self._tmp) as zf:
                    zf.infolist()
            except (zipfile.BadZipFile, OSError, ValueError, EOFError):
                raise UploadRefused("file: not a readable zip archive") from None
            final = self.uploads.path(self.upload_id)
            os.replace(self._tmp, final)
            return self.upload_id
        finally:
            self._tmp.unlink(missing_ok=True)

    def abort(self) -> None:
        if not self._file.closed:
            self._file.close()
        self._tmp.unlink(missing_ok=True)
