"""What today's OpenAI clients send and expect, against a real `localrun serve` with SmolLM2, through the
real openai client: current request fields accepted (or refused by name where they cannot be honoured),
`models.retrieve`, every id /v1/models lists answering on every endpoint, a digest for every model on
Ollama's listings (clients key models by it), response_format json_object with llama-server's schema, and
n > 1 choices."""

from __future__ import annotations

import hashlib
import json

import httpx
import jsonschema
import openai
import pytest

from conftest import start_server, wait_until

pytestmark = pytest.mark.slow

HI = [{"role": "user", "content": "Say hi"}]

# Fields that do not change what the model must write: accepted and ignored (as Ollama and llama-server do).
IGNORED = {"prompt_cache_key": "k1", "prompt_cache_retention": "24h", "safety_identifier": "u-1", "verbosity": "low",
           "prediction": {"type": "content", "content": "Hello"}, "modalities": ["text"], "service_tier": "auto",
           "store": False, "metadata": {"a": "b"}, "user": "someone", "reasoning_effort": "low"}
# Fields that would: refused, naming the field.
REFUSED = {"modalities": ["text", "audio"], "audio": {"voice": "alloy", "format": "wav"}, "web_search_options": {},
           "functions": [{"name": "f"}]}


@pytest.fixture(scope="module")
def server(smollm2, tmp_path_factory):
    with start_server(smollm2, tmp_path_factory.mktemp("surface-home"), "--parallel", "4", "--ctx", "1024") as srv:
        yield srv


def client(server) -> openai.OpenAI:
    return server.client("none")


def test_current_openai_fields_are_accepted_or_refused_by_name(server, smollm2):
    c = client(server)
    plain = c.chat.completions.create(model=smollm2.name, messages=HI, max_tokens=8, temperature=0).choices[0].message.content
    for name, value in IGNORED.items():
        r = c.chat.completions.create(model=smollm2.name, messages=HI, max_tokens=8, temperature=0, extra_body={name: value})
        assert r.choices[0].message.content == plain, name  # ignored: the same answer
    for name, value in REFUSED.items():
        with pytest.raises(openai.BadRequestError) as err:
            c.chat.completions.create(model=smollm2.name, messages=HI, max_tokens=8, extra_body={name: value})
        assert err.value.body["param"] == name and name in err.value.body["message"], err.value.body
    with pytest.raises(openai.BadRequestError, match="unknown or unsupported field 'no_such_field'"):
        c.chat.completions.create(model=smollm2.name, messages=HI, max_tokens=8, extra_body={"no_such_field": 1})
    # What litellm and other clients send (found by a helper): a cache_control hint in a content part (it was a 400
    # naming the wrong field), and null for n and stream (nullable in OpenAI's spec) are taken; a key no part has is
    # refused by its own name.
    hinted = [{"role": "user", "content": [{"type": "text", "text": HI[0]["content"], "cache_control": {"type": "ephemeral"}}]}]
    r = httpx.post(str(c.base_url) + "chat/completions", headers={"Authorization": "Bearer none"}, json={
        "model": smollm2.name, "messages": hinted, "max_tokens": 8, "temperature": 0, "n": None, "stream": None})
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == plain, r.text
    with pytest.raises(openai.BadRequestError) as odd:
        c.chat.completions.create(model=smollm2.name, max_tokens=8, messages=[{"role": "user", "content": [{"type": "text", "text": "x", "foo": 1}]}])
    assert odd.value.body["param"] == "messages.0.content.0.foo"
    # An assistant's refusal part in the history is read as its text (it was a 400: found by a helper); a user's is refused.
    said = [*HI, {"role": "assistant", "content": "I cannot."}, {"role": "user", "content": "Why?"}]
    refused = [*HI, {"role": "assistant", "content": [{"type": "refusal", "refusal": "I cannot."}]}, {"role": "user", "content": "Why?"}]
    assert (c.chat.completions.create(model=smollm2.name, messages=refused, max_tokens=8, temperature=0).choices[0].message.content
            == c.chat.completions.create(model=smollm2.name, messages=said, max_tokens=8, temperature=0).choices[0].message.content)
    with pytest.raises(openai.BadRequestError, match="assistant's message only"):
        c.chat.completions.create(model=smollm2.name, max_tokens=8, messages=[{"role": "user", "content": [{"type": "refusal", "refusal": "x"}]}])


def test_models_retrieve_and_every_listed_id_answers_everywhere(server, smollm2):
    c = client(server)
    ids = [m.id for m in c.models.list().data]
    assert smollm2.name in ids
    for model_id in ids:
        assert c.models.retrieve(model_id).id == model_id
        assert c.chat.completions.create(model=model_id, messages=HI, max_tokens=4).choices[0].message.content is not None
        assert len(c.embeddings.create(model=model_id, input="hello").data[0].embedding) > 0
    with pytest.raises(openai.NotFoundError):
        c.models.retrieve("no-such-model")


def test_every_model_has_its_files_digest(server, smollm2):
    sha = hashlib.sha256(smollm2.read_bytes()).hexdigest()
    tags = httpx.get(server.url + "/api/tags").json()["models"]
    assert [m["digest"] for m in tags if m["name"].endswith(smollm2.name)] == [sha]
    assert httpx.post(server.url + "/api/show", json={"model": str(smollm2)}).json()["digest"] == sha
    wait_until(lambda: all(m["digest"] == sha for m in httpx.get(server.url + "/api/ps").json()["models"]), what="the digest on /api/ps")


def test_json_object_with_a_schema_constrains_to_it(server, smollm2):
    schema = {"type": "object", "properties": {"answer": {"type": "integer"}, "unit": {"enum": ["cm", "m"]}},
              "required": ["answer", "unit"], "additionalProperties": False}
    r = client(server).chat.completions.create(model=smollm2.name, messages=[{"role": "user", "content": "How tall is a door?"}],
                                               max_tokens=40, temperature=0, response_format={"type": "json_object", "schema": schema})
    jsonschema.validate(json.loads(r.choices[0].message.content), schema)
    with pytest.raises(openai.BadRequestError) as err:
        client(server).chat.completions.create(model=smollm2.name, messages=HI, max_tokens=8,
                                               response_format={"type": "json_object", "schema": {"type": "no-such-type"}})
    assert err.value.body["param"] == "response_format"


def one_choice_tokens(r) -> int:
    return max(1, len(r.choices[0].message.content.split()))


def test_n_choices(server, smollm2):
    r = client(server).chat.completions.create(model=smollm2.name, messages=[{"role": "user", "content": "Name a colour."}],
                                               n=3, max_tokens=12, temperature=1.0, seed=7)
    assert [c.index for c in r.choices] == [0, 1, 2] and all(c.message.content for c in r.choices)
    assert len({c.message.content for c in r.choices}) > 1  # each choice its own sample
    assert r.usage.completion_tokens > one_choice_tokens(r) and r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    one = client(server).chat.completions.create(model=smollm2.name, messages=[{"role": "user", "content": "Name a colour."}],
                                                 max_tokens=12, temperature=1.0, seed=7)
    assert r.usage.prompt_tokens == one.usage.prompt_tokens and r.choices[0].message.content == one.choices[0].message.content
    with pytest.raises(openai.BadRequestError, match="n with stream"):
        client(server).chat.completions.create(model=smollm2.name, messages=HI, n=2, stream=True)
