"""llama-server's own dialect without a model (serve.dialects.llama): /completion and /infill bodies in, localrun's
request out, each bad field a 400 named as llama-server's clients write it; prompts of text and token ids as its
tokenize_mixed reads them; the logit bias by id or text; /tokenize's pieces and /detokenize; the answer's JSON and
stream with llama-server's field names; its error shape, also for refusals made before any route."""

from __future__ import annotations

import math

import pytest

from dialect_fakes import FakeFacts, canned, final, sse_data, written

from localrun.engine.types import TokenLogprob
from localrun.errors import ContextOverflow
from localrun.runtime import SamplingOptions
from localrun.serve.dialects import error_bytes, llama, shape_for
from localrun.serve.errors import Fault, Refused, TooLong
from localrun.serve.stream import Event


class Facts(FakeFacts):
    """FakeFacts with llama-server's tokenizer calls: a character a token, BOS 1 before text with add_special; the
    markers <s> and <x> one token each where special markers are read; token 300 half a UTF-8 character."""

    def tokens_of(self, text: str, add_special: bool = False, parse_special: bool = True) -> list[int]:
        out = [1] if add_special else []
        i = 0
        while i < len(text):
            marker = next((m for m in ("<s>", "<x>") if parse_special and text.startswith(m, i)), None)
            out.append({"<s>": 1, "<x>": 2}[marker] if marker else ord(text[i]))
            i += len(marker) if marker else 1
        return out

    def piece(self, token: int) -> bytes:
        return {1: b"<s>", 2: b"<x>", 300: b"\xe5"}.get(token, chr(token).encode())

    def detokenize(self, tokens: list[int]) -> str:
        return b"".join(self.piece(t) for t in tokens).decode("utf-8", "replace")


def refused(fn, *args) -> Refused:
    with pytest.raises(Refused) as caught:
        fn(*args)
    return caught.value


def test_a_completion_body_becomes_localrun_s_request():
    asked, native = llama.completion_asked({
        "prompt": "Once", "n_predict": 8, "temperature": 0, "top_k": 5, "stop": ["\n"], "seed": 42, "stream": True,
        "n_probs": 3, "return_tokens": True, "lora": [{"id": 0, "scale": 0.5}], "dry_sequence_breakers": ["x"],
        "response_fields": ["content"], "logit_bias": [[15, -1]], "model": "m",
        # llama-server's own fields that mean nothing here: passed over, as llama-server passes over what it does not know
        "cache_prompt": True, "id_slot": 1, "samplers": ["top_k"], "n_keep": 4, "t_max_predict_ms": 500, "n_indent": 2})
    assert asked.model == "m" and asked.max_tokens == 8 and asked.stops == ["\n"] and asked.reply.stream
    assert asked.sampling == {"temperature": 0, "top_k": 5, "seed": 42, "dry_sequence_breaker": ["x"]}
    assert asked.top_logprobs == 3 and asked.lora == [{"id": 0, "scale": 0.5}]
    assert native.prompts == ["Once"] and native.return_tokens and native.response_fields == ["content"]
    assert native.logit_bias == [[15, -1]] and native.n_probs == 3


@pytest.mark.parametrize("n_predict", [-1, 0])
def test_n_predict_of_zero_or_less_is_until_the_context_is_full(n_predict):
    asked, _ = llama.completion_asked({"prompt": "x", "n_predict": n_predict})
    assert asked.max_tokens is None


@pytest.mark.parametrize("body, field, fragment", [
    ({}, "prompt", '"prompt" must be provided'),
    ({"prompt": "x", "n_predict": "8"}, "n_predict", "n_predict"),
    ({"prompt": "x", "temperature": "hot"}, "temperature", "temperature"),
    ({"prompt": "x", "stream": "yes"}, "stream", "stream"),
    ({"prompt": "x", "n_probs": -1}, "n_probs", "n_probs"),
    ({"prompt": "x", "n_probs": 50}, "n_probs", "n_probs"),
    ({"prompt": 5}, "prompt", "prompt"),
    ({"prompt": []}, "prompt", "prompt"),
    ({"prompt": ["a", "b"], "stream": True, "n_predict": 2, "ignore_eos": 1}, "ignore_eos", "ignore_eos"),
    ({"prompt": [[1, 2], "b"], "stream": True}, "stream", "several prompts"),
    ({"prompt": {"prompt_string": "x", "multimodal_data": ["aGk="]}}, "prompt", "no images"),
    ({"prompt": "x", "response_fields": "content"}, "response_fields", "response_fields"),
])
def test_each_bad_completion_field_is_a_400_named_as_llama_server_names_it(body, field, fragment):
    exc = refused(llama.completion_asked, body)
    status, shaped = llama.error_answer(exc)
    assert status == 400 and shaped["error"]["type"] == "invalid_request_error" and shaped["error"]["code"] == 400
    assert fragment in shaped["error"]["message"], shaped
    assert llama.WORDING.name_of(exc.field) == field


