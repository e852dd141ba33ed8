"""The pure pieces under the request path, tested alone and fast (no model): the shared-prefix count the
caches compare by, the KV-state header rewrite that moves a saved state between a one-sequence context and a
server slot, the one sampling-options merge, the one load-options type and the error table."""

from __future__ import annotations

import array
import errno
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from localrun.engine.kv import _STATE_MAGIC, _restream, common_prefix
from localrun.engine.sampling import OptionError, merge_options
from localrun.errors import EXIT_INTERRUPTED, EXIT_RUNTIME, EXIT_USAGE, ContextOverflow, SettingError, UsageError
from localrun.cli.failures import message_for
from localrun.runtime.options import LOAD_FIELDS, LoadSpec

tokens = st.lists(st.integers(-3, 40), max_size=300)


@given(tokens, tokens)
@settings(max_examples=300, deadline=None)
def test_common_prefix_counts_the_leading_tokens_two_sequences_share(a, b):
    naive = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    assert common_prefix(a, b) == naive
    assert common_prefix(array.array("i", a), array.array("i", b)) == naive  # an array compares the same
    assert common_prefix(a, a + [1]) == len(a)


def test_common_prefix_past_a_block():
    long = list(range(5000))
    assert common_prefix(long, long[:4097] + [-1]) == 4097
    assert common_prefix(long, long) == 5000


# -- a KV state as llama.cpp writes one (src/llama-kv-cache.cpp, state_write) -------------------------


def _stream(cells: list[tuple[int, list[int]]], n_layer: int, v_trans: bool) -> bytes:
    """One stream: its cell count, then (when not 0) each cell's position and sequence ids, then every layer's
    K rows and V rows (or V transposed), filled with bytes that tell the cells apart."""
    out = struct.pack("<I", len(cells))
    if not cells:
        return out
    for pos, seqs in cells:
        out += struct.pack("<iI", pos, len(seqs)) + b"".join(struct.pack("<i", s) for s in seqs)
    out += struct.pack("<II", int(v_trans), n_layer)
    row = 6
    for layer in range(n_layer):
        out += struct.pack("<iQ", 1, row) + bytes((layer + i) % 251 for i in range(row * len(cells)))
    for layer in range(n_layer):
        if v_trans:
            size, width = 2, 3
            out += struct.pack("<iII", 1, size, width) + bytes((layer * 7 + i) % 251 for i in range(width * len(cells) * size))
        else:
            out += struct.pack("<iQ", 1, row) + bytes((layer * 5 + i) % 251 for i in range(row * len(cells)))
    return out


def _state(caches: list[list[bytes]]) -> bytes:
    """magic, the sequence id, then per cache (two for sliding-window models) its stream count and streams."""
    out = struct.pack("<II", _STATE_MAGIC, 0)
    for streams in caches:
        out += struct.pack("<I", len(streams)) + b"".join(streams)
    return out


cell_lists = st.lists(st.tuples(st.integers(0, 4000), st.lists(st.integers(0, 7), min_size=1, max_size=2)), max_size=5)


@given(cells=cell_lists, swa=st.booleans(), n_layer=st.integers(1, 3), v_trans=st.booleans(), n_stream=st.integers(1, 6),
       copy=st.booleans())
@settings(max_examples=200, deadline=None)
def test_a_state_moves_into_n_streams_and_back_unchanged(cells, swa, n_layer, v_trans, n_stream, copy):
    one = _state([[_stream(cells, n_layer, v_trans)]] * (2 if swa else 1))
    empty = _stream([], n_layer, v_trans)
    expected = _state([[_stream(cells, n_layer, v_trans)] + [empty] * (n_stream - 1)] * (2 if swa else 1))
    data = bytes(one) if copy else bytearray(one)  # rewritten in place where it can be, else copied: the same bytes
    moved = _restream(data, n_stream)
    assert bytes(moved) == expected
    assert bytes(_restream(bytearray(moved), 1, take=0)) == one


@given(cells=cell_lists.filter(bool), n_stream=st.integers(2, 5), data=st.data())
@settings(max_examples=100, deadline=None)
def test_a_slot_is_taken_out_of_a_state_of_every_slot(cells, n_stream, data):
    """A server's whole state holds each slot's sequence in its own stream: `take` keeps that one."""
    slot = data.draw(st.integers(0, n_stream - 1))
    other = [(7, [3])]
    streams = [_stream(cells if i == slot else other, 2, False) for i in range(n_stream)]
    assert bytes(_restream(bytearray(_state([streams])), 1, take=slot)) == _state([[_stream(cells, 2, False)]])


