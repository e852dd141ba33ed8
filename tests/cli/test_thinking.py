"""A reasoning model's thinking kept apart from the answer, end to end: `run` (in-process and through the
background server) and `chat` with SmolLM2 under a reasoning template (conftest.thinking_model) and a
grammar that makes it write `thinking</think>answer`; the OpenAI and Ollama dialects read by their real
clients."""

from __future__ import annotations

import json

import pytest

from conftest import THINK_GRAMMAR, start_server

pytestmark = pytest.mark.slow

Q = "What is the capital of France?"


@pytest.fixture
def grammar(tmp_path):
    path = tmp_path / "think.gbnf"
    path.write_text(THINK_GRAMMAR)
    return str(path)


def parts(cli, model, grammar, *extra, keep_alive="0"):
    r = cli("run", str(model), "-t", "0", "-n", "80", "--threads", "1", "--grammar", grammar, *extra, Q,
            env={"LOCALRUN_KEEP_ALIVE": keep_alive})
    assert r.returncode == 0, r.stderr
    return r


@pytest.mark.parametrize("keep_alive", ["0", "5m"])
def test_run_puts_the_answer_on_stdout_and_the_thinking_on_stderr(thinking_model, grammar, cli, keep_alive, request, isolated_home):
    variants = (["--json"], ["-v"], ["--hide-thinking"], ["-n", "3"])
    if keep_alive != "0":
        request.getfixturevalue("resident")
        as_json, plain, hidden, cut = (parts(cli, thinking_model, grammar, *v, keep_alive=keep_alive) for v in variants)
    else:  # in-process: the four commands in one process (tests/one_process.py), each with its own stdout and stderr
        from one_process import run_all

        as_json, plain, hidden, cut = run_all(*[["run", str(thinking_model), "-t", "0", "-n", "80", "--threads", "1", "--grammar",
                                                 grammar, *v, Q] for v in variants], home=isolated_home, env={"LOCALRUN_KEEP_ALIVE": "0"})
        assert [r.returncode for r in (as_json, plain, hidden, cut)] == [0] * 4, [r.stderr for r in (as_json, plain, hidden, cut)]
    events = [json.loads(line) for line in as_json.stdout.splitlines()]
    thought = "".join(e["text"] for e in events if e["type"] == "thinking")
    answer = "".join(e["text"] for e in events if e["type"] == "token")
    assert thought.strip() and answer.strip() and "</think>" not in thought + answer
    assert events[-1]["type"] == "done" and events[-1]["text"] == answer
    assert 0 < events[-1]["stats"]["thinking_tokens"] < len(events[-1]["tokens"]) + 1

    assert plain.stdout == answer + "\n"  # only the answer: a pipeline never sees the thinking
    assert thought in plain.stderr and "thinking tokens:" in plain.stderr
    assert hidden.stdout == plain.stdout and thought not in hidden.stderr
    assert cut.stdout == "" and "cut inside the model's thinking" in cut.stderr  # -n 3: max tokens counts the thinking



def test_no_think_switches_it_off_and_a_model_without_a_switch_says_so(thinking_model, smollm2, cli):
    off = cli("run", str(thinking_model), "-t", "0", "-n", "16", "--threads", "1", "--no-think", "--json", Q)
    events = [json.loads(line) for line in off.stdout.splitlines()]
    assert off.returncode == 0 and not [e for e in events if e["type"] == "thinking"]
    assert "thinking_tokens" not in events[-1]["stats"]
    plain = cli("run", str(smollm2), "-t", "0", "-n", "4", "--threads", "1", "--think", Q)
    assert plain.returncode == 0 and "has no thinking switch: asking it to think changes nothing" in plain.stderr


def test_chat_shows_thinking_on_stderr_and_keeps_it_out_of_the_history(thinking_model, grammar, cli):
    r = cli("chat", str(thinking_model), "-t", "0", "-n", "80", "--threads", "1", "--grammar", grammar,
            input=f"{Q}\nAnd of Italy?\n/save trip\n")
    assert r.returncode == 0, r.stderr
    answers = r.stdout.splitlines()
    assert len(answers) == 2 and all(a.strip() for a in answers) and "</think>" not in r.stdout
    saved = json.loads(cli("sessions", "show", "trip", "--json").stdout)["messages"]
    assert [m["content"] for m in saved if m["role"] == "assistant"] == [a for a in answers]  # the answers only
    thought_lines = [line for line in r.stderr.splitlines() if line.strip() and line.strip() not in answers]
    assert thought_lines  # the thinking was shown, on stderr


def test_openai_reasoning_content_and_ollama_thinking(thinking_model, smollm2, tmp_path):
    import ollama

    with start_server(thinking_model, tmp_path / "home", "--parallel", "2", "--ctx", "1024") as srv:
        c = srv.client("none")
        ask = dict(model=str(thinking_model), messages=[{"role": "user", "content": Q}], temperature=0, max_tokens=80)
        whole = c.chat.completions.create(**ask, extra_body={"grammar": THINK_GRAMMAR})
        message = whole.choices[0].message
        thought = message.model_extra["reasoning_content"]
        assert thought and message.content and "</think>" not in thought + message.content
        chunks = list(c.chat.completions.create(**ask, extra_body={"grammar": THINK_GRAMMAR}, stream=True))
        deltas = [ch.choices[0].delta for ch in chunks if ch.choices]
        assert "".join((d.model_extra or {}).get("reasoning_content") or "" for d in deltas) == thought
        assert "".join(d.content or "" for d in deltas) == message.content
        inline = c.chat.completions.create(**ask, extra_body={"grammar": THINK_GRAMMAR, "reasoning_format": "none"})
        content = inline.choices[0].message.content  # left inline: the thinking, its end marker, the answer
        assert content.startswith(thought + "</think>") and content.endswith(message.content)
        assert inline.choices[0].message.model_extra.get("reasoning_content") is None

        o = ollama.Client(host=srv.url)
        thinks = o.chat(model=str(thinking_model), messages=[{"role": "user", "content": Q}], think=True,
                        options={"temperature": 0, "num_predict": 40})
        assert thinks.message.thinking and "</think>" not in thinks.message.thinking
        quiet = o.chat(model=str(thinking_model), messages=[{"role": "user", "content": Q}], think=False,
                       options={"temperature": 0, "num_predict": 16})
        assert not quiet.message.thinking and quiet.message.content.strip()
        streamed = list(o.generate(model=str(thinking_model), prompt=Q, think=True, stream=True, options={"temperature": 0, "num_predict": 40}))
        assert "".join(p.thinking or "" for p in streamed) == thinks.message.thinking
        assert "thinking" in o.show(str(thinking_model)).capabilities
        # JSON asked of a reasoning model: the constrained text is the answer, not its thinking.
        schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}}, "required": ["city"]}
        formatted = o.chat(model=str(thinking_model), messages=[{"role": "user", "content": Q}], format=schema,
                           options={"temperature": 0, "num_predict": 40})
        assert json.loads(formatted.message.content)["city"] and not formatted.message.thinking
        with pytest.raises(ollama.ResponseError) as no:
            o.chat(model=str(smollm2), messages=[{"role": "user", "content": Q}], think=True)
        assert no.value.status_code == 400 and "does not support thinking" in no.value.error
