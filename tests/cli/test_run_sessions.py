"""`run --session`, the automatic prefix cache and `localrun sessions`, end to end across processes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import last_json

pytestmark = pytest.mark.slow

# A shared document of about 380 tokens: six times MIN_PREFIX_TOKENS and 9 MB of SmolLM2's KV cache, well over
# the 1 MB cap below (its first 4,000 characters took a quarter of this file's time to evaluate, eight times).
DOC = (Path(__file__).resolve().parents[2] / "src" / "localrun" / "data" / "wonderland.txt").read_text()[:1500]



def ask(cli, model, *args, input=None):
    r = cli("run", str(model), "-t", "0", "-n", "16", "--ctx", "2048", "--json", *args, input=input)
    assert r.returncode == 0, r.stderr
    return last_json(r.stdout)


def test_prefix_cache_prefills_a_shared_document_once_and_changes_nothing(smollm2, cli):
    # Without flash attention: the CPU's flash attention rounds a 400-token batch differently from the question's
    # 10 alone (on an AMD EPYC the cold and restored answers parted at the second token; the Intel CPUs of earlier
    # runs happened to agree), and the claim is about the restored state, not batch shapes: unfused, a row rounds
    # alike in any batch of more than one token (the question's 10 as in the whole prompt's 400; a batch of one
    # takes other kernels, so a restore that leaves one token to evaluate may still part at a near-tie).
    exact = "--no-flash-attn"
    first = ask(cli, smollm2, exact, "Who is the story about?", input=DOC)
    assert first["stats"]["cached_tokens"] == 0
    second = ask(cli, smollm2, exact, "Where did Alice fall?", input=DOC)
    # Everything up to the question was restored from disk in this new process.
    assert second["stats"]["cached_tokens"] > 0.9 * first["stats"]["prompt_tokens"]
    assert second["stats"]["prompt_eval_tokens"] < 30
    cold = ask(cli, smollm2, exact, "--no-cache", "Where did Alice fall?", input=DOC)
    assert cold["stats"]["cached_tokens"] == 0
    assert cold["tokens"] == second["tokens"]  # fidelity: a restored prefix gives the same greedy answer


def test_cache_max_caps_what_is_stored_and_0_turns_the_cache_off(tiny_smollm2, cli):
    """A cap smaller than one entry evicted nothing (the new entry was just not stored), and 0 still
    looked entries up: 0 now means off (no lookup, nothing kept), any cap is brought under. On the tiny model
    (SmolLM2's tokenizer on two layers: the same prompt tokens, the same cache entries, a smaller KV per token):
    the subject is what the cache keeps, not the answer, and the cap is set below its smallest entry as 1M
    was below SmolLM2's 9 MB."""
    model = tiny_smollm2
    ask(cli, model, "Who is the story about?", input=DOC)

    def prefix_entries() -> list[int]:
        entries = json.loads(cli("sessions", "list", "--all", "--json").stdout)
        return [e["size"] for e in entries if e["kind"] == "prefix"]

    def cache_bytes() -> int:
        return sum(prefix_entries())

    cap = min(prefix_entries()) // 2  # smaller than any one entry
    assert cap > 0
    small = cli("run", str(model), "-t", "0", "-n", "4", "--ctx", "2048", "--json", "Where did Alice fall?",
                input=DOC, env={"LOCALRUN_CACHE_MAX": str(cap)})
    assert small.returncode == 0 and cache_bytes() <= cap
    ask(cli, model, "Who is the story about?", input=DOC)  # stored again under the default cap
    assert cache_bytes() > cap
    off = cli("run", str(model), "-t", "0", "-n", "4", "--ctx", "2048", "--json", "Where did Alice fall?",
              input=DOC, env={"LOCALRUN_CACHE_MAX": "0"})
    assert off.returncode == 0 and last_json(off.stdout)["stats"]["cached_tokens"] == 0
    assert cache_bytes() == 0


def test_named_session_resumes_in_a_new_process(smollm2, cli):
    one = ask(cli, smollm2, "--session", "trip", "I am planning a trip to Lisbon.")
    two = ask(cli, smollm2, "--session", "trip", "What city did I mention?")
    assert two["stats"]["cached_tokens"] >= one["stats"]["prompt_tokens"]
    r = cli("sessions", "show", "trip", "--json")
    info = json.loads(r.stdout)
    assert [m["role"] for m in info["messages"]] == ["user", "assistant", "user", "assistant"]  # a path model: no system prompt
    assert info["messages"][-1]["content"] == two["text"]
    listed = json.loads(cli("sessions", "list", "--json").stdout)
    assert [s["name"] for s in listed] == ["trip"]

    # Its state damaged on disk: the next turn says so, answers from the messages (evaluated again, the same
    # greedy answer as from the state) and saves the session whole again; no turn is lost.
    from localrun.store.sessions import default_root

    (state,) = (default_root() / "states").glob("*.kv")
    with open(state, "r+b") as f:
        f.seek(state.stat().st_size // 2)
        f.write(b"\xff" * 64)
    again = cli("run", str(smollm2), "-t", "0", "-n", "16", "--ctx", "2048", "--json", "--session", "trip",
                "What city did I mention?")
    assert again.returncode == 0 and "its saved KV cache was damaged" in again.stderr, again.stderr
    assert last_json(again.stdout)["stats"]["cached_tokens"] == 0
    info = json.loads(cli("sessions", "show", "trip", "--json").stdout)
    assert [m["role"] for m in info["messages"]] == ["user", "assistant"] * 3


def test_session_from_another_model_is_refused(smollm2, gemma, cli):
    ask(cli, smollm2, "--session", "mine", "Hello there.")
    r = cli("run", str(gemma), "-n", "4", "--session", "mine", "Hello again.")
    assert r.returncode == 1
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    assert "mine" in r.stderr
    assert f"resume it with {smollm2}" in r.stderr  # the path that loads it (it said the bare file name)


def test_a_session_of_another_model_is_refused_before_that_model_loads(smollm2, tools_model, cli, resident):
    """Where the other model's sha256 is known without hashing (hashed here before: a session of its own), the
    session is refused before the model loads (the background server loaded it first, 5.6 GB for Qwen, then
    refused: found by a helper); the message is the one the check after a load gives."""
    ask(cli, smollm2, "--session", "mine", "Hello there.")
    ask(cli, tools_model, "--session", "other", "Hello there.")  # its file hashed by the store
    assert cli("stop", "--server").returncode == 0
    r = cli("run", str(tools_model), "-n", "4", "--session", "mine", "Hello again.")
    assert r.returncode == 1 and r.stderr.strip().splitlines() == [
        f"error: session 'mine' was saved with {smollm2.name} (Q4_1), not {tools_model.name}: resume it with {smollm2}"], r.stderr
    assert json.loads(cli("ps", "--json").stdout or "[]") == []  # nothing loaded for it (no server started even)


def test_system_given_to_a_resumed_session_replaces_its_own(smollm2, cli):
    ask(cli, smollm2, "--session", "crew", "My name is Bob.")
    ask(cli, smollm2, "--session", "crew", "--system", "You are a pirate.", "Who are you?")
    messages = json.loads(cli("sessions", "show", "crew", "--json").stdout)["messages"]
    assert messages[0] == {"role": "system", "content": "You are a pirate."}  # it was dropped, silently
    assert [m["role"] for m in messages[1:]] == ["user", "assistant", "user", "assistant"]


def test_a_damaged_session_index_names_itself_and_run_answers_without_the_cache(smollm2, tiny_smollm2, cli, isolated_home):
    import sqlite3

    ask(cli, smollm2, "--session", "kept", "Hello.")
    ask(cli, tiny_smollm2, "Who is the story about?", input=DOC)  # a prefix entry too (the tiny model's: not read)
    index = isolated_home / "sessions" / "index.sqlite"
    with sqlite3.connect(index) as db:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    with open(index, "r+b") as f:  # a damaged page past the header (a damaged header is caught on opening)
        for page in range(2, 11):
            f.seek(page * 4096 + 8)
            f.write(bytes(range(256)) * 12)
    listed = cli("sessions", "list")
    assert listed.returncode == 1 and str(index) in listed.stderr and "move it aside" in listed.stderr
    r = cli("run", str(smollm2), "-t", "0", "-n", "4", "--ctx", "2048", "Where did Alice fall?", input=DOC)
    assert r.returncode == 0 and r.stdout.strip() and "prefix cache skipped" in r.stderr


def test_prune_keeps_named_sessions_and_rm_removes(smollm2, tiny_smollm2, cli):
    ask(cli, smollm2, "--session", "keep", "Remember the number 7.")
    ask(cli, tiny_smollm2, "Summarise:", input=DOC)  # fills the prefix cache (the tiny model: its words are not read)
    entries = json.loads(cli("sessions", "list", "--all", "--json").stdout)
    assert any(e["kind"] == "prefix" for e in entries)
    r = cli("sessions", "prune", "--max-size", "0")
    assert r.returncode == 0, r.stderr
    entries = json.loads(cli("sessions", "list", "--all", "--json").stdout)
    assert [e["name"] for e in entries] == ["keep"]
    assert cli("sessions", "rm", "keep").returncode == 0
    assert json.loads(cli("sessions", "list", "--json").stdout) == []
    r = cli("sessions", "rm", "keep")
    assert r.returncode == 1 and "no session named" in r.stderr


def test_bad_session_name_is_a_usage_error(smollm2, cli):
    r = cli("run", str(smollm2), "--session", "../etc", "hi")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1
