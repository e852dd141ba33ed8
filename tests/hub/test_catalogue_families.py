"""Today's model families in the built-in catalogue (issue 50): gpt-oss, Qwen3 to Qwen3.6 and Qwen3-Coder, Gemma 3
and 4, more DeepSeek-R1 distills, GLM-4.7-Flash and GLM-4.5-Air, Granite 4, LFM2 and LFM2.5, Ministral 3, Devstral,
Magistral and SmolLM3.

Each new alias is parsed offline (Ollama's NAME:TAG spelling too) and resolved against the loopback Hub stand-in
holding its repository: the real huggingface_hub client lists the repository, and `pull`'s Hub source picks exactly
the files it would fetch (every shard of a split file, in order; the projector the entry names, not a decoy), with
nothing downloaded. Every entry lists its quants, sets a context and cites its repository's page; the quant each key
names is the one its file name carries; `list --available` shows them all without asking the Hub."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from hubstub import StubFile, hub_stub  # noqa: F401 - hub_stub is a fixture
from test_catalogue_cli import ok, table_rows
from localrun.engine.sampling import merge_options
from localrun.errors import UnknownModel
from localrun.hub.catalogue import builtin_catalogue_path, catalogue
from localrun.hub.refs import SHARD_RE, parse_ref, quant_of
from localrun.hub.sources.hf import HubSource

NEW_ALIASES = (
    "gpt-oss-20b", "gpt-oss-120b",
    "qwen3-14b", "qwen3-30b", "qwen3-32b", "qwen3-4b-instruct-2507", "qwen3-4b-thinking-2507",
    "qwen3-30b-a3b-instruct-2507", "qwen3-30b-a3b-thinking-2507", "qwen3-coder-30b",
    "qwen3.5-0.8b", "qwen3.5-2b", "qwen3.5-4b", "qwen3.5-9b", "qwen3.5-27b", "qwen3.5-35b", "qwen3.6-27b", "qwen3.6-35b",
    "gemma3-12b", "gemma3-27b", "gemma4-e2b", "gemma4-e4b", "gemma4-12b", "gemma4-26b", "gemma4-31b",
    "deepseek-r1-qwen-14b", "deepseek-r1-qwen-32b", "deepseek-r1-0528-qwen3-8b",
    "glm-4.7-flash", "glm-4.5-air",
    "granite4-micro", "granite4-micro-h", "granite4-tiny-h", "granite4-small-h",
    "lfm2-1.2b", "lfm2-8b-a1b", "lfm2.5-1.2b", "lfm2.5-8b-a1b",
    "ministral-3-3b", "ministral-3-8b", "ministral-3-14b", "devstral-24b", "devstral-small-2-24b", "magistral-24b",
    "smollm3-3b",
)


def entry_blocks() -> dict[str, str]:
    """Each alias's text in the built-in models.yaml, comments included (where its sources are cited)."""
    text = Path(builtin_catalogue_path()).read_text(encoding="utf-8")
    return {block.split(":", 1)[0]: block for block in re.split(r"\n  (?=[a-z0-9][\w.-]*:\n)", text)[1:]}


def shards(name: str) -> list[str]:
    """A file name as the repository holds it: one file, or every shard the first one's -0000N-of-0000M names."""
    split = SHARD_RE.match(name)
    if split is None:
        return [name]
    count = int(split.group("count"))
    return [f"{split.group('stem')}-{index:05d}-of-{count:05d}.gguf" for index in range(1, count + 1)]


def test_the_new_aliases_cover_todays_families():
    models = catalogue().models
    assert [a for a in NEW_ALIASES if a not in models] == []
    families = ("gpt-oss-", "qwen3-", "qwen3-coder-", "qwen3.5-", "qwen3.6-", "gemma3-", "gemma4-", "deepseek-r1-",
                "glm-4.7-flash", "glm-4.5-air", "granite4-", "lfm2-", "lfm2.5-", "ministral-3-", "devstral-", "magistral-",
                "smollm3-")
    assert [f for f in families if not any(a.startswith(f) for a in NEW_ALIASES)] == []
    assert len(set(NEW_ALIASES)) == len(NEW_ALIASES)


@pytest.mark.parametrize("alias", NEW_ALIASES)
def test_a_new_entry_lists_its_quants_sets_a_context_and_cites_its_repository(alias):
    entry = catalogue().models[alias]
    assert entry.quants and entry.default_quant in entry.quants
    assert isinstance(entry.context, int) and 2048 <= entry.context <= 32768, entry.context
    assert entry.description and entry.license and not entry.embedding and entry.mirror == {}
    for quant, name in entry.quants.items():
        # the key names the quant the file carries (unsloth's dynamic UD-Q4_K_M is a Q4_K_M file)
        assert name.endswith(".gguf") and quant_of(name) == quant.removeprefix("UD-"), (quant, name)
    if entry.mmproj:
        assert "mmproj" in entry.mmproj.lower() and entry.mmproj.endswith(".gguf")
    merge_options(entry.sampling)  # the defaults it sets are options llama.cpp takes, in range
    block = entry_blocks()[alias]
    assert f"# source: https://huggingface.co/{entry.repo}" in block, block


