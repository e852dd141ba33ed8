"""How far a long prompt is, while the answer waits for it: `localrun run` in a pseudo-terminal shows one line
("reading the prompt: N of T tokens"), redrawn as each chunk is evaluated up to the total and erased when the answer
begins, in this process and through the background server (which also says the part its slot had cached); nothing
on a stderr that is a pipe; progress events under --json. Real llama.cpp on SmolLM2's tokenizer and chat template
over two layers of random weights (tests/tinymodel.py): the prompts count and are cut into chunks as on SmolLM2,
and a 3,000-token one is read in a second or two where SmolLM2 took most of a minute on a busy 2-core machine;
what is tested is the reading, not the answer."""

from __future__ import annotations

import json
import os
import re

import pexpect
import pytest

from conftest import LOCALRUN, run_cli

pytestmark = pytest.mark.slow

SENTENCE = "The quick brown fox jumps over the lazy dog. "  # 10 of SmolLM2's tokens
LINE = re.compile(r"reading the prompt: ([\d,]+) of ([\d,]+) tokens(?: \(([\d,]+) from the cache\))?")
# Sampled with a seed, not greedy: the tiny model's greedy answer repeats the prompt's last token (its random
# layers leave the residual stream near that token's embedding), the template's newline, and an answer of blank
# lines could not be told from none.
ARGS = ("-t", "1", "--seed", "1", "-n", "4", "--ctx", "4096", "--threads", "1")
FRESH = ("--no-cache",)  # from an empty context: nothing from a slot or the disk prefix cache


def long_prompt(sentences: int, question: str = "How many foxes?") -> str:
    return SENTENCE * sentences + "\n" + question


def on_terminal(model, prompt: str, *args: str) -> str:
    """`localrun run` in a pseudo-terminal: everything it wrote there (stdout and stderr, escapes and all)."""
    env = {**os.environ, "TERM": "xterm", "COLUMNS": "120", "LINES": "40"}
    child = pexpect.spawn(LOCALRUN, ["run", str(model), *ARGS, *args, prompt], env=env, encoding="utf-8", timeout=600, dimensions=(40, 120))
    try:
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert child.exitstatus == 0, child.before
    return child.before


def progress_lines(raw: str) -> list[tuple[int, int, int]]:
    return [(int(n.replace(",", "")), int(t.replace(",", "")), int((c or "0").replace(",", ""))) for n, t, c in LINE.findall(raw)]


def assert_shown_to_the_total(raw: str, least_total: int, least_lines: int = 3) -> list[tuple[int, int, int]]:
    lines = progress_lines(raw)
    assert len(lines) >= least_lines, raw
    read = [n for n, _, _ in lines]
    total = lines[-1][1]
    assert {t for _, t, _ in lines} == {total} and total >= least_total
    assert read == sorted(set(read)) and read[-1] == total, read  # increasing, to the whole prompt
    # erased (the line cleared) before the answer is written on that line
    after = raw.rsplit("reading the prompt", 1)[1]
    erased, _, answer = after.partition("\r\x1b[2K")
    assert erased and answer.strip(), after
    assert "reading the prompt" not in answer
    return lines


def test_a_long_prompt_on_a_terminal_in_process(tiny_smollm2):
    raw = on_terminal(tiny_smollm2, long_prompt(300), *FRESH)
    lines = assert_shown_to_the_total(raw, 3000)
    assert all(c == 0 for _, _, c in lines)  # nothing cached in a fresh process (and --no-cache)


def test_nothing_on_a_pipe_and_events_under_json(tiny_smollm2):
    prompt = long_prompt(110)  # 1,100 tokens: three chunks
    plain = run_cli("run", str(tiny_smollm2), *ARGS, *FRESH, prompt)
    assert plain.returncode == 0 and plain.stdout.strip(), plain.stderr
    assert "reading the prompt" not in plain.stderr and "\x1b" not in plain.stderr
    as_json = run_cli("run", str(tiny_smollm2), *ARGS, *FRESH, "--json", prompt)
    assert as_json.returncode == 0, as_json.stderr
    assert "reading the prompt" not in as_json.stderr
    events = [json.loads(line) for line in as_json.stdout.splitlines()]
    progress = [e for e in events if e["type"] == "progress"]
    assert len(progress) >= 3 and all(set(e) == {"type", "total", "cached", "processed"} for e in progress)
    processed = [e["processed"] for e in progress]
    assert processed == sorted(set(processed)) and processed[-1] == progress[-1]["total"] >= 1100
    assert events.index(progress[-1]) < next(i for i, e in enumerate(events) if e["type"] == "done")
    assert events[-1]["type"] == "done" and events[-1]["stats"]["prompt_tokens"] == progress[-1]["total"]


def test_through_the_background_server_with_the_cached_part(resident, tiny_smollm2):
    first = on_terminal(tiny_smollm2, long_prompt(120))
    assert "started a localrun server in the background" in first
    lines = assert_shown_to_the_total(first, 1200)
    assert all(c == 0 for _, _, c in lines)
    resident()  # the server answered it
    # The same prompt and more: what the slot kept of the first is said, and only the rest is read
    first_total = lines[-1][1]
    again = on_terminal(tiny_smollm2, long_prompt(120, "Count the dogs too. " * 100 + "How many foxes?"))
    lines = assert_shown_to_the_total(again, first_total + 300, least_lines=2)  # 500 tokens read: two chunks
    cached = {c for _, _, c in lines}
    assert len(cached) == 1 and first_total - 20 <= cached.pop() < first_total, lines  # the shared prefix
    assert lines[0][0] > lines[0][2]  # the first line already counts the cached part as read


@pytest.mark.parametrize("via", ["in-process", "server"])
def test_chat_shows_a_long_message_being_read(tiny_smollm2, via, request):
    """chat at a terminal: a long message's reading is shown as run shows it, up to the total, and erased before
    the answer; in this process and through the background server (its chat conversation sends each chunk's
    progress over the socket)."""
    keep = ["--keep-alive", "0"] if via == "in-process" else []
    if via == "server":
        request.getfixturevalue("resident")
    env = {**os.environ, "TERM": "xterm", "COLUMNS": "120", "LINES": "40", "PROMPT_TOOLKIT_NO_CPR": "1"}
    child = pexpect.spawn(LOCALRUN, ["chat", str(tiny_smollm2), *ARGS, *keep], env=env, encoding="utf-8", timeout=600,
                          dimensions=(40, 120))
    ready, accepted = "\x1b[?2004h", "\x1b[?2004l"  # the prompt's bracketed paste on, and off as a line is taken
    try:
        child.expect_exact(ready)
        child.send(long_prompt(150).replace("\n", " ") + "\r")
        child.expect_exact(accepted)
        child.expect_exact(ready)
        raw = child.before
        child.send("/bye\r")
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert_shown_to_the_total(raw, 1500, least_lines=2)
