"""Reasoning controls reach the model: a thinking budget closes the thinking with the family's own end marker after
N tokens and the answer begins (llama.cpp's reasoning budget; OpenAI's reasoning_budget or llama-server's
reasoning_budget_tokens, Anthropic's thinking.budget_tokens, Ollama's options), and the effort a client asks for
reaches the template (OpenAI's reasoning_effort, the Responses API's reasoning.effort, Ollama's think level) as
gpt-oss's template reads it. SmolLM2 under a reasoning template (conftest.thinking_model)."""

from __future__ import annotations

import json

import httpx
import pytest

from conftest import THINK_GRAMMAR, start_server

pytestmark = pytest.mark.slow

Q = "What is the capital of France?"
# A template that writes what the effort asks for, as gpt-oss's writes "Reasoning: high" into its system message.
EFFORT = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
          "{% if reasoning_effort is defined and reasoning_effort == 'high' %}<|im_start|>system\n"
          "{{ 'Think long and hard about every single word before you answer. ' * 8 }}<|im_end|>\n{% endif %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}")


@pytest.fixture(scope="module")
def server(thinking_model, tmp_path_factory):
    with start_server(thinking_model, tmp_path_factory.mktemp("reasoning-home"), "--parallel", "1", "--ctx", "1024") as srv:
        yield srv


def test_a_thinking_budget_closes_the_thinking_with_the_familys_marker(server, thinking_model):
    ask = {"model": str(thinking_model), "messages": [{"role": "user", "content": Q}], "temperature": 0, "max_tokens": 90,
           "grammar": THINK_GRAMMAR}
    with httpx.Client(base_url=server.url, timeout=300) as http:
        free = http.post("/v1/chat/completions", json=ask).json()["choices"][0]["message"]
        budgeted = http.post("/v1/chat/completions", json={**ask, "reasoning_budget": 4}).json()["choices"][0]["message"]
        # the thinking stopped at the budget, its end marker came, and the answer followed (kept apart, no marker left)
        assert len(budgeted["reasoning_content"]) < len(free["reasoning_content"]), (budgeted, free)
        assert free["reasoning_content"].startswith(budgeted["reasoning_content"].strip())
        assert budgeted["content"] and "</think>" not in budgeted["content"] + budgeted["reasoning_content"]
        # llama-server's spelling
        alias = http.post("/v1/chat/completions", json={**ask, "reasoning_budget_tokens": 4}).json()["choices"][0]["message"]
        assert alias["reasoning_content"] == budgeted["reasoning_content"]
        # Anthropic's thinking.budget_tokens, streamed (no grammar there: the model thinks freely until the budget): the
        # thinking block holds 4 tokens, then the text block follows
        with http.stream("POST", "/v1/messages", json={
                "model": str(thinking_model), "max_tokens": 40, "messages": [{"role": "user", "content": Q}],
                "thinking": {"type": "enabled", "budget_tokens": 4}, "temperature": 0, "stream": True}) as r:
            lines = [line for line in r.iter_lines() if line.startswith("data: ")]
        events = [json.loads(line[6:]) for line in lines]
        thought = "".join(e["delta"].get("thinking", "") for e in events if e["type"] == "content_block_delta")
        text = "".join(e["delta"].get("text", "") for e in events if e["type"] == "content_block_delta")
        tokens = http.post("/api/embed", json={"model": str(thinking_model), "input": thought}).json()
        assert thought.strip() and text.strip() and "</think>" not in thought + text
        assert tokens["prompt_eval_count"] <= 4 + 2, thought  # (its own BOS, a piece cut at the marker)
        # Ollama's options
        o = http.post("/api/chat", json={"model": str(thinking_model), "messages": [{"role": "user", "content": Q}], "stream": False,
                                         "think": True, "options": {"temperature": 0, "num_predict": 90, "grammar": THINK_GRAMMAR,
                                                                    "reasoning_budget": 4}}).json()["message"]
        assert o["thinking"].strip() == budgeted["reasoning_content"].strip() and o["content"].strip() == budgeted["content"].strip()
        bad = http.post("/v1/chat/completions", json={**ask, "reasoning_budget": -5})
        assert bad.status_code == 400 and "reasoning_budget" in bad.json()["error"]["message"]


def test_the_effort_asked_for_reaches_the_template(server, thinking_model):
    with httpx.Client(base_url=server.url, timeout=300) as http:
        made = http.post("/api/create", json={"model": "effort", "from": str(thinking_model), "template": EFFORT, "stream": False})
        assert made.status_code == 200, made.text
        ask = {"model": "effort", "messages": [{"role": "user", "content": Q}], "max_tokens": 1, "temperature": 0}

        def prompt_tokens(**more) -> int:
            r = http.post("/v1/chat/completions", json={**ask, **more})
            assert r.status_code == 200, r.text
            return r.json()["usage"]["prompt_tokens"]

        plain, low, high = prompt_tokens(), prompt_tokens(reasoning_effort="low"), prompt_tokens(reasoning_effort="high")
        assert plain == low < high - 50
        responses = http.post("/v1/responses", json={"model": "effort", "input": Q, "max_output_tokens": 16,
                                                     "reasoning": {"effort": "high"}, "temperature": 0}).json()
        assert responses["usage"]["input_tokens"] == high
        ollama = http.post("/api/chat", json={"model": "effort", "messages": [{"role": "user", "content": Q}], "stream": False,
                                              "think": "high", "options": {"num_predict": 1}}).json()
        assert ollama["prompt_eval_count"] == high
        wrong = http.post("/v1/chat/completions", json={**ask, "reasoning_effort": "extreme"})
        assert wrong.status_code == 400 and "reasoning_effort" in wrong.json()["error"]["message"]
