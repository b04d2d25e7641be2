"""``conveyor api`` as users run it: a subprocess on a free port, with this test's private servers."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import psutil

from tests.support.obs_support import TOKEN, CliProcess, cli_env
from tests.support.servers import free_port
from tests.support.waiting import wait_for


@contextmanager
def conveyor_api(clean_env, tmp_path, database_url: str, redis_url: str, **variables: str) -> Iterator[tuple]:
    """``conveyor api`` on a free port; yields (base URL, psutil.Process)."""
    port = free_port()
    env = cli_env(
        clean_env,
        DATABASE_URL=database_url,
        REDIS_URL=redis_url,
        CONVEYOR_BROKER="redis",
        CONVEYOR_ADMIN_TOKEN=TOKEN,
        CONVEYOR_API_HOST="127.0.0.1",
        CONVEYOR_API_PORT=str(port),
        CONVEYOR_DATA_DIR=str(tmp_path / "data"),
        **variables,
    )
    process = CliProcess(["api"], env, tmp_path / "api.log")
    base = f"http://127.0.0.1:{port}"

    def up() -> bool:
        try:
            return httpx.get(f"{base}/metrics", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_for(up, timeout=60, message="conveyor api to answer")
        yield base, psutil.Process(process.process.pid)
    finally:
        code = process.stop()
        assert code == 0, process.output()[-3000:]
