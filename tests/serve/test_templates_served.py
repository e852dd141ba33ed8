"""Every chat template of llama.cpp's collection through the real server: put on a model by /api/create (Ollama's
{"model", "from", "template"}), then a plain chat, a system prompt, tools offered, and a second turn carrying an
assistant's tool call (an OpenAI client's id) and its result, each a real /v1/chat/completions request. Each is
answered (200), or refused as a bad request (400) carrying the template's own message: never a server error.

The model under the templates is SmolLM2's tokenizer on two layers of random weights (tests/tinymodel.py): the
prompts are what is tested, not the answers, and SmolLM2's 30 layers would evaluate the 280 prompts (up to 1,500
tokens each) for half an hour on one core. Its tokenizer keeps SmolLM2's special tokens, bytes and first 256 merges
(write_tiny_model(merges=)): the same texts in more, shorter tokens (3,600 at most), and a vocabulary of 508 tokens
that loads in a tenth of the time of 49,152, each of the 70 times a template is put on it here and in llama-server."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from conftest import start_server
from llamaserver import LLAMA_SERVER, NO_LLAMA_SERVER, llama_server

pytestmark = pytest.mark.slow

TEMPLATES = Path(__file__).resolve().parent.parent / "data" / "templates"
NAMES = sorted(p.stem for p in TEMPLATES.glob("*.jinja"))

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                          "required": ["city"]}}}]
CALL_ID = "call_abc123DEF456ghi789JKL0"
USER = {"role": "user", "content": "Weather in Paris?"}
CASES = {
    "plain": ([USER], None),
    "system": ([{"role": "system", "content": "Answer in French."}, USER], None),
    "tools": ([USER], TOOLS),
    "tool turn": ([USER, {"role": "assistant", "content": None, "tool_calls": [
        {"id": CALL_ID, "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": CALL_ID, "content": '{"sky": "clear"}'}], TOOLS),
}
# The template's own refusal (its raise_exception), answered as a 400 with its message.
REFUSED = {("google-gemma-2-2b-it", "tool turn"): "Conversation roles must alternate"}


@pytest.fixture(scope="module")
def tiny(smollm2, tmp_path_factory) -> Path:
    from tinymodel import write_tiny_model

    where = tmp_path_factory.mktemp("tiny-templates")
    return write_tiny_model(smollm2, where / "tiny.gguf", (TEMPLATES / "Qwen-Qwen2.5-7B-Instruct.jinja").read_text(), merges=256)


@pytest.fixture(scope="module")
def server(tiny, tmp_path_factory):
    # --ctx 4096: the longest prompt (a template's tools) is 3,554 of the small vocabulary's tokens
    with start_server(None, tmp_path_factory.mktemp("templates-home"), "--ctx", "4096", "--parallel", "1") as srv:
        srv.tiny = tiny
        yield srv


def test_every_template_of_the_collection_answers_or_refuses_with_its_own_message(server):
    answered, refused = 0, []
    with httpx.Client(base_url=server.url, timeout=300) as http:
        for i, name in enumerate(NAMES):
            model = f"template-{i}"
            made = http.post("/api/create", json={"model": model, "from": str(server.tiny), "stream": False,
                                                  "template": (TEMPLATES / f"{name}.jinja").read_text()})
            assert made.status_code == 200, (name, made.text)
            prompt_tokens = {}
            for case, (messages, tools) in CASES.items():
                body = {"model": model, "messages": messages, "max_tokens": 1, "temperature": 0,
                        **({"tools": tools} if tools else {})}
                reply = http.post("/v1/chat/completions", json=body)
                if (name, case) in REFUSED:
                    assert reply.status_code == 400, (name, case, reply.text)
                    assert REFUSED[name, case] in reply.json()["error"]["message"], (name, case, reply.text)
                    refused.append((name, case))
                    continue
                assert reply.status_code == 200, (name, case, reply.text)
                prompt_tokens[case] = reply.json()["usage"]["prompt_tokens"]
                answered += 1
            assert prompt_tokens["system"] != prompt_tokens["plain"], name  # the template renders the request
            http.request("DELETE", "/api/delete", json={"model": model})  # unloaded, not kept beside the next 69
        # a template that is not Jinja: refused by /api/create in one line naming its line and the problem
        broken = http.post("/api/create", json={"model": "broken", "from": str(server.tiny), "stream": False,
                                                "template": "{% for m in messages %}\n{{ m.content }\n{% endfor %}"})
        assert broken.status_code == 400 and "line 2" in broken.json()["error"], broken.text
        assert "\n" not in broken.json()["error"]
    assert answered == 4 * len(NAMES) - len(REFUSED) and refused == list(REFUSED)
    assert "Traceback" not in "".join(server.stderr)


# What localrun renders otherwise than llama.cpp, on purpose:
DIFFERS = {
    # llama.cpp's analysis of this template fails at load ("Invalid message role"), which turns its thinking off by
    # default; localrun leaves it on, as for every template with a switch (its Deliberation)
    **{("Apertus-8B-Instruct", case): "thinking on" for case in
       ("plain", "system", "tools", "tool turn", "reasoning", "reasoning in loop", "developer")},
    # firefunction-v2 reads its tools as `functions`, which llama.cpp no longer passes (its own handler once did)
    **{("fireworks-ai-llama-3-firefunction-v2", case): "functions" for case in ("tools", "tool turn", "reasoning in loop")},
    # an OpenAI client's tool-call id: llama.cpp hands it to Mistral's templates, which refuse it (a 400); localrun
    # maps it to the 9 alphanumerics they take
    **{(name, case): "ids" for name in ("mistralai-Mistral-Nemo-Instruct-2407", "Mistral-Small-3.2-24B-Instruct-2506")
       for case in ("tool turn", "reasoning in loop")},
}
REFUSED_BY_BOTH = {("google-gemma-2-2b-it", "tool turn"), ("google-gemma-2-2b-it", "reasoning in loop")}


@pytest.mark.skipif(LLAMA_SERVER is None, reason=NO_LLAMA_SERVER)
def test_every_template_renders_as_llama_server_renders_it(tiny):
    """llama.cpp's own rendering (llama-server --jinja's /apply-template, the llama.cpp that llama-cpp-python
    vendors) of the same requests, text for text: its Jinja engine, the variables it passes, the messages as it
    shapes them for each template (arguments as objects or strings, developer as system, a system message the
    template has no role for merged, reasoning under each family's name). A system message in the middle of a
    conversation is compared where the template renders it in place (elsewhere llama.cpp drops it, hoists it to
    the top or refuses it; localrun puts it at the start of the next user message)."""
    import json

    from localrun.engine.prompt import render_template, template_caps
    from localrun.errors import TemplateError

    call = {"role": "assistant", "content": None, "tool_calls": [
        {"id": CALL_ID, "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]}
    result = {"role": "tool", "tool_call_id": CALL_ID, "content": '{"sky": "clear"}'}
    cases = {
        **{case: (messages, tools, {}) for case, (messages, tools) in CASES.items()},
        "reasoning": ([USER, {"role": "assistant", "content": "It is sunny.", "reasoning_content": "Reasoning-7Q"},
                       {"role": "user", "content": "Thanks"}], None, {}),
        "reasoning in loop": ([USER, {**call, "reasoning_content": "Reasoning-7Q"}, result], TOOLS, {}),
        "thinking off": ([USER], None, {"enable_thinking": False}),
        "developer": ([{"role": "developer", "content": "Be brief."}, USER], None, {}),
        "system in place": ([{"role": "system", "content": "Be terse."}, USER, {"role": "assistant", "content": "Sunny."},
                             {"role": "system", "content": "Be kind."}, {"role": "user", "content": "Thanks"}], None, {}),
    }
    compared, differing = 0, []
    for name in NAMES:
        text = (TEMPLATES / f"{name}.jinja").read_text()
        # (the tiny model: SmolLM2's BOS, EOS and special tokens, loaded in a fraction of SmolLM2's time, 70 times)
        with llama_server(tiny, "--chat-template-file", str(TEMPLATES / f"{name}.jinja"), "--jinja", "-c", "512",
                          "-np", "1") as http:
            props = http.get("/props").json()
            bos, eos = props["bos_token"], props["eos_token"]
            for case, (messages, tools, kwargs) in cases.items():
                if case == "system in place" and not template_caps(text).system_in_place:
                    continue
                body = {"messages": messages, **({"tools": tools} if tools else {}),
                        **({"chat_template_kwargs": kwargs} if kwargs else {})}
                reply = http.post("/apply-template", json=body)
                theirs = reply.json()["prompt"].removeprefix(bos) if reply.status_code == 200 else None
                ours_messages = json.loads(json.dumps(messages))
                try:
                    ours = render_template(text, ours_messages, tools=tools, bos_token=bos, eos_token=eos, **kwargs)
                    ours = ours.removeprefix(bos)
                except TemplateError:
                    ours = None
                if (name, case) in REFUSED_BY_BOTH:
                    assert ours is None and theirs is None, (name, case)
                elif (name, case) in DIFFERS:
                    assert ours is not None and ours != theirs, (name, case)
                    differing.append((name, case))
                else:
                    assert ours == theirs, (name, case, ours, theirs)
                    compared += 1
    assert sorted(differing) == sorted(DIFFERS)
    assert compared > 500  # 70 templates, 9 cases, less the differences and where llama.cpp has no mid-conversation system
