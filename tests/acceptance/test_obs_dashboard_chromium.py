"""The /admin/queues dashboard in a real headless Chromium: sign in, find a failed job, retry it by clicking.

Needs Debian's ``chromium`` and ``chromium-driver``. Set ``TEST_SCREENSHOT_DIR=/some/dir``
to keep screenshots of the pages it saw.
"""

from __future__ import annotations

import os
import shutil
import time
from contextlib import contextmanager

import pytest

from tests.support.obs_support import SECRET, TOKEN, api_server, redis_app, worker
from tests.support.waiting import wait_for

pytestmark = pytest.mark.chromium

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
QUEUE = "indexing"
#: Not a CONVEYOR_ variable: conftest.py removes those from the environment at import.
SCREENSHOTS = os.environ.get("TEST_SCREENSHOT_DIR")


@pytest.fixture
def browser(tmp_path):
    if not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)):
        missing = "needs Debian's chromium and chromium-driver (apt-get install -y chromium chromium-driver)"
        if os.environ.get("CI"):  # .ci/run installs them: their absence there is a failure, not a skip
            pytest.fail(missing)
        pytest.skip(missing)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        "--window-size=1280,900",
        f"--user-data-dir={tmp_path / 'profile'}",
    ):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(30)
    yield driver
    driver.quit()


def test_retrying_a_failed_job_by_clicking_makes_it_complete(browser, redis_url, tmp_path):
    from selenium.webdriver.common.by import By

    marker = tmp_path / "fail"
    marker.touch()
    app = redis_app(redis_url)
    worker_app = redis_app(redis_url)
    try:
        with api_server(app) as base, worker(worker_app, QUEUE):
            ref = app.jobs.enqueue("obs.work", {"n": 7, "api_key": SECRET, "fail_while": str(marker)})
            wait_for(lambda: app.broker.queue_counts(QUEUE).failed == 1, message="the job to fail for good")

            browser.get(f"{base}/admin/queues")
            browser.find_element(By.ID, "token").send_keys(TOKEN)
            browser.find_element(By.CSS_SELECTOR, "form button[type=submit]").click()
            wait_for(
                lambda: browser.find_elements(By.CSS_SELECTOR, f'tr[data-queue="{QUEUE}"]'),
                timeout=15,
                message="the queue overview",
            )

            row = browser.find_element(By.CSS_SELECTOR, f'tr[data-queue="{QUEUE}"]')
            row.find_element(By.CSS_SELECTOR, f'a[href="/admin/queues/{QUEUE}?state=failed"]').click()
            wait_for(
                lambda: browser.find_elements(By.CSS_SELECTOR, f'tr[data-job-id="{ref.id}"]'),
                timeout=15,
                message="the failed job in the list",
            )
            _screenshot(browser, "failed-list")
            browser.find_element(By.CSS_SELECTOR, f'tr[data-job-id="{ref.id}"] a').click()
            wait_for(lambda: browser.find_elements(By.ID, "retry"), timeout=15, message="the job page")
            assert browser.find_element(By.ID, "job-state").text == "failed"
            assert "failed on purpose" in browser.page_source
            assert SECRET not in browser.page_source

            marker.unlink()
            browser.find_element(By.ID, "retry").click()
            # The page reloads after the click, then every 2 s while the job is unfinished.
            wait_for(lambda: _state(browser) == "completed", timeout=30, message="the job page to show completed")
            assert app.broker.get_job(ref.id).state == "completed"
            assert SECRET not in browser.page_source
            _screenshot(browser, "job")
            browser.get(f"{base}/admin/queues")
            _screenshot(browser, "queues")
    finally:
        worker_app.close()
        app.close()


def _screenshot(browser, name: str) -> None:
    """Keep a screenshot as <TEST_SCREENSHOT_DIR>/<name>.png when that variable names a directory."""
    folder = SCREENSHOTS
    if folder:
        os.makedirs(folder, exist_ok=True)
        browser.save_screenshot(os.path.join(folder, f"{name}.png"))


