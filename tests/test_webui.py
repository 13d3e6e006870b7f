"""The chat page at `/`, driven in a real headless chromium as a person
would, against a real `llmctl serve smollm2` (Qwen2.5-Coder 0.5B loads on
demand when picked). Screenshots, and the page's weight and time to
interactive (webui-figures.json), go to docs/images/ with
LLMCTL_DOCS_IMAGES=1, else to a temporary folder (docs/webui.md)."""

from __future__ import annotations

import json
import time

import httpx
import pytest
from fastapi.testclient import TestClient

from conftest import QWEN, ServerProcess, wait_until
from llmctl.bench.launcher import Server
from llmctl.runtime.load_options import LoadOptions
from llmctl.runtime.pool.model_pool import ModelPool
from llmctl.server.app import create_app
from llmctl.server.state import HttpPolicy, ServerState
from webui_browser import (
    IMAGES,
    MEASURE,
    ActionChains,
    By,
    Keys,
    Select,
    open_page,
    screenshot,
    set_theme,
    start_browser,
    wait_js,
)

SMOL = "smollm2"
ARGS = ["--ctx-size", "1024", "--max-num-seqs", "2", "--max-num-batched-tokens", "256"]
KEY = "webui-test-key"
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}


@pytest.fixture(scope="module")
def browser():
    driver = start_browser()
    yield driver
    driver.quit()


@pytest.fixture(scope="module")
def srv(session_home):
    server = ServerProcess([SMOL, *ARGS], env={"LLMCTL_HOME": str(session_home)})
    try:
        yield server.wait_ready(600)
    finally:
        server.stop()


def texts(driver, selector: str) -> list[str]:
    return [e.text for e in driver.find_elements(By.CSS_SELECTOR, selector)]


def answers(driver) -> list[str]:
    return texts(driver, "#messages .msg.assistant .content")


def send(driver, text: str) -> None:
    box = driver.find_element(By.ID, "input")
    box.send_keys(text)
    box.send_keys(Keys.ENTER)


def wait_answered(driver, n: int) -> None:
    wait_js(driver, f"return document.querySelectorAll('#messages .msg.assistant').length === {n}"
            " && document.body.dataset.streaming !== '1'", f"answer {n} to end", timeout=120)


def requests_of(srv, model: str) -> dict:
    return httpx.get(srv.url + "/stats", timeout=30).json()["models"].get(model, {}).get(
        "requests", {})


def set_field(driver, field_id: str, value: str) -> None:
    driver.find_element(By.CSS_SELECTOR, "#settings summary").click()
    field = driver.find_element(By.ID, field_id)
    field.clear()
    field.send_keys(value)
    driver.find_element(By.CSS_SELECTOR, "#settings summary").click()


def test_page_loads_with_strict_csp_small_and_fast(srv, browser):
    head = httpx.get(srv.url + "/", timeout=30)
    csp = head.headers["content-security-policy"]
    assert head.status_code == 200 and "connect-src 'self'" in csp
    assert "script-src 'self';" in csp and "unsafe-inline" not in csp and "unsafe-eval" not in csp
    open_page(browser, srv.url)     # a first visit: the browser has none of it
    first = browser.execute_script(MEASURE)
    browser.refresh()               # a second: each file is asked for, and is a 304
    open_page(browser, srv.url)
    again = browser.execute_script(MEASURE)
    figures = {"first_visit": first, "second_visit": again}
    print("webui figures:", figures)
    IMAGES.mkdir(parents=True, exist_ok=True)
    (IMAGES / "webui-figures.json").write_text(json.dumps(figures, indent=1) + "\n")
    assert first["files"] == again["files"] == 9 and first["body_bytes"] > 10_000
    assert first["transfer_bytes"] < 150_000
    assert again["transfer_bytes"] < first["transfer_bytes"] / 4
    # Offline: nothing but this server is asked for anything.
    hosts = browser.execute_script("return performance.getEntriesByType('resource')"
                                   ".map((r) => new URL(r.name).origin)")
    assert hosts and set(hosts) == {srv.url}
    assert browser.execute_script("return typeof window.__xss") == "undefined"


