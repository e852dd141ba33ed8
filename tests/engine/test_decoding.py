"""Speculative decoding (--draft lookup / --draft MODEL) and beam search (--beams N) on the real SmolLM2."""

from __future__ import annotations

import itertools
import json
import re

import numpy as np
import pytest
from conftest import last_json

pytestmark = pytest.mark.slow

COUNTING = "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 1, 2, 3,"


def _engine(path, beams: int = 1):
    from localrun.engine import Engine, LoadOptions

    return Engine(path, LoadOptions(n_ctx=512, n_threads=1, n_seq_max=2 * beams + 1, kv_unified=True))


def reference_logprob(engine, prompt: list[int], tokens: list[int]) -> float:
    """log P(tokens | prompt) from the model's own logits, one token at a time (float64 log-softmax over the
    whole vocabulary): what beam search ranks its hypotheses by."""
    from localrun.engine import llama_cpp_module
    from localrun.engine.loop import evaluate

    ll = llama_cpp_module()
    total = 0.0
    for i, tok in enumerate(tokens):
        evaluate(engine, prompt + tokens[:i])
        x = np.ctypeslib.as_array(ll.llama_get_logits_ith(engine.ctx, -1), shape=(engine.n_vocab,)).astype(np.float64)
        x -= x.max()
        total += float(x[tok] - np.log(np.exp(x).sum()))
    return total


def test_beam_search_agrees_with_brute_force(smollm2):
    """Over a 3-token vocabulary and 3 steps, 9 beams are exact: the best of all 27 sequences."""
    from localrun.engine import Engine, LoadOptions, SamplingOptions, llama_cpp_module
    from localrun.engine.loop import evaluate
    from localrun.engine.strategies import BeamSearch

    ll = llama_cpp_module()
    engine = Engine(smollm2, LoadOptions(n_ctx=512, n_threads=1, n_seq_max=19, kv_unified=True))
    try:
        prompt = engine.tokenize("The colours of the rainbow are red, orange, yellow,")
        allowed = [engine.tokenize(w, add_special=False)[0] for w in (" green", " blue", " and")]

        def logprob(seq) -> float:
            total = 0.0
            for i, tok in enumerate(seq):
                evaluate(engine, prompt + list(seq[:i]))
                x = np.ctypeslib.as_array(ll.llama_get_logits_ith(engine.ctx, -1), shape=(engine.n_vocab,))[allowed]
                x = x.astype(np.float64) - x.max()
                total += float(x[allowed.index(tok)] - np.log(np.exp(x).sum()))
            return total

        scores = {seq: logprob(seq) for seq in itertools.product(allowed, repeat=3)}
        brute = max(scores, key=scores.get)
        best, stats = BeamSearch(9, 1.0).search(engine, prompt, SamplingOptions(max_tokens=3), allowed=allowed)
        assert tuple(best.tokens) == brute
        assert best.logprob == pytest.approx(scores[brute], abs=1e-3)
        assert stats.finish_reason == "length" and stats.target_steps == 2  # the first step is the prompt's logits
        # A narrow beam is not exact, but never beats the exhaustive best.
        narrow, _ = BeamSearch(1, 1.0).search(engine, prompt, SamplingOptions(max_tokens=3), allowed=allowed)
        assert scores[tuple(narrow.tokens)] <= scores[brute] + 1e-6
    finally:
        engine.close()


def test_beam_search_in_run_honours_stop_and_json(smollm2, cli):
    from localrun.engine import SamplingOptions
    from localrun.engine.strategies import BeamSearch

    prompt = "The three primary colours are"
    r = cli("run", str(smollm2), "--beams", "3", "--raw", "-n", "40", "--threads", "1", "--no-cache",
            "--stop", ".", "--json", prompt)
    assert r.returncode == 0, r.stderr
    done = last_json(r.stdout)
    stats = done["stats"]
    engine = _engine(smollm2, beams=3)
    try:
        # The best beam's ids (they were missing: beam search streams it as text): their text, cut at the
        # stop, is the answer; the last of them made the stop.
        full = engine.detokenize(done["tokens"])
        assert done["text"].strip() and "." in full and done["text"] == full[: full.index(".")]
        assert "." not in engine.detokenize(done["tokens"][:-1])
        # The same search in-process (3 beams, length penalty 1, stop "."): the CLI ran it, not plain decoding.
        best, ref_stats = BeamSearch(3, 1.0).search(engine, engine.tokenize(prompt),
                                                    SamplingOptions(max_tokens=40, stop=["."]))
    finally:
        engine.close()
    assert done["tokens"] == best.tokens and best.stopped_by == "."
    assert stats["finish_reason"] == "stop" and stats["target_steps"] == ref_stats.target_steps
    # The chosen beam needed one batched step per token after the prompt's logits; the search may go on.
    assert len(done["tokens"]) - 1 <= stats["target_steps"] < 40


