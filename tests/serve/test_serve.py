"""`localrun serve` end to end: the real `openai` client against a server this test starts on loopback,
serving the real SmolLM2 through real llama.cpp."""

from __future__ import annotations

import json
import re
import signal
import threading
import time

import httpx
import jsonschema
import pytest

from conftest import LOCALRUN, SERVE_KEY, Server, last_json, run_cli, start_server, wait_until  # noqa: F401 - Server for annotations

openai = pytest.importorskip("openai")

pytestmark = pytest.mark.slow
KEY = SERVE_KEY
SMOL = "SmolLM2-135M-Instruct.Q4_1.gguf"  # the name the server gives a model loaded by path


@pytest.fixture(scope="module")
def server(smollm2, tmp_path_factory):
    with start_server(smollm2, tmp_path_factory.mktemp("home"), "--parallel", "8", "--ctx", "1024", "--api-key", KEY) as srv:
        yield srv


def complete(client, prompt: str, model: str = SMOL, **kw):
    return client.completions.create(model=model, prompt=prompt, temperature=0, **kw)


def stream_text(client, prompt: str, **kw) -> tuple[str, str]:
    parts, finish = [], None
    for chunk in client.completions.create(model=SMOL, prompt=prompt, temperature=0, stream=True, **kw):
        if chunk.choices:
            parts.append(chunk.choices[0].text)
            finish = chunk.choices[0].finish_reason or finish
    return "".join(parts), finish


HEADERS = {"Authorization": f"Bearer {KEY}"}
IDLE = {"status": "ok", "slots_idle": 8, "slots_processing": 0, "requests_waiting": 0, "models": 1}  # the module's server, at rest


def post(server, **body) -> dict:
    """A /v1/completions request with httpx (fields the `openai` client does not know go as they are)."""
    r = httpx.post(server.url + "/v1/completions", json=body, headers=HEADERS, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def metrics(server) -> str:
    return httpx.get(server.url + "/metrics", headers=HEADERS).text


def wait_idle(server, slots: int = 8) -> dict:
    """/health once every slot is idle and nobody waits (a generous deadline: callers assert on counts)."""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        health = httpx.get(server.url + "/health").json()
        if health["slots_idle"] == slots and health["requests_waiting"] == 0:
            return health
        time.sleep(0.05)
    return httpx.get(server.url + "/health").json()


def test_models_and_health(server):
    models = server.client().models.list().data
    assert [m.id for m in models] == ["SmolLM2-135M-Instruct.Q4_1.gguf"]
    health = httpx.get(server.url + "/health").json()  # no key needed
    assert health == IDLE  # nothing has been asked yet


def test_api_key_is_enforced(server):
    with pytest.raises(openai.AuthenticationError):
        server.client(key="wrong-key").models.list()
    r = httpx.post(server.url + "/v1/completions", json={"prompt": "hi"})
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    import ollama  # Ollama's clients read {"error": "..."}: the 401 is in that shape under /api

    with pytest.raises(ollama.ResponseError) as denied:
        ollama.Client(host=server.url).chat(model=SMOL, messages=[{"role": "user", "content": "hi"}])
    assert denied.value.status_code == 401 and denied.value.error.startswith("missing or wrong API key"), denied.value


def test_chat_non_streaming_and_streaming_agree(server, smollm2, cli):
    """Both equal `localrun run` with the same system prompt (the model's chat template, greedy): text, token
    counts and finish reason."""
    client = server.client()
    messages = [{"role": "system", "content": "You are concise."}, {"role": "user", "content": "Name a primary colour."}]
    whole = client.chat.completions.create(model=SMOL, messages=messages, temperature=0, max_tokens=40)
    text = whole.choices[0].message.content
    ran = cli("run", str(smollm2), "--system", "You are concise.", "-t", "0", "-n", "40", "--no-cache", "--threads", "1",
              "--json", "Name a primary colour.")
    assert ran.returncode == 0, ran.stderr
    done = last_json(ran.stdout)
    assert done["type"] == "done"
    assert whole.choices[0].message.role == "assistant" and text == done["text"]
    assert whole.choices[0].finish_reason == {"eos": "stop", "stop": "stop", "length": "length"}[done["stats"]["finish_reason"]]
    assert whole.usage.prompt_tokens == done["stats"]["prompt_tokens"]
    assert whole.usage.completion_tokens == len(done["tokens"])
    assert whole.usage.total_tokens == whole.usage.prompt_tokens + whole.usage.completion_tokens
    chunks = list(client.chat.completions.create(
        model=SMOL, messages=messages, temperature=0, max_tokens=40, stream=True, stream_options={"include_usage": True}))
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == text
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == [whole.choices[0].finish_reason]


def test_include_usage_streams_usage_null_then_the_totals(server):
    body = {"prompt": "Hi", "max_tokens": 4, "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", server.url + "/v1/completions", json=body, headers={"Authorization": f"Bearer {KEY}"}) as r:
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    assert all("usage" in e and e["usage"] is None for e in events if e["choices"])  # OpenAI's shape
    assert events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] == 4


def test_greedy_output_equals_localrun_run(server, smollm2, cli):
    """The server's batched path decodes the same tokens as `localrun run` (one sequence, no batching)."""
    prompt = "The three most common gases in the air are"
    served = complete(server.client(), prompt, max_tokens=24).choices[0].text
    ran = cli("run", str(smollm2), "--raw", "-t", "0", "-n", "24", "--no-cache", "--threads", "1", prompt)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout == served + "\n"  # run ends the answer with a newline on stdout


