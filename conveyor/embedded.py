"""The embedded Postgres behind the zero-config default.

With no ``DATABASE_URL``, conveyor keeps its broker and ledger in a real
PostgreSQL that lives in ``<data_dir>/postgres``. It comes from
`pgserver <https://github.com/orm011/pgserver>`_: PostgreSQL's binaries in a
wheel, so ``pip install conveyor`` is all a newcomer needs, the SQL is the
same as in production (no SQLite dialect to maintain), and nothing else here
depends on it: swapping it out means rewriting the two functions below.

How pgserver runs the server, which this module relies on:

* One server per data directory, shared by every process on the machine.
  The first caller runs initdb and starts it (``pg_ctl``, so the server is a
  daemon, not our child); later callers, in this process or any other, find
  it running through ``postmaster.pid`` and get the same URL. Start-up is
  serialised by a machine-wide file lock, so ``conveyor up`` and its workers
  may all call :func:`start_embedded` at once.
* Each calling process registers its pid in ``postgres/.handle_pids.json``;
  when a registered process exits normally (atexit), it unregisters, and the
  last one out stops the server. So the server outlives the process that
  started it exactly as long as another process still uses it. Processes
  that die without atexit (SIGKILL, ``os._exit``) stay on that list; we drop
  dead pids when a process registers and when one exits, or a crashed worker
  would keep the server up forever.
  A forked child that inherited a handle does not register: the parent
  must outlive it (``conveyor up`` does, it supervises its workers).
* It listens on a unix socket only (in the data directory, or under
  ``/tmp/runtime-<uid>`` if that path is too long), never on TCP, so it
  cannot collide with a Postgres on 5432.
* As root, PostgreSQL refuses to run, so pgserver creates a ``pgserver``
  system user (``useradd``) and runs the server as that user, and it makes
  every directory above the data directory and above its binaries readable
  and traversable by all (``chmod go+rx``). Its binaries live inside the
  venv, often inside a clone under ``/root`` (0700): that chmod would open
  up root's home, and without it the server user cannot reach them. So as
  root we run the server from a copy of pgserver's PostgreSQL install under
  the data directory (``<data_dir>/pgserver/<version>/``, root's, read-only
  to the server user), made once per pgserver build and kept, and we refuse
  a data directory whose parents are not already open (so that chmod is a
  no-op there), with a message that names one that works.

The handle list, start-up lock, per-process cache and the module-level path
of the binaries used below are pgserver internals, so the dependency is
pinned to 0.1.x.
"""

from __future__ import annotations

import atexit
import functools
import hashlib
import logging
import os
import shutil
import stat
import subprocess
import tempfile
import warnings
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Protocol
from urllib.parse import quote

from conveyor.errors import ConfigurationError, ConveyorError, DatabaseUnavailable

_log = logging.getLogger(__name__)


class _Postmaster(Protocol):
    """What this module reads of pgserver's ``PostmasterInfo`` (pgserver ships no types)."""

    pid: int
    port: int | None
    socket_dir: Path
    #: The server's ``psutil.Process`` (psutil ships no types either), None when its pid is gone.
    process: Any


class _Server(Protocol):
    """What this module uses of a pgserver ``PostgresServer`` handle."""

    #: pgserver's exit hook, which stops the server when the last process leaves.
    _cleanup: Callable[[], None]
    #: Ours, set by :func:`_adopt` (absent before).
    _conveyor_exit: Callable[[], None]

    def get_postmaster_info(self) -> _Postmaster: ...


#: The database conveyor uses inside the embedded cluster.
DATABASE = "conveyor"

#: The system user pgserver runs the server as when we are root.
ROOT_RUNS_AS = "pgserver"

#: As root: the directory under the data directory that holds the copies of
#: pgserver's PostgreSQL install, one subdirectory per pgserver build.
INSTALL_DIR = "pgserver"

#: Data directories root may use when the configured one is closed to the
#: server user; the first whose parents are all open is named in the error.
ROOT_DATA_DIR_CANDIDATES = (Path("/var/lib/conveyor"), Path("/srv/conveyor"), Path("/opt/conveyor"))

