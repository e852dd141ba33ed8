"""Every request a real Open WebUI 0.12.4 sent to `localrun serve` in one session (both of its connections:
Ollama's /api and OpenAI's /v1), replayed in order against a real server with the real SmolLM2, each answer
checked as Open WebUI reads it: the status, NDJSON or SSE whole and in shape, `expires_at` a date, the
listed names the ones it may send, a continued message that continues.

The recordings (tests/data/clients/open-webui-0.12.4/*.jsonl: method, path, body, and the status localrun
gave then) named the models of that session. Most requests check what surrounds an answer, not its words: they
are mapped to the tiny model (tests/tinymodel.py: SmolLM2's tokenizer and chat template on two layers of random
weights, so every prompt counts the tokens it counted with SmolLM2 and fits the same context), pulled from the
Hub stand-in as REF and named on the command line (so pinned, as that session's was). The three "Continue
response" requests check words (the answer goes on from the partial one): they go to the real SmolLM2, pulled
as SMOL and loaded beside it. The one delete is mapped to a second copy pulled for it, so that the requests after
it still have their model.
"""

from __future__ import annotations

import json
from datetime import datetime

import httpx
import pytest

from conftest import OPEN_WEBUI_RECORDINGS, start_server
from hubstub import StubFile, hub_stub  # noqa: F401 - hub_stub is a fixture

pytestmark = pytest.mark.slow

RECORDINGS = OPEN_WEBUI_RECORDINGS
REF = "test/Tiny-GGUF:F16"  # the tiny model: every request but the continued answers
SMOL = "test/SmolLM2-GGUF:Q4_1"  # the real SmolLM2: the continued answers, whose words are checked
SPARE = "test/Spare-GGUF:F16"  # what the recorded delete removes

SERVER_CAP = 16  # serve's -n: the cap on an answer whose request sets none
LONGEST_CAP = 96  # the longest cap a recorded chat request sets (the title task's 1000 is brought to SERVER_CAP)

# What Ollama itself answers where the recording's request cannot succeed: `think` asked of a model that
# does not think (400, as Ollama's).
EXPECTED_STATUS: dict = {}


def recorded() -> list[tuple[str, int, dict]]:
    calls = []
    for name in ("ollama-api.jsonl", "openai-api.jsonl"):
        for i, line in enumerate((RECORDINGS / name).read_text().splitlines()):
            calls.append((name, i, json.loads(line)))
    return calls


def mapped(call: dict) -> dict:
    body = call["body"]
    if not isinstance(body, dict):
        return body
    body = dict(body)
    if call["path"] == "/api/create":  # the new model keeps its name; it is made from this test's model
        return {**body, "from": REF}
    model = SPARE if call["path"] == "/api/delete" else SMOL if _continued(body) else REF
    for key in ("model", "name"):
        if key in body:
            body[key] = model
    # Open WebUI's title task asks for up to 1000 tokens, where a model can ramble for seconds a request: such a
    # cap is brought down to the server's own -n (below), as for the requests that set none. Caps of up to 96
    # (its chats) go as recorded.
    if isinstance(body.get("max_tokens"), int) and body["max_tokens"] > LONGEST_CAP:
        body["max_tokens"] = SERVER_CAP
    options = body.get("options")
    if isinstance(options, dict) and isinstance(options.get("num_predict"), int) and options["num_predict"] > LONGEST_CAP:
        body["options"] = {**options, "num_predict": SERVER_CAP}
    return body


def _continued(body: dict) -> bool:
    """Open WebUI's "Continue response": the partial answer is the last message."""
    messages = body.get("messages") or []
    return bool(messages and isinstance(messages[-1], dict) and messages[-1].get("role") == "assistant" and messages[-1].get("content"))


def expected_status(call: dict, body) -> int:
    if isinstance(body, dict) and body.get("think"):
        return 400  # SmolLM2 does not think: Ollama answers 400 '"MODEL" does not support thinking'
    if isinstance(body, dict) and body.get("tools") and call["path"] == "/api/chat":
        return 400  # nor call tools (its template has none): Ollama answers 400 'MODEL does not support tools'
    return EXPECTED_STATUS.get((call["method"], call["path"]), 200)


@pytest.fixture
def served(hub_stub, smollm2, cli, tmp_path):
    from tinymodel import write_tiny_model

    tiny = write_tiny_model(smollm2, tmp_path / "tiny.F16.gguf")  # SmolLM2's tokenizer and template
    hub_stub.stub.add_repo("test/SmolLM2-GGUF", [StubFile(smollm2.name, smollm2.read_bytes())])
    for repo in ("test/Tiny-GGUF", "test/Spare-GGUF"):
        hub_stub.stub.add_repo(repo, [StubFile(tiny.name, tiny.read_bytes())])
    for ref in (REF, SMOL, SPARE):
        assert cli("pull", ref).returncode == 0
    # -n 16: a server's own cap on an answer whose request sets none (Open WebUI's chats and its title and
    # follow-up tasks); the requests go as recorded (16 tokens are enough to see a continued answer continue).
    # --threads 2: the replay sends one request at a time and only waits for it.
    with start_server(REF, hub_stub.home, "--parallel", "2", "--ctx", "1024", "-n", str(SERVER_CAP), threads=2) as srv:
        yield srv


