"""What llama-server's clients ask beyond its endpoints' basics, on `localrun serve` (SmolLM2 through real llama.cpp,
on loopback): `serve --alias` (the served model answers to other names and is listed by the alphabetically first),
/completion's
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
    """As llama-server's --alias: /v1/models lists the model once, by the alphabetically first alias, with the
    others answering too; /props' model_alias; its own file name still names it."""
    client = aliased.client(key="none")
    assert [m.id for m in client.models.list().data] == ["smol"]
    assert client.models.list().data[0].aliases == ["smol", "tiny-2"]  # all of them, sorted, as llama-server's
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


def test_answers_to_a_request_naming_no_model_name_the_alias(aliased):
    """Every dialect's answer says the model it came from by the name the server lists it by: the alias (the
    request's own name where it gave one, as OpenAI echoes it)."""
    asks = {"/v1/chat/completions": {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2},
            "/v1/completions": {"prompt": "Hi", "max_tokens": 2},
            "/v1/messages": {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2},
            "/v1/responses": {"input": "Hi", "max_output_tokens": 2},
            "/v1/embeddings": {"input": "Hi"}}
    for path, body in asks.items():
        answer = httpx.post(aliased.url + path, json=body, timeout=120)
        assert answer.status_code == 200, (path, answer.text)
        assert answer.json()["model"] == "smol", path
    named = httpx.post(aliased.url + "/v1/messages", json={**asks["/v1/messages"], "model": "tiny-2"}, timeout=120)
    assert named.json()["model"] == "tiny-2"


def test_a_model_is_not_made_under_an_alias(aliased, smollm2):
    """A model created or copied to an alias's name would be listed and shown but never answer (the alias does):
    refused as Ollama refuses a bad name, nothing made."""
    local = ollama.Client(host=aliased.url)
    for make in (lambda: local.create(model="Tiny-2", from_=str(smollm2)),
                 lambda: local.copy(SMOL, "smol:latest")):
        with pytest.raises(ollama.ResponseError) as refused:
            make()
        assert refused.value.status_code == 400 and "alias" in refused.value.error
    assert not [m.model for m in local.list().models if m.model.split(":")[0].casefold() in ("smol", "tiny-2")]
    local.copy(SMOL, "smol-copy")  # any other name is made
    assert "smol-copy:latest" in [m.model for m in local.list().models]


def test_an_alias_may_not_hide_a_model_of_that_name(smollm2, tmp_path):
    (tmp_path / "Modelfile").write_text(f"FROM {smollm2}\n")
    assert run_cli("create", "mine", "-f", str(tmp_path / "Modelfile")).returncode == 0
    result = run_cli("serve", str(smollm2), "--alias", "tiny,MINE", "--port", "0")
    assert result.returncode == 2 and "\n" not in result.stderr.strip()
    assert "'MINE'" in result.stderr and "mine" in result.stderr and "localrun rm" in result.stderr


def test_alias_needs_the_model_it_names():
    result = run_cli("serve", "--alias", "smol", "--port", "0")
    assert result.returncode == 2 and "--alias" in result.stderr and "\n" not in result.stderr.strip()
    result = run_cli("serve", "x.gguf", "--alias", " , ", "--port", "0")
    assert result.returncode == 2 and "--alias" in result.stderr


# -- post_sampling_probs -----------------------------------------------------------------------------------------

from llamaserver import LLAMA_SERVER, NO_LLAMA_SERVER, llama_server  # noqa: E402

STORY = "Today was the day. Today I would finally become a"


@pytest.fixture(scope="module")
def server(smollm2, tmp_path_factory):
    with start_server(smollm2, tmp_path_factory.mktemp("home"), "--ctx", "1024", "--parallel", "1") as srv:
        yield srv


def completion(url: str, **body) -> dict:
    r = httpx.post(url + "/completion", json=body, timeout=300)
    assert r.status_code == 200, r.text
    return r.json()


