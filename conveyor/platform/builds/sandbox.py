"""The build sandbox: a build script runs in bubblewrap, as nobody, with limits, seeing nothing of the worker.

A ``.conveyor-build`` script is code from whoever uploaded the source. Run as
the worker it read ``/proc/$PPID/environ`` and printed the admin token, the
secret key and the provider key. Here it runs as ``bwrap`` (Debian's
``bubblewrap``) with:

- **its own namespaces**: pid (its ``/proc`` shows its own processes only, so
  no other process's environ), ipc, uts, cgroup, and net (loopback only,
  unless ``CONVEYOR_BUILD_NETWORK`` is on);
- **the host read-only**, with a private size-capped ``/tmp`` and an empty
  ``/run`` (no host sockets), the data directory hidden, and only its
  workspace writable, mounted at ``/tmp/build``;
- **a clean environment**: PATH, LANG, HOME, TMPDIR and the build's own env,
  nothing of the worker's;
- **an unprivileged user**: when the worker is root the workspace is handed to
  ``CONVEYOR_BUILD_SANDBOX_UID`` (nobody) and the script runs as that user
  with no capabilities and ``no_new_privs``; a worker that is not root runs
  bwrap in a user namespace as its own (unprivileged) user;
- **limits** (``prlimit``): CPU seconds, address space, processes of the
  sandbox user, file size; plus the variant's wall-clock limit, past which the
  whole sandbox is killed (bwrap's pid 1 dies, the kernel kills the rest).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import threading
from pathlib import Path
from typing import IO

from conveyor.errors import BuildTimeout, SandboxUnavailable
from conveyor.platform.builds.builder import BuildLog, Deadline
from conveyor.settings import Settings

#: Where the workspace appears inside the sandbox.
SANDBOX_ROOT = "/tmp/build"

#: Locale variables passed from the worker (harmless, and tools complain without them).
PASSED_ENV = ("LANG", "LC_ALL", "TZ")

SANDBOX_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

#: Sandbox configurations this process has started once (see :meth:`Sandbox.check`).
_WORKING: set[tuple[bool, bool, str]] = set()


class Sandbox:
    """Runs one command for a build inside bubblewrap, within the limits of ``settings``."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.as_root = os.geteuid() == 0
        #: The host uid files written by the script belong to (None: the worker's own).
        self.uid = settings.build_sandbox_uid if self.as_root else None
        self.gid = settings.build_sandbox_gid if self.as_root else None
        self.data_dir = Path(settings.data_dir).expanduser().resolve()

    def hand_over(self, workspace: Path) -> None:
        """Give the workspace to the sandbox user, so the script can write it and nothing else."""
        if self.uid is None or self.gid is None:  # both, or neither (a worker that is not root)
            return
        os.chown(workspace, self.uid, self.gid)
        for dirpath, dirnames, filenames in os.walk(workspace):
            for name in dirnames + filenames:
                os.chown(os.path.join(dirpath, name), self.uid, self.gid, follow_symlinks=False)

    def argv(self, workspace: Path, cwd: str, command: list[str]) -> list[str]:
        """The full command line: prlimit, bwrap with its mounts, the user switch, ``command``."""
        bwrap, prlimit = shutil.which("bwrap"), shutil.which("prlimit")
        setpriv = shutil.which("setpriv") if self.as_root else ""  # only root switches to the sandbox user
        if bwrap is None or prlimit is None or setpriv is None:
            raise SandboxUnavailable(
                "build scripts run in bubblewrap: install the bubblewrap and util-linux packages on this worker"
            )
        s = self.settings
        argv = [
            prlimit,
            f"--cpu={s.build_cpu_seconds}",
            f"--as={s.build_memory_bytes}",
            f"--nproc={s.build_max_processes}",
            f"--fsize={s.build_max_file_bytes}",
            "--core=0",
            "--",
            bwrap,
            "--die-with-parent",
            "--new-session",
            "--unshare-pid",
            "--unshare-ipc",
            "--unshare-uts",
            "--unshare-cgroup-try",
        ]
        if not s.build_network:
            argv.append("--unshare-net")
        if not self.as_root:
            argv += ["--unshare-user", "--disable-userns"]
        argv += [
            "--hostname",
            "conveyor-build",
            "--ro-bind",
            "/",
            "/",
            "--proc",
            "/proc",
            "--dev",
            "/dev",
            "--remount-ro",
            "/dev",
            "--tmpfs",
            "/run",
        ]
        if not self.data_dir.is_relative_to("/tmp") and self.data_dir.is_dir():
            # Other builds' workspaces, uploads and artifacts live here.
            argv += ["--tmpfs", str(self.data_dir), "--remount-ro", str(self.data_dir)]
        argv += [
            "--perms",
            "1777",
            "--size",
            str(s.build_tmp_bytes),
            "--tmpfs",
            "/tmp",
            "--bind",
            str(workspace),
            SANDBOX_ROOT,
            "--chdir",
            f"{SANDBOX_ROOT}/{cwd}",
        ]
        if self.as_root:
            # bwrap keeps only what setpriv needs to become nobody; setpriv drops it and sets no_new_privs.
            argv += [
                "--cap-drop",
                "ALL",
                "--cap-add",
                "CAP_SETUID",
                "--cap-add",
                "CAP_SETGID",
                "--cap-add",
                "CAP_SETPCAP",
                "--",
                setpriv,
                f"--reuid={self.uid}",
                f"--regid={self.gid}",
                "--clear-groups",
                "--inh-caps=-all",
                "--bounding-set=-all",
                "--no-new-privs",
            ]
        return [*argv, "--", *command]

    def check(self, workspace: Path) -> None:
        """Start an empty sandbox once per process: a worker that cannot (no user namespaces in its container,
        say) raises :class:`SandboxUnavailable`, which is retried, instead of failing the build for good."""
        key = (self.as_root, self.settings.build_network, str(self.data_dir))
        if key in _WORKING:
            return
        probe = workspace / ".sandbox-check"
        probe.mkdir(exist_ok=True)
        self.hand_over(probe)
        try:
            done = subprocess.run(
                self.argv(probe, ".", ["true"]),
                env=self.env({}),
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                errors="replace",
                timeout=30,
            )
        except subprocess.TimeoutExpired:
            raise SandboxUnavailable("the build sandbox did not start within 30s") from None
        finally:
            shutil.rmtree(probe, ignore_errors=True)
        if done.returncode != 0:
            raise SandboxUnavailable(f"this worker cannot start the build sandbox: {done.stderr.strip()[-300:]}")
        _WORKING.add(key)

    def env(self, build_env: dict[str, str]) -> dict[str, str]:
        """The script's whole environment: a fixed PATH, locale, HOME and TMPDIR, and the build's own env."""
        env = {k: os.environ[k] for k in PASSED_ENV if k in os.environ}
        env.update(PATH=SANDBOX_PATH, HOME=f"{SANDBOX_ROOT}/home", TMPDIR="/tmp")
        env.update(build_env)
        return env

    def run(
        self,
        workspace: Path,
        cwd: str,
        command: list[str],
        build_env: dict[str, str],
        deadline: Deadline,
        log: BuildLog,
        what: str,
    ) -> int:
        """Run ``command`` in the sandbox with ``workspace`` writable; its output goes to ``log``. The exit status.

        Past the deadline, or when the job itself is interrupted, the whole sandbox is killed.
        """
        self.check(workspace)
        (workspace / "home").mkdir(exist_ok=True)
        self.hand_over(workspace)
        argv = self.argv(workspace, cwd, command)
        # bwrap itself gets the clean environment too: its pid 1 is in the sandbox's /proc.
        proc = subprocess.Popen(
            argv,
            env=self.env(build_env),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            start_new_session=True,
        )
        reader = threading.Thread(target=_pump, args=(proc.stdout, log), name="conveyor-build-log", daemon=True)
        reader.start()
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
            reader.join(timeout=5)
        return code


#: The longest piece of output read at once: a script that prints gigabytes without a newline
#: must not make the worker hold them.
READ_LIMIT = 64 * 1024


def _pump(stream: IO[str], log: BuildLog) -> None:
    while line := stream.readline(READ_LIMIT):
        log.write(line)
    stream.close()


def _kill(proc: subprocess.Popen[str]) -> None:
    """SIGKILL prlimit/bwrap's process group: bwrap's pid 1 dies with it, and with it every process inside."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()
