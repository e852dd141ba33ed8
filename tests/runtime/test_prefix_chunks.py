"""The prefix cache in chunks keyed by the prefix they extend: what prompts share is stored once, a prompt comes
back from the chunks of its longest stored prefix exactly as it was, eviction takes the least recently used
chains from their ends, a damaged chunk is removed (said once) and the answer stays right, and a save is written
after its slot is given back. Real llama.cpp and a real GGUF (SmolLM2 where an answer is compared, the tiny
model of tests/tinymodel.py, SmolLM2's tokenizer on random weights, where only sizes, counts and locks are),
real processes where they must be separate; the cutting and joining of states also on made-up states that say
in every byte where they came from."""

from __future__ import annotations

import os
import random
import sqlite3
import struct
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from conftest import LOCALRUN, last_json, wait_until

from localrun.engine import Engine, LoadOptions, SamplingOptions, generate
from localrun.engine.kv import StateJoiner, StateLayout, cut_state
from localrun.engine.loop import evaluate
from localrun.runtime.sessions import Sessions, wait_for_saves
from localrun.store.sessions import PREFIX_CHUNK_TOKENS as CHUNK

GREEDY = SamplingOptions(temperature=0, max_tokens=12)
TEXT = (Path(__file__).resolve().parents[2] / "src" / "localrun" / "data" / "wonderland.txt").read_text()
THREADS = 1  # (see tests/store/test_sessions.py: one thread per engine on a busy two-core machine)


# -- cutting and joining, on made-up states --------------------------------------------------------------


def made_state(n: int, *, layers=3, k_row=8, v_row=6, v_trans=False, element=2, ext=False, caches=1,
               order=None, no_v=False) -> bytearray:
    """A state in llama.cpp's one-stream layout (src/llama-kv-cache.cpp, state_write) of n cells at positions
    0..n-1, written in `order`, whose every row byte says which cell, layer and cache it belongs to. `no_v`: as
    an MLA model's (DeepSeek), whose layers keep no V."""
    order = list(range(n)) if order is None else order
    out = bytearray(struct.pack("<Ii", 0xAF143CD8, 0))
    for c in range(caches):
        out += struct.pack("<II", 1, n)
        for i in order:
            out += struct.pack("<iI", i, 1) + (struct.pack("<iii", i % 5, i % 3, 1000 + i) if ext else b"") + struct.pack("<i", 0)
        out += struct.pack("<II", int(v_trans), layers)
        for layer in range(layers):
            out += struct.pack("<iQ", 1, k_row)
            for i in order:
                out += bytes((i + 7 * layer + 13 * c + j) % 251 for j in range(k_row))
        for layer in range(0 if no_v else layers):
            if v_trans:
                out += struct.pack("<iII", 1, element, v_row)
                for j in range(v_row):
                    for i in order:
                        out += bytes((3 * i + layer + 5 * j + c + e) % 251 for e in range(element))
            else:
                out += struct.pack("<iQ", 1, v_row)
                for i in order:
                    out += bytes((3 * i + layer + c + j) % 251 for j in range(v_row))
    return out


SHAPES = [{}, {"v_trans": True}, {"ext": True}, {"caches": 2, "v_trans": True, "ext": True}, {"no_v": True}]
IDS = ["rows", "v-transposed", "cell-ext", "two-caches", "no-v"]


@pytest.mark.parametrize("shape", SHAPES, ids=IDS)
def test_chunks_put_back_together_are_the_state_byte_for_byte(shape):
    whole = made_state(50, **shape)
    layout = StateLayout(whole)
    assert (layout.cells, layout.base) == (50, 0)
    for bounds in [(0, 50), (0, 16, 32, 48, 50), (0, 1, 49, 50)]:
        chunks = [cut_state(whole, layout, a, b) for a, b in zip(bounds, bounds[1:])]
        assert [StateLayout(c).base for c in chunks] == list(bounds[:-1])
        joiner = StateJoiner(chunks[0], 50)
        for chunk in chunks:
            joiner.add(chunk)
        assert joiner.result() == whole
    # The first 40 cells: the chunk where the prompt parts is cut, and so is the state made of them.
    chunks = [cut_state(whole, layout, a, b) for a, b in [(0, 16), (16, 32), (32, 50)]]
    joiner = StateJoiner(chunks[0], 40)
    for chunk, take in zip(chunks, (16, 16, 8)):
        joiner.add(chunk, take)
    assert joiner.result() == made_state(40, **shape)
    # A chunk found damaged after two: the state of what came before it.
    joiner = StateJoiner(chunks[0], 50)
    joiner.add(chunks[0])
    joiner.add(chunks[1])
    assert joiner.result() == made_state(32, **shape)


