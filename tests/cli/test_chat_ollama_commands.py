"""`localrun chat` takes what Ollama's REPL users type (/set parameter NAME VALUE, /set system TEXT, /set
verbose), hints at what is fixed at load (num_ctx), and after /load NAME keeps saving to NAME, in-process and
through the background server."""

from __future__ import annotations

import json
import re

import pytest

pytestmark = pytest.mark.slow

ARGS = ("-t", "0", "-n", "16", "--ctx", "1024", "--threads", "1")


@pytest.fixture(params=["in-process", "server"])
def via(request):
    if request.param == "server":
        request.getfixturevalue("resident")
    return request.param


def test_ollama_set_commands(smollm2, cli):
    r = cli("chat", str(smollm2), "-n", "16", "--ctx", "1024", "--threads", "1", "--temperature", "1.5", input="\n".join([
        "/set parameter temperature 0",
        "/set parameter num_predict 8",
        "/set parameter num_ctx 2048",
        "/set parameter warmth 1",
        "/set system You are a pirate.",
        "/set verbose",
        "/show",
        "Hello!",
    ]) + "\n")
    assert r.returncode == 0, r.stderr
    assert "temperature = 0.0" in r.stderr and "max_tokens = 8" in r.stderr
    assert "num_ctx is fixed when the model loads: restart the chat with --ctx" in r.stderr
    assert "unknown parameter 'warmth'" in r.stderr
    assert "system prompt set" in r.stderr and re.search(r"^system:\s+You are a pirate\.$", r.stderr, re.M)
    assert re.search(r"^options:.*temperature=0\.0.*max_tokens=8", r.stderr, re.M)
    assert re.search(r"^eval count:\s+[1-8] token", r.stderr, re.M)  # /set verbose: the stats after the answer
    # Ollama's /show subcommands each show their own (all printed the /show block: found by a helper), and
    # /stats after /clear has no answer to speak of (it spoke of the cleared one).
    shown = cli("chat", str(smollm2), *ARGS, input="\n".join([
        "/set system Be brief.", "/set parameter temperature 0.5", "/show template", "/show system", "/show parameters",
        "/show nonsense", "Hi", "/clear", "/stats"]) + "\n")
    assert shown.returncode == 0, shown.stderr
    assert "{%" in shown.stderr and "<|im_start|>" in shown.stderr  # the chat template itself
    assert re.search(r"^Be brief\.$", shown.stderr, re.M) and re.search(r"^temperature\s+0\.5$", shown.stderr, re.M)
    assert re.search(r"^num_predict\s+16$", shown.stderr, re.M)  # Ollama's names for what differs from the defaults
    assert "usage: /show [info|template|system|parameters]" in shown.stderr
    assert shown.stderr.rstrip().endswith("no answer yet")
    # The same as the native spellings.
    native = cli("chat", str(smollm2), "-n", "16", "--ctx", "1024", "--threads", "1", "--temperature", "1.5", input="\n".join([
        "/set temperature 0", "/set max_tokens 8", "/system You are a pirate.", "Hello!"]) + "\n")
    assert native.returncode == 0 and native.stdout == r.stdout and r.stdout.strip()


def test_set_format_json_constrains_the_answers_until_noformat(smollm2, cli):
    """/set format json (any JSON object; or a schema) as Ollama's REPL takes it, /set noformat; its other
    switches (wordwrap, history) are said to have no counterpart, not read as unknown sampling options."""
    r = cli("chat", str(smollm2), "-t", "0", "-n", "200", "--ctx", "1024", "--threads", "1", input="\n".join([
        "/set format json", "Give Ann's name and age (31) as JSON.", "/set noformat", "/set nowordwrap"]) + "\n")
    assert r.returncode == 0, r.stderr
    assert isinstance(json.loads(r.stdout.strip().replace("\\n", "\n")), dict)  # one answer line, its breaks escaped
    assert "json_schema = {'type': 'object'}" in r.stderr and "json_schema = None" in r.stderr
    assert "/set nowordwrap: localrun's chat has no such switch" in r.stderr and "unknown parameter" not in r.stderr


def test_load_makes_the_loaded_session_the_one_saved_to(smollm2, cli, via):
    """Without --session, /load NAME left the chat's session '(none)': later answers were saved nowhere."""
    first = cli("chat", str(smollm2), *ARGS, input="My name is Ada.\n/save ada\n")
    assert first.returncode == 0, first.stderr
    r = cli("chat", str(smollm2), *ARGS, input="/load ada\n/show\nWhat is my name?\n")
    assert r.returncode == 0, r.stderr
    assert "answers are now saved to session ada" in r.stderr
    assert re.search(r"^session:\s+ada$", r.stderr, re.M)
    saved = json.loads(cli("sessions", "show", "ada", "--json").stdout)["messages"]
    assert [m["content"] for m in saved if m["role"] == "user"] == ["My name is Ada.", "What is my name?"]
    assert saved[-1]["role"] == "assistant"