#: pgserver's chmod on every parent: the bits a parent must already have.
_OPEN = stat.S_IRGRP | stat.S_IXGRP | stat.S_IROTH | stat.S_IXOTH

_PARTIAL = ".partial-"


def start_embedded(data_dir: Path) -> str:
    """Start (or find running) the embedded Postgres; return its DATABASE_URL.

    The URL reaches the ``conveyor`` database (created if missing) over a
    unix socket. Safe to call from several processes at once; every call
    for the same ``data_dir`` gets the same server.
    """
    pgserver = _pgserver()
    pgdata = _pgdata(data_dir)
    if os.geteuid() == 0:
        # The data directory itself is conveyor's own; only what is above it belongs to someone else.
        _refuse_to_open_up(pgdata.parent)
        pgdata.parent.mkdir(parents=True, exist_ok=True)
        _check_root_owned(pgdata.parent)
        bin_path = _root_install(pgserver, pgdata.parent)
    else:
        pgdata.parent.mkdir(parents=True, exist_ok=True)
        bin_path = _own_binaries()
    _forget_dead_handles(pgserver, pgdata)

    _use_binaries(pgserver, bin_path)
    # Every process of `conveyor up` finds the server; only the one that started it says so at INFO.
    was_running = _is_running(pgserver.utils.PostmasterInfo.read_from_pgdata(pgdata))
    try:
        server = pgserver.get_server(pgdata)  # cached per process
        if not _is_running(pgserver.utils.PostmasterInfo.read_from_pgdata(pgdata)):
            # Stopped (stop_embedded) since this process first asked: start it again.
            server = pgserver.PostgresServer(pgdata)
    except Exception as exc:  # CalledProcessError, TimeoutExpired, OSError
        raise DatabaseUnavailable(
            f"embedded Postgres in {pgdata} did not start: {exc}; its log: {pgdata / 'log'}"
        ) from exc
    _adopt(pgserver, server, pgdata, bin_path)

    info = server.get_postmaster_info()
    _ensure_database(_url(info, "postgres"))
    _log.log(
        logging.DEBUG if was_running else logging.INFO,
        "embedded postgres ready: data=%s pid=%s binaries=%s",
        pgdata,
        info.pid,
        bin_path,
    )
    return _url(info, DATABASE)


def stop_embedded(data_dir: Path) -> None:
    """Stop the embedded Postgres of ``data_dir`` now, whoever else uses it.

    A fast shutdown: open sessions are ended. Does nothing if it is not running.
    """
    pgserver = _pgserver()
    pgdata = _pgdata(data_dir)
    # Drop this process's handle, so its exit does not try to stop the
    # server again and a later start_embedded starts a fresh one.
    handle = pgserver.PostgresServer._instances.pop(pgdata, None)
    if handle is not None:
        atexit.unregister(handle._cleanup)
        hook = getattr(handle, "_conveyor_exit", None)
        if hook is not None:
            atexit.unregister(hook)
        with pgserver.PostgresServer._lock:
            pgserver.utils.DiskList(pgdata / ".handle_pids.json").get_and_remove(os.getpid())
    if not _is_running(pgserver.utils.PostmasterInfo.read_from_pgdata(pgdata)):
        return
    user = None
    bin_path = _own_binaries()
    if os.geteuid() == 0:
        user = ROOT_RUNS_AS
        bin_path = _root_install(pgserver, pgdata.parent)
    _use_binaries(pgserver, bin_path)
    try:
        pgserver.pg_ctl(["-w", "-m", "fast", "stop"], pgdata=pgdata, user=user, timeout=60)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
        if _is_running(pgserver.utils.PostmasterInfo.read_from_pgdata(pgdata)):
            raise ConveyorError(f"embedded Postgres in {pgdata} did not stop: {exc}") from exc
        # else: its last user stopped it at the same moment; stopped is stopped.
    _log.info("embedded postgres stopped: data=%s", pgdata)


