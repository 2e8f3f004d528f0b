"""report.html and the docs site in a real browser: headless Chromium (Debian's chromium and
chromium-driver, driven by selenium) opens each page over a local HTTP server on 127.0.0.1 and
checks that every image loaded and that the page logged no error to the console."""

from __future__ import annotations

import functools
import http.server
import os
import threading
from pathlib import Path

import pytest

from tests.docs.pages import build_site, small_sim_sweep

pytestmark = pytest.mark.browser

CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")


def _need_browser() -> None:
    """CI runs as root and scripts/setup.sh installs the browser there, so a missing one fails;
    elsewhere without root it cannot be installed, and the test says so."""
    missing = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not p.exists()]
    try:
        import selenium  # noqa: F401
    except ImportError:
        missing.append("selenium (the test extra)")
    if not missing:
        return
    reason = f"missing {', '.join(missing)}: run scripts/setup.sh (as root it installs chromium and chromium-driver)"
    if os.geteuid() == 0:
        pytest.fail(reason)
    pytest.skip(reason + "; not root, so it could not")


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A folder with the sweep (report.html) and the built site, served on 127.0.0.1."""
    _need_browser()
    root = tmp_path_factory.mktemp("served")
    small_sim_sweep(root / "sweep")
    result = build_site(root / "site")
    assert result.returncode == 0, result.stderr[-3000:]
    handler = functools.partial(_Quiet, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield root, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def browser(served):
    os.environ.setdefault("SE_OFFLINE", "true")  # never let selenium fetch a driver
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--no-first-run",
        "--disable-extensions",
        "--disable-background-networking",
    ):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=str(CHROMEDRIVER)), options=options)
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


def _open(driver, url: str) -> tuple[list[dict], list[dict]]:
    """Load a page; its images (src, complete, naturalWidth) and its SEVERE console entries."""
    driver.get_log("browser")  # drop what earlier pages logged
    driver.get(url)
    images = driver.execute_script(
        "return Array.from(document.images).map(i => ({src: i.currentSrc.slice(0, 80),"
        " complete: i.complete, width: i.naturalWidth}))"
    )
    # Chromium asks every page for /favicon.ico; the report has none by design (one file).
    severe = [e for e in driver.get_log("browser") if e["level"] == "SEVERE" and "favicon.ico" not in e["message"]]
    return images, severe


def test_report_html_shows_every_figure_without_console_errors(served, browser):
    root, base = served
    assert (root / "sweep" / "report.html").exists()
    images, severe = _open(browser, f"{base}/sweep/report.html")
    assert len(images) >= 2, images  # latency vs RTT and acceptance
    assert [i for i in images if not (i["complete"] and i["width"] > 0)] == []
    assert severe == []


def test_every_docs_page_shows_its_images_without_console_errors(served, browser):
    root, base = served
    pages = sorted(p.relative_to(root / "site") for p in (root / "site").rglob("index.html"))
    assert len(pages) >= 8
    broken, errors, seen = {}, {}, 0
    for page in pages:
        images, severe = _open(browser, f"{base}/site/{page.as_posix()}")
        seen += len(images)
        bad = [i for i in images if not (i["complete"] and i["width"] > 0)]
        if bad:
            broken[str(page)] = bad
        if severe:
            errors[str(page)] = severe
    assert seen >= 1  # the getting-started figure at least
    assert broken == {} and errors == {}