def test_prompts_are_read_as_llama_server_reads_them():
    def prompts(given):
        return llama.completion_asked({"prompt": given})[1].prompts

    assert prompts("text") == ["text"]
    assert prompts([5, 6, "text", 7]) == [[5, 6, "text", 7]]  # one prompt of ids and text
    assert prompts([[5, 6], "text"]) == [[5, 6], "text"]  # two prompts: an answer each
    assert prompts([[5, 6], {"prompt_string": "text"}]) == [[5, 6], "text"]
    assert prompts({"prompt_string": "text"}) == ["text"]
    facts = Facts()
    assert llama.prompt_tokens("ab<s>", facts) == [1, 97, 98, 1]  # BOS, special markers read
    assert llama.prompt_tokens([5, "ab", 6, "c"], facts) == [5, 97, 98, 6, 99]  # BOS only before text that comes first
    assert llama.prompt_tokens(["ab", 6], facts) == [1, 97, 98, 6]
    exc = refused(llama.prompt_tokens, [5000], facts)
    assert exc.field == "prompt" and "0..999" in exc.reason


def test_the_logit_bias_by_token_or_text_as_pairs_or_an_object():
    facts = Facts()
    assert llama.logit_bias_of(None, facts) is None
    assert llama.logit_bias_of([[5, -1.5], ["ab", 2], [7, False], ["bad"], [8, "x"]], facts) == {5: -1.5, 97: 2.0, 98: 2.0, 7: -math.inf}
    assert llama.logit_bias_of({"5": 1, "c": -2, "9999": 1}, facts) == {5: 1.0, 99: -2.0}  # out of the vocabulary: passed over
    assert llama.logit_bias_of([["<s>", 1]], facts) == {60: 1.0, 115: 1.0, 62: 1.0}  # text as text, markers not read
    assert refused(llama.logit_bias_of, "5", facts).field == "logit_bias"


def test_an_infill_body_as_llama_vim_sends_it():
    asked, native, infill = llama.infill_asked({
        "input_prefix": "def f(", "input_suffix": "\n", "prompt": "a", "n_predict": 16, "stop": ["\n"],
        "input_extra": [{"filename": "x.py", "text": "X = 1\n"}, {"text": "Y = 2\n"}], "t_max_prompt_ms": 500, "samplers": []})
    assert (infill.prefix, infill.suffix, infill.prompt) == ("def f(", "\n", "a")
    assert infill.extra == [("x.py", "X = 1\n"), ("tmp", "Y = 2\n")] and asked.max_tokens == 16 and asked.stops == ["\n"]


@pytest.mark.parametrize("extra", [{}, {"filename": "ok"}, {"filename": 123}, {"filename": 123, "text": "abc"},
                                   {"filename": 123, "text": 456}])
def test_a_bad_input_extra_is_a_400_as_llama_server_s(extra):
    body = {"input_prefix": "a", "input_suffix": "b", "input_extra": [extra]}
    status, shaped = llama.error_answer(refused(llama.infill_asked, body))
    assert status == 400 and "error" in shaped


@pytest.mark.parametrize("body, fragment", [({"input_suffix": "b"}, '"input_prefix" is required'),
                                            ({"input_prefix": "a"}, '"input_suffix" is required'),
                                            ({"input_prefix": 1, "input_suffix": "b"}, '"input_prefix" must be a string'),
                                            ({"input_prefix": "a", "input_suffix": "b", "prompt": 3}, '"prompt" must be a string'),
                                            ({"input_prefix": "a", "input_suffix": "b", "input_extra": {}}, "must be an array")])
def test_a_bad_infill_body_says_what(body, fragment):
    assert fragment in refused(llama.infill_asked, body).reason


def test_tokenize_with_pieces_and_detokenize():
    facts = Facts()
    assert llama.tokenize_answer({"content": "a<s>"}, facts) == {"tokens": [97, 1]}
    assert llama.tokenize_answer({"content": "a<s>", "parse_special": False}, facts) == {"tokens": [97, 60, 115, 62]}
    assert llama.tokenize_answer({"content": "a", "add_special": True}, facts) == {"tokens": [1, 97]}
    assert llama.tokenize_answer({}, facts) == {"tokens": []}
    pieces = llama.tokenize_answer({"content": "a<x>", "with_pieces": True}, facts)["tokens"]
    assert pieces == [{"id": 97, "piece": "a"}, {"id": 2, "piece": "<x>"}]
    assert llama._piece(facts.piece(300)) == [0xE5]  # half a character: its bytes, as llama-server gives them
    assert llama.detokenize_answer({"tokens": [1, 104, 105]}, facts) == {"content": "<s>hi"}
    assert llama.detokenize_answer({}, facts) == {"content": ""}
    assert refused(llama.detokenize_answer, {"tokens": ["a"]}, facts).field == "tokens"
    assert refused(llama.detokenize_answer, {"tokens": [-1]}, facts).field == "tokens"
    assert refused(llama.tokenize_answer, {"content": "a", "with_pieces": 1}, facts).field == "with_pieces"


