"""Private Redis and PostgreSQL servers for the test suite.

Tests never touch the machine's own services: each class here starts its own
server from the machine's binaries, on a free loopback port, with its files in
a temporary directory that `close()` removes. They can be stopped, killed
(a crash) and started again on the same port, so a client that reconnects
finds the same server.

Plain classes, no pytest: `tests/conftest.py` wraps them in fixtures, and they
can be used from a shell for debugging:

    with PostgresServer(tempfile.mkdtemp()) as pg:
        print(pg.url())
"""

from __future__ import annotations

import atexit
import glob
import os
import pwd
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import time
from pathlib import Path

import psycopg
from psycopg import sql

#: How long a server may take to answer after it was started. initdb is not
#: included; a cold PostgreSQL start after a crash replays WAL, which on a slow
#: CI disk can take several seconds, hence the margin.
START_TIMEOUT = 60.0

#: How long a stop (SIGTERM) may take before the server is killed instead.
STOP_TIMEOUT = 30.0

#: Tries at a fresh port when another process took ours between picking it
#: and binding it (a race with parallel test runs).
PORT_ATTEMPTS = 5

#: Lines of the server log quoted in a start-up error.
LOG_TAIL_LINES = 40


class ServerStartError(RuntimeError):
    """A test server did not come up; the message carries its log tail."""


class _PortInUse(ServerStartError):
    """The picked port was taken before the server bound it; pick another."""


def free_port() -> int:
    """A loopback TCP port that was free a moment ago (the kernel's choice)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return "(no log written)"
    return "\n".join(text.splitlines()[-lines:])


def _clean_env() -> dict[str, str]:
    """Our environment without PG* variables, which would redirect the tools."""
    return {k: v for k, v in os.environ.items() if not k.startswith("PG")}


class _Server:
    """What both servers share: a child process, a log file, a temp dir."""

    name = "server"

    #: The signal of a clean shutdown.
    STOP_SIGNAL = signal.SIGTERM

    #: Extra environment of the server process (the fault campaign preloads libfaketime); set before start.
    env: dict[str, str] = {}

    def __init__(self, tmpdir: str | os.PathLike[str] | None = None) -> None:
        self.tmpdir = Path(tmpdir or tempfile.mkdtemp(prefix=f"conveyor-{self.name}-"))
        self.tmpdir.mkdir(parents=True, exist_ok=True)
        self.log_path = self.tmpdir / f"{self.name}.log"
        self._proc: subprocess.Popen[bytes] | None = None
        self._closed = False
        self._log_mark = 0
        self.port = 0
        # A safety net for interpreters that exit without running fixture
        # teardown (KeyboardInterrupt during setup): never leave a server behind.
        atexit.register(self.close)

    # -- lifecycle -----------------------------------------------------------

    @property
    def is_running(self) -> bool:
        """True while the server process is alive."""
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        """The server's process id, or None when it is not running."""
        return self._proc.pid if self.is_running else None

    def start(self) -> None:
        """Start the server again on the same port (after stop() or kill())."""
        if self._closed:
            raise RuntimeError(f"{self.name} server was closed")
        if self.is_running:
            return
        self._spawn_and_wait()

    def stop(self) -> None:
        """Shut down cleanly (``STOP_SIGNAL``) and wait; killed after STOP_TIMEOUT; idempotent."""
        proc = self._proc
        if proc is None or proc.poll() is not None:
            self._proc = None
            return
        proc.send_signal(self.STOP_SIGNAL)
        try:
            proc.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.kill()
        self._proc = None

    def kill(self) -> None:
        """Crash the server (SIGKILL) and wait for it to be gone; idempotent."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        self._proc = None

    def close(self) -> None:
        """Stop the server and remove its temporary directory; idempotent."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self.close)
        try:
            self.stop()
        finally:
            shutil.rmtree(self.tmpdir, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "running" if self.is_running else "stopped"
        return f"<{type(self).__name__} port={self.port} {state} dir={self.tmpdir}>"

    # -- for subclasses ------------------------------------------------------

    def _start_first_time(self) -> None:
        """Pick a port and start; pick again if someone else took the port."""
        for attempt in range(PORT_ATTEMPTS):
            self.port = free_port()
            try:
                self._spawn_and_wait()
                return
            except _PortInUse:
                if attempt == PORT_ATTEMPTS - 1:
                    raise

    def _spawn_and_wait(self) -> None:
        raise NotImplementedError

    def _popen(self, argv: list[str], **kwargs) -> subprocess.Popen[bytes]:
        with open(self.log_path, "ab") as log:
            self._log_mark = log.tell()  # where this run's output starts
            return subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**_clean_env(), **self.env},
                # Its own process group: a Ctrl-C in the terminal reaches
                # pytest, whose teardown stops the server in order.
                start_new_session=True,
                **kwargs,
            )

    def _wait_until(self, ready, what: str) -> None:
        """Poll `ready()` until true; fail fast if the process died."""
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            if ready():
                return
            assert self._proc is not None
            code = self._proc.poll()
            if code is not None:
                self._proc = None
                with open(self.log_path, "rb") as log:
                    log.seek(self._log_mark)
                    this_run = log.read().decode(errors="replace")
                if "Address already in use" in this_run:
                    raise _PortInUse(f"{self.name}: port {self.port} was taken")
                raise ServerStartError(
                    f"{self.name} exited with code {code} before {what} "
                    f"(port {self.port}); log {self.log_path}:\n{_log_tail(self.log_path)}"
                )
            if time.monotonic() > deadline:
                self.kill()
                raise ServerStartError(
                    f"{self.name} not {what} within {START_TIMEOUT:.0f}s "
                    f"(port {self.port}); log {self.log_path}:\n{_log_tail(self.log_path)}"
                )
            time.sleep(0.02)


