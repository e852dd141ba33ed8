"""Speculative decoding (--draft lookup / --draft MODEL) and beam search (--beams N) on the real SmolLM2."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest

pytestmark = pytest.mark.slow

COUNTING = "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 1, 2, 3,"


def _done(stdout: str) -> dict:
    return [json.loads(line) for line in stdout.splitlines() if line.strip()][-1]


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
    r = cli("run", str(smollm2), "--beams", "3", "--raw", "-n", "40", "--threads", "1", "--no-cache",
            "--stop", ".", "--json", "The three primary colours are")
    assert r.returncode == 0, r.stderr
    done = _done(r.stdout)
    assert done["text"].strip() and "." not in done["text"]
    assert done["tokens"]  # the best beam's ids (they were missing: beam search streams it as text)
    assert done["stats"]["finish_reason"] == "stop" and done["stats"]["target_steps"] >= 1


def test_lookup_draft_is_token_identical_and_accepts_copied_text(smollm2, cli):
    """On text that repeats, prompt lookup drafts most tokens; the output is plain greedy decoding's
    (flash attention off on both sides, as --draft sets it)."""
    common = ["run", str(smollm2), "--raw", "-t", "0", "-n", "60", "--no-cache", "--threads", "1", "--json", COUNTING]
    plain = cli(*common, "--no-flash-attn")
    spec = cli(*common, "--draft", "lookup")
    assert plain.returncode == 0 and spec.returncode == 0, spec.stderr
    a, b = _done(plain.stdout), _done(spec.stdout)
    assert b["tokens"] == a["tokens"] and b["text"] == a["text"]
    stats = b["stats"]
    assert stats["draft_tokens"] > 20 and stats["acceptance_rate"] > 0.6
    assert stats["target_steps"] < stats["eval_tokens"]  # fewer target decodes than tokens: the point of it


def test_draft_model_with_same_vocabulary(smollm2, cli):
    r = cli("run", str(smollm2), "--raw", "-t", "0", "-n", "30", "--no-cache", "--threads", "1", "--json",
            "--draft", str(smollm2), "--draft-max", "4", "Once upon a time")
    assert r.returncode == 0, r.stderr
    stats = _done(r.stdout)["stats"]
    assert stats["draft_tokens"] > 0 and stats["acceptance_rate"] > 0.8  # a model agrees with itself


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
    r = cli("chat", str(smollm2), "--draft", "lookup", "-t", "0", "-n", "20", "--threads", "1",
            input="Say hello.\nSay goodbye.\n")
    assert r.returncode == 0, r.stderr
    assert len(r.stdout.splitlines()) == 2 and all(line.strip() for line in r.stdout.splitlines())


def test_bench_compares_decoding_strategies(smollm2, cli):
    r = cli("bench", str(smollm2), "--pp", "0", "--tg", "16", "--depth", "64", "--reps", "1", "--threads", "1",
            "--decode", "plain,lookup,beams2", "--output", "json")
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    assert [row["settings"]["decode"] for row in rows] == ["plain", "lookup", "beams2"]
    assert all(row["median_ts"] > 0 for row in rows)
    r = cli("bench", str(smollm2), "--decode", "beams1")
    assert r.returncode == 2 and "--decode" in r.stderr


def test_draft_with_a_quantized_kv_cache_keeps_flash_attention(smollm2, cli):
    """--draft turns flash attention off for identity, but a quantized V cache needs it: this was refused
    with "drop --no-flash-attn", a flag the user never gave."""
    r = cli("run", str(smollm2), "--draft", "lookup", "--kv-type", "q8_0", "-t", "0", "-n", "8", "--threads", "1", "--raw", "Hi")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip()


def test_verbose_shows_target_steps_and_acceptance(smollm2, cli):
    r = cli("run", str(smollm2), "--draft", "lookup", "-t", "0", "-n", "40", "--threads", "1", "--raw", "--verbose",
            "1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2,")
    assert r.returncode == 0, r.stderr
    assert "target steps:" in r.stderr and "tokens per step" in r.stderr and "draft acceptance:" in r.stderr