def made(stream: bool = False) -> llama.Made:
    settings = llama.generation_settings(SamplingOptions(temperature=0, seed=42, max_tokens=8), stream=stream, lora=(0.5,))
    return llama.Made("m", [1, 104, 105], "<s>hi", settings, stream)


def test_the_whole_answer_with_llama_server_s_field_names():
    last = final("stop", prompt=3, generated=2, cached=1, stop_sequence="\n\n", tokens=[104, 10])
    answer = llama.final(made(), "h\n", last, llama.Native(return_tokens=True))
    assert answer["content"] == "h\n" and answer["stop"] is True and answer["stop_type"] == "word"
    assert answer["stopping_word"] == "\n\n" and answer["has_new_line"] is True and answer["tokens"] == [104, 10]
    assert (answer["tokens_predicted"], answer["tokens_evaluated"], answer["tokens_cached"]) == (2, 3, 4)
    assert answer["prompt"] == "<s>hi" and answer["model"] == "m" and answer["truncated"] is False
    assert answer["timings"]["prompt_n"] == 2 and answer["timings"]["cache_n"] == 1 and answer["timings"]["predicted_n"] == 2
    settings = answer["generation_settings"]
    assert settings["n_predict"] == 8 and settings["seed"] == 42 and settings["lora"] == [{"id": 0, "scale": 0.5}]
    assert llama.final(made(), "x", final("eos"), llama.Native())["stop_type"] == "eos"
    assert llama.final(made(), "x", final("length"), llama.Native())["tokens"] == []  # only with return_tokens
    kept = llama.final(made(), "x", final("length"), llama.Native(response_fields=["content", "generation_settings/n_predict"]))
    assert kept == {"content": "x", "generation_settings/n_predict": 8}


def test_probabilities_as_completion_probabilities():
    entries = [TokenLogprob(token=104, logprob=-0.5, top=[(104, -0.5), (105, -1.5)])]
    assert llama.probabilities(Facts(), entries) == [{"id": 104, "token": "h", "bytes": [104], "logprob": -0.5, "top_logprobs": [
        {"id": 104, "token": "h", "bytes": [104], "logprob": -0.5}, {"id": 105, "token": "i", "bytes": [105], "logprob": -1.5}]}]


def test_the_stream_is_a_server_sent_event_a_piece_then_the_last_without_its_text():
    events = canned(Event("ping"), Event("text", "Hel", tokens=[72, 101]), Event("text", "lo", tokens=[108]),
                    Event("done", final=final("length", prompt=3, generated=3)))
    out = sse_data(written(llama.lines(events, made(stream=True), llama.Native())))
    assert out[0] == ":" and "[DONE]" not in out
    assert out[1] == {"index": 0, "content": "Hel", "tokens": [72, 101], "stop": False, "id_slot": -1, "tokens_predicted": 2,
                      "tokens_evaluated": 3}
    assert out[2]["content"] == "lo" and out[2]["tokens_predicted"] == 3
    assert out[3]["stop"] is True and out[3]["content"] == "" and out[3]["stop_type"] == "limit"
    assert out[3]["generation_settings"]["stream"] is True
    failed = sse_data(written(llama.lines(canned(Event("failed", text="boom")), made(True), llama.Native())))
    assert failed == [{"error": {"code": 500, "message": "boom", "type": "server_error"}}]


def test_the_error_shape_and_a_prompt_over_the_context():
    status, body = llama.error_answer(TooLong(ContextOverflow("too long", 600, 512), "prompt"))
    assert status == 400 and body["error"]["type"] == "exceed_context_size_error"
    assert (body["error"]["n_prompt_tokens"], body["error"]["n_ctx"]) == (600, 512)
    assert llama.error_shape(Fault(401, "no key"))[1] == {"error": {"code": 401, "message": "no key", "type": "authentication_error"}}
    assert llama.error_shape(Fault(501, "no"))[1]["error"]["type"] == "not_supported_error"
    for path in ("/completion", "/completions", "/infill", "/tokenize", "/detokenize", "/props", "/lora-adapters"):
        assert shape_for(path, {}) is llama
    assert b'"authentication_error"' in error_bytes("/completions", {}, Fault(401, "no key"))


def test_a_stop_word_s_tokens_go_out_without_their_text_before_the_last_event():
    """As llama-server streams them: the tokens whose text the stop word cut, in a piece of no content."""
    events = canned(Event("text", "Paris", tokens=[7042]),
                    Event("done", final=final("stop", prompt=3, generated=2, stop_sequence="."), tokens=[30]))
    out = sse_data(written(llama.lines(events, made(stream=True), llama.Native())))
    assert [(e["content"], e["tokens"], e["tokens_predicted"]) for e in out[:2]] == [("Paris", [7042], 1), ("", [30], 2)]
    assert out[2]["stop"] is True and out[2]["stop_type"] == "word" and out[2]["stopping_word"] == "."


def test_slots_as_llama_server_lists_them():
    assert llama.slots_answer([False, True], 1024, False) == [
        {"id": 0, "n_ctx": 1024, "speculative": False, "is_processing": False},
        {"id": 1, "n_ctx": 1024, "speculative": False, "is_processing": True}]