def _state(browser) -> str:
    from selenium.common.exceptions import WebDriverException
    from selenium.webdriver.common.by import By

    try:
        return browser.find_element(By.ID, "job-state").text
    except WebDriverException:
        return ""  # mid-reload


# -- the Workers page, attempt history, live refresh and search ------------------------------

#: Recovery after 8 s without a heartbeat: beats every 1.3 s, late after 3.3 s, gone at 8 s.
HEARTBEAT_TIMEOUT = "8"


#: The policy the API serves (conveyor/api/guard.py on the apisec branch): no inline script at all.
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
    "object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)


@contextmanager
def _strict_api_server(app):
    """The API as api_server runs it, every response under :data:`CSP`: live.js must work with no inline script."""
    import threading

    import uvicorn

    from conveyor.api import create_app
    from tests.support.servers import free_port

    api = create_app(app)

    @api.middleware("http")
    async def policy(request, call_next):
        response = await call_next(request)
        response.headers["Content-Security-Policy"] = CSP
        return response

    config = uvicorn.Config(api, host="127.0.0.1", port=free_port(), log_config=None, access_log=False, lifespan="off")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="test-uvicorn-csp", daemon=True)
    thread.start()
    wait_for(lambda: server.started, timeout=20, message="uvicorn to start")
    try:
        yield f"http://127.0.0.1:{config.port}"
    finally:
        server.should_exit = True
        thread.join(10)


def _sign_in(browser, base: str, path: str) -> None:
    from selenium.webdriver.common.by import By

    browser.get(f"{base}{path}")
    browser.find_element(By.ID, "token").send_keys(TOKEN)
    browser.find_element(By.CSS_SELECTOR, "form button[type=submit]").click()
    wait_for(
        lambda: browser.current_url.endswith(path) and browser.find_elements(By.CSS_SELECTOR, "[data-live]"),
        timeout=15,
        message=f"{path} after signing in",
    )


def _worker_running(browser, link: str) -> str | None:
    """The ``data-worker`` of the Workers row that links ``link``, or None (also while the live
    refresh swaps the rows out from under the read)."""
    from selenium.common.exceptions import WebDriverException
    from selenium.webdriver.common.by import By

    try:
        for row in browser.find_elements(By.CSS_SELECTOR, "tr[data-worker]"):
            if row.find_elements(By.CSS_SELECTOR, link):
                return str(row.get_attribute("data-worker"))
    except WebDriverException:
        pass
    return None


def _text(browser, css: str) -> str:
    from selenium.common.exceptions import WebDriverException
    from selenium.webdriver.common.by import By

    try:
        return " ".join(e.text for e in browser.find_elements(By.CSS_SELECTOR, css))
    except WebDriverException:
        return ""  # the region was swapped while being read


def _job_rows(browser) -> list[str] | None:
    """The ``data-job-id`` of the listed rows, or None while the page or a region is being replaced."""
    from selenium.common.exceptions import WebDriverException
    from selenium.webdriver.common.by import By

    try:
        return [str(r.get_attribute("data-job-id")) for r in browser.find_elements(By.CSS_SELECTOR, "tr[data-job-id]")]
    except WebDriverException:
        return None


def _worker_states(browser) -> dict[str, tuple[str, str]]:
    """{worker id: (state, pid)} as the Workers page shows them now."""
    from selenium.common.exceptions import WebDriverException
    from selenium.webdriver.common.by import By

    try:
        return {
            row.get_attribute("data-worker"): (row.get_attribute("data-state"), row.get_attribute("data-pid"))
            for row in browser.find_elements(By.CSS_SELECTOR, "tr[data-worker]")
        }
    except WebDriverException:
        return {}


