"""`localrun chat` end to end: the installed command in a pseudo-terminal (pexpect) and with piped stdin,
against the real SmolLM2 (ChatML template) and Gemma 3 270M (a base model without a template). The tests
taking `via` run twice: in-process (--keep-alive 0) and through the background server, where the
conversation is kept by the server and must read the same."""

from __future__ import annotations

import functools
import json
import os
import re
import signal

import pexpect
import pytest

from localrun.engine.prompt import apply_template
from conftest import LOCALRUN, run_cli

pytestmark = pytest.mark.slow

# One thread: llama.cpp's thread barrier degrades badly on a busy machine (CI), one thread does not.
ARGS = ("-t", "0", "-n", "32", "--ctx", "1024", "--threads", "1")
T1 = ("--threads", "1")

# prompt_toolkit turns bracketed paste on when it starts reading a line and off once the line is accepted:
# the one reliable marker of "the prompt is waiting" in a raw terminal stream (the prompt itself is drawn
# with cursor moves, so '>>> ' never appears literally).
READY = "\x1b[?2004h"
ACCEPTED = "\x1b[?2004l"
_ESCAPES = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[()][0-9A-Za-z]|\x1b[=>]")


def clean(text: str) -> str:
    return _ESCAPES.sub("", text).replace("\r", "")


class ChatTerm:
    """`localrun chat` running in a pseudo-terminal, driven as a person would type."""

    def __init__(self, model, *args: str, timeout: float = 240, command: str = "chat"):
        env = {**os.environ, "TERM": "xterm", "COLUMNS": "120", "LINES": "40", "PROMPT_TOOLKIT_NO_CPR": "1"}
        self.child = pexpect.spawn(
            LOCALRUN, [command, str(model), *args], env=env, encoding="utf-8", timeout=timeout, dimensions=(40, 120)
        )
        self.banner = self.ready()

    def ready(self) -> str:
        """Wait for the next prompt; return what was printed since the last input line was accepted."""
        self.child.expect_exact(READY)
        return clean(self.child.before)

    def say(self, text: str) -> str:
        """Type `text`, press Enter, return everything printed until the next prompt (answer and stderr)."""
        self.child.send(text + "\r")
        self.child.expect_exact(ACCEPTED)
        return self.ready()

    def bye(self) -> int:
        self.child.send("/bye\r")
        self.child.expect(pexpect.EOF)
        self.child.close()
        return self.child.exitstatus

    def kill(self) -> None:
        if self.child.isalive():
            self.child.terminate(force=True)


@pytest.fixture
def term():
    started = []

    def start(model, *args):
        t = ChatTerm(model, *args)
        started.append(t)
        return t

    yield start
    for t in started:
        t.kill()


@pytest.fixture(params=["in-process", "server"])
def via(request):
    """Where the chat's conversation lives: in the chat's process, or in the background server."""
    if request.param == "server":
        request.getfixturevalue("resident")  # LOCALRUN_KEEP_ALIVE=5m, and every server gone after the test
    return request.param


def served(via: str) -> None:
    """Through the server: one answered (and the chat did not fall back to in-process)."""
    if via == "server":
        from conftest import _version

        assert _version(None) is not None, "no background server answers"


@pytest.fixture(scope="module")
def engine(smollm2):
    """The same model in this process, to count tokens the way the command must."""
    from localrun.engine import Engine, LoadOptions

    e = Engine(smollm2, LoadOptions(n_ctx=1024, n_threads=1))
    yield e
    e.close()


def stats(text: str) -> dict:
    """Parse the Ollama-style stats block printed by --verbose and /stats."""
    m = re.search(r"prompt eval count:\s+(\d+) token\(s\)(?: \((\d+) cached\))?", text)
    assert m, f"no stats in {text!r}"
    out = {"eval_prompt": int(m.group(1)), "cached": int(m.group(2) or 0)}
    out["prompt"] = out["eval_prompt"] + out["cached"]
    out["generated"] = int(re.search(r"^eval count:\s+(\d+)", text, re.M).group(1))
    out["finish"] = re.search(r"finish reason:\s+(\w+)", text).group(1)
    return out


