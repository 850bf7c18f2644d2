"""The dashboard page in headless Chromium (Debian's chromium and chromedriver), served by the real API
over the running pipeline of conftest.py: the status figures render, and an order inserted by SQL
appears in the page's search results without a reload."""

from __future__ import annotations

import random
import socket
import tempfile
import threading
from collections.abc import Iterator

import psycopg
import pytest
import uvicorn
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from services.api.app import create_app
from services.stack import postgres
from spark_jobs.model.settings import SINKS
from tests.waiting import wait_until

pytestmark = pytest.mark.stack

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
# Without the background-networking flags Chromium stalls on a closed network; a fresh profile each run.
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync")
APPLIED_S = 300  # the search query's batches, on a shared 2-core machine


def _free_port(host: str) -> int:
    with socket.socket() as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def dashboard_url(run) -> Iterator[str]:
    """The API (`create_app`, as `tide api` serves it) on a free loopback port, in a thread of this process."""
    jobs, _, writer = run
    writer.finish()  # the fixture's workload: it must not update the order this module inserts
    port = _free_port(jobs.host)
    server = uvicorn.Server(uvicorn.Config(create_app(jobs), host=jobs.host, port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_until(lambda: server.started, 30, "the API server to listen")
    yield f"http://{jobs.host}:{port}/"
    server.should_exit = True
    thread.join(timeout=30)


@pytest.fixture(scope="module")
def browser() -> Iterator[WebDriver]:
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    with tempfile.TemporaryDirectory(prefix="tideline-chromium-") as profile:
        for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={profile}"):
            options.add_argument(flag)
        driver = webdriver.Chrome(options=options, service=Service(executable_path=CHROMEDRIVER))
        try:
            yield driver
        finally:
            driver.quit()


def _cells(browser: WebDriver, selector: str) -> list[str]:
    return [cell.text for cell in browser.find_elements(By.CSS_SELECTOR, selector)]


def test_status_figures_render_and_an_inserted_order_appears_in_the_search_results(run, dashboard_url, browser, stack):
    _, pipeline, _ = run
    browser.get(dashboard_url)
    states = wait_until(lambda: _cells(browser, "#sinks tr.sink td.state"), 60, "the sinks' states on the page")
    assert len(states) == len(SINKS)
    wait_until(lambda: _cells(browser, '#sinks tr.sink[data-sink="cache"] td.state') == ["running"], 120,
               "the cache query shown running")
    behind = _cells(browser, "#sinks tr.table td.records-behind")
    tables_read = sum(len(pipeline.sink_tables(sink)) for sink in SINKS)
    assert len(behind) == tables_read and all(cell.isdigit() for cell in behind), behind
    assert _cells(browser, '#source tr[data-what="slot"] td')[1] == "active"

    total = f"{random.randint(70_000, 79_999)}.{random.randint(10, 99)}"  # a total no other order has
    browser.find_element(By.ID, "q").send_keys(total)
    wait_until(lambda: browser.find_element(By.ID, "search-state").text == "0 found", 30, "an empty result first")
    with psycopg.connect(postgres.conninfo(stack), autocommit=True) as conn:
        order_id = conn.execute("INSERT INTO orders (status, total) VALUES ('paid', %s) RETURNING id",
                                (total,)).fetchone()[0]
    row = wait_until(lambda: browser.find_elements(By.CSS_SELECTOR, f'#results tbody tr[data-id="{order_id}"]'),
                     APPLIED_S, "the inserted order in the page's search results")
    assert total in row[0].text and "paid" in row[0].text
    assert browser.find_element(By.ID, "search-state").text == "1 found"
