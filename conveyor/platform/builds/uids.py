"""One uid per running build: what the kernel counts per user is then the build's own.

Under a root worker every build used to run as ``nobody``: the kernel's
per-user counts (processes under ``RLIMIT_NPROC``, inotify instances and
watches, keyring quotas, queued signals, POSIX message queue bytes) were shared
by every tenant's build, and one build that took them all made the others
fail. Each build now claims a uid from ``CONVEYOR_BUILD_SANDBOX_UIDS`` for as
long as it runs: an exclusive ``flock`` on ``<LOCK_DIR>/<uid>``, held by the
worker, which the kernel releases when the worker exits however it exits (a
SIGKILLed worker's sandbox dies with it: bwrap ``--die-with-parent``). Worker
processes on one host share the lock directory; workers in containers that do
not share ``/run`` need disjoint ranges.
"""

from __future__ import annotations

import fcntl
import os
from dataclasses import dataclass, field

from conveyor.platform.errors import SandboxUnavailable

#: Where the claims live: host-local (never on a shared data volume, where flock may not hold), root's only.
LOCK_DIR = "/run/conveyor-build-uids"


@dataclass
class UidClaim:
    """A uid held for one build: :meth:`release` (or the worker's exit) gives it back."""

    uid: int
    _fd: int = field(repr=False)

    def release(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)  # closing the only descriptor drops the flock
            self._fd = -1


def claim_uid(first: int, last: int, lock_dir: str = LOCK_DIR) -> UidClaim:
    """A uid in ``first..last`` no other running build on this host holds; :class:`SandboxUnavailable` if none."""
    os.makedirs(lock_dir, mode=0o700, exist_ok=True)
    count = last - first + 1
    # The lowest free one: the lock files stay as few as the builds that ever ran at once.
    for uid in range(first, last + 1):
        fd = os.open(os.path.join(lock_dir, str(uid)), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        except BaseException:
            os.close(fd)
            raise
        return UidClaim(uid, fd)
    raise SandboxUnavailable(f"all {count} build uids (CONVEYOR_BUILD_SANDBOX_UIDS) are in use on this host")