def answer_of(text: str) -> str:
    """The answer: what comes before the stats block (if any), without blank lines."""
    return text.split("load duration:")[0].strip()


def glue_tokens(engine, previous: list[dict], user: str) -> int:
    """Tokens the template adds after an answer: its end, the next user message, the assistant header."""
    before = apply_template(engine, previous, add_generation_prompt=True) + "ANSWER"
    after = apply_template(engine, [*previous, {"role": "assistant", "content": "ANSWER"}, {"role": "user", "content": user}])
    assert after.startswith(before)
    return len(engine.tokenize(after[len(before) :], add_special=False, parse_special=True))


def prompt_size(engine, messages: list[dict]) -> int:
    return len(engine.tokenize(apply_template(engine, messages), add_special=True, parse_special=True))


_REFERENCES: dict = {}  # (model, n_ctx, the conversation) -> its answers: a test run twice (via) computes them once


def reference(engine, turns: list, system=None, history: list[dict] | None = None, **options) -> list:
    """The reference answers: the same conversation held in this process by runtime.Conversation over an engine
    loaded as the command loads it, from an empty KV cache. `turns`: messages, or (message, extra options) pairs
    for a /set between turns. Returns (answer, final response) per turn (greedy: computed once a module for
    the same model, context and conversation)."""
    key = (str(engine.path), engine.n_ctx, repr((turns, system, history, sorted(options.items()))))
    if key not in _REFERENCES:
        _REFERENCES[key] = _reference(engine, turns, system, history, **options)
    return _REFERENCES[key]


def _reference(engine, turns: list, system=None, history: list[dict] | None = None, **options) -> list:
    from localrun.runtime import Loaded, SamplingOptions
    from localrun.runtime.conversation import Conversation

    engine.reset()
    conv = Conversation(Loaded(engine, "reference", SamplingOptions()), system)
    if history:
        conv.replace(history)
    out = []
    for turn in turns:
        text, extra = turn if isinstance(turn, tuple) else (turn, {})
        options.update(extra)
        out.append(conv.send(text, SamplingOptions(**options), lambda piece: None))
    return out


def line_of(answer: str) -> str:
    """An answer as piped chat writes it (the README's rule, spelled out here): one line, backslashes and line
    breaks escaped, surrounding blanks dropped."""
    return answer.strip().replace("\\", "\\\\").replace("\r", "\\r").replace("\n", "\\n")


# -- in a terminal -----------------------------------------------------------------------------------


def test_two_turns_evaluate_only_the_new_tokens(smollm2, engine, term, via):
    t = term(smollm2, *ARGS, "--verbose")
    assert "/help" in t.banner
    first = t.say("Hello! What is your name?")
    s1 = stats(first)
    u1 = [{"role": "user", "content": "Hello! What is your name?"}]
    assert s1["cached"] == 0 and s1["prompt"] == prompt_size(engine, u1)

    second = t.say("What is the capital of France?")
    s2 = stats(second)
    ref = reference(engine, ["Hello! What is your name?", "What is the capital of France?"], temperature=0, max_tokens=32)
    assert [answer_of(first), answer_of(second)] == [a.strip() for a, _ in ref]
    assert (s1["generated"], s1["finish"]) == (ref[0][1].stats.generated_tokens, ref[0][1].finish_reason)
    # The last sampled token of a turn cut by --max-tokens was never decoded, so it is evaluated with the glue.
    cut = 1 if s1["finish"] == "length" else 0
    assert s2["cached"] == s1["prompt"] + s1["generated"] - cut
    assert s2["eval_prompt"] == glue_tokens(engine, u1, "What is the capital of France?") + cut
    assert s2["eval_prompt"] * 3 < s2["prompt"]

    shown = t.say("/show")
    assert "2 turn(s)" in shown
    used = int(re.search(r"context:\s+(\d+) of 1024 tokens used, (\d+) left", shown).group(1))
    assert s2["prompt"] <= used <= s2["prompt"] + s2["generated"] + 2
    served(via)
    assert t.bye() == 0


