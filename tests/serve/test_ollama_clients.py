"""What clients written for Ollama (Open WebUI, the AI SDK's ollama provider, aider, Codex) send and expect,
against a real `localrun serve` with the real SmolLM2 (issue 32): options and fields Ollama does not know
are ignored and logged, those that map are honoured; a final assistant message is continued; /api/ps's
expires_at is always a date; one access-log line per request; one name per model, also after a reload; a
conversation over the context keeps its newest messages on /api/chat and is a 400 on /v1 (counted on the tiny
model of tests/tinymodel.py, SmolLM2's tokenizer and template on random weights: its tokens, not its words)."""

from __future__ import annotations

import re
from datetime import datetime

import httpx
import ollama
import openai
import pytest

from conftest import start_server, wait_until

pytestmark = pytest.mark.slow

COUNT = [{"role": "user", "content": "Count from 1 to 20, separated by commas."},
         {"role": "assistant", "content": "1, 2, 3, 4, 5, 6,"}]
HI = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def served(smollm2, tmp_path_factory):
    """One server for the tests that leave it as they found it (a server's start for each test was most of this
    module's time)."""
    with start_server(smollm2, tmp_path_factory.mktemp("ollama-clients") / "home", "--parallel", "2", "--ctx", "512") as srv:
        yield srv


@pytest.fixture
def fresh(smollm2, tmp_path):
    """A server of its own, for a test that needs one untouched (its access log, its prompt cache, its loaded
    models) or changes what it serves (a reload with another num_ctx)."""
    with start_server(smollm2, tmp_path / "home", "--parallel", "2", "--ctx", "512") as srv:
        yield srv


def log(srv) -> str:
    return "".join(srv.stderr)


def test_unknown_options_and_fields_are_ignored_and_logged_known_ones_honoured(served, smollm2):
    c = ollama.Client(host=served.url)
    name = smollm2.name
    greedy = c.chat(model=name, messages=HI, options={"temperature": 0, "num_predict": 8})
    # Open WebUI's Reasoning Effort and logit_bias land in options: ignored, as Ollama ignores them
    r = c.chat(model=name, messages=HI, options={"temperature": 0, "num_predict": 8, "reasoning_effort": "low",
                                                  "logit_bias": '{"100": -100}'})
    assert r.message.content == greedy.message.content
    wait_until(lambda: "'reasoning_effort'" in log(served) and "'logit_bias'" in log(served), what="the ignored options logged")
    # the AI SDK's provider: sampling at the top level, taken as the options they name; an unknown field ignored
    top = httpx.post(served.url + "/api/chat", timeout=120, json={
        "model": name, "messages": HI, "stream": False, "temperature": 0, "top_p": 1, "max_output_tokens": 3,
        "tool_choice": "auto", "providerOptions": {}})
    assert top.status_code == 200, top.text
    assert top.json()["eval_count"] == 3 and greedy.message.content.startswith(top.json()["message"]["content"])
    wait_until(lambda: "'providerOptions'" in log(served), what="the ignored field logged")
    # a known option or field of the wrong type is still refused, naming it
    bad = httpx.post(served.url + "/api/chat", json={"model": name, "messages": HI, "options": {"temperature": "hot"}})
    assert bad.status_code == 400 and "temperature" in bad.json()["error"]
    bad = httpx.post(served.url + "/api/chat", json={"model": name, "messages": HI, "temperature": "hot"})
    assert bad.status_code == 400 and "temperature" in bad.json()["error"]
    # /api/generate and /api/embed ignore them alike
    g = httpx.post(served.url + "/api/generate", timeout=120, json={"model": name, "prompt": "Hi", "stream": False, "foo": 1,
                                                                    "options": {"num_predict": 2, "reasoning_effort": "low"}})
    assert g.status_code == 200, g.text

    # Ollama's version, so that clients checking it go on (Codex wants 0.13.4 or newer), and localrun's own
    version = httpx.get(served.url + "/api/version").json()
    assert tuple(int(p) for p in version["version"].split(".")) >= (0, 13, 4)
    from localrun import __version__

    assert version["localrun_version"] == __version__


