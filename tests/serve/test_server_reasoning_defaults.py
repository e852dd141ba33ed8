"""serve's --reasoning on|off|auto, --reasoning-effort and --chat-template-kwargs (llama-server's flags): what every chat
request that says nothing else is answered with; a request's own settings win, key by key. Checked on the prompt
the template renders (/apply-template, as the request would be answered) with SmolLM2 under a reasoning template whose
enable_thinking false closes the thinking at once (conftest.thinking_model); bad values are usage errors."""

from __future__ import annotations

import httpx
import pytest

from conftest import run_cli, start_server

pytestmark = pytest.mark.slow

ASK = [{"role": "user", "content": "What is the capital of France?"}]


def prompt(server, model, **extra) -> str:
    with httpx.Client(base_url=server.url, timeout=120) as http:
        r = http.post("/apply-template", json={"model": str(model), "messages": ASK, **extra})
    assert r.status_code == 200, r.text
    return r.json()["prompt"]


def test_the_servers_reasoning_is_the_default_a_request_overrides(thinking_model, tmp_path):
    with start_server(thinking_model, tmp_path / "plain", "--parallel", "1", "--ctx", "512") as plain:
        thinking = prompt(plain, thinking_model)
        closed = prompt(plain, thinking_model, chat_template_kwargs={"enable_thinking": False})
    assert thinking != closed and "</think>" in closed and "</think>" not in thinking  # the template's switch shows
    with start_server(thinking_model, tmp_path / "off", "--parallel", "1", "--ctx", "512", "--reasoning", "off") as off:
        assert prompt(off, thinking_model) == closed
        assert prompt(off, thinking_model, chat_template_kwargs={"enable_thinking": True}) == thinking  # the request wins
    with start_server(thinking_model, tmp_path / "kwargs", "--parallel", "1", "--ctx", "512",
                      "--chat-template-kwargs", '{"enable_thinking": false}') as given:
        assert prompt(given, thinking_model) == closed
        assert prompt(given, thinking_model, chat_template_kwargs={"enable_thinking": True}) == thinking


@pytest.mark.parametrize("flag", [("--reasoning", "maybe"), ("--reasoning-effort", "huge"),
                                  ("--chat-template-kwargs", "[1]"), ("--chat-template-kwargs", "{not json")])
def test_a_bad_value_is_one_line_and_exit_2(flag):
    r = run_cli("serve", *flag, "--port", "0")
    assert r.returncode == 2 and flag[0] in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "Traceback" not in r.stderr
