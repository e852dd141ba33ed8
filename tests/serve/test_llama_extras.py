"""What llama-server's clients ask beyond its endpoints' basics, on `localrun serve` (SmolLM2 through real llama.cpp,
on loopback): `serve --alias` (the served model answers to other names and is listed by the first), /completion's
`post_sampling_probs`, /infill's `n_indent`."""

from __future__ import annotations

import httpx
import pytest

from conftest import run_cli, start_server

openai = pytest.importorskip("openai")
ollama = pytest.importorskip("ollama")

pytestmark = pytest.mark.slow
SMOL = "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="module")
def aliased(smollm2, tmp_path_factory):
    with start_server(smollm2, tmp_path_factory.mktemp("home"), "--alias", "tiny-2, smol", "--ctx", "1024",
                      "--parallel", "2") as srv:
        yield srv


def test_alias_is_what_the_model_is_listed_and_answers_by(aliased):
    """As llama-server's --alias: /v1/models lists the model once, by the first alias in order, with the others
    answering too; /props' model_alias; its own file name still names it."""
    client = aliased.client(key="none")
    assert [m.id for m in client.models.list().data] == ["smol"]
    props = httpx.get(aliased.url + "/props", timeout=60).json()
    assert props["model_alias"] == "smol"
    local = ollama.Client(host=aliased.url)
    assert [m.model for m in local.ps().models] == ["smol:latest"]  # as Ollama writes a name without a tag
    assert local.generate(model="smol:latest", prompt="Hi", options={"num_predict": 2}).response
    for name in ("smol", "tiny-2", "TINY-2", SMOL):
        answer = client.completions.create(model=name, prompt="The capital of France is", max_tokens=3, temperature=0)
        assert answer.model == name and answer.choices[0].text
    # no model named: llama-server's answer names the alias
    native = httpx.post(aliased.url + "/completion", json={"prompt": "Hi", "n_predict": 2}, timeout=120).json()
    assert native["model"] == "smol"
    # still one model loaded: the names are one load's
    assert len(local.ps().models) == 1


def test_alias_needs_the_model_it_names():
    result = run_cli("serve", "--alias", "smol", "--port", "0")
    assert result.returncode == 2 and "--alias" in result.stderr and "\n" not in result.stderr.strip()
    result = run_cli("serve", "x.gguf", "--alias", " , ", "--port", "0")
    assert result.returncode == 2 and "--alias" in result.stderr