def test_v1_takes_ollama_and_llama_server_parameters(fresh, smollm2):
    client = fresh.client()
    name = smollm2.name
    # Open WebUI's OpenAI connection puts its Advanced Params at the top level
    r = client.chat.completions.create(model=name, messages=HI, temperature=0, max_tokens=40,
                                       extra_body={"tfs_z": 1, "top_k": 1, "mirostat": 0, "num_predict": 3, "cache_prompt": True})
    assert r.choices[0].message.content and r.usage.completion_tokens <= 40
    # num_ctx means what it means on /api: the model is loaded with it (reloaded here)
    r = client.chat.completions.create(model=name, messages=HI, max_tokens=2, extra_body={"num_ctx": 256})
    assert r.choices[0].finish_reason == "length"
    [loaded] = httpx.get(fresh.url + "/api/ps").json()["models"]
    assert loaded["context_length"] == 256
    # num_predict alone is the length
    r = client.chat.completions.create(model=name, messages=HI, temperature=0, extra_body={"num_predict": 3, "num_ctx": 256})
    assert r.usage.completion_tokens == 3
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=name, messages=HI, extra_body={"top_k": "many"})
    assert "top_k" in str(caught.value)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=name, messages=HI, extra_body={"num_ctx": "big"})
    with pytest.raises(openai.BadRequestError):  # what OpenAI's API does not know, and neither do they, is still refused
        client.chat.completions.create(model=name, messages=HI, extra_body={"no_such_field": 1})


def test_a_final_assistant_message_is_continued(served, smollm2):
    name = smollm2.name
    c = ollama.Client(host=served.url)
    r = c.chat(model=name, messages=COUNT, options={"temperature": 0, "num_predict": 12})
    assert r.message.content.startswith(" 7, 8"), r.message.content
    streamed = "".join(p.message.content for p in c.chat(model=name, messages=COUNT, stream=True,
                                                         options={"temperature": 0, "num_predict": 12}))
    assert streamed == r.message.content
    v1 = served.client().chat.completions.create(model=name, messages=COUNT, temperature=0, max_tokens=12)
    assert v1.choices[0].message.content == r.message.content
    # the same conversation ending with the user's message is a new answer, which starts at 1
    fresh = c.chat(model=name, messages=COUNT[:1], options={"temperature": 0, "num_predict": 12})
    assert fresh.message.content.lstrip().startswith("1")


def test_ps_expires_at_is_always_a_date(served, smollm2, gemma):
    c = httpx.Client(base_url=served.url, timeout=120)

    def expiry(name: str) -> datetime:
        [m] = [m for m in c.get("/api/ps").json()["models"] if m["name"] == name]
        return datetime.fromisoformat(m["expires_at"])

    far = datetime.now().astimezone().replace(year=datetime.now().year + 100)
    assert expiry(smollm2.name) > far  # the command line's model never expires: Ollama's far future
    r = c.post("/api/generate", json={"model": str(gemma), "keep_alive": -1})  # Open WebUI's preload, forever
    assert r.status_code == 200 and r.json()["done_reason"] == "load"
    assert expiry(gemma.name) > far
    try:
        r = c.post("/api/generate", json={"model": str(gemma), "keep_alive": "10m"})
        assert expiry(gemma.name) < far and expiry(gemma.name) > datetime.now().astimezone()
    finally:  # the module's server: Gemma unloaded for the tests after this one
        c.post("/api/generate", json={"model": str(gemma), "keep_alive": 0})
        wait_until(lambda: gemma.name not in [m["name"] for m in c.get("/api/ps").json()["models"]], what="Gemma to unload")


