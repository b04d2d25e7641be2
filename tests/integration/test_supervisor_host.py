"""What an operator sees of two supervisors on one host: metrics that do not clash, processes named for their role."""

from __future__ import annotations

import httpx

from conveyor.middleware.metrics import WorkerMetrics
from tests.support.servers import free_port


def test_a_second_supervisor_on_the_host_serves_its_metrics_on_the_next_port(tmp_path, caplog):
    port = free_port()
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
