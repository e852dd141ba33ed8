"""Claude Code's own requests (tests/data/clients/claude-code-2.1.197: a session of Claude Code 2.1.197 against
`localrun serve`) replayed: every turn's prompt starts with the turn before it wherever the conversation only grew
(its mid-conversation system messages rendered where they were put, not hoisted to the top), so each turn after the
first takes its earlier prompt from the cache, through a server restart too; the cache figure is in message_start
already; and no stream is silent longer than the ping interval.

Rendered with Qwen 2.5's template, the one the recorded session ran under (Qwen2.5-Coder-1.5B), on SmolLM2's tokenizer
with two layers of random weights (tests/tinymodel.py): the prompts and the cache are what is tested, and the main
agent's prompt is ~19k tokens."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import httpx
import pytest

from conftest import start_server

pytestmark = pytest.mark.slow

DATA = Path(__file__).resolve().parent.parent / "data"
RECORDED = [json.loads(line) for line in (DATA / "clients" / "claude-code-2.1.197" / "requests.jsonl").read_text().splitlines()]
TEMPLATE = (DATA / "templates" / "Qwen-Qwen2.5-7B-Instruct.jinja").read_text()
# turn -> the turn whose prompt it continues (1-based, as the recording's README numbers its lines)
CONTINUES = {2: 1, 4: 3, 5: 1}
PING_S = 1.0


def rendered(number: int) -> str:
    """The prompt of a recorded turn as the server renders it (the Anthropic translator, then the template)."""
    from localrun.engine.prompt import render_template
    from localrun.serve.dialects.anthropic import asked_of
    from localrun.serve.prepare import message_for_template

    asked = asked_of(RECORDED[number - 1]["body"])
    tools = [t.for_template() for t in asked.tools] or None
    return render_template(TEMPLATE, [message_for_template(m) for m in asked.messages], tools=tools)


@pytest.mark.parametrize("turn, earlier", sorted(CONTINUES.items()))
def test_each_turns_prompt_starts_with_the_turn_before(turn, earlier):
    """The conversation only grew: the earlier prompt, but for its generation prompt (the assistant's header, which
    the earlier answer's own turn replaces), is where the later one begins."""
    before, after = rendered(earlier), rendered(turn)
    header = "<|im_start|>assistant\n"
    assert before.endswith(header)
    assert after.startswith(before[: -len(header)]), os.path.commonprefix([before, after])[-300:]


def _replay(http, number: int, model: str) -> dict:
    """One recorded request, as Claude Code sent it (its headers, its body; a short answer, greedy), read as Claude
    Code reads it: the usage of message_start and message_delta, and the longest gap between two events."""
    row = RECORDED[number - 1]
    body = {**row["body"], "model": model, "max_tokens": 4, "temperature": 0}
    headers = {k: v for k, v in row["headers"].items() if k.lower() not in ("content-length", "host", "accept-encoding")}
    if not body.get("stream"):
        r = http.post("/v1/messages", json=body, headers=headers)
        assert r.status_code == 200, r.text
        usage = r.json()["usage"]
        return {"start": usage, "end": usage, "gap": 0.0}
    out, last, gap = {}, time.monotonic(), 0.0
    with http.stream("POST", "/v1/messages", json=body, headers=headers) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            now = time.monotonic()
            gap, last = max(gap, now - last), now
            event = json.loads(line[6:])
            if event["type"] == "message_start":
                out["start"] = event["message"]["usage"]
            elif event["type"] == "message_delta":
                out["end"] = event["usage"]
    out["gap"] = gap
    return out


def _prompt(usage: dict) -> int:
    return usage["input_tokens"] + usage["cache_read_input_tokens"]


def test_every_turn_after_the_first_comes_from_the_cache_through_a_restart(smollm2, tmp_path, monkeypatch):
    from tinymodel import write_tiny_model

    tiny = write_tiny_model(smollm2, tmp_path / "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", TEMPLATE, context_length=32768)
    monkeypatch.setenv("LOCALRUN_PING_S", str(PING_S))
    home = tmp_path / "home"
    seen: dict[int, dict] = {}
    with httpx.Client(timeout=600) as http:
        server = start_server(tiny, home, "--ctx", "24576", "--parallel", "1")
        try:
            http.base_url = server.url
            for number in (1, 2, 3):
                seen[number] = _replay(http, number, tiny.name)
        finally:
            assert server.stop() == 130
        server = start_server(tiny, home, "--ctx", "24576", "--parallel", "1")  # a restart: the cache is on disk
        try:
            http.base_url = server.url
            for number in (4, 5):
                seen[number] = _replay(http, number, tiny.name)
        finally:
            assert server.stop() == 130
    for number, figures in seen.items():
        # the cache figure as soon as the prompt's prefix was matched: message_start says what message_delta says
        assert figures["start"]["cache_read_input_tokens"] == figures["end"]["cache_read_input_tokens"], (number, figures)
        assert _prompt(figures["start"]) == _prompt(figures["end"]), (number, figures)
        # never silent for longer than the ping interval (a margin for a loaded machine's scheduling)
        assert figures["gap"] < PING_S + 5, (number, figures["gap"])
    for turn, earlier in CONTINUES.items():
        # the earlier prompt came from the cache, but for the few tokens of its assistant header (and, where the earlier
        # turn was answered here, what differs from the recorded answer)
        cached, before = seen[turn]["end"]["cache_read_input_tokens"], _prompt(seen[earlier]["end"])
        assert cached >= before - 8, (turn, earlier, cached, before)