class RedisServer(_Server):
    """A private `redis-server` on a free loopback port, no persistence.

    Started by the constructor; `url` points at database 0.
    """

    name = "redis"

    def __init__(
        self,
        tmpdir: str | os.PathLike[str] | None = None,
        executable: str | None = None,
        *,
        durable: bool = False,
        bind: tuple[str, ...] = ("127.0.0.1",),
    ) -> None:
        super().__init__(tmpdir)
        self.executable = executable or shutil.which("redis-server") or "/usr/bin/redis-server"
        #: With ``durable``, every write is in the append-only file before Redis answers
        #: (``appendfsync always``): a SIGKILL loses nothing that was acknowledged.
        self.durable = durable
        #: Addresses to listen on; the first is the one ``url`` names.
        self.bind = tuple(bind)
        try:
            if not os.access(self.executable, os.X_OK):
                raise ServerStartError("redis-server not found; install it (Debian: apt-get install redis-server)")
            self._start_first_time()
        except BaseException:
            self.close()
            raise

    @property
    def url(self) -> str:
        """`redis://127.0.0.1:PORT/0`."""
        return f"redis://127.0.0.1:{self.port}/0"

    def _spawn_and_wait(self) -> None:
        self._proc = self._popen(
            [
                self.executable,
                "--port",
                str(self.port),
                "--bind",
                " ".join(self.bind),
                "--save",
                "",
                "--appendonly",
                "yes" if self.durable else "no",
                *(["--appendfsync", "always"] if self.durable else []),
                # Listening beyond loopback (a test network namespace): no password, so say it is meant.
                *(["--protected-mode", "no"] if set(self.bind) - {"127.0.0.1"} else []),
                "--dir",
                str(self.tmpdir),
                "--daemonize",
                "no",
                "--logfile",
                "",  # stdout, which _popen sends to the log file
            ]
        )
        self._wait_until(self._pings, "answering PING")

    def _pings(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as sock:
                sock.sendall(b"PING\r\n")
                return sock.recv(64).startswith(b"+PONG")
        except OSError:
            return False

    def url_on(self, address: str) -> str:
        """The URL of database 0 on one of the ``bind`` addresses."""
        return f"redis://{address}:{self.port}/0"

    def pause(self, seconds: float) -> None:
        """``CLIENT PAUSE`` every client (reads and writes) for ``seconds``; returns at once."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=5) as sock:
            sock.sendall(f"CLIENT PAUSE {int(seconds * 1000)} ALL\r\n".encode())
            reply = sock.recv(64)
        if not reply.startswith(b"+OK"):
            raise RuntimeError(f"CLIENT PAUSE refused: {reply!r}")


def find_postgres_bindir() -> Path:
    """The directory holding `postgres` and `initdb`.

    `pg_config --bindir` first (it names the server the developer chose),
    then the newest /usr/lib/postgresql/*/bin (Debian's layout, where the
    server binaries are not on PATH), then PATH.
    """

    def has_server(path: Path) -> bool:
        return (path / "postgres").is_file() and (path / "initdb").is_file()

    pg_config = shutil.which("pg_config")
    if pg_config:
        try:
            out = subprocess.run(
                [pg_config, "--bindir"], capture_output=True, text=True, check=True, timeout=10
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            out = ""
        if out and has_server(Path(out)):
            return Path(out)

    def version(path: str) -> tuple[int, ...]:
        name = Path(path).parent.name
        return tuple(int(p) for p in name.split(".") if p.isdigit())

    for candidate in sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=version, reverse=True):
        if has_server(Path(candidate)):
            return Path(candidate)

    initdb = shutil.which("initdb")
    if initdb and has_server(Path(initdb).parent):
        return Path(initdb).parent
    raise ServerStartError(
        "PostgreSQL server binaries not found (looked at pg_config --bindir, "
        "/usr/lib/postgresql/*/bin, PATH); Debian: apt-get install postgresql"
    )


