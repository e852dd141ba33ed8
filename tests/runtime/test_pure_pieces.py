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
from localrun.runtime.failures import message_for
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
    (LoadSpec(parallel=8, batch=4), "parallel", "batch (4)"),
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


def test_a_stored_response_keeps_its_object_and_one_stored_before_that_still_continues(isolated_home):
    import json

    from localrun.serve.responses import Kept
    from localrun.store.responses import folder, load_response, save_response

    conversation = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    rid, old = "resp_" + "a" * 24, "resp_" + "b" * 24
    save_response(rid, conversation, {"id": rid, "object": "response"})
    assert load_response(rid) == (conversation, {"id": rid, "object": "response"}, None)
    (folder() / f"{old}.json").write_text(json.dumps(conversation))  # a file written before the object was kept
    assert load_response(old) == (conversation, None, None)
    kept = Kept(size=1)  # nothing of these in memory: both read from the disk
    assert kept.get(old) == conversation and kept.envelope(rid)["id"] == rid
    assert kept.delete(rid) and not kept.delete(rid) and load_response(rid) is None
    kept.put("resp_" + "c" * 24, conversation, store=False, response={"id": "x"})  # kept to continue, not to be read
    assert kept.get("resp_" + "c" * 24) == conversation and kept.envelope("resp_" + "c" * 24) is None
    assert not kept.delete("resp_" + "c" * 24) and kept.get("resp_" + "c" * 24) == conversation


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


def test_a_stored_response_reads_as_in_progress_until_answered_and_one_deleted_meanwhile_is_not_kept(isolated_home):
    """GET /v1/responses/{id} of a response still being answered reads its in-progress object (it was a 404);
    one deleted while being answered is neither kept nor written when its answer comes; one that failed
    (`end` without `put`) is gone."""
    import threading

    from localrun.serve.responses import Kept
    from localrun.store.responses import folder, load_response

    conversation = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    kept = Kept()
    one, two, three = ("resp_" + c * 24 for c in "def")
    kept.begin(one, {"id": one, "status": "in_progress"})
    assert kept.envelope(one)["status"] == "in_progress" and kept.get(one) is None  # nothing to continue from yet
    kept.put(one, conversation, response={"id": one, "status": "completed"})
    assert kept.envelope(one)["status"] == "completed" and kept.get(one) == conversation
    kept.begin(two, {"id": two, "status": "in_progress"})
    assert kept.delete(two) and kept.envelope(two) is None
    kept.put(two, conversation, response={"id": two, "status": "completed"})
    assert kept.envelope(two) is None and kept.get(two) is None
    kept.begin(three, {"id": three, "status": "in_progress"})
    kept.end(three)
    assert kept.envelope(three) is None and not kept.delete(three)
    for thread in threading.enumerate():  # the stores written beside the answers
        if thread.name == "localrun-store-response":
            thread.join()
    assert load_response(one)[1]["status"] == "completed" and load_response(two) is None
    assert sorted(p.name for p in folder().iterdir()) == [f"{one}.json"]
    small = Kept(size=1)  # an in-progress entry whose end never comes (a stream never started) does not stay forever
    small.begin(two, {"id": two}), small.begin(three, {"id": three})
    assert small.envelope(two) is None and small.envelope(three) == {"id": three}


def test_input_items_of_a_stored_response_are_listed_a_page_at_a_time_as_openai_lists_them(isolated_home):
    """GET /v1/responses/{id}/input_items: the request's input as items (a string is one user message; each has
    an id and a status), newest first unless order=asc, `limit` and `after` paging; kept on disk too."""
    import threading

    import pytest

    from localrun.serve.openai import ApiError
    from localrun.serve.responses import Kept, input_items, item_list

    given = input_items({"input": [
        {"role": "user", "content": [{"type": "input_text", "text": "Weather in Paris?"}]},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_1", "output": "Sunny"},
        {"role": "assistant", "content": "It is sunny.", "id": "msg_mine"}]})
    assert [i["type"] for i in given] == ["message", "function_call", "function_call_output", "message"]
    assert all(i["id"] and i["status"] == "completed" for i in given) and given[3]["id"] == "msg_mine"
    assert given[3]["content"] == [{"type": "output_text", "text": "It is sunny."}] and given[2]["output"] == "Sunny"
    assert input_items({"input": "hi"})[0]["content"] == [{"type": "input_text", "text": "hi"}]
    page = item_list(given, {"limit": "2"})
    assert [i["id"] for i in page["data"]] == ["msg_mine", given[2]["id"]] and page["has_more"]
    assert (page["object"], page["first_id"], page["last_id"]) == ("list", "msg_mine", given[2]["id"])
    rest = item_list(given, {"limit": "2", "after": page["last_id"]})
    assert [i["id"] for i in rest["data"]] == [given[1]["id"], given[0]["id"]] and not rest["has_more"]
    assert item_list(given, {"order": "asc"})["data"] == given
    for query, param in (({"limit": "0"}, "limit"), ({"limit": "x"}, "limit"), ({"order": "up"}, "order"), ({"after": "msg_no"}, "after")):
        with pytest.raises(ApiError) as bad:
            item_list(given, query)
        assert bad.value.status == 400 and bad.value.param == param
    rid = "resp_" + "9" * 24
    kept = Kept()
    kept.begin(rid, {"id": rid, "status": "in_progress"}, given)
    assert kept.input_items(rid) == given  # while it is being answered too
    kept.put(rid, [{"role": "user", "content": "x"}], response={"id": rid}, input_items=given)
    kept.put("resp_" + "8" * 24, [], store=False, response={"id": "x"}, input_items=given)
    assert kept.input_items("resp_" + "8" * 24) is None  # not stored: nothing to list
    for thread in threading.enumerate():
        if thread.name == "localrun-store-response":
            thread.join()
    assert Kept().input_items(rid) == given  # from the disk


