"""Memory and CPU of processes, read from Linux's /proc (no dependency, no sampling thread)."""

from __future__ import annotations

import os

_TICK = os.sysconf("SC_CLK_TCK")


def _stat_fields(pid: int) -> list[bytes]:
    with open(f"/proc/{pid}/stat", "rb") as f:
        # The command name may hold spaces and parentheses: split after its last ")".
        return f.read().rsplit(b")", 1)[1].split()


def peak_rss_kb(pid: int) -> int:
    """The process's peak resident set size (VmHWM), in KiB; 0 when it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def cpu_seconds(pid: int) -> float:
    """User + system CPU of the process itself; 0 when it is gone."""
    try:
        fields = _stat_fields(pid)
    except OSError:
        return 0.0
    # Fields 14 and 15 of stat (utime, stime); index 11, 12 after the name is cut off.
    return (int(fields[11]) + int(fields[12])) / _TICK


def tree_cpu_seconds(pid: int) -> float:
    """CPU of a process, of its children that ended (cutime, cstime) and of its live children.

    For Postgres: the postmaster reaps every backend, so backends that came
    and went are counted too.
    """
    try:
        fields = _stat_fields(pid)
    except OSError:
        return 0.0
    total = sum(int(x) for x in fields[11:15]) / _TICK
    return total + sum(cpu_seconds(child) for child in children(pid))


def children(parent: int) -> list[int]:
    """Direct children of ``parent``."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if int(_stat_fields(int(entry))[1]) == parent:
                out.append(int(entry))
        except (OSError, IndexError, ValueError):
            continue
    return out
