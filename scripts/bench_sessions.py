#!/usr/bin/env python3
"""Time to first token for a ~2,000-token conversation, resumed from a saved session vs evaluated cold.

    python scripts/bench_sessions.py [--runs 3] [--tokens 2000] [--ctx 4096] [--threads N] [--model PATH ...]

Each timing is a whole new process, as a user starting `localrun chat --session` would pay: Python start,
imports, model load, then either evaluating the history (cold) or loading its saved KV state (resumed),
then the new question, up to the first generated token. Runs alternate cold/resumed after one untimed
warm-up of each. Prints medians, the ratio cold/resumed (goal: at least 20x), and:

  fidelity   the resumed process's greedy continuation equals, token for token, that of the process that
             made the session carrying on without any restore (and, for information, how many leading
             tokens agree with the cold process, whose single-pass prefill rounds differently);
  disk       bytes of saved state per 1,000 tokens of history;
  save       time of one `SessionStore.save` of the whole history (what each chat turn costs), median of 5.

Models: by default the two the tests use (SmolLM2-135M Q4_1, gemma-3-270m Q4_K_M), fetched like the tests do.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

QUESTION = "\nuser: Which clock in the log was looked at for the longest, and for how long?\nassistant:"
FOLLOW_TOKENS = 32


def history_text(target_tokens: int, tokenize) -> str:
    """A plain transcript of about `target_tokens` tokens (gemma-3-270m's file has no chat template)."""
    turns = ["system: You are the guide of a small museum of clocks. Answer briefly and precisely."]
    i = 0
    while len(tokenize("\n".join(turns))) < target_tokens:
        turns.append(
            f"user: Visitor {i} spent {i % 9 + 1} minutes at clock {i * 7 % 31}, built in {1650 + i * 13 % 300}. "
            f"What kind of escapement would a clock from that year most likely have?"
        )
        turns.append(
            f"assistant: A clock from {1650 + i * 13 % 300} would most likely use "
            f"{['a verge', 'an anchor', 'a deadbeat', 'a grasshopper', 'a detent'][i % 5]} escapement, "
            f"though regional makers varied."
        )
        i += 1
    return "\n".join(turns)


def child(mode: str, model: str, work: Path, ctx: int, threads: int | None) -> None:
    """One timed process: print 'first' at the first generated token, then a JSON line with the details."""
    t0 = time.perf_counter()
    from localrun.engine import Engine, LoadOptions, SamplingOptions, generate
    from localrun.runtime.sessions import Sessions as SessionStore

    t_import = time.perf_counter()
    engine = Engine(model, LoadOptions(n_ctx=ctx, n_threads=threads))
    t_load = time.perf_counter()
    history = json.loads((work / "history.json").read_text())
    question = json.loads((work / "question.json").read_text())
    if mode == "resumed":
        with SessionStore.open(work / "store") as store:
            store.load("bench", engine)
    t_ready = time.perf_counter()
    tokens, first_at, done = [], None, None
    for response in generate(engine, history + question, SamplingOptions(temperature=0, max_tokens=FOLLOW_TOKENS)):
        if first_at is None:
            first_at = time.perf_counter()
            print("first", flush=True)
        tokens.extend(response.tokens)
        if response.done:
            done = response
    print(json.dumps({
        "import_s": t_import - t0, "load_s": t_load - t_import, "restore_s": t_ready - t_load,
        "first_token_s": first_at - t_ready, "in_process_ttft_s": first_at - t0,
        "cached_tokens": done.stats.cached_tokens, "tokens": tokens,
    }), flush=True)


def timed_child(mode: str, model: Path, work: Path, ctx: int, threads: int | None) -> tuple[float, dict]:
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, __file__, "--child", mode, str(model), str(work), "--ctx", str(ctx)]
        + (["--threads", str(threads)] if threads else []),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL,
    )
    line = proc.stdout.readline()
    wall = time.perf_counter() - t0
    rest, err = proc.communicate()
    if line.strip() != "first" or proc.returncode != 0:
        raise SystemExit(f"{mode} child failed:\n{err}")
    return wall, json.loads(rest.strip().splitlines()[-1])


def prepare(model: Path, work: Path, ctx: int, target: int, threads: int | None) -> dict:
    """Evaluate the history once, save it as session 'bench'; time saves; the no-restore continuation."""
    from localrun.engine import Engine, LoadOptions, SamplingOptions, generate
    from localrun.engine.loop import evaluate
    from localrun.runtime.sessions import Sessions as SessionStore

    engine = Engine(model, LoadOptions(n_ctx=ctx, n_threads=threads))
    history = engine.tokenize(history_text(target, engine.tokenize))
    question = engine.tokenize(QUESTION, add_special=False)
    (work / "history.json").write_text(json.dumps(history))
    (work / "question.json").write_text(json.dumps(question))
    evaluate(engine, history)
    messages = [{"role": "user", "content": "(benchmark history)"}]
    with SessionStore.open(work / "store") as store:
        store.save("bench", engine, messages, model_ref=model.name)  # the first save also hashes the model file
        saves = []
        for _ in range(5):
            t0 = time.perf_counter()
            info = store.save("bench", engine, messages, model_ref=model.name)
            saves.append(time.perf_counter() - t0)
        # The reference continuation: this process carries on from its own evaluation, no restore involved.
        greedy = SamplingOptions(temperature=0, max_tokens=FOLLOW_TOKENS)
        direct = [t for r in generate(engine, history + question, greedy) for t in r.tokens]
        restores = []
        for _ in range(5):
            t0 = time.perf_counter()
            store.load("bench", engine)
            restores.append(time.perf_counter() - t0)
    engine.close()
    return {
        "history_tokens": len(history), "state_bytes": info.size, "save_s": statistics.median(saves),
        "restore_s": statistics.median(restores), "direct_tokens": direct,
    }