def test_post_sampling_probs_are_the_sampler_chains(server):
    """After top-k, top-p, min-p and the temperature: each token's `prob` among `top_probs` (llama-server's names),
    none of them 0, fewer than asked only when they are all there is (their sum 1); without post_sampling_probs the
    model's own logprobs, where the chain keeps fewer than the model ranks."""
    body = {"prompt": STORY, "n_probs": 10, "n_predict": 5, "temperature": 1.0, "seed": 7}
    after = completion(server.url, **body, post_sampling_probs=True)["completion_probabilities"]
    before = completion(server.url, **body)["completion_probabilities"]
    assert len(after) == 5 and [t["id"] for t in after] == [t["id"] for t in before]  # (the same seed: the same draws)
    for tok in after:
        assert "logprob" not in tok and "top_logprobs" not in tok
        assert 0.0 < tok["prob"] <= 1.0 and tok["bytes"] == list(tok["token"].encode())
        probs = [p["prob"] for p in tok["top_probs"]]
        assert probs == sorted(probs, reverse=True) and all(0.0 < p <= 1.0 for p in probs)
        assert [p["prob"] for p in tok["top_probs"] if p["id"] == tok["id"]] in ([tok["prob"]], [])
        if len(probs) < 10:
            assert sum(probs) == pytest.approx(1.0)
    assert len(before[0]["top_logprobs"]) == 10
    # min-p (0.05 of the best) leaves out what the model still ranks: the chain's first list is the shorter, and
    # renormalised, each kept token more likely than the model alone makes it
    first = {p["id"]: p["prob"] for p in after[0]["top_probs"]}
    import math
    model = {p["id"]: math.exp(p["logprob"]) for p in before[0]["top_logprobs"]}
    assert all(first[t] >= model[t] for t in first if t in model)
    greedy = completion(server.url, prompt=STORY, n_probs=3, n_predict=2, temperature=0, post_sampling_probs=True)
    assert all(t["prob"] == 1.0 and [p["prob"] for p in t["top_probs"]] == [1.0] for t in greedy["completion_probabilities"])


@pytest.mark.skipif(LLAMA_SERVER is None, reason=NO_LLAMA_SERVER)
def test_post_sampling_probs_equal_llama_servers(server, smollm2):
    """The first token's candidates after the chain (its distribution comes before any draw) equal llama-server's for
    the same GGUF and sampling, token for token."""
    body = {"prompt": STORY, "n_probs": 10, "n_predict": 1, "temperature": 0.7, "top_k": 30, "top_p": 0.9,
            "min_p": 0.02, "seed": 1, "post_sampling_probs": True}
    ours = completion(server.url, **body)["completion_probabilities"][0]["top_probs"]
    with llama_server(smollm2, "-c", "1024", "-np", "1") as http:
        r = http.post("/completion", json=body)
        assert r.status_code == 200, r.text
        theirs = r.json()["completion_probabilities"][0]["top_probs"]
    assert [p["id"] for p in ours] == [p["id"] for p in theirs]
    assert [p["prob"] for p in ours] == pytest.approx([p["prob"] for p in theirs], abs=1e-3)
    assert [p["token"] for p in ours] == [p["token"] for p in theirs]


# -- n_indent ---------------------------------------------------------------------------------------------------

CODE = "def add(a, b):\n    \"\"\"Add two numbers.\"\"\"\n    return a + b\n\n\ndef sub(a, b):\n    \"\"\"Subtract"


def test_n_indent_ends_the_answer_at_a_line_indented_less(server):
    """llama.vim asks /infill (and /completion) for lines at least as indented as the cursor's: the answer ends at
    the first line indented less, that line's text cut (its indentation kept), stop_type "limit", whole and streamed."""
    body = {"prompt": CODE, "n_predict": 60, "temperature": 0}
    free = completion(server.url, **body)["content"]
    lines = free.split("\n")
    short = next((i for i, line in enumerate(lines[1:], 1) if line.strip() and len(line) - len(line.lstrip(" \t")) < 4
                  or not line.strip() and i < len(lines) - 1), None)
    assert short is not None, f"the model's answer has no line indented less than 4: {free!r}"  # what the test needs
    cut = completion(server.url, **body, n_indent=4)
    line = lines[short]
    expected = "\n".join(lines[:short]) + "\n" + line[:len(line) - len(line.lstrip(" \t"))]
    assert cut["content"] == expected and cut["stop_type"] == "limit" and cut["stop"] is True
    assert free.startswith(cut["content"])
    streamed = [e for e in _events(server.url, {**body, "n_indent": 4, "stream": True})]
    assert "".join(e["content"] for e in streamed[:-1]) == expected
    assert streamed[-1]["stop"] is True and streamed[-1]["stop_type"] == "limit"
    # the server goes on answering (the slot was given back)
    assert completion(server.url, prompt="Hi", n_predict=2)["tokens_predicted"] == 2


def _events(url: str, body: dict) -> list[dict]:
    import json

    out = []
    with httpx.stream("POST", url + "/completion", json=body, timeout=300) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: "):
                out.append(json.loads(line[6:]))
    return out


def test_indent_cut_as_llama_server_reads_it():
    from localrun.serve.dialects.llama import indent_cut

    assert indent_cut("x = 1\n    y\n", 4) is None  # the first line is never checked; an indented one passes
    assert indent_cut("    a\n  b", 4) == 8  # the line's indentation kept, its text cut
    assert indent_cut("a\n  ", 4) is None  # not whole yet: more spaces may come
    assert indent_cut("a\n\n", 1) == 2  # an empty line is indented less
    assert indent_cut("a\n\tb", 1) is None and indent_cut("a\nb", 0) is None