@pytest.mark.parametrize("broken, why", [
    (struct.pack("<II", 0x12345678, 0), "not a KV state"),
    (_state([[_stream([(0, [0])], 1, False)]])[:-3], "torn"),
    (_state([[_stream([(0, [0])], 1, False)]]) + b"\0", "torn"),
    (_state([[_stream([(0, [0])], 1, False), _stream([(1, [1])], 1, False)]]), "several streams"),
    (struct.pack("<III", _STATE_MAGIC, 0, 0), "not a KV state"),  # a cache of 0 streams
])
def test_a_state_it_cannot_read_is_refused_not_misread(broken, why):
    with pytest.raises(ValueError, match=why):
        _restream(bytearray(broken), 2)


# -- the one sampling-options merge --------------------------------------------------------------------


def test_later_layers_win_and_none_is_not_given():
    merged = merge_options({"temperature": 0.2, "top_k": 5}, {"temperature": None, "top_k": 9}, None, {"seed": 3})
    assert (merged.temperature, merged.top_k, merged.seed) == (0.2, 9, 3)
    assert merge_options().temperature == merge_options({}).temperature  # llama.cpp's defaults, the fields' own


@pytest.mark.parametrize("layer, field, reason", [
    ({"temprature": 1.0}, "temprature", "unknown option"),
    ({"top_p": 1.5}, "top_p", "1"),
    ({"temperature": "hot"}, "temperature", "number"),
])
def test_a_bad_option_is_refused_naming_its_field(layer, field, reason):
    with pytest.raises(OptionError) as caught:
        merge_options({"temperature": 0.5}, layer)
    assert caught.value.field == field and reason in caught.value.reason


# -- the one load-options type -------------------------------------------------------------------------


def test_load_spec_becomes_the_engines_options_in_one_place():
    slots = LoadSpec(ctx=1024, parallel=4, batch=256, threads=3, gpu_layers="0").engine_options(1024)
    assert (slots.n_ctx, slots.n_seq_max, slots.n_outputs, slots.n_batch, slots.n_threads, slots.gpu_layers) == (4096, 4, 4, 256, 3, 0)
    assert not slots.kv_unified  # a stream per slot: a request's output does not depend on the others
    lookup = LoadSpec(ctx=512, parallel=2, draft="lookup", draft_max=8).engine_options(512)
    assert lookup.n_outputs == 2 * 9 and lookup.flash_attn is False  # a row per drafted token; exact greedy output
    # --draft-max by default: 32 for lookup (long only behind a long match), 16 for a draft model
    assert LoadSpec(ctx=512, parallel=2, draft="lookup").engine_options(512).n_outputs == 2 * 33
    assert (LoadSpec(draft="lookup").decoding().draft_max, LoadSpec(draft="some/draft").decoding().draft_max) == (32, 16)
    assert LoadSpec().decoding("lookup").draft_max == 32  # a catalogue entry's default draft
    assert LoadSpec(batch=16).decoding("lookup").draft_max == 15  # fitted to a small batch, not refused
    beams = LoadSpec(ctx=512, beams=3).engine_options(512, answer_room=100)
    assert (beams.n_ctx, beams.n_seq_max, beams.kv_unified) == (512 + 300, 7, True)
    embed = LoadSpec(ctx=2048, kind="embed", pooling="cls").engine_options(2048)
    assert (embed.embeddings, embed.n_batch, embed.pooling, embed.kv_unified) == (True, 2048, "cls", True)


@pytest.mark.parametrize("spec, setting, words", [
    (LoadSpec(ctx=10), "ctx", "at least 16"),
    (LoadSpec(ctx=10, parallel=4), "ctx", "invalid ctx 10: the context must hold at least 16"),  # a slot's, not 4 slots' 40
    (LoadSpec(kv_type="q5_1"), "kv_type", "f16"),
    (LoadSpec(threads=0), "threads", "1 or more"),
    (LoadSpec(parallel=8, batch=4), "batch", "invalid batch 4: each step decodes a token of every sequence, so it must hold at least 8"),
    (LoadSpec(kv_type="q8_0", flash_attn=False), "kv_type", "flash attention"),
])
def test_a_bad_load_option_is_refused_before_any_model_loads(spec, setting, words):
    with pytest.raises(SettingError) as caught:
        spec.check()
    assert caught.value.setting == setting and words in str(caught.value)


