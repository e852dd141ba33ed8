"""The stop matcher against a plain reference: whatever the chunking, the output is the text before
the earliest stop, and nothing is held back that could not be a stop's start."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from localrun.errors import UsageError
from localrun.engine.stops import StopMatcher


def reference(text: str, stops: list[str]) -> tuple[str, bool]:
    """Cut at the earliest occurrence of any stop (the plain, non-streaming definition)."""
    hits = [text.find(s) for s in stops if s in text]
    if not hits:
        return text, False
    return text[: min(hits)], True


def run_stream(chunks: list[str], stops: list[str]) -> tuple[str, bool, list[str]]:
    m = StopMatcher(stops)
    out, emitted = [], []
    for c in chunks:
        piece = m.feed(c)
        out.append(piece)
        emitted.append("".join(out))
        if m.stopped is not None:
            break
    out.append(m.flush())
    return "".join(out), m.stopped is not None, emitted


alphabet = st.sampled_from(list("ab<|>é😀 \n"))
text_st = st.text(alphabet, max_size=40)
stops_st = st.lists(st.text(alphabet, min_size=1, max_size=5), min_size=1, max_size=3)


@st.composite
def chunked(draw):
    text = draw(text_st)
    cuts = sorted(draw(st.lists(st.integers(0, len(text)), max_size=10)))
    chunks, prev = [], 0
    for c in cuts + [len(text)]:
        chunks.append(text[prev:c])
        prev = c
    return text, chunks


@settings(max_examples=500, deadline=None)
@given(chunked(), stops_st)
def test_matches_reference(tc, stops):
    text, chunks = tc
    got, stopped, _ = run_stream(chunks, stops)
    want, want_stopped = reference(text, stops)
    assert got == want
    assert stopped == want_stopped


@settings(max_examples=300, deadline=None)
@given(chunked(), stops_st)
def test_holds_back_only_possible_stop_prefixes(tc, stops):
    """After each chunk, the text not yet emitted is a proper prefix of some stop (or empty)."""
    text, chunks = tc
    m = StopMatcher(stops)
    seen = ""
    for c in chunks:
        m.feed(c)
        seen += c
        if m.stopped is not None:
            break
        held = m.held
        assert held == "" or any(s.startswith(held) and s != held for s in stops)
        assert seen.endswith(held)


def test_stop_split_across_chunks_is_cut_exactly():
    m = StopMatcher(["<|end|>"])
    assert m.feed("Hello <|") == "Hello "
    assert m.feed("en") == ""
    assert m.feed("d|> trailing") == ""
    assert m.stopped == "<|end|>"
    assert m.flush() == ""


def test_false_start_is_released():
    m = StopMatcher(["STOP"])
    assert m.feed("ST") == ""
    assert m.feed("ART") == "START"
    assert m.flush() == ""


def test_earliest_stop_wins():
    m = StopMatcher(["world", "lo w"])
    assert m.feed("hello world") == "hel"


def test_empty_stop_rejected():
    with pytest.raises(UsageError):
        StopMatcher([""])


def test_the_last_response_says_which_stop_ended_it_and_whether_the_context_was_full():
    """What Anthropic's stop_sequence and stop_reason are made of: the stop sequence found (of several; it was
    null when more than one was given) and a cut by a full context told apart from one at max_tokens (it was
    max_tokens either way; Anthropic says model_context_window_exceeded)."""
    from types import SimpleNamespace

    from localrun.engine.sampling import SamplingOptions
    from localrun.engine.sequence import SequenceState
    from localrun.serve.dialects.anthropic import stop_reason

    words = {1: "It is ", 2: "Par", 3: "is.", 4: " And"}
    engine = SimpleNamespace(load_s=0.0, is_eog=lambda t: t == 0, token_bytes=lambda t, special=False: words[t].encode())

    def answer(tokens, n_ctx=100, **options):
        seq = SequenceState(engine, [9] * 5, SamplingOptions(**options), n_ctx=n_ctx)
        for t in tokens:
            last = seq.push(t)
            if last.done:
                return last

    stops = ["zebra", "Paris", "is"]
    stopped = answer([1, 2, 3], stop=stops)
    assert (stopped.finish_reason, stopped.stop_sequence) == ("stop", "is")  # "It is " holds the earliest
    assert stop_reason(stopped, [], stops) == ("stop_sequence", "is")
    paris = answer([2, 3], stop=["zebra", "Paris"])
    assert stop_reason(paris, [], ["zebra", "Paris"]) == ("stop_sequence", "Paris")
    assert stop_reason(answer([1, 0]), [], ["zebra"]) == ("end_turn", None)
    full, limited = answer([4] * 10, n_ctx=8), answer([4] * 10, max_tokens=3)
    assert full.finish_reason == limited.finish_reason == "length" and full.context_full and not limited.context_full
    assert stop_reason(full, [], []) == ("model_context_window_exceeded", None) and stop_reason(limited, [], []) == ("max_tokens", None)