def test_stop_sequence_cut_exactly(server):
    client = server.client()
    prompt = "Here is a list of fruits: apple, banana,"
    full = complete(client, prompt, max_tokens=40).choices[0].text
    words = full.split()
    assert len(words) > 4, full
    stop = " ".join(words[2:4])  # spans at least two tokens, in the middle of the text
    cut = full[: full.index(stop)]
    got = complete(client, prompt, max_tokens=40, stop=[stop, "zzzz-never"])
    assert got.choices[0].text == cut and got.choices[0].finish_reason == "stop"
    streamed, finish = stream_text(client, prompt, max_tokens=40, stop=stop)
    assert streamed == cut and finish == "stop"


def test_concurrent_requests_finish_independently_with_solo_output(server):
    """8 greedy requests together: each ends on its own (short ones first) with exactly what it gives alone.
    The evidence is the server's own: `localrun_batch_sequences` counts the sequences each decode step
    carried, so its sum is the generated tokens decoded so far (every token but a request's last)."""
    client = server.client()
    prompts = [f"Write a sentence about the number {i}." for i in range(8)]
    prompts[7] = "Summarise: " + "the cat sat on the mat and looked at the dog. " * 40  # > one prefill chunk (256)
    lengths = [4, 40, 8, 40, 16, 40, 24, 40]
    solo = [complete(client, p, max_tokens=n, extra_body={"ignore_eos": True}).choices[0].text for p, n in zip(prompts, lengths)]
    assert wait_idle(server) == IDLE
    before = metrics(server)
    decoded = lambda text: _metric(text, "localrun_batch_sequences_sum") - _metric(before, "localrun_batch_sequences_sum")  # noqa: E731
    results, used, decoded_when_done = [None] * 8, [None] * 8, [None] * 8
    barrier = threading.Barrier(8)

    def one(i):
        barrier.wait()
        parts = []
        for chunk in client.completions.create(model=SMOL, prompt=prompts[i], temperature=0, max_tokens=lengths[i],
                                               stream=True, stream_options={"include_usage": True}, extra_body={"ignore_eos": True}):
            if chunk.choices:
                parts.append(chunk.choices[0].text)
            else:
                used[i] = chunk.usage.completion_tokens
        decoded_when_done[i] = decoded(metrics(server))  # how far the whole batch had got when this one ended
        results[i] = "".join(parts)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert results == solo
    assert used == lengths
    after = metrics(server)
    # Every request decoded all its tokens but the last, and nothing more: none ran past its own end.
    total = sum(n - 1 for n in lengths)
    assert decoded(after) == total
    # The short ones ended while the long ones still had most of their tokens to decode (4 and 8 tokens
    # done before any 40), in the server's own token count.
    assert max(decoded_when_done[i] for i in (0, 2)) < min(decoded_when_done[i] for i in (1, 3, 5, 7))
    assert max(decoded_when_done) == total
    # Batched: fewer than half as many decode steps as tokens decoded (one request at a time: one step each).
    steps = _metric(after, "localrun_batch_sequences_count") - _metric(before, "localrun_batch_sequences_count")
    assert steps < total / 2, (steps, total)


def _metric(text: str, name: str, default: float | None = None) -> float:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    if default is not None:  # a labelled series appears with its first sample
        return default
    raise AssertionError(f"{name} not in metrics")


def test_shared_prefix_is_reused_across_requests(server):
    client = server.client()
    system = "You are a helpful assistant for a bakery. " * 20
    first = client.chat.completions.create(model=SMOL, temperature=0, max_tokens=4, messages=[
        {"role": "system", "content": system}, {"role": "user", "content": "Do you sell bread?"}])
    second = client.chat.completions.create(model=SMOL, temperature=0, max_tokens=4, messages=[
        {"role": "system", "content": system}, {"role": "user", "content": "When do you open?"}])
    assert first.usage.prompt_tokens > 150
    assert second.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens - 20


def test_disconnect_mid_stream_frees_the_slot(server):
    """A client that closes its stream stops the generation at once: counted in tokens the server decoded
    (/metrics), not in time. Asked for 2000 tokens (the slot's context allows ~1020, all of them with
    ignore_eos), it decodes a few more than the client read, then its slot is idle."""
    assert wait_idle(server) == IDLE
    before = metrics(server)
    body = {"prompt": "Count forever:", "max_tokens": 2000, "temperature": 0, "stream": True, "ignore_eos": True}
    with httpx.stream("POST", server.url + "/v1/completions", json=body, headers=HEADERS, timeout=60) as r:
        assert r.status_code == 200
        lines = r.iter_lines()
        got = [next(lines) for _ in range(5)]
        assert any(line.startswith("data: ") for line in got)
        assert httpx.get(server.url + "/health").json()["slots_processing"] == 1
    assert wait_idle(server) == IDLE
    after = metrics(server)
    delta = lambda name: _metric(after, name) - _metric(before, name)  # noqa: E731
    decoded = delta("localrun_batch_sequences_sum")  # this request was alone: its generated tokens decoded
    prompt = delta("localrun_batch_tokens_sum") - decoded  # the rest of what the steps evaluated
    assert prompt == 3  # "Count forever:", evaluated once
    assert 0 < decoded < 250, decoded  # of the 1024 - 3 it was allowed
    assert _metric(after, "localrun_requests_running") == 0 and _metric(after, "localrun_requests_waiting") == 0
    # The cut-off request is counted as any other (it was missing from /metrics): what it generated, and a 499.
    assert delta("localrun_generated_tokens_total") == decoded + 1  # the last sampled token was never decoded
    assert delta("localrun_prompt_tokens_total") == 3
    status = 'localrun_requests_total{endpoint="/v1/completions",status="499"}'
    assert _metric(after, status, 0.0) - _metric(before, status, 0.0) == 1
    still = complete(server.client(), "Hello", max_tokens=3, extra_body={"ignore_eos": True})  # still serving
    assert still.usage.completion_tokens == 3 and still.choices[0].finish_reason == "length"


