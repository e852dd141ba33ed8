"""llama.cpp's DRY and XTC samplers, added through the one option list (engine/options.py + the chain in
engine/sampling.py and nothing else): on the command line, in the chat's /set, in the server's requests,
each validated, each changing real output."""

from __future__ import annotations

import pytest
from conftest import last_json

pytestmark = pytest.mark.slow

REPEAT = "The cat sat on the mat. The cat sat on the mat. The cat sat on the mat. The cat"



def repeat_extended(context: list[int], token: int) -> int:
    """How long a run already seen in `context` the token would extend: the longest n such that the last n
    tokens of the context followed by `token` occur earlier in it."""
    n = 0
    while n < len(context):
        run = context[len(context) - n - 1 :] + [token]
        if not any(context[i : i + len(run)] == run for i in range(len(context) - len(run) + 1)):
            break
        n += 1
    return n


def test_dry_cuts_repeated_sequences(smollm2, cli):
    """DRY penalises a token that would extend a run already seen (the prompt's too) past
    --dry-allowed-length. Greedy decoding with and without it agree until the first token it penalised: there
    plain decoding extends a repeat of at least that length and DRY's answer does not. (Counting repeated
    3-grams depended on the CPU: on an AMD EPYC both answers repeated ten, in long runs and in short ones.)"""
    from localrun.engine import Engine, LoadOptions

    args = ("run", str(smollm2), "--raw", "-t", "0", "-n", "48", "--json", REPEAT)
    plain = last_json(cli(*args).stdout)["tokens"]
    r = cli(*args, "--dry-multiplier", "2", "--dry-base", "1.75", "--dry-allowed-length", "2", "--dry-penalty-last-n", "-1")
    assert r.returncode == 0, r.stderr
    dry = last_json(r.stdout)["tokens"]
    assert dry != plain
    with Engine(smollm2, LoadOptions(n_ctx=256)) as engine:
        prompt = engine.tokenize(REPEAT)
    i = next(k for k, (a, b) in enumerate(zip(plain, dry)) if a != b)
    context = prompt + plain[:i]
    assert repeat_extended(context, plain[i]) >= 2
    assert repeat_extended(context, dry[i]) < repeat_extended(context, plain[i])


def test_dry_sequence_breakers_change_what_counts_as_a_repeat(smollm2, cli):
    """A breaker ends a repeated sequence: the default ones (newline, colon, quote, star) given explicitly give
    the default's answer, and '.', which ends each sentence here, another one."""
    args = ("run", str(smollm2), "--raw", "-t", "0", "-n", "48", "--json", "--dry-multiplier", "2", REPEAT)
    default = last_json(cli(*args).stdout)["tokens"]
    absent = cli(*args, *[a for b in ("\n", ":", '"', "*") for a in ("--dry-sequence-breaker", b)])
    assert absent.returncode == 0, absent.stderr
    assert last_json(absent.stdout)["tokens"] == default
    present = cli(*args, "--dry-sequence-breaker", ".")
    assert present.returncode == 0, present.stderr
    assert last_json(present.stdout)["tokens"] != default


def test_xtc_excludes_the_top_choices(smollm2, cli):
    """XTC with probability 1 removes every token above the threshold but the least likely of them, so the
    near-greedy answer (temperature 0.01) changes, from its first token on."""
    args = ("run", str(smollm2), "--raw", "-t", "0.01", "--seed", "3", "-n", "24", "--json", "The capital of France is")
    plain = last_json(cli(*args).stdout)["tokens"]
    r = cli(*args, "--xtc-probability", "1", "--xtc-threshold", "0.01")
    assert r.returncode == 0, r.stderr
    xtc = last_json(r.stdout)["tokens"]
    assert xtc[0] != plain[0]
    # Probability 0 is off: the same tokens as without it.
    off = last_json(cli(*args, "--xtc-probability", "0", "--xtc-threshold", "0.01").stdout)["tokens"]
    assert off == plain


@pytest.mark.parametrize("args,needle", [
    (["--dry-multiplier", "-1"], "invalid --dry-multiplier -1.0"),
    (["--dry-base", "0.5"], "invalid --dry-base 0.5"),
    (["--dry-allowed-length", "-3"], "invalid --dry-allowed-length -3"),
    (["--dry-penalty-last-n", "-2"], "invalid --dry-penalty-last-n -2"),
    (["--xtc-probability", "1.5"], "invalid --xtc-probability 1.5"),
    (["--xtc-threshold", "-0.1"], "invalid --xtc-threshold -0.1"),
    (["--dry-sequence-breaker", ""], "sequence breaker"),
])
def test_bad_values_are_one_line_usage_errors(smollm2, cli, args, needle):
    r = cli("run", str(smollm2), "-n", "4", *args, "Hi")
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in r.stderr


def test_set_in_chat_takes_them(smollm2, cli):
    """/set dry_multiplier and xtc_probability change the options of the next answers (and refuse bad values)."""
    script = "/set dry_multiplier 2\n/set dry_sequence_breaker none\n/set xtc_probability 7\n/set xtc_threshold 0.2\n/bye\n"
    r = cli("chat", str(smollm2), "-n", "8", input=script)
    assert r.returncode == 0, r.stderr
    assert "dry_multiplier = 2.0" in r.stderr and "dry_sequence_breaker = []" in r.stderr
    assert "invalid xtc_probability '7'" in r.stderr and "xtc_threshold = 0.2" in r.stderr


def test_the_server_takes_them_per_request(smollm2, tmp_path, cli):
    """Request fields, as llama.cpp's server takes them: a greedy completion with DRY is `run`'s with the same
    options, token for token, and not the one without."""
    import openai

    from conftest import start_server

    srv = start_server(smollm2, tmp_path / "home", "--parallel", "2", "--ctx", "512")
    try:
        client = srv.client(key="none")

        def complete(**extra) -> str:
            r = client.completions.create(model=smollm2.name, prompt=REPEAT, max_tokens=40, temperature=0, extra_body=extra)
            return r.choices[0].text

        plain, dry = complete(), complete(dry_multiplier=2.0)
        assert dry != plain
        same = cli("run", str(smollm2), "--raw", "-t", "0", "-n", "40", "--json", "--dry-multiplier", "2", REPEAT)
        assert dry == last_json(same.stdout)["text"]
        with pytest.raises(openai.BadRequestError) as bad:
            complete(xtc_probability=3)
        assert bad.value.body["param"] == "xtc_probability"
    finally:
        srv.stop()