@pytest.mark.parametrize("alias", NEW_ALIASES)
def test_a_new_alias_resolves_to_its_repository_and_the_files_pull_would_fetch(alias, hub_stub):
    entry = catalogue().models[alias]
    held = [n for pattern in entry.quants.values() for n in shards(pattern)]
    decoys = ["mmproj-decoy-F16.gguf"] if entry.mmproj else []  # F16 would win if the entry's name were ignored
    held += ([entry.mmproj] if entry.mmproj else []) + decoys
    hub_stub.stub.add_repo(entry.repo, [StubFile(n, b"GGUF" + n.encode()) for n in held]
                           + [StubFile("README.md", b"card", lfs=False)])

    ref = parse_ref(alias)
    assert (ref.kind, ref.name, ref.repo, ref.quant) == ("alias", alias, entry.repo, None)
    for quant, pattern in entry.quants.items():
        found = HubSource().resolve(ref.with_quant(quant))
        assert (found.repo, found.ref.name, found.ref.quant) == (entry.repo, alias, quant)
        assert [f.name for f in found.files] == shards(pattern) + ([entry.mmproj] if entry.mmproj else [])
    assert hub_stub.stub.log and not [r.path for r in hub_stub.stub.log if "/resolve/" in r.path]  # listed, not fetched


@pytest.mark.parametrize("alias, quant, files", [
    ("gpt-oss-120b", "MXFP4", ["gpt-oss-120b-mxfp4-00001-of-00003.gguf", "gpt-oss-120b-mxfp4-00002-of-00003.gguf",
                               "gpt-oss-120b-mxfp4-00003-of-00003.gguf"]),
    ("glm-4.5-air", "Q4_K_M", ["Q4_K_M/GLM-4.5-Air-Q4_K_M-00001-of-00002.gguf",
                               "Q4_K_M/GLM-4.5-Air-Q4_K_M-00002-of-00002.gguf"]),
    ("gemma3-27b", "F16", ["gemma-3-27b-it-f16-00001-of-00002.gguf", "gemma-3-27b-it-f16-00002-of-00002.gguf",
                           "mmproj-model-f16.gguf"]),
])
def test_a_split_file_resolves_to_every_shard_in_order(alias, quant, files, hub_stub):
    """The repositories as their file lists show them: shards listed out of order, in a quant's folder, beside
    another quant's single file."""
    entry = catalogue().models[alias]
    other = [n for q, n in entry.quants.items() if q != quant]
    hub_stub.stub.add_repo(entry.repo, [StubFile(n, b"GGUF" + n.encode()) for n in [*reversed(files), *other]])
    found = HubSource().resolve(parse_ref(f"{alias}:{quant.lower()}"))
    assert [f.name for f in found.files] == files


@pytest.mark.parametrize("ref, alias, quant", [
    ("gpt-oss:20b", "gpt-oss-20b", None), ("gpt-oss:120b", "gpt-oss-120b", None),
    ("gpt-oss-20b:mxfp4", "gpt-oss-20b", "MXFP4"), ("qwen3:14b", "qwen3-14b", None), ("qwen3:30b", "qwen3-30b", None),
    ("qwen3:32b", "qwen3-32b", None), ("qwen3-coder:30b", "qwen3-coder-30b", None), ("qwen3.5:9b", "qwen3.5-9b", None),
    ("Qwen3.6:35B", "qwen3.6-35b", None), ("qwen3.6-35b:ud-q4_k_m", "qwen3.6-35b", "UD-Q4_K_M"),
    ("gemma3:27b", "gemma3-27b", None), ("gemma4:e4b", "gemma4-e4b", None), ("gemma4:26b", "gemma4-26b", None),
    ("granite4:tiny-h", "granite4-tiny-h", None), ("ministral-3:8b", "ministral-3-8b", None),
    ("devstral:24b", "devstral-24b", None), ("devstral-small-2:24b", "devstral-small-2-24b", None),
    ("magistral:24b", "magistral-24b", None), ("GLM-4.7-Flash", "glm-4.7-flash", None),
    ("glm-4.7-flash:latest", "glm-4.7-flash", None), ("smollm3:3b", "smollm3-3b", None), ("lfm2.5:1.2b", "lfm2.5-1.2b", None),
])
def test_ollamas_spellings_name_the_new_aliases(ref, alias, quant):
    parsed = parse_ref(ref)
    assert (parsed.kind, parsed.name, parsed.quant) == ("alias", alias, quant)


@pytest.mark.parametrize("family, sizes", [
    ("gpt-oss", ["gpt-oss-120b", "gpt-oss-20b"]),
    ("gemma4", ["gemma4-12b", "gemma4-26b", "gemma4-31b", "gemma4-e2b", "gemma4-e4b"]),
    ("granite4", ["granite4-micro", "granite4-micro-h", "granite4-small-h", "granite4-tiny-h"]),
])
def test_a_family_name_alone_says_which_sizes_the_catalogue_has(family, sizes):
    with pytest.raises(UnknownModel) as unknown:
        parse_ref(family)
    assert unknown.value.close == sizes


def test_list_available_shows_every_new_alias_without_asking_the_hub(hub_stub, cli):
    models = catalogue().models
    listed = json.loads(ok(cli("list", "--available", "--json")).stdout)
    for alias in NEW_ALIASES:
        assert listed[alias] == json.loads(models[alias].model_dump_json()), alias
    rows = {row[0]: row for row in table_rows(ok(cli("list", "--available")).stdout)[1:]}
    for alias in NEW_ALIASES:
        entry = models[alias]
        quants = list(entry.quants)
        # ALIAS REPO QUANTS... DEFAULT MIRROR DESCRIPTION...
        assert rows[alias][:4 + len(quants)] == [alias, entry.repo, *quants, entry.default_quant, "-"], rows[alias]
        assert " ".join(rows[alias][4 + len(quants):]) == entry.description
    assert hub_stub.stub.log == []
