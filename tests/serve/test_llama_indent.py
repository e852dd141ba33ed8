"""/completion's `n_indent` (llama.vim's, and /infill's) counts the answer up to its cut: tokens_predicted, the tokens
returned (return_tokens) and their probabilities (n_probs) are those of the text up to the line indented less, not
what the model made in the step or more before it stopped. A real `localrun serve` with the real SmolLM2, on loopback."""

from __future__ import annotations

import json

import httpx
import pytest

from conftest import start_server

pytestmark = pytest.mark.slow
CODE = "def add(a, b):\n    \"\"\"Add two numbers.\"\"\"\n    return a + b\n\n\ndef sub(a, b):\n    \"\"\"Subtract"
BODY = {"prompt": CODE, "n_predict": 60, "temperature": 0, "return_tokens": True, "n_probs": 1}


@pytest.fixture(scope="module")
def server(smollm2, tmp_path_factory):
    with start_server(smollm2, tmp_path_factory.mktemp("home"), "--ctx", "1024", "--parallel", "1") as srv:
        yield srv


def post(url: str, path: str, body: dict) -> dict:
    r = httpx.post(url + path, json=body, timeout=300)
    assert r.status_code == 200, r.text
    return r.json()


def text_of(url: str, tokens: list[int]) -> str:
    return post(url, "/detokenize", {"tokens": tokens})["content"]


def test_an_answer_cut_by_n_indent_counts_the_tokens_up_to_the_cut(server):
    free = post(server.url, "/completion", BODY)
    cut = post(server.url, "/completion", {**BODY, "n_indent": 4})
    assert cut["stop_type"] == "limit" and len(cut["content"]) < len(free["content"]), (free["content"], cut["content"])
    n = cut["tokens_predicted"]
    assert cut["tokens"] == free["tokens"][:n] and len(cut["completion_probabilities"]) == n
    # the fewest tokens that make the text up to the cut: the last of them holds it
    assert text_of(server.url, cut["tokens"]).startswith(cut["content"])
    assert not text_of(server.url, cut["tokens"][:-1]).startswith(cut["content"])


def test_a_streamed_answer_cut_by_n_indent_counts_the_tokens_up_to_the_cut(server):
    whole = post(server.url, "/completion", {**BODY, "n_indent": 4})
    events = []
    with httpx.stream("POST", server.url + "/completion", json={**BODY, "n_indent": 4, "stream": True}, timeout=300) as r:
        assert r.status_code == 200
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
    pieces, last = events[:-1], events[-1]
    assert last["stop_type"] == "limit" and "".join(e["content"] for e in pieces) == whole["content"]
    tokens = [t for e in pieces for t in e["tokens"]]
    assert tokens == whole["tokens"] and last["tokens_predicted"] == len(tokens) == pieces[-1]["tokens_predicted"]
    assert sum(len(e.get("completion_probabilities", [])) for e in pieces) == len(tokens)
