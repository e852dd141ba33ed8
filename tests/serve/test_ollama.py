"""Ollama's dialect (/api) end to end: a real `localrun serve` answering the real `ollama` Python client and
langchain-ollama, unchanged, with the real SmolLM2 pulled from the Hub stand-in (and Gemma 3 by path, a base
model without a chat template). Answers are compared with `localrun run` in-process, greedy."""

from __future__ import annotations

import json

import httpx
import jsonschema
import ollama
import pytest

from conftest import run_cli, start_server, wait_until
from hubstub import HubStub, StubEnv, StubFile, isolate_hf_home, point_hub_at

pytestmark = pytest.mark.slow

REF = "test/SmolLM2-GGUF:Q4_1"
QUESTION = "What is the capital of France?"
GREEDY = {"temperature": 0, "num_predict": 24}


@pytest.fixture(scope="module")
def module_served(smollm2, tmp_path_factory):
    """One Hub stand-in, one pull of SmolLM2 (as REF) and one server on that home for the whole module (a pull of
    90 MB and a server's start for each test were most of this module's time); stopped (Ctrl-C) at the end.
    test_pull_and_delete pulls another repository, so the pull itself is still tested through the server."""
    where = tmp_path_factory.mktemp("ollama")
    home, hf_home = where / "localrun-home", where / "hf-home"
    home.mkdir()
    with pytest.MonkeyPatch.context() as patch, HubStub() as stub:
        patch.setenv("LOCALRUN_HOME", str(home))
        patch.delenv("LOCALRUN_MODELS", raising=False)
        patch.delenv("LOCALRUN_MIRROR_FIND_LINKS", raising=False)
        isolate_hf_home(patch, hf_home)
        point_hub_at(patch, stub.url)
        stub.add_repo("test/SmolLM2-GGUF", [StubFile(smollm2.name, smollm2.read_bytes())])
        pulled = run_cli("pull", REF)
        assert pulled.returncode == 0, pulled.stderr
        with start_server(None, home, "--parallel", "2", "--ctx", "1024") as srv:
            srv.hub = StubEnv(stub=stub, home=home, hf_home=hf_home)
            yield srv
        from huggingface_hub import close_session

        close_session()


@pytest.fixture
def served(module_served, monkeypatch):
    """The module's server, with this test's `localrun` commands (run_here) in the server's home."""
    monkeypatch.setenv("LOCALRUN_HOME", str(module_served.hub.home))
    monkeypatch.setenv("HF_HOME", str(module_served.hub.hf_home))
    return module_served


@pytest.fixture(scope="module")
def want(module_served) -> str:
    """What `localrun run REF QUESTION` answers in the module's home (as run_here): one run for the tests that
    compare the server's answers to QUESTION with it, where each ran its own."""
    hub = module_served.hub
    ran = run_cli("run", REF, QUESTION, "-t", "0", "-n", "24", "--no-cache", "--threads", "1",
                  env={"LOCALRUN_HOME": str(hub.home), "HF_HOME": str(hub.hf_home), "LOCALRUN_KEEP_ALIVE": "0"})
    assert ran.returncode == 0, ran.stderr
    return ran.stdout.rstrip("\n")


def run_here(cli, *args: str) -> str:
    """What `localrun run` answers in this home, in-process (LOCALRUN_KEEP_ALIVE=0 in tests), greedy."""
    ran = cli("run", *args, "-t", "0", "-n", "24", "--no-cache", "--threads", "1")
    assert ran.returncode == 0, ran.stderr
    return ran.stdout.rstrip("\n")