def test_workers_attempts_live_refresh_and_search_in_the_browser(browser, redis_url, tmp_path, clean_env):
    """A real `conveyor worker`; its child is stopped mid-job (late), then SIGKILLed (gone), its attempt lost.

    Every page is followed without reloading: a marker set in the page's
    JavaScript must survive each update (a reload would clear it).
    """
    import signal

    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import Select

    from tests.support.obs_support import CliProcess, cli_env

    app = redis_app(redis_url, heartbeat_timeout=float(HEARTBEAT_TIMEOUT))
    env = cli_env(
        clean_env,
        REDIS_URL=redis_url,
        CONVEYOR_BROKER="redis",
        CONVEYOR_IMPORTS="tests.support.obs_jobs",
        CONVEYOR_QUEUES__INDEXING__MIN_BACKOFF="0.02",
        CONVEYOR_QUEUES__INDEXING__MAX_BACKOFF="0.05",
        CONVEYOR_ADMIN_TOKEN=TOKEN,
        CONVEYOR_METRICS_PORT="0",
        CONVEYOR_HEARTBEAT_TIMEOUT=HEARTBEAT_TIMEOUT,
        CONVEYOR_MAINTENANCE_INTERVAL="0.5",
    )
    supervisor = None
    try:
        with _strict_api_server(app) as base:
            # The queues page counts by itself.
            _sign_in(browser, base, "/admin/queues")
            browser.execute_script("window.notReloaded = true;")
            waiting = f'tr[data-queue="{QUEUE}"] td:nth-child(2)'
            assert _text(browser, waiting) == "0"
            app.broker.pause_queue(QUEUE)
            for n in range(3):
                app.jobs.enqueue("obs.work", {"n": n}, key=f"live-{n}")
            wait_for(lambda: _text(browser, waiting) == "3", timeout=20, message="the waiting count to go to 3")
            assert browser.execute_script("return window.notReloaded === true;")
            assert "paused" in _text(browser, f'tr[data-queue="{QUEUE}"]')
            _screenshot(browser, "queues")

            # A list filtered by job type, and a job found by its key from the search box.
            leak = app.jobs.enqueue("obs.leak", {"api_key": SECRET, "fail_first": 1}, key="order-4711")
            browser.get(f"{base}/admin/queues/{QUEUE}?state=waiting")
            # Choosing a job type applies it (no Filter click needed).
            Select(browser.find_element(By.ID, "job-name")).select_by_value("obs.leak")
            wait_for(lambda: "job=obs.leak" in browser.current_url, timeout=15, message="the filtered list")
            wait_for(lambda: _job_rows(browser) == [leak.id], timeout=15, message="only the obs.leak job listed")
            _screenshot(browser, "queue-filtered")
            browser.find_element(By.ID, "search").send_keys("order-4711", Keys.ENTER)
            wait_for(
                lambda: browser.current_url.endswith(f"/admin/jobs/{leak.id}"),
                timeout=15,
                message="the search to open the job",
            )
            assert _state(browser) == "waiting"

            # The job page follows the job: no attempt yet, then a failure with its traceback, then success.
            browser.execute_script("window.notReloaded = true;")
            supervisor = CliProcess(["worker", "--queues", QUEUE, "--processes", "2"], env, tmp_path / "worker.log")
            app.broker.resume_queue(QUEUE)
            wait_for(lambda: _state(browser) == "completed", timeout=60, message="the job page to show completed")
            wait_for(
                lambda: _text(browser, "tr[data-attempt]").count("completed") == 1,
                timeout=15,
                message="both attempts in the history",
            )
            assert browser.execute_script("return window.notReloaded === true;")
            outcomes = [
                r.get_attribute("data-outcome") for r in browser.find_elements(By.CSS_SELECTOR, "tr[data-attempt]")
            ]
            assert outcomes == ["failed", "completed"]
            browser.find_element(By.CSS_SELECTOR, "details.traceback summary").click()
            trace = browser.find_element(By.CSS_SELECTOR, "pre.traceback").text
            assert "Traceback (most recent call last)" in trace and "_call_the_provider" in trace
            assert "[redacted]" in trace and SECRET not in browser.page_source
            browser.execute_script("document.getElementById('history').scrollIntoView();")
            _screenshot(browser, "job")

            # The Workers page: the worker, then the job it runs, then its death by SIGKILL.
            browser.get(f"{base}/admin/workers")
            browser.execute_script("window.notReloaded = true;")
            wait_for(
                lambda: [s for s, _ in _worker_states(browser).values()].count("alive") == 2,
                timeout=30,
                message="both worker processes on the Workers page",
            )
            slow = app.jobs.enqueue("obs.work", {"n": 99, "sleep": 8})
            link = f'a[href="/admin/jobs/{slow.id}"]'
            first = wait_for(
                lambda: _worker_running(browser, link), timeout=20, message="the running job linked from its worker"
            )
            pid = int(_worker_states(browser)[first][1])
            # Stopped (not dead: its supervisor sees it alive), it beats no more: late.
            os.kill(pid, signal.SIGSTOP)
            wait_for(
                lambda: _worker_states(browser).get(first, ("",))[0] == "late",
                timeout=20,
                interval=0.1,
                message="the silent worker marked late",
            )
            late_row = browser.find_element(By.CSS_SELECTOR, f'tr[data-worker="{first}"]').get_attribute("class")
            assert "late" in late_row
            _screenshot(browser, "workers")
            # Killed, it is reaped by its supervisor, which marks it gone at once: "died", not a minute of "late".
            os.kill(pid, signal.SIGKILL)
            wait_for(
                lambda: _worker_states(browser).get(first, ("",))[0] == "gone",
                timeout=10,
                message="the killed worker shown as gone",
            )
            assert "died" in _text(browser, f'tr[data-worker="{first}"]')
            # The supervisor restarted the process: a new worker, alive.
            wait_for(
                lambda: [s for s, _ in _worker_states(browser).values()].count("alive") == 2,
                timeout=30,
                message="the restarted worker beside the other one",
            )
            assert browser.execute_script("return window.notReloaded === true;")
            _screenshot(browser, "workers-gone")

            # Its job ran again elsewhere; the lost attempt names the dead worker.
            browser.get(f"{base}/admin/jobs/{slow.id}")
            wait_for(lambda: _state(browser) == "completed", timeout=60, message="the recovered job to complete")
            wait_for(
                lambda: (
                    [
                        r.get_attribute("data-outcome")
                        for r in browser.find_elements(By.CSS_SELECTOR, "tr[data-attempt]")
                    ]
                    == ["lost", "completed"]
                ),
                timeout=15,
                message="the lost attempt, then the completed one",
            )
            assert first in _text(browser, 'tr[data-outcome="lost"]')
    finally:
        if supervisor is not None:
            supervisor.stop()
        app.close()


