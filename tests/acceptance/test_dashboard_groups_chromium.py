"""The groups and budgets views in a real headless Chromium (issue 21): a queue's groups on its page, the
Budgets page reached from the header, user data shown as text (a group named ``<script>``) and a
200-character group name or budget key that does not push the page wider than the window.

Needs Debian's ``chromium`` and ``chromium-driver``; ``TEST_SCREENSHOT_DIR=/some/dir`` keeps screenshots.
"""

from __future__ import annotations

import pytest
from dramatiq import Message

from conveyor.brokers.base import EnqueueItem
from conveyor.inspector import Inspector
from tests.acceptance.test_obs_dashboard_chromium import _screenshot, _text, browser  # noqa: F401 (a fixture)
from tests.support.obs_support import TOKEN, api_server, broker_app, running
from tests.support.waiting import wait_for

pytestmark = pytest.mark.chromium

HOSTILE = "<script>document.title='pwned'</script>"
#: Longer than the enqueue allows (128): an older producer's, stored straight through the broker.
LONG_GROUP = "<b>" + "w" * 197
LONG_KEY = "k" * 200


def _fits(browser) -> bool:
    """The page is no wider than the window: nothing forces a horizontal scroll."""
    return bool(browser.execute_script("return document.documentElement.scrollWidth <= window.innerWidth;"))


def test_a_queues_groups_and_the_budgets_page_in_the_browser(browser, request, redis_url, database_url):  # noqa: F811
    from selenium.common.exceptions import NoAlertPresentException
    from selenium.webdriver.common.by import By

    app = broker_app(request, "redis", imports="tests.support.dashboard_jobs", database_url=database_url)
    try:
        app.broker.pause_queue("tenants")  # its groups' jobs stay waiting
        app.jobs.set_group_weight("tenants", "a", 4)
        for group in ["a", "a", "a", HOSTILE, HOSTILE]:
            app.jobs.enqueue("dash.work", {"tenant": "x"}, group=group)
        long = Message(
            queue_name="tenants", actor_name="dash.work", args=({},), kwargs={}, options={"group": LONG_GROUP}
        )
        app.broker.enqueue_jobs([EnqueueItem(long)], dedup_ttl=60)

        with api_server(app) as base, running(app, "metered"):
            # 30 of 50 taken for HOSTILE, then a second 30 waits (throttled); a 200-character key takes 1.
            app.jobs.enqueue("dash.metered", {"tenant": HOSTILE, "weight": 30})
            app.jobs.enqueue("dash.metered", {"tenant": LONG_KEY, "weight": 1})
            app.jobs.enqueue("dash.metered", {"tenant": HOSTILE, "weight": 30})
            wait_for(
                lambda: any(b.throttled for b in Inspector(app).budgets() if b.name == "dash-tokens"),
                timeout=30,
                interval=0.2,
                message="a start throttled by dash-tokens",
            )

            browser.get(f"{base}/admin/queues/tenants")
            browser.find_element(By.ID, "token").send_keys(TOKEN)
            browser.find_element(By.CSS_SELECTOR, "form button[type=submit]").click()
            wait_for(
                lambda: browser.find_elements(By.CSS_SELECTOR, 'tr[data-group="a"]'),
                timeout=15,
                message="the queue's groups",
            )
            cells = [td.text for td in browser.find_elements(By.CSS_SELECTOR, 'tr[data-group="a"] td')]
            assert cells[:5] == ["a", "3", "0", "1", "4"], cells  # group, waiting, active, cap, weight
            names = [td.text for td in browser.find_elements(By.CSS_SELECTOR, "td.group-name")]
            assert names == ["a", HOSTILE, LONG_GROUP]  # shown as text, busiest first
            assert "3 with jobs now" in _text(browser, "#groups-summary")
            # The job list names each job's group too, a long one cut to 40 characters.
            listed = {td.text for td in browser.find_elements(By.CSS_SELECTOR, "td.job-group")}
            assert listed == {"a", HOSTILE, LONG_GROUP[:39] + "…"}, listed
            assert browser.title != "pwned" and _fits(browser)
            browser.execute_script("document.getElementById('groups').scrollIntoView();")
            _screenshot(browser, "queue-groups")

            browser.find_element(By.CSS_SELECTOR, 'header nav a[href="/admin/budgets"]').click()
            tokens = 'section[data-budget="dash-tokens"]'
            wait_for(
                lambda: len(browser.find_elements(By.CSS_SELECTOR, f"{tokens} td.budget-key")) == 2,
                timeout=15,
                message="the budget's two keys",
            )
            keys = [td.text for td in browser.find_elements(By.CSS_SELECTOR, f"{tokens} td.budget-key")]
            assert keys == [HOSTILE, LONG_KEY]
            row = _text(browser, f"{tokens} tbody tr:first-child")
            assert "30" in row and "60 %" in row
            assert int(_text(browser, f"{tokens} .throttled")) >= 1
            assert _text(browser, f"{tokens} .waited") not in ("", "–")
            assert browser.find_elements(By.CSS_SELECTOR, 'section[data-budget="dash-starts"]')
            assert browser.title != "pwned" and _fits(browser)
            try:
                browser.switch_to.alert
                pytest.fail("a page opened an alert")
            except NoAlertPresentException:
                pass
            _screenshot(browser, "budgets")
    finally:
        app.close()
