"""`conveyor worker --health-port` (issue 22, item 6): the probes Kubernetes' manifests point at.

/livez answers 200 while the supervisor's loop turns; /healthz answers 200 only while every worker process
runs and the broker answers, and 503 (saying which, never an error's text) when the broker is gone.
"""

from __future__ import annotations

import httpx

from tests.support.harness import WorkerProcess, make_settings
from tests.support.servers import RedisServer, free_port
from tests.support.waiting import wait_for


def status(port: int, path: str) -> tuple[int, str] | None:
    try:
        response = httpx.get(f"http://127.0.0.1:{port}{path}", timeout=5)
    except httpx.TransportError:
        return None
    return response.status_code, response.text.strip()


def test_health_follows_the_worker_processes_and_the_broker(tmp_path, clean_env, database_url):
    redis = RedisServer(tmp_path / "redis")
    try:
        settings = make_settings("redis", redis.url, database_url)
        port = free_port()
        worker = WorkerProcess(
            settings, "critical", 2, log=tmp_path / "worker.log", CONVEYOR_WORKER_HEALTH_PORT=str(port)
        )
        try:
            wait_for(lambda: status(port, "/healthz") == (200, "ok"), message="/healthz to answer ok")
            assert status(port, "/livez") == (200, "ok")
            assert status(port, "/metrics")[0] == 404
            redis.close()  # the broker is gone: not ready, still alive (a restart would not bring Redis back)
            wait_for(
                lambda: status(port, "/healthz") == (503, "broker unreachable"),
                message="/healthz to refuse without Redis",
            )
            assert status(port, "/livez") == (200, "ok")
            assert redis.url not in (tmp_path / "worker.log").read_text()
        finally:
            worker.terminate()
    finally:
        redis.close()