def test_api_docs_render_offline_under_the_strict_policy(browser, redis_url):
    """/docs draws every route from the package's own Swagger UI: no CDN, no inline script (the CSP above)."""
    from selenium.webdriver.common.by import By

    app = redis_app(redis_url)
    try:
        with _strict_api_server(app) as base:
            browser.get(f"{base}/docs")
            wait_for(
                lambda: len(browser.find_elements(By.CSS_SELECTOR, ".opblock")) > 10,
                timeout=20,
                message="Swagger UI to draw the routes",
            )
            _screenshot(browser, "api-docs")
            sources = [
                e.get_attribute("src") or e.get_attribute("href")
                for e in browser.find_elements(By.CSS_SELECTOR, "script, link")
            ]
            assert sources and all(s.startswith(base) for s in sources), sources
            assert "/api/admin/queue-metrics" in browser.page_source
    finally:
        app.close()


# -- actions: promote, bulk actions confirmed with their count, paging ------------------------------


def _bulk_status(browser) -> str:
    return _text(browser, "#bulk-status")


def _bulk_result(browser, expected: str) -> None:
    """Wait for the bulk action's closing line; on a timeout, say what the page showed instead."""
    try:
        wait_for(lambda: _bulk_status(browser) == expected, timeout=60, message="the bulk action's result")
    except AssertionError as exc:
        shown = f"status {_bulk_status(browser)!r}, flash {_text(browser, '#flash')!r}"
        raise AssertionError(f"{exc}; the page showed {shown}") from None


