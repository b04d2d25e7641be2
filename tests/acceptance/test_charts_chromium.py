"""The dashboard's charts in a real headless Chromium, under the strict CSP: drawn from real jobs, refreshed live.

Set ``TEST_SCREENSHOT_DIR=/some/dir`` to keep screenshots (docs/screenshots/charts-*.png come from here).
"""

from __future__ import annotations

import random

import pytest

from conveyor.brokers.rollup import Tally, TallyGroup, bucket_of, rollup_store
from conveyor.inspector import Inspector
from tests.acceptance.test_obs_dashboard_chromium import (  # noqa: F401 (browser is a fixture)
    _screenshot,
    _sign_in,
    _strict_api_server,
    _text,
    browser,
)
from tests.support.brokers import SERVER_BROKERS
from tests.support.obs_support import broker_app, worker
from tests.support.waiting import wait_for

pytestmark = pytest.mark.chromium

QUEUE = "indexing"
JOB = "obs.work"


def _earlier_hour(app) -> None:
    """Fifty-odd earlier minutes of traffic, written through the store as workers' flushes are (for a
    chart with a shape; the assertions below are about the jobs this test runs)."""
    rng = random.Random(20)
    groups = []
    for minutes_ago in range(3, 58):
        tally = Tally(enqueued=rng.randint(30, 60), completed=rng.randint(25, 55), retried=rng.randint(0, 4))
        tally.failed = 1 if minutes_ago % 11 == 0 else 0
        for _ in range(tally.completed):
            tally.wait[bucket_of(rng.lognormvariate(-4 + (minutes_ago % 17) / 8, 0.8))] += 1
            tally.run[bucket_of(rng.lognormvariate(-2, 0.5))] += 1
        groups.append(TallyGroup(QUEUE, JOB, minutes_ago * 60.0, tally))
    rollup_store(app).write("earlier-hour", groups)


def _series(browser, chart: str) -> dict[str, int]:
    """{series name: points drawn} of a chart as the page shows it now ({} mid-swap)."""
    from selenium.common.exceptions import WebDriverException
    from selenium.webdriver.common.by import By

    try:
        return {
            str(p.get_attribute("data-series")): len((p.get_attribute("points") or "").split())
            for p in browser.find_elements(By.CSS_SELECTOR, f"#{chart} polyline")
        }
    except WebDriverException:
        return {}


@pytest.mark.parametrize("broker", SERVER_BROKERS)
def test_charts_show_real_jobs_and_follow_them_live_under_the_strict_policy(browser, request, broker):
    from selenium.webdriver.common.by import By

    app = broker_app(request, broker, rollup_flush_seconds=0.2)
    worker_app = broker_app(request, broker, rollup_flush_seconds=0.2)  # as a worker process has its own
    try:
        _earlier_hour(app)
        with _strict_api_server(app) as base, worker(worker_app, QUEUE, threads=4):
            for n in range(20):
                app.jobs.enqueue(JOB, {"n": n, "sleep": 0.02})
            app.jobs.enqueue(JOB, {"n": 99, "fail": True})
            wait_for(
                lambda: app.broker.queue_counts(QUEUE).failed == 1 and app.broker.queue_counts(QUEUE).waiting == 0,
                timeout=30,
                message="the jobs to run",
            )

            _sign_in(browser, base, "/admin/queues")
            browser.execute_script("window.notReloaded = true;")
            # The overview draws every queue's last hour: the jobs just run are in its last points.
            wait_for(lambda: _history_has_the_jobs(app), timeout=20, message="the rollup to hold the jobs run")
            completed = Inspector(app).history(None, "1h").totals["completed"]
            wait_for(
                lambda: (
                    f"{completed} completed" in _text(browser, "#charts .charts-head")
                    and _series(browser, "chart-throughput").get("completed") == 60
                ),
                timeout=20,
                message=f"the throughput chart with its 60 points and {completed} completed",
            )
            times = _series(browser, "chart-times")
            assert times.get("run p50", 0) >= 2 and times.get("wait p95", 0) >= 2, times
            assert _series(browser, "chart-depth").get("waiting", 0) >= 1
            if broker == "redis":
                _screenshot(browser, "charts-queues")

            # More jobs while the page is open: the live refresh redraws the charts, no reload.
            before = _text(browser, "#charts .charts-head")
            for n in range(5):
                app.jobs.enqueue(JOB, {"n": 200 + n})
            wait_for(
                lambda: _text(browser, "#charts .charts-head") not in ("", before),
                timeout=20,
                message="the chart summary to change live",
            )
            assert browser.execute_script("return window.notReloaded === true;")

            # A queue's page, switched to 24 h: 288 five-minute points.
            browser.get(f"{base}/admin/queues/{QUEUE}")
            wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, "#chart-throughput"), message="the queue's charts")
            browser.find_element(By.CSS_SELECTOR, 'a[data-window="24h"]').click()
            wait_for(
                lambda: _series(browser, "chart-throughput").get("completed") == 288,
                timeout=20,
                message="the 24h window",
            )
            assert "on" in (browser.find_element(By.CSS_SELECTOR, 'a[data-window="24h"]').get_attribute("class") or "")
            assert "window=24h" in browser.current_url
            browser.find_element(By.CSS_SELECTOR, 'a[data-window="1h"]').click()
            wait_for(lambda: _series(browser, "chart-throughput").get("completed") == 60, message="back to 1h")
            browser.execute_script("document.getElementById('charts').scrollIntoView()")
            if broker == "redis":
                _screenshot(browser, "charts-queue")
            # Nothing the policy blocked: the page loaded no inline script and needed none.
            logs = [e for e in browser.get_log("browser") if "Content Security Policy" in e.get("message", "")]
            assert logs == []
    finally:
        worker_app.close()
        app.close()


def _history_has_the_jobs(app) -> bool:
    last = Inspector(app).history(QUEUE, "1h").points[-3:]
    return sum(p.completed for p in last) == 20 and sum(p.failed for p in last) == 1