def test_length_penalty_changes_which_beam_is_picked(smollm2, cli):
    """Finished beams are ranked by logprob / length ** P: with P = 0 the most likely (shortest) answer wins,
    with 0.5 a longer one, with 1 (average log-probability) a longer one still. Each pick is the best of the
    three picks under its own P, with the log-probabilities computed independently from the model's logits."""
    prompt = "The best way to learn is"
    picks = {}
    for penalty in ("0", "0.5", "1"):
        r = cli("run", str(smollm2), "--beams", "4", "--length-penalty", penalty, "--stop", ".", "--raw", "-n", "30",
                "--threads", "1", "--no-cache", "--json", prompt)
        assert r.returncode == 0, r.stderr
        done = last_json(r.stdout)
        assert done["stats"]["finish_reason"] == "stop"
        picks[float(penalty)] = done
    assert [picks[p]["text"] for p in (0.0, 0.5, 1.0)] == [
        " by doing", " to start with the basics",
        " to start with the basics and gradually work your way up to more complex concepts"]
    lengths = [len(picks[p]["tokens"]) for p in (0.0, 0.5, 1.0)]
    assert lengths[0] < lengths[1] < lengths[2]
    engine = _engine(smollm2)
    try:
        ids = engine.tokenize(prompt)
        logprob = {p: reference_logprob(engine, ids, done["tokens"]) for p, done in picks.items()}
    finally:
        engine.close()
    for p, done in picks.items():
        score = {q: logprob[q] / len(picks[q]["tokens"]) ** p for q in picks}
        assert max(score, key=score.get) == p, (p, score)  # the pick under P has the best score under P
        assert min(score[p] - score[q] for q in picks if q != p) > 0.05  # by a margin above rounding


def test_lookup_draft_is_token_identical_and_accepts_copied_text(smollm2, cli):
    """On text that repeats, prompt lookup drafts most tokens; the output is plain greedy decoding's
    (flash attention off on both sides, as --draft sets it)."""
    common = ["run", str(smollm2), "--raw", "-t", "0", "-n", "60", "--no-cache", "--threads", "1", "--json", COUNTING]
    plain = cli(*common, "--no-flash-attn")
    spec = cli(*common, "--draft", "lookup")
    assert plain.returncode == 0 and spec.returncode == 0, spec.stderr
    a, b = last_json(plain.stdout), last_json(spec.stdout)
    assert b["tokens"] == a["tokens"] and b["text"] == a["text"]
    stats = b["stats"]
    assert stats["draft_tokens"] > 20 and stats["acceptance_rate"] > 0.6
    assert stats["target_steps"] < stats["eval_tokens"]  # fewer target decodes than tokens: the point of it


def test_a_verified_draft_fills_whole_fours_of_rows_on_the_cpu(smollm2, monkeypatch):
    """llama.cpp's repacked CPU kernels multiply four tokens at a time and each one left over alone, as a whole
    pass over the weights (engine.strategies.CPU_ROWS): every verifying step of more than three tokens is a
    multiple of four, with a draft cap that would otherwise make steps of 17; the output is plain decoding's."""
    from localrun.engine import Engine, LoadOptions
    from localrun.engine.loop import generate
    from localrun.engine.model import Engine as EngineClass
    from localrun.engine.sampling import SamplingOptions
    from localrun.engine.strategies import LookupDrafter, Speculative

    engine = Engine(smollm2, LoadOptions(n_ctx=512, n_threads=1, n_outputs=32, flash_attn=False))
    prompt = engine.tokenize(COUNTING)
    greedy = SamplingOptions(temperature=0.0, max_tokens=60)
    plain = [t for r in generate(engine, prompt, greedy) for t in r.tokens]
    engine.kv.clear(0)
    sizes: list[int] = []
    decode = EngineClass.decode

    def recorded(self, batch):
        sizes.append(batch.n)
        return decode(self, batch)

    monkeypatch.setattr(EngineClass, "decode", recorded)
    drafted = [t for r in generate(engine, prompt, greedy, strategy=Speculative(LookupDrafter(), 16)) for t in r.tokens]
    assert drafted == plain
    steps = sizes[1:]  # after the prompt's
    assert max(steps) == 16  # 15 drafted, not the 16 allowed (a step of 17)
    assert all(n % 4 == 0 for n in steps if n > 3), steps
    engine.close()