def running_embedded(data_dir: Path) -> str | None:
    """The DATABASE_URL of the embedded Postgres of ``data_dir`` if it is running now, else None.

    Starts nothing and registers no handle, so the caller's exit never stops
    the server (a read-only command such as ``conveyor status`` looks in on the
    server that ``conveyor up`` or a worker runs, and leaves it as it found it).
    Reads ``postmaster.pid`` itself: importing pgserver costs half a second.
    The server counts as running once it says ``ready`` there and its pid is a
    live process (not a zombie).
    """
    pgdata = _pgdata(data_dir)
    try:
        lines = (pgdata / "postmaster.pid").read_text().splitlines()
    except (OSError, UnicodeDecodeError):
        return None
    # pid, data directory, start time, port, socket directory, listen address, shared memory, status
    if len(lines) < 8 or lines[7].strip() != "ready" or not lines[0].strip().isdigit() or not lines[4].strip():
        return None
    import psutil

    try:
        if psutil.Process(int(lines[0])).status() == psutil.STATUS_ZOMBIE:
            return None
    except psutil.Error:
        return None
    host = quote(lines[4].strip(), safe="")
    port = lines[3].strip() if lines[3].strip().isdigit() else "5432"
    return f"postgresql://postgres@/{DATABASE}?host={host}&port={port}"


#: pgserver's own bin directory (inside the venv), read once before we repoint it.
_PGSERVER_BIN: Path | None = None


def _pgserver() -> ModuleType:
    global _PGSERVER_BIN
    # platformdirs warns at import when XDG_RUNTIME_DIR is unset (servers,
    # containers) and falls back to /tmp/runtime-<uid>, which is what we want.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import pgserver
        import pgserver._commands
        import pgserver.postgres_server
        import pgserver.utils
    if _PGSERVER_BIN is None:
        _PGSERVER_BIN = Path(pgserver._commands.POSTGRES_BIN_PATH)
        # pgserver logs every command it runs, with its output, at INFO: a dozen lines per
        # CLI call that say nothing to an operator. Its warnings and errors still show.
        quiet = logging.getLogger("pgserver")
        if quiet.level == logging.NOTSET:
            quiet.setLevel(logging.WARNING)
    return pgserver


def _own_binaries() -> Path:
    """pgserver's own bin directory, as :func:`_pgserver` read it before any repointing."""
    assert _PGSERVER_BIN is not None, "_pgserver() reads it first"
    return _PGSERVER_BIN


def _use_binaries(pgserver: ModuleType, bin_path: Path) -> None:
    """Point pgserver at ``bin_path``: its commands (initdb, pg_ctl) look the
    module global up on every call, its server class imported it by name."""
    pgserver._commands.POSTGRES_BIN_PATH = bin_path
    pgserver.postgres_server.POSTGRES_BIN_PATH = bin_path


def _adopt(pgserver: ModuleType, server: _Server, pgdata: Path, bin_path: Path) -> None:
    """Run pgserver's exit hook of ``server`` through ours, once per handle.

    Ours first drops dead pids, so a child that died without unregistering
    cannot keep the server up after the last live process leaves, and points
    pgserver at this server's binaries: another data directory used later in
    this process may have pointed it elsewhere.
    """
    if getattr(server, "_conveyor_exit", None) is not None:
        return
    hook = functools.partial(_at_exit, pgserver, server, pgdata, bin_path)
    atexit.unregister(server._cleanup)
    atexit.register(hook)
    server._conveyor_exit = hook


def _at_exit(pgserver: ModuleType, server: _Server, pgdata: Path, bin_path: Path) -> None:
    _forget_dead_handles(pgserver, pgdata)
    _use_binaries(pgserver, bin_path)
    server._cleanup()


def _pgdata(data_dir: Path) -> Path:
    return Path(data_dir).expanduser().resolve() / "postgres"


# -- as root: a copy of pgserver's install the server user can reach ----------