class PostgresServer(_Server):
    """A private PostgreSQL cluster on a free loopback port, tuned for tests.

    The constructor runs initdb (trust auth, superuser `postgres`) and starts
    the server; durability is traded for speed (`fsync`, `synchronous_commit`,
    `full_page_writes` off). Note that with `synchronous_commit=off` a commit
    made just before `kill()` may be lost; a crash test that counts on every
    commit can pass `settings={"synchronous_commit": "on"}`.

    As root, PostgreSQL refuses to run, so initdb and postgres run as the
    `postgres` system user (override with `system_user`) and `tmpdir` is
    handed to that user; every directory above `tmpdir` must let it through.
    """

    name = "postgres"

    #: Fast shutdown, pg_ctl's default: open sessions are ended, then a
    #: checkpoint. SIGTERM (smart) would wait for every client to leave, and
    #: pooled clients never do.
    STOP_SIGNAL = signal.SIGINT

    #: Server settings for tests. max_connections leaves room for many worker
    #: processes and pools in one test session.
    SETTINGS = {
        "fsync": "off",
        "synchronous_commit": "off",
        "full_page_writes": "off",
        "max_connections": "300",
        "listen_addresses": "127.0.0.1",
    }

    def __init__(
        self,
        tmpdir: str | os.PathLike[str] | None = None,
        *,
        bindir: str | os.PathLike[str] | None = None,
        settings: dict[str, str] | None = None,
        system_user: str = "postgres",
    ) -> None:
        super().__init__(tmpdir)
        self.bindir = Path(bindir) if bindir else find_postgres_bindir()
        self.datadir = self.tmpdir / "data"
        self.socket_dir = self.tmpdir / "socket"
        self.settings = {**self.SETTINGS, **(settings or {})}
        self._user_kwargs: dict = {}
        try:
            if os.geteuid() == 0:
                self._run_as(system_user)
            self.socket_dir.mkdir(exist_ok=True)
            if self._user_kwargs:
                os.chown(self.socket_dir, self._user_kwargs["user"], self._user_kwargs["group"])
            self._initdb()
            self._start_first_time()
        except BaseException:
            self.close()
            raise

    def url(self, dbname: str = "postgres") -> str:
        """`postgresql://postgres@127.0.0.1:PORT/dbname`."""
        return f"postgresql://postgres@127.0.0.1:{self.port}/{dbname}"

    def restart(self) -> None:
        """A clean stop followed by a start on the same port and data."""
        self.stop()
        self.start()

    #: Settings of a cluster that keeps every acknowledged commit through a
    #: crash: pass as ``settings=PostgresServer.DURABLE`` to a crash test.
    DURABLE = {"fsync": "on", "synchronous_commit": "on", "full_page_writes": "on"}

    def url_on(self, address: str, dbname: str = "postgres") -> str:
        """The URL of ``dbname`` on another address of ``listen_addresses``."""
        return f"postgresql://postgres@{address}:{self.port}/{dbname}"

    def trust(self, network: str) -> None:
        """Let clients from ``network`` (CIDR) in without a password, like loopback; applied at once."""
        with open(self.datadir / "pg_hba.conf", "a") as hba:
            hba.write(f"host all all {network} trust\n")
        with self.connect() as conn:
            conn.execute("SELECT pg_reload_conf()")

    def crash_immediate(self) -> None:
        """Crash the way ``pg_ctl stop -m immediate`` does (SIGQUIT to the postmaster: no
        checkpoint, the next start replays WAL), then wait until every process is gone."""
        proc = self._proc
        if proc is None or proc.poll() is not None:
            self._proc = None
            return
        children = _child_pids(proc.pid)
        proc.send_signal(signal.SIGQUIT)
        try:
            proc.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            pass
        self.kill()  # a postmaster that ignored SIGQUIT: SIGKILL, and its children with it
        for pid in children:
            deadline = time.monotonic() + STOP_TIMEOUT
            while _is_alive(pid) and time.monotonic() < deadline:
                time.sleep(0.01)

    def kill(self) -> None:
        """Crash: SIGKILL the postmaster, then wait for its orphaned children.

        PostgreSQL's children exit by themselves once the postmaster is gone;
        until they have, a new postmaster would refuse the data directory
        ("pre-existing shared memory block is still in use").
        """
        proc = self._proc
        if proc is None or proc.poll() is not None:
            self._proc = None
            return
        children = _child_pids(proc.pid)
        super().kill()
        deadline = time.monotonic() + STOP_TIMEOUT
        while children and time.monotonic() < deadline:
            children = [pid for pid in children if _is_alive(pid)]
            if children:
                time.sleep(0.01)
        for pid in children:  # stuck: finish the crash ourselves
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    # -- databases -----------------------------------------------------------

    def connect(self, dbname: str = "postgres") -> psycopg.Connection:
        """An autocommit connection, for administration."""
        return psycopg.connect(self.url(dbname), autocommit=True, connect_timeout=10)

    def create_database(self, name: str, template: str | None = None) -> None:
        """CREATE DATABASE name [TEMPLATE template].

        Copying a template fails while anyone is connected to it (after a
        5 s wait), so sessions on the template are ended first: in tests a
        template is only ever a source.
        """
        query = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
        if template:
            query += sql.SQL(" TEMPLATE {}").format(sql.Identifier(template))
        with self.connect() as conn:
            if template:
                self._terminate(conn, template)
            conn.execute(query)

    def drop_database(self, name: str) -> None:
        """Drop a database if it exists, ending its sessions first."""
        with self.connect() as conn:
            self._terminate(conn, name)
            force = sql.SQL(" WITH (FORCE)") if conn.info.server_version >= 130000 else sql.SQL("")
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(name)) + force)

    def terminate_connections(self, dbname: str) -> None:
        """End every session connected to `dbname`."""
        with self.connect() as conn:
            self._terminate(conn, dbname)

    @staticmethod
    def _terminate(conn: psycopg.Connection, dbname: str) -> None:
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
            (dbname,),
        )

    # -- internals -----------------------------------------------------------

    def _run_as(self, user: str) -> None:
        try:
            entry = pwd.getpwnam(user)
        except KeyError:
            raise ServerStartError(
                f"running as root, PostgreSQL must run as another user, but there is "
                f"no {user!r} user (Debian's postgresql package creates it)"
            ) from None
        groups = os.getgrouplist(user, entry.pw_gid)
        self._user_kwargs = {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": groups}
        blocked = [
            str(p)
            for p in [self.tmpdir.resolve(), *self.tmpdir.resolve().parents]
            if not _can_traverse(p, entry.pw_uid, groups)
        ]
        # tmpdir itself is chowned below; only its parents must already let us in.
        blocked = [p for p in blocked if p != str(self.tmpdir.resolve())]
        if blocked:
            raise ServerStartError(
                f"user {user!r} cannot reach {self.tmpdir}: {', '.join(blocked)} not "
                f"traversable; use a directory under /tmp (tempfile.mkdtemp())"
            )
        os.chown(self.tmpdir, entry.pw_uid, entry.pw_gid)

    def _initdb(self) -> None:
        argv = [
            str(self.bindir / "initdb"),
            "--pgdata",
            str(self.datadir),
            "--username",
            "postgres",
            "--auth",
            "trust",
            "--encoding",
            "UTF8",
            "--no-locale",
            "--no-sync",  # the files are thrown away with the temp dir
        ]
        with open(self.log_path, "ab") as log:
            result = subprocess.run(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=_clean_env(),
                cwd=self.tmpdir,
                timeout=120,
                **self._user_kwargs,
            )
        if result.returncode != 0:
            raise ServerStartError(
                f"initdb failed with code {result.returncode}; log {self.log_path}:\n{_log_tail(self.log_path)}"
            )

    def _spawn_and_wait(self) -> None:
        argv = [
            str(self.bindir / "postgres"),
            "-D",
            str(self.datadir),
            "-p",
            str(self.port),
            "-k",
            str(self.socket_dir),
        ]
        for key, value in self.settings.items():
            argv += ["-c", f"{key}={value}"]
        self._proc = self._popen(argv, cwd=self.tmpdir, **self._user_kwargs)
        self._wait_until(self._accepts_queries, "accepting queries")

    def _accepts_queries(self) -> bool:
        try:
            with psycopg.connect(self.url(), connect_timeout=2, autocommit=True) as conn:
                conn.execute("SELECT 1")
            return True
        except psycopg.OperationalError:
            return False


def _can_traverse(path: Path, uid: int, groups: list[int]) -> bool:
    st = path.stat()
    if st.st_uid == uid:
        return bool(st.st_mode & stat.S_IXUSR)
    if st.st_gid in groups:
        return bool(st.st_mode & stat.S_IXGRP)
    return bool(st.st_mode & stat.S_IXOTH)


def _child_pids(parent: int) -> list[int]:
    """Direct children of `parent`, from /proc (Linux)."""
    children = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == parent:
            children.append(int(entry))
    return children


def _is_alive(pid: int) -> bool:
    """True unless the process is gone or a zombie (nobody may reap orphans)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in (b"Z", b"X")


class PgBouncerServer(_Server):
    """A private PgBouncer in transaction pooling mode on a free loopback port, in front of ``upstream``.

    Every database of the upstream cluster is reachable under its own name
    (``* =`` fallback), as user ``postgres`` without a password (trust on
    both hops). As root it runs as the ``postgres`` system user, as the
    server does (PgBouncer refuses to run as root).
    """

    name = "pgbouncer"

    def __init__(
        self,
        upstream: PostgresServer,
        tmpdir: str | os.PathLike[str] | None = None,
        *,
        pool_size: int = 20,
        system_user: str = "postgres",
    ) -> None:
        super().__init__(tmpdir or tempfile.mkdtemp(prefix="conveyor-pgbouncer-"))
        self.upstream = upstream
        self.pool_size = pool_size
        self.executable = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
        self._user_kwargs: dict = {}
        try:
            if not os.access(self.executable, os.X_OK):
                raise ServerStartError("pgbouncer not found; install it (Debian: apt-get install pgbouncer)")
            if os.geteuid() == 0:
                entry = pwd.getpwnam(system_user)
                self._user_kwargs = {
                    "user": entry.pw_uid,
                    "group": entry.pw_gid,
                    "extra_groups": os.getgrouplist(system_user, entry.pw_gid),
                }
                os.chown(self.tmpdir, entry.pw_uid, entry.pw_gid)
            self._start_first_time()
        except BaseException:
            self.close()
            raise

    def url(self, dbname: str = "postgres") -> str:
        """`postgresql://postgres@127.0.0.1:PORT/dbname`, through the pooler."""
        return f"postgresql://postgres@127.0.0.1:{self.port}/{dbname}"

    def _write_config(self) -> Path:
        users = self.tmpdir / "users.txt"
        users.write_text('"postgres" ""\n')
        config = self.tmpdir / "pgbouncer.ini"
        config.write_text(
            "\n".join(
                [
                    "[databases]",
                    f"* = host=127.0.0.1 port={self.upstream.port}",
                    "[pgbouncer]",
                    "listen_addr = 127.0.0.1",
                    f"listen_port = {self.port}",
                    "unix_socket_dir =",
                    "auth_type = trust",
                    f"auth_file = {users}",
                    "pool_mode = transaction",
                    f"default_pool_size = {self.pool_size}",
                    "max_client_conn = 1000",
                    "ignore_startup_parameters = extra_float_digits",
                    f"pidfile = {self.tmpdir / 'pgbouncer.pid'}",
                    "",
                ]
            )
        )
        if self._user_kwargs:
            for path in (users, config):
                os.chown(path, self._user_kwargs["user"], self._user_kwargs["group"])
        return config

    def _spawn_and_wait(self) -> None:
        config = self._write_config()
        self._proc = self._popen([self.executable, str(config)], cwd=self.tmpdir, **self._user_kwargs)
        self._wait_until(self._accepts_queries, "accepting queries")

    def _accepts_queries(self) -> bool:
        try:
            with psycopg.connect(self.url(), connect_timeout=2, autocommit=True, prepare_threshold=None) as conn:
                conn.execute("SELECT 1")
            return True
        except psycopg.OperationalError:
            return False