def test_chat_and_generate_answer_as_run_does(served, cli, gemma, want):
    c = ollama.Client(host=served.url)
    user = [{"role": "user", "content": QUESTION}]

    r = c.chat(model=REF, messages=user, options=GREEDY)
    assert r.message.role == "assistant" and r.message.content == want
    assert r.done and r.done_reason in ("stop", "length") and r.model
    assert r.prompt_eval_count > 5 and 0 < r.eval_count <= 24
    assert r.total_duration >= r.eval_duration > 0 and r.prompt_eval_duration > 0 and r.load_duration >= 0

    parts = list(c.chat(model=REF, messages=user, options=GREEDY, stream=True))
    assert "".join(p.message.content for p in parts) == want
    assert [p.done for p in parts] == [False] * (len(parts) - 1) + [True] and len(parts) > 2
    assert parts[-1].done_reason == r.done_reason and parts[-1].eval_count == r.eval_count

    # /api/generate goes through the chat template (as Ollama's does unless raw) ...
    assert c.generate(model=REF, prompt=QUESTION, options=GREEDY).response == want
    assert "".join(p.response for p in c.generate(model=REF, prompt=QUESTION, options=GREEDY, stream=True)) == want
    # ... raw, or for a model without one, the prompt as it is.
    prefix = "The capital of France is"
    assert c.generate(model=REF, prompt=prefix, raw=True, options=GREEDY).response == run_here(cli, REF, "--raw", prefix)
    assert c.generate(model=str(gemma), prompt=prefix, options=GREEDY).response == run_here(cli, str(gemma), "--raw", prefix)

    # A conversation: the assistant's turn and a system prompt are part of the prompt.
    two = c.chat(model=REF, options=GREEDY, messages=[
        {"role": "system", "content": "You are a pirate."}, *user, {"role": "assistant", "content": r.message.content},
        {"role": "user", "content": "And of Italy?"}])
    assert two.prompt_eval_count > r.prompt_eval_count + 10 and two.message.content


def test_format_json_and_a_schema(served, cli, tmp_path):
    from localrun.runtime.options import json_grammar

    c = ollama.Client(host=served.url)
    # format "json": the answer run gives under the same JSON grammar (greedy, so cut at 24 tokens alike).
    prompt = 'Reply in JSON: {"colour": ...} for the sky.'
    (tmp_path / "json.gbnf").write_text(json_grammar())
    loose = c.chat(model=REF, format="json", options=GREEDY, messages=[{"role": "user", "content": prompt}])
    assert loose.message.content == run_here(cli, REF, "--grammar", str(tmp_path / "json.gbnf"), prompt)
    assert loose.message.content.lstrip().startswith(("{", "["))
    # a schema: an answer that validates
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer"}},
              "required": ["name", "age"], "additionalProperties": False}
    strict = c.generate(model=REF, format=schema, options={"temperature": 0, "num_predict": 200}, prompt="Invent a person.")
    assert strict.done_reason == "stop", strict.response
    jsonschema.validate(json.loads(strict.response), schema)


def test_logprobs(served):
    c = ollama.Client(host=served.url)
    user = [{"role": "user", "content": QUESTION}]
    r = c.chat(model=REF, messages=user, options=GREEDY, logprobs=True, top_logprobs=2)
    assert "".join(t.token for t in r.logprobs) == r.message.content and len(r.logprobs) == r.eval_count
    assert all(t.top_logprobs[0].token == t.token and t.logprob == pytest.approx(t.top_logprobs[0].logprob) for t in r.logprobs)
    streamed = [t for part in c.chat(model=REF, messages=user, options=GREEDY, logprobs=True, top_logprobs=2, stream=True)
                for t in part.logprobs or []]
    assert [t.token for t in streamed] == [t.token for t in r.logprobs]
    raw = c.generate(model=REF, prompt="The capital of France is", raw=True, options=GREEDY, logprobs=True, top_logprobs=1)
    assert "".join(t.token for t in raw.logprobs) == raw.response
    assert c.chat(model=REF, messages=user, options=GREEDY).logprobs is None


def test_list_show_ps_version_preload_and_unload(served, cli):
    c = ollama.Client(host=served.url)
    [listed] = [m for m in c.list().models if m.model == REF]
    assert listed.size > 50_000_000 and listed.details.family == "llama" and listed.details.quantization_level == "Q4_1"
    assert listed.details.format == "gguf" and listed.digest and listed.modified_at is not None

    shown = c.show(REF)
    assert shown.details.parameter_size.endswith("M") and "completion" in shown.capabilities
    assert shown.modelinfo["general.architecture"] == "llama" and shown.modelinfo["llama.block_count"] == 30
    assert "<|im_start|>" in shown.template

    for model in c.ps().models:  # (what the module's earlier tests left loaded: unloaded first)
        c.generate(model=model.model, prompt="", keep_alive=0)
    wait_until(lambda: c.ps().models == [], what="the models loaded before to unload")
    loaded = c.chat(model=REF, messages=[])  # an empty request loads the model (Ollama's preload)
    assert loaded.done and loaded.done_reason == "load"
    [running] = c.ps().models
    assert running.name and running.size > 0 and running.context_length == 1024 and running.expires_at is not None
    assert running.details.family == "llama"
    gone = c.generate(model=REF, prompt="", keep_alive=0)  # ... and with keep_alive 0 unloads it
    assert gone.done_reason == "unload"
    wait_until(lambda: c.ps().models == [], what="the model to unload")

    assert httpx.get(served.url + "/api/version").json()["version"]
    up = httpx.head(served.url + "/")  # what the `ollama` command checks before each command
    assert up.status_code == 200 and "Ollama is running" in httpx.get(served.url + "/").text