def test_promote_and_bulk_actions_confirmed_with_their_count(browser, redis_url):
    """A delayed job promoted from its row runs now; a bulk retry asks "Retry 3 failed jobs…?" first and
    acts only on "Yes", with progress; tab counts follow the job-type filter; paging says where it is."""
    from selenium.webdriver.common.by import By

    app = redis_app(redis_url)
    worker_app = redis_app(redis_url)
    try:
        with _strict_api_server(app) as base:
            with worker(worker_app, QUEUE):
                failed = [app.jobs.enqueue("obs.work", {"n": n, "fail": True}).id for n in range(3)]
                wait_for(lambda: app.broker.queue_counts(QUEUE).failed == 3, message="three jobs to fail for good")
                held = app.jobs.enqueue("obs.work", {"n": 10}, delay=3600).id
                _sign_in(browser, base, f"/admin/queues/{QUEUE}")
                browser.get(f"{base}/admin/queues/{QUEUE}?state=delayed")
                row = f'tr[data-job-id="{held}"]'
                wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, row), timeout=15, message="the delayed row")
                assert not browser.find_elements(By.CSS_SELECTOR, "button[data-action$='/retry-failed']")
                browser.find_element(By.CSS_SELECTOR, f"{row} button.promote").click()
                wait_for(
                    lambda: app.broker.get_job(held).state == "completed",
                    timeout=20,
                    message="the promoted job to run now, not in an hour",
                )
                assert app.broker.get_job(held).attempts == 1

            # A completed row has no Delete (its job page keeps one).
            browser.get(f"{base}/admin/queues/{QUEUE}?state=completed")
            wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, row), timeout=15, message="the completed row")
            assert not browser.find_elements(By.CSS_SELECTOR, f"{row} button")

            # The bulk retry counts first and asks; nothing moves before "Yes".
            browser.get(f"{base}/admin/queues/{QUEUE}?state=failed")
            wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, "button[data-bulk=retry]"), timeout=15)
            # No Delete on completed rows; failed rows keep theirs.
            assert len(browser.find_elements(By.CSS_SELECTOR, "tr[data-job-id] button.danger")) == 3
            browser.find_element(By.CSS_SELECTOR, "button[data-bulk=retry]").click()
            wait_for(
                lambda: _text(browser, "#bulk-question") == f"Retry 3 failed jobs of queue {QUEUE}?",
                timeout=15,
                message="the confirmation with its count",
            )
            _screenshot(browser, "bulk-confirm")
            assert not browser.find_element(By.ID, "bulk-progress").is_displayed()
            assert app.broker.queue_counts(QUEUE).failed == 3
            browser.find_element(By.ID, "bulk-go").click()
            _bulk_result(browser, "Retried 3 of 3.")
            assert {app.broker.get_job(i).state for i in failed} == {"waiting"}
            wait_for(lambda: _text(browser, 'a[data-state="failed"] .count') == "0", timeout=15, message="live counts")
            _screenshot(browser, "bulk-done")

            # Tab counts follow the job-type filter; paging says which page this is.
            app.broker.pause_queue(QUEUE)
            app.jobs.enqueue("obs.leak", {"fail_first": 0})
            for n in range(30):
                app.jobs.enqueue("obs.work", {"n": 100 + n})
            browser.get(f"{base}/admin/queues/{QUEUE}?state=waiting&job=obs.leak")
            wait_for(lambda: _text(browser, 'a[data-state="waiting"] .count') == "1", timeout=15)
            browser.get(f"{base}/admin/queues/{QUEUE}?state=waiting")
            wait_for(lambda: _text(browser, 'a[data-state="waiting"] .count') == "34", timeout=15)
            assert _text(browser, "#page-number") == "Page 1" and not browser.find_elements(By.ID, "page-prev")
            browser.find_element(By.ID, "page-next").click()
            wait_for(lambda: _text(browser, "#page-number") == "Page 2", timeout=15, message="page 2")
            assert not browser.find_elements(By.ID, "page-next")
            browser.find_element(By.ID, "page-prev").click()
            wait_for(lambda: _text(browser, "#page-number") == "Page 1", timeout=15, message="back to page 1")

            # A bulk delete of the waiting jobs of one type, cancelled once, then done.
            browser.get(f"{base}/admin/queues/{QUEUE}?state=waiting&job=obs.work")
            wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, "button[data-bulk=delete]"), timeout=15)
            browser.find_element(By.CSS_SELECTOR, "button[data-bulk=delete]").click()
            question = f"Delete 33 waiting jobs of queue {QUEUE} of type obs.work?"
            wait_for(lambda: _text(browser, "#bulk-question") == question, timeout=15, message="the question")
            browser.find_element(By.ID, "bulk-cancel").click()
            assert not browser.find_element(By.ID, "bulk-confirm").is_displayed()
            assert app.broker.queue_counts(QUEUE).waiting == 34
            browser.find_element(By.CSS_SELECTOR, "button[data-bulk=delete]").click()
            wait_for(lambda: _text(browser, "#bulk-question") == question, timeout=15, message="the question again")
            browser.find_element(By.ID, "bulk-go").click()
            _bulk_result(browser, "Deleted 33 of 33.")
            assert app.broker.queue_counts(QUEUE).waiting == 1
    finally:
        worker_app.close()
        app.close()


