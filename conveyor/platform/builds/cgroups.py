"""One cgroup per build: its memory, its process count and its CPU, the whole process tree counted.

The worker makes the build's cgroup under its own (``/proc/self/cgroup``), one
per controller, before the sandbox starts; the launcher joins it before it
starts anything, so every process of the build is in it from the first; the
worker kills what is left in it and removes it after the build, however the
build ended (a success, a failure, a timeout, the job interrupted).

- **cgroup v2** where the host's unified hierarchy has the ``memory``, ``pids``
  and ``cpu`` controllers for the worker's cgroup (``memory.max``,
  ``memory.swap.max``, ``pids.max``, ``cpu.max``);
- else **cgroup v1**, the ``memory``, ``pids`` and ``cpu`` hierarchies
  (``memory.limit_in_bytes`` and ``memory.memsw.limit_in_bytes``, ``pids.max``,
  ``cpu.cfs_quota_us``);
- else none: :func:`detect` says why, and the sandbox refuses builds unless
  ``CONVEYOR_BUILD_ISOLATION=rlimits-only``.

A cgroup left behind by a worker that was killed is removed by the next one
that makes a cgroup beside it, once it is empty and older than :data:`STALE_AFTER`.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

#: The controllers a build's cgroup needs.
CONTROLLERS = ("memory", "pids", "cpu")

#: Every build cgroup's name starts with this.
PREFIX = "conveyor-build-"

#: The CFS period the CPU quota is a share of (the kernel's default), microseconds.
CPU_PERIOD_US = 100_000

#: Seconds an empty build cgroup may stay before another worker removes it (made, not yet joined: a few ms).
STALE_AFTER = 60.0


@dataclass(frozen=True)
class Limits:
    """What one build may use."""

    memory_bytes: int
    max_processes: int
    cpus: float


@dataclass(frozen=True)
class Hierarchy:
    """Where this process may make build cgroups: ``v2`` with one parent, or ``v1`` with one per controller."""

    version: str
    #: controller -> the directory build cgroups are made in (v2: the same directory for each).
    parents: dict[str, Path]


@dataclass(frozen=True)
class Usage:
    """The most a build used, as its cgroup counted it (None where the kernel does not keep it)."""

    peak_memory_bytes: int | None
    peak_processes: int | None
    oom_kills: int | None


def _mounts() -> list[tuple[str, str, list[str]]]:
    """(mount point, filesystem type, super options) of each mount this process sees."""
    found = []
    with open("/proc/self/mountinfo") as fh:
        for line in fh:
            left, _, right = line.partition(" - ")
            fields, rest = left.split(), right.split()
            if len(fields) >= 5 and len(rest) >= 3:
                found.append((fields[4].replace("\\040", " "), rest[0], rest[2].split(",")))
    return found


def _own_paths() -> dict[str, str]:
    """controller (or "" for v2) -> this process's cgroup path, from /proc/self/cgroup."""
    paths = {}
    with open("/proc/self/cgroup") as fh:
        for line in fh:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            for controller in controllers.split(",") if controllers else [""]:
                paths[controller] = path
    return paths


def _writable_dir(path: Path) -> bool:
    return path.is_dir() and os.access(path, os.W_OK | os.X_OK)


def _v2(mounts: list[tuple[str, str, list[str]]], own: dict[str, str]) -> tuple[Hierarchy | None, str]:
    mount = next((point for point, fstype, _ in mounts if fstype == "cgroup2"), None)
    if mount is None or "" not in own:
        return None, "no cgroup v2 hierarchy"
    parent = Path(mount) / own[""].lstrip("/")
    try:
        available = (parent / "cgroup.controllers").read_text().split()
        enabled = (parent / "cgroup.subtree_control").read_text().split()
    except OSError:
        return None, "cgroup v2: cannot read the worker's cgroup"
    missing = [c for c in CONTROLLERS if c not in available]
    if missing:
        return None, f"cgroup v2: the worker's cgroup lacks the {', '.join(missing)} controller(s)"
    if not _writable_dir(parent):
        return None, "cgroup v2: the worker's cgroup is not writable (not delegated)"
    wanted = [c for c in CONTROLLERS if c not in enabled]
    if wanted:
        try:
            # Refused (EBUSY) while the worker's own cgroup holds processes: delegate a cgroup with a leaf for them.
            (parent / "cgroup.subtree_control").write_text(" ".join(f"+{c}" for c in wanted))
        except OSError as exc:
            return None, f"cgroup v2: cannot enable {', '.join(wanted)} below the worker's cgroup ({exc.strerror})"
    return Hierarchy("v2", {c: parent for c in CONTROLLERS}), ""


def _v1(mounts: list[tuple[str, str, list[str]]], own: dict[str, str]) -> tuple[Hierarchy | None, str]:
    parents = {}
    for controller in CONTROLLERS:
        mount = next((p for p, fstype, opts in mounts if fstype == "cgroup" and controller in opts), None)
        if mount is None or controller not in own:
            return None, f"cgroup v1: no {controller} hierarchy"
        parent = Path(mount) / own[controller].lstrip("/")
        if not _writable_dir(parent):
            return None, f"cgroup v1: the worker's {controller} cgroup is not writable"
        parents[controller] = parent
    return Hierarchy("v1", parents), ""


