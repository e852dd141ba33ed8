"""Prompt-lookup speculation in the server's slots (`serve --draft lookup`): with the real SmolLM2, two
concurrent greedy requests that copy text from their prompts answer token for token what a plain server
answers, while drafts are proposed and accepted (the server's /metrics counts them); a request that asks
for log-probabilities still gets them (it decodes plainly)."""

from __future__ import annotations

import concurrent.futures
import re

import httpx
import pytest

from conftest import start_server

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
    plain = start_server(smollm2, tmp_path_factory.mktemp("plain"), "--parallel", "2", "--ctx", "1024")
    lookup = start_server(smollm2, tmp_path_factory.mktemp("lookup"), "--parallel", "2", "--ctx", "1024", "--draft", "lookup")
    yield plain, lookup
    assert plain.stop() == 130 and lookup.stop() == 130


def test_lookup_in_slots_answers_as_plain_decoding_with_drafts_accepted(servers, smollm2):
    plain, lookup = servers
    theirs = [a["choices"][0]["message"]["content"] for a in _answers(plain.url, smollm2)]
    ours = [a["choices"][0]["message"]["content"] for a in _answers(lookup.url, smollm2)]
    assert ours == theirs and all(ours)
    drafted = _metric(lookup.url, "localrun_draft_tokens_total")
    accepted = _metric(lookup.url, "localrun_draft_accepted_tokens_total")
    assert drafted > 0 and 0 < accepted <= drafted, (drafted, accepted)
    assert _metric(plain.url, "localrun_draft_tokens_total") == 0


def test_a_request_for_logprobs_decodes_plainly_with_the_same_tokens(servers, smollm2):
    body = {"model": str(smollm2), "messages": [{"role": "user", "content": PROMPTS[0]}], "temperature": 0, "max_tokens": 16,
            "logprobs": True, "top_logprobs": 2}
    a, b = (httpx.post(s.url + "/v1/chat/completions", json=body, timeout=300).json() for s in servers)
    theirs, ours = (x["choices"][0]["logprobs"]["content"] for x in (a, b))
    assert [t["token"] for t in ours] == [t["token"] for t in theirs] and ours
    # The lookup server evaluates without flash attention (a verified draft must round as single steps do),
    # the plain one with it: the same tokens, log-probabilities equal to rounding.
    assert all(abs(o["logprob"] - t["logprob"]) < 0.02 for o, t in zip(ours, theirs)), (ours, theirs)
