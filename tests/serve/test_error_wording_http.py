"""What an error names, each HTTP dialect words as its requests name it: a batch too small for the server's 4 slots
(runtime.options.check_slots: a SettingError on batch whose reason names batch and parallel) reads
options.num_batch and options.num_parallel to OpenAI's clients (their `options` set both), the field at fault
options.num_batch, where the command line reads --parallel and --batch (tests/cli/test_error_wording.py); Ollama's
requests cannot set num_parallel (its dialect ignores it), so they read the server's --parallel; dialects whose
requests set no load option (Anthropic's, llama-server's) name the server's flags. A real `localrun serve` with the real
SmolLM2; Ollama's /api/generate by httpx, the real OpenAI client."""

from __future__ import annotations

import httpx
import openai
import pytest

from conftest import start_server
from localrun.errors import SettingError
from localrun.runtime.options import check_slots
from localrun.serve.dialects import anthropic, llama
from localrun.serve.errors import LoadFailed, fault

pytestmark = pytest.mark.slow

TOO_MANY_SLOTS = {"num_batch": 2}  # for the server's 4 slots
SAID = ("invalid options.num_batch 2: each step decodes a token of every sequence, so it must hold at least 4, one per"
        " slot (raise options.num_batch or lower options.num_parallel)")
OLLAMA_SAID = ("invalid options.num_batch 2: each step decodes a token of every sequence, so it must hold at least 4, one"
               " per slot (raise options.num_batch or lower the server's --parallel)")


@pytest.fixture(scope="module")
def server(smollm2, tmp_path_factory):
    srv = start_server(smollm2, tmp_path_factory.mktemp("wording-home"), "--ctx", "512")
    yield srv
    assert srv.stop() == 130


def test_each_dialect_names_the_settings_as_its_requests_set_them(server):
    name = httpx.get(server.url + "/api/tags", timeout=30).json()["models"][0]["name"]
    ollama = httpx.post(server.url + "/api/generate", json={"model": name, "prompt": "Hi", "stream": False,
                                                           "options": TOO_MANY_SLOTS}, timeout=60)
    assert (ollama.status_code, ollama.json()) == (400, {"error": OLLAMA_SAID})  # never options.num_parallel
    with pytest.raises(openai.BadRequestError) as refused:
        server.client(key="unused").chat.completions.create(model=name, messages=[{"role": "user", "content": "Hi"}],
                                                            max_tokens=4, extra_body={"options": TOO_MANY_SLOTS})
    assert refused.value.status_code == 400
    assert (refused.value.body["message"], refused.value.body["param"]) == (SAID, "options.num_batch")
    assert "--" not in refused.value.body["message"]
    # the server still answers (nothing was loaded for the refused request)
    answered = server.client(key="unused").chat.completions.create(model=name, messages=[{"role": "user", "content": "Hi"}],
                                                                   max_tokens=2)
    assert answered.choices[0].message.content is not None


def test_a_dialect_without_load_options_names_the_servers_flags():
    """A load that fails by the server's own settings (a batch too small for its slots)."""
    with pytest.raises(SettingError) as refused:
        check_slots(2, 4)
    for dialect in (anthropic, llama):
        said = fault(LoadFailed(refused.value, "smol"), dialect.WORDING).message
        assert said == ("invalid the server's --batch 2: each step decodes a token of every sequence, so it must hold at"
                        " least 4, one per slot (raise the server's --batch or lower the server's --parallel)"), said