def test_one_access_log_line_per_request(fresh, smollm2, tmp_path):
    name = smollm2.name
    r = httpx.post(fresh.url + "/api/chat", timeout=120, json={"model": name, "messages": HI, "stream": False,
                                                                "options": {"num_predict": 3}})
    assert r.status_code == 200
    httpx.post(fresh.url + "/v1/chat/completions", timeout=120, json={"model": name, "messages": HI, "max_tokens": 2,
                                                                       "stream": True}).read()
    assert httpx.post(fresh.url + "/api/chat", json={"model": "no-such-model", "messages": HI}).status_code == 404
    missing = httpx.post(fresh.url + "/api/push", json={"model": "x"})  # Ollama's push: nowhere to push to here
    assert missing.status_code == 404 and isinstance(missing.json()["error"], str)  # Ollama's error shape under /api
    prompt = r.json()["prompt_eval_count"]
    wait_until(lambda: len(re.findall(r"^\[access\]", log(fresh), re.M)) >= 4, what="four access lines")
    lines = [line for line in log(fresh).splitlines() if line.startswith("[access]")]
    # the prompt's tokens (those from a cache: the second request's prefix is the first's), the answer's, the time to the first
    assert re.search(rf"\| 200 \| .*POST /api/chat \| {re.escape(name)} \| {prompt} in \(0 cached\), 3 out, ttft \d+\.\d{{3}}s$", lines[0]), lines[0]
    assert re.search(rf"\| 200 \| .*POST /v1/chat/completions \| {re.escape(name)} \| {prompt} in \({prompt - 1} cached\), 2 out, ttft [0-9.]+s$",
                     lines[1]), lines[1]
    assert "| 404 |" in lines[2] and "POST /api/chat | no-such-model |" in lines[2]
    assert "| 404 |" in lines[3] and "POST /api/push" in lines[3]
    # A client that goes away mid-stream: its line says 499 (as /metrics counts it), not the 200 its head carried.
    with httpx.stream("POST", fresh.url + "/v1/chat/completions", timeout=120, json={
            "model": name, "messages": HI, "max_tokens": 400, "stream": True, "ignore_eos": True}) as cut:
        next(cut.iter_lines())
    wait_until(lambda: len(re.findall(r"^\[access\]", log(fresh), re.M)) >= 5, what="the cut stream's line")
    cut_line = [line for line in log(fresh).splitlines() if line.startswith("[access]")][4]
    assert "| 499 |" in cut_line and "POST /v1/chat/completions" in cut_line, cut_line

    with start_server(smollm2, tmp_path / "quiet-home", "--quiet") as quiet:
        assert httpx.post(quiet.url + "/api/chat", json={"model": name, "messages": HI, "stream": False,
                                                         "options": {"num_predict": 2}}, timeout=120).status_code == 200
        assert httpx.get(quiet.url + "/api/ps").status_code == 200
    assert "[access]" not in "".join(quiet.stderr)


def test_one_name_per_model_before_and_after_a_reload(fresh, smollm2):
    c = httpx.Client(base_url=fresh.url, timeout=120)
    [listed] = [m["id"] for m in c.get("/v1/models").json()["data"]]
    assert [m["name"] for m in c.get("/api/tags").json()["models"]] == [listed]
    assert [(m["name"], m["model"]) for m in c.get("/api/ps").json()["models"]] == [(listed, listed)]

    def works(name: str) -> None:
        r = c.post("/api/chat", json={"model": name, "messages": HI, "stream": False, "options": {"num_predict": 1}})
        assert r.status_code == 200 and r.json()["model"] == name, r.text  # the name the client used, echoed
        r = c.post("/v1/chat/completions", json={"model": name, "messages": HI, "max_tokens": 1})
        assert r.status_code == 200 and r.json()["model"] == name, r.text
        assert c.post("/api/show", json={"model": name}).status_code == 200
        assert c.get(f"/v1/models/{listed}").status_code == 200

    works(listed)
    works(str(smollm2))
    # aider sends num_ctx: the model is reloaded with it, as Ollama does, and keeps its pin and its name
    r = c.post("/api/chat", json={"model": listed, "messages": HI, "stream": False, "options": {"num_ctx": 1024, "num_predict": 1}})
    assert r.status_code == 200 and r.json()["model"] == listed
    [m] = c.get("/api/ps").json()["models"]
    assert m["name"] == listed and m["context_length"] == 1024
    assert datetime.fromisoformat(m["expires_at"]).year > datetime.now().year + 100  # still pinned: never expires
    assert [m["id"] for m in c.get("/v1/models").json()["data"]] == [listed]
    r = c.post("/v1/chat/completions", json={"model": listed, "messages": HI, "max_tokens": 1, "options": {"num_ctx": 1024}})
    assert r.status_code == 200, r.text
    works(listed)
    # a bad num_ctx is refused before anything is unloaded: the per-slot context as given, not 4096 nor 2 slots' sum
    for ctx in (0, 10):
        r = c.post("/api/chat", json={"model": listed, "messages": HI, "stream": False, "options": {"num_ctx": ctx}})
        assert r.status_code == 400 and "options.num_ctx" in r.json()["error"], r.text
    [m] = c.get("/api/ps").json()["models"]
    assert m["name"] == listed and m["context_length"] == 512


@pytest.fixture
def tiny_served(tiny_smollm2, tmp_path):
    """The tiny model (tests/tinymodel.py: SmolLM2's tokenizer and chat template on random weights) served as
    `served` serves SmolLM2, for a test that counts a prompt's tokens and never reads the words: the prompts of
    hundreds of tokens it sends are evaluated in a fraction of SmolLM2's time."""
    with start_server(tiny_smollm2, tmp_path / "tiny-home", "--parallel", "2", "--ctx", "512") as srv:
        yield srv


