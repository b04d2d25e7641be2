"""A worker host of its own: a network namespace joined to this one by a veth pair.

The namespace side gets ``ns_address``, this side ``host_address`` (both in
198.18.0.0/15, the benchmark range, never routed anywhere); servers listen
on ``host_address`` too. :meth:`cut` takes this side's link down: packets to
and from the namespace vanish silently (nothing answers, nothing resets),
the way a dead switch port or a partition looks to the worker, whose calls
hang until their timeouts. :meth:`heal` brings the link back.

Names are unique per run and everything is deleted in :meth:`close`.
"""

from __future__ import annotations

import os
import random
import subprocess


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30, check=check)


class NetworkNamespace:
    def __init__(self) -> None:
        tag = f"{os.getpid() % 100000:05d}{random.randrange(16**3):03x}"
        self.name = f"cvfault{tag}"
        self.host_link = f"cvh{tag}"  # at most 15 characters
        self.ns_link = f"cvn{tag}"
        third, fourth = random.randrange(256), 4 * random.randrange(64)
        self.host_address = f"198.19.{third}.{fourth + 1}"
        self.ns_address = f"198.19.{third}.{fourth + 2}"
        self._made: list[str] = []
        try:
            _ip("netns", "add", self.name)
            self._made.append("netns")
            _ip("link", "add", self.host_link, "type", "veth", "peer", "name", self.ns_link)
            self._made.append("link")
            _ip("link", "set", self.ns_link, "netns", self.name)
            _ip("addr", "add", f"{self.host_address}/30", "dev", self.host_link)
            _ip("link", "set", self.host_link, "up")
            self.exec_ip("addr", "add", f"{self.ns_address}/30", "dev", self.ns_link)
            self.exec_ip("link", "set", self.ns_link, "up")
            self.exec_ip("link", "set", "lo", "up")
        except BaseException:
            self.close()
            raise

    @property
    def prefix(self) -> list[str]:
        """The command prefix that runs a program on this host."""
        return ["ip", "netns", "exec", self.name]

    def exec_ip(self, *args: str) -> None:
        subprocess.run([*self.prefix, "ip", *args], capture_output=True, text=True, timeout=30, check=True)

    def cut(self) -> None:
        _ip("link", "set", self.host_link, "down")

    def heal(self) -> None:
        _ip("link", "set", self.host_link, "up")

    def close(self) -> None:
        """Delete the link pair and the namespace (whatever of them was made); idempotent."""
        if "link" in self._made:
            _ip("link", "del", self.host_link, check=False)  # deletes its peer too
        if "netns" in self._made:
            _ip("netns", "del", self.name, check=False)
        self._made.clear()
