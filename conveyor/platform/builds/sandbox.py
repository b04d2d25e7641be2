"""The build sandbox: a build script runs in bubblewrap, in its own cgroup and workspace, seeing nothing of the host.

A ``.conveyor-build`` script is code from whoever uploaded the source. Here it
runs in ``bwrap`` (Debian's ``bubblewrap``) with:

- **nothing of the build on the host side**: the launchers that run on the host
  (``unshare``, ``sh``, ``prlimit``, ``bwrap`` itself) start with a fixed
  environment (PATH and LANG) and an argv that holds no value of the build's.
  bwrap's options, the build's variables among them (``--clearenv --setenv``),
  reach it through a memfd (``--args FD``), so they are set only in the process
  bwrap starts inside the sandbox and never show in any host process's argv or
  environ. A variable that steers the dynamic loader or libc (``LD_PRELOAD``,
  ...; :mod:`conveyor.platform.builds.envnames`) is refused here too, whatever
  the API let through;
- **its own namespaces**: pid (its ``/proc`` shows its own processes only), ipc,
  uts, cgroup, mount, and net (loopback only, unless ``CONVEYOR_BUILD_NETWORK``);
- **the host read-only**, with private size-capped ``/tmp`` and empty ``/run``
  (no host sockets), the data directory hidden;
- **a workspace that is not on the host's disk**: a tmpfs at ``/tmp/build``
  capped at ``CONVEYOR_BUILD_WORKSPACE_BYTES`` and (under a root worker)
  ``CONVEYOR_BUILD_MAX_SOURCE_FILES`` inodes. The source tree goes in as a tar
  stream on the sandbox's stdin; what the script leaves in ``/tmp/build/src``
  comes out as a tar stream on its stdout, capped, and is unpacked on the host
  with the archive checks (:func:`~conveyor.platform.builds.unpack.unpack`: no
  absolute paths, no ``..``, no links out, no devices, within the source caps).
  A script that writes past the cap gets ``ENOSPC``; no host path is bound into
  the sandbox, so ``/proc/self/mountinfo`` shows none (a root worker mounts the
  tmpfs over ``/run`` in a mount namespace of its own, which the sandbox's
  ``/run`` covers);
- **one cgroup per build** (:mod:`conveyor.platform.builds.cgroups`): memory
  (processes, workspace and ``/tmp`` together), process count and CPU, for the
  whole process tree, made before and removed after every build. Where the
  worker cannot make one, builds are refused unless
  ``CONVEYOR_BUILD_ISOLATION=rlimits-only``;
- **an unprivileged user of its own**: under a root worker each build runs as a
  uid from ``CONVEYOR_BUILD_SANDBOX_UIDS`` that no other running build holds
  (:mod:`conveyor.platform.builds.uids`; empty: ``CONVEYOR_BUILD_SANDBOX_UID``,
  nobody) with no capabilities and ``no_new_privs``; a worker that is not root
  runs bwrap in a user namespace as its own (unprivileged) user;
- **per-process limits** (``prlimit``): CPU seconds, address space, file size,
  no core files (and, ``rlimits-only``, processes of the sandbox user); plus the
  variant's wall-clock limit, past which the whole sandbox is killed.
"""

from __future__ import annotations

import io
import os
import shutil
import signal
import subprocess
import threading
from pathlib import Path
from typing import IO

from conveyor.logs import log_event
from conveyor.platform.builds.builder import BuildLog, Deadline
from conveyor.platform.builds.cgroups import BuildCgroup, Hierarchy, Limits, Usage, detect
from conveyor.platform.builds.envnames import unsafe_names
from conveyor.platform.builds.uids import claim_uid
from conveyor.platform.builds.unpack import Caps, unpack
from conveyor.platform.errors import BuildFailed, BuildTimeout, SandboxUnavailable, SourceUnusable
from conveyor.platform.settings import PlatformSettings
from conveyor.settings import Settings