def detect() -> tuple[Hierarchy | None, str]:
    """Where this process can make build cgroups, or (None, why not)."""
    try:
        mounts, own = _mounts(), _own_paths()
    except OSError as exc:
        return None, f"cannot read this process's cgroups ({exc.strerror})"
    found, why_not_v2 = _v2(mounts, own)
    if found is not None:
        return found, ""
    found, why_not_v1 = _v1(mounts, own)
    if found is not None:
        return found, ""
    return None, f"{why_not_v2}; {why_not_v1}"


class BuildCgroup:
    """The cgroup of one build: made with its limits, joined by the launcher, removed with :meth:`remove`."""

    def __init__(self, hierarchy: Hierarchy, limits: Limits) -> None:
        self.hierarchy = hierarchy
        name = f"{PREFIX}{os.getpid()}-{uuid.uuid4().hex[:12]}"
        #: controller -> this build's directory (v2: one directory, named for each controller).
        self.dirs = {c: parent / name for c, parent in hierarchy.parents.items()}
        for parent in set(hierarchy.parents.values()):
            _sweep(parent)
        try:
            for path in self._unique_dirs():
                path.mkdir()
            self._limit(limits)
        except BaseException:
            self.remove()
            raise

    def _unique_dirs(self) -> list[Path]:
        return list(dict.fromkeys(self.dirs.values()))

    def _limit(self, limits: Limits) -> None:
        memory, pids, cpu = self.dirs["memory"], self.dirs["pids"], self.dirs["cpu"]
        quota = max(1000, int(limits.cpus * CPU_PERIOD_US))
        if self.hierarchy.version == "v2":
            (memory / "memory.max").write_text(str(limits.memory_bytes))
            _write_if_present(memory / "memory.swap.max", "0")
            (pids / "pids.max").write_text(str(limits.max_processes))
            (cpu / "cpu.max").write_text(f"{quota} {CPU_PERIOD_US}")
        else:
            (memory / "memory.limit_in_bytes").write_text(str(limits.memory_bytes))
            # memory + swap: only after the memory limit (the kernel keeps memsw >= memory).
            _write_if_present(memory / "memory.memsw.limit_in_bytes", str(limits.memory_bytes))
            (pids / "pids.max").write_text(str(limits.max_processes))
            (cpu / "cpu.cfs_period_us").write_text(str(CPU_PERIOD_US))
            (cpu / "cpu.cfs_quota_us").write_text(str(quota))

    @property
    def procs_files(self) -> list[str]:
        """The ``cgroup.procs`` files a process writes its pid to, to join the build's cgroup."""
        return [str(path / "cgroup.procs") for path in self._unique_dirs()]

    def usage(self) -> Usage:
        """The build's peak memory and process count, and how often the kernel killed one of its processes."""
        memory, pids = self.dirs["memory"], self.dirs["pids"]
        if self.hierarchy.version == "v2":
            peak = _read_int(memory / "memory.peak")
            oom = _read_key(memory / "memory.events", "oom_kill")
        else:
            peak = _read_int(memory / "memory.max_usage_in_bytes")
            oom = _read_key(memory / "memory.oom_control", "oom_kill")
        return Usage(peak, _read_int(pids / "pids.peak"), oom)

    def remove(self, timeout: float = 10.0) -> None:
        """Kill every process left in the cgroup and remove it. Never raises: a leftover is swept later."""
        end = time.monotonic() + timeout
        for path in self._unique_dirs():
            while path.exists():
                if _kill_all(path) == 0:
                    try:
                        path.rmdir()
                        break
                    except OSError:
                        pass  # EBUSY: a process was still exiting
                if time.monotonic() > end:
                    break
                time.sleep(0.02)


def _kill_all(path: Path) -> int:
    """SIGKILL every process in the cgroup at ``path`` (v2's cgroup.kill where there is one); how many there were."""
    try:
        pids = [int(p) for p in (path / "cgroup.procs").read_text().split()]
    except (OSError, ValueError):
        return 0
    if pids and (path / "cgroup.kill").exists():
        _write_if_present(path / "cgroup.kill", "1")
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    return len(pids)


def _sweep(parent: Path) -> None:
    """Remove build cgroups a killed worker left here: empty ones only (rmdir refuses the others)."""
    try:
        entries = list(parent.glob(f"{PREFIX}*"))
    except OSError:
        return
    for path in entries:
        try:
            if time.time() - path.stat().st_mtime > STALE_AFTER:
                path.rmdir()
        except OSError:
            pass


def _write_if_present(path: Path, value: str) -> None:
    try:
        path.write_text(value)
    except FileNotFoundError:
        pass


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _read_key(path: Path, key: str) -> int | None:
    try:
        for line in path.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    except (OSError, ValueError):
        pass
    return None
