"""The model's own chat template renders every prompt, as llama.cpp's --jinja renders it: checked token for
token, through the request path every entry point takes (runtime.request.prompt_for), against a reference
rendering of the GGUF's template with the jinja2 package (Transformers' and llama.cpp's settings:
trim_blocks, lstrip_blocks, loopcontrols, tojson without ASCII escapes; a BOS the template writes left to the
tokenizer that adds one). llama.cpp's built-in renderers, used before for the templates they recognise,
left out what the template itself writes: Qwen's default system prompt, SmolLM2's."""

from __future__ import annotations

import json

import jinja2
import jinja2.ext
import jinja2.sandbox
import pytest

pytestmark = pytest.mark.slow

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
CONVERSATIONS = [
    [{"role": "user", "content": "Say hi"}],
    [{"role": "system", "content": "Answer in French."}, {"role": "user", "content": "Say hi"}],
    [{"role": "user", "content": "Say hi"}, {"role": "assistant", "content": "Hi! ünïcode ✓"}, {"role": "user", "content": "Again"}],
]
WITH_TOOLS = [
    [{"role": "user", "content": "Weather in Paris?"}],
    [{"role": "user", "content": "Weather in Paris?"},
     {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
     {"role": "tool", "tool_call_id": "c1", "name": "get_weather", "content": '{"sky": "clear"}'}],
]


def reference(engine, messages, tools=None) -> list[int]:
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = lambda x, indent=None, ensure_ascii=False, separators=None, sort_keys=False: json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)
    bos = engine.detokenize([engine.info.bos_token_id]) if engine.info.bos_token_id is not None else ""
    eos = engine.detokenize([engine.info.eos_token_id]) if engine.info.eos_token_id is not None else ""

    def raise_exception(message):
        raise ValueError(message)

    text = env.from_string(engine.chat_template).render(messages=messages, add_generation_prompt=True, bos_token=bos, eos_token=eos,
                                                         raise_exception=raise_exception, **({"tools": tools} if tools else {}))
    if bos and engine.add_bos and text.startswith(bos):
        text = text[len(bos):]
    return engine.tokenize(text, add_special=True, parse_special=True)


@pytest.mark.parametrize("which", ["smollm2", "qwen"])
def test_every_prompt_is_the_templates_own_rendering(which, request):
    from localrun.engine import Engine, LoadOptions
    from localrun.runtime.request import Request, prompt_for

    engine = Engine(request.getfixturevalue(which), LoadOptions(n_ctx=1024, n_threads=1))
    try:
        cases = [(m, None) for m in CONVERSATIONS] + ([(m, TOOLS) for m in WITH_TOOLS] if which == "qwen" else [])
        for messages, tools in cases:
            ours = prompt_for(engine, Request(messages=messages, tools=tools)).tokens
            assert ours == reference(engine, messages, tools), (messages, engine.detokenize(ours))
        said = engine.detokenize(prompt_for(engine, Request(messages=CONVERSATIONS[0])).tokens)
        default_system = {"smollm2": "You are a helpful AI assistant named SmolLM", "qwen": "You are Qwen, created by Alibaba Cloud"}[which]
        assert default_system in said  # what the template itself writes is there
        if which == "qwen":  # tools or not, the same system prompt and turns around them
            plain = engine.detokenize(prompt_for(engine, Request(messages=WITH_TOOLS[0])).tokens)
            tooled = engine.detokenize(prompt_for(engine, Request(messages=WITH_TOOLS[0], tools=TOOLS)).tokens)
            head, tail = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.", "user\nWeather in Paris?\nassistant\n"
            assert head in plain and head in tooled and plain.endswith(tail) and tooled.endswith(tail) and "# Tools" in tooled
    finally:
        engine.close()