@pytest.mark.parametrize("body, fragment", [
    (b"{not json", "malformed JSON"),
    (b"[1, 2]", "JSON object"),
    (json.dumps({"prompt": "hi", "max_tokens": 0}).encode(), "max_tokens"),
    (json.dumps({"prompt": "hi", "max_tokens": "many"}).encode(), "max_tokens"),
    (json.dumps({"prompt": "hi", "temperature": -1}).encode(), "temperature"),
    (json.dumps({"prompt": "hi", "frobnicate": True}).encode(), "frobnicate"),
    (json.dumps({"max_tokens": 3}).encode(), "prompt"),
    (json.dumps({"prompt": "hi", "stop": [""]}).encode(), "stop"),
    (json.dumps({"prompt": "word " * 1100}).encode(), "1024"),
    (json.dumps({"prompt": "hi", "response_format": {"type": "xml"}}).encode(), "response_format"),
    (json.dumps({"prompt": "hi", "logprobs": 21}).encode(), "logprobs must be 0 to 20"),
    (json.dumps({"prompt": "hi", "top_logprobs": 2}).encode(), "top_logprobs is a chat field"),
    (json.dumps({"prompt": "hi", "echo": True}).encode(), "echo"),
    (json.dumps({"prompt": "hi", "n": 17}).encode(), "'n'"),
    (json.dumps({"prompt": "hi", "Stream": True}).encode(), "unknown or unsupported field 'Stream'"),  # named as written
    (b'{"prompt": "hi", "logit_bias": {"5": Infinity}}', "Infinity is not a JSON value"),
    (b'{"prompt": "hi", "logit_bias": {"5": NaN}}', "NaN is not a JSON value"),
    (json.dumps({"prompt": "hi", "logit_bias": {"99999999": -100}}).encode(), "invalid logit_bias: token 99999999 is not this model's"),
    (json.dumps({"prompt": ["a", "b"]}).encode(), "prompt is a list of 2 prompts"),
    (json.dumps({"prompt": [[1, 2], [3]]}).encode(), "prompt is a list of 2 prompts"),
    (json.dumps({"prompt": ""}).encode(), "prompt is empty"),
    # Refused before the stream starts (it was a 200 stream ending in a server_error event: a helper's run)
    (json.dumps({"prompt": "hi", "grammar": "root ::= foo", "stream": True}).encode(), "the grammar does not parse (GBNF)"),
    (json.dumps({"prompt": "hi", "logit_bias": {"99999999": -100}, "stream": True}).encode(), "token 99999999 is not this model's"),
])
def test_bad_requests_get_400_and_the_server_keeps_serving(server, body, fragment, hi_reference):
    headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    r = httpx.post(server.url + "/v1/completions", content=body, headers=headers)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert fragment in error["message"] and error["type"] == "invalid_request_error"
    if "logit_bias" in body.decode(errors="replace") and "not a JSON value" not in fragment:  # NaN: no JSON at all
        assert error["param"] == "logit_bias"
    answer = complete(server.client(), "Hi", max_tokens=2)  # and serves exactly what `localrun run` gives
    assert (answer.choices[0].text, answer.usage.completion_tokens) == hi_reference
    if fragment.startswith("prompt is"):  # but a list of one prompt is that prompt (LangChain's OpenAI LLM sends one)
        one = complete(server.client(), ["Hi"], max_tokens=2)
        assert (one.choices[0].text, one.usage.completion_tokens) == hi_reference


@pytest.fixture(scope="module")
def hi_reference(smollm2) -> tuple[str, int]:
    """`localrun run --raw -t 0 -n 2 Hi`: its text and token count ("Hi" is one token: never a cached prefix)."""
    ran = run_cli("run", str(smollm2), "--raw", "-t", "0", "-n", "2", "--no-cache", "--threads", "1", "--json", "Hi")
    assert ran.returncode == 0, ran.stderr
    done = last_json(ran.stdout)
    return done["text"], len(done["tokens"])


def test_unknown_paths_and_methods_get_openai_style_errors(server):
    headers = {"Authorization": f"Bearer {KEY}"}
    missing = httpx.get(server.url + "/v1/nothing", headers=headers)
    assert missing.status_code == 404 and "no such endpoint" in missing.json()["error"]["message"]
    wrong = httpx.get(server.url + "/v1/completions", headers=headers)
    assert wrong.status_code == 405 and "GET is not allowed" in wrong.json()["error"]["message"]  # was plain text


def test_fields_common_clients_send_with_their_off_values_are_accepted(server):
    client = server.client()
    hi = [{"role": "user", "content": "Hi"}]
    # Warm: both answers below then reuse the same cached prefix (a warm and a cold prompt can round apart).
    client.chat.completions.create(model=SMOL, messages=hi, max_tokens=1, temperature=0)
    plain = client.chat.completions.create(model=SMOL, messages=hi, max_tokens=3, temperature=0)
    out = client.chat.completions.create(
        model=SMOL, messages=hi, max_tokens=3, temperature=0,
        n=1, logprobs=False, stream=False, tool_choice="none", parallel_tool_calls=False, user="u1", store=False,
        extra_body={"tools": []},
    )
    # They change nothing: the same text, token counts and finish as without them.
    assert out.choices[0].message.content == plain.choices[0].message.content
    assert (out.usage.prompt_tokens, out.usage.completion_tokens, out.choices[0].finish_reason) == (
        plain.usage.prompt_tokens, plain.usage.completion_tokens, plain.choices[0].finish_reason)
    # Tools offered to a template that cannot render them: answered as text (tool_choice auto), the same text.
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    offered = client.chat.completions.create(model=SMOL, messages=hi, max_tokens=3, temperature=0, tools=tools)
    assert offered.choices[0].message.content == plain.choices[0].message.content and not offered.choices[0].message.tool_calls


