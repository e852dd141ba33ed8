"""llama-server's fields on OpenAI's endpoints, without a model: a request's `lora` scales (made against the model's
adapters where the request becomes the runtime's; a bad one a 400 naming lora), and system_fingerprint in answers
and in every chunk of a stream."""

from __future__ import annotations

import json

import pytest

from dialect_fakes import FakeFacts, canned, final, sse_data, written

from localrun.runtime.lora import LoraRequestError
from localrun.serve.dialects import openai
from localrun.serve.errors import Refused
from localrun.serve.prepare import prepared
from localrun.serve.stream import Event


class WithAdapters(FakeFacts):
    """A model's facts with two LoRA adapters at default scales 1 and 0.5 (runtime.lora's rules, by hand)."""

    def lora_scales(self, entries):
        if not isinstance(entries, list):
            raise LoraRequestError(entries, 'give a list of {"id": N, "scale": X}')
        if not entries:
            return (1.0, 0.5)
        scales = [0.0, 0.0]
        for e in entries:
            if e.get("id") not in (0, 1):
                raise LoraRequestError(entries, "this model has 2 LoRA adapters (ids 0..1)")
            scales[e["id"]] = float(e["scale"])
        return tuple(scales)


def asked_of(body: dict):
    return openai.completion_asked(openai.parse_body(json.dumps(body).encode(), openai.CompletionBody))


def test_a_request_s_lora_becomes_the_runtime_request_s_scales():
    asked = asked_of({"prompt": "x", "lora": [{"id": 1, "scale": 0.25}]})
    assert asked.lora == [{"id": 1, "scale": 0.25}]
    request, _ = prepared(asked, WithAdapters())
    assert request.lora == (0.0, 0.25)
    assert prepared(asked_of({"prompt": "x"}), WithAdapters())[0].lora is None  # the model's own scales


@pytest.mark.parametrize("lora", [[{"id": 7, "scale": 1}], {"id": 0}])
def test_a_bad_lora_is_a_400_naming_it(lora):
    with pytest.raises((LoraRequestError, Refused)) as caught:  # (not a list: the body's own check)
        prepared(asked_of({"prompt": "x", "lora": lora}), WithAdapters())
    status, body = openai.error_answer(caught.value)
    assert status == 400 and body["error"]["param"] == "lora" and "lora" in body["error"]["message"]


def test_system_fingerprint_in_the_answer_and_every_chunk():
    answer = openai.completion("id", True, "m", "hi", final(), fingerprint="b1-abc")
    assert answer["system_fingerprint"] == "b1-abc"
    chunks = sse_data(written(openai.sse(canned(Event("text", "hi"), Event("done", final=final())), "id", True, False, "m",
                                         fingerprint="b1-abc")))
    assert [c["system_fingerprint"] for c in chunks if isinstance(c, dict)] == ["b1-abc"] * 3


def test_apply_template_takes_add_generation_prompt_and_nothing_else_new():
    body, opened = openai.template_body(b'{"messages": [{"role": "user", "content": "hi"}], "add_generation_prompt": false}')
    assert opened is False and body.messages[0].content == "hi"
    assert openai.template_body(b'{"messages": [{"role": "user", "content": "hi"}]}')[1] is True
    for raw, field in ((b'{"messages": [], "add_generation_prompt": "no"}', "add_generation_prompt"),
                       (b'{"messages": [{"role": "user", "content": "hi"}], "echo": true}', "echo")):
        with pytest.raises(Refused) as caught:
            openai.template_body(raw)
        status, answer = openai.error_answer(caught.value)
        assert status == 400 and answer["error"]["param"] == field, answer
