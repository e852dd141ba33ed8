"""llama-server's own endpoints on `localrun serve` (SmolLM2 through real llama.cpp, on loopback), so that tools
written for llama-server find them: /tokenize, /detokenize, /apply-template, /props, /completion (whole and streamed,
with its field names), /infill, its unprefixed OpenAI paths, /health and /v1/health, OpenAI's system_fingerprint.
Where llama-server is built (scripts/build_llama_bench.sh), the same requests are asked of it on the same GGUF and
the answers compared field for field."""

from __future__ import annotations

import json

import httpx
import pytest

from conftest import start_server, wait_until
from llamaserver import LLAMA_SERVER, NO_LLAMA_SERVER, llama_server

openai = pytest.importorskip("openai")

pytestmark = pytest.mark.slow
SMOL = "SmolLM2-135M-Instruct.Q4_1.gguf"
PROMPT = "The capital of France is"
needs_llama_server = pytest.mark.skipif(LLAMA_SERVER is None, reason=NO_LLAMA_SERVER)


@pytest.fixture(scope="module")
def server(smollm2, tmp_path_factory):
    with start_server(smollm2, tmp_path_factory.mktemp("home"), "--parallel", "2", "--ctx", "1024") as srv:
        yield srv


@pytest.fixture(scope="module")
def theirs(smollm2):
    """llama-server on the same GGUF, two slots of 1024 tokens as the server above."""
    if LLAMA_SERVER is None:
        pytest.skip(NO_LLAMA_SERVER)
    with llama_server(smollm2, "-c", "2048", "-np", "2") as http:
        yield http


def ask(server, path: str, body=None, status: int = 200):
    r = httpx.post(server.url + path, json=body, timeout=300) if body is not None else httpx.get(server.url + path, timeout=300)
    assert r.status_code == status, r.text
    return r.json()