def test_logprobs_chat_and_completions_streamed_and_not(server):
    """Each token's logprob from the model's own distribution: under greedy the chosen token is the most
    likely one (its logprob the first of the top ones), alternatives most likely first, all <= 0 and their
    probabilities sum to at most 1; streamed and not streamed agree; tokens spell the text."""
    import math

    client = server.client()
    hi = [{"role": "user", "content": "Name a colour."}]
    whole = client.chat.completions.create(model=SMOL, messages=hi, max_tokens=8, temperature=0, logprobs=True, top_logprobs=3)
    content = whole.choices[0].logprobs.content
    assert "".join(t.token for t in content) == whole.choices[0].message.content
    assert len(content) == whole.usage.completion_tokens
    for t in content:
        assert len(t.top_logprobs) == 3 and t.top_logprobs[0].token == t.token
        assert t.logprob == pytest.approx(t.top_logprobs[0].logprob) and t.logprob <= 0
        lps = [a.logprob for a in t.top_logprobs]
        assert lps == sorted(lps, reverse=True) and sum(math.exp(x) for x in lps) <= 1 + 1e-6
        assert bytes(t.bytes).decode("utf-8", "replace") == t.token
    chunks = list(client.chat.completions.create(model=SMOL, messages=hi, max_tokens=8, temperature=0, logprobs=True,
                                                 top_logprobs=3, stream=True))
    streamed = [t for c in chunks if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.content]
    assert [(t.token, round(t.logprob, 4)) for t in streamed] == [(t.token, round(t.logprob, 4)) for t in content]
    # Cut by a stop sequence: the token that completed it is not listed, its text being cut (as llama-server's)
    at = next(i for i, t in enumerate(content) if i and t.token.strip() and t.token not in "".join(x.token for x in content[:i]))
    stopped = client.chat.completions.create(model=SMOL, messages=hi, max_tokens=8, temperature=0, logprobs=True, stop=[content[at].token])
    assert [t.token for t in stopped.choices[0].logprobs.content] == [t.token for t in content[:at]]
    plain = client.chat.completions.create(model=SMOL, messages=hi, max_tokens=8, temperature=0)
    assert plain.choices[0].logprobs is None and plain.choices[0].message.content == whole.choices[0].message.content

    legacy = client.completions.create(model=SMOL, prompt="The capital of France is", max_tokens=5, temperature=0, logprobs=2)
    lp = legacy.choices[0].logprobs
    assert "".join(lp.tokens) == legacy.choices[0].text and len(lp.token_logprobs) == len(lp.tokens) == len(lp.top_logprobs)
    assert all(max(top.values()) == pytest.approx(chosen) for top, chosen in zip(lp.top_logprobs, lp.token_logprobs))
    assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset)
    # Sampled (temperature 1.5): still the model's own distribution, so a token need not be the top one, but
    # its logprob is real and the alternatives stay the model's.
    hot = client.completions.create(model=SMOL, prompt="Once upon a time", max_tokens=12, temperature=1.5, seed=3, logprobs=1)
    assert all(x <= 0 for x in hot.choices[0].logprobs.token_logprobs)
    for body, fragment in (({"messages": hi, "top_logprobs": 2}, "needs logprobs"), ({"messages": hi, "logprobs": True, "top_logprobs": 21}, "0 to 20")):
        r = httpx.post(server.url + "/v1/chat/completions", json={"model": SMOL, **body}, headers={"Authorization": f"Bearer {KEY}"})
        assert r.status_code == 400 and fragment in r.json()["error"]["message"], r.text


def test_context_overflow_is_a_bad_request_in_the_client(server):
    """In each dialect's own words, which clients match to trim or compact (litellm's ContextWindowExceededError
    reads OpenAI's; Claude Code compacts its conversation on Anthropic's): localrun's own were neither (a helper)."""
    with pytest.raises(openai.BadRequestError) as exc:
        server.client().chat.completions.create(model=SMOL, messages=[{"role": "user", "content": "word " * 1100}])
    assert exc.value.code == "context_length_exceeded"
    assert re.match(r"This model's maximum context length is 1024 tokens .*, but the prompt is \d+ tokens", exc.value.body["message"])
    claude = httpx.post(server.url + "/v1/messages", headers={"x-api-key": KEY}, json={
        "model": SMOL, "max_tokens": 4, "messages": [{"role": "user", "content": "word " * 1100}]})
    assert claude.status_code == 400 and re.match(r"prompt is too long: \d+ tokens > 1024 maximum", claude.json()["error"]["message"])


def test_json_schema_response_format(server):
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
              "required": ["name", "age"], "additionalProperties": False}
    out = server.client().chat.completions.create(
        model=SMOL, temperature=0, max_tokens=60,
        messages=[{"role": "user", "content": "Give me a person as JSON."}],
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": schema}},
    )
    jsonschema.validate(json.loads(out.choices[0].message.content), schema)


def test_response_format_json_object(server):
    out = post(server, prompt="A JSON object describing a dog:", max_tokens=60, temperature=0,
               response_format={"type": "json_object"})
    # Greedy, this prompt alone answers with a JSON object inside a Markdown code block; the grammar makes
    # the answer the object itself, closed (finish stop) well within max_tokens.
    assert out["choices"][0]["finish_reason"] == "stop" and out["usage"]["completion_tokens"] < 60
    assert isinstance(json.loads(out["choices"][0]["text"]), dict)