@pytest.mark.parametrize("shape", SHAPES, ids=IDS)
def test_cells_written_out_of_position_order_are_cut_by_position(shape):
    """A slot's cells in a KV pool that several slots share lie wherever there was room: in a state they
    come in cell order. A chunk holds positions a..b-1 whatever their order there."""
    order = list(range(60))
    random.Random(7).shuffle(order)
    scattered = made_state(60, order=order, **shape)
    layout = StateLayout(scattered)
    chunks = [cut_state(scattered, layout, a, b) for a, b in [(0, 25), (25, 60)]]
    joiner = StateJoiner(chunks[0], 60)
    for chunk in chunks:
        joiner.add(chunk)
    assert joiner.result() == made_state(60, **shape)


def test_states_that_cannot_be_cut_are_refused():
    shared = made_state(4)
    struct.pack_into("<I", shared, 8 + 8 + 4, 2)  # the first cell held by two sequences
    twice = made_state(4)
    struct.pack_into("<i", twice, 8 + 8 + 12, 0)  # two cells at position 0 (an image's 2-D positions)
    for bad in (shared, twice, made_state(4)[:-1], bytearray(b"\0" * 64)):
        with pytest.raises(ValueError):
            StateLayout(bad)
    whole, other = made_state(32), made_state(32, k_row=16)
    joiner = StateJoiner(cut_state(whole, StateLayout(whole), 0, 16), 32)
    with pytest.raises(ValueError, match="another layout"):
        joiner.add(cut_state(other, StateLayout(other), 0, 16))
    with pytest.raises(ValueError, match="where 0 comes next"):
        joiner.add(cut_state(whole, StateLayout(whole), 16, 32))


def test_the_old_caches_whole_states_are_dropped_and_never_read_as_chunks(tmp_path):
    """A store of the whole-state prefix cache (one state file per prompt): its prefix entries go with the
    migration, their files with them; its sessions stay."""
    import time

    from localrun.store.sessions import SessionStore, m001_initial, pack_tokens

    root = tmp_path / "store"
    (root / "states").mkdir(parents=True)
    db = sqlite3.connect(root / "index.sqlite", isolation_level=None)
    db.execute("CREATE TABLE _migrations (name TEXT PRIMARY KEY, applied REAL NOT NULL)")
    m001_initial(db)
    db.execute("INSERT INTO _migrations VALUES ('m001_initial', ?)", (time.time(),))
    for name, kind in (("chat", "session"), (None, "prefix")):
        state = made_state(100)
        (root / "states" / f"{kind}.kv").write_bytes(state)
        db.execute("INSERT INTO entries (name, kind, model_ref, model_file, model_sha256, quant, n_ctx, kv_type, swa_full,"
                   " flash_attn, build, system_info, n_tokens, tokens, head_hash, messages, state_file, state_size, checksum,"
                   " created, last_used) VALUES (?, ?, 'm', 'm.gguf', 'abc', 'Q4_1', 1024, 'f16', 0, 'auto', 'b', 's', 100, ?,"
                   " NULL, '[]', ?, ?, 'crc32:0', 1, 1)", (name, kind, pack_tokens(range(100)), f"{kind}.kv", len(state)))
    db.close()
    with SessionStore.open(root) as store:
        assert [(e.name, e.kind) for e in store.list(prefixes=True)] == [("chat", "session")]
        assert sorted(p.name for p in store.states.iterdir()) == ["session.kv"] and list(store.prefix.iterdir()) == []
        assert store.total_bytes("prefix") == 0


# -- on a real model ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def smol(smollm2):
    with Engine(smollm2, LoadOptions(n_ctx=2048, n_threads=THREADS, flash_attn=False)) as engine:
        yield engine


@pytest.fixture(scope="module")
def tiny(tiny_smollm2):
    """SmolLM2's tokenizer (a text is the same tokens, so the same chunks) on two layers of random weights: a
    prompt of a thousand tokens is evaluated in a second where SmolLM2 takes ten or more; for the tests that
    compare no answer."""
    with Engine(tiny_smollm2, LoadOptions(n_ctx=2048, n_threads=THREADS, flash_attn=False)) as engine:
        yield engine