def test_every_recorded_request_is_answered_as_open_webui_reads_it(served):
    assert RECORDINGS.is_dir(), RECORDINGS
    calls = recorded()
    assert len(calls) > 100
    seen_paths = set()
    with httpx.Client(base_url=served.url, timeout=600) as http:
        for source, i, call in calls:
            where = f"{source}:{i + 1} {call['method']} {call['path']}"
            body = mapped(call)
            want = expected_status(call, body)
            streamed = _streams(call["path"], body)
            request = http.build_request(call["method"], call["path"], json=body if body is not None else None)
            response = http.send(request, stream=True)
            try:
                raw = response.read().decode()
            finally:
                response.close()
            assert response.status_code == want, f"{where}: {response.status_code} {raw[:500]}"
            seen_paths.add(call["path"])
            if want != 200:
                error = json.loads(raw)["error"]
                assert isinstance(error, (str, dict)) and error, where  # Ollama's {"error": "..."}; OpenAI's object
                continue
            _check(http, call["path"], body, raw, streamed, where)
    assert {"/api/chat", "/api/ps", "/api/tags", "/v1/chat/completions", "/api/pull", "/api/delete", "/api/create"} <= seen_paths


def _streams(path: str, body) -> bool:
    if not isinstance(body, dict):
        return False
    if path.startswith("/api/"):
        return body.get("stream", True) is not False and path in ("/api/chat", "/api/generate", "/api/pull")
    return bool(body.get("stream"))


def _check(http: httpx.Client, path: str, body, raw: str, streamed: bool, where: str) -> None:
    if path == "/api/version":
        version = json.loads(raw)["version"]
        assert tuple(int(p) for p in version.split(".")) >= (0, 13, 4), f"{where}: {version}"  # what Codex and others need
    elif path == "/api/tags":
        models = json.loads(raw)["models"]
        assert REF in [m["name"] for m in models], where
        for m in models:
            assert m["name"] == m["model"] and m["details"]["format"] == "gguf" and m["size"] > 0, where
            datetime.fromisoformat(m["modified_at"])
    elif path == "/api/ps":
        models = json.loads(raw)["models"]
        listed = {m["name"] for m in json.loads(http.get("/api/tags").text)["models"]}
        for m in models:
            # Open WebUI shows "unloads in ..." and the eject control from expires_at, parsed as a date
            assert isinstance(m["expires_at"], str) and datetime.fromisoformat(m["expires_at"]), where
            assert m["name"] == m["model"] and m["name"] in listed, where  # the name it may send
    elif path in ("/api/chat", "/api/generate"):
        chat = path == "/api/chat"
        lines = [json.loads(line) for line in raw.splitlines() if line.strip()] if streamed else [json.loads(raw)]
        assert lines and all("error" not in obj for obj in lines), f"{where}: {raw[-500:]}"
        last = lines[-1]
        assert last["done"] is True and all(obj["done"] is False for obj in lines[:-1]), where
        assert all(obj["model"] == body["model"] for obj in lines), where  # the name it sent, echoed
        datetime.fromisoformat(last["created_at"])
        if last["done_reason"] in ("load", "unload"):
            return
        assert last["done_reason"] in ("stop", "length") and last["eval_count"] >= 0 and last["prompt_eval_count"] > 0, where
        _continues(body, "".join(obj["message"]["content"] if chat else obj["response"] for obj in lines), where)
    elif path == "/api/pull":
        lines = [json.loads(line) for line in raw.splitlines() if line.strip()]
        assert lines[-1] == {"status": "success"}, where
    elif path == "/api/create":  # Open WebUI's "create a model": listed at once, and it answers with its system prompt
        lines = [json.loads(line) for line in raw.splitlines() if line.strip()]
        assert lines[-1] == {"status": "success"}, where
        assert body["model"] + ":latest" in [m["name"] for m in json.loads(http.get("/api/tags").text)["models"]], where  # as Ollama lists it
        shown = http.post("/api/show", json={"model": body["model"]}).json()
        assert shown["system"] == body["system"], where
    elif path == "/api/show":
        shown = json.loads(raw)
        assert shown["details"]["format"] == "gguf" and "<|im_start|>" in shown["template"], where
    elif path == "/v1/models":
        ids = [m["id"] for m in json.loads(raw)["data"]]
        assert REF in ids, where
    elif path == "/v1/chat/completions":
        if streamed:
            events = [line.removeprefix("data: ") for line in raw.splitlines() if line.startswith("data: ")]
            assert events[-1] == "[DONE]", where
            chunks = [json.loads(e) for e in events[:-1]]
            assert all(c["object"] == "chat.completion.chunk" and c["model"] == body["model"] for c in chunks), where
            assert chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length"), where
            _continues(body, "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]), where)
        else:
            answer = json.loads(raw)
            assert answer["model"] == body["model"] and isinstance(answer["choices"][0]["message"]["content"], str), where
            _continues(body, answer["choices"][0]["message"]["content"], where)


def _continues(body: dict, text: str, where: str) -> None:
    """Open WebUI's "Continue response" sends the partial answer last and appends what comes back: the answer
    goes on from it (SmolLM2, greedy, counts on: "1, 2, 3, 4, 5, 6," -> " 7, 8, ..."), not from the start."""
    if not _continued(body):
        return
    assert body["model"] == SMOL, where  # (a real model's words)
    partial = body["messages"][-1]["content"]
    assert not text.strip().startswith(partial.strip()[:12]), f"{where}: started again: {text!r}"
    if partial.endswith("6,"):
        assert text.startswith(" 7, 8"), f"{where}: {text!r}"