def test_draft_model_with_same_vocabulary(smollm2, cli):
    """The README's promise: greedy output with a draft model is the target's own, token for token (against
    plain decoding with flash attention off, as --draft sets it)."""
    common = ["run", str(smollm2), "--raw", "-t", "0", "-n", "30", "--no-cache", "--threads", "1", "--json"]
    r = cli(*common, "--draft", str(smollm2), "--draft-max", "4", "Once upon a time")
    plain = cli(*common, "--no-flash-attn", "Once upon a time")
    assert r.returncode == 0 and plain.returncode == 0, r.stderr + plain.stderr
    done, ref = last_json(r.stdout), last_json(plain.stdout)
    assert len(ref["tokens"]) == 30  # no end of text within 30 tokens: the whole run is compared
    assert done["tokens"] == ref["tokens"] and done["text"] == ref["text"]
    stats = done["stats"]
    assert stats["draft_tokens"] > 0 and stats["acceptance_rate"] > 0.8  # a model agrees with itself
    # Every step emits the kept draft plus the target's own token; the last step's excess is cut.
    assert stats["target_steps"] < stats["eval_tokens"] <= stats["target_steps"] + stats["draft_accepted"]


def test_draft_model_with_another_vocabulary_is_refused(smollm2, gemma, cli):
    r = cli("run", str(smollm2), "--draft", str(gemma), "hi")
    assert r.returncode == 2 and "vocabulary" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("args, flag", [
    (["--beams", "0"], "--beams"),
    (["--beams", "65"], "--beams"),
    (["--draft-max", "0", "--draft", "lookup"], "--draft-max"),
    (["--beams", "2", "--draft", "lookup"], "--draft"),
    (["--length-penalty", "99", "--beams", "2"], "--length-penalty"),
])
def test_bad_decoding_options(smollm2, cli, args, flag):
    r = cli("run", str(smollm2), *args, "hi")
    assert r.returncode == 2 and flag in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_chat_with_lookup_draft(smollm2, cli):
    """Each turn's answer is the one chat gives without a draft (flash attention off, as --draft sets it), and
    -v shows, per turn, that drafts from the conversation were kept (the answers repeat themselves, and the
    second repeats the first)."""
    # Short answers copied from the prompt: no near-ties between the top tokens, so the rounding of the
    # multi-token verification batches (llamafile's kernels differ between CPUs) cannot flip a greedy pick;
    # "Say hello." / "Say goodbye." had one on an AMD EPYC, in its 14th token.
    turns = "Repeat after me: the cat sat on the mat, the cat sat on the mat.\nRepeat it again.\n"
    common = ["chat", str(smollm2), "-t", "0", "-n", "24", "--threads", "1"]
    r = cli(*common, "--draft", "lookup", "-v", input=turns)
    plain = cli(*common, "--no-flash-attn", input=turns)
    assert r.returncode == 0 and plain.returncode == 0, r.stderr + plain.stderr
    assert len(plain.stdout.splitlines()) == 2 and all(line.strip() for line in plain.stdout.splitlines())
    assert r.stdout == plain.stdout
    steps = [int(n) for n in re.findall(r"^target steps:\s+(\d+) \(", r.stderr, re.M)]
    accepted = [tuple(map(int, m)) for m in re.findall(r"^draft acceptance:\s+(\d+)/(\d+) \(", r.stderr, re.M)]
    evals = [int(n) for n in re.findall(r"^eval count:\s+(\d+) token", r.stderr, re.M)]
    assert len(steps) == len(accepted) == len(evals) == 2, r.stderr  # one report per turn
    for n_steps, (ok, drafted), n_eval in zip(steps, accepted, evals):
        assert 0 < ok <= drafted and n_steps < n_eval  # drafts kept: fewer target steps than tokens
        assert n_eval <= 1 + n_steps + ok  # the first token, then per step the kept draft and one more


