"""The one drop-oldest policy (runtime.request._drop_oldest), as the request path applies it to a conversation a
client sends whole each time (Ollama's /api/chat) on the real SmolLM2's template and tokenizer: the turns kept
start at the same message from one request to the next until the conversation has grown by half the answer's
room again, so each prompt extends the last and its KV prefix is reused."""

from __future__ import annotations

import pytest

from localrun.engine import Engine, LoadOptions, SamplingOptions
from localrun.runtime.request import Request, prompt_for, prompt_room

N_CTX = 256
ANSWER = "The number is prime, and it appears in many old stories about luck and fortune."


@pytest.fixture(scope="module")
def engine(smollm2):
    e = Engine(smollm2, LoadOptions(n_ctx=N_CTX, n_threads=1))
    yield e
    e.close()


def test_a_growing_conversation_keeps_its_first_message_between_drops(engine):
    sampling = SamplingOptions(max_tokens=32)
    keep = prompt_room(N_CTX, sampling.max_tokens)
    conversation = [{"role": "system", "content": "Be brief."}]
    starts, prompts = [], []
    for n in range(1, 16):
        conversation.append({"role": "user", "content": f"Tell me one fact about the number {n}."})
        prompt = prompt_for(engine, Request(messages=list(conversation), sampling=sampling, drop_oldest=True))
        assert len(prompt.tokens) <= keep  # the answer keeps its room
        kept = prompt.messages
        assert kept[0] == conversation[0] and kept[1]["role"] == "user" and kept[-1] == conversation[-1]
        assert prompt.dropped == len(conversation) - len(kept) and kept == [conversation[0], *conversation[prompt.dropped + 1:]]
        starts.append(prompt.dropped)
        prompts.append(prompt.tokens)
        conversation.append({"role": "assistant", "content": ANSWER})
    moves = [i for i in range(1, len(starts)) if starts[i] != starts[i - 1]]
    assert starts[0] == 0 and moves  # it did outgrow the context
    for i in moves:  # a drop takes a block of at least half the room (the fewest that fit would move every turn)
        assert starts[i] - starts[i - 1] >= 4  # two turns or more (a turn here is two messages of ~26 tokens each)
    assert all(b - a > 1 for a, b in zip(moves, moves[1:]))
    for i in range(1, len(starts)):
        if i not in moves:  # the same start: the prompt goes on from the last one
            assert prompts[i][:len(prompts[i - 1])] == prompts[i - 1]


def test_a_conversation_that_fits_is_sent_whole(engine):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Name a colour."}]
    prompt = prompt_for(engine, Request(messages=messages, sampling=SamplingOptions(max_tokens=32), drop_oldest=True))
    assert prompt.dropped == 0 and prompt.messages == messages
