"""How an answer ends on the terminal and what a wrong model path says: an answer cut inside a multi-byte
character ends at the last whole one (as llama.cpp's server does), never with U+FFFD; Ctrl-C during an answer
leaves the shell's prompt on a line of its own (in-process and through the background server); a folder
named like a model file is called a folder."""

from __future__ import annotations

import json
import os

import pexpect
import pytest

from conftest import LOCALRUN

pytestmark = pytest.mark.slow

# Greedy SmolLM2 answers this with Japanese, each character of it spread over two tokens or more.
JAPANESE = "日本の首都は"


def test_an_answer_cut_inside_a_character_ends_at_the_last_whole_one(smollm2, isolated_home):
    from one_process import run_all

    # The twelve commands (each cap, plain and --json) in one process: the subject is what each writes on stdout.
    args = [["run", str(smollm2), "--raw", "-t", "0", "-n", str(n), "--threads", "1", "--no-cache", *json_flag, JAPANESE]
            for n in range(1, 7) for json_flag in ([], ["--json"])]
    done = run_all(*args, home=isolated_home)
    texts = []
    for n, r, as_json in zip(range(1, 7), done[::2], done[1::2]):
        assert r.returncode == 0 and as_json.returncode == 0, (r.stderr, as_json.stderr)
        assert "\ufffd" not in r.stdout, (n, r.stdout)
        texts.append(r.stdout)
        events = [json.loads(line) for line in as_json.stdout.splitlines()]
        assert events[-1]["stats"]["finish_reason"] == "length" and "\ufffd" not in events[-1]["text"]
        assert "".join(e["text"] for e in events[:-1]) == events[-1]["text"] == r.stdout.rstrip("\n")
    # Some of those limits did fall inside a character (the same text as one token fewer), and what came
    # out is each time the start of the longer answer: the incomplete bytes were dropped, nothing else.
    assert any(a == b for a, b in zip(texts, texts[1:])), texts
    assert all(b.rstrip("\n").startswith(a.rstrip("\n")) for a, b in zip(texts, texts[1:])), texts


@pytest.fixture(params=["in-process", "server"])
def via(request):
    if request.param == "server":
        request.getfixturevalue("resident")
    return request.param


def test_ctrl_c_during_an_answer_ends_its_line(smollm2, via):
    env = {**os.environ, "TERM": "xterm"}
    child = pexpect.spawn(LOCALRUN, ["run", str(smollm2), "--raw", "-t", "0", "-n", "3000", "--min-tokens", "3000", "--threads", "1",
                                     "--ctx", "4096", "--no-cache", "Once upon a time"], env=env, encoding="utf-8", timeout=120)
    try:
        child.expect(r"\w+ \w+ \w+ \w+ \w+ \w+ \w+ \w+")  # the answer is streaming (the server's notice has commas)
        child.sendintr()
        child.expect(pexpect.EOF)
        child.close()
        assert child.exitstatus == 130
        # The terminal echoes ^C after the answer; the line ends there, so the shell's prompt starts a new one.
        assert child.before.endswith("\n"), repr(child.before[-80:])
        assert "Traceback" not in child.before
    finally:
        if child.isalive():
            child.terminate(force=True)


@pytest.mark.parametrize("name", ["x.gguf", "models"])
def test_a_folder_is_called_a_folder(name, cli, tmp_path, smollm2):
    folder = tmp_path / name
    folder.mkdir()
    r = cli("run", str(folder), "hi")
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.strip() == f"error: {folder} is a folder, not a .gguf file: give the path of the model's .gguf file (it holds none)"
    (folder / "model.gguf").symlink_to(smollm2)
    r = cli("run", str(folder), "hi")
    assert r.returncode == 2 and f"name a file in it, e.g. {folder / 'model.gguf'}" in r.stderr
    assert "no such file" not in cli("show", str(folder)).stderr