def test_pull_and_delete(served, smollm2):
    c, hub_stub = ollama.Client(host=served.url), served.hub
    other = "test/SmolLM2-copy-GGUF:Q4_1"
    hub_stub.stub.add_repo("test/SmolLM2-copy-GGUF", [StubFile(smollm2.name, smollm2.read_bytes())])
    parts = list(c.pull(other, stream=True))
    assert parts[0].status == "pulling manifest" and parts[-1].status == "success"
    sized = [p for p in parts if p.total]
    assert sized and sized[-1].completed == sized[-1].total == smollm2.stat().st_size  # byte progress, to the end
    assert [p.completed for p in sized] == sorted(p.completed for p in sized)
    assert other in [m.model for m in c.list().models]
    assert c.chat(model=other, messages=[{"role": "user", "content": "Hi"}], options={"num_predict": 2}).done
    # A copy answered by its source, loaded already (the same file and options): deleting the copy deletes the
    # copy alone, and the source stays loaded (it deleted the source, the model that answered: found by a helper).
    c.create(model="base", from_=str(smollm2))
    assert c.generate(model="base", prompt="Hi", options={"num_predict": 2}).done  # loaded as "base"
    c.copy("base", "mine")
    assert c.chat(model="mine", messages=[{"role": "user", "content": "Hi"}], options={"num_predict": 2}).done
    c.delete("mine")
    assert "base:latest" in [m.model for m in c.list().models] and "mine:latest" not in [m.model for m in c.list().models]
    assert "base:latest" in [m.model for m in c.ps().models] and c.show("base").details.format == "gguf"
    with pytest.raises(ollama.ResponseError) as copy_gone:
        c.chat(model="mine", messages=[{"role": "user", "content": "Hi"}], options={"num_predict": 2})
    assert copy_gone.value.status_code == 404
    c.delete("base:latest")  # as /api/tags lists it: unloaded too (the name it was loaded by is 'base')
    wait_until(lambda: "base:latest" not in [m.model for m in c.ps().models], what="the deleted model to unload")
    c.delete(other)
    assert other not in [m.model for m in c.list().models]
    with pytest.raises(ollama.ResponseError) as missing:
        c.delete(other)
    assert missing.value.status_code == 404
    with pytest.raises(ollama.ResponseError) as unknown:
        c.pull("test/No-Such-GGUF:Q4_1")
    assert "No-Such" in unknown.value.error


BAD_CALLS = [
    (lambda c: c.chat(model="no-such-model", messages=[{"role": "user", "content": "x"}]), 404, 'model "no-such-model" not found'),
    (lambda c: c.chat(model=REF, messages=[{"role": "user", "content": "x"}], options={"temperature": -1}), 400, "invalid 'options.temperature'"),
    (lambda c: c.chat(model=REF, messages=[{"role": "user", "content": "x"}], options={"num_predict": "many"}), 400, "options.num_predict"),
    (lambda c: c.generate(model=REF, prompt="x", images=[b"\x89PNG"]), 400, "images"),
    (lambda c: c.generate(model=REF, prompt="x", suffix="y"), 400, "has no fill-in-the-middle tokens"),  # SmolLM2 has none
    (lambda c: c.show("no-such-model"), 404, "not found"),
]