# -- cancel -------------------------------------------------------------------------------------------


def test_cancelling_a_running_job_from_its_page_stops_it_and_the_cancelled_tab_shows_it(browser, redis_url):
    """The job page of a running job has Cancel; confirmed, the job is interrupted where it runs (a 60 s
    sleep, a 1 s grace) and ends cancelled; the queue's cancelled tab counts and lists it."""
    from selenium.webdriver.common.by import By

    app = redis_app(redis_url)
    worker_app = redis_app(redis_url)
    try:
        with _strict_api_server(app) as base, worker(worker_app, QUEUE):
            ref = app.jobs.enqueue("obs.work", {"n": 1, "sleep": 60})
            wait_for(lambda: app.broker.get_job(ref.id).state == "active", timeout=20, message="the job to run")
            _sign_in(browser, base, f"/admin/jobs/{ref.id}")
            wait_for(lambda: browser.find_elements(By.ID, "cancel"), timeout=15, message="the Cancel button")
            assert not browser.find_elements(By.ID, "delete"), "a running job has no Delete"
            browser.find_element(By.ID, "cancel").click()
            browser.switch_to.alert.accept()
            clicked = time.monotonic()
            wait_for(lambda: app.broker.get_job(ref.id).state == "cancelled", timeout=15, message="cancelled")
            assert time.monotonic() - clicked < 5, "stopped after the grace, not after its 60 s sleep"
            wait_for(lambda: _text(browser, "#job-state") == "cancelled", timeout=15, message="the page to follow")
            assert not browser.find_elements(By.ID, "cancel"), "an ended job has no Cancel"
            browser.get(f"{base}/admin/queues/{QUEUE}?state=cancelled")
            wait_for(lambda: _text(browser, 'a[data-state="cancelled"] .count') == "1", timeout=15)
            assert browser.find_elements(By.CSS_SELECTOR, f'tr[data-job-id="{ref.id}"]')
            _screenshot(browser, "cancelled")
    finally:
        app.close()
        worker_app.close()
