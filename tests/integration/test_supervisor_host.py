"""What an operator sees of two supervisors on one host: metrics that do not clash, processes named for their role."""

from __future__ import annotations

import random
import socket
from pathlib import Path

import httpx

from conveyor.middleware.metrics import WorkerMetrics


def free_port_pair() -> int:
    """A port ``p`` with ``p`` and ``p + 1`` both free, below the kernel's ephemeral range.

    The kernel's own choice (port 0) lands in the ephemeral range, where any outgoing
    connection of another test may take ``p + 1`` a moment later (CI saw it once);
    ports below that range are only ever taken by an explicit bind.
    """
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    for _ in range(200):
        port = random.randrange(max(1024, low - 12000), low - 2)
        try:
            with socket.socket() as a, socket.socket() as b:
                a.bind(("127.0.0.1", port))
                b.bind(("127.0.0.1", port + 1))
        except OSError:
            continue
        return port
    raise RuntimeError("no two consecutive free ports below the ephemeral range")


def test_a_second_supervisor_on_the_host_serves_its_metrics_on_the_next_port(tmp_path, caplog):
    port = free_port_pair()
    first, second = WorkerMetrics(str(tmp_path / "a")), WorkerMetrics(str(tmp_path / "b"))
    try:
        assert first.serve("127.0.0.1", port) == port
        assert second.serve("127.0.0.1", port) == port + 1
        for served in (port, port + 1):
            assert httpx.get(f"http://127.0.0.1:{served}/metrics", timeout=5).status_code == 200
    finally:
        second.close()
        first.close()
    assert [r for r in caplog.records if '"metrics_served"' in r.getMessage() and str(port + 1) in r.getMessage()]