#: Where the workspace appears inside the sandbox, and the tree in it (the script's working directory).
SANDBOX_ROOT = "/tmp/build"
SANDBOX_TREE = f"{SANDBOX_ROOT}/src"

#: Locale variables passed from the worker into the sandbox (harmless, and tools complain without them).
PASSED_ENV = ("LANG", "LC_ALL", "TZ")

SANDBOX_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

#: The host-side launchers' whole environment.
HOST_ENV_NAMES = ("LANG",)

#: Inodes of the workspace beyond the source's cap: the workspace's root, src and home.
SPARE_INODES = 16

#: Tar's bytes per entry beyond its data (a header, padding, a long name's extra header).
TAR_OVERHEAD = 2048

#: The host side, run with the fixed environment: join the build's cgroups, (as root) mount the workspace
#: tmpfs in this mount namespace of its own, then exec prlimit -> bwrap.
LAUNCHER = """set -eu
unset PWD OLDPWD
mount_opts=$1; count=$2; shift 2
while [ "$count" -gt 0 ]; do echo $$ > "$1"; shift; count=$((count - 1)); done
if [ "$mount_opts" != - ]; then "$1" -t tmpfs -o "$mount_opts" conveyor-build /run; fi
shift
exec "$@"
"""

#: Inside the sandbox, as the sandbox user: take the source in from stdin, say so on stdout, run the command
#: with stdout to the log, then write the tree out on stdout. The script can reach none of this but its own
#: result (which the host checks like any archive).
DRIVER = f"""tar=$1; in_ok=$2; in_failed=$3; shift 3
umask 022
mkdir -p {SANDBOX_ROOT}/home {SANDBOX_TREE} && cd {SANDBOX_TREE} || exit 125
if TAR_OPTIONS= "$tar" -x --no-same-owner -f - >&2; then echo "$in_ok"; else echo "$in_failed"; exit 125; fi
exec </dev/null
"$@" >&2
code=$?
chmod -R u+rX {SANDBOX_TREE} 2>/dev/null  # the tree is the sandbox user's own: what it locked still goes out
if ! (cd {SANDBOX_TREE} && TAR_OPTIONS= "$tar" -c -f - .); then
    echo "conveyor: the built tree could not be read whole" >&2
    [ "$code" -ne 0 ] || code=124
fi
exit $code
"""

IN_OK = b"conveyor-sandbox: source in\n"
IN_FAILED = b"conveyor-sandbox: source not in\n"

#: Sandbox configurations this process has started once (see :meth:`Sandbox.check`).
_WORKING: set[tuple[object, ...]] = set()