def test_set_temperature_zero_gives_the_same_answer_after_clear(smollm2, engine, term):
    t = term(smollm2, "-n", "24", "--ctx", "1024", "--temperature", "1.5", "--verbose", *T1)
    assert "temperature = 0.0" in t.say("/set temperature 0")
    assert "temperature=0.0" in t.say("/show")
    question = "Name three fruits."
    first = t.say(question)
    assert "cleared the conversation" in t.say("/clear")
    assert "0 turn(s)" in t.say("/show")
    second = t.say(question)
    a, b = answer_of(first), answer_of(second)
    [(want, _)] = reference(engine, [question], temperature=0, max_tokens=24)
    assert a == b == want.strip()
    # The same first prompt again: everything but its last token comes from the KV cache.
    s1, s2 = stats(first), stats(second)
    assert s2["prompt"] == s1["prompt"] and s2["eval_prompt"] == 1
    assert t.bye() == 0


def test_bad_set_value_stays_in_the_repl(smollm2, engine, term):
    t = term(smollm2, *ARGS)
    out = t.say("/set temperature hot")
    assert "invalid temperature 'hot'" in out and len(out.strip().splitlines()) == 1
    assert "invalid temperature '9'" in t.say("/set temperature 9")
    assert "unknown parameter 'warmth'" in t.say("/set warmth 1")
    assert "invalid stop" in t.say('/set stop "unclosed')
    assert "stop = ['###', 'The end']" in t.say('/set stop ### "The end"')
    assert "unknown command /frobnicate" in t.say("/frobnicate")
    assert "temperature=0.0" in t.say("/show")  # unchanged
    assert "max_tokens = 8" in t.say("/set max_tokens 8")
    [(want, final)] = reference(engine, ["Hi there"], temperature=0, max_tokens=8, stop=["###", "The end"])
    assert answer_of(t.say("Hi there")) == want.strip()
    s = stats(t.say("/stats"))
    assert s["generated"] <= 8 and (s["generated"], s["finish"]) == (final.stats.generated_tokens, final.finish_reason)
    assert t.bye() == 0


def test_ctrl_c_stops_the_answer_and_the_next_turn_works(smollm2, engine, term, via):
    t = term(smollm2, "-t", "0", "-n", "600", "--ctx", "1024", *T1)
    t.child.send("Write a very long story about a dragon who learns to cook.\r")
    t.child.expect_exact(ACCEPTED)
    t.child.expect(r"[A-Za-z]{3}")  # the answer has started streaming
    streamed = clean(t.child.before + t.child.after)
    t.child.sendintr()
    after = t.ready()
    assert "(interrupted: the partial answer stays in the conversation)" in after
    shown = (streamed + after.split("(interrupted")[0]).strip()
    s1 = stats(t.say("/stats"))
    assert s1["finish"] == "interrupted" and s1["generated"] < 600

    out = t.say("/set max_tokens 24")
    assert "max_tokens = 24" in out
    reply = t.say("Thank you!")
    s2 = stats(t.say("/stats"))
    assert s2["finish"] in ("eos", "length")
    # The cut answer stayed in the conversation and in the KV cache: only about the new message is evaluated.
    u1 = [{"role": "user", "content": "Write a very long story about a dragon who learns to cook."}]
    assert s2["cached"] >= s1["prompt"]
    assert s2["eval_prompt"] <= glue_tokens(engine, u1, "Thank you!") + 2
    assert "2 turn(s)" in t.say("/show")
    # The conversation holds exactly what was shown: the partial answer, then the reply.
    assert "saved session cut" in t.say("/save cut")
    assert t.bye() == 0
    saved = json.loads(run_cli("sessions", "show", "cut", "--json").stdout)["messages"]
    assert [m["role"] for m in saved] == ["user", "assistant", "user", "assistant"]
    assert saved[1]["content"].strip() == shown and len(shown) >= 3
    assert saved[3]["content"].strip() == answer_of(reply)
    served(via)