TOKENIZE = [
    {"content": "Hello world <|im_start|>", "with_pieces": True},
    {"content": "é中 naïve 🙂", "with_pieces": True},  # pieces that are not whole UTF-8: their bytes
    {"content": "<|im_end|>x", "parse_special": False, "with_pieces": True},
    {"content": "Hi", "add_special": True},
    {"content": ["Hi", 1, " there"]},  # token ids and text mixed
    {},
]
CONVERSATIONS = [
    [{"role": "user", "content": "Hi"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."},
     {"role": "user", "content": "Bye"}],
]


def test_tokenize_detokenize_and_apply_template(server):
    """Pieces that join to the text, ids that detokenize back to it, special markers read or not as asked, the
    template rendered with the model's default system prompt where the conversation has none."""
    pieces = ask(server, "/tokenize", TOKENIZE[0])["tokens"]
    assert "".join(p["piece"] for p in pieces) == "Hello world <|im_start|>"
    assert pieces[-1]["piece"] == "<|im_start|>"
    ids = [p["id"] for p in pieces]
    assert ask(server, "/tokenize", {"content": "Hello world <|im_start|>"}) == {"tokens": ids}
    assert ask(server, "/detokenize", {"tokens": ids}) == {"content": "Hello world <|im_start|>"}
    assert len(ask(server, "/tokenize", {"content": "<|im_start|>", "parse_special": False})["tokens"]) > 1
    prompt = ask(server, "/apply-template", {"messages": CONVERSATIONS[0]})["prompt"]
    assert prompt.startswith("<|im_start|>system\n") and prompt.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    closed = ask(server, "/apply-template", {"messages": CONVERSATIONS[0], "add_generation_prompt": False})["prompt"]
    assert closed == prompt.removesuffix("<|im_start|>assistant\n")
    bad = ask(server, "/detokenize", {"tokens": [1, 10**7]}, status=400)
    assert bad["error"]["code"] == 400 and bad["error"]["type"] == "invalid_request_error" and "10000000" in bad["error"]["message"]


@needs_llama_server
def test_tokenize_detokenize_apply_template_and_props_are_llama_servers(server, theirs):
    for body in TOKENIZE:
        assert ask(server, "/tokenize", body) == theirs.post("/tokenize", json=body).json(), body
    ids = [t for body in TOKENIZE[:3] for t in ask(server, "/tokenize", {"content": body["content"]})["tokens"]]
    assert ask(server, "/detokenize", {"tokens": ids}) == theirs.post("/detokenize", json={"tokens": ids}).json()
    for body in [{"messages": messages} for messages in CONVERSATIONS] + [{"messages": CONVERSATIONS[1], "add_generation_prompt": False}]:
        assert ask(server, "/apply-template", body) == theirs.post("/apply-template", json=body).json(), body
    ours, their = ask(server, "/props"), theirs.get("/props").json()
    for name in ("chat_template", "bos_token", "eos_token", "total_slots"):
        assert ours[name] == their[name], name
    assert ours["default_generation_settings"]["n_ctx"] == their["default_generation_settings"]["n_ctx"] == 1024
    ours_slots, their_slots = ask(server, "/slots"), theirs.get("/slots").json()
    assert [{k: s[k] for k in ("id", "n_ctx", "is_processing")} for s in ours_slots] == \
        [{k: s[k] for k in ("id", "n_ctx", "is_processing")} for s in their_slots] == [{"id": i, "n_ctx": 1024, "is_processing": False} for i in (0, 1)]
    params, their_params = ours["default_generation_settings"]["params"], their["default_generation_settings"]["params"]
    for name in ("temperature", "top_k", "top_p", "min_p", "repeat_penalty", "n_predict", "seed"):  # the same defaults
        assert params[name] == pytest.approx(their_params[name] if name != "seed" else -1), name


def _streamed(url: str, body: dict) -> list[dict]:
    with httpx.stream("POST", url + "/completion", json={**body, "stream": True}, timeout=300) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        return [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]


def test_completion_whole_and_streamed_in_llama_servers_fields(server):
    body = {"prompt": PROMPT, "n_predict": 8, "temperature": 0, "return_tokens": True}
    whole = ask(server, "/completion", body)
    assert whole["content"] and len(whole["tokens"]) == whole["tokens_predicted"] == 8
    assert whole["stop"] is True and whole["stop_type"] == "limit" and whole["stopping_word"] == ""
    assert whole["tokens_evaluated"] == len(ask(server, "/tokenize", {"content": PROMPT, "add_special": True})["tokens"])
    assert whole["generation_settings"]["n_predict"] == 8 and whole["generation_settings"]["temperature"] == 0
    assert whole["timings"]["predicted_n"] == 8 and whole["timings"]["prompt_n"] + whole["timings"]["cache_n"] == whole["tokens_evaluated"]
    assert ask(server, "/detokenize", {"tokens": whole["tokens"]})["content"] == whole["content"]
    events = _streamed(server.url, body)
    pieces, last = events[:-1], events[-1]
    assert all(e["stop"] is False and e["tokens"] for e in pieces) and last["stop"] is True
    assert "".join(e["content"] for e in pieces) == whole["content"]
    assert [t for e in pieces for t in e["tokens"]] == whole["tokens"]
    assert last["content"] == "" and last["stop_type"] == "limit" and last["tokens_predicted"] == 8
    # a stop word: stop_type "word" and the word; /completions is llama-server's name for the same
    word = whole["content"].split()[0]
    stopped = ask(server, "/completions", {**body, "stop": [word]})
    assert stopped["stop_type"] == "word" and stopped["stopping_word"] == word and word not in stopped["content"]
    only = ask(server, "/completion", {**body, "response_fields": ["content", "generation_settings/n_predict"]})
    assert only == {"content": whole["content"], "generation_settings/n_predict": 8}
    refused = ask(server, "/completion", {"n_predict": 4}, status=400)
    assert refused["error"]["type"] == "invalid_request_error" and "prompt" in refused["error"]["message"]


@needs_llama_server
def test_completion_is_llama_servers_field_for_field(server, theirs):
    """The same greedy answer, token for token, with the same fields, whole and streamed, and a stop word alike."""
    for body in ({"prompt": PROMPT, "n_predict": 8, "temperature": 0, "return_tokens": True},
                 {"prompt": PROMPT, "n_predict": 16, "temperature": 0, "stop": ["."], "return_tokens": True}):
        ours, their = ask(server, "/completion", body), theirs.post("/completion", json=body).json()
        assert set(ours) == set(their)
        assert set(ours["generation_settings"]) <= set(their["generation_settings"])
        assert set(ours["timings"]) == set(their["timings"])
        for name in ("content", "tokens", "stop", "stop_type", "stopping_word", "tokens_predicted", "tokens_evaluated",
                     "tokens_cached", "prompt", "has_new_line", "truncated"):
            assert ours[name] == their[name], name
        assert ours["generation_settings"]["n_predict"] == their["generation_settings"]["n_predict"]
        streamed, their_stream = _streamed(server.url, body), _streamed(str(theirs.base_url).rstrip("/"), body)
        assert [(e["content"], e["tokens"]) for e in streamed] == [(e["content"], e["tokens"]) for e in their_stream]
        assert set(streamed[-1]) == set(their_stream[-1]) and set(streamed[0]) <= set(their_stream[0])


def test_slots_say_which_is_answering_and_a_client_that_leaves_frees_its_own(server):
    """llama-server's GET /slots, as its test_cancel_request reads it: a slot answering while a long answer streams,
    free again once its client has gone away."""
    body = {"prompt": PROMPT, "n_predict": 900, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", server.url + "/completion", json=body, timeout=300) as r:
        lines = r.iter_lines()  # (kept: a line iterator let go closes the response)
        assert next(line for line in lines if line.startswith("data: "))
        assert [s["is_processing"] for s in ask(server, "/slots")].count(True) == 1
    wait_until(lambda: not any(s["is_processing"] for s in ask(server, "/slots")), timeout=120, what="the slot freed")


def test_infill_on_a_model_without_fim_tokens_names_why(server, smollm2):
    refused = ask(server, "/infill", {"input_prefix": "def add(a, b):\n    ", "input_suffix": "\n", "n_predict": 4}, status=501)
    assert refused["error"]["type"] == "not_supported_error"
    assert SMOL in refused["error"]["message"] and "fill-in-the-middle" in refused["error"]["message"]
    missing = ask(server, "/infill", {"input_prefix": "x"}, status=400)
    assert "input_suffix" in missing["error"]["message"]


def test_openai_answers_carry_a_fingerprint_and_llama_servers_unprefixed_paths_answer(server):
    client = openai.OpenAI(base_url=server.url, api_key="none", max_retries=0, timeout=300)  # /chat/completions, /models...
    assert [m.id for m in client.models.list().data] == [SMOL]
    messages = [{"role": "user", "content": "Hi"}]
    chat = client.chat.completions.create(model=SMOL, messages=messages, max_tokens=4, temperature=0)
    assert chat.system_fingerprint and chat.choices[0].message.content
    chunks = list(client.chat.completions.create(model=SMOL, messages=messages, max_tokens=4, temperature=0, stream=True))
    assert {c.system_fingerprint for c in chunks} == {chat.system_fingerprint}
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == chat.choices[0].message.content
    v1 = server.client().completions.create(model=SMOL, prompt=PROMPT, max_tokens=4, temperature=0)
    assert v1.system_fingerprint == chat.system_fingerprint
    assert len(client.embeddings.create(model=SMOL, input="hello").data[0].embedding) == 576  # SmolLM2-135M's width
    for path in ("/health", "/v1/health"):
        assert ask(server, path)["status"] == "ok"


@needs_llama_server
def test_infill_is_llama_servers_on_a_code_model(qwen, tmp_path):
    """Qwen2.5-Coder's FIM tokens, repo-level with an extra file as llama.vim sends it: the same prompt and the same
    greedy answer as llama-server's /infill. llama-server sizes the prompt's parts by its batch (prefix 3/4 of it,
    suffix 1/4) and gives the extra files what the slot has left after a batch and twice the answer's length, which it
    reads from its own -n, not the request's: it runs with localrun's batch (512) and -n as the request's n_predict
    (with its defaults, -b 2048 in a 2048-token slot, it keeps 2 tokens of the extra files). One short case: the
    model is slow on a small machine."""
    body = {"input_prefix": "def add(a, b):\n    ", "input_suffix": "\n\nprint(add(1, 2))\n", "n_predict": 6, "temperature": 0,
            "input_extra": [{"filename": "util.py", "text": "def sub(a, b):\n    return a - b\n"}], "return_tokens": True}
    with start_server(qwen, tmp_path / "home", "--parallel", "1", "--ctx", "2048", threads=2) as srv:
        ours = ask(srv, "/infill", body)
    with llama_server(qwen, "-c", "2048", "-np", "1", "-b", "512", "-n", "6") as http:
        their = http.post("/infill", json=body).json()
    assert ours["prompt"].startswith("<|repo_name|>myproject\n<|file_sep|>util.py\ndef sub(a, b):")
    for name in ("prompt", "tokens_evaluated", "content", "tokens", "tokens_predicted", "stop_type"):
        assert ours[name] == their[name], name