def _json_or_none(path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):       # still being written
        return None


STORY = "Write a short story about a cat who learns to fly."


def test_chat_streams_keeps_and_manages_conversations(srv, browser, tmp_path):
    open_page(browser, srv.url)
    Select(browser.find_element(By.ID, "model")).select_by_value(SMOL)
    wait_js(browser, "return document.getElementById('model-status').dataset.state === 'loaded'",
            "smollm2 shown loaded")
    assert "MiB" in browser.find_element(By.ID, "model-status").text
    set_field(browser, "max-tokens", "48")
    send(browser, STORY)
    # The answer grows while it streams: several lengths seen before it ends.
    seen = set()
    while browser.execute_script("return document.body.dataset.streaming") == "1":
        seen.add(len((answers(browser) or [""])[-1]))
        time.sleep(0.05)        # the server shares the cores with this loop
    assert len(seen) >= 2, seen
    wait_answered(browser, 1)
    stats = texts(browser, "#messages .msg.assistant .stats")[-1]
    assert "tokens" in stats and "tok/s" in stats and "first token" in stats and "cached" in stats
    send(browser, "Give it a title.")
    wait_answered(browser, 2)
    # The second turn repeats the first: its prompt starts with cached tokens.
    cached = texts(browser, "#messages .msg.assistant .stats")[-1].split(" prompt tokens cached")[0]
    assert int(cached.rsplit(" ", 1)[-1].split("/")[0]) > 0, cached
    background = "return getComputedStyle(document.body).backgroundColor"
    set_theme(browser, "light")
    light = browser.execute_script(background)
    screenshot(browser, "webui-light.png")
    set_theme(browser, "dark")
    assert browser.execute_script(background) != light == "rgb(255, 255, 255)"
    screenshot(browser, "webui-dark.png")
    set_theme(browser, "light")
    browser.refresh()
    open_page(browser, srv.url)
    assert texts(browser, "#conv-list .title") == ["Write a short story about a cat who lear"]
    assert len(answers(browser)) == 2 and answers(browser)[0]
    # Rename in place, then a second conversation, then delete the first.
    browser.find_element(By.CSS_SELECTOR, "#conv-list .conv .rename").click()
    field = browser.find_element(By.CSS_SELECTOR, "#conv-list .rename-input")
    field.send_keys(Keys.CONTROL, "a")
    field.send_keys("Flying cat" + Keys.ENTER)
    assert texts(browser, "#conv-list .title") == ["Flying cat"]
    browser.find_element(By.ID, "new-conv").click()
    assert answers(browser) == []
    browser.execute_cdp_cmd("Browser.setDownloadBehavior", {"behavior": "allow",
                                                            "downloadPath": str(tmp_path)})
    browser.find_element(By.ID, "export").click()
    exported = wait_until(lambda: list(tmp_path.glob("llmctl-conversations*.json")),
                          "the export to be downloaded", timeout=30)
    saved = wait_until(lambda: _json_or_none(exported[0]), "the export to be written", timeout=30)
    assert [c["title"] for c in saved] == ["New chat", "Flying cat"]
    assert saved[1]["messages"][0] == {"role": "user", "content": STORY}
    browser.find_element(By.CSS_SELECTOR, "#conv-list .conv:nth-child(2) .delete").click()
    assert texts(browser, "#conv-list .title") == ["New chat"]


