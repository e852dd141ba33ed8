#!/usr/bin/env python3
"""Decode and prefill speed of localrun's generation path against llama.cpp's own llama-bench, in one run.

    python scripts/bench_decode.py [--models smollm2 gemma] [--reps 5] [--threads N] [--llama-bench PATH]

For each model it measures, alternating reference and ours, `--reps` times:
  - pp512: prefill of 512 tokens (llama-bench `-p 512 -n 0`; ours: Engine.prefill in a fresh context)
  - tg128 @ depth 512: 128 decoded tokens after a 512-token context (llama-bench `-p 0 -n 128 -d 512`;
    ours: Engine.generate with the default sampler chain, EOS suppressed, timed from the first token)
and prints medians and the ratio ours/llama.cpp. llama-bench comes from scripts/build_llama_bench.sh
(built from the llama.cpp source that llama-cpp-python vendors, with the same CPU flags).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

from conftest import fetch_real_model  # noqa: E402  (the same cached real models the tests use)

MODELS = {"smollm2": "SmolLM2-135M-Instruct.Q4_1.gguf", "gemma": "gemma-3-270m-q4_k_m.gguf"}


def find_llama_bench(explicit: str | None) -> str:
    if explicit:
        return explicit
    found = shutil.which("llama-bench")
    if found:
        return found
    out = subprocess.run(["bash", str(HERE / "build_llama_bench.sh")], capture_output=True, text=True, check=True)
    return out.stdout.strip().splitlines()[-1]


def llama_bench(exe: str, model: Path, threads: int, pp: int, tg: int, depth: int) -> float:
    cmd = [exe, "-m", str(model), "-t", str(threads), "-p", str(pp), "-n", str(tg), "-d", str(depth), "-r", "1", "-o", "json"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    rows = json.loads(out.stdout)
    return float(rows[0]["avg_ts"])


def ours_prefill(engine, n: int) -> float:
    tokens = prompt_tokens(engine, n)
    engine.reset()
    t0 = time.perf_counter()
    engine._decode(tokens)
    return n / (time.perf_counter() - t0)


def ours_decode(engine, depth: int, n: int) -> float:
    from localrun.engine import Token
    from localrun.sampling import SamplingOptions

    engine.reset()
    opts = SamplingOptions(max_tokens=n, min_tokens=n, seed=1)  # default chain: top-k, top-p, min-p, temp, dist
    times = []
    for ev in engine.generate(prompt_tokens(engine, depth), opts):
        if isinstance(ev, Token):
            times.append(time.perf_counter())
    return (len(times) - 1) / (times[-1] - times[0])




def prompt_tokens(engine, n: int) -> list[int]:
    text = (HERE.parent / "README.md").read_text() * 50
    toks = engine.tokenize(text)[:n]
    assert len(toks) == n
    return toks


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("--llama-bench", default=None)
    args = ap.parse_args()

    from localrun.engine import Engine, LoadOptions

    exe = find_llama_bench(args.llama_bench)
    print(f"llama-bench: {exe}\nthreads: {args.threads}, repetitions: {args.reps} (medians)\n")
    print(f"| model | test | llama.cpp t/s | localrun t/s | ratio |\n|---|---|---|---|---|")
    for name in args.models:
        path = fetch_real_model(MODELS[name])
        engine = Engine(path, LoadOptions(n_ctx=1024, n_threads=args.threads))
        ours_prefill(engine, 512)  # warm-up
        ours_decode(engine, 512, 16)
        res = {"pp512": ([], []), "tg128@d512": ([], [])}
        for _ in range(args.reps):
            res["pp512"][0].append(llama_bench(exe, path, args.threads, 512, 0, 0))
            res["pp512"][1].append(ours_prefill(engine, 512))
            res["tg128@d512"][0].append(llama_bench(exe, path, args.threads, 0, 128, 512))
            res["tg128@d512"][1].append(ours_decode(engine, 512, 128))
        for test, (ref, ours) in res.items():
            r, o = statistics.median(ref), statistics.median(ours)
            print(f"| {name} | {test} | {r:.1f} | {o:.1f} | {o / r:.3f} |", flush=True)
        engine.close()


if __name__ == "__main__":
    main()
