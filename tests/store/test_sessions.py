"""The KV-cache session store: real llama.cpp, real GGUF files, real processes (no mocks).

Processes that must be separate (resume across processes, kill -9, concurrent writers) run this file as a
script: `python tests/store/test_sessions.py COMMAND ...` (see `child_main` at the bottom).
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from localrun.engine import Engine, LoadOptions, SamplingOptions, generate, llama_cpp_module
from localrun.engine.loop import evaluate
from localrun.errors import SessionError, UsageError
from localrun.runtime.sessions import Sessions as SessionStore
from localrun.store.sessions import MIN_PREFIX_TOKENS, cache_max_bytes, check_name, unpack_tokens

GREEDY = SamplingOptions(temperature=0, max_tokens=12)
SYSTEM = (
    "You are a careful assistant for a small museum of clocks. Visitors ask about the collection, the opening hours, "
    "the guided tours and the history of timekeeping, from water clocks and sundials to pendulums, balance springs "
    "and quartz. Answer in one or two short sentences, and say so plainly when you do not know."
)
FIRST = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "When was the pendulum clock invented?"}]
SECOND_QUESTION = "Who invented it?"
SHORT_QUESTION = "Is the museum open on Mondays?"


def visitor_log(entries: int) -> str:
    return "Summarise this visitor log in one sentence: " + " ".join(
        f"visitor {i} looked at clock {i * 7 % 31} for {i % 9 + 1} minutes;" for i in range(entries)
    )


HERE = Path(__file__).resolve()
# One thread per engine: llama.cpp's threads spin at barriers, so on a busy two-core machine two threads can
# run several times slower than one. These tests are about files and processes; the speed is the benchmark's.
THREADS = 1


def run_all(engine: Engine, tokens: list[int]):
    """Greedy-generate for `tokens`; returns the ids generated and the stats."""
    from types import SimpleNamespace

    responses = list(generate(engine, tokens, GREEDY))
    assert responses[-1].done
    return SimpleNamespace(tokens=[t for r in responses for t in r.tokens], stats=responses[-1].stats)


def chat_tokens(engine: Engine, messages: list[dict]) -> list[int]:
    """A plain transcript (gemma-3-270m's file has no chat template; the store does not care)."""
    return engine.tokenize("".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant:")


def child(*args: str, timeout: float = 120) -> dict:
    """Run this file as a script in a fresh Python process; it prints one JSON object."""
    proc = subprocess.run(
        [sys.executable, str(HERE), *args], capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
    )
    assert proc.returncode == 0, proc.stderr
    from conftest import last_json  # (this file also runs as a script, where conftest is not importable)

    return last_json(proc.stdout)


@pytest.fixture(scope="module")
def smol(smollm2):
    with Engine(smollm2, LoadOptions(n_ctx=1024, n_threads=THREADS)) as engine:
        yield engine


@pytest.fixture(scope="module")
def gem(gemma):
    with Engine(gemma, LoadOptions(n_ctx=1024, n_threads=THREADS)) as engine:
        yield engine


@pytest.fixture
def store():
    with SessionStore.open() as s:  # under the test's own LOCALRUN_HOME
        yield s


# -- pure pieces -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "raw, want",
    [("", 2_000_000_000), ("0", 0), ("500M", 500_000_000), ("2GB", 2_000_000_000), ("1.5GiB", 1536 << 20), ("64k", 64_000)],
)
def test_cache_max_parses_sizes(raw, want, monkeypatch):
    monkeypatch.setenv("LOCALRUN_CACHE_MAX", raw)
    assert cache_max_bytes() == want


def test_cache_max_rejects_nonsense(monkeypatch):
    monkeypatch.setenv("LOCALRUN_CACHE_MAX", "lots")
    with pytest.raises(UsageError, match="LOCALRUN_CACHE_MAX='lots'"):
        cache_max_bytes()


@pytest.mark.parametrize("bad", ["", ".hidden", "a/b", "../x", "x" * 101, "with space", "-dash"])
def test_session_names_are_checked(bad):
    with pytest.raises(UsageError, match="invalid session name"):
        check_name(bad)
    assert check_name("chat-2024.v1_a") == "chat-2024.v1_a"


def test_migrations_are_recorded_once_by_name(tmp_path):
    SessionStore.open(tmp_path / "s").close()
    with SessionStore.open(tmp_path / "s") as again:
        names = [row[0] for row in again.db.execute("SELECT name FROM _migrations")]
    assert names == ["m001_initial", "m002_prefix_chunks", "m003_adapters"]


# -- fidelity --------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("which", ["smollm2", "gemma"])
def test_resume_in_another_process_continues_token_for_token(which, request, tmp_path):
    path = str(request.getfixturevalue(which))
    root = str(tmp_path / "store")
    saved = child("resume-save", path, root)
    resumed = child("resume-load", path, root)
    assert saved["continuation"], "the model produced nothing to compare"
    assert resumed["continuation"] == saved["continuation"]
    # The resumed process reused all that the saving one held and evaluated only the new turn.
    assert resumed["cached_tokens"] == saved["cached_tokens"] == saved["saved_tokens"]
    assert resumed["prompt_tokens"] - resumed["cached_tokens"] < 20
    assert resumed["messages"] == saved["messages"]


# On gemma-3 the first question is long enough (~600 tokens) that cutting a restored state back to the
# shared system prompt needs the sliding-window layers' history from before the last 512-token window.
@pytest.mark.slow
@pytest.mark.parametrize("which, entries", [("smol", 6), ("gem", 36)])
def test_prefix_reuse_evaluates_only_the_new_question(which, entries, request, store):
    engine: Engine = request.getfixturevalue(which)
    engine.reset()
    first = chat_tokens(engine, [{"role": "system", "content": SYSTEM}, {"role": "user", "content": visitor_log(entries)}])
    second = chat_tokens(engine, [{"role": "system", "content": SYSTEM}, {"role": "user", "content": SHORT_QUESTION}])
    shared = next(i for i, (a, b) in enumerate(zip(first, second)) if a != b)
    assert shared >= MIN_PREFIX_TOKENS
    run_all(engine, first)
    entry = store.save_prefix(engine)
    assert entry is not None and entry.kind == "prefix" and entry.tokens == len(engine.kv.tokens[0])
    held = list(engine.kv.tokens[0])

    # The reference: the same engine carries on without any restore, cutting its cache back to the shared
    # prefix. (A cold single-pass prefill is no oracle: llama.cpp's float rounding depends on batch shapes,
    # and on gemma-3 the greedy paths part after about ten tokens.)
    direct = run_all(engine, second)
    assert direct.stats.cached_tokens == shared

    engine.reset()
    assert store.lookup_prefix(engine, second) == shared
    assert engine.kv.tokens[0] == held[:shared]  # the chunks' tokens up to where the prompts part, no more
    if which == "gem":  # the sliding-window layers came back whole, not just their last window
        assert llama_cpp_module().llama_memory_seq_pos_min(engine.kv.memory, 0) == 0
    warm = run_all(engine, second)
    assert warm.stats.cached_tokens == shared
    assert warm.stats.prompt_eval_tokens == len(second) - shared
    assert warm.tokens == direct.tokens

    # Nothing better to restore now, and nothing for an unrelated prompt.
    assert store.lookup_prefix(engine, second) == 0
    engine.reset()
    assert store.lookup_prefix(engine, engine.tokenize("Unrelated text. " * 30)) == 0
    assert engine.kv.tokens[0] == []


@pytest.mark.slow
def test_prefix_entries_are_per_model(smol, gem, store):
    tokens = chat_tokens(smol, FIRST)
    assert len(tokens) >= MIN_PREFIX_TOKENS
    smol.reset()
    evaluate(smol, tokens)
    assert store.save_prefix(smol) is not None
    assert store.save_prefix(smol) is None  # already stored
    gem.reset()
    assert store.lookup_prefix(gem, chat_tokens(gem, FIRST)) == 0


# -- refusals --------------------------------------------------------------------------------


def _save_small(store: SessionStore, engine: Engine, name: str, ref: str) -> list[dict]:
    engine.reset()
    evaluate(engine, engine.tokenize(KILL_VARIANTS["long"]))  # ~30 tokens
    messages = [{"role": "user", "content": "note"}]
    store.save(name, engine, messages, model_ref=ref)
    return messages


@pytest.mark.slow
def test_refuses_a_session_from_another_model(smol, gem, store):
    _save_small(store, smol, "notes", "smollm2")
    gem.reset()
    evaluate(gem, gem.tokenize("something else"))
    with pytest.raises(SessionError) as caught:
        store.load("notes", gem)
    message = caught.value.message
    assert "SmolLM2-135M-Instruct.Q4_1.gguf (Q4_1)" in message and "gemma-3-270m-q4_k_m.gguf (Q4_K_M)" in message
    assert "\n" not in message and caught.value.exit_code == 1
    assert [s.name for s in store.list()] == ["notes"]  # refused, not removed
    assert store.load("notes", smol) == [{"role": "user", "content": "note"}]


@pytest.mark.slow
def test_refuses_other_kv_type_swa_full_build_and_too_small_context(smollm2, gemma, smol, gem, store):
    _save_small(store, smol, "smol", "smollm2")
    with Engine(smollm2, LoadOptions(n_ctx=1024, kv_type="q8_0", n_threads=THREADS)) as q8:
        with pytest.raises(SessionError, match="KV cache type f16, not q8_0") as other_kv:
            store.load("smol", q8)
    with Engine(smollm2, LoadOptions(n_ctx=16, n_threads=THREADS)) as tiny:
        with pytest.raises(SessionError, match=r"holds \d+ tokens but the context holds 16$") as too_small:
            store.load("smol", tiny)
    # The store names the setting and the value that resumes it; the command line words it as its flag.
    from localrun.cli.failures import message_for

    assert (other_kv.value.setting, other_kv.value.saved) == ("kv_type", "f16")
    assert message_for(other_kv.value)[0].endswith("resume it with --kv-type f16")
    assert (too_small.value.setting, too_small.value.saved) == ("ctx", 1024)
    assert message_for(too_small.value)[0].endswith(": resume it with --ctx 1024")

    _save_small(store, gem, "gem", "gemma")
    with Engine(gemma, LoadOptions(n_ctx=1024, swa_full=False, n_threads=THREADS)) as windowed:
        with pytest.raises(SessionError, match="swa_full=True"):
            store.load("gem", windowed)

    with sqlite3.connect(store.root / "index.sqlite") as db:  # as if written by another llama.cpp
        db.execute("UPDATE entries SET build = 'llama-cpp-python 0.3.1' WHERE name = 'smol'")
    with pytest.raises(SessionError, match="saved by llama-cpp-python 0.3.1, this is llama-cpp-python"):
        store.load("smol", smol)


@pytest.mark.slow
@pytest.mark.parametrize("damage", ["truncate", "flip", "delete"])
def test_damaged_state_is_reported_and_removed_and_the_messages_kept(damage, smol, store):
    """The state is a cache of what the messages compute: a damaged one goes (said), the messages, the user's,
    stay and come back without it (the next answer evaluates them again, and its save replaces the entry)."""
    messages = _save_small(store, smol, "fragile", "smollm2")
    state = store.states / store.db.execute("SELECT state_file FROM entries WHERE name = 'fragile'").fetchone()[0]
    if damage == "truncate":
        with open(state, "r+b") as f:
            f.truncate(state.stat().st_size // 2)
    elif damage == "flip":
        with open(state, "r+b") as f:
            f.seek(state.stat().st_size - 100)
            byte = f.read(1)
            f.seek(-1, os.SEEK_CUR)
            f.write(bytes([byte[0] ^ 0x01]))
    else:
        state.unlink()
    evaluate(smol, smol.tokenize("unrelated"))
    before = list(smol.kv.tokens[0])
    said = []
    assert store.load("fragile", smol, on_notice=said.append) == messages
    assert len(said) == 1 and re.search(r"session 'fragile': its saved KV cache was damaged \(.+\) and is removed", said[0])
    assert not state.exists() and [s.name for s in store.list()] == ["fragile"]
    assert smol.kv.tokens[0] == before  # nothing restored
    said.clear()
    assert store.load("fragile", smol, on_notice=said.append) == messages and said == []  # again: said once, not each time
    assert [s.tokens for s in store.list() if s.name == "fragile"] == [0]
    store.save("fragile", smol, messages, model_ref="smollm2")  # the next answer's save: whole again
    assert store.load("fragile", smol) == messages and smol.kv.tokens[0] == before


@pytest.mark.slow
def test_a_session_the_engine_still_holds_is_not_read_back(smol, store):
    """A resident model that answered a session last resumes it from memory: the state file is not read (here
    it is gone, and loading still works); once the engine holds something else it is read from disk."""
    messages = _save_small(store, smol, "hot", "smollm2")
    held = list(smol.kv.tokens[0])
    state = store.states / store.db.execute("SELECT state_file FROM entries WHERE name = 'hot'").fetchone()[0]
    state.unlink()
    assert store.load("hot", smol) == messages
    assert smol.kv.tokens[0] == held
    evaluate(smol, smol.tokenize("unrelated"))
    said = []
    assert store.load("hot", smol, on_notice=said.append) == messages and "state file" in said[0]  # missing: said


# -- faults and concurrency ------------------------------------------------------------------


@pytest.mark.slow
def test_kill9_during_save_never_leaves_a_torn_session(smollm2, smol, tmp_path):
    root = tmp_path / "store"
    variants = {}
    for name, text in KILL_VARIANTS.items():  # the child restores these instead of evaluating anything
        smol.reset()
        evaluate(smol, smol.tokenize(text))
        variants[name] = list(smol.kv.tokens[0])
        (tmp_path / f"{name}.kv").write_bytes(smol.kv.state_bytes())
        (tmp_path / f"{name}.json").write_text(json.dumps(variants[name]))
    rng = random.Random(1234)
    committed = False
    outcomes = []
    # Each saver is a process of its own, killed -9 at a random moment of its saves; a fork of one that loaded
    # the model once (see `fork-savers` below), so that twenty kills cost twenty forks, not twenty starts.
    savers = subprocess.Popen(
        [sys.executable, str(HERE), "fork-savers", str(smollm2), str(root), str(tmp_path)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.PIPE,
    )
    pid = None

    def said() -> str:  # (what the savers wrote to stderr, once they end)
        savers.stdin.close()
        return savers.stderr.read()

    try:
        assert savers.stdout.readline().strip() == "loaded", said()
        for _ in range(20):
            savers.stdin.write("save\n")
            savers.stdin.flush()
            ready = savers.stdout.readline().split()
            assert ready[:1] == ["ready"], said()
            pid = int(ready[1])
            try:
                time.sleep(rng.uniform(0.0, 0.25))
            finally:
                os.kill(pid, signal.SIGKILL)
            reaped = savers.stdout.readline().split()  # the saver is gone before the store is opened
            assert reaped[:1] == ["reaped"], said()
            pid, status = None, int(reaped[1])
            assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, (status, said())  # killed saving
            with SessionStore.open(root) as store:
                try:
                    messages = store.load("k", smol)
                except SessionError as exc:
                    assert not committed and "no session named 'k'" in exc.message, exc.message
                    outcomes.append("none")
                    continue
                committed = True
                variant = messages[0]["content"]
                assert smol.kv.tokens[0] == variants[variant]  # the row and the state file belong to the same save
                assert llama_cpp_module().llama_memory_seq_pos_max(smol.kv.memory, 0) == len(variants[variant]) - 1
                outcomes.append(variant)
        savers.stdin.close()
        assert savers.wait(timeout=60) == 0, savers.stderr.read()
    finally:
        if pid is not None:
            os.kill(pid, signal.SIGKILL)
        if savers.poll() is None:
            savers.kill()
            savers.wait()
    assert committed, outcomes
    # Whatever the kills left behind unreferenced is swept once it is old enough.
    with SessionStore.open(root) as store:
        for leftover in store.states.iterdir():
            os.utime(leftover, (time.time() - 3600, time.time() - 3600))
        store.prune(1 << 40)
        live = store.db.execute("SELECT state_file FROM entries").fetchall()
        assert sorted(p.name for p in store.states.iterdir()) == sorted(row[0] for row in live)
        assert store.load("k", smol)


@pytest.mark.slow
def test_two_processes_saving_one_name_never_interleave(smollm2, smol, tmp_path):
    root = tmp_path / "store"
    go = tmp_path / "go"
    procs = [
        subprocess.Popen(
            [sys.executable, str(HERE), "save-ten-times", str(smollm2), str(root), tag, str(go)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL,
        )
        for tag in WRITER_TAGS
    ]
    for proc in procs:
        assert proc.stdout.readline().strip() == "ready", proc.stderr.read()
    go.touch()
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        assert json.loads(out)["saved"] == 10
    with SessionStore.open(root) as store:
        messages = store.load("shared", smol)
        tag = messages[0]["content"]
        assert tag in WRITER_TAGS
        assert smol.kv.tokens[0] == smol.tokenize(WRITER_TAGS[tag])
        assert [s.name for s in store.list()] == ["shared"]
        assert len(list(store.states.iterdir())) == 1  # every replaced state was deleted


# -- eviction --------------------------------------------------------------------------------


@pytest.mark.slow
def test_prune_and_the_cache_cap_keep_named_sessions(smol, store, monkeypatch):
    base = chat_tokens(smol, [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Hello"}])
    _save_small(store, smol, "keep-me", "smollm2")
    smol.reset()
    evaluate(smol, base)
    prompts = [base + smol.tokenize(f" question number {i}", add_special=False) for i in range(4)]
    entries = []
    for i in range(3):  # three prefix entries that do not extend one another (prefill cuts back to `base`)
        evaluate(smol, prompts[i])
        entry = store.save_prefix(smol)
        assert entry is not None
        entries.append(entry)
        time.sleep(0.01)
    sizes = [e.size for e in entries]
    named_size = store.show("keep-me").size
    assert store.total_bytes() == named_size + sum(sizes)

    def held() -> list[list[int]]:
        """The tokens of the prefix entries still stored, most recently used first (each is one chunk here:
        the prompts are shorter than PREFIX_CHUNK_TOKENS)."""
        rows = store.db.execute("SELECT tokens FROM prefix_chunks ORDER BY last_used DESC, end_pos DESC")
        return [unpack_tokens(row[0]) for row in rows]

    assert held() == [prompts[2], prompts[1], prompts[0]]
    # Using the oldest entry makes it the most recently used: least recently used is not oldest created.
    smol.reset()
    assert store.lookup_prefix(smol, prompts[0]) == len(prompts[0]) - 1  # (its last token is evaluated again)
    assert held() == [prompts[0], prompts[2], prompts[1]]
    time.sleep(0.01)

    # The cap applies to prefix entries only and evicts the least recently used: entries 1 and 2 go,
    # entry 0 (just used) and the new one stay.
    monkeypatch.setenv("LOCALRUN_CACHE_MAX", str(sizes[0] + sizes[2] + 10))
    evaluate(smol, prompts[3])
    newest = store.save_prefix(smol)
    assert newest is not None
    prefixes = [s for s in store.list(prefixes=True) if s.kind == "prefix"]
    assert [p.checksum for p in prefixes] == [newest.checksum, entries[0].checksum]
    assert held() == [prompts[3], prompts[0]]
    assert store.total_bytes("prefix") <= sizes[0] + sizes[2] + 10
    assert [s.name for s in store.list()] == ["keep-me"]

    removed = store.prune(0)
    # Least recently used first: entry 0 (used before the newest was saved), then the newest.
    assert [(r.kind, r.checksum) for r in removed] == [("prefix", entries[0].checksum), ("prefix", newest.checksum)]
    assert [s.name for s in store.list(prefixes=True)] == ["keep-me"]
    assert store.load("keep-me", smol)

    removed = store.prune(0, named=True)
    assert [r.name for r in removed] == ["keep-me"]
    assert store.list(prefixes=True) == [] and list(store.states.iterdir()) == list(store.prefix.iterdir()) == []


@pytest.mark.slow
def test_save_replaces_keeps_created_and_remove_forgets(smol, store):
    _save_small(store, smol, "chat", "smollm2")
    first = store.show("chat")
    time.sleep(0.01)
    evaluate(smol, smol.kv.tokens[0] + smol.tokenize(" More text.", add_special=False))
    second = store.save("chat", smol, [{"role": "user", "content": "v2"}], model_ref="smollm2")
    assert second.created == first.created and second.last_used > first.last_used
    assert second.tokens > first.tokens and second.messages == [{"role": "user", "content": "v2"}]
    assert len(list(store.states.iterdir())) == 1
    assert store.remove("chat").name == "chat"
    assert store.list() == [] and list(store.states.iterdir()) == []
    with pytest.raises(SessionError, match="no session named 'chat'"):
        store.remove("chat")


# -- the child processes ---------------------------------------------------------------------

KILL_VARIANTS = {
    "short": "Clocks.",
    "long": "The pendulum clock was invented by Christiaan Huygens in 1656, and it kept time far better than anything before it.",
}
WRITER_TAGS = {
    "A": "Writer A saves this text about escapements.",
    "B": "Writer B saves a different, somewhat longer text about the balance springs of pocket watches.",
}


def child_main(argv: list[str]) -> None:
    command, model, root = argv[0], argv[1], Path(argv[2])
    engine = Engine(model, LoadOptions(n_ctx=1024 if command.startswith("resume") else 512, n_threads=THREADS))
    if command == "fork-savers":
        fork_savers(engine, root, Path(argv[3]))
        return
    store = SessionStore.open(root)

    if command == "resume-save":
        first = run_all(engine, chat_tokens(engine, FIRST))
        messages = FIRST + [{"role": "assistant", "content": engine.detokenize(first.tokens).strip()}]
        info = store.save("chat", engine, messages, model_ref=Path(model).name)
        # The reference: the same process carries on without any restore.
        follow = messages + [{"role": "user", "content": SECOND_QUESTION}]
        done = run_all(engine, chat_tokens(engine, follow))
        print(json.dumps({
            "saved_tokens": info.tokens, "continuation": done.tokens, "cached_tokens": done.stats.cached_tokens,
            "messages": messages,
        }))
    elif command == "resume-load":
        messages = store.load("chat", engine)
        prompt = chat_tokens(engine, messages + [{"role": "user", "content": SECOND_QUESTION}])
        done = run_all(engine, prompt)
        print(json.dumps({
            "continuation": done.tokens, "cached_tokens": done.stats.cached_tokens,
            "prompt_tokens": done.stats.prompt_tokens, "messages": messages,
        }))
    elif command == "save-ten-times":
        tag, go = argv[3], Path(argv[4])
        evaluate(engine, engine.tokenize(WRITER_TAGS[tag]))
        print("ready", flush=True)
        while not go.exists():
            time.sleep(0.005)
        for _ in range(10):
            store.save("shared", engine, [{"role": "user", "content": tag}], model_ref="smollm2")
        print(json.dumps({"saved": 10}))
    else:
        raise SystemExit(f"unknown command {command}")


def fork_savers(engine: Engine, root: Path, given: Path) -> None:
    """For each line read, fork a saver: a process that opens the store, says "ready PID", and saves session
    "k" as one KILL_VARIANTS state, then the other, until it is killed; once it is gone, say "reaped STATUS".
    The saver is a process of its own (its own store connection, locks and open files, killed whole), made
    from this one after the model is loaded (most of a second each time) and hashed."""
    states = {
        name: (bytearray((given / f"{name}.kv").read_bytes()), json.loads((given / f"{name}.json").read_text()))
        for name in KILL_VARIANTS
    }
    # The model file hashed and the hash cached in the index, as the first save that ends does: a 100 MB hash in
    # each saver took the whole of its life on a busy machine (killed within 0.25 s, none ever saved).
    with SessionStore.open(root) as store:
        store.model_sha256(list(engine.info.shards) or [engine.path])
    me = os.getpid()
    print("loaded", flush=True)
    for _ in sys.stdin:
        pid = os.fork()
        if pid == 0:
            try:
                store = SessionStore.open(root)
                print(f"ready {os.getpid()}", flush=True)
                while os.getppid() == me:  # until killed (or orphaned)
                    for name, (data, tokens) in states.items():
                        assert engine.kv.restore(data, tokens)
                        store.save("k", engine, [{"role": "user", "content": name}], model_ref="smollm2")
            except BaseException:
                import traceback

                traceback.print_exc()
            finally:
                sys.stderr.flush()
                os._exit(1)
        _, status = os.waitpid(pid, 0)
        print(f"reaped {status}", flush=True)


if __name__ == "__main__":
    child_main(sys.argv[1:])
