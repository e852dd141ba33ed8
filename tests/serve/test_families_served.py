"""Every family's own format through the real server: what a model of each family writes (the model made to write
it exactly, with a GBNF grammar of that text) comes back as structured tool calls, with the thinking apart and no
marker left in the content, whole and streamed, on /v1/chat/completions and Ollama's /api/chat; and a call forced
by tool_choice is written in the family's own format and read back.

What models of each family write, and what must be read from it, is llama.cpp's own (tests/test-chat.cpp, ported
into tests/data/llama_chat_cases.json): for each family, its cases of a call, two calls, a call after text, and
thinking then a call. Each family's template is put on a model by /api/create; the model is SmolLM2's tokenizer on
two layers of random weights (tests/tinymodel.py), since it is the reading that is tested, not the model."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from conftest import start_server

pytestmark = pytest.mark.slow

DATA = Path(__file__).resolve().parent.parent / "data"
TEMPLATES = DATA / "templates"
CASES = json.loads((DATA / "llama_chat_cases.json").read_text(encoding="utf-8"))["cases"]
USER = {"role": "user", "content": "Hey there!"}  # llama.cpp's message_user
SCENARIOS = ("call", "two calls", "text then call", "thinking then call")


def scenario(case: dict, thinks: bool):
    """Which scenario a case shows, or None (one that is not a plain reading of an answer to a fresh turn). A case
    that leaves thinking inline (llama.cpp's default, reasoning_format none) reads as the server reads by default
    only for a family that does not think."""
    e = case["expect"]
    inline = case["reasoning_format"] not in ("auto", "deepseek")
    if (case["continue_final_message"] or case["is_partial"] or case["json_schema"] is not None or case["tool_choice"] != "auto"
            or inline and thinks and _writes_thinking(case) or not e["tool_calls"] or not case["add_generation_prompt"]):
        return None
    if e["reasoning"]:  # (the model's own: not begun by the prompt, which the server does not send back)
        return "thinking then call" if e["reasoning"].strip() in case["input"] else None
    if e["content"].strip():
        return "text then call"
    return "two calls" if len(e["tool_calls"]) == 2 else ("call" if len(e["tool_calls"]) == 1 else None)


def _writes_thinking(case: dict) -> bool:
    """Whether the case's text holds a thinking block of its family's (left inline, it would read differently)."""
    from localrun.engine.formats import family_for

    markers = family_for((TEMPLATES / case["template"]).read_text(encoding="utf-8")).thinking
    return markers is not None and (markers.open == "" or any(m and m in case["input"] for m in (markers.open, markers.close)))


def chosen() -> dict[str, dict[str, dict]]:
    """For each family (one template each: the one with the most scenarios), a case per scenario."""
    from localrun.engine.formats import family_for

    by_template: dict[str, dict[str, dict]] = {}
    for case in CASES:
        thinks = family_for((TEMPLATES / case["template"]).read_text(encoding="utf-8")).thinking is not None
        kind = scenario(case, thinks)
        if kind is not None:
            by_template.setdefault(case["template"], {}).setdefault(kind, {**case, "thinks": thinks})
    families: dict[str, tuple[str, dict]] = {}
    for template, cases in sorted(by_template.items()):
        family = family_for((TEMPLATES / template).read_text(encoding="utf-8")).name
        if family not in families or len(cases) > len(families[family][1]):
            families[family] = (template, cases)
    return {f"{family} ({template.removesuffix('.jinja')})": cases for family, (template, cases) in sorted(families.items())}


FAMILIES = chosen()


def literal(text: str) -> str:
    """A GBNF grammar whose only sentence is `text`."""
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\r", "\\r").replace("\t", "\\t")
    return f'root ::= "{escaped}"'


def arguments(text) -> object:
    return json.loads(text) if isinstance(text, str) else text


def want(case: dict) -> tuple[str, str, list]:
    e = case["expect"]
    return e["content"].strip(), e["reasoning"].strip(), [(c["name"], arguments(c["arguments"])) for c in e["tool_calls"]]


SLOTS = 4  # a family's requests are sent at once, decoded together (each one's text is fixed by its grammar)
MERGES = 256  # the tiny model's vocabulary: SmolLM2's special tokens, bytes and first merges (tests/tinymodel.py)


@pytest.fixture(scope="module")
def server(smollm2, tmp_path_factory):
    from tinymodel import write_tiny_model

    where = tmp_path_factory.mktemp("tiny-families")
    tiny = write_tiny_model(smollm2, where / "tiny.gguf", (TEMPLATES / "Qwen-Qwen2.5-7B-Instruct.jinja").read_text(),
                            merges=MERGES)
    with start_server(None, where / "home", "--ctx", "16384", "--parallel", str(SLOTS)) as srv:
        srv.tiny = tiny
        yield srv


def _v1(http, model: str, case: dict, stream: bool) -> tuple[str, str, list]:
    body = {"model": model, "messages": case["messages"] or [USER], "tools": case["tools"], "temperature": 0, "max_tokens": 2400,
            "grammar": literal(case["input"]), "parallel_tool_calls": True, "stream": stream,
            "reasoning_format": "none" if case["reasoning_format"] == "none" else "auto",
            "chat_template_kwargs": {"enable_thinking": case["enable_thinking"]}}
    if not stream:
        r = http.post("/v1/chat/completions", json=body)
        assert r.status_code == 200, r.text
        m = r.json()["choices"][0]["message"]
        return ((m.get("content") or "").strip(), (m.get("reasoning_content") or "").strip(),
                [(c["function"]["name"], arguments(c["function"]["arguments"])) for c in m.get("tool_calls") or []])
    content, reasoning, calls = "", "", {}
    with http.stream("POST", "/v1/chat/completions", json=body) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            delta = json.loads(line[6:])["choices"][0]["delta"]
            content += delta.get("content") or ""
            reasoning += delta.get("reasoning_content") or ""
            for c in delta.get("tool_calls") or []:  # as the openai client assembles them
                call = calls.setdefault(c["index"], {"name": "", "arguments": ""})
                call["name"] = c["function"].get("name") or call["name"]
                call["arguments"] += c["function"].get("arguments") or ""
    return content.strip(), reasoning.strip(), [(c["name"], arguments(c["arguments"])) for _, c in sorted(calls.items())]


def _ollama(http, model: str, case: dict, stream: bool) -> tuple[str, str, list]:
    body = {"model": model, "messages": case["messages"] or [USER], "tools": case["tools"], "stream": stream,
            "options": {"temperature": 0, "num_predict": 2400, "grammar": literal(case["input"])}}
    if case.get("thinks"):  # (Ollama refuses think for a model that does not think)
        body["think"] = case["enable_thinking"]
    if not stream:
        r = http.post("/api/chat", json=body)
        assert r.status_code == 200, r.text
        m = r.json()["message"]
        return (m.get("content") or "").strip(), (m.get("thinking") or "").strip(), [
            (c["function"]["name"], c["function"]["arguments"]) for c in m.get("tool_calls") or []]
    content, thinking, calls = "", "", []
    with http.stream("POST", "/api/chat", json=body) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            m = json.loads(line).get("message") or {}
            content += m.get("content") or ""
            thinking += m.get("thinking") or ""
            calls += [(c["function"]["name"], c["function"]["arguments"]) for c in m.get("tool_calls") or []]
    return content.strip(), thinking.strip(), calls


def test_the_families_covered():
    """Every family localrun reads tool calls of has its cases here (a family with none would pass unseen)."""
    names = {name.split(" ")[0] for name in FAMILIES}
    assert {"hermes", "qwen3-coder", "gpt-oss", "deepseek-v3.1", "deepseek-v3.2", "kimi-k2", "glm-4", "gemma4", "minimax-m2",
            "lfm2", "mistral", "ministral-3", "command-r7b", "functionary-v3.1", "functionary-v3.2", "apertus", "nemotron-v2",
            "seed-oss"} <= names, sorted(names)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_what_each_family_writes_comes_back_as_calls(server, family):
    cases = FAMILIES[family]
    template = (TEMPLATES / next(iter(cases.values()))["template"]).read_text(encoding="utf-8")
    model = "family-" + family.split(" ")[0]
    with httpx.Client(base_url=server.url, timeout=300) as http:
        made = http.post("/api/create", json={"model": model, "from": str(server.tiny), "template": template, "stream": False})
        assert made.status_code == 200, made.text
        try:
            asked = [(kind, case, way, read, stream) for kind, case in cases.items()
                     for way, read in (("/v1", _v1), ("/api/chat", _ollama)) for stream in (False, True)]
            with ThreadPoolExecutor(SLOTS) as pool:
                answers = [pool.submit(read, http, model, case, stream) for _, case, _, read, stream in asked]
                for (kind, case, way, _, stream), answer in zip(asked, answers):
                    got, expected = answer.result(), want(case)
                    assert got == expected, f"{kind} ({case['id']}) on {way}{' streamed' if stream else ''}: {got} != {expected}"
        finally:
            http.request("DELETE", "/api/delete", json={"model": model})


FORCED = ["Qwen-Qwen2.5-7B-Instruct", "Qwen3-Coder", "openai-gpt-oss-120b", "deepseek-ai-DeepSeek-V3.1", "moonshotai-Kimi-K2",
          "GLM-4.6", "MiniMax-M2", "mistralai-Mistral-Nemo-Instruct-2407", "unsloth-mistral-Devstral-Small-2507",
          "deepseek-ai-DeepSeek-V3.2", "NVIDIA-Nemotron-Nano-v2", "CohereForAI-c4ai-command-r7b-12-2024-tool_use", "Apertus-8B-Instruct"]
WEATHER = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 12}, "days": {"type": "integer", "minimum": 1, "maximum": 9}},
    "required": ["city", "days"], "additionalProperties": False}}}]


@pytest.mark.parametrize("name", FORCED)
def test_a_forced_call_is_written_in_the_familys_own_format(server, name):
    """tool_choice required: the grammar holds the family's own markers around the arguments (what a real model of
    the family was trained to write), and the call comes back structured, whole and streamed."""
    import jsonschema

    model = "forced-" + name.lower()[:40]
    with httpx.Client(base_url=server.url, timeout=300) as http:
        made = http.post("/api/create", json={"model": model, "from": str(server.tiny), "stream": False,
                                              "template": (TEMPLATES / f"{name}.jinja").read_text(encoding="utf-8")})
        assert made.status_code == 200, made.text
        try:
            body = {"model": model, "messages": [{"role": "user", "content": "Weather in Paris for 3 days?"}], "tools": WEATHER,
                    "tool_choice": {"type": "function", "function": {"name": "get_weather"}}, "temperature": 0, "max_tokens": 300,
                    "chat_template_kwargs": {"enable_thinking": False}}
            r = http.post("/v1/chat/completions", json=body)
            assert r.status_code == 200, r.text
            choice = r.json()["choices"][0]
            assert choice["finish_reason"] == "tool_calls", choice
            [call] = choice["message"]["tool_calls"]
            assert call["function"]["name"] == "get_weather" and not choice["message"].get("content")
            jsonschema.validate(json.loads(call["function"]["arguments"]), WEATHER[0]["function"]["parameters"])
            chunks = []
            with http.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as streamed:
                for line in streamed.iter_lines():
                    if line.startswith("data: {"):
                        chunks.append(json.loads(line[6:])["choices"][0]["delta"])
            pieces = [c for d in chunks for c in d.get("tool_calls") or []]
            assert pieces[0]["function"]["name"] == "get_weather" and not "".join(d.get("content") or "" for d in chunks)
            assert "".join(p["function"].get("arguments") or "" for p in pieces) == call["function"]["arguments"]
        finally:
            http.request("DELETE", "/api/delete", json={"model": model})