def test_anthropic_client_tools_are_offered_and_a_result_must_answer_a_use():
    """Anthropic's client tools (bash, text_editor: the client runs them, sending only type and name) reach the
    model in their published schema (they were left out as server tools); computer use and server tools stay
    out; a tool_result answering no tool_use is a 400 as on Anthropic's API (it was read). Found by a helper."""
    import pytest

    from localrun.serve.anthropic import chat_body
    from localrun.serve.openai import ApiError

    tools = [{"type": "bash_20250124", "name": "bash"}, {"type": "text_editor_20250728", "name": "str_replace_based_edit_tool"},
             {"type": "web_search_20250305", "name": "web_search"}, {"type": "computer_20250124", "name": "computer"},
             {"name": "mine", "input_schema": {"type": "object"}}]
    body = chat_body({"max_tokens": 5, "messages": [{"role": "user", "content": "ls"}], "tools": tools})
    assert [t.function.name for t in body.tools] == ["bash", "str_replace_based_edit_tool", "mine"]
    assert body.tools[0].function.parameters["properties"]["command"]["type"] == "string"
    assert "str_replace" in body.tools[1].function.parameters["properties"]["command"]["enum"]
    use = {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "bash", "input": {"command": "ls"}}]}
    answer = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "a.txt"}]}
    assert chat_body({"max_tokens": 5, "tools": tools, "messages": [{"role": "user", "content": "ls"}, use, answer]}).messages[-1].role == "tool"
    with pytest.raises(ApiError) as bad:
        chat_body({"max_tokens": 5, "messages": [{"role": "user", "content": "ls"}, answer]})
    assert bad.value.param == "messages.1.content.0" and "'toolu_1' answers no tool_use" in bad.value.message