def _texts(server, prompt: str, variants: list[dict], n: int) -> list[str]:
    """The answers to `prompt` with each variant's fields, after a warm-up: every answer then reuses the same
    cached prefix (its last prompt token evaluated alone), so only the fields tell them apart. Greedy unless
    a variant gives a temperature."""
    post(server, prompt=prompt, max_tokens=1, temperature=0)
    return [post(server, prompt=prompt, max_tokens=n, **{"temperature": 0, **v})["choices"][0]["text"] for v in variants]


def test_seed_top_k_top_p_and_min_p(server):
    """At temperature 1 over the whole vocabulary, the seed decides the text (the same seed the same text,
    another seed another text); top_k 1, a tiny top_p or min_p 1 each leave only the most likely token, so
    the same seed then gives the greedy text."""
    whole = {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0}
    greedy, seed1, again, seed2, top_k, top_p, min_p, big, folded = _texts(server, "Once upon a time, in a small village by the sea,", [
        {"temperature": 0}, {**whole, "seed": 1}, {**whole, "seed": 1}, {**whole, "seed": 2},
        {**whole, "seed": 1, "top_k": 1}, {**whole, "seed": 1, "top_p": 0.01}, {**whole, "seed": 1, "min_p": 1.0},
        {**whole, "seed": 2**63 - 1}, {**whole, "seed": (2**63 - 1) % (2**32 - 1)}], 16)
    assert seed1 == again
    assert big == folded  # OpenAI's 64-bit seeds taken (it was a 400), folded into llama.cpp's 32 bits
    assert seed2 != seed1
    assert seed1 != greedy  # so each cut below changed what seed 1 draws
    assert top_k == greedy
    assert top_p == greedy
    assert min_p == greedy


def test_repetition_penalties_change_greedy_output(server):
    """Each penalty moves greedy decoding off a repetitive prompt from the first token on (they see the
    prompt, as llama.cpp's server does); repeat_last_n 0 (a window of no tokens) turns the penalty off; the
    frequency penalty grows with the count (each word is 4 times in the prompt), the presence penalty not."""
    prompt = "one two three one two three one two three one two three"
    greedy, repeat, presence, frequency, windowless, light_presence, light_frequency = _texts(server, prompt, [
        {}, {"repeat_penalty": 1.5}, {"presence_penalty": 1.5}, {"frequency_penalty": 1.5},
        {"repeat_penalty": 1.5, "repeat_last_n": 0}, {"presence_penalty": 0.5}, {"frequency_penalty": 0.5}], 16)
    assert greedy.split()[:3] == ["one", "two", "three"]
    for penalised in (repeat, presence, frequency, light_frequency):  # 4 x 0.5 outweighs the lead of " one"
        assert penalised.split()[0] not in ("one", "two", "three"), penalised
    assert light_presence.split()[0] == "one" and light_presence != greedy  # 0.5 does not, but changes it later
    assert windowless == greedy


BANANA = 21285  # " banana" in SmolLM2's vocabulary


def test_positive_logit_bias_forces_a_token(server):
    out = post(server, prompt="The capital of France is", max_tokens=4, temperature=0, logit_bias={str(BANANA): 100})
    assert out["choices"][0]["text"] == " banana" * 4 and out["usage"]["completion_tokens"] == 4


def test_prefix_is_copied_from_a_busy_slot(server):
    """A request sharing a long prefix with one that is still running in another slot copies that slot's
    KV (engine.kv.reuse_from) and evaluates only the rest: all of the shared prefix is cached when its own
    tokens follow, and all but the last prompt token (its logits are sampled) when the prompt is the other's."""
    assert wait_idle(server) == IDLE
    shared = [30000 + (i * 7) % 9000 for i in range(200)]  # token ids: no other request's prefix
    running = shared + [500, 501, 502]
    before = metrics(server)
    body = {"prompt": running, "max_tokens": 800, "temperature": 0, "stream": True, "ignore_eos": True}
    with httpx.stream("POST", server.url + "/v1/completions", json=body, headers=HEADERS, timeout=60) as r:
        lines = r.iter_lines()
        next(lines)  # its prompt is in its slot's KV, and it keeps that slot while it generates
        assert httpx.get(server.url + "/health").json()["slots_processing"] == 1
        other = post(server, prompt=shared + [600, 601], max_tokens=3, temperature=0, ignore_eos=True)
        same = post(server, prompt=running, max_tokens=3, temperature=0, ignore_eos=True)
        assert httpx.get(server.url + "/health").json()["slots_processing"] == 1  # still running: the donor was busy
    assert other["usage"]["prompt_tokens"] == 202 and other["usage"]["prompt_tokens_details"]["cached_tokens"] == 200
    assert same["usage"]["prompt_tokens"] == 203 and same["usage"]["prompt_tokens_details"]["cached_tokens"] == 202
    assert other["usage"]["completion_tokens"] == same["usage"]["completion_tokens"] == 3
    assert wait_idle(server) == IDLE
    after = metrics(server)
    # Prompt tokens the steps evaluated: 203 for the running one, 2 and 1 for the two that copied its prefix.
    evaluated = (_metric(after, "localrun_batch_tokens_sum") - _metric(before, "localrun_batch_tokens_sum")
                 - (_metric(after, "localrun_batch_sequences_sum") - _metric(before, "localrun_batch_sequences_sum")))
    assert evaluated == 203 + 2 + 1


def test_a_prompt_sharing_only_a_first_token_keeps_off_another_prompts_slot(server):
    """Two prompts that share only their first token (as every prompt shares <bos> on models that add it)
    take two slots, so each asked again reuses all of itself. Taking the first one's slot for the second
    would throw away 59 cached tokens to keep 1."""
    assert wait_idle(server) == IDLE
    first = [44000] + [44100 + i for i in range(59)]  # token ids: no other request's prefix
    second = [44000] + [44300 + i for i in range(59)]
    for prompt, cached in ((first, 0), (second, 1)):  # the second copies the one token it shares
        answer = post(server, prompt=prompt, max_tokens=2, temperature=0, ignore_eos=True)
        assert answer["usage"]["prompt_tokens_details"]["cached_tokens"] == cached
    for prompt in (first, second):
        answer = post(server, prompt=prompt, max_tokens=2, temperature=0, ignore_eos=True)
        assert answer["usage"]["prompt_tokens_details"]["cached_tokens"] == 59