def test_a_conversation_over_the_context_keeps_its_newest_messages_on_api_chat(tiny_served, tiny_smollm2):
    served, name = tiny_served, tiny_smollm2.name
    story = "Once upon a time a small dragon lived in a cave by the sea, and every morning it counted the waves. " * 6
    conversation = [{"role": "system", "content": "You are a pirate."}]
    for i in range(6):
        conversation += [{"role": "user", "content": f"Tell me story number {i}."}, {"role": "assistant", "content": story}]
    conversation.append({"role": "user", "content": "What is the capital of France?"})
    c = httpx.Client(base_url=served.url, timeout=120)
    r = c.post("/api/chat", json={"model": name, "messages": conversation, "stream": False, "options": {"num_predict": 4}})
    assert r.status_code == 200, r.text
    used = r.json()["prompt_eval_count"]
    assert used < 512
    wait_until(lambda: "oldest" in log(served) and "messages were left out" in log(served), what="the notice")
    # what was kept: the system prompt and the newest messages, from a user's turn on (prompt_eval_count says so)
    # (a shorter conversation counts fewer tokens; a longer one is cut to the same)
    # (the largest such start, found from the shortest conversation up: each one asked is short)
    start = next(k for k in range(len(conversation) - 1, 0, -1) if _count(c, name, [conversation[0], *conversation[k:]]) == used)
    assert start > 1 and conversation[start]["role"] == "user"
    # the newest message alone over the context: its start cut, as Ollama's truncate (true by default) does (it was
    # a 400: found by a helper), on generate too; with truncate false, a 400 naming both numbers and the option
    alone = c.post("/api/chat", json={"model": name, "messages": [{"role": "user", "content": story * 4}], "stream": False,
                                      "options": {"num_predict": 4}})
    assert alone.status_code == 200 and 400 < alone.json()["prompt_eval_count"] < 512, alone.text
    generated = c.post("/api/generate", json={"model": name, "prompt": story * 4, "stream": False, "options": {"num_predict": 4}})
    assert generated.status_code == 200 and 400 < generated.json()["prompt_eval_count"] < 512, generated.text
    for path, body in (("/api/chat", {"messages": [{"role": "user", "content": story * 4}]}), ("/api/generate", {"prompt": story * 4})):
        refused = c.post(path, json={"model": name, **body, "stream": False, "truncate": False})
        assert refused.status_code == 400 and "maximum context length is 512 tokens" in refused.json()["error"], refused.text
        assert "options.num_ctx" in refused.json()["error"]
    # OpenAI's API (and llama-server) refuse it: a 400 naming both numbers
    v1 = c.post("/v1/chat/completions", json={"model": name, "messages": conversation, "max_tokens": 4})
    assert v1.status_code == 400 and v1.json()["error"]["code"] == "context_length_exceeded"


def _count(c: httpx.Client, name: str, messages: list) -> int:
    r = c.post("/api/chat", json={"model": name, "messages": messages, "stream": False, "options": {"num_predict": 1}})
    assert r.status_code == 200, r.text
    return r.json()["prompt_eval_count"]


def test_an_ejected_command_line_model_answers_again_by_its_name_pinned(served, smollm2):
    """Open WebUI's Eject (generate with keep_alive 0 and no prompt) unloads the model the server was started
    with; the name it was listed by loads it again, pinned as it was (found by a real Open WebUI session)."""
    name = smollm2.name
    ejected = httpx.post(served.url + "/api/generate", json={"model": name, "keep_alive": 0, "prompt": ""}, timeout=120)
    assert ejected.status_code == 200 and ejected.json()["done_reason"] == "unload"
    wait_until(lambda: not httpx.get(served.url + "/api/ps").json()["models"], what="the model unloaded")
    # Still the server's model: still listed (Open WebUI's model list is /api/tags), by the same name.
    assert [m["name"] for m in httpx.get(served.url + "/api/tags").json()["models"]] == [name]
    assert [m["id"] for m in httpx.get(served.url + "/v1/models").json()["data"]] == [name]
    again = httpx.post(served.url + "/api/chat", timeout=120, json={"model": name, "messages": HI, "stream": False,
                                                                    "options": {"num_predict": 2}})
    assert again.status_code == 200, again.text
    (loaded,) = httpx.get(served.url + "/api/ps").json()["models"]
    assert loaded["name"] == name and loaded["keep_alive"] is None  # None: never expires (pinned again)