def test_stop_cancels_the_generation_on_the_server(srv, browser):
    open_page(browser, srv.url)
    browser.find_element(By.ID, "new-conv").click()
    set_field(browser, "max-tokens", "900")
    # Greedy: at the page's 0.7 the small model sometimes answers in a short
    # line and ends before there is anything to stop.
    set_field(browser, "temperature", "0")
    before = requests_of(srv, SMOL).get("cancelled", 0)
    send(browser, "Count from 1 to 400, one number per line.")
    wait_js(browser, "const c = document.querySelectorAll('#messages .msg.assistant .content');"
            " return c.length && c[c.length - 1].textContent.length > 20", "the answer to start")
    assert browser.find_element(By.ID, "stop").is_displayed()
    assert not browser.find_element(By.ID, "send").is_displayed()
    browser.find_element(By.ID, "input").send_keys(Keys.ESCAPE)
    wait_answered(browser, 1)
    assert "stopped" in texts(browser, "#messages .msg.assistant .stats")[-1]
    wait_until(lambda: requests_of(srv, SMOL).get("cancelled", 0) > before,
               "the server to count the request cancelled", timeout=60)
    set_field(browser, "max-tokens", "512")
    set_field(browser, "temperature", "0.7")


def test_server_errors_are_shown_as_the_server_wrote_them(srv, browser):
    open_page(browser, srv.url)
    browser.find_element(By.ID, "new-conv").click()
    # Shift+Enter is a new line, not a send.
    box = browser.find_element(By.ID, "input")
    box.send_keys("one")
    ActionChains(browser).key_down(Keys.SHIFT).send_keys(Keys.ENTER).key_up(Keys.SHIFT).perform()
    box.send_keys("two")
    assert box.get_attribute("value") == "one\ntwo" and not answers(browser)
    box.clear()
    set_field(browser, "max-tokens", "0")
    send(browser, "Hi")
    wait_answered(browser, 1)
    error = texts(browser, "#messages .msg.assistant .error")[-1]
    direct = httpx.post(srv.url + "/v1/chat/completions", timeout=60, json={
        "model": SMOL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 0})
    assert direct.status_code == 400 and "max_tokens" in error
    assert error == "Error 400: " + direct.json()["error"]["message"]
    # The settings reach the request, and the JSON switch holds the answer
    # to a JSON object.
    browser.execute_script("""
        window.__sent = [];
        const real = window.fetch;
        window.fetch = (url, init) => {
          if (init && init.body) window.__sent.push(JSON.parse(init.body));
          return real(url, init);
        };""")
    set_field(browser, "max-tokens", "64")
    set_field(browser, "temperature", "0.2")
    set_field(browser, "system", "You describe animals.")
    toggle_json(browser)
    send(browser, "Describe a cat as JSON with a name and an age.")
    wait_answered(browser, 2)
    assert answers(browser)[-1].lstrip().startswith("{"), answers(browser)[-1]
    sent = browser.execute_script("return window.__sent")[-1]
    assert sent["max_tokens"] == 64 and sent["temperature"] == 0.2 and sent["stream"] is True
    assert sent["response_format"] == {"type": "json_object"}
    assert sent["messages"][0] == {"role": "system", "content": "You describe animals."}
    assert sent["messages"][-1]["content"] == "Describe a cat as JSON with a name and an age."
    toggle_json(browser)
    set_field(browser, "system", "")
    set_field(browser, "temperature", "0.7")
    set_field(browser, "max-tokens", "512")
    kept = json.loads(browser.execute_script("return localStorage.getItem('llmctl.settings')"))
    assert kept["system"] == "" and kept["json"] is False and kept["maxTokens"] == "512"


def toggle_json(browser) -> None:
    browser.find_element(By.CSS_SELECTOR, "#settings summary").click()
    browser.find_element(By.ID, "json").click()
    browser.find_element(By.CSS_SELECTOR, "#settings summary").click()


XSS = ('<img src=x onerror="window.__xss=1"> <script>window.__xss=2</script> '
       '[link](javascript:window.__xss=3)')


MARKDOWN = ("\n# Heading\n\n- one\n- two\n\n1. first\n\n**bold**, *em*, `code` and "
            "[a link](https://example.com)\n\n> quoted\n")