class Sandbox:
    """Runs one command for a build inside bubblewrap, within the limits of the platform's ``config``
    (``settings``: the library's, for the data directory)."""

    def __init__(self, settings: Settings, config: PlatformSettings) -> None:
        self.settings = config
        self.as_root = os.geteuid() == 0
        #: The user the script runs as, when the worker is root (None: the worker's own, in a user namespace).
        self.uid = config.build_sandbox_uid if self.as_root else None
        self.gid = config.build_sandbox_gid if self.as_root else None
        #: Under a root worker, each build's own uid comes from here (:mod:`conveyor.platform.builds.uids`).
        self.uid_range = config.sandbox_uid_range if self.as_root else None
        self.data_dir = Path(settings.data_dir).expanduser().resolve()
        self.limits = Limits(config.build_memory_bytes, config.build_max_processes, config.build_cpus)
        self.hierarchy: Hierarchy | None = None
        if config.build_isolation == "cgroup":
            self.hierarchy, self.why_no_cgroups = detect()
        else:
            self.why_no_cgroups = "CONVEYOR_BUILD_ISOLATION=rlimits-only"

    # -- the command lines -------------------------------------------------------

    def _tools(self) -> dict[str, str]:
        names = ["sh", "prlimit", "bwrap", "tar"] + (["setpriv", "unshare", "mount"] if self.as_root else [])
        found = {name: shutil.which(name, path=SANDBOX_PATH) for name in names}
        missing = sorted(name for name, path in found.items() if path is None)
        if missing:
            raise SandboxUnavailable(
                f"build scripts run in bubblewrap: install bubblewrap, util-linux and tar on this worker "
                f"(missing: {', '.join(missing)})"
            )
        return {name: path for name, path in found.items() if path is not None}

    def host_argv(
        self,
        tools: dict[str, str],
        args_fd: int,
        cgroup: BuildCgroup | None,
        command: list[str],
        uid: int | None = None,
        gid: int | None = None,
    ) -> list[str]:
        """The host-side command line: [unshare] -> sh (join the cgroup, mount) -> prlimit -> bwrap --args FD ->
        [setpriv] -> the driver -> ``command``. It holds no value of the build's."""
        s = self.settings
        argv: list[str] = []
        if self.as_root:
            argv += [tools["unshare"], "--mount", "--propagation", "private", "--"]
            mount = (
                f"size={s.build_workspace_bytes},nr_inodes={s.build_max_source_files + SPARE_INODES},"
                f"mode=0700,uid={uid},gid={gid}"
            )
        else:
            mount = "-"
        procs = cgroup.procs_files if cgroup is not None else []
        argv += [tools["sh"], "-c", LAUNCHER, "conveyor-launcher", mount, str(len(procs)), *procs]
        argv += [
            tools.get("mount", "-"),
            tools["prlimit"],
            f"--cpu={s.build_cpu_seconds}",
            f"--as={s.build_memory_bytes}",
        ]
        if cgroup is None:
            argv.append(f"--nproc={s.build_max_processes}")  # per user: the weaker, rlimits-only mode
        argv += [f"--fsize={s.build_max_file_bytes}", "--core=0", "--", tools["bwrap"], "--args", str(args_fd), "--"]
        if self.as_root:
            # bwrap keeps only what setpriv needs to become nobody; setpriv drops it and sets no_new_privs.
            argv += [
                tools["setpriv"],
                f"--reuid={uid}",
                f"--regid={gid}",
                "--clear-groups",
                "--inh-caps=-all",
                "--bounding-set=-all",
                "--no-new-privs",
                "--",
            ]
        markers = [IN_OK.decode().strip(), IN_FAILED.decode().strip()]
        return [*argv, tools["sh"], "-c", DRIVER, "conveyor-sandbox", tools["tar"], *markers, *command]

    def bwrap_options(self, build_env: dict[str, str], user_files: tuple[int, int] | None = None) -> list[str]:
        """bwrap's options, read from a memfd: the namespaces, the mounts, and the sandbox's whole environment."""
        s = self.settings
        opts = ["--die-with-parent", "--new-session", "--unshare-pid", "--unshare-ipc", "--unshare-uts"]
        opts.append("--unshare-cgroup-try")
        if not s.build_network:
            opts.append("--unshare-net")
        if not self.as_root:
            opts += ["--unshare-user", "--disable-userns"]
        opts += ["--hostname", "conveyor-build", "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev"]
        if user_files is not None:
            # The build's own uid has a name (tools that look themselves up find one): the host's files, one line more.
            opts += ["--perms", "0644", "--ro-bind-data", str(user_files[0]), "/etc/passwd"]
            opts += ["--perms", "0644", "--ro-bind-data", str(user_files[1]), "/etc/group"]
        opts += ["--remount-ro", "/dev", "--tmpfs", "/run"]
        if not self.data_dir.is_relative_to("/tmp") and self.data_dir.is_dir():
            # Other builds' sources, uploads and artifacts live here.
            opts += ["--tmpfs", str(self.data_dir), "--remount-ro", str(self.data_dir)]
        opts += ["--perms", "1777", "--size", str(s.build_tmp_bytes), "--tmpfs", "/tmp"]
        if self.as_root:
            opts += ["--bind", "/run", SANDBOX_ROOT]  # the launcher's tmpfs (the host's /run is not seen)
        else:
            opts += ["--perms", "0700", "--size", str(s.build_workspace_bytes), "--tmpfs", SANDBOX_ROOT]
        opts += ["--chdir", "/", "--clearenv"]  # the driver goes on into the workspace as the sandbox user
        for name, value in self.env(build_env).items():
            opts += ["--setenv", name, value]
        if self.as_root:
            opts += ["--cap-drop", "ALL"]
            for cap in ("CAP_SETUID", "CAP_SETGID", "CAP_SETPCAP"):
                opts += ["--cap-add", cap]
        return opts

    def env(self, build_env: dict[str, str]) -> dict[str, str]:
        """The sandbox's whole environment: a fixed PATH, locale, HOME and TMPDIR, and the build's own env."""
        env = {k: os.environ[k] for k in PASSED_ENV if k in os.environ}
        env.update(PATH=SANDBOX_PATH, HOME=f"{SANDBOX_ROOT}/home", TMPDIR="/tmp")
        env.update(build_env)
        return env

    @staticmethod
    def host_env() -> dict[str, str]:
        """The host-side launchers' whole environment: PATH and the worker's LANG, nothing else."""
        env = {k: os.environ[k] for k in HOST_ENV_NAMES if k in os.environ}
        env["PATH"] = SANDBOX_PATH
        return env

    # -- running -------------------------------------------------------------------

    def check(self) -> None:
        """Start an empty sandbox once per process: a worker that cannot (no user namespaces in its container,
        say) raises :class:`SandboxUnavailable`, which is retried, instead of failing the build for good; so does
        a worker that cannot make a build's cgroup while ``CONVEYOR_BUILD_ISOLATION`` is ``cgroup``."""
        if self.settings.build_isolation == "cgroup" and self.hierarchy is None:
            log_event(
                "build_isolation_unavailable",
                level="error",
                queue=None,
                job=None,
                job_id=None,
                attempt=None,
                reason=self.why_no_cgroups,
            )
            raise SandboxUnavailable(
                f"this worker cannot make a cgroup per build ({self.why_no_cgroups}): builds are refused; "
                "set CONVEYOR_BUILD_ISOLATION=rlimits-only to run them with per-process limits only"
            )
        key = (self.as_root, self.settings.build_network, str(self.data_dir), self.settings.build_isolation)
        if key in _WORKING:
            return
        log = BuildLog()
        try:
            code, started = self._run(None, ["true"], {}, Deadline(30, "sandbox check"), log, "the sandbox check")
        except BuildTimeout:
            raise SandboxUnavailable("the build sandbox did not start within 30s") from None
        if code != 0 or not started:
            raise SandboxUnavailable(f"this worker cannot start the build sandbox: {log.tail(5)[-300:]}")
        _WORKING.add(key)

    def run(
        self,
        tree: Path,
        command: list[str],
        build_env: dict[str, str],
        deadline: Deadline,
        log: BuildLog,
        what: str,
    ) -> int:
        """Run ``command`` in the sandbox on a copy of ``tree``; its output goes to ``log``. The exit status.

        When the command exits 0, ``tree`` is replaced by what it left in the workspace (within the source caps,
        else :class:`BuildFailed`). Past the deadline, or when the job itself is interrupted, the whole sandbox
        is killed; its cgroup is removed whatever happens.
        """
        refused = unsafe_names(build_env)
        if refused:
            raise BuildFailed(
                f"{', '.join(refused)}: variables that steer the dynamic loader or the C library are not accepted"
            )
        # bwrap's options are NUL-separated: a NUL in a value would add options of the tenant's choosing.
        with_nul = sorted(name for name, value in build_env.items() if "\0" in name or "\0" in value)
        if with_nul:
            raise BuildFailed(f"the values of {', '.join(with_nul)} hold a NUL byte, which no environment can carry")
        self.check()
        result = tree.parent / ".result.tar"
        try:
            code, started = self._run(tree, command, build_env, deadline, log, what, result)
            if code == 0 and started:
                self._take_result(result, tree, deadline)
        finally:
            result.unlink(missing_ok=True)
        return code

    def _take_result(self, result: Path, tree: Path, deadline: Deadline) -> None:
        shutil.rmtree(tree)
        caps = Caps(self.settings.build_max_source_bytes, self.settings.build_max_source_files)
        try:
            unpack(result, tree, caps, deadline)
        except SourceUnusable:
            raise BuildFailed(
                f"the built tree is larger than the limits ({caps.max_files} entries, {caps.max_bytes} bytes) "
                "or holds a device, a fifo or a link out of it"
            ) from None

    def _run(
        self,
        tree: Path | None,
        command: list[str],
        build_env: dict[str, str],
        deadline: Deadline,
        log: BuildLog,
        what: str,
        result: Path | None = None,
    ) -> tuple[int, bool]:
        """Start the sandbox on ``tree`` (None: an empty one), wait for it; (exit status, whether the source got in).

        What comes back is written to ``result`` (None: dropped). Under a root worker with a uid range, the
        build runs as a uid of its own, held until its last process is gone."""
        tools = self._tools()
        claim = claim_uid(*self.uid_range) if self.uid_range is not None else None
        try:
            uid, gid = (claim.uid, claim.uid) if claim is not None else (self.uid, self.gid)
            return self._run_as(
                uid, gid, claim is not None, tools, tree, command, build_env, deadline, log, what, result
            )
        finally:
            if claim is not None:
                claim.release()

    def _run_as(
        self,
        uid: int | None,
        gid: int | None,
        named: bool,
        tools: dict[str, str],
        tree: Path | None,
        command: list[str],
        build_env: dict[str, str],
        deadline: Deadline,
        log: BuildLog,
        what: str,
        result: Path | None,
    ) -> tuple[int, bool]:
        cgroup = BuildCgroup(self.hierarchy, self.limits) if self.hierarchy is not None else None
        fds: list[int] = []
        try:
            user_files = None
            if named:
                user_files = (
                    _memfd(
                        "conveyor-passwd",
                        _user_line("/etc/passwd", f"conveyor-build:x:{uid}:{gid}::{SANDBOX_ROOT}/home:/bin/sh"),
                    ),
                    _memfd("conveyor-group", _user_line("/etc/group", f"conveyor-build:x:{gid}:")),
                )
                fds += user_files
            options = self.bwrap_options(build_env, user_files)
            args_fd = _memfd("conveyor-bwrap-args", b"".join(opt.encode() + b"\0" for opt in options))
            fds.append(args_fd)
            proc = subprocess.Popen(
                self.host_argv(tools, args_fd, cgroup, command, uid, gid),
                env=self.host_env(),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                pass_fds=tuple(fds),
                start_new_session=True,
            )
        except BaseException:
            if cgroup is not None:
                cgroup.remove()
            raise
        finally:
            for fd in fds:
                os.close(fd)
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        cap = self.settings.build_workspace_bytes + TAR_OVERHEAD * (self.settings.build_max_source_files + SPARE_INODES)
        out = _Result(proc.stdout, result, cap)
        threads = [
            threading.Thread(target=_send, args=(tree, proc.stdin), name="conveyor-build-in", daemon=True),
            threading.Thread(target=out.read, name="conveyor-build-out", daemon=True),
            threading.Thread(
                target=_pump,
                args=(io.TextIOWrapper(proc.stderr, errors="replace"), log),
                name="conveyor-build-log",
                daemon=True,
            ),
        ]
        for thread in threads:
            thread.start()
        try:
            code = proc.wait(timeout=deadline.remaining())
        except (subprocess.TimeoutExpired, BuildTimeout):
            _kill(proc)
            raise BuildTimeout(
                f"{deadline.kind} build exceeded its time limit of {deadline.seconds:g}s in {what}"
            ) from None
        except BaseException:
            # The job's own time limit (or a shutdown) interrupted us: leave no build running.
            _kill(proc)
            raise
        finally:
            if cgroup is not None:
                usage = cgroup.usage()
                cgroup.remove()
                if tree is not None:
                    log.write(_usage_line(usage, self.limits))
            for thread in threads:
                thread.join(timeout=5)
        if out.state == IN_FAILED:
            raise BuildFailed(
                f"the source does not fit in the build's workspace ({self.settings.build_workspace_bytes} bytes, "
                f"CONVEYOR_BUILD_WORKSPACE_BYTES): {log.tail(3)}"
            )
        if code == 0 and out.overflow:
            raise BuildFailed(f"the built tree is larger than the workspace allows ({cap} bytes as a tar stream)")
        return code, out.state == IN_OK


