"""Ollama's /api/create and /api/copy against a real server with the real SmolLM2: a made model is listed
whether loaded or not, answers by its name on every dialect with its own system prompt, first messages and
parameters (token for token what the file answers when a request gives them itself), survives the model
it was made from being deleted, and every refusal is Ollama's {"error"} with a 4xx."""

from __future__ import annotations

import json

import httpx
import pytest

from conftest import run_cli, start_server, wait_until

pytestmark = pytest.mark.slow

SYSTEM = "You are terse."
FIRST = [{"role": "user", "content": "Say hello."}, {"role": "assistant", "content": "Hello."}]
QUESTION = {"role": "user", "content": "Name a colour."}


@pytest.fixture(scope="module")
def server(smollm2, tmp_path_factory):
    with start_server(None, tmp_path_factory.mktemp("home"), "--ctx", "1024", "--parallel", "1") as srv:
        yield srv


def test_a_created_model_answers_by_its_name_with_its_own_defaults(server, smollm2):
    with httpx.Client(base_url=server.url, timeout=300) as http:
        made = http.post("/api/create", json={"model": "terse", "from": str(smollm2), "system": SYSTEM, "messages": FIRST,
                                              "parameters": {"temperature": 0, "num_predict": 12, "stop": ["\n\n"]}})
        assert made.status_code == 200, made.text
        statuses = [json.loads(line)["status"] for line in made.text.splitlines()]
        assert statuses[-1] == "success" and len(statuses) > 1  # streamed, as Ollama's create answers

        names = [m["name"] for m in http.get("/api/tags").json()["models"]]
        assert "terse:latest" in names  # listed before anything loads it, tagged as Ollama lists it
        from langchain_ollama import ChatOllama  # its check of a model's name, by either (it found no terse:latest)

        for name in ("terse", "terse:latest"):
            ChatOllama(model=name, base_url=server.url, validate_model_on_init=True)
        assert "terse" in [m["id"] for m in http.get("/v1/models").json()["data"]]

        ours = http.post("/api/chat", json={"model": "terse", "messages": [QUESTION], "stream": False}).json()
        theirs = http.post("/api/chat", json={"model": str(smollm2), "stream": False,
                                              "messages": [{"role": "system", "content": SYSTEM}, *FIRST, QUESTION],
                                              "options": {"temperature": 0, "num_predict": 12, "stop": ["\n\n"]}}).json()
        assert ours["message"]["content"] == theirs["message"]["content"] and ours["message"]["content"]
        assert ours["prompt_eval_count"] == theirs["prompt_eval_count"]  # the system prompt and first messages are in it
        assert ours["model"] == "terse"

        v1 = http.post("/v1/chat/completions", json={"model": "terse:latest", "messages": [QUESTION]}).json()
        assert v1["choices"][0]["message"]["content"] == ours["message"]["content"]  # its parameters on /v1 too
        assert v1["usage"]["prompt_tokens"] == ours["prompt_eval_count"]

        loaded = {m["name"] for m in http.get("/api/ps").json()["models"]}
        assert {"terse:latest", smollm2.name} <= loaded  # one file, two models: neither answers for the other

        stopped = run_cli("stop", "terse:latest", "--port", str(server.port))  # the name ps lists
        assert stopped.returncode == 0 and "unloaded terse" in stopped.stderr, stopped.stderr
        wait_until(lambda: "terse:latest" not in {m["name"] for m in http.get("/api/ps").json()["models"]}, what="terse to unload")
        # from: the name a model served by path is listed by (its file name), as /api/copy takes it
        by_name = http.post("/api/create", json={"model": "terse3", "from": smollm2.name, "system": SYSTEM, "stream": False})
        assert by_name.status_code == 200, by_name.text
        assert http.post("/api/show", json={"model": "terse3"}).json()["system"] == SYSTEM

        assert http.post("/api/copy", json={"source": "terse", "destination": "terse2"}).status_code == 200
        card = http.post("/api/show", json={"model": "terse2"}).json()
        assert card["system"] == SYSTEM and "PARAMETER temperature 0" in card["modelfile"]
        assert "PARAMETER num_predict 12" in card["modelfile"] and card["messages"] == FIRST
        # parameters as Ollama writes them: its names, one line per stop, strings quoted (it was max_tokens 12 and a
        # Python list: found by a helper)
        assert sorted(line.split(None, 1) for line in card["parameters"].splitlines()) == [
            ["num_predict", "12"], ["stop", '"\\n\\n"'], ["temperature", "0"]], card["parameters"]

        assert http.request("DELETE", "/api/delete", json={"model": "terse"}).status_code == 200
        names = [m["name"] for m in http.get("/api/tags").json()["models"]]
        assert "terse:latest" not in names and "terse2:latest" in names and smollm2.exists()  # the file is the user's: kept
        again = http.post("/api/chat", json={"model": "terse2", "messages": [QUESTION], "stream": False}).json()
        assert again["message"]["content"] == ours["message"]["content"]

        # An older client's Modelfile text, not streamed.
        old = http.post("/api/create", json={"name": "terse3", "modelfile": "FROM terse2\nPARAMETER num_predict 3\n", "stream": False})
        assert old.status_code == 200 and old.json() == {"status": "success"}
        short = http.post("/api/generate", json={"model": "terse3", "prompt": QUESTION["content"], "stream": False}).json()
        assert short["eval_count"] <= 3


