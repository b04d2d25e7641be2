"""LocalBuilder: builds on this host, artifacts under ``<data_dir>/artifacts``.

- **Sources**: an archive is unpacked with path checks and a size cap; a
  directory is copied; a git repository is cloned, and only a local one (a
  path or a ``file://`` URL) -- this builder never reaches the network.
- **Build script**: if the tree has an executable-or-not ``.conveyor-build``
  file at its root, ``sh .conveyor-build`` runs in the tree with the build's
  decrypted env, in its own process group (killed whole on timeout). Its
  output goes to the build log with secret values masked.
- **Artifacts**: a reproducible ``.tar.gz`` (sorted entries, zeroed times and
  owners, ``.git`` left out), stored as ``artifacts/sha256/<digest>.tar.gz``:
  the same tree is stored once, whoever builds it.

Workers on several hosts need ``CONVEYOR_DATA_DIR`` on a shared volume for
artifacts and uploaded archives; a remote builder would implement
:class:`~conveyor.builds.builder.Builder` instead.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import shutil
import signal
import subprocess
import tarfile
import threading
import uuid
import zipfile
from contextlib import contextmanager
from pathlib import Path, PurePosixPath

from ..errors import BuildFailed, BuildTimeout
from .builder import (
    ArchiveSource,
    Artifact,
    Builder,
    BuildLog,
    Deadline,
    DirectorySource,
    GitSource,
    Source,
)

#: The build script a source tree may carry at its root.
BUILD_SCRIPT = ".conveyor-build"

#: An archive may unpack to at most this many bytes (a zip bomb fails the build, not the disk).
MAX_SOURCE_BYTES = 2 * 1024 ** 3

#: Variables from the worker's own environment a build script sees; nothing else leaks in.
PASSED_ENV = ("PATH", "LANG", "LC_ALL", "TZ")

_SHA256_HEX = frozenset("0123456789abcdef")


class LocalBuilder(Builder):
    """A :class:`Builder` on the local disk, rooted at the data directory."""

    def __init__(self, data_dir: Path) -> None:
        self.root = Path(data_dir).expanduser().resolve()
        self.artifacts = self.root / "artifacts" / "sha256"
        self.work = self.root / "builds"

    @contextmanager
    def workspace(self, build_id: str, claim: int):
        build_dir = self.work / build_id
        # An earlier claim's worker died: its tree is of no use to anyone.
        for old in build_dir.glob("*"):
            if old.name != str(claim):
                shutil.rmtree(old, ignore_errors=True)
        path = build_dir / str(claim)
        shutil.rmtree(path, ignore_errors=True)
        path.mkdir(parents=True)
        try:
            yield path
        finally:
            shutil.rmtree(build_dir, ignore_errors=True)

    # -- sources --------------------------------------------------------------

    def fetch(self, source: Source, dest: Path, deadline: Deadline, log: BuildLog) -> str | None:
        if isinstance(source, ArchiveSource):
            self._unpack(Path(source.path), dest, deadline, log)
            return None
        if isinstance(source, DirectorySource):
            src = Path(source.path)
            if not src.is_dir():
                raise BuildFailed(f"source directory {src} does not exist")
            log.write(f"copying {src}")
            def copy(a: str, b: str) -> None:
                deadline.check()
                shutil.copy2(a, b)

            shutil.copytree(src, dest, symlinks=True, ignore=shutil.ignore_patterns(".git"), copy_function=copy)
            return None
        return self._clone(source, dest, deadline, log)

    def _unpack(self, archive: Path, dest: Path, deadline: Deadline, log: BuildLog) -> None:
        if not archive.is_file():
            raise BuildFailed(f"archive {archive} does not exist")
        log.write(f"unpacking {archive.name}")
        dest.mkdir(parents=True)
        if zipfile.is_zipfile(archive):
            with zipfile.ZipFile(archive) as zf:
                members = zf.infolist()
                _check_size(sum(m.file_size for m in members), archive)
                for member in members:
                    deadline.check()
                    _check_member(member.filename, archive)
                    zf.extract(member, dest)
            return
        try:
            with tarfile.open(archive) as tf:
                members = tf.getmembers()
                _check_size(sum(m.size for m in members), archive)
                for member in members:
                    deadline.check()
                    # The "data" filter refuses absolute paths, "..", device files and links out of dest.
                    tf.extract(member, dest, filter="data")
        except tarfile.TarError as exc:
            raise BuildFailed(f"{archive.name} is not a zip or tar archive: {exc}") from None

    def _clone(self, source: GitSource, dest: Path, deadline: Deadline, log: BuildLog) -> str:
        url = source.url
        if not (url.startswith("file://") or (os.path.isabs(url) and Path(url).exists())):
            raise BuildFailed("the local builder clones local repositories only (an absolute path or a file:// URL)")
        argv = ["git", "clone", "--quiet"]
        if source.ref:
            argv += ["--branch", source.ref]
        log.write(f"cloning {url}" + (f" at {source.ref}" if source.ref else ""))
        self._git("git clone", [*argv, "--", url, str(dest)], deadline, log)
        commit = self._git("git rev-parse", ["git", "-C", str(dest), "rev-parse", "HEAD"], deadline, log).strip()
        log.write(f"at commit {commit}")
        return commit

    def _git(self, what: str, argv: list[str], deadline: Deadline, log: BuildLog) -> str:
        env = {k: os.environ[k] for k in PASSED_ENV if k in os.environ}
        env.update(GIT_TERMINAL_PROMPT="0", GIT_CONFIG_NOSYSTEM="1", HOME=str(self.root))
        try:
            done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=deadline.remaining())
        except subprocess.TimeoutExpired:
            raise BuildTimeout(f"{deadline.kind} build exceeded its time limit of {deadline.seconds:g}s in {what}") from None
        if done.returncode != 0:
            for line in done.stderr.splitlines():
                log.write(line)
            raise BuildFailed(f"{what} failed: {log.mask(done.stderr.strip())[-500:]}")
        return done.stdout

    # -- build script ---------------------------------------------------------

    def run_build_script(self, tree: Path, env: dict[str, str], deadline: Deadline, log: BuildLog) -> None:
        script = tree / BUILD_SCRIPT
        if not script.is_file():
            log.write(f"no {BUILD_SCRIPT}: packaging the source as it is")
            return
        run_env = {k: os.environ[k] for k in PASSED_ENV if k in os.environ}
        run_env.update(HOME=str(tree), **env)
        log.write(f"running {BUILD_SCRIPT}" + (f" with env {', '.join(sorted(env))}" if env else ""))
        proc = subprocess.Popen(["sh", BUILD_SCRIPT], cwd=tree, env=run_env, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)
        reader = threading.Thread(target=_pump, args=(proc.stdout, log), name="conveyor-build-log", daemon=True)
        reader.start()
        try:
            code = proc.wait(timeout=deadline.remaining())
        except (subprocess.TimeoutExpired, BuildTimeout):
            _kill_group(proc)
            raise BuildTimeout(f"{deadline.kind} build exceeded its time limit of {deadline.seconds:g}s "
                               f"in {BUILD_SCRIPT}") from None
        except BaseException:
            # The job's own time limit (or a shutdown) interrupted us: leave no build running.
            _kill_group(proc)
            raise
        finally:
            reader.join(timeout=5)
        if code != 0:
            raise BuildFailed(f"{BUILD_SCRIPT} exited with status {code}: {log.tail(5)}")

    # -- artifacts ------------------------------------------------------------

    def package(self, tree: Path, deadline: Deadline, log: BuildLog) -> Artifact:
        self.artifacts.mkdir(parents=True, exist_ok=True)
        tmp = self.artifacts / f".tmp-{uuid.uuid4().hex}"
        files = 0
        try:
            with open(tmp, "wb") as raw, \
                    gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as gz, \
                    tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
                for path in _walk(tree):
                    deadline.check()
                    info = tar.gettarinfo(str(path), arcname=path.relative_to(tree).as_posix())
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
        path = self.artifacts / f"{sha256}.tar.gz"
        return Artifact(sha256, path, path.stat().st_size) if path.is_file() else None


def _check_size(total: int, archive: Path) -> None:
    if total > MAX_SOURCE_BYTES:
        raise BuildFailed(f"{archive.name} unpacks to {total} bytes; the limit is {MAX_SOURCE_BYTES}")


def _check_member(name: str, archive: Path) -> None:
    path = PurePosixPath(name)
    if path.is_absolute() or ".." in path.parts:
        raise BuildFailed(f"{archive.name} holds a path outside the source tree: {name!r}")


def _walk(tree: Path):
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


def _pump(stream, log: BuildLog) -> None:
    for line in stream:
        log.write(line)
    stream.close()


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()