def test_chat_goes_on_when_the_server_is_killed(smollm2, engine, term, resident):
    """kill -9 of the background server between turns goes unnoticed (the next turn starts a new one and
    rebuilds the conversation from the chat's messages); in the middle of an answer it is one line, and the
    chat goes on without that message."""
    t = term(smollm2, "-t", "0", "-n", "600", "--ctx", "1024", *T1)
    first = t.say("/set max_tokens 32") and t.say("Hello! What is your name?")
    os.kill(resident(), signal.SIGKILL)
    second = t.say("What is the capital of France?")
    ref = reference(engine, ["Hello! What is your name?", "What is the capital of France?"], temperature=0, max_tokens=32)
    assert [answer_of(first), answer_of(second)] == [a.strip() for a, _ in ref]

    t.say("/set max_tokens 600")
    t.child.send("Write a very long story about a dragon who learns to cook.\r")
    t.child.expect_exact(ACCEPTED)
    t.child.expect(r"[A-Za-z]{3}")  # the answer is streaming
    os.kill(resident(), signal.SIGKILL)
    after = t.ready()
    assert "the localrun server stopped in the middle of the answer" in after
    assert "Traceback" not in after
    assert "2 turn(s)" in t.say("/show")  # the cut message is not in the conversation
    assert t.say("/set max_tokens 32") and answer_of(t.say("What is the capital of France?"))
    assert "3 turn(s)" in t.say("/show")
    assert t.bye() == 0


def test_ctrl_c_at_the_prompt_hints_and_ctrl_d_exits(smollm2, term):
    t = term(smollm2, *ARGS)
    t.child.send("half a thought")
    t.child.sendcontrol("c")  # clears the line being typed
    t.child.send("/show\r")
    t.child.expect_exact(ACCEPTED)
    assert "0 turn(s)" in t.ready()  # not "half a thought/show" sent as a message
    t.child.sendcontrol("c")  # on an empty line: a hint, and the chat goes on
    t.child.expect_exact(ACCEPTED)
    assert "Ctrl-D or /bye to exit" in t.ready()
    t.child.sendcontrol("d")
    t.child.expect(pexpect.EOF)
    t.child.close()
    assert t.child.exitstatus == 0


def test_multiline_block_and_bracketed_paste_send_one_message(smollm2, engine, term):
    t = term(smollm2, *ARGS, "--verbose")
    block = t.say('"""\rfirst line\rsecond line"""')
    want = prompt_size(engine, [{"role": "user", "content": "first line\nsecond line"}])
    assert stats(block)["prompt"] == want
    [(ref, _)] = reference(engine, ["first line\nsecond line"], temperature=0, max_tokens=32)
    assert answer_of(block) == ref.strip()
    t.say("/clear")
    pasted = t.say("\x1b[200~alpha beta\ngamma delta\x1b[201~")
    assert stats(pasted)["prompt"] == prompt_size(engine, [{"role": "user", "content": "alpha beta\ngamma delta"}])
    assert "1 turn(s)" in t.say("/show")
    slash = t.say('"""/show"""')  # a block is always a message, even one starting with a slash
    assert "model:" not in slash and stats(slash)["eval_prompt"] > 0
    assert "2 turn(s)" in t.say("/show")
    assert t.bye() == 0


def test_history_is_kept_across_runs(smollm2, term, isolated_home):
    t = term(smollm2, *ARGS)
    t.say("/show")
    assert t.bye() == 0
    history = (isolated_home / "chat_history").read_text()
    assert "/show" in history and "/bye" in history
    t2 = term(smollm2, *ARGS)
    shown = t2.say("\x1b[A\x1b[A")  # Up twice: /bye, then /show from the previous run, sent again
    assert "context:" in shown and "model:" in shown
    assert t2.bye() == 0


# -- piped stdin ---------------------------------------------------------------------------------------