def test_anthropic_threads_structured_outputs_and_server_tool_blocks():
    """What Anthropic's current SDKs send (found by a helper with @anthropic-ai/sdk): a message thread to continue is a
    404 thread_not_found in error.details, on which the SDK replays the whole conversation (it was read without the
    turns before, then refused); output_config.format is the answer's JSON schema (it was ignored); a server tool's
    blocks in a history are passed over as thinking is (they were a 400)."""
    import pytest

    from localrun.serve.anthropic import chat_body, error_body
    from localrun.serve.openai import ApiError

    hi = [{"role": "user", "content": "hi"}]
    with pytest.raises(ApiError) as lost:
        chat_body({"max_tokens": 5, "messages": hi, "thread": {"type": "continue", "previous_message_id": "msg_1"}})
    assert lost.value.status == 404 and error_body(lost.value)["error"]["details"] == {"error_code": "thread_not_found"}
    assert chat_body({"max_tokens": 5, "messages": hi, "thread": {"type": "create"}}).messages[0].text() == "hi"
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    for body in ({"output_config": {"format": {"type": "json_schema", "schema": schema}, "effort": "low"}},
                 {"output_format": {"type": "json_schema", "schema": schema}}):
        assert chat_body({"max_tokens": 5, "messages": hi, **body}).response_format == {
            "type": "json_schema", "json_schema": {"name": "output", "schema": schema}}
    with pytest.raises(ApiError) as bad:
        chat_body({"max_tokens": 5, "messages": hi, "output_config": {"format": {"type": "yaml"}}})
    assert bad.value.param == "output_config.format"
    searched = {"role": "assistant", "content": [
        {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {"query": "x"}},
        {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_1", "content": []}, {"type": "text", "text": "Found it."}]}
    assert chat_body({"max_tokens": 5, "messages": [*hi, searched, *hi]}).messages[1].text() == "Found it."
    assert error_body(ApiError(404, "x", code="model_not_found"))["error"].get("details") is None


def test_responses_allowed_tools_become_the_chat_requests():
    """The Responses API's flat allowed_tools is the chat request's nested one (tools of other types left out, as
    they are from tools; none left: a 400)."""
    import pytest

    from localrun.serve.openai import ApiError
    from localrun.serve.responses import Kept, chat_body

    tools = [{"type": "function", "name": "add", "parameters": {"type": "object"}}, {"type": "function", "name": "sub"}]
    allowed = {"type": "allowed_tools", "mode": "required", "tools": [{"type": "function", "name": "add"}, {"type": "web_search"}]}
    body, _ = chat_body({"input": "hi", "tools": tools, "tool_choice": allowed}, Kept())
    assert body.tool_choice == {"type": "allowed_tools", "allowed_tools": {"mode": "required", "tools": [{"type": "function", "function": {"name": "add"}}]}}
    with pytest.raises(ApiError) as none:  # naming no function tool: nothing it names could be called
        chat_body({"input": "hi", "tools": tools, "tool_choice": {**allowed, "tools": [{"type": "web_search"}]}}, Kept())
    assert none.value.param == "tool_choice"


def test_an_item_reference_is_the_stored_item_it_names(isolated_home):
    """The AI SDK's Responses model (store: true) sends an earlier answer back as {"type": "item_reference", "id"}:
    it reads as that item of a stored response, in memory or after a restart (a 400 before: found by a helper); an
    id no stored response has is a 400 naming the item."""
    import threading

    import pytest

    from localrun.serve.openai import ApiError
    from localrun.serve.responses import Kept, chat_body

    rid = "resp_" + "7" * 24
    answer = {"type": "message", "id": "msg_answer", "role": "assistant", "status": "completed",
              "content": [{"type": "output_text", "text": "Paris.", "annotations": [], "logprobs": []}]}
    call = {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "f", "arguments": "{}", "status": "completed"}
    kept = Kept()
    kept.put(rid, [{"role": "user", "content": "Capital?"}], response={"id": rid, "output": [answer, call]},
             input_items=[{"type": "message", "id": "msg_q", "role": "user", "content": [{"type": "input_text", "text": "Capital?"}]}])
    for thread in threading.enumerate():
        if thread.name == "localrun-store-response":
            thread.join()
    body = {"input": [{"type": "item_reference", "id": "msg_q"}, {"type": "item_reference", "id": "msg_answer"},
                      {"type": "item_reference", "id": "fc_1"}, {"type": "function_call_output", "call_id": "call_1", "output": "ok"},
                      {"role": "user", "content": "And Italy's?"}]}
    for store in (kept, Kept()):  # in memory, and from the disk
        chat, _ = chat_body(body, store)
        assert [(m.role, m.text()) for m in chat.messages] == [("user", "Capital?"), ("assistant", "Paris."), ("assistant", ""),
                                                               ("tool", "ok"), ("user", "And Italy's?")]
    with pytest.raises(ApiError) as unknown:
        chat_body({"input": [{"type": "item_reference", "id": "msg_nope"}]}, kept)
    assert unknown.value.param == "input.0" and "'msg_nope'" in unknown.value.message
    # The next turn, stored, lists (and keeps) the items referred to, not the references: a third turn referring
    # to the same answer still finds it (the reference had replaced it: found by a review)
    from localrun.serve.responses import input_items

    listed = input_items(body, kept.item)
    assert [i["type"] for i in listed] == ["message", "message", "function_call", "function_call_output", "message"]
    kept.put("resp_" + "6" * 24, [], response={"id": "resp_" + "6" * 24, "output": []}, input_items=listed)
    assert kept.item("msg_answer") == answer and chat_body(body, kept)[0].messages[1].text() == "Paris."
    # A deleted response's items are no longer there to refer to (once no stored response holds them)
    for thread in threading.enumerate():
        if thread.name == "localrun-store-response":
            thread.join()
    assert kept.delete(rid) and kept.item("fc_1") == call  # the later response lists it too
    assert kept.delete("resp_" + "6" * 24) and kept.item("fc_1") is None and Kept().item("fc_1") is None


def test_an_empty_responses_answer_streams_its_message_as_any_other():
    """An answer of no tokens (the model ended at once: seen with Codex) streams the same item events as one with
    text, less the delta: its text part was in output_item.done without ever being announced (found by a helper)."""
    import asyncio
    import json

    from localrun.engine.types import Response, Stats
    from localrun.serve.responses import events
    from localrun.serve.stream import Event

    def streamed(*texts: str) -> list[dict]:
        async def answer():
            for text in texts:
                yield Event("text", text)
            yield Event("done", final=Response(finish_reason="stop", stats=Stats(prompt_tokens=5, generated_tokens=len(texts))))

        async def read() -> list[dict]:
            return [json.loads(line.split("data: ", 1)[1]) async for line in events(answer(), "resp_x", {}, "m", 1700000000, lambda *a: None)]

        return asyncio.run(read())

    empty, said = streamed(), streamed("Hi")
    assert [e["type"] for e in empty] == [e["type"] for e in said if e["type"] != "response.output_text.delta"]
    assert [e["type"] for e in empty][2:7] == ["response.output_item.added", "response.content_part.added", "response.output_text.done",
                                               "response.content_part.done", "response.output_item.done"]
    assert empty[-2]["item"]["content"] == [{"type": "output_text", "text": "", "annotations": [], "logprobs": []}]
    assert empty[-1]["type"] == "response.completed" and empty[-1]["response"]["output"] == [empty[-2]["item"]]
    assert [e["sequence_number"] for e in empty] == list(range(len(empty)))
    # one created_at from the request's arrival, in the in-progress and the completed Response alike
    assert {e["response"]["created_at"] for e in empty if "response" in e} == {1700000000}
