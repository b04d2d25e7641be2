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
  every directory above the data directory readable and traversable by all
  (``chmod go+rx``). Under ``/root`` that would open up root's home, so we
  refuse such a data directory instead and say what to do.

The handle list, start-up lock and per-process cache used below are pgserver
internals, so the dependency is pinned to 0.1.x.
"""

from __future__ import annotations

import atexit
import logging
import os
import stat
import subprocess
import warnings
from pathlib import Path
from urllib.parse import quote

from .errors import ConfigurationError, ConveyorError, DatabaseUnavailable

_log = logging.getLogger(__name__)

#: The database conveyor uses inside the embedded cluster.
DATABASE = "conveyor"

#: The system user pgserver runs the server as when we are root.
ROOT_RUNS_AS = "pgserver"

_exit_hooks: set[Path] = set()


def start_embedded(data_dir: Path) -> str:
    """Start (or find running) the embedded Postgres; return its DATABASE_URL.

    The URL reaches the ``conveyor`` database (created if missing) over a
    unix socket. Safe to call from several processes at once; every call
    for the same ``data_dir`` gets the same server.
    """
    pgserver = _pgserver()
    pgdata = _pgdata(data_dir)
    if os.geteuid() == 0:
        # The data directory itself is conveyor's own; only what is above it
        # (and above the binaries) belongs to someone else.
        _refuse_to_open_up(pgdata.parent.parent, Path(pgserver._commands.POSTGRES_BIN_PATH).parent)
    pgdata.parent.mkdir(parents=True, exist_ok=True)
    _forget_dead_handles(pgserver, pgdata)

    try:
        server = pgserver.get_server(pgdata)  # cached per process
        if not _is_running(pgserver.utils.PostmasterInfo.read_from_pgdata(pgdata)):
            # Stopped (stop_embedded) since this process first asked: start it again.
            server = pgserver.PostgresServer(pgdata)
    except Exception as exc:  # CalledProcessError, TimeoutExpired, OSError
        raise DatabaseUnavailable(
            f"embedded Postgres in {pgdata} did not start: {exc}; its log: {pgdata / 'log'}"
        ) from exc

    if pgdata not in _exit_hooks:
        # atexit runs last-registered first: this runs before pgserver's own
        # hook, so a child that died without unregistering cannot keep the
        # server up after the last live process leaves.
        atexit.register(_forget_dead_handles, pgserver, pgdata)
        _exit_hooks.add(pgdata)

    info = server.get_postmaster_info()
    _ensure_database(_url(info, "postgres"))
    _log.info("embedded postgres ready: data=%s pid=%s", pgdata, info.pid)
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
        with pgserver.PostgresServer._lock:
            pgserver.utils.DiskList(pgdata / ".handle_pids.json").get_and_remove(os.getpid())
    if not _is_running(pgserver.utils.PostmasterInfo.read_from_pgdata(pgdata)):
        return
    user = ROOT_RUNS_AS if os.geteuid() == 0 else None
    try:
        pgserver.pg_ctl(["-w", "-m", "fast", "stop"], pgdata=pgdata, user=user, timeout=60)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
        if _is_running(pgserver.utils.PostmasterInfo.read_from_pgdata(pgdata)):
            raise ConveyorError(f"embedded Postgres in {pgdata} did not stop: {exc}") from exc
        # else: its last user stopped it at the same moment; stopped is stopped.
    _log.info("embedded postgres stopped: data=%s", pgdata)


def _pgserver():
    # platformdirs warns at import when XDG_RUNTIME_DIR is unset (servers,
    # containers) and falls back to /tmp/runtime-<uid>, which is what we want.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import pgserver
        import pgserver._commands
        import pgserver.utils
    return pgserver


def _pgdata(data_dir: Path) -> Path:
    return Path(data_dir).expanduser().resolve() / "postgres"


def _is_running(info) -> bool:
    """Whether a postmaster.pid names a live server (a zombie is not one:
    where nothing reaps orphans, a stopped daemon lingers as one)."""
    import psutil

    if info is None or info.process is None:
        return False
    try:
        return info.process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _url(info, dbname: str) -> str:
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


def _forget_dead_handles(pgserver, pgdata: Path) -> None:
    """Drop pids of processes that died without unregistering (see module doc)."""
    import psutil

    handles = pgserver.utils.DiskList(pgdata / ".handle_pids.json")
    with pgserver.PostgresServer._lock:
        pids = handles.get()
        alive = [pid for pid in pids if psutil.pid_exists(pid)]
        if alive != pids:
            handles.put(alive)


def _refuse_to_open_up(*paths: Path) -> None:
    """Fail if pgserver would have to chmod a closed directory open for others.

    The server user needs to pass through every directory above its data and
    binaries; pgserver grants that with ``chmod go+rx`` on each, which on
    ``/root`` (0700) would expose root's home to every local user.
    """
    for path in paths:
        for parent in [path, *path.parents]:
            if parent.exists() and not parent.stat().st_mode & stat.S_IXOTH:
                raise ConfigurationError(
                    f"running as root, the embedded Postgres runs as user {ROOT_RUNS_AS!r}, "
                    f"which cannot enter {parent} (mode {stat.filemode(parent.stat().st_mode)}); "
                    f"set CONVEYOR_DATA_DIR to a directory outside it (for example "
                    f"/var/lib/conveyor), set DATABASE_URL, or run as a non-root user"
                )
