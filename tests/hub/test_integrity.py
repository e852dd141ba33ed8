"""A pulled file damaged on disk (4 KB flipped in the middle) is caught on use, repaired by `pull`, and found by
`--verify` even where its mtime was put back: a real GGUF (SmolLM2, or the tiny model on its tokenizer where no
answer is read) served by the loopback Hub stand-in, run by the installed `localrun` command."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hubstub import StubFile, hub_stub  # noqa: F401 - hub_stub is a fixture

from localrun import hub

REPO = "stub-org/SmolLM2-GGUF"
REF = f"{REPO}:Q4_1"


def flip_4k_mid_file(path: Path, keep_mtime: bool = False) -> None:
    """Damage the file in place as a bad disk or a stray write would: same size, 4 KB inverted mid-file."""
    st = path.stat()
    with open(path, "r+b") as f:
        f.seek(st.st_size // 2)
        block = f.read(4096)
        f.seek(st.st_size // 2)
        f.write(bytes(b ^ 0xFF for b in block))
    if keep_mtime:
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def pull(hub_stub, cli, model: Path):
    data = model.read_bytes()
    hub_stub.stub.add_repo(REPO, [StubFile("SmolLM2-135M-Instruct.Q4_1.gguf", data)])
    r = cli("pull", REF)
    assert r.returncode == 0, r.stderr
    return hub.resolve_local(REF), data


@pytest.fixture
def pulled(hub_stub, tiny_smollm2, cli):
    """The tiny model (tests/tinymodel.py: SmolLM2's tokenizer and template on random weights, 8 MB) under
    SmolLM2's file name, pulled: what these tests check is the file's bytes, never an answer, and each pull and
    hash is of an eighth of the bytes."""
    return pull(hub_stub, cli, tiny_smollm2)


@pytest.fixture
def pulled_smollm2(hub_stub, smollm2, cli):
    """The real SmolLM2, pulled: for the test that reads an answer of the repaired file (the tiny model's greedy
    answer is blank lines)."""
    return pull(hub_stub, cli, smollm2)


def test_the_record_carries_size_and_mtime(pulled):
    model, data = pulled
    record = json.loads(hub.registry_path().read_text())["models"][REF]["files"][0]
    st = model.path.stat()
    assert (record["size"], record["mtime_ns"]) == (st.st_size, st.st_mtime_ns) == (len(data), st.st_mtime_ns)


def test_a_damaged_file_is_refused_on_use_and_repaired_by_pull(pulled_smollm2, cli):
    model, data = pulled_smollm2
    flip_4k_mid_file(model.path.resolve())
    damaged_line = (f"error: model '{REF}' is damaged ({model.path}: sha256 differs from the pull): "
                    f"run `localrun pull {REF}` to repair it")

    run = cli("run", REF, "-n", "5", "-t", "0", "Hello")
    assert run.returncode == 1 and run.stdout == ""
    assert run.stderr.strip().splitlines()[-1] == damaged_line

    show = cli("show", REF, "--no-measure")
    assert show.returncode == 1 and show.stdout == ""
    assert show.stderr.strip().splitlines()[-1] == damaged_line

    repair = cli("pull", REF)
    assert repair.returncode == 0, repair.stderr
    assert "is damaged (sha256 differs from the pull): fetching it again" in repair.stderr
    assert "already pulled" not in repair.stderr
    assert model.path.read_bytes() == data

    again = cli("run", REF, "-n", "5", "-t", "0", "Hello")
    assert again.returncode == 0 and again.stdout.strip(), again.stderr


def test_a_file_touched_but_intact_is_hashed_once_and_used(pulled, cli):
    model, _ = pulled
    os.utime(model.path.resolve(), ns=(0, 10**18))
    r = cli("show", REF, "--no-measure", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["sha256"] == model.sha256[0]
    record = json.loads(hub.registry_path().read_text())["models"][REF]["files"][0]
    assert record["mtime_ns"] == 10**18  # the new mtime is recorded: the next use costs a stat


def test_verify_finds_damage_whose_mtime_was_put_back(pulled, cli):
    model, data = pulled
    flip_4k_mid_file(model.path.resolve(), keep_mtime=True)

    assert cli("show", REF, "--no-measure").returncode == 0  # the cheap check cannot see it: size and mtime agree
    show = cli("show", REF, "--no-measure", "--verify")
    assert show.returncode == 1 and f"is damaged ({model.path}: sha256 differs from the pull)" in show.stderr

    pull = cli("pull", REF)
    assert pull.returncode == 0 and "already pulled" in pull.stderr
    verify = cli("pull", REF, "--verify")
    assert verify.returncode == 0, verify.stderr
    assert "fetching it again" in verify.stderr and "already pulled" not in verify.stderr
    assert model.path.read_bytes() == data

    ok = cli("show", REF, "--no-measure", "--verify", "--json")
    assert ok.returncode == 0 and json.loads(ok.stdout)["sha256"] == model.sha256[0]


def test_ollama_pull_repairs_a_damaged_file(pulled, hub_stub):
    import httpx
    from conftest import start_server

    model, data = pulled
    flip_4k_mid_file(model.path.resolve())
    server = start_server(None, hub_stub.home)
    try:
        r = httpx.post(server.url + "/api/pull", json={"model": REF, "stream": False}, timeout=120)
        assert r.status_code == 200 and r.json() == {"status": "success"}, r.text
    finally:
        server.stop()
    assert model.path.read_bytes() == data
