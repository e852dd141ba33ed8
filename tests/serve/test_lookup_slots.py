"""Prompt-lookup speculation in the server's slots (`serve --draft lookup`): with the real SmolLM2, two
concurrent greedy requests that copy text from their prompts answer token for token what a plain server
answers, while drafts are proposed and accepted (the server's /metrics counts them); a request that asks
for log-probabilities still gets them (it decodes plainly)."""

from __future__ import annotations

import concurrent.futures
import re
import time

import httpx
import pytest

from conftest import start_server, wait_until

pytestmark = pytest.mark.slow

TEXT = ("The lighthouse keeper climbed the spiral stairs at dusk, lit the great lamp, wound the clockwork that turned "
        "the lens, and wrote the weather in the log: wind from the west, sea calm, two ships passing north.")
PROMPTS = [f"Repeat this text exactly, word for word:\n\n{TEXT}",
           f"Copy the following sentence twice:\n\n{TEXT.split(',')[0]}."]


def _answers(url: str, model) -> list[dict]:
    def ask(prompt: str) -> dict:
        body = {"model": str(model), "messages": [{"role": "user", "content": prompt}], "temperature": 0, "max_tokens": 48}
        answer = httpx.post(url + "/v1/chat/completions", json=body, timeout=300)
        assert answer.status_code == 200, answer.text
        return answer.json()

    with concurrent.futures.ThreadPoolExecutor(2) as pool:  # both in the slots at once: batched with each other
        return list(pool.map(ask, PROMPTS))


def _metric(url: str, name: str) -> float:
    text = httpx.get(url + "/metrics", timeout=30).text
    found = re.search(rf"^{name} (\S+)$", text, re.M)
    return float(found.group(1)) if found else 0.0


@pytest.fixture(scope="module")
def servers(smollm2, tmp_path_factory):
    # On the CPU (as on a CPU build): there drafting turns flash attention off, so that a verified draft rounds as
    # single steps do (on a GPU llama.cpp keeps its own choice, and near-ties may differ). The plain server
    # evaluates without it too: the comparison is of drafting, not of flash attention's rounding (which moved
    # log-probabilities by up to 0.08 on an AMD EPYC, and may flip a near-tie on another CPU).
    plain = start_server(smollm2, tmp_path_factory.mktemp("plain"), "--parallel", "2", "--ctx", "1024", "--gpu-layers", "0",
                         "--no-flash-attn")
    lookup = start_server(smollm2, tmp_path_factory.mktemp("lookup"), "--parallel", "2", "--ctx", "1024", "--draft", "lookup",
                          "--gpu-layers", "0")
    yield plain, lookup
    assert plain.stop() == 130 and lookup.stop() == 130


def test_lookup_in_slots_answers_as_plain_decoding_with_drafts_accepted(servers, smollm2):
    plain, lookup = servers
    theirs = [a["choices"][0]["message"]["content"] for a in _answers(plain.url, smollm2)]
    ours = [a["choices"][0]["message"]["content"] for a in _answers(lookup.url, smollm2)]
    assert ours == theirs and all(ours)
    drafted = _settled(lookup.url)
    accepted = _metric(lookup.url, "localrun_draft_accepted_tokens_total")
    assert drafted > 0 and 0 < accepted <= drafted, (drafted, accepted)
    assert _metric(plain.url, "localrun_draft_tokens_total") == 0


def test_a_request_for_logprobs_decodes_plainly_with_the_same_tokens(servers, smollm2):
    body = {"model": str(smollm2), "messages": [{"role": "user", "content": PROMPTS[0]}], "temperature": 0, "max_tokens": 16,
            "logprobs": True, "top_logprobs": 2}
    a, b = (httpx.post(s.url + "/v1/chat/completions", json=body, timeout=300).json() for s in servers)
    theirs, ours = (x["choices"][0]["logprobs"]["content"] for x in (a, b))
    assert [t["token"] for t in ours] == [t["token"] for t in theirs] and ours
    # Both evaluate without flash attention, one token a step: the same log-probabilities, to print's rounding.
    assert all(abs(o["logprob"] - t["logprob"]) < 1e-4 for o, t in zip(ours, theirs)), (ours, theirs)


