"""The chat page with the server's MCP tools (`llmctl serve --mcp`), in a
real headless chromium against a real server and a real MCP server (the
toolbox, over stdio): a call the tool marks read-only runs at once and is
shown folded; a call that may change something waits for Approve, and
runs only after it."""

from __future__ import annotations

import json
import sys

import pytest
from test_mcp import TOOLBOX
from test_webui import send, set_field, texts

from conftest import QWEN, ServerProcess
from webui_browser import By, open_page, screenshot, start_browser, wait_js

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def browser():
    driver = start_browser()
    yield driver
    driver.quit()


@pytest.fixture(scope="module")
def srv(session_home, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("webui-mcp")
    notes = tmp / "notes.log"
    path = tmp / "mcp.json"
    path.write_text(json.dumps({"mcpServers": {"toolbox": {
        "command": sys.executable, "args": [str(TOOLBOX), "stdio"],
        "env": {"TOOLBOX_NOTES": str(notes)}, "allowedTools": ["add", "note"]}}}))
    server = ServerProcess([QWEN, "--ctx-size", "4096", "--max-num-seqs", "2", "--mcp", str(path)],
                           env={"LLMCTL_HOME": str(session_home)})
    try:
        yield server.wait_ready(600), notes
    finally:
        server.stop()


def wait_idle(driver, what: str) -> None:
    wait_js(driver, "return document.body.dataset.streaming !== '1' && "
            "document.querySelectorAll('#messages .msg.assistant').length > 0", what,
            timeout=300)


def test_mcp_calls_are_folded_blocks_and_writes_wait_for_approve(srv, browser):
    server, notes = srv
    open_page(browser, server.url)
    assert browser.find_element(By.ID, "mcp-names").get_attribute("textContent") == "toolbox"
    set_field(browser, "temperature", "0")
    send(browser, "Use the add tool to add 1234 and 4321.")
    wait_idle(browser, "the add to be answered")
    block = browser.find_element(By.CSS_SELECTOR, "#messages .mcp-call")
    assert block.get_attribute("open") is None              # folded
    assert "toolbox.add" in block.text and block.get_attribute("data-status") == "completed"
    block.find_element(By.TAG_NAME, "summary").click()
    assert "5555" in block.find_element(By.CSS_SELECTOR, ".mcp-output").text
    send(browser, "Use the note tool to note: buy milk")
    wait_js(browser, "return document.querySelector('#messages .mcp-approval button.approve')",
            "the Approve button", timeout=300)
    wait_idle(browser, "the note to wait for approval")
    asked = texts(browser, "#messages .mcp-approval .tool-name")
    assert asked == ["Run toolbox.note?"] and not notes.exists()
    screenshot(browser, "webui-mcp-approval.png")
    browser.find_element(By.CSS_SELECTOR, "#messages .mcp-approval button.approve").click()
    wait_js(browser, "return [...document.querySelectorAll('#messages .mcp-call')]"
            ".some((b) => b.textContent.includes('toolbox.note'))", "the note to run", timeout=300)
    wait_idle(browser, "the approved answer to end")
    assert "milk" in notes.read_text().lower()
    assert texts(browser, "#messages .mcp-approval .mcp-choice") == ["approved"]