def test_piped_stdin_one_answer_line_per_message(smollm2, engine, cli, via):
    r = cli("chat", str(smollm2), *ARGS, input="Hello!\n\nWhat is 2+2?\n/set top_k 20\nName a colour.\n")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.split("\n")
    assert lines[-1] == "" and len(lines) == 4, r.stdout  # three answers, each one line; blank input skipped
    ref = reference(engine, ["Hello!", "What is 2+2?", ("Name a colour.", {"top_k": 20})], temperature=0, max_tokens=32)
    assert lines[:3] == [line_of(a) for a, _ in ref]
    assert "\x1b" not in r.stdout and ">>>" not in r.stdout + r.stderr
    assert "top_k = 20" in r.stderr
    served(via)


def test_a_made_models_messages_start_every_conversation(smollm2, engine, cli, via, tmp_path):
    """A Modelfile's MESSAGEs come before the conversation's own in chat as in `run` (as Ollama puts them), and
    /clear keeps them (they are the model's): the answers are those of a conversation that holds them."""
    system = "You are Mario from Super Mario Bros."
    preset = [{"role": "user", "content": "Is Toronto in Canada?"}, {"role": "assistant", "content": "yes"}]
    (tmp_path / "Modelfile").write_text(f'FROM {smollm2}\nSYSTEM """{system}"""\n'
                                        f'MESSAGE user {preset[0]["content"]}\nMESSAGE assistant {preset[1]["content"]}\n')
    assert cli("create", "mario", "-f", str(tmp_path / "Modelfile")).returncode == 0
    r = cli("chat", "mario", *ARGS, input="Who are you?\n/show\n/clear\nWho are you?\n")
    assert r.returncode == 0, r.stderr
    held = reference(engine, ["Who are you?"], history=[{"role": "system", "content": system}, *preset],
                     temperature=0, max_tokens=32)[0][0]
    bare = reference(engine, ["Who are you?"], system=system, temperature=0, max_tokens=32)[0][0]
    assert held != bare  # else this test could not tell
    assert r.stdout.split("\n")[:2] == [line_of(held)] * 2, (r.stdout, held)
    assert "conversation: 1 turn(s)" in clean(r.stderr)  # the preset's question is no turn of the user's
    served(via)