def _settled(url: str) -> float:
    """The drafted-token count once two reads 0.2 s apart agree."""
    def steady():
        first = _metric(url, "localrun_draft_tokens_total")
        time.sleep(0.2)
        return (first,) if _metric(url, "localrun_draft_tokens_total") == first else None

    return wait_until(steady, what="the draft count to settle")[0]


def _ask(url: str, model, **extra) -> dict:
    body = {"model": str(model), "messages": [{"role": "user", "content": PROMPTS[0]}], "temperature": 0, "max_tokens": 40, **extra}
    answer = httpx.post(url + "/v1/chat/completions", json=body, timeout=300)
    assert answer.status_code == 200, answer.text
    return answer.json()


def test_each_request_may_cap_or_turn_off_its_drafts(servers, smollm2):
    """draft_max per request (llama-server's speculative.n_max is read as it; Ollama's options.draft_max): 0 decodes
    plainly, 1 drafts at most one token a step, none the model's own cap; the answer is the same each way."""
    _, lookup = servers
    free = _ask(lookup.url, smollm2)
    text, steps, tokens = free["choices"][0]["message"]["content"], free["timings"]["steps"], free["usage"]["completion_tokens"]
    assert free["timings"]["draft_n_accepted"] > 0 and tokens > 2 * steps, free["timings"]  # long drafts kept

    for extra in ({"draft_max": 1}, {"speculative.n_max": 1}):
        one = _ask(lookup.url, smollm2, **extra)
        assert one["choices"][0]["message"]["content"] == text
        assert 0 < one["timings"]["draft_n"] <= one["timings"]["steps"] and one["usage"]["completion_tokens"] <= 2 * one["timings"]["steps"]
    assert _ask(lookup.url, smollm2, **{"speculative.n_max": 1000})["timings"]["steps"] == steps  # llama-server's any count

    before = _settled(lookup.url)  # (an answer is counted just after it is sent)
    for extra in ({"draft_max": 0}, {"speculative.n_max": 0}):
        off = _ask(lookup.url, smollm2, **extra)
        assert off["choices"][0]["message"]["content"] == text and "draft_n" not in off["timings"], (extra, off["timings"])
    ollama = httpx.post(lookup.url + "/api/chat", timeout=300, json={
        "model": str(smollm2), "messages": [{"role": "user", "content": PROMPTS[0]}], "stream": False,
        "options": {"temperature": 0, "num_predict": 40, "draft_max": 0}})
    assert ollama.status_code == 200 and ollama.json()["message"]["content"] == text, ollama.text
    messages = httpx.post(lookup.url + "/v1/messages", timeout=300, json={
        "model": str(smollm2), "max_tokens": 40, "temperature": 0, "draft_max": 0, "messages": [{"role": "user", "content": PROMPTS[0]}]})
    assert messages.status_code == 200 and messages.json()["content"][0]["text"] == text, messages.text
    responses = httpx.post(lookup.url + "/v1/responses", timeout=300, json={
        "model": str(smollm2), "max_output_tokens": 40, "temperature": 0, "draft_max": 0, "input": PROMPTS[0]})
    assert responses.status_code == 200, responses.text
    assert _settled(lookup.url) == before  # none of the five drafted

    for field in ("draft_max", "speculative.n_max"):  # named as the client wrote it
        bad = httpx.post(lookup.url + "/v1/chat/completions", timeout=60, json={
            "model": str(smollm2), "messages": [{"role": "user", "content": "hi"}], field: -1})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == field, bad.text
    bad = httpx.post(lookup.url + "/v1/messages", timeout=60, json={
        "model": str(smollm2), "max_tokens": 8, "draft_max": "all", "messages": [{"role": "user", "content": "hi"}]})
    assert bad.status_code == 400 and bad.json()["type"] == "error" and "draft_max" in bad.json()["error"]["message"], bad.text