def test_model_markup_runs_nothing_and_code_stays_visible(srv, browser):
    open_page(browser, srv.url)
    browser.find_element(By.ID, "new-conv").click()
    # The real path first: the model asked to repeat the payload.
    set_field(browser, "max-tokens", "32")
    send(browser, "Repeat exactly: " + XSS)
    wait_answered(browser, 1)
    set_field(browser, "max-tokens", "512")
    # Then an answer that surely carries it, with reasoning and a tool call,
    # as stored: the same renderer draws stored and streamed answers.
    answer = {"role": "assistant", "model": SMOL, "reasoning": "Thinking <b>hard</b>",
              "content": XSS + "\n\n```html\n<script>window.__xss=4</script>\n```\n" + MARKDOWN,
              "toolCalls": [{"id": "call_1", "type": "function",
                             "function": {"name": "get_weather", "arguments": '{"city": "<i>"}'}}]}
    conv = {"id": "xss", "title": "markup", "created": 0,
            "messages": [{"role": "user", "content": XSS}, answer]}
    browser.execute_script("localStorage.setItem('llmctl.conversations', arguments[0]);"
                           "localStorage.setItem('llmctl.current', 'xss');", json.dumps([conv]))
    browser.refresh()
    open_page(browser, srv.url)
    assert browser.execute_script("return typeof window.__xss") == "undefined"
    box = browser.find_element(By.ID, "messages")
    assert not box.find_elements(By.CSS_SELECTOR, "img, script, b, i, a[href^='javascript']")
    assert "<img src=x onerror=" in answers(browser)[-1]
    code = box.find_element(By.CSS_SELECTOR, ".msg.assistant .code pre")
    assert code.is_displayed() and code.text == "<script>window.__xss=4</script>"
    reasoning = box.find_element(By.CSS_SELECTOR, ".msg.assistant details.reasoning")
    assert reasoning.is_displayed() and reasoning.get_attribute("open") is None
    tool = box.find_element(By.CSS_SELECTOR, ".msg.assistant .tool-call")
    assert "get_weather" in tool.text and '"<i>"' in tool.text
    drawn = browser.execute_script(
        "const m = document.querySelector('#messages .msg.assistant .content');"
        "return ['h3', 'ul li', 'ol li', 'strong', 'em', 'p code', 'blockquote']"
        ".map((s) => m.querySelectorAll(s).length)"
        ".concat([m.querySelector('a').href, m.querySelector('a').rel])")
    assert drawn == [1, 2, 1, 1, 1, 1, 1, "https://example.com/", "noopener noreferrer"]
    browser.execute_script("document.querySelector('#messages .msg.assistant').scrollIntoView()")
    screenshot(browser, "webui-markup.png")
    # The code block's Copy button puts the code, as text, on the clipboard.
    browser.execute_cdp_cmd("Browser.grantPermissions", {
        "origin": srv.url, "permissions": ["clipboardReadWrite", "clipboardSanitizedWrite"]})
    box.find_element(By.CSS_SELECTOR, ".msg.assistant .code .copy").click()
    wait_js(browser, "return document.querySelector('.msg.assistant .code .copy').textContent"
            " === 'Copied'", "the copy to be done")
    copied = browser.execute_async_script("navigator.clipboard.readText().then(arguments[0])")
    assert copied == "<script>window.__xss=4</script>"
    assert browser.execute_script("return typeof window.__xss") == "undefined"


def test_switching_to_an_unloaded_model_shows_it_loading(srv, browser):
    open_page(browser, srv.url)
    browser.find_element(By.ID, "new-conv").click()
    browser.execute_script("""
        window.__states = [];
        new MutationObserver(() => window.__states.push(
            document.getElementById('model-status').dataset.state))
          .observe(document.getElementById('model-status'), {attributes: true});""")
    Select(browser.find_element(By.ID, "model")).select_by_value(QWEN)
    wait_js(browser, "return document.getElementById('model-status').dataset.state === 'loaded'",
            "qwen to load", timeout=300)
    assert "loading" in browser.execute_script("return window.__states")
    loaded = [m["name"] for m in httpx.get(srv.url + "/api/ps", timeout=30).json()["models"]]
    assert QWEN in loaded
    ok = requests_of(srv, QWEN).get("ok", 0)
    send(browser, "Say hello.")
    wait_answered(browser, 1)
    assert texts(browser, "#messages .msg.assistant .who")[-1] == QWEN
    assert requests_of(srv, QWEN).get("ok", 0) == ok + 1
    # A request that carries tools: the model's call is drawn as a block.
    set_field(browser, "tools", json.dumps([WEATHER]))
    set_field(browser, "temperature", "0")
    browser.find_element(By.ID, "new-conv").click()
    send(browser, "What's the weather in Paris?")
    wait_answered(browser, 1)
    block = browser.find_elements(By.CSS_SELECTOR, "#messages .msg.assistant .tool-call")
    assert block, browser.find_element(By.ID, "messages").text
    assert "get_weather" in block[-1].text and "Paris" in block[-1].text
    set_field(browser, "tools", "")
    set_field(browser, "temperature", "0.7")
    Select(browser.find_element(By.ID, "model")).select_by_value(SMOL)


