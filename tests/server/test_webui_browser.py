"""The chat page in a real browser (issue 64): headless Chromium driven by Selenium against a real
`edgellm serve smollm2-135m` and a router of two tiny models. Skipped, saying why, where Debian's chromium
and chromium-driver (or selenium) are absent. Every test also checks the page asked for nothing outside
its server's origin (resource timings, CSP violations) and logged no console error."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest

from edgellm.testing import browser
from edgellm.testing.reasoning import THINKING_TEMPLATE
from edgellm.testing.servers import httpx, metrics, start_server, stop_server
from edgellm.testing.synthetic.models import write_tiny_model

pytestmark = pytest.mark.skipif(browser.missing() is not None, reason=f"no browser: {browser.missing()}")

KEY = "webui-browser-key"
HOSTILE = [
    '<img src=x onerror="window.__xss=1">',
    "<script>window.__xss=2</script>",
    "[click me](javascript:window.__xss=3)",
    "[data](data:text/html,<script>alert(1)</script>)",
    '<a href="javascript:alert(4)">a</a> <iframe src="/"></iframe> <svg onload=alert(5)>',
    "```html\n<img src=y onerror=alert(6)>\n```",
]


@pytest.fixture(scope="module")
def driver() -> Iterator:
    d = browser.chromium()
    try:
        yield d
    finally:
        d.quit()


def until(condition, timeout: float = 120, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := condition():
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def by_name(d, name: str):
    """The one visible control whose accessible name is `name` (how a user and a screen reader find it)."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By

    for _ in range(10):  # a streamed reply re-renders the messages: a control found may go stale
        try:
            controls = d.find_elements(By.CSS_SELECTOR, "button, textarea, select, input")
            [hit] = [e for e in controls if e.is_displayed() and e.accessible_name == name]
            return hit
        except StaleElementReferenceException:
            time.sleep(0.05)
    raise AssertionError(f"no stable control named {name!r}")


def messages(d, role: str) -> list[str]:
    """The text of each message of `role`, as shown (its buttons left out)."""
    bubbles = f"document.querySelectorAll('[data-role={role}] .bubble')"
    return d.execute_script(f"return [...{bubbles}].map(e => e.innerText)")


def model_count(d) -> int:
    return d.execute_script("return document.getElementById('model').options.length")


def open_page(d, url: str, settings: dict | None = None, conversations: list | None = None) -> None:
    """The page fresh: storage cleared (then `settings` and `conversations` stored), the models listed."""
    d.get(f"{url}/ui/icon.svg")  # the origin, to clear its storage before the page reads it
    d.execute_script(
        "localStorage.clear(); sessionStorage.clear();"
        "if (arguments[0]) localStorage.setItem('edgellm.settings', arguments[0]);"
        "if (arguments[1]) localStorage.setItem('edgellm.conversations', arguments[1]);",
        json.dumps(settings) if settings else None,
        json.dumps(conversations) if conversations else None,
    )
    d.get(f"{url}/")


def assert_stayed_home(d, url: str) -> None:
    names = d.execute_script("return performance.getEntriesByType('resource').map(e => e.name)")
    assert names and all(n.startswith(url + "/") for n in names), names
    assert d.execute_script("return window.__cspViolations") == []
    errors = [e for e in d.get_log("browser") if e["level"] == "SEVERE"]
    assert errors == [], errors


def wait_idle(d) -> None:
    until(lambda: d.execute_script("return !document.getElementById('send').disabled"), what="the end")