def breakdown(runs: list[tuple[float, dict]]) -> dict:
    return {k: round(statistics.median(d[k] for _, d in runs), 4) for k in ("import_s", "load_s", "restore_s", "first_token_s")}


def agree(a: list[int], b: list[int]) -> int:
    from localrun.engine.kv import common_prefix

    return common_prefix(a, b)


def bench_model(model: Path, runs: int, ctx: int, target: int, threads: int | None) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench-sessions-") as tmp:
        work = Path(tmp)
        prep = prepare(model, work, ctx, target, threads)
        timed_child("cold", model, work, ctx, threads)  # warm-ups: page cache, CPU frequency
        timed_child("resumed", model, work, ctx, threads)
        cold, resumed = [], []
        for _ in range(runs):
            cold.append(timed_child("cold", model, work, ctx, threads))
            resumed.append(timed_child("resumed", model, work, ctx, threads))
    cold_s = statistics.median(w for w, _ in cold)
    res_s = statistics.median(w for w, _ in resumed)
    res_tokens = [d["tokens"] for _, d in resumed]
    cold_tokens = cold[0][1]["tokens"]
    return {
        "model": model.name,
        **{k: v for k, v in prep.items() if k != "direct_tokens"},
        "cold_ttft_s": cold_s,
        "resumed_ttft_s": res_s,
        "ratio": cold_s / res_s,
        "cold_runs_s": [round(w, 3) for w, _ in cold],
        "resumed_runs_s": [round(w, 3) for w, _ in resumed],
        "resumed_breakdown_s": breakdown(resumed),
        "cold_breakdown_s": breakdown(cold),
        "resumed_cached_tokens": resumed[0][1]["cached_tokens"],
        "fidelity_exact": all(t == prep["direct_tokens"] for t in res_tokens),
        "follow_tokens": len(prep["direct_tokens"]),
        "cold_agrees_for": agree(cold_tokens, res_tokens[0]),
        "bytes_per_1k_tokens": prep["state_bytes"] / prep["history_tokens"] * 1000,
    }


def default_models() -> list[Path]:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from conftest import fetch_real_model

    return [fetch_real_model("SmolLM2-135M-Instruct.Q4_1.gguf"), fetch_real_model("gemma-3-270m-q4_k_m.gguf")]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=2000, help="history length to aim for")
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--threads", type=int, help="llama.cpp threads (default: the engine's, all usable cores)")
    ap.add_argument("--model", type=Path, action="append", help="GGUF file (repeatable); default: the test models")
    ap.add_argument("--json", action="store_true", help="print the results as JSON too")
    ap.add_argument("--child", nargs=3, metavar=("MODE", "MODEL", "WORK"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        mode, model, work = args.child
        child(mode, model, Path(work), args.ctx, args.threads)
        return
    if args.runs < 1:
        ap.error("--runs must be at least 1")
    models = args.model or default_models()
    from localrun.engine import default_threads

    threads = args.threads or default_threads()
    print(
        f"{os.cpu_count()} CPUs, {threads} llama.cpp thread(s), load average {os.getloadavg()[0]:.2f};"
        f" ctx {args.ctx}; medians of {args.runs} runs\n"
    )
    print("| model | history tokens | cold TTFT s | resumed TTFT s | ratio | fidelity | MB per 1k tokens | save ms | restore ms |")
    print("|---|---|---|---|---|---|---|---|---|")
    results = []
    for model in models:
        r = bench_model(model, args.runs, args.ctx, args.tokens, args.threads)
        results.append(r)
        fidelity = f"exact ({r['follow_tokens']} tok)" if r["fidelity_exact"] else "DIFFERS"
        print(
            f"| {r['model']} | {r['history_tokens']} | {r['cold_ttft_s']:.2f} | {r['resumed_ttft_s']:.2f} | "
            f"{r['ratio']:.1f}x | {fidelity} | {r['bytes_per_1k_tokens'] / 1e6:.1f} | {r['save_s'] * 1000:.0f} | "
            f"{r['restore_s'] * 1000:.1f} |",
            flush=True,
        )
    print()
    for r in results:
        b, c = r["resumed_breakdown_s"], r["cold_breakdown_s"]
        # The part a session replaces, without the process start and model load both paths pay.
        session_ratio = c["first_token_s"] / (b["restore_s"] + b["first_token_s"])
        print(
            f"{r['model']}:\n  cold    = import {c['import_s']:.2f} s + model load {c['load_s']:.2f} s"
            f" + history and question {c['first_token_s']:.2f} s; runs {r['cold_runs_s']}\n"
            f"  resumed = import {b['import_s']:.2f} s + model load {b['load_s']:.2f} s + session load"
            f" {b['restore_s'] * 1000:.0f} ms + question {b['first_token_s']:.2f} s"
            f" ({r['resumed_cached_tokens']} tokens reused); runs {r['resumed_runs_s']}\n"
            f"  after the model load: cold {c['first_token_s']:.2f} s vs resumed {b['restore_s'] + b['first_token_s']:.2f} s"
            f" = {session_ratio:.0f}x\n"
            f"  cold single-pass prefill agrees with the resumed continuation for {r['cold_agrees_for']}/{r['follow_tokens']} tokens"
        )
    if args.json:
        print(json.dumps(results, indent=2))
    if not all(r["fidelity_exact"] for r in results):
        raise SystemExit("fidelity check failed: a resumed continuation differs from the direct one")


if __name__ == "__main__":
    main()