def _memfd(name: str, data: bytes) -> int:
    """An anonymous in-memory file holding ``data``, at offset 0: for bwrap to read (never on a disk, never in argv)."""
    fd = os.memfd_create(name, os.MFD_CLOEXEC)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _user_line(path: str, line: str) -> bytes:
    """The host's ``path`` (passwd or group) with ``line`` added."""
    try:
        with open(path, "rb") as fh:
            text = fh.read()
    except OSError:
        text = b""
    if text and not text.endswith(b"\n"):
        text += b"\n"
    return text + line.encode() + b"\n"


def _usage_line(usage: Usage, limits: Limits) -> str:
    """What the build used against its caps, for its log (the kernel's own counts, from its cgroup)."""

    def known(value: int | None) -> str:
        return "?" if value is None else str(value)

    line = (
        f"sandbox: peak memory {known(usage.peak_memory_bytes)} of {limits.memory_bytes} bytes, "
        f"peak processes {known(usage.peak_processes)} of {limits.max_processes}"
    )
    if usage.oom_kills:
        line += f"; {usage.oom_kills} process(es) killed at the memory limit (CONVEYOR_BUILD_MEMORY_BYTES)"
    return line


class _Result:
    """Reads the sandbox's stdout: the driver's word on the source, then the built tree as a tar stream."""

    def __init__(self, stream: IO[bytes], dest: Path | None, cap: int) -> None:
        self.stream, self.dest, self.cap = stream, dest, cap
        self.state: bytes | None = None
        self.overflow = False

    def read(self) -> None:
        try:
            line = self.stream.readline(len(IN_FAILED) + 1)
            if line not in (IN_OK, IN_FAILED):
                return
            self.state = line
            if self.dest is None:
                while self.stream.read(READ_LIMIT):
                    pass
                return
            written = 0
            with open(self.dest, "wb") as fh:
                while chunk := self.stream.read(READ_LIMIT):
                    written += len(chunk)
                    if written > self.cap:
                        # Stop here: the sandbox's tar gets EPIPE; the build fails.
                        self.overflow = True
                        return
                    fh.write(chunk)
        finally:
            self.stream.close()


def _send(tree: Path | None, stream: IO[bytes]) -> None:
    """Write ``tree`` (None: nothing) as a tar stream to the sandbox's stdin."""
    import tarfile

    try:
        with tarfile.open(fileobj=stream, mode="w|", format=tarfile.PAX_FORMAT) as tar:
            if tree is not None:
                for path in sorted(tree.iterdir()):
                    tar.add(str(path), arcname=path.name)
    except (BrokenPipeError, ValueError, OSError):
        pass  # the sandbox is gone (killed, or past its workspace): its exit says why
    finally:
        try:
            stream.close()
        except OSError:
            pass


#: The longest piece of output read at once: a script that prints gigabytes without a newline
#: must not make the worker hold them.
READ_LIMIT = 64 * 1024


def _pump(stream: IO[str], log: BuildLog) -> None:
    while line := stream.readline(READ_LIMIT):
        log.write(line)
    stream.close()


def _kill(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the launcher's process group: bwrap's pid 1 dies with it, and with it every process inside
    (the build's cgroup is swept after)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()
