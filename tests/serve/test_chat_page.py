"""The chat page at `/` of `localrun serve`, in headless Chromium (Playwright, Debian's chromium): the key asked
for and kept, a model picked from /v1/models, a message streamed and answered with its speed, a second turn that
carries the first, stop that halts an answer (the server's slot freed), the conversation kept across a reload, an
image reaching a vision model (SmolLM2 with the test projector). Screenshots in the test's tmp folder."""

from __future__ import annotations

import re

import httpx
import pytest

from browser import chromium
from conftest import start_server, wait_until
from projector import IMAGE_SIZE, PATCH_SIZE

pytestmark = pytest.mark.slow
KEY = "page-key-7"
SMOL = "SmolLM2-135M-Instruct.Q4_1.gguf"
N_IMAGE = (IMAGE_SIZE // PATCH_SIZE) ** 2  # the test projector's tokens for any image
LAST = ".message.assistant >> nth=-1"
# Records every text the last answer showed while it streamed (the page draws at most once a frame)
WATCH = """() => {
  window.seen = [];
  new MutationObserver(() => {
    const last = [...document.querySelectorAll('.message.assistant')].pop();
    if (last && last.dataset.state === 'streaming') window.seen.push(last.querySelector('.content').textContent);
  }).observe(document.getElementById('messages'), {subtree: true, childList: true, characterData: true});
}"""


@pytest.fixture(scope="module")
def server(smollm2, image_files, tmp_path_factory):
    with start_server(smollm2, tmp_path_factory.mktemp("home"), "--ctx", "1024", "--parallel", "2", "--api-key", KEY,
                      "--mmproj", str(image_files / "mmproj-test.gguf")) as srv:
        yield srv


def idle(server) -> bool:
    return httpx.get(server.url + "/health").json()["slots_processing"] == 0


def settings(page, **values) -> None:
    """Fill the Settings form as a person would (each field is kept when it changes)."""
    if not page.eval_on_selector("#settings", "d => d.open"):  # (a 401 opens it by itself)
        page.click("#settings summary")
    for field, value in values.items():
        page.fill(f"#{field}", str(value))
        page.dispatch_event(f"#{field}", "change")
    page.click("#settings summary")


def say(page, text: str) -> None:
    page.fill("#prompt", text)
    page.press("#prompt", "Enter")


def answered(page) -> dict:
    """Wait for the last answer to end; its state, text and figures."""
    page.wait_for_selector('.message.assistant:last-child[data-state="done"], .message.assistant:last-child[data-state="error"]',
                           timeout=300_000)
    last = page.locator(LAST)
    return {"state": last.get_attribute("data-state"), "text": last.locator(".content").inner_text(),
            "meta": last.locator(".meta .speed").inner_text() if last.locator(".meta .speed").count() else ""}


def prompt_tokens(meta: str) -> int:
    return int(re.search(r"prompt (\d+)", meta).group(1))


def test_a_conversation_in_the_page(server, tmp_path):
    asked = []
    with chromium() as browser:
        page = browser.new_page(viewport={"width": 1100, "height": 760})
        page.on("request", lambda r: asked.append(r.post_data_json) if r.method == "POST" and r.url.endswith("/v1/chat/completions") else None)
        errors = []  # the page's own errors, and what its Content-Security-Policy blocked
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" and "status of 401" not in m.text else None)
        page.goto(server.url + "/")
        # The server asks for a key: the page says so, and opens its settings
        page.wait_for_selector("#notice.error")
        assert "API key" in page.inner_text("#notice")
        page.screenshot(path=tmp_path / "1-no-key.png")
        settings(page, **{"api-key": KEY, "temperature": 0, "max-tokens": 24})
        page.wait_for_function("document.querySelectorAll('#model option').length > 0")
        assert page.eval_on_selector_all("#model option", "os => os.map(o => o.value)") == [SMOL]
        page.select_option("#model", SMOL)

        page.evaluate(WATCH)
        say(page, "What is the capital of France?")
        first = answered(page)
        assert first["state"] == "done" and first["text"].strip(), first
        assert re.search(r"\d+ tokens .* prompt \d+", first["meta"]), first["meta"]  # each answer's speed and size
        # Streamed: asked for as a stream, and drawn while it streamed (the prompt's reading, pieces of the answer; on a
        # busy machine the whole answer may come in one read, drawn once with the state already done)
        assert asked[-1]["stream"] is True
        shown = [t for t in page.evaluate("window.seen") if t and not t.startswith("Waiting")]
        assert shown, shown
        page.screenshot(path=tmp_path / "2-answered.png")

        say(page, "And of Germany?")
        second = answered(page)
        assert second["state"] == "done" and second["text"].strip()
        messages = asked[-1]["messages"]
        assert [m["role"] for m in messages] == ["user", "assistant", "user"]
        assert messages[0]["content"] == "What is the capital of France?" and messages[2]["content"] == "And of Germany?"
        assert messages[1]["content"].strip() == first["text"].strip()  # the first answer as it was shown
        assert asked[-1]["model"] == SMOL and asked[-1]["stream"] is True and asked[-1]["max_tokens"] == 24

        # Stop: a long answer halted part way; the server's slot is freed and the text stays as it was
        settings(page, **{"max-tokens": 400})
        say(page, "Write a very long story about a dragon who learns to cook.")
        page.wait_for_function("() => { const m = [...document.querySelectorAll('.message.assistant')].pop();"
                               " return m.dataset.state === 'streaming' && m.querySelector('.content').textContent.length > 40; }",
                               timeout=300_000)
        page.click("#stop")
        page.wait_for_selector('.message.assistant:last-child[data-state="stopped"]')
        stopped = page.locator(LAST).locator(".content").inner_text()
        wait_until(lambda: idle(server), what="the server to end the stopped answer")
        assert page.locator(LAST).locator(".content").inner_text() == stopped
        assert len(stopped.split()) < 300  # not the 400 tokens asked for
        assert page.is_visible("#send") and not page.is_visible("#stop")
        page.screenshot(path=tmp_path / "3-stopped.png")

        # Regenerate: the stopped answer is replaced by a new one, asked with the same conversation
        settings(page, **{"max-tokens": 12})
        page.click(".message.assistant:last-child .regenerate")
        again = answered(page)
        assert again["state"] == "done" and again["text"].strip()
        assert [m["role"] for m in asked[-1]["messages"]] == ["user", "assistant"] * 2 + ["user"]
        regenerated = asked[-1]["messages"]
        assert regenerated[:3] == messages and regenerated[3]["content"].strip() == second["text"].strip()
        assert regenerated[4]["content"].startswith("Write a very long story")  # (the stopped answer is not sent)

        # The conversation is kept in the browser: a reload shows it again
        page.reload()
        page.wait_for_selector(".message.assistant")
        assert page.locator(".message.user").count() == 3 and page.locator(".message.assistant").count() == 3
        assert page.locator(LAST).locator(".content").inner_text() == again["text"]
        assert page.locator("#conversations li").count() == 1
        page.screenshot(path=tmp_path / "4-reloaded.png")
        assert not errors, errors
    assert idle(server)


def test_an_image_reaches_a_vision_model(server, image_files, tmp_path):
    with chromium() as browser:
        page = browser.new_page(viewport={"width": 1100, "height": 760})
        page.goto(server.url + "/")
        page.wait_for_selector("#notice.error")
        settings(page, **{"api-key": KEY, "temperature": 0, "max-tokens": 8})
        page.wait_for_function("document.querySelectorAll('#model option').length > 0")
        say(page, "Describe the picture.")
        without = answered(page)
        assert without["state"] == "done", without

        page.click("#new-chat")
        page.set_input_files("#image-input", str(image_files / "red.png"))
        page.wait_for_selector("#attachments img")
        say(page, "Describe the picture.")
        page.wait_for_selector(".message.user .images img")
        with_image = answered(page)
        assert with_image["state"] == "done", with_image
        assert prompt_tokens(with_image["meta"]) == prompt_tokens(without["meta"]) + N_IMAGE  # the image's tokens
        page.screenshot(path=tmp_path / "image.png")


def test_the_page_and_its_files(server):
    page = httpx.get(server.url + "/", headers={"Accept": "text/html,application/xhtml+xml"})
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "connect-src 'self'" in page.headers["content-security-policy"]
    assert "http://" not in page.text and "https://" not in page.text  # nothing from elsewhere
    for name, kind in (("chat.js", "text/javascript"), ("chat.css", "text/css")):
        asset = httpx.get(server.url + "/static/" + name)  # public, as the page is: no key
        assert asset.status_code == 200 and asset.headers["content-type"].startswith(kind)
    assert httpx.get(server.url + "/static/nope.js").status_code == 404
    assert httpx.get(server.url + "/static/..%2Fguards.py").status_code == 404  # only the page's own files
    # Ollama's clients (no Accept for HTML) still hear "Ollama is running" at /
    assert httpx.get(server.url + "/").text.startswith("Ollama is running")
    assert httpx.get(server.url + "/v1/models").status_code == 401  # the API itself still needs the key
