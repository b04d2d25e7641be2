"""Environment variable names a build may not set: those that steer the dynamic loader or the C library.

The reference is glibc's own list of variables it drops for setuid programs
(``sysdeps/generic/unsecvars.h``): each makes a program load code or read files
the variable names (``LD_PRELOAD``, ``GCONV_PATH``, ``LOCPATH``, ...) or change how
it allocates (``MALLOC_*``) and resolves names (``HOSTALIASES``, ``RES_OPTIONS``).
``LD_*``, ``MALLOC_*`` and ``GLIBC_*`` are refused as whole families, so a name
a newer glibc adds is refused too. The sandbox sets ``TMPDIR`` itself.

The check runs twice: at the API (a 422 naming the variable) and in the sandbox
before anything starts, so a payload that bypassed validation still runs nothing.
"""

from __future__ import annotations

from collections.abc import Iterable

#: Names glibc drops for setuid programs (unsecvars.h), beyond the prefixes below.
UNSAFE_NAMES = frozenset(
    {
        "GCONV_PATH",
        "GETCONF_DIR",
        "HOSTALIASES",
        "LOCALDOMAIN",
        "LOCPATH",
        "NIS_PATH",
        "NLSPATH",
        "RESOLV_HOST_CONF",
        "RES_OPTIONS",
        "TMPDIR",
        "TZDIR",
    }
)

#: Whole families: the loader (LD_PRELOAD, LD_LIBRARY_PATH, LD_AUDIT, ...), malloc's tunables, glibc's tunables.
UNSAFE_PREFIXES = ("LD_", "MALLOC_", "GLIBC_")


def unsafe(name: str) -> bool:
    """True when ``name`` steers the dynamic loader or the C library (compared without regard to case)."""
    upper = name.upper()
    return upper in UNSAFE_NAMES or upper.startswith(UNSAFE_PREFIXES)


def unsafe_names(names: Iterable[str]) -> list[str]:
    """The names among ``names`` a build may not set, sorted."""
    return sorted(name for name in names if unsafe(name))
