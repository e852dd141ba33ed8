"""The built-in catalogue (models.yaml): popular chat models from 0.5B to 8B across families and embedding
models, each entry with its source cited; Ollama-style `hf.co/OWNER/REPO:QUANT` references; an alias
pulled through the Hub stand-in as its entry describes, and one whose repository the Hub does not have
failing in one line."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from hubstub import StubFile, hub_stub  # noqa: F401 - hub_stub is a fixture
from localrun.hub.catalogue import builtin_catalogue_path, catalogue
from localrun.errors import ModelNotFound
from localrun.hub.refs import parse_ref

TESTED = {"smollm2", "gemma3-270m"}  # the two the tests use, with their PyPI mirrors


def test_the_catalogue_covers_popular_families_and_embeddings():
    models = catalogue().models
    assert len(models) >= 27
    chat = {a: e for a, e in models.items() if not e.embedding}
    embedding = [a for a, e in models.items() if e.embedding]
    assert len(embedding) >= 3
    families = ("llama3", "qwen2.5", "qwen3", "gemma3", "phi", "mistral", "smollm2", "deepseek-r1")
    for family in families:
        assert any(a.startswith(family) for a in chat), f"no {family} model"
    for alias, entry in models.items():
        assert entry.default_quant in entry.quants and entry.license, alias
        assert entry.repo.count("/") == 1 and all(f.lower().endswith(".gguf") for f in entry.quants.values()), alias
    assert sum(e.reasoning for e in models.values()) >= 3


def test_every_added_entry_cites_its_source():
    text = Path(builtin_catalogue_path()).read_text()
    blocks = re.split(r"\n  (?=[a-z0-9][\w.-]*:\n)", text)
    cited = {}
    for block in blocks[1:]:
        alias = block.split(":", 1)[0]
        cited[alias] = "# source:" in block
    assert set(cited) == set(catalogue().models)
    assert [a for a, ok in cited.items() if not ok and a not in TESTED] == []


@pytest.mark.parametrize("ref, repo, quant", [
    ("hf.co/bartowski/Llama-3.2-1B-Instruct-GGUF:Q4_K_M", "bartowski/Llama-3.2-1B-Instruct-GGUF", "Q4_K_M"),
    ("hf.co/Qwen/Qwen3-0.6B-GGUF:q8_0", "Qwen/Qwen3-0.6B-GGUF", "Q8_0"),
    ("huggingface.co/unsloth/Qwen3-4B-GGUF", "unsloth/Qwen3-4B-GGUF", None),
    ("https://huggingface.co/unsloth/Qwen3-4B-GGUF:latest", "unsloth/Qwen3-4B-GGUF", None),
])
def test_ollama_style_hub_references(ref, repo, quant):
    parsed = parse_ref(ref)
    assert (parsed.kind, parsed.name, parsed.quant) == ("repo", repo, quant)


def test_an_alias_pulls_what_its_entry_names_and_a_missing_repo_is_one_line(hub_stub, smollm2, cli):
    entry = catalogue().models["qwen2.5-0.5b"]
    name = entry.quants[entry.default_quant]
    # The Hub stand-in holds the repository as the entry describes it (SmolLM2's bytes under that name).
    hub_stub.stub.add_repo(entry.repo, [StubFile(name, smollm2.read_bytes()), StubFile("README.md", b"x", lfs=False)])
    pulled = cli("pull", "qwen2.5-0.5b", "--source", "hub")
    assert pulled.returncode == 0, pulled.stderr
    import json

    assert [(m["name"], m["quant"]) for m in json.loads(cli("list", "--json").stdout)] == [("qwen2.5-0.5b", "Q4_K_M")]
    same = cli("pull", f"hf.co/{entry.repo}:{entry.default_quant}", "--source", "hub")
    assert same.returncode == 0, same.stderr
    missing = cli("pull", "llama3.2-1b", "--source", "hub")
    assert missing.returncode == 1 and len(missing.stderr.strip().splitlines()) == 1, missing.stderr
    assert "Llama-3.2-1B-Instruct-GGUF" in missing.stderr


def test_the_real_size_test_model_has_its_mirror_and_ollamas_name():
    """qwen2.5-coder-1.5b is pulled without the Hub from the same 22 PyPI parts the tests assemble, and
    Ollama's NAME:TAG spelling (qwen2.5-coder:1.5b) names the alias NAME-TAG; a quant after the colon stays a quant."""
    from conftest import REAL_MODELS

    entry = catalogue().models["qwen2.5-coder-1.5b"]
    mirror = entry.mirror["Q4_K_M"]
    packages, members, sha = REAL_MODELS["qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"]
    assert (list(mirror.packages), list(mirror.files), mirror.sha256) == (packages, members, sha)
    for ref in ("qwen2.5-coder:1.5b", "Qwen2.5-Coder:1.5B", "qwen2.5-coder-1.5b"):
        parsed = parse_ref(ref)
        assert (parsed.kind, parsed.name, parsed.quant) == ("alias", "qwen2.5-coder-1.5b", None), ref
    assert parse_ref("qwen2.5-coder-1.5b:q8_0").quant == "Q8_0" and parse_ref("llama3.2:1b").name == "llama3.2-1b"
    assert (parse_ref("smollm2:latest").name, parse_ref("smollm2:latest").quant) == ("smollm2", None)  # Ollama's default tag
    with pytest.raises(ModelNotFound, match="unknown model 'llama3.2': did you mean llama3.2-1b or llama3.2-3b"):
        parse_ref("llama3.2")  # Ollama's family name, sized in the catalogue
    # the code models draft by prompt lookup by default (their edits copy their input); nothing else does
    assert {name for name, e in catalogue().models.items() if e.draft} == {"qwen2.5-coder-1.5b", "qwen2.5-coder-3b", "qwen2.5-coder-7b"}