@pytest.mark.parametrize("path, body, status, words", [
    ("/api/create", {"model": "x", "from": "nosuchmodel"}, 404, "nosuchmodel"),
    ("/api/create", {"model": "x", "from": "SMOL", "parameters": {"temperature": "hot"}}, 400, "PARAMETER temperature"),
    ("/api/create", {"model": "x", "from": "SMOL", "adapters": {"lora.gguf": "sha256:00"}}, 400, "adapters"),
    ("/api/create", {"model": "x", "files": {"m.gguf": "sha256:00"}}, 400, "files"),
    ("/api/create", {"model": "x"}, 400, "from"),
    ("/api/create", {"model": "x", "modelfile": "FROM SMOL\nWARMTH 3\n"}, 400, "Modelfile line 2"),
    ("/api/create", {"model": "smollm2", "from": "SMOL"}, 400, "catalogue alias"),
    ("/api/copy", {"source": "nosuchmodel", "destination": "y"}, 404, "nosuchmodel"),
    ("/api/copy", {"source": "SMOL"}, 400, "destination"),
])
def test_what_cannot_be_made_is_ollamas_error_shape(server, smollm2, path, body, status, words):
    body = json.loads(json.dumps(body).replace("SMOL", str(smollm2)))
    answer = httpx.post(server.url + path, json=body, timeout=60)
    assert answer.status_code == status, answer.text
    assert words in answer.json()["error"], answer.text


def test_a_damaged_registry_leaves_the_model_lists_answering(smollm2, tmp_path):
    """models.json damaged (a crash of another tool, a bad edit): /v1/models and /api/tags still list what the
    server serves, with a warning in its log, where they were a plain-text 500 (a helper's reliability run)."""
    (tmp_path / "models.json").write_text('{"pirate": {"name": "pir')
    with start_server(smollm2, tmp_path, "--ctx", "512", "--parallel", "1") as srv:
        with httpx.Client(base_url=srv.url, timeout=60) as http:
            v1, tags = http.get("/v1/models"), http.get("/api/tags")
        assert v1.status_code == 200 and [m["id"] for m in v1.json()["data"]] == [smollm2.name], v1.text
        assert tags.status_code == 200 and [m["name"] for m in tags.json()["models"]] == [smollm2.name], tags.text
        wait_until(lambda: any("warning: the pulled models are left out of the model list" in line and "models.json is damaged" in line
                               for line in srv.stderr), what="the warning")
        assert not any("Traceback" in line for line in srv.stderr)