def test_bad_requests_get_ollamas_error_shape_and_the_server_goes_on(served):
    """Each through the ollama client (its ResponseError: the status and Ollama's words), then raw bodies no
    client would send; one server for all of them, answering after each."""
    c = ollama.Client(host=served.url)
    for call, status, fragment in BAD_CALLS:
        with pytest.raises(ollama.ResponseError) as failed:
            call(c)
        assert failed.value.status_code == status and fragment in failed.value.error, (fragment, failed.value.error)
        assert c.chat(model=REF, messages=[{"role": "user", "content": "Hi"}], options={"num_predict": 2}).done  # still serving
    for body in (b"{not json", b'{"model": "%s", "messages": [], "format": "yaml"}' % REF.encode(), b'{"model": "%s", "prompt": 3}' % REF.encode(),
                 b'{"model": "%s", "prompt": "x", "stream": "yes"}' % REF.encode(), b'{"model": 12, "prompt": "x"}',
                 b'{"model": "%s", "messages": [], "format": %s}' % (REF.encode(), b"[" * 5000 + b"]" * 5000)):
        raw = httpx.post(served.url + ("/api/generate" if b"prompt" in body else "/api/chat"), content=body)
        assert raw.status_code == 400 and set(raw.json()) == {"error"}, raw.text
    assert c.chat(model=REF, messages=[{"role": "user", "content": "Hi"}], options={"num_predict": 2}).done
    # a whole float for an integer option, as Ollama takes it (a 400 "a whole number" before: found by a helper)
    whole = httpx.post(served.url + "/api/generate", json={"model": REF, "prompt": "Hi", "stream": False,
                                                           "options": {"num_predict": 3.0, "top_k": 1.0, "seed": 7.0}})
    assert whole.status_code == 200 and 0 < whole.json()["eval_count"] <= 3, whole.text
    half = httpx.post(served.url + "/api/generate", json={"model": REF, "prompt": "Hi", "options": {"num_predict": 2.5}})
    assert half.status_code == 400 and "num_predict" in half.json()["error"]


def test_langchain_ollama_chat_and_stream(served, want):
    from langchain_ollama import ChatOllama

    llm = ChatOllama(model=REF, base_url=served.url, temperature=0, num_predict=24)
    assert llm.invoke(QUESTION).content == want
    assert "".join(chunk.content for chunk in llm.stream(QUESTION)) == want


def test_a_model_deleted_while_it_answers_leaves_the_listings_whole(served):
    """Open WebUI deletes a model its title and follow-up requests still use: /api/tags stays 200 without it
    (it was a 500 on the vanished file), and the answer under way ends."""
    body = {"model": REF, "messages": [{"role": "user", "content": "Count to a hundred."}],
            "options": {"num_predict": 200, "temperature": 0}}
    try:
        with httpx.stream("POST", served.url + "/api/chat", json=body, timeout=300) as answer:
            lines = answer.iter_lines()
            assert json.loads(next(lines))["done"] is False  # under way
            assert httpx.request("DELETE", served.url + "/api/delete", json={"model": REF}, timeout=60).status_code == 200
            tags = httpx.get(served.url + "/api/tags", timeout=60)
            assert tags.status_code == 200 and REF not in [m["name"] for m in tags.json()["models"]], tags.text
            assert json.loads(list(lines)[-1])["done"] is True
    finally:  # the module's other tests use it: pulled again (from the stand-in, as the module's fixture did)
        assert ollama.Client(host=served.url).pull(REF).status == "success"


def test_generate_context_continues_an_exchange(served):
    """Ollama's (deprecated, still used) generate `context`: the last object carries the prompt and answer as
    tokens, and a request that sends them back continues after them (it was never given, and a 400 when sent:
    found by a helper); streamed or not alike; a context that is not this model's tokens is a 400."""
    c = ollama.Client(host=served.url)
    first = c.generate(model=REF, prompt="My name is Ada.", options=GREEDY | {"num_predict": 8})
    assert first.context and len(first.context) >= first.prompt_eval_count + 1
    streamed = list(c.generate(model=REF, prompt="My name is Ada.", options=GREEDY | {"num_predict": 8}, stream=True))
    assert streamed[-1].context == first.context and all(p.context is None for p in streamed[:-1])
    alone = c.generate(model=REF, prompt="What is my name?", options=GREEDY | {"num_predict": 8})
    follow = c.generate(model=REF, prompt="What is my name?", context=first.context, options=GREEDY | {"num_predict": 8})
    assert follow.prompt_eval_count == len(first.context) + alone.prompt_eval_count  # (SmolLM2 adds no BOS to drop)
    assert follow.context[:len(first.context)] == first.context
    assert c.generate(model=REF, prompt="Hi", raw=True, options={"num_predict": 2}).context is None  # raw: none, as Ollama's
    for context, fragment in (("abc", "list of token ids"), ([10**9], "out of this model's range")):
        bad = httpx.post(served.url + "/api/generate", json={"model": REF, "prompt": "x", "context": context, "stream": False})
        assert bad.status_code == 400 and fragment in bad.json()["error"], bad.text