def _buckets(text: str, name: str) -> dict[float, float]:
    out = {}
    for line in text.splitlines():
        m = re.fullmatch(name + r'_bucket\{le="([^"]+)"\} (\S+)', line)
        if m:
            out[float(m.group(1))] = float(m.group(2))
    assert out, f"{name} not in metrics"
    return out


def test_metrics_are_prometheus_text(server):
    """Each request moves the counters by exactly its usage, the TTFT and TPOT histograms by exactly its
    timings, and the KV gauge by exactly the tokens its slot holds (prompt + generated - 1: the last token
    is never decoded). Three requests on one token prompt: 3 tokens, 10 tokens, then 1 token."""
    assert wait_idle(server) == IDLE
    prompt = [41000 + i for i in range(50)]  # token ids: no other request's prefix
    tpot, ttft = "localrun_time_per_output_token_seconds", "localrun_time_to_first_token_seconds"
    done = 'localrun_requests_total{endpoint="/v1/completions",status="200"}'
    text = metrics(server)
    for n, cached in ((3, 0), (10, 49), (1, 49)):
        answer = post(server, prompt=prompt, max_tokens=n, temperature=0, ignore_eos=True)
        assert answer["usage"]["completion_tokens"] == n and answer["usage"]["prompt_tokens_details"]["cached_tokens"] == cached
        before, text = text, metrics(server)
        delta = lambda name: _metric(text, name) - _metric(before, name)  # noqa: E731
        assert _metric(text, done) - _metric(before, done, default=0.0) == 1
        assert delta("localrun_prompt_tokens_total") == 50 and delta("localrun_prompt_tokens_cached_total") == cached
        assert delta("localrun_generated_tokens_total") == n
        # The histograms hold exactly the timings the answer reports (rounded there to 1 µs).
        assert delta(ttft + "_count") == 1 and abs(delta(ttft + "_sum") - answer["timings"]["ttft_s"]) < 2e-6
        observed = 1 if n > 1 else 0  # one token has no time per output token
        assert delta(tpot + "_count") == observed
        assert abs(delta(tpot + "_sum") - observed * answer["timings"]["tpot_s"]) < 2e-6
        after_b, before_b = _buckets(text, tpot), _buckets(before, tpot)
        for le in after_b:
            if abs(le - answer["timings"]["tpot_s"]) > 2e-6:  # (a value on a bucket's edge could round either way)
                assert after_b[le] - before_b[le] == (observed if answer["timings"]["tpot_s"] <= le else 0), le
        kv = _metric(text, "localrun_kv_cache_tokens")
        if n == 3:
            first_kv = kv  # a slot that held other tokens went to this prompt: 50 + 3 - 1 now
            assert kv <= _metric(before, "localrun_kv_cache_tokens") + 50 + 3 - 1
        else:
            assert kv == first_kv + (n - 1) - (3 - 1)  # the same slot: its prompt kept, its old answer replaced
    assert _metric(text, "localrun_requests_running") == 0 and _metric(text, "localrun_requests_waiting") == 0
    assert _metric(text, "localrun_slots") == 8
    assert _metric(text, "localrun_kv_cache_capacity_tokens") == 8 * 1024
    assert _metric(text, "localrun_kv_cache_tokens") <= 8 * 1024


def test_full_queue_gets_429_and_ctrl_c_stops_cleanly(smollm2, tmp_path):
    with start_server(smollm2, tmp_path / "home", "--parallel", "1", "--queue", "1") as srv:
        body = {"prompt": "Count:", "max_tokens": 3000, "temperature": 0, "stream": True, "ignore_eos": True}
        answers = []
        with httpx.stream("POST", srv.url + "/v1/completions", json=body, timeout=60) as running:
            lines = running.iter_lines()  # kept referenced: a dropped iterator closes the stream
            next(lines)  # holds the only slot (until this client goes away)
            waiting = threading.Thread(target=lambda: answers.append(httpx.post(
                srv.url + "/v1/completions", json={**body, "stream": False, "max_tokens": 5}, timeout=60)))
            waiting.start()
            deadline = time.monotonic() + 10
            while httpx.get(srv.url + "/health").json()["requests_waiting"] < 1 and time.monotonic() < deadline:
                time.sleep(0.02)
            assert httpx.get(srv.url + "/health").json()["requests_waiting"] == 1
            with pytest.raises(openai.RateLimitError):
                srv.client().completions.create(model=SMOL, prompt="hi", max_tokens=2)
        waiting.join(timeout=120)
        assert answers[0].status_code == 200 and answers[0].json()["usage"]["completion_tokens"] == 5