@pytest.fixture(scope="module")
def doc(smol) -> tuple[list[int], bytearray]:
    """TEXT's first 774 tokens (just over three chunks) evaluated on `smol` once for the module, and the KV
    state the engine then holds: a test restores it (byte for byte the engine's own) and carries on from it."""
    tokens = smol.tokenize(TEXT[:3000])
    assert len(tokens) > 3 * CHUNK
    smol.reset()
    evaluate(smol, tokens)
    return tokens, smol.kv.state_bytes()


def holding(engine: Engine, doc: tuple[list[int], bytearray]) -> list[int]:
    """Make `engine` hold `doc`'s evaluated tokens, as if it had just evaluated them; those tokens."""
    tokens, state = doc
    engine.reset()
    assert engine.kv.restore(bytearray(state), tokens)
    return list(tokens)


@pytest.fixture
def store():
    with Sessions.open() as s:  # under the test's own LOCALRUN_HOME
        yield s


def on_disk(store) -> int:
    return sum(p.stat().st_size for p in store.prefix.iterdir())


def answer(engine: Engine, tokens: list[int]):
    responses = list(generate(engine, tokens, GREEDY))
    return [t for r in responses for t in r.tokens], responses[-1].stats


def test_prompts_sharing_a_long_prefix_store_it_once(tiny, store, monkeypatch):
    monkeypatch.setattr("localrun.store.sessions.WRITE_BATCH", 3)  # (the first save commits its chunks in two batches)
    doc = tiny.tokenize(TEXT[:4000])
    assert len(doc) > 3 * CHUNK
    first = doc + tiny.tokenize("\nWho is the story about?", add_special=False)
    second = doc + tiny.tokenize("\nWhere did Alice fall?", add_special=False)
    tiny.reset()
    evaluate(tiny, first)
    one = store.save_prefix(tiny)
    assert one is not None and one.tokens == len(first)
    copy = on_disk(store)
    per_token = copy / len(first)
    assert len(list(store.prefix.iterdir())) == -(-len(first) // CHUNK)

    evaluate(tiny, second)  # (the engine keeps the shared document: only the question is evaluated)
    two = store.save_prefix(tiny)
    assert two is not None and two.tokens == len(second)
    both = on_disk(store)
    # One copy of the document's whole chunks, and each prompt's last chunk: from where the chunk the prompts
    # part in starts. Two whole states were `2 * copy`.
    start = len(doc) // CHUNK * CHUNK
    assert both == store.total_bytes("prefix") == store.total_bytes()
    assert abs(both - copy - (len(second) - start) * per_token) < 0.01 * copy
    assert both < 1.3 * copy
    listed = store.list(prefixes=True)
    assert [e.tokens for e in listed] == [len(second), len(first)] and sum(e.size for e in listed) == both

    # Both come back from the chunks: the longest prefix each shares with a third prompt.
    third = doc + tiny.tokenize("\nWhere did Alice fall down?", add_special=False)
    shared = next(i for i, (a, b) in enumerate(zip(second, third)) if a != b)
    tiny.reset()
    assert store.lookup_prefix(tiny, third) == shared and tiny.kv.tokens[0] == third[:shared]


def test_a_prompt_from_chunks_answers_as_the_engine_that_made_them(smol, doc, store):
    """The chunks are the engine's own KV, cut and put back byte for byte: a prompt restored from them (its
    prefix parting mid-chunk) answers exactly as the engine carrying on from its own cache does. (A cold
    prefill is no oracle: llama.cpp's rounding depends on batch shapes; the CLI test below compares with one.)"""
    shared_doc = holding(smol, doc)
    first = shared_doc + smol.tokenize("\nWho is the story about?", add_special=False)
    second = shared_doc + smol.tokenize("\nWhat did the rabbit take out of its pocket?", add_special=False)
    evaluate(smol, first)  # (only the question: the engine holds the document)
    assert smol.kv.tokens[0] == first
    state = smol.kv.state_bytes()
    assert store.save_prefix(smol) is not None
    direct, direct_stats = answer(smol, second)
    shared = direct_stats.cached_tokens
    assert shared > 3 * CHUNK and shared % CHUNK

    smol.reset()
    assert store.lookup_prefix(smol, second) == shared
    layout = StateLayout(state)
    assert smol.kv.state_bytes() == cut_state(state, layout, 0, shared)  # the engine's own bytes, no more
    warm, stats = answer(smol, second)
    assert stats.cached_tokens == shared and stats.prompt_eval_tokens == len(second) - shared
    assert warm == direct


def test_eviction_keeps_the_most_recent_chains_whole(tiny, store, monkeypatch):
    """Under a cap, the least recently used chains lose their last chunks first; the prefixes used last stay
    whole, and what is left of a shortened chain still serves its prompt's first tokens."""
    a, b, c = [tiny.tokenize(TEXT[i * 4000 : (i + 1) * 4000])[: 3 * CHUNK + 100] for i in range(3)]
    assert len({len(a), len(b), len(c), 3 * CHUNK + 100}) == 1

    def restored(prompt) -> int:
        tiny.reset()
        return store.lookup_prefix(tiny, prompt + [prompt[-1]])

    for prompt in (a, b):
        tiny.reset()
        evaluate(tiny, prompt)
        assert store.save_prefix(tiny) is not None
    chain = on_disk(store) / 2  # one prompt's chunks
    chunk = chain / len(a) * CHUNK  # about one full chunk's bytes
    assert restored(a) == len(a)  # A used again: B is now the least recently used

    # Room for two chains and a chunk and a half: B, the least recently used, keeps its first chunk only.
    cap = int(2 * chain + 1.5 * chunk)
    monkeypatch.setenv("LOCALRUN_CACHE_MAX", str(cap))
    tiny.reset()
    evaluate(tiny, c)
    newest = store.save_prefix(tiny)
    assert newest is not None and newest.tokens == len(c)
    assert on_disk(store) == store.total_bytes("prefix") <= cap
    assert restored(c) == len(c)  # the newest, whole
    assert restored(a) == len(a)  # used before it, whole
    assert restored(b) == CHUNK
    assert [e.tokens for e in store.list(prefixes=True)] == [CHUNK, len(a), len(c)]  # most recently used first

    # Less room: C, the least recently used now, loses its last chunks; B's first chunk and A stay.
    cap = int(chain + 2.5 * chunk)
    store.trim_prefixes(cap)
    assert on_disk(store) == store.total_bytes("prefix") <= cap
    assert restored(a) == len(a)
    assert restored(b) == CHUNK
    assert restored(c) == CHUNK


@pytest.mark.parametrize("damage", ["flip", "truncate", "delete"])
def test_a_damaged_chunk_is_removed_said_once_and_the_answer_stays_right(damage, smol, doc, store):
    prompt = holding(smol, doc)  # TEXT[:3000], evaluated
    question = prompt + smol.tokenize("\nWho is the story about?", add_special=False)
    assert store.save_prefix(smol) is not None
    direct, _ = answer(smol, question)
    assert len(prompt) > 3 * CHUNK
    second = store.store.db.execute("SELECT file FROM prefix_chunks WHERE start_pos = ?", (CHUNK,)).fetchone()[0]
    path = store.prefix / second
    if damage == "flip":
        with open(path, "r+b") as f:
            f.seek(path.stat().st_size // 2)
            byte = f.read(1)
            f.seek(-1, os.SEEK_CUR)
            f.write(bytes([byte[0] ^ 0x01]))
    elif damage == "truncate":
        os.truncate(path, path.stat().st_size - 1)
    else:
        path.unlink()

    said: list[str] = []
    smol.reset()
    assert store.lookup_prefix(smol, question, on_notice=said.append) == CHUNK  # the chunk before it still serves
    assert len(said) == 1 and "a prefix-cache chunk was damaged" in said[0], said
    warm, stats = answer(smol, question)
    assert stats.cached_tokens == CHUNK and warm == direct
    # The damaged chunk and those after it (nothing reaches them) are gone, from the index and the disk.
    assert [row[0] for row in store.store.db.execute("SELECT start_pos FROM prefix_chunks ORDER BY start_pos")] == [0]
    assert len(list(store.prefix.iterdir())) == 1
    said.clear()
    smol.reset()
    assert store.lookup_prefix(smol, question, on_notice=said.append) == CHUNK and said == []  # said once


def test_a_restart_restores_the_chunks_and_answers_as_a_cold_run(smollm2, cli):
    """`run` in new processes: the second prompt shares the document's ~800 tokens (four chunks, the last cut
    where the questions part), restored from disk, and the answer is the one a run without the cache gives.
    (Without flash attention: see tests/cli/test_run_sessions.py, a row rounds alike in any batch of more than
    one token.)"""
    doc = TEXT[:3000]  # 774 tokens, and the chat template's

    def ask(*args, n="16"):
        r = cli("run", str(smollm2), "-t", "0", "-n", n, "--ctx", "2048", "--threads", str(THREADS), "--json",
                "--no-flash-attn", *args, input=doc)
        assert r.returncode == 0 and "prefix cache" not in r.stderr, r.stderr
        return last_json(r.stdout)

    first = ask("Who is the story about?", n="1")  # (its answer is compared with nothing: it stores the chunks)
    assert first["stats"]["cached_tokens"] == 0 and first["stats"]["prompt_tokens"] > 3 * CHUNK
    second = ask("Where did Alice fall?")
    assert second["stats"]["cached_tokens"] > 3 * CHUNK
    assert second["stats"]["prompt_eval_tokens"] < 40
    cold = ask("--no-cache", "Where did Alice fall?")
    assert cold["stats"]["cached_tokens"] == 0
    assert cold["tokens"] == second["tokens"]


def test_a_model_removed_during_its_answer_skips_the_cache_quietly(smollm2, tmp_path):
    """`localrun rm` of a model while `run` answered: the run ended rc 0 with "prefix cache skipped: [Errno 2]
    No such file or directory" (the sha256 of a file that is gone). It ends as any run, without caching."""
    model = tmp_path / "copy.gguf"
    model.write_bytes(smollm2.read_bytes())
    proc = subprocess.Popen([LOCALRUN, "run", str(model), "-t", "0", "-n", "80", "--min-tokens", "80",
                             "--threads", str(THREADS), "Count to a hundred:"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    try:
        assert proc.stdout.read(1)  # answering: the model loaded, its first text out
        model.unlink()
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert b"prefix cache" not in err and b"Errno" not in err and b"Traceback" not in err, err
    with Sessions.open() as store:
        assert store.list(prefixes=True) == []


# -- the slot is free while a save is written ----------------------------------------------------------------


def test_the_next_request_is_answered_while_a_save_is_still_being_written(tiny_smollm2):
    """In a server an answer's chunks are written after its slot is given back, on a writer thread: the next
    request takes the slot and is answered while that save cannot finish (here another process holds the
    index's write lock, as an eviction or a save of its own would). A request used to read its state under
    the prefix cache's lock, held by the save before it for as long as it wrote, and so waited with its slot.
    (The tiny model: what it answers is not the subject.)"""
    from localrun.runtime.generate import generate as answer_request
    from localrun.runtime.loader import load
    from localrun.runtime.options import LoadSpec
    from localrun.runtime.request import Request
    from localrun.runtime.serving.scheduler import Scheduler

    def deliver(responses) -> None:
        for job, response in responses:
            job.sink.put_nowait(response)

    loaded = load(str(tiny_smollm2), LoadSpec(ctx=1024, parallel=1))
    scheduler = Scheduler(loaded.engine, parallel=1, slot_ctx=1024, max_waiting=4, prefill_chunk=256, deliver=deliver)
    scheduler.start()
    notices: list[str] = []
    sampling = SamplingOptions(temperature=0, max_tokens=8)

    def ask(text: str, admitted=None):
        request = Request(messages=[{"role": "user", "content": text}], sampling=sampling)
        return list(answer_request(loaded, request, on_notice=notices.append, place=scheduler, on_admitted=admitted))

    try:
        ask("Say hello. " * 20)  # the model file hashed, its chunks stored: what follows needs no write before its answer
        assert wait_for_saves(60)
        with Sessions.open() as store:
            index, folder = store.root / "index.sqlite", store.prefix
            stored = len(list(folder.iterdir()))
        blocker = sqlite3.connect(index, isolation_level=None)
        try:
            blocker.execute("BEGIN IMMEDIATE")  # nothing can commit to the index now
            first = ask(TEXT[:1500] + "\nWho is this about?")
            assert first[-1].done
            wait_until(lambda: len([p for p in folder.iterdir() if p.name.endswith(".kv")]) > stored,
                       what="the first answer's chunks written")  # written and fsynced, not yet committed
            admitted = threading.Event()
            second = ask(TEXT[2000:3000] + "\nWhat happened next?", admitted=lambda prompt: admitted.set())
            assert admitted.is_set() and second[-1].done and second[-1].finish_reason == "length"
            assert not wait_for_saves(0)  # the first save is still under way
            assert blocker.execute("SELECT COUNT(*) FROM prefix_chunks").fetchone()[0] == stored
        finally:
            blocker.execute("ROLLBACK")
            blocker.close()
        assert wait_for_saves(60)
        assert notices == []
        with Sessions.open() as store:  # both answers' chains, prompt and answer
            lengths = [e.tokens for e in store.list(prefixes=True)]
        for done in (first[-1].stats, second[-1].stats):
            assert any(done.prompt_tokens < n <= done.prompt_tokens + done.generated_tokens for n in lengths), lengths
    finally:
        scheduler.stop()
        loaded.close()
