"""LocalBuilder: builds on this host, artifacts under ``<data_dir>/artifacts``.

- **Sources**: an upload (stored by the upload route under
  ``<data_dir>/uploads``, named by a server-made id), or an archive, a
  directory or a local git repository under ``CONVEYOR_BUILD_SOURCE_ROOTS``
  (resolved, symlinks followed, then checked); nothing else on the host. An
  archive is unpacked and a directory copied within the size caps
  (:mod:`conveyor.platform.builds.unpack`); every unusable source gets one message.
  Only local git repositories are cloned: this builder never reaches the network.
- **Build script**: if the tree has a ``.conveyor-build`` file at its root,
  ``sh .conveyor-build`` runs in the sandbox (:mod:`conveyor.platform.builds.sandbox`)
  on a copy of the tree in a capped workspace, with the build's decrypted env and
  nothing else, its output going to the build log with every secret value
  scrubbed; what it leaves there replaces the tree, checked like an archive.
- **Artifacts**: a reproducible ``.tar.gz`` (sorted entries, zeroed times and
  owners, ``.git`` left out), stored as ``artifacts/sha256/<digest>.tar.gz``:
  the same tree is stored once, whoever builds it.

Workers on several hosts need ``CONVEYOR_DATA_DIR`` on a shared volume for
artifacts and uploaded archives; a remote builder would implement
:class:`~conveyor.platform.builds.builder.Builder` instead.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import shutil
import signal
import subprocess
import tarfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import unquote, urlsplit

from conveyor.platform.builds.builder import (
    ArchiveSource,
    Artifact,
    Builder,
    BuildLog,
    Deadline,
    DirectorySource,
    GitSource,
    Source,
    UploadSource,
)
from conveyor.platform.builds.paths import inside, safe_name, under_roots
from conveyor.platform.builds.sandbox import Sandbox
from conveyor.platform.builds.unpack import UNUSABLE, Caps, check_tree, copy_tree, unpack
from conveyor.platform.builds.uploads import Uploads
from conveyor.platform.errors import BuildFailed, BuildTimeout, SourceUnusable
from conveyor.platform.settings import PlatformSettings
from conveyor.settings import Settings

#: The build script a source tree may carry at its root.
BUILD_SCRIPT = ".conveyor-build"

#: Variables from the worker's own environment git sees; nothing else leaks in.
PASSED_ENV = ("PATH", "LANG", "LC_ALL", "TZ")

_SHA256_HEX = frozenset("0123456789abcdef")


class LocalBuilder(Builder):
    """A :class:`Builder` on the local disk, rooted at the data directory."""

    def __init__(self, settings: Settings, config: PlatformSettings) -> None:
        self.settings = settings
        self.root = Path(settings.data_dir).expanduser().resolve()
        self.artifacts = self.root / "artifacts" / "sha256"
        self.work = self.root / "builds"
        self.uploads = Uploads(self.root)
        self.roots = config.source_roots
        self.caps = Caps(config.build_max_source_bytes, config.build_max_source_files)
        self.sandbox = Sandbox(settings, config)

    @contextmanager
    def workspace(self, build_id: str, claim: int) -> Iterator[Path]:
        self.work.mkdir(parents=True, exist_ok=True)
        build_dir = inside(self.work, safe_name(build_id, "build_id"))
        # An earlier claim's worker died: its tree is of no use to anyone.
        for old in build_dir.glob("*"):
            if old.name != str(claim):
                shutil.rmtree(inside(build_dir, old.name), ignore_errors=True)
        path = inside(build_dir, str(int(claim)))
        shutil.rmtree(path, ignore_errors=True)
        path.mkdir(parents=True)
        try:
            yield path
        finally:
            shutil.rmtree(build_dir, ignore_errors=True)

    # -- sources --------------------------------------------------------------

    def host_path(self, path: str) -> Path:
        """``path`` resolved, when it lies under a configured source root; else :class:`SourceUnusable`."""
        resolved = under_roots(path, self.roots)
        if resolved is None:
            raise SourceUnusable(UNUSABLE)
        return resolved

    def fetch(self, source: Source, dest: Path, deadline: Deadline, log: BuildLog) -> str | None:
        if isinstance(source, UploadSource):
            log.write(f"unpacking upload {source.upload_id}")
            unpack(self.uploads.path(source.upload_id), dest, self.caps, deadline)
            return None
        if isinstance(source, ArchiveSource):
            archive = self.host_path(source.path)
            log.write("unpacking an archive from a source root")
            unpack(archive, dest, self.caps, deadline)
            return None
        if isinstance(source, DirectorySource):
            directory = self.host_path(source.path)
            log.write("copying a directory from a source root")
            copy_tree(directory, dest, self.caps, deadline)
            return None
        return self._clone(source, dest, deadline, log)

    def _clone(self, source: GitSource, dest: Path, deadline: Deadline, log: BuildLog) -> str:
        repo = self.host_path(_local_repo(source.url))
        # --no-hardlinks: the workspace is handed to the sandbox user; the source repository must not be.
        argv = ["git", "clone", "--quiet", "--no-hardlinks"]
        if source.ref:
            argv.append(f"--branch={source.ref}")  # one argument: a ref cannot become an option
        log.write("cloning a repository from a source root" + (f" at {source.ref}" if source.ref else ""))
        self._git("git clone", [*argv, "--", str(repo), str(dest)], deadline, log)
        check_tree(dest, self.caps)
        commit = self._git("git rev-parse", ["git", "-C", str(dest), "rev-parse", "HEAD"], deadline, log).strip()
        log.write(f"at commit {commit}")
        return commit

    def _git(self, what: str, argv: list[str], deadline: Deadline, log: BuildLog) -> str:
        env = {k: os.environ[k] for k in PASSED_ENV if k in os.environ}
        env.update(GIT_TERMINAL_PROMPT="0", GIT_CONFIG_NOSYSTEM="1", HOME=str(self.root))
        try:
            done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=deadline.remaining())
        except subprocess.TimeoutExpired:
            raise BuildTimeout(
                f"{deadline.kind} build exceeded its time limit of {deadline.seconds:g}s in {what}"
            ) from None
        if done.returncode != 0:
            for line in done.stderr.splitlines():
                log.write(line)
            raise BuildFailed(f"{what} failed: {log.mask(done.stderr.strip())[-500:]}")
        return done.stdout

    # -- build script ---------------------------------------------------------

    def run_build_script(self, tree: Path, env: dict[str, str], deadline: Deadline, log: BuildLog) -> None:
        script = tree / BUILD_SCRIPT
        if not script.is_file() or script.is_symlink():
            log.write(f"no {BUILD_SCRIPT}: packaging the source as it is")
            return
        log.write(f"running {BUILD_SCRIPT} in the sandbox" + (f" with env {', '.join(sorted(env))}" if env else ""))
        code = self.sandbox.run(tree, ["sh", BUILD_SCRIPT], env, deadline, log, BUILD_SCRIPT)
        if code != 0:
            raise BuildFailed(f"{BUILD_SCRIPT} exited with status {_status(code)}: {log.tail(5)}")

    # -- artifacts ------------------------------------------------------------

    def package(self, tree: Path, deadline: Deadline, log: BuildLog) -> Artifact:
        self.artifacts.mkdir(parents=True, exist_ok=True)
        tmp = self.artifacts / f".tmp-{uuid.uuid4().hex}"
        files = entries = total = 0
        try:
            with (
                open(tmp, "wb") as raw,
                gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as gz,
                tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar,
            ):
                for path in _walk(tree):
                    deadline.check()
                    rel = path.relative_to(tree).as_posix()
                    # A tree a script ran on is the worker's own unpack of what the sandbox gave back
                    # (no host file can be linked into it): the checks are the caps.
                    info = tar.gettarinfo(str(path), arcname=rel)
                    entries += 1
                    total += info.size if info.isfile() else 0
                    if entries > self.caps.max_files or total > self.caps.max_bytes:
                        raise BuildFailed(
                            f"the built tree is larger than the limits ({self.caps.max_files} "
                            f"entries, {self.caps.max_bytes} bytes)"
                        )
                    _normalise(info)
                    if info.isfile():
                        with open(path, "rb") as fh:
                            tar.addfile(info, fh)
                        files += 1
                    else:
                        tar.addfile(info)
            digest = _sha256(tmp)
            final = self.artifacts / f"{digest}.tar.gz"
            if final.exists():
                log.write(f"artifact sha256:{digest} already stored")
            else:
                os.replace(tmp, final)
                log.write(f"stored artifact sha256:{digest} ({files} files)")
        finally:
            tmp.unlink(missing_ok=True)
        return Artifact(digest, final, final.stat().st_size)

    def artifact(self, sha256: str) -> Artifact | None:
        if len(sha256) != 64 or not set(sha256) <= _SHA256_HEX:
            return None
        self.artifacts.mkdir(parents=True, exist_ok=True)
        path = inside(self.artifacts, f"{sha256}.tar.gz")
        return Artifact(sha256, path, path.stat().st_size) if path.is_file() else None


def _walk(tree: Path) -> Iterator[Path]:
    """Every entry under ``tree`` in a fixed order, without .git."""
    for dirpath, dirnames, filenames in os.walk(tree):
        dirnames[:] = sorted(d for d in dirnames if d != ".git")
        base = Path(dirpath)
        for name in sorted(dirnames + filenames):
            yield base / name


def _normalise(info: tarfile.TarInfo) -> None:
    """Drop everything that varies between two builds of the same tree."""
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    if info.isdir() or (info.isfile() and info.mode & 0o111):
        info.mode = 0o755
    elif info.isfile():
        info.mode = 0o644


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _local_repo(url: str) -> str:
    """The path of a local repository URL (a path or file://...); "" for anything else, which no root holds."""
    if url.startswith("file://"):
        parts = urlsplit(url)
        return unquote(parts.path) if parts.netloc in ("", "localhost") else ""
    return url if os.path.isabs(url) else ""


def _status(code: int) -> str:
    """An exit status as people read it: 3, or "killed by SIGXCPU" for a limit."""
    if code < 0 or code > 128:
        number = -code if code < 0 else code - 128
        try:
            return f"{code} (killed by {signal.Signals(number).name})"
        except ValueError:
            return str(code)
    return str(code)