def test_a_reply_streams_stop_keeps_it_and_a_reload_keeps_the_conversation(driver, apis_server: str) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    d = driver
    open_page(d, apis_server, settings={"temperature": 0.0, "max_tokens": 900})
    until(lambda: model_count(d), what="the models")
    assert by_name(d, "Model").get_attribute("value") == "smollm2-135m"
    for name in ("New chat", "Message", "Send"):
        by_name(d, name)
    by_name(d, "Message").send_keys("Count from 1 to 300, one number per line.")
    by_name(d, "Send").click()
    seen = set()  # the reply's lengths while it streams: several, so it came in pieces
    reply_length = lambda: len((messages(d, "assistant") or [""])[0])  # noqa: E731
    until(lambda: seen.add(reply_length()) or len(seen - {0, 1}) >= 3, what="tokens")
    assert metrics(apis_server)["edgellm_num_requests_running"] == 1
    by_name(d, "Stop").click()
    wait_idle(d)
    [partial] = messages(d, "assistant")
    assert "stopped" in partial and len(partial) >= max(seen) - 1
    # The abort closed the connection: the server cancelled the generation.
    until(lambda: metrics(apis_server)["edgellm_num_requests_running"] == 0, 30, "the server to cancel")
    generated = metrics(apis_server)["edgellm_generation_tokens_total"]
    time.sleep(0.5)
    assert metrics(apis_server)["edgellm_generation_tokens_total"] == generated
    d.refresh()
    until(lambda: messages(d, "assistant") == [partial], 30, "the conversation after a reload")
    assert messages(d, "user") == ["Count from 1 to 300, one number per line."]
    # Esc stops too, wherever the focus is.
    by_name(d, "Message").send_keys("And from 300 down to 1.", Keys.ENTER)
    until(lambda: len((messages(d, "assistant") + ["", ""])[1]) > 5, what="the second reply")
    d.find_element(By.TAG_NAME, "body").send_keys(Keys.ESCAPE)
    wait_idle(d)
    assert "stopped" in messages(d, "assistant")[1]
    until(lambda: metrics(apis_server)["edgellm_num_requests_running"] == 0, 30, "the server to cancel")
    assert_stayed_home(d, apis_server)


def test_replies_and_imported_files_render_as_text_and_run_nothing(driver, apis_server, tmp_path) -> None:
    from selenium.webdriver.common.by import By

    d = driver
    hostile = "\n\n".join([*HOSTILE, "A **safe** [link](https://example.com/docs)."])
    stored = {
        "id": "stored",
        "title": "<img src=x onerror=alert(7)>",
        "updated": 2,
        "messages": [
            {"role": "user", "content": hostile},
            {"role": "assistant", "content": hostile, "reasoning": HOSTILE[0], "model": HOSTILE[1]},
            {"role": "system<script>", "content": "dropped: not a role the page knows"},
        ],
    }
    open_page(d, apis_server, conversations=[stored])
    until(lambda: messages(d, "assistant"), 30, "the stored conversation")
    imported = tmp_path / "chats.json"
    imported.write_text(json.dumps({"conversations": [{**stored, "id": "imported", "updated": 3}]}))
    file_input = d.find_element(By.ID, "import-file")
    d.execute_script("arguments[0].hidden = false", file_input)
    file_input.send_keys(str(imported))
    until(lambda: len(d.find_elements(By.CSS_SELECTOR, ".conversations li")) == 2, 30, "the import")
    for i in range(2):  # each click re-renders the list: find the buttons again
        d.find_elements(By.CSS_SELECTOR, ".conversations .open")[i].click()
        [text] = messages(d, "assistant")
        assert '<img src=x onerror="window.__xss=1">' in text and "<script>window.__xss=2</script>" in text
        assert "[click me](javascript:window.__xss=3)" in text
        log = d.find_element(By.ID, "messages")
        assert not log.find_elements(By.CSS_SELECTOR, "img, script, iframe, svg, object, embed")
        hrefs = [a.get_attribute("href") for a in log.find_elements(By.TAG_NAME, "a")]
        assert hrefs == ["https://example.com/docs"], hrefs  # the reply's one http(s) link (user text: as is)
        assert log.find_element(By.TAG_NAME, "strong").text == "safe"
        assert len(messages(d, "user")) == 1  # the unknown role was dropped
        [fold] = log.find_elements(By.CSS_SELECTOR, "details.reasoning")  # reasoning: folded, apart
        assert fold.get_attribute("open") is None and HOSTILE[0] not in fold.text
        fold.click()
        assert fold.text == "Reasoning\n" + HOSTILE[0]
    assert d.execute_script("return [window.__xss, window.__dialogs]") == [None, []]
    assert_stayed_home(d, apis_server)