@pytest.mark.parametrize("spec, words", [
    (LoadSpec(draft="some/draft-model"), "prompt lookup only"),
    (LoadSpec(beams=4), "do not search beams"),
    (LoadSpec(draft="lookup", draft_max=99), "invalid draft_max 99: use 1 to 64"),
    (LoadSpec(draft="lookup", draft_max=32, batch=16), "invalid draft_max 32: a step of it needs a batch of at least 33 tokens"),
    (LoadSpec(gpu_layers="most"), "invalid gpu_layers .most.: use a number of layers"),
])
def test_what_the_servers_slots_cannot_take_is_refused_in_one_line(spec, words):
    with pytest.raises(UsageError, match=words):
        spec.check()


def test_a_client_sends_what_its_flags_set_and_the_server_decides_the_rest():
    spec = LoadSpec(ctx=2048, parallel=3, kind="run", draft="lookup", beams=1, pooling="mean")
    assert set(spec.sent()) == set(LOAD_FIELDS) and spec.sent()["ctx"] == 2048 and spec.sent()["draft"] == "lookup"
    assert not {"parallel", "kind", "beams", "length_penalty", "pooling"} & set(LOAD_FIELDS)
    assert LoadSpec(**spec.sent()).sent() == spec.sent()
    assert LoadSpec(ctx=1).differences(LoadSpec(ctx=2, kv_type="q8_0")) == ["ctx 1 -> 2", "kv_type f16 -> q8_0"]


# -- the error table ------------------------------------------------------------------------------------


@pytest.mark.parametrize("exc, message, code", [
    (SettingError("kv_type", "q5", "use one of f16, q8_0, q4_0"), "invalid --kv-type 'q5': use one of f16, q8_0, q4_0", EXIT_USAGE),
    (ContextOverflow("the prompt is 5000 tokens; the context holds 4096", n_prompt=5000, n_ctx=4096, n_train=32768),
     "the prompt is 5000 tokens; the context holds 4096: raise --ctx (up to the model's 32768) or pass --truncate to keep its end",
     EXIT_RUNTIME),
    (UsageError("no prompt: pass it as an argument"), "no prompt: pass it as an argument", EXIT_USAGE),
    (KeyboardInterrupt(), "interrupted", EXIT_INTERRUPTED),
    (MemoryError(), "out of memory: try a smaller --ctx or a smaller quant", EXIT_RUNTIME),
    (OSError(errno.ENOSPC, "No space left", "/data/x"), "no space left on device (/data/x): free some space or set "
     "LOCALRUN_HOME/HF_HOME elsewhere", EXIT_RUNTIME),
    (PermissionError(errno.EACCES, "denied", "/srv/m.gguf"), "permission denied: /srv/m.gguf: check the path's ownership or set "
     "LOCALRUN_HOME", EXIT_RUNTIME),
    (RuntimeError("llama_decode returned -3"), "RuntimeError: llama_decode returned -3 (set LOCALRUN_DEBUG=1 for a traceback)",
     EXIT_RUNTIME),
])
def test_every_failure_is_one_line_and_an_exit_code(exc, message, code):
    assert message_for(exc) == (message, code)
    assert "\n" not in message_for(exc)[0]


# -- stored responses (OpenAI's Responses API) -------------------------------------------------------


def test_a_damaged_stored_response_is_not_found_and_said_once_in_the_log(isolated_home, capsys):
    """Truncated or garbage: answered as not stored, and the log names the file (it was silent: a helper's run)."""
    from localrun.store.responses import folder, load_response, save_response

    rid = "resp_" + "d" * 24
    save_response(rid, [{"role": "user", "content": "hi"}], {"id": rid})
    path = folder() / f"{rid}.json"
    path.write_bytes(path.read_bytes()[:20])
    assert load_response(rid) is None and load_response(rid) is None
    said = [line for line in capsys.readouterr().err.splitlines() if "warning:" in line]
    assert len(said) == 1 and str(path) in said[0] and "unreadable" in said[0]
    assert load_response("resp_" + "e" * 24) is None and "warning" not in capsys.readouterr().err  # never stored: silent

