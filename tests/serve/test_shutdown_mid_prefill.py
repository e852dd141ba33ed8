"""SIGTERM while a long prompt is being evaluated (#32 item 6): the requests in flight still get the answer
promised for a stop, in their dialect's shape, once the step under way ends: a 503 JSON error (not a
plain-text 500) and, on a stream, an error event (not an empty body). One step here is a whole 7,000-token
prompt (--prefill-chunk 8192), longer than a step of the usual chunk."""

from __future__ import annotations

import json
import signal
import threading

import httpx
import pytest

from conftest import start_server, wait_until

pytestmark = pytest.mark.slow


def test_sigterm_mid_prefill_answers_503_and_an_error_event(smollm2, tmp_path):
    srv = start_server(smollm2, tmp_path / "home", "--parallel", "2", "--ctx", "8192", "--prefill-chunk", "8192")
    prompt = "The quick brown fox jumps over the lazy dog. " * 700  # about 7,000 tokens
    answers: dict[str, object] = {}

    def plain() -> None:
        r = httpx.post(srv.url + "/v1/completions", json={"prompt": prompt, "max_tokens": 4}, timeout=600)
        answers["plain"] = (r.status_code, r.headers.get("content-type"), r.text)

    def streamed() -> None:
        with httpx.stream("POST", srv.url + "/v1/chat/completions", timeout=600, json={
                "messages": [{"role": "user", "content": prompt}], "max_tokens": 4, "stream": True}) as r:
            answers["stream"] = (r.status_code, r.read().decode())

    threads = [threading.Thread(target=plain), threading.Thread(target=streamed)]
    try:
        for t in threads:
            t.start()
        wait_until(lambda: httpx.get(srv.url + "/health").json()["slots_processing"] == 2, what="both prompts in evaluation")
        srv.proc.send_signal(signal.SIGTERM)
        for t in threads:
            t.join(timeout=600)
        assert srv.proc.wait(timeout=600) in (0, -signal.SIGTERM)  # uvicorn ends by the signal it caught
    finally:
        if srv.proc.poll() is None:
            srv.proc.kill()
            srv.proc.wait()
    status, kind, text = answers["plain"]
    assert status == 503 and kind == "application/json", text
    assert "shutting down" in json.loads(text)["error"]["message"]
    status, text = answers["stream"]
    events = [line.removeprefix("data: ") for line in text.splitlines() if line.startswith("data: ")]
    assert status == 200 and events, text
    assert "shutting down" in json.loads(events[-1])["error"]["message"], text
    assert "Traceback" not in "".join(srv.stderr)