def test_queue_0_serves_while_a_slot_is_idle(smollm2, tmp_path):
    """--queue 0: nobody waits, but a request that an idle slot takes at once is not waiting (every
    request got 429 here once). With the only slot busy, the next one gets 429."""
    with start_server(smollm2, tmp_path / "home", "--parallel", "1", "--queue", "0", "--ctx", "512") as srv:
        for _ in range(2):
            r = httpx.post(srv.url + "/v1/completions", json={"prompt": "Hi", "max_tokens": 2, "temperature": 0}, timeout=60)
            assert r.status_code == 200, r.text
        body = {"prompt": "Count:", "max_tokens": 400, "temperature": 0, "stream": True, "ignore_eos": True}
        with httpx.stream("POST", srv.url + "/v1/completions", json=body, timeout=60) as running:
            lines = running.iter_lines()
            next(lines)  # holds the only slot
            r = httpx.post(srv.url + "/v1/completions", json={"prompt": "Hi", "max_tokens": 2}, timeout=60)
            assert r.status_code == 429 and r.headers["retry-after"] == "1", r.text
            # the translated dialects' too, each in its own shape (they had no Retry-After: found by a helper)
            hi = [{"role": "user", "content": "Hi"}]
            claude = httpx.post(srv.url + "/v1/messages", json={"max_tokens": 2, "messages": hi}, timeout=60)
            assert claude.status_code == 429 and claude.headers["retry-after"] == "1", claude.text
            assert claude.json()["error"]["type"] == "rate_limit_error"
            codex = httpx.post(srv.url + "/v1/responses", json={"input": "Hi", "max_output_tokens": 2}, timeout=60)
            assert codex.status_code == 429 and codex.headers["retry-after"] == "1" and codex.json()["error"]["message"], codex.text
            # Ollama's: a 503 "server busy", as Ollama answers a full queue (it was a 429 without Retry-After)
            busy = httpx.post(srv.url + "/api/generate", json={"model": smollm2.name, "prompt": "Hi", "stream": False}, timeout=60)
            assert busy.status_code == 503 and busy.headers["retry-after"] == "1" and busy.json()["error"].startswith("server busy"), busy.text


def test_ctrl_c_with_long_requests_running_ends_them_cleanly(smollm2, tmp_path):
    """Requests longer than the 3 s grace: they end at once with a JSON 503 (an error event on a stream);
    uvicorn used to cancel them at the deadline, log a traceback and send a plain-text 500."""
    srv = start_server(smollm2, tmp_path / "home", "--parallel", "2", "--ctx", "2048")
    answers = []
    body = {"prompt": "Count:", "max_tokens": 1800, "temperature": 0, "ignore_eos": True}
    plain = threading.Thread(target=lambda: answers.append(httpx.post(srv.url + "/v1/completions", json=body, timeout=60)))
    try:
        with httpx.stream("POST", srv.url + "/v1/completions", json={**body, "stream": True}, timeout=60) as stream:
            lines = stream.iter_lines()
            next(lines)  # generating
            plain.start()
            deadline = time.monotonic() + 10
            while httpx.get(srv.url + "/health").json()["slots_processing"] < 2 and time.monotonic() < deadline:
                time.sleep(0.05)
            srv.proc.send_signal(signal.SIGINT)
            rest = list(lines)
        assert any("shutting down" in line for line in rest), rest[-3:]
        plain.join(timeout=30)
        assert answers[0].status_code == 503 and "shutting down" in answers[0].json()["error"]["message"]
        srv.proc.wait(timeout=30)  # one Ctrl-C is enough (a second one forces an exit, as uvicorn's does)
    finally:
        assert srv.stop() == 130  # no traceback on stderr (checked there)


def test_a_second_ctrl_c_during_a_long_step_stops_at_once(smollm2, tmp_path):
    """One step of a long prompt (a 1,900-token chunk: ~20 s on one thread) cannot be interrupted: the first Ctrl-C
    says the requests end when it does, a second stops at once, the stream getting its error event (it waited the
    whole step, logged tracebacks, cut the stream without an end, and once crashed in llama.cpp while tearing
    down beside it: a helper's reliability run)."""
    srv = start_server(smollm2, tmp_path / "home", "--parallel", "1", "--ctx", "4096", "--prefill-chunk", "2048", "--batch", "2048")
    body = {"model": smollm2.name, "stream": True, "max_tokens": 8, "messages": [{"role": "user", "content": "word " * 1900}]}
    got: list[str] = []
    client = threading.Thread(target=lambda: got.extend(_lines_of(srv.url + "/v1/chat/completions", body)))
    try:
        client.start()
        wait_until(lambda: httpx.get(srv.url + "/health").json()["slots_processing"] == 1, what="the prompt's step")
        # Admitted; the scheduler thread enters llama.cpp's step a moment later (on a loaded CI machine a first Ctrl-C
        # before it took the graceful path: the step never started). The step itself lasts ~20 s.
        time.sleep(1.5)
        srv.proc.send_signal(signal.SIGINT)
        wait_until(lambda: any("a second Ctrl-C stops at once" in line for line in srv.stderr), what="the first Ctrl-C's line")
        srv.proc.send_signal(signal.SIGINT)
        assert srv.proc.wait(timeout=30) == 130
        client.join(timeout=30)
        assert any("the server was stopped: retry later" in line for line in got), got
        assert any("stopped at once: the step under way was not waited for" in line for line in srv.stderr)
    finally:
        assert srv.stop() == 130  # no traceback on stderr (checked there)


def _lines_of(url: str, body: dict) -> list[str]:
    with httpx.stream("POST", url, json=body, timeout=120) as r:
        return list(r.iter_lines())


def test_ctrl_c_exits_130_even_when_started_with_sigint_ignored(tmp_path):
    """A background job of a script starts with SIGINT ignored: uvicorn still stopped on it, but could not
    re-raise it, and serve exited 0. (A server that loads models on request: the signal is the subject, and
    holding a model took most of this test's time.)"""
    srv = start_server(None, tmp_path / "home", "--parallel", "1", "--ctx", "256", sigint=signal.SIG_IGN)
    assert srv.stop() == 130


def test_serve_bad_options(smollm2, cli):
    r = cli("serve", str(smollm2), "--port", "70000")
    assert r.returncode == 2 and "--port" in r.stderr and "Traceback" not in r.stderr
    r = cli("serve", str(smollm2), "--parallel", "0")
    assert r.returncode == 2 and "--parallel" in r.stderr


