"""A real headless browser for the chat page's tests: Debian's chromium
driven by its chromedriver through selenium (scripts/test installs both
as root; elsewhere the tests skip, saying why)."""

from __future__ import annotations

import io
import os
import shutil
import tempfile
import time
from pathlib import Path

import pytest

try:        # in the test extra; without it the browser tests skip (chrome_paths)
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import Select
except ImportError:
    ActionChains = By = Keys = Select = None

REPO = Path(__file__).resolve().parent.parent
# Screenshots and figures refresh docs/images/ only when asked
# (LLMCTL_DOCS_IMAGES=1), so that a test run leaves the checkout as it was.
IMAGES = (REPO / "docs" / "images" if os.environ.get("LLMCTL_DOCS_IMAGES")
          else Path(tempfile.gettempdir()) / "llmctl-webui-images")


def chrome_paths() -> tuple[str, str]:
    """(chromium, chromedriver), or a pytest skip naming what is missing."""
    pytest.importorskip("selenium", reason="selenium is not installed (the test extra has it)")
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if not browser or not driver:
        pytest.skip("no chromium/chromedriver: `apt-get install chromium chromium-driver` "
                    "(scripts/test does it as root)")
    return browser, driver


def start_browser(width: int = 1100, height: int = 720):
    """A headless chromium with a fresh profile; the caller quits it."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    browser, driver = chrome_paths()
    opts = webdriver.ChromeOptions()
    opts.binary_location = browser
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                f"--window-size={width},{height}", "--disable-extensions",
                "--no-first-run", "--force-device-scale-factor=1"):
        opts.add_argument(arg)
    return webdriver.Chrome(service=Service(driver), options=opts)


def wait_js(driver, script: str, what: str, timeout: float = 60.0, interval: float = 0.05):
    """Poll `script` (a JS expression's body, `return ...`) until it is
    truthy, and return its value. Raises AssertionError naming `what`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = driver.execute_script(script)
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out waiting for {what}")


def open_page(driver, url: str) -> None:
    """Load the page at `url` and wait until it has its model list."""
    driver.get(url + "/")
    wait_js(driver, "return document.body.dataset.ready === '1'", "the page to be ready")


def set_theme(driver, scheme: str) -> None:
    """Emulate the system's colour scheme ("light" or "dark")."""
    driver.execute_cdp_cmd("Emulation.setEmulatedMedia", {
        "features": [{"name": "prefers-color-scheme", "value": scheme}]})


def screenshot(driver, name: str) -> Path:
    """A PNG of the viewport in docs/images/, for the docs and the README.
    Raises what PIL raises for an image it cannot read."""
    from PIL import Image  # matplotlib's dependency, in the test extra

    IMAGES.mkdir(parents=True, exist_ok=True)
    path = IMAGES / name
    # A palette of 64 colours keeps the committed files a few times smaller.
    image = Image.open(io.BytesIO(driver.get_screenshot_as_png())).convert("RGB")
    image.quantize(colors=64).save(path, optimize=True)
    return path


# The page's weight and time to interactive, from the Performance API:
# what went over the wire for the page and its files, and when app.js
# marked itself ready (its model list fetched and drawn).
MEASURE = """
const nav = performance.getEntriesByType('navigation')[0];
const files = performance.getEntriesByType('resource')
  .filter((r) => r.name.includes('/webui/static/'));
const ready = performance.getEntriesByName('llmctl-ready')[0];
return {transfer_bytes: nav.transferSize + files.reduce((n, r) => n + r.transferSize, 0),
        body_bytes: nav.encodedBodySize + files.reduce((n, r) => n + r.encodedBodySize, 0),
        files: files.length + 1, dom_interactive_ms: nav.domInteractive,
        ready_ms: ready ? ready.startTime : null};
"""
