"""A real Prometheus scrapes the API: jobs enqueued by a CLI process nobody scrapes show in a PromQL query.

Needs Debian's ``prometheus`` (``.ci/run`` installs it).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import httpx
import pytest

from tests.support.brokers import SERVER_BROKERS
from tests.support.obs_support import ROOT, api_server, cli_env, running
from tests.support.obs_support import broker_app as make_app
from tests.support.servers import free_port
from tests.support.waiting import wait_for

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
QUEUE = "indexing"
JOBS = 40


@pytest.fixture
def prometheus_binary() -> str:
    if not os.path.exists(PROMETHEUS):
        missing = "needs Debian's prometheus (apt-get install -y prometheus)"
        if os.environ.get("CI"):  # .ci/run installs it: its absence there is a failure
            pytest.fail(missing)
        pytest.skip(missing)
    return PROMETHEUS


@pytest.fixture
def prometheus(prometheus_binary, tmp_path):
    """Factory: start Prometheus scraping ``target`` (host:port) every second; returns its query URL."""
    processes = []

    def start(target: str) -> str:
        config = tmp_path / "prometheus.yml"
        # The same scrape job as compose/prometheus.yml, only faster.
        config.write_text(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
            "scrape_configs:\n  - job_name: conveyor-api\n    metrics_path: /metrics\n"
            f'    static_configs:\n      - targets: ["{target}"]\n'
        )
        port = free_port()
        log = open(tmp_path / "prometheus.log", "wb")
        process = subprocess.Popen(
            [
                prometheus_binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--log.level=warn",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        processes.append((process, log))
        url = f"http://127.0.0.1:{port}"
        wait_for(lambda: _ready(url), timeout=60, interval=0.2, message="Prometheus to be ready")
        return url

    yield start
    for process, log in processes:
        process.terminate()
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


def _dashboard_expr(metric: str) -> str:
    dashboard = json.loads((ROOT / "grafana" / "dashboards" / "conveyor.json").read_text())
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel.get("targets", []) if metric in t["expr"]]
    assert len(exprs) == 1, exprs
    return exprs[0]


def _ready(url: str) -> bool:
    try:
        return httpx.get(f"{url}/-/ready", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def query(url: str, promql: str) -> float | None:
    """The single value of an instant query, or None when it has no data."""
    body = httpx.get(f"{url}/api/v1/query", params={"query": promql}, timeout=10).json()
    assert body["status"] == "success", body
    result = body["data"]["result"]
    if not result:
        return None
    assert len(result) == 1, result
    return float(result[0]["value"][1])


@pytest.mark.parametrize("broker", SERVER_BROKERS)
def test_jobs_enqueued_by_the_cli_reach_prometheus_through_the_api(request, broker, prometheus, clean_env):
    app = make_app(request, broker)
    try:
        variables = {"CONVEYOR_BROKER": broker, "CONVEYOR_IMPORTS": "tests.support.obs_jobs"}
        if broker == "redis":
            variables["REDIS_URL"] = app.settings.redis_url
        else:
            variables["DATABASE_URL"] = app.settings.database_url
        env = cli_env(clean_env, **variables)
        with api_server(app) as base:
            url = prometheus(base.removeprefix("http://"))
            # The label `job` of conveyor's families is the job type; Prometheus keeps it as exported_job.
            enqueued = f'sum(conveyor_jobs_enqueued_total{{queue="{QUEUE}",exported_job="obs.work"}})'
            wait_for(
                lambda: query(url, enqueued) == 0, timeout=60, interval=0.5, message="the first scrape (0 enqueued)"
            )
            lines = "".join(json.dumps({"job": "obs.work", "payload": {"n": n}}) + "\n" for n in range(JOBS))
            done = subprocess.run(
                [sys.executable, "-m", "conveyor", "enqueue", "--batch"],
                input=lines,
                cwd=ROOT,
                env=env,
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert done.returncode == 0, done.stderr
            assert len(done.stdout.splitlines()) == JOBS
            wait_for(
                lambda: query(url, enqueued) == JOBS,
                timeout=60,
                interval=0.5,
                message=f"Prometheus to see the {JOBS} jobs the CLI enqueued",
            )
            # The Grafana Throughput panel's enqueue line has data now.
            panel = _dashboard_expr("conveyor_jobs_enqueued_total").replace("$queue", QUEUE)
            wait_for(
                lambda: (query(url, panel) or 0) > 0, timeout=30, interval=0.5, message="the dashboard's enqueue rate"
            )
            with running(app, own_app=True):
                completed = f'sum(conveyor_queue_completed_total{{queue="{QUEUE}"}})'
                wait_for(
                    lambda: query(url, completed) == JOBS,
                    timeout=90,
                    interval=0.5,
                    message="Prometheus to see them completed",
                )
            assert query(url, f'sum(conveyor_queue_failed_total{{queue="{QUEUE}"}})') == 0
    finally:
        app.close()
