"""The /admin/queues dashboard in a real headless Chromium: sign in, find a failed job, retry it by clicking.

Needs Debian's ``chromium`` and ``chromium-driver``. Set ``CONVEYOR_SCREENSHOT=/some/dir``
to keep screenshots of the pages it saw.
"""

from __future__ import annotations

import os
import shutil

import pytest

from tests.obs_support import SECRET, TOKEN, api_server, redis_app, worker
from tests.waiting import wait_for

pytestmark = pytest.mark.chromium

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
QUEUE = "indexing"


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
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--no-first-run", "--window-size=1280,900", f"--user-data-dir={tmp_path / 'profile'}"):
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
            wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, f'tr[data-queue="{QUEUE}"]'),
                     timeout=15, message="the queue overview")

            row = browser.find_element(By.CSS_SELECTOR, f'tr[data-queue="{QUEUE}"]')
            row.find_element(By.CSS_SELECTOR, f'a[href="/admin/queues/{QUEUE}?state=failed"]').click()
            wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, f'tr[data-job-id="{ref.id}"]'),
                     timeout=15, message="the failed job in the list")
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
    """Keep a screenshot as <CONVEYOR_SCREENSHOT dir>/<name>.png when that variable names a directory."""
    folder = os.environ.get("CONVEYOR_SCREENSHOT")
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