def _root_install(pgserver: ModuleType, data_dir: Path) -> Path:
    """The bin directory of root's copy of pgserver's install under ``data_dir``.

    Copied once per pgserver build (the name carries its version and a hash
    of its file list), into a temporary directory renamed into place only
    when complete and on disk, so a copy cut short by a crash is never used
    and a half-copied tree is never run. Copies of other builds are removed
    once no running server uses them. Everything is root's and read-only to
    the server user, so it cannot change the programs it runs.
    """
    source = _own_binaries().parent  # .../site-packages/pgserver/pginstall
    key = _build_key(source)
    cache = data_dir / INSTALL_DIR
    target = cache / key
    # Same layout as in site-packages: initdb finds pgserver.libs through $ORIGIN/../../../pgserver.libs.
    bin_path = target / "pgserver" / "pginstall" / "bin"
    if target.is_dir() and all(p.name == key for p in cache.iterdir()):
        _check_root_owned(target)
        return bin_path
    with pgserver.PostgresServer._lock:  # machine-wide: one copier at a time
        _owned_dir(cache)
        if not target.is_dir():
            _remove_partial_copies(cache)
            _copy_install(source, cache, target)
            _log.info("copied pgserver's PostgreSQL install to %s", target)
        _check_root_owned(target)
        _remove_unused_copies(cache, keep=key)
    return bin_path


def _build_key(source: Path) -> str:
    """``<pgserver version>-<hash>``: a new build (or a reinstall that changed files) gets a new copy."""
    from importlib import metadata

    try:
        dist = metadata.distribution("pgserver")
        version, record = dist.version, dist.read_text("RECORD") or ""
    except metadata.PackageNotFoundError:
        version, record = "unknown", ""
    if not record:  # not installed by pip: the files' names, sizes and times
        record = "\n".join(
            f"{p.relative_to(source)} {p.stat().st_size} {p.stat().st_mtime_ns}"
            for p in sorted(source.rglob("*"))
            if p.is_file()
        )
    return f"{version}-{hashlib.sha256(record.encode()).hexdigest()[:12]}"


def _copy_install(source: Path, cache: Path, target: Path) -> None:
    partial = Path(tempfile.mkdtemp(prefix=f"{_PARTIAL}{os.getpid()}-", dir=cache))
    try:
        install = partial / "pgserver" / "pginstall"
        install.mkdir(parents=True)
        for part in ("bin", "lib", "share"):
            # Static libraries, pkg-config files and headers are for building, not running.
            shutil.copytree(
                source / part, install / part, symlinks=True, ignore=shutil.ignore_patterns("*.a", "pkgconfig")
            )
        libs = source.parent.parent / "pgserver.libs"  # the wheel's bundled libpq, if any
        if libs.is_dir():
            shutil.copytree(libs, partial / "pgserver.libs", symlinks=True)
        _seal(partial)
        os.rename(partial, target)
        _fsync_dir(cache)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        if target.is_dir():
            return  # another copier (another lock file: another XDG_RUNTIME_DIR) won the rename
        raise


def _seal(root: Path) -> None:
    """Modes readable (and, for programs, runnable) by all, writable by root only; everything on disk."""
    for dirpath, dirnames, filenames in os.walk(root):
        for name in filenames:
            path = os.path.join(dirpath, name)
            if os.path.islink(path):
                continue
            mode = os.stat(path).st_mode
            os.chmod(path, 0o755 if mode & stat.S_IXUSR else 0o644)
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        os.chmod(dirpath, 0o755)
        _fsync_dir(Path(dirpath))


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _remove_partial_copies(cache: Path) -> None:
    """Drop copies cut short: their copier is dead (we hold the lock, and its pid is gone)."""
    import psutil

    for path in cache.glob(f"{_PARTIAL}*"):
        pid = path.name[len(_PARTIAL) :].split("-", 1)[0]
        if not (pid.isdigit() and psutil.pid_exists(int(pid))):
            shutil.rmtree(path, ignore_errors=True)


def _remove_unused_copies(cache: Path, keep: str) -> None:
    """Drop copies of other pgserver builds that no running postgres was started from."""
    import psutil

    old = [p for p in cache.iterdir() if p.name != keep and not p.name.startswith(".") and p.is_dir()]
    if not old:
        return
    in_use: set[Path] = set()
    for proc in psutil.process_iter(["name", "exe", "status"]):
        exe = proc.info.get("exe")
        # A zombie runs nothing (where nothing reaps orphans, a stopped postmaster lingers as one).
        if proc.info.get("name") == "postgres" and exe and proc.info.get("status") != psutil.STATUS_ZOMBIE:
            in_use.update(p for p in old if Path(exe).is_relative_to(p))
    for path in old:
        if path not in in_use:
            shutil.rmtree(path, ignore_errors=True)
            _log.info("removed the copy of another pgserver build: %s", path)