def test_bench_compares_decoding_strategies(smollm2, cli, monkeypatch, capsys):
    """One tg row per --decode value, and each measured with its strategy: bench's rows say only the label,
    so the generations bench times are watched (the real engine.generate, wrapped to keep each one's final
    stats): plain decoding has no target steps; lookup's steps were the target's verifying ones; two beams
    took one batched step per token. One bench, in-process (the function `localrun bench` hands its options to,
    which prints the rows it writes on stdout): the command line's --decode is the one below, refused there by
    the same check; its other flags are tests/runtime/test_bench.py's."""
    import localrun.engine as engine_api
    from localrun.cli import bench as front

    real = engine_api.generate
    finals = []

    def watched(engine, prompt, sampling, **kw):
        for response in real(engine, prompt, sampling, **kw):
            if response.done:
                finals.append((len(prompt), sampling.max_tokens, response))
            yield response

    monkeypatch.setattr(engine_api, "generate", watched)
    assert front.run_from_cli([str(smollm2)], pp="0", tg="16", depth="64", reps=1, threads="1",
                              decode="plain,lookup,beams2", output="json") == 0
    rows = json.loads(capsys.readouterr().out)
    assert [row["settings"]["decode"] for row in rows] == ["plain", "lookup", "beams2"]
    assert [(row["test"], row["n_tokens"], row["depth"], row["reps"]) for row in rows] == [("tg16@d64", 16, 64, 1)] * 3
    assert len({json.dumps({**row["settings"], "decode": None}) for row in rows}) == 1  # only the decode differs
    assert all(row["median_ts"] == row["mean_ts"] == row["samples_ts"][0] > 0 for row in rows)
    # The timed generations (the warm-ups decode 2 after one token): 64 tokens of context, 17 sampled.
    timed = [resp for n_prompt, max_tokens, resp in finals if (n_prompt, max_tokens) == (64, 17)]
    assert len(timed) == 3
    plain, lookup, beams = (resp.stats for resp in timed)
    assert [len(resp.tokens) for resp in timed[::2]] == [1, 17]  # plain streams tokens; beams answer at once
    for stats in (plain, lookup, beams):
        assert stats.eval_tokens == 16 and stats.finish_reason == "length"
    assert plain.target_steps == 0 and plain.draft_tokens == 0
    # Verified by the target step by step (bench's filler repeats no run of 3 tokens: nothing is drafted there)
    assert 0 < lookup.target_steps <= 16
    assert lookup.eval_tokens <= lookup.target_steps + lookup.draft_accepted
    assert beams.target_steps == 16 and beams.draft_tokens == 0  # the first token comes from the prompt's logits

    r = cli("bench", str(smollm2), "--decode", "beams1")
    assert r.returncode == 2 and "--decode" in r.stderr


def test_draft_with_a_quantized_kv_cache_keeps_flash_attention(smollm2, cli):
    """--draft turns flash attention off for identity, but a quantized V cache needs it: this was refused
    with "drop --no-flash-attn", a flag the user never gave."""
    common = ["run", str(smollm2), "--kv-type", "q8_0", "-t", "0", "-n", "40", "--threads", "1", "--raw", "--no-cache",
              "--json", "1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2,"]
    r = cli(*common, "--draft", "lookup")
    assert r.returncode == 0, r.stderr
    plain = cli(*common)  # the same quantized cache, flash attention on by default for it
    assert plain.returncode == 0, plain.stderr
    done, ref = last_json(r.stdout), last_json(plain.stdout)
    assert len(ref["tokens"]) == 40 and done["tokens"] == ref["tokens"] and done["text"] == ref["text"]
    stats = done["stats"]  # lookup did draft the repeated counting, and the target verified it
    assert stats["draft_accepted"] > 20 and stats["target_steps"] < stats["eval_tokens"]


def test_verbose_shows_target_steps_and_acceptance(smollm2, cli):
    """--verbose shows the numbers --json reports for the same (deterministic) run: text that partly repeats,
    so that some drafts are kept and some are not."""
    common = ["run", str(smollm2), "--draft", "lookup", "-t", "0", "-n", "60", "--threads", "1", "--raw", "--no-cache",
              "The cat sat on the mat. The dog sat on the log. The cat"]
    r = cli(*common, "--verbose")
    ref = cli(*common, "--json")
    assert r.returncode == 0 and ref.returncode == 0, r.stderr + ref.stderr
    stats = last_json(ref.stdout)["stats"]
    steps = re.search(r"^target steps:\s+(\d+) \(([\d.]+) tokens per step\)$", r.stderr, re.M)
    accepted = re.search(r"^draft acceptance:\s+(\d+)/(\d+) \(([\d.]+)%\)$", r.stderr, re.M)
    assert steps and accepted, r.stderr
    assert int(steps.group(1)) == stats["target_steps"] < stats["eval_tokens"]
    assert float(steps.group(2)) == pytest.approx((stats["eval_tokens"] + 1) / stats["target_steps"], abs=0.0051)
    assert (int(accepted.group(1)), int(accepted.group(2))) == (stats["draft_accepted"], stats["draft_tokens"])
    assert float(accepted.group(3)) == pytest.approx(100 * stats["acceptance_rate"], abs=0.051)
    assert 0 < stats["draft_accepted"] < stats["draft_tokens"]  # kept and rejected drafts: the two numbers differ