def test_api_key_is_asked_once_and_a_lost_server_is_shown(session_home, browser):
    server = ServerProcess([SMOL, *ARGS, "--api-key", KEY], env={"LLMCTL_HOME": str(session_home)})
    try:
        server.wait_ready(600)
        browser.get(server.url + "/")
        wait_js(browser, "return document.getElementById('key-dialog').open", "the key prompt")
        browser.find_element(By.ID, "key-input").send_keys("wrong" + Keys.ENTER)
        wait_js(browser, "return document.getElementById('key-dialog').open"
                " && !document.getElementById('key-error').hidden", "the refusal")
        assert "invalid or missing API key" in browser.find_element(By.ID, "key-error").text
        field = browser.find_element(By.ID, "key-input")
        field.clear()
        field.send_keys(KEY + Keys.ENTER)
        wait_js(browser, "return document.body.dataset.ready === '1'", "the page with the key")
        browser.refresh()       # kept in the browser: not asked again
        open_page(browser, server.url)
        assert not browser.execute_script("return document.getElementById('key-dialog').open")
        send(browser, "Hi")
        wait_answered(browser, 1)
        assert answers(browser)[-1] and not texts(browser, "#messages .msg.assistant .error")[-1]
    finally:
        server.stop()
    send(browser, "Are you there?")
    wait_answered(browser, 2)
    assert "connection lost" in texts(browser, "#messages .msg.assistant .error")[-1]


def _app(**policy) -> TestClient:
    pool = ModelPool(LoadOptions(), memory_budget=1 << 30)
    return TestClient(create_app(ServerState(pool, default=SMOL, policy=HttpPolicy(**policy))))


def test_page_is_public_and_the_api_still_guarded():
    http = _app(api_key=KEY)
    for path in ("/", "/webui/static/app.js", "/webui/static/style.css"):
        answer = http.get(path)
        assert answer.status_code == 200 and "connect-src 'self'" in answer.headers[
            "content-security-policy"]
    assert http.get("/webui/static/..%2Froutes.py").status_code == 404
    etag = http.get("/webui/static/app.js").headers["etag"]
    again = http.get("/webui/static/app.js", headers={"If-None-Match": etag})
    assert again.status_code == 304 and not again.content
    assert http.get("/webui/static/missing.js").status_code == 404
    for path in ("/webui/models", "/v1/models"):
        assert http.get(path).status_code == 401
    assert http.post("/webui/load", json={"model": SMOL}).status_code == 401
    foreign = {"Origin": "https://evil.example"}
    assert http.get("/", headers=foreign).status_code == 403
    auth = {"Authorization": f"Bearer {KEY}"}
    assert http.post("/webui/load", json={}, headers=auth).json()["error"]["param"] == "model"


def test_no_webui_turns_the_page_off(session_home):
    assert _app(webui=False, api_key=KEY).get("/").status_code == 401    # no open page
    assert _app(webui=False).get("/").status_code == 404
    env = {"LLMCTL_HOME": str(session_home), "LLMCTL_NO_WEBUI": "1"}     # --no-webui's variable
    with Server.llmctl_serve(env=env) as off:
        assert httpx.get(off.url + "/", timeout=30).status_code == 404
        assert httpx.get(off.url + "/health", timeout=30).status_code == 200
