"""The thinking splitter (engine/thinking.py): whatever the token boundaries, the thinking (trimmed) and the
answer come back as written, markers left out; a template's markers and an opened block are recognised."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from localrun.engine.thinking import GPT_OSS, THINK, Markers, ThinkingSplitter, has_switch, markers_for, opened_in_prompt

# Text that holds no marker (nor a piece of one that could join the next): letters, spaces, '<', '/', '>', newlines.
plain = st.text(alphabet=st.sampled_from(list("abc <>/\nthink|")), max_size=40).filter(
    lambda t: "<think>" not in t and "</think>" not in t and not any(t.endswith(THINK.close[:n]) for n in range(1, 8)))
answers = plain.filter(lambda t: t[:1] not in (" ", "\n") and not t.startswith("<"))


def split(text: str, cuts: list[int], splitter: ThinkingSplitter) -> tuple[str, str]:
    points = sorted({c % (len(text) + 1) for c in cuts} | {0, len(text)})
    parts = []
    for a, b in zip(points, points[1:]):
        parts += splitter.feed(text[a:b])
    parts += splitter.flush()
    return "".join(t for k, t in parts if k == "thinking"), "".join(t for k, t in parts if k == "answer")


@settings(max_examples=300, deadline=None)
@given(thought=plain, answer=answers, gap=st.sampled_from(["", "\n", "\n\n", " "]), cuts=st.lists(st.integers(0, 200), max_size=12))
def test_thinking_and_answer_come_back_exactly(thought, answer, gap, cuts):
    # the thinking without the blanks at its ends (as llama.cpp's reasoning_content: templates write "<think>\n")
    assert split(f"<think>{thought}</think>{gap}{answer}", cuts, ThinkingSplitter(THINK)) == (thought.strip(), answer)
    # The prompt opened the block: the answer starts inside it.
    assert split(f"{thought}</think>{gap}{answer}", cuts, ThinkingSplitter(THINK, inside=True)) == (thought.strip(), answer)
    # No thinking at all: everything is the answer.
    assert split(answer, cuts, ThinkingSplitter(THINK)) == ("", answer)
    # Cut inside the thinking (max tokens): what was thought, no answer.
    assert split(f"<think>{thought}", cuts, ThinkingSplitter(THINK)) == (thought.strip(), "")


@given(cuts=st.lists(st.integers(0, 200), max_size=12))
def test_a_call_marker_ends_an_unclosed_thinking_and_stays_in_the_answer(cuts):
    """Kimi K2 and Qwen3.5 may go from thinking straight to a call, without the close marker (llama.cpp's
    thinking_end_tags): the marker ends the thinking and begins the answer."""
    markers = Markers("<think>", "</think>", ends=("<tool_call>",))
    text = "Weighing it.\n<tool_call>\n{}</tool_call>"
    assert split(text, cuts, ThinkingSplitter(markers, inside=True)) == ("Weighing it.", "<tool_call>\n{}</tool_call>")


def test_without_markers_everything_is_answer_and_the_family_markers_are_shown():
    splitter = ThinkingSplitter(None, preserved=("<|tool_call_begin|>",))
    assert split("<think>x</think>y", [3], splitter) == ("", "<think>x</think>y")
    assert splitter.marks("<|tool_call_begin|>") and not splitter.marks("<|im_end|>")


@given(cuts=st.lists(st.integers(0, 200), max_size=12))
def test_gpt_oss_channels(cuts):
    text = f"{GPT_OSS.open}Let me think.{GPT_OSS.close}{GPT_OSS.answer_prefix}Paris."
    assert split(text, cuts, ThinkingSplitter(GPT_OSS)) == ("Let me think.", "Paris.")


def test_markers_in_the_answer_are_text_once_it_began():
    assert split("Use <think> tags.", [3, 7], ThinkingSplitter(THINK)) == ("", "Use <think> tags.")


def test_markers_from_templates():
    assert markers_for("{{ '<think>\\n' }}") == THINK and markers_for("...<|channel|>analysis...").open == GPT_OSS.open
    assert markers_for("[SYSTEM_PROMPT] [TOOL_CALLS] [ARGS] [THINK]") == Markers("[THINK]", "[/THINK]")
    assert markers_for("<seed:tool_call> <seed:think>").open == "<seed:think>"
    assert markers_for("{{ messages }}") is None and markers_for(None) is None
    assert opened_in_prompt("<|im_start|>assistant\n<think>\n", THINK)
    assert not opened_in_prompt("<|im_start|>assistant\n<think>\n\n</think>\n\n", THINK)
    assert has_switch("{% if enable_thinking is false %}") and not has_switch("<think>")


def test_gpt_oss_channels_made_of_special_tokens_are_split_by_the_sequence():
    """gpt-oss marks its channels with control tokens, which llama.cpp prints as nothing unless asked: the
    sequence prints those that belong to a marker, so the thinking and the answer still come apart."""
    from types import SimpleNamespace

    from localrun.engine.sampling import SamplingOptions
    from localrun.engine.sequence import SequenceState

    control = {1: "<|channel|>", 2: "<|message|>", 3: "<|end|>", 4: "<|start|>", 5: "<|return|>"}
    words = {10: "analysis", 11: "Let me think.", 12: "assistant", 13: "final", 14: "Paris."}
    engine = SimpleNamespace(
        load_s=0.0, is_eog=lambda t: t == 5,
        token_bytes=lambda t, special=False: (control[t] if special else "").encode() if t in control else words[t].encode())
    seq = SequenceState(engine, [0], SamplingOptions(), n_ctx=100)
    seq.thinking = ThinkingSplitter(GPT_OSS)
    out = [seq.push(t) for t in (1, 10, 2, 11, 3, 4, 12, 1, 13, 2, 14, 5)]
    assert "".join(r.thinking for r in out) == "Let me think." and "".join(r.text for r in out) == "Paris."
    assert out[-1].finish_reason == "eos" and out[-1].stats.thinking_tokens > 0