def test_bench_serve_load_test(server, cli):
    """`localrun bench --serve`: concurrent streams against the running server, one row per level."""
    r = cli("bench", "--serve", server.url + "/v1", "--concurrency", "1,3", "--requests", "3", "--tg", "8",
            "--output", "json", "--api-key", KEY)
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    assert [row["concurrency"] for row in rows] == [1, 3]
    for row in rows:
        assert row["requests"] == 3 and row["failed"] == 0 and row["tokens"] == 3 * 8  # ignore_eos: exactly --tg each
        # Both rates over the level's one wall time (rounded: tokens/s to 0.01, requests/s to 0.001, wall to 1 ms)
        assert row["tokens_per_s"] > 0 and abs(row["tokens_per_s"] - 8 * row["requests_per_s"]) <= 0.01
        assert abs(row["tokens_per_s"] - row["tokens"] / row["wall_s"]) <= 0.006 + row["tokens"] * 0.0006 / row["wall_s"] ** 2
        assert 0 < row["ttft_p50_s"] <= row["ttft_p95_s"] and 0 < row["tpot_p50_s"] <= row["tpot_p95_s"]
    assert rows[0]["speedup_vs_first"] == 1.0
    assert rows[1]["speedup_vs_first"] == pytest.approx(rows[1]["tokens_per_s"] / rows[0]["tokens_per_s"], rel=1e-3, abs=1e-3)


def test_bench_serve_bad_target(server, cli):
    r = cli("bench", "--serve", server.url + "/v1", "--requests", "1")  # no key
    assert r.returncode == 2 and "--api-key" in r.stderr and "Traceback" not in r.stderr
    r = cli("bench", "--serve", "http://127.0.0.1:9/v1")
    assert r.returncode == 2 and "cannot reach" in r.stderr
    r = cli("bench", "--serve", "localhost:8080")
    assert r.returncode == 2 and "base URL" in r.stderr


def test_gemma_sliding_window_model_batches_and_shares_prefixes(gemma, tmp_path, cli):
    """gemma-3 (sliding-window attention, no chat template): batched output equals solo output, and a
    cached prefix is reused. llama.cpp's K-quant kernels round a last token evaluated alone differently
    from one inside a prompt batch, so the warm answer may differ from the cold one: each is compared with
    `localrun run` in the same state (cold, then with its prefix cache holding the prompt)."""
    with start_server(gemma, tmp_path / "home", "--parallel", "2", "--ctx", "512") as srv:
        client = srv.client(key="unused")
        prompts = ["The tallest mountain in Europe is", "A recipe for bread needs flour, water,"]
        for p in prompts:  # warm: solo and together then both reuse the prompt but its last token
            complete(client, p, gemma.name, max_tokens=1)
        # Each prompt keeps its own slot (they share only <bos>): every step after this decodes one token per
        # sequence, whether the two requests arrive in the same step or not.
        solo = [complete(client, p, gemma.name, max_tokens=16, extra_body={"ignore_eos": True}) for p in prompts]
        assert [s.usage.prompt_tokens_details.cached_tokens for s in solo] == [s.usage.prompt_tokens - 1 for s in solo]
        together = [None, None]
        threads = [threading.Thread(target=lambda i=i: together.__setitem__(i, complete(
            client, prompts[i], gemma.name, max_tokens=16, extra_body={"ignore_eos": True}).choices[0].text)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert together == [s.choices[0].text for s in solo]
        shared = "Facts about the planets of the solar system, one per line. " * 12
        first = complete(client, shared + "Mars:", gemma.name, max_tokens=12)
        again = complete(client, shared + "Mars:", gemma.name, max_tokens=12)  # the whole prompt but its last token is reused
        assert first.usage.prompt_tokens_details.cached_tokens == 1  # only <bos>, which every prompt starts with
        assert again.usage.prompt_tokens_details.cached_tokens == first.usage.prompt_tokens - 1
        assert again.usage.completion_tokens == 12
    # run's first evaluates the prompt whole; its second restores all but the last prompt token from its cache
    for answer, cached in ((first, 0), (again, again.usage.prompt_tokens_details.cached_tokens)):
        ran = cli("run", str(gemma), "--raw", "-t", "0", "-n", "12", "--threads", "1", "--json", shared + "Mars:")
        assert ran.returncode == 0, ran.stderr
        done = last_json(ran.stdout)
        assert done["stats"]["cached_tokens"] == cached
        assert done["text"] == answer.choices[0].text and len(done["tokens"]) == answer.usage.completion_tokens


def test_requests_that_would_crash_llama_cpp_are_refused(server, smollm2, cli, tmp_path):
    """ignore_eos with a grammar (a finished grammar allows only end-of-text) and batches larger than
    --batch would abort llama.cpp: both are refused up front."""
    headers = {"Authorization": f"Bearer {KEY}"}
    r = httpx.post(server.url + "/v1/completions", headers=headers, json={
        "prompt": "JSON:", "max_tokens": 20, "ignore_eos": True, "response_format": {"type": "json_object"}})
    assert r.status_code == 400 and "ignore_eos" in r.json()["error"]["message"]
    grammar = tmp_path / "yes.gbnf"
    grammar.write_text('root ::= "yes"\n')
    for args, flag in ((["serve", "--parallel", "4", "--batch", "2"], "--parallel"),
                       (["run", "--draft", "lookup", "--draft-max", "8", "--batch", "4", "hi"], "--draft-max"),
                       (["run", "--min-tokens", "5", "--grammar", str(grammar), "hi"], "min"),
                       (["run", "--grammar", str(smollm2), "hi"], "UTF-8")):
        res = cli(args[0], str(smollm2), *args[1:])
        assert res.returncode == 2 and flag in res.stderr and "Traceback" not in res.stderr, res.stderr
