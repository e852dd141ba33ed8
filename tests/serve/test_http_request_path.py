"""HTTP requests take the request path `run` and `chat` take (runtime.generate through serve.stream.Answer):
the prefix cache on disk serves HTTP clients, so a long system prompt survives a server restart, and what
is restored answers exactly as a prompt evaluated from scratch."""

from __future__ import annotations

import pytest

from conftest import start_server

openai = pytest.importorskip("openai")

pytestmark = pytest.mark.slow

# About 400 tokens: well over the prefix cache's 64-token minimum, short enough for a quick prefill.
SYSTEM = ("You are the help desk of a small public library. " * 4 + "\n".join(
    f"Rule {i}: answer in one short sentence, name the shelf {chr(65 + i % 26)}{i} when a book is asked for, "
    "and never invent opening hours." for i in range(14)))


def ask(server, model, question: str):
    client = server.client("none", timeout=300)
    return client.chat.completions.create(model=model.name, temperature=0, max_tokens=12,
                                          messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}])


def test_a_long_system_prompt_is_restored_from_disk_after_a_restart(smollm2, tmp_path):
    home = tmp_path / "home"
    with start_server(smollm2, home, "--ctx", "2048", "--parallel", "1") as first:
        cold = ask(first, smollm2, "Where are the atlases?")
    assert cold.usage.prompt_tokens > 350 and cold.usage.prompt_tokens_details.cached_tokens == 0

    with start_server(smollm2, home, "--ctx", "2048", "--parallel", "1") as again:  # a new process, the same store
        warm = ask(again, smollm2, "Do you lend films?")
    # The system prompt (and the first question's start of turn) came from the disk, not from a prefill.
    shared = cold.usage.prompt_tokens - 20
    assert warm.usage.prompt_tokens_details.cached_tokens >= shared, warm.usage

    with start_server(smollm2, tmp_path / "other", "--ctx", "2048", "--parallel", "1") as fresh:  # nothing stored
        reference = ask(fresh, smollm2, "Do you lend films?")
    assert reference.usage.prompt_tokens_details.cached_tokens == 0
    assert warm.choices[0].message.content == reference.choices[0].message.content
    assert warm.usage.prompt_tokens == reference.usage.prompt_tokens


def test_a_stored_response_continues_after_a_restart_and_an_unstored_one_does_not(tiny_smollm2, tmp_path):
    """previous_response_id after the server restarted: a response stored (`store` true, the default) is
    found on disk and its conversation continues, its KV state from the prefix cache, and GET reads it as it
    was answered; one sent with `store: false` was kept only in memory (404, in OpenAI's shape). The tiny
    model (tests/tinymodel.py: SmolLM2's tokenizer and template, so the same tokens counted): what is checked
    is what is kept and counted, never the words."""
    smollm2 = tiny_smollm2
    home = tmp_path / "home"

    def client(server):
        return server.client("none", timeout=300)

    with start_server(smollm2, home, "--ctx", "2048", "--parallel", "1") as first:
        stored = client(first).responses.create(model=smollm2.name, instructions=SYSTEM, input="My name is Ada.",
                                                temperature=0, max_output_tokens=8)
        unstored = client(first).responses.create(model=smollm2.name, input="My name is Bo.", store=False,
                                                  temperature=0, max_output_tokens=8)
        # GET /v1/responses/{id}: a stored response as it was answered, whole or streamed; DELETE forgets one
        # (even while its write to disk may still be on its way); one sent with store: false is not kept to be read.
        assert client(first).responses.retrieve(stored.id).model_dump() == stored.model_dump()
        given = client(first).responses.input_items.list(stored.id).data  # its input, as items
        assert [(i.type, i.role, [(c.type, c.text) for c in i.content]) for i in given] == [("message", "user", [("input_text", "My name is Ada.")])]
        with pytest.raises(openai.NotFoundError):
            client(first).responses.input_items.list(unstored.id)
        with pytest.raises(openai.BadRequestError) as streamed_get:  # (it answered JSON, which the SDK read as no events)
            list(client(first).responses.retrieve(stored.id, stream=True))
        assert streamed_get.value.body["param"] == "stream"
        events = list(client(first).responses.create(model=smollm2.name, input="Say hi.", temperature=0, max_output_tokens=4,
                                                     stream=True))
        streamed = events[-1].response  # response.incomplete: cut at max_output_tokens
        assert events[-1].type == "response.incomplete" and streamed.status == "incomplete"
        assert client(first).responses.retrieve(streamed.id).model_dump() == streamed.model_dump()
        client(first).responses.delete(streamed.id)
        for gone in (streamed.id, unstored.id, "resp_" + "0" * 24):
            with pytest.raises(openai.NotFoundError) as missing:
                client(first).responses.retrieve(gone)
            assert gone in missing.value.body["message"]
        with pytest.raises(openai.NotFoundError):
            client(first).responses.delete(streamed.id)
    assert list((home / "responses").glob("resp_*.json")) == [home / "responses" / f"{stored.id}.json"]

    with start_server(smollm2, home, "--ctx", "2048", "--parallel", "1") as again:
        assert client(again).responses.retrieve(stored.id).model_dump() == stored.model_dump()  # from the disk
        assert client(again).responses.input_items.list(stored.id).data == given
        follow = client(again).responses.create(model=smollm2.name, instructions=SYSTEM, input="What is my name?",
                                                previous_response_id=stored.id, temperature=0, max_output_tokens=8)
        with pytest.raises(openai.NotFoundError) as lost:
            client(again).responses.create(model=smollm2.name, input="And mine?", previous_response_id=unstored.id)
    # The earlier turn is part of the prompt (more tokens than the question alone), and what the first
    # server evaluated of it came back from the disk instead of a prefill.
    assert follow.usage.input_tokens > stored.usage.input_tokens + 5
    assert follow.usage.input_tokens_details.cached_tokens >= stored.usage.input_tokens - 20, follow.usage
    assert lost.value.body["code"] == "previous_response_not_found"