def test_a_text_models_message_naming_an_image_file_is_sent_as_typed(smollm2, engine, cli, tmp_path):
    """An image file named in a message is an image only for a model that takes them (a projector given or beside
    it), as in Ollama's REPL: for SmolLM2 alone the message goes as typed (it was dropped with advice to pass
    --mmproj, which a text model has none of)."""
    (tmp_path / "logo.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    message = f"What is the extension of {tmp_path / 'logo.png'} ?"
    r = cli("chat", str(smollm2), *ARGS, "--keep-alive", "0", input=message + "\n")
    assert r.returncode == 0 and "added image" not in r.stderr and "mmproj" not in r.stderr, r.stderr
    ((answer, _),) = reference(engine, [message], temperature=0, max_tokens=32)
    assert r.stdout == line_of(answer) + "\n"


def test_piped_triple_quoted_block_is_one_message(smollm2, engine, cli):
    """/help advertises triple-quoted blocks; piped, each of their lines (markers included) went as a message."""
    r = cli("chat", str(smollm2), *ARGS, input='"""\nline one\nline two"""\n"""one line"""\nHi\n')
    assert r.returncode == 0, r.stderr
    assert len(r.stdout.split("\n")) == 4, r.stdout  # three answers: the block, the one-line block, Hi
    ref = reference(engine, ["line one\nline two", "one line", "Hi"], temperature=0, max_tokens=32)
    assert r.stdout == "".join(line_of(a) + "\n" for a, _ in ref)


def test_piped_answers_escape_newlines(smollm2, engine, cli):
    r = cli("chat", str(smollm2), "-t", "0", "-n", "48", "--ctx", "1024", *T1,
            input="Write a numbered list of five animals, one per line.\n")
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("\n") == 1 and r.stdout.endswith("\n")
    [(answer, _)] = reference(engine, ["Write a numbered list of five animals, one per line."], temperature=0, max_tokens=48)
    assert "\n" in answer.strip()  # the answer has line breaks inside ...
    assert r.stdout == line_of(answer) + "\n" and "\\n" in r.stdout  # ... written as \n


def test_piped_bad_set_and_bye(smollm2, cli):
    r = cli("chat", str(smollm2), *ARGS, input="/set min_p 2\n/bye\nnever answered\n")
    assert r.returncode == 0
    assert r.stdout == ""
    assert "invalid min_p '2'" in r.stderr


def test_base_model_gets_a_notice_and_a_plain_transcript(gemma, cli):
    r = cli("chat", str(gemma), "-t", "0", "-n", "32", "--ctx", "1024", "--verbose", *T1,
            input="What is the capital of France?\nAnd of Italy?\n")
    assert r.returncode == 0, r.stderr
    assert "has no chat template" in r.stderr and "User:" in r.stderr
    answers = r.stdout.splitlines()
    assert len(answers) == 2
    assert not any("User:" in a for a in answers)  # the transcript's stop
    # Turn 2 reuses the cache for turn 1's prompt and answer.
    counts = [int(c) for c in re.findall(r"\((\d+) cached\)", r.stderr)]
    assert counts and counts[0] > 10


def test_context_full_drops_the_oldest_turns_with_a_notice(smollm2, cli):
    questions = [f"Tell me one fact about the number {n}." for n in range(1, 8)]
    r = cli("chat", str(smollm2), "-t", "0", "-n", "32", "--ctx", "160", *T1, input="\n".join(questions) + "\n/show\n")
    assert r.returncode == 0, r.stderr
    assert len(r.stdout.splitlines()) == len(questions)
    assert "dropped the oldest" in r.stderr
    used, left = map(int, re.search(r"context:\s+(\d+) of 160 tokens used, (\d+) left", r.stderr).groups())
    assert used + left == 160 and used < 160


def test_a_conversation_that_outgrows_the_context_drops_its_oldest_turns_in_blocks(smollm2, cli, via):
    """The one drop-oldest policy (runtime.request's, which Ollama's /api/chat takes too): once a message leaves
    the answer no room, the oldest turns go in a block of at least half the room, so that the next turns extend
    the new prompt instead of dropping again; every message is still answered, as by the runtime's own
    conversation over the same model and context."""
    questions = [f"Tell me one fact about the number {n}." for n in range(1, 10)]
    # 128 tokens and answers of 16 (it was 256 and 32: half the decoding, here and in the reference): it drops
    # four times, every other turn, where 256 dropped twice
    r = cli("chat", str(smollm2), "-t", "0", "-n", "16", "--ctx", "128", *T1, input="\n".join(questions) + "\n")
    assert r.returncode == 0, r.stderr
    dropped = [int(n) for n in re.findall(r"context \(128 tokens\) is full: dropped the oldest (\d+) turn", r.stderr)]
    want, drops = _dropping_reference(smollm2, tuple(questions))
    assert r.stdout.splitlines() == want and all(want)
    assert dropped == [n for said in drops for n in said]
    turns = [i for i, said in enumerate(drops) if said]
    assert turns and all(n >= 2 for n in dropped)  # a block of turns, not the fewest that fit
    assert all(b - a > 1 for a, b in zip(turns, turns[1:]))  # the turn after a drop extends its prompt
    served(via)


@functools.lru_cache(maxsize=None)
def _dropping_reference(model, questions: tuple) -> tuple[list[str], list[list[int]]]:
    """The runtime's own conversation over `model` in a 128-token context: each answer as piped chat writes it,
    and the turns it dropped before each (greedy: computed once a module, for both `via`)."""
    from localrun.engine import Engine, LoadOptions
    from localrun.runtime import Loaded, SamplingOptions
    from localrun.runtime.conversation import Conversation

    e = Engine(model, LoadOptions(n_ctx=128, n_threads=1))
    try:
        conv = Conversation(Loaded(e, "reference", SamplingOptions()), None)
        want, drops = [], []
        for question in questions:
            said: list[int] = []
            answer, _ = conv.send(question, SamplingOptions(temperature=0, max_tokens=16), lambda piece: None,
                                  on_dropped=said.append)
            want.append(line_of(answer))
            drops.append(said)
    finally:
        e.close()
    return want, drops


def test_message_too_long_for_the_context_is_one_line(smollm2, cli):
    r = cli("chat", str(smollm2), "-t", "0", "-n", "16", "--ctx", "64", *T1, input=("word " * 200) + "\nHi\n")
    assert r.returncode == 0, r.stderr
    assert "context holds 64" in r.stderr
    from localrun.engine import Engine, LoadOptions

    with Engine(smollm2, LoadOptions(n_ctx=64, n_threads=1)) as small:  # the failed message left nothing behind
        [(answer, _)] = reference(small, ["Hi"], temperature=0, max_tokens=16)
    assert r.stdout == "\n" + line_of(answer) + "\n"  # an empty line for the failed one, then the answer to Hi


def test_save_load_and_session(smollm2, gemma, engine, cli, via):
    # (-n 4: what this first chat answers is not compared, only that its turn is saved and loaded)
    r = cli("chat", str(smollm2), *ARGS, "-n", "4", input="Hello!\n/save ../x\n/save first\n/clear\n/show\n/load first\n/show\n")
    assert r.returncode == 0, r.stderr
    assert "invalid session name" in r.stderr
    assert "saved" in r.stderr and "loaded" in r.stderr
    shows = re.findall(r"conversation:\s+(\d+) turn", r.stderr)
    assert shows == ["0", "1"]

    one = cli("chat", str(smollm2), *ARGS, "--session", "work", input="My name is Ada.\n")
    assert one.returncode == 0 and "new session work" in one.stderr
    two = cli("chat", str(smollm2), *ARGS, "--session", "work", "-v", input="/show\nWhat is my name?\n")
    assert two.returncode == 0, two.stderr
    assert "loaded session work" in two.stderr and re.search(r"conversation:\s+1 turn", two.stderr)
    # The reference: both messages in one conversation, no session (the runtime's, as piped chat writes it:
    # test_piped_stdin_one_answer_line_per_message): resuming continues as if never stopped.
    straight = [line_of(a) for a, _ in reference(engine, ["My name is Ada.", "What is my name?"], temperature=0, max_tokens=32)]
    assert straight[0] + "\n" == one.stdout
    assert two.stdout == straight[1] + "\n"
    # The restored KV cache serves the saved turn: only the new message is evaluated.
    s = stats(two.stderr)
    assert s["cached"] > 10 and s["eval_prompt"] < s["cached"]
    other = cli("chat", str(gemma), "-n", "8", *T1, "--session", "work", input="Hi\n")
    assert other.returncode == 1 and "session 'work'" in other.stderr  # another model's session: refused
    three = cli("chat", str(smollm2), *ARGS, "--session", "work", input="/show\n")
    assert re.search(r"conversation:\s+2 turn", three.stderr)  # saved after every answer, not overwritten
    served(via)


def test_load_in_a_session_chat_moves_saving_to_the_loaded_session(smollm2, cli):
    """With --session A, /load B then a message used to save B's conversation over A (A's turns lost)."""
    assert cli("chat", str(smollm2), *ARGS, "--session", "a", input="My name is Alice.\n").returncode == 0
    assert cli("chat", str(smollm2), *ARGS, "--session", "b", input="I like cats.\n").returncode == 0
    r = cli("chat", str(smollm2), *ARGS, "--session", "a", input="/load b\nWhat do I like?\n")
    assert r.returncode == 0 and "now saved to session b" in r.stderr, r.stderr
    a = json.loads(cli("sessions", "show", "a", "--json").stdout)
    b = json.loads(cli("sessions", "show", "b", "--json").stdout)
    assert "Alice" in json.dumps(a) and "cats" not in json.dumps(a)
    assert "What do I like?" in json.dumps(b)


# -- the pieces --------------------------------------------------------------------------------------------


def test_one_line_writer_escapes_and_trims():
    import io

    from localrun.cli.chat import OneLineWriter

    out = io.StringIO()
    w = OneLineWriter(out)
    for piece in [" ", "\n", "a\n", "b \\", " c", "  \n", " "]:
        w.write(piece)
    w.end()
    assert out.getvalue() == "a\\nb \\\\ c\n"


@pytest.mark.parametrize(
    "text, is_open, message",
    [
        ('"""', True, ""),
        ('"""\nfirst\nsecond', True, "first\nsecond"),
        ('"""\nfirst\nsecond"""', False, "first\nsecond"),
        ('"""one line"""', False, "one line"),
        ('""""""', False, ""),
    ],
)
def test_block_markers(text, is_open, message):
    from localrun.cli.chat import _open_block, _unwrap_block

    assert _open_block(text) is is_open
    assert _unwrap_block(text) == message


def test_the_kv_cache_always_mirrors_the_conversation(engine):
    """In process: after full, cut (Ctrl-C) and stopped answers, the engine's cached tokens are a prefix of
    the conversation's tokens, and the next prompt extends them."""
    from localrun.runtime import Loaded, SamplingOptions
    from localrun.runtime.conversation import Conversation

    engine.reset()
    conv = Conversation(Loaded(engine, "smollm2", SamplingOptions()), "Be brief.")
    opts = SamplingOptions(temperature=0, max_tokens=16)
    pieces: list[str] = []
    for text, cancel_after, extra in [("Hi", None, {}), ("Tell me a story.", 3, {}), ("And then?", None, {"stop": ["."]})]:
        pieces.clear()
        answer, final = conv.send(text, opts.model_copy(update=extra), pieces.append,
                                  lambda n=cancel_after: n is not None and len(pieces) >= n)
        assert answer == "".join(pieces)
        assert (final.finish_reason == "interrupted") is (cancel_after is not None)
        assert conv.messages[-1] == {"role": "assistant", "content": answer}
        cached = engine.kv.tokens[0]
        assert conv._tokens[: len(cached)] == cached
        assert len(conv._tokens) - len(cached) <= 1
        nxt = conv.prompt([*conv.messages, {"role": "user", "content": "next"}]).tokens
        assert nxt[: len(conv._tokens)] == conv._tokens
    assert [m["role"] for m in conv.messages] == ["system", "user", "assistant"] * 1 + ["user", "assistant"] * 2


def test_a_hard_interrupt_empties_the_kv_cache_and_keeps_the_conversation(engine):
    from localrun.runtime import Loaded, SamplingOptions
    from localrun.runtime.conversation import Conversation

    engine.reset()
    conv = Conversation(Loaded(engine, "smollm2", SamplingOptions()), None)
    opts = SamplingOptions(temperature=0, max_tokens=12)
    conv.send("Hi", opts, lambda piece: None)
    before = [dict(m) for m in conv.messages]
    pieces: list[str] = []

    def second_ctrl_c() -> bool:
        if len(pieces) >= 2:
            raise KeyboardInterrupt
        return False

    with pytest.raises(KeyboardInterrupt):
        conv.send("Tell me a story.", opts.model_copy(update={"max_tokens": 64}), pieces.append, second_ctrl_c)
    assert engine.kv.tokens[0] == [] and conv.messages == before
    answer, final = conv.send("Hello again", opts, lambda piece: None)
    assert final.stats.cached_tokens == 0
    [(want, _)] = reference(engine, ["Hello again"], history=before, temperature=0, max_tokens=12)
    assert answer == want


def test_run_without_a_prompt_at_a_terminal_chats(smollm2):
    """`localrun run MODEL` at a terminal with no prompt opens the chat, as `ollama run MODEL` does (it was a usage
    error: found by a helper); piped or with a prompt it answers once, as before (test_run)."""
    t = ChatTerm(smollm2, *ARGS, command="run")
    try:
        assert "/help" in t.banner or "/bye" in t.banner, t.banner
        assert t.say("Hi").strip()
        assert t.bye() == 0
    finally:
        t.kill()