def _owned_dir(path: Path) -> None:
    """Create ``path`` (0755) if missing, then make sure it is root's own directory."""
    try:
        path.mkdir(mode=0o755)
    except FileExistsError:
        pass
    _check_root_owned(path)
    path.chmod(0o755)


def _check_root_owned(path: Path) -> None:
    """Root writes programs here that another user runs: refuse anything but a
    real directory (not a symlink) that root owns and nobody else may write."""
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != 0 or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        kind = "a symlink" if stat.S_ISLNK(st.st_mode) else stat.filemode(st.st_mode)
        raise ConfigurationError(
            f"running as root, the embedded Postgres needs {path} to be a directory owned by root that "
            f"only root can write; it is {kind} owned by uid {st.st_uid}: remove it, or set "
            f"CONVEYOR_DATA_DIR to a directory of root's"
        )


def _is_running(info: _Postmaster | None) -> bool:
    """Whether a postmaster.pid names a live server (a zombie is not one:
    where nothing reaps orphans, a stopped daemon lingers as one)."""
    import psutil

    if info is None or info.process is None:
        return False
    try:
        # psutil ships no types: its answers as what it documents.
        status: str = info.process.status()
        zombie: str = psutil.STATUS_ZOMBIE
        return status != zombie
    except psutil.NoSuchProcess:
        return False


def _url(info: _Postmaster, dbname: str) -> str:
    """A libpq URL over the server's unix socket (pgserver listens on no port)."""
    host = quote(str(info.socket_dir), safe="")
    port = info.port or 5432  # names the socket file; given so PGPORT cannot interfere
    return f"postgresql://postgres@/{dbname}?host={host}&port={port}"


def _ensure_database(admin_url: str) -> None:
    import psycopg
    from psycopg import errors

    try:
        with psycopg.connect(admin_url, autocommit=True, connect_timeout=10) as conn:
            if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (DATABASE,)).fetchone():
                return
            try:
                conn.execute(f'CREATE DATABASE "{DATABASE}"')
            except (errors.DuplicateDatabase, errors.UniqueViolation):
                pass  # another process created it first
    except psycopg.OperationalError as exc:
        raise DatabaseUnavailable(f"embedded Postgres not reachable: {exc}") from exc


def _forget_dead_handles(pgserver: ModuleType, pgdata: Path) -> None:
    """Drop pids of processes that died without unregistering (see module doc)."""
    import psutil

    handles = pgserver.utils.DiskList(pgdata / ".handle_pids.json")
    with pgserver.PostgresServer._lock:
        pids = handles.get()
        alive = [pid for pid in pids if psutil.pid_exists(pid)]
        if alive != pids:
            handles.put(alive)


def _closed_parent(path: Path) -> Path | None:
    """The first existing directory at or above ``path`` that pgserver would have to chmod open."""
    for parent in reversed([path, *path.parents]):
        if parent.exists() and parent.stat().st_mode & _OPEN != _OPEN:
            return parent
    return None


def _refuse_to_open_up(data_dir: Path) -> None:
    """Fail if pgserver would have to chmod a directory above ``data_dir`` open for others.

    The server user needs to pass through every directory above its data;
    pgserver grants that with ``chmod go+rx`` on each, which on ``/root``
    (0700) would expose root's home to every local user.
    """
    closed = _closed_parent(data_dir.parent)
    if closed is None:
        return
    works = next((c for c in ROOT_DATA_DIR_CANDIDATES if c != data_dir and _closed_parent(c.parent) is None), None)
    if works == ROOT_DATA_DIR_CANDIDATES[0]:
        step = f"unset CONVEYOR_DATA_DIR (as root the default is {works})"
    elif works:
        step = f"set CONVEYOR_DATA_DIR={works}"
    else:
        step = "set CONVEYOR_DATA_DIR to a directory whose parents all have mode 755"
    raise ConfigurationError(
        f"running as root, the embedded Postgres runs as user {ROOT_RUNS_AS!r}, which cannot enter "
        f"{closed} (mode {stat.filemode(closed.stat().st_mode)}) above the data directory {data_dir}; "
        f"{step}, set DATABASE_URL to a PostgreSQL you run, or run as a non-root user"
    )