@pytest.fixture(scope="module")
def keyed_router(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str, str]]:
    d = tmp_path_factory.mktemp("webui-router")
    a = str(write_tiny_model(d / "a.gguf", "llama", seed=1))
    thinks = {"tokenizer.chat_template": THINKING_TEMPLATE}  # b's replies start in <think>: reasoning
    b = str(write_tiny_model(d / "b.gguf", "qwen3", seed=2, metadata_overrides=thinks))
    router, url = start_server(None, "--models", f"{a},{b}", "--ctx", "128", "--kv-cache-memory", "1M",
                               "--api-key", KEY)  # fmt: skip
    try:
        yield url, a, b
    finally:
        stop_server(router)


def _loaded(url: str) -> dict[str, bool]:
    r = httpx.get(f"{url}/v1/models", headers={"Authorization": f"Bearer {KEY}"}, timeout=10)
    data = r.json()["data"]
    return {m["id"]: m["status"]["loaded"] for m in data}


def test_the_key_is_asked_once_and_the_model_picker_switches_models(driver, keyed_router) -> None:
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.select import Select

    d = driver
    url, a, b = keyed_router
    open_page(d, url, settings={"max_tokens": 6})
    key_shown = lambda: d.find_element("id", "api-key").is_displayed() and by_name(d, "API key")  # noqa: E731
    until(key_shown, 30, "the key dialog").send_keys("wrong-key", Keys.ENTER)
    until(lambda: d.find_element("id", "key-reason").text == "The server refused that key.", 30, "a refusal")
    assert [e["message"].split(" - ")[1] for e in d.get_log("browser")] == [  # the one error expected
        "Failed to load resource: the server responded with a status of 401 (Unauthorized)"
    ]
    by_name(d, "API key").send_keys(KEY, Keys.ENTER)
    until(lambda: model_count(d) == 2, 30, "the models")
    assert d.execute_script("return sessionStorage.getItem('edgellm.apiKey')") == KEY
    assert _loaded(url) == {a: False, b: False}
    Select(by_name(d, "Model")).select_by_value(b)
    box = by_name(d, "Message")
    box.send_keys("hello", Keys.SHIFT, Keys.ENTER, Keys.SHIFT, "there", Keys.ENTER)  # Shift+Enter: a newline
    until(lambda: len(messages(d, "assistant")) == 1, 30, "a reply")
    wait_idle(d)
    assert messages(d, "user") == ["hello\nthere"]
    assert _loaded(url) == {a: False, b: True}
    # b streamed delta.reasoning_content: shown folded, apart from the (empty) answer
    [fold] = d.find_elements("css selector", "[data-role=assistant] details.reasoning")
    assert fold.get_attribute("open") is None and fold.text == "Reasoning"
    assert d.execute_script("return document.querySelector('.reasoning-text').textContent.length") > 0
    by_name(d, "Regenerate").click()
    wait_idle(d)
    assert len(messages(d, "assistant")) == 1
    Select(by_name(d, "Model")).select_by_value(a)
    by_name(d, "Regenerate").click()  # the reply again, from the other model
    wait_idle(d)
    assert len(messages(d, "assistant")) == 1 and _loaded(url) == {a: True, b: True}
    by_name(d, "Edit").click()
    edit = by_name(d, "Edit message")
    edit.clear()
    edit.send_keys("edited")
    by_name(d, "Save and send").click()
    wait_idle(d)
    assert messages(d, "user") == ["edited"] and len(messages(d, "assistant")) == 1
    by_name(d, "New chat").click()
    assert messages(d, "user") == [] and len(d.find_elements("css selector", ".conversations li")) == 2
    d.refresh()  # the key lasts the session: no second prompt
    until(lambda: model_count(d) == 2, 30, "the models")
    assert not d.find_element("id", "api-key").is_displayed()
    assert_stayed_home(d, url)


def test_dark_theme_toggles_and_persists(driver, apis_server: str) -> None:
    d = driver
    open_page(d, apis_server)
    before = d.execute_script("return document.documentElement.dataset.theme")
    by_name(d, "Theme").click()
    after = d.execute_script("return document.documentElement.dataset.theme")
    assert {before, after} == {"light", "dark"}
    background = d.execute_script("return getComputedStyle(document.body).backgroundColor")
    d.refresh()
    assert d.execute_script("return document.documentElement.dataset.theme") == after
    assert d.execute_script("return getComputedStyle(document.body).backgroundColor") == background
