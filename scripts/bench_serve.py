#!/usr/bin/env python3
"""Measure `localrun serve` with concurrent streams, against llama.cpp's own batched decoding.

Starts `localrun serve MODEL --parallel 8` on a free loopback port, then, interleaved per repetition:
  - ours: aggregate decode throughput of 1 stream and of 8 concurrent streams (real HTTP, SSE, the
    server's continuous batching), via `localrun bench --serve`'s load generator;
  - reference: llama.cpp's `llama-batched-bench` (built by scripts/build_llama_bench.sh) decoding
    1 and 8 sequences in one process with no HTTP at all (its S_TG t/s).
Prints the medians and the 8-vs-1 speed-up of each. With --load N it finally runs N requests at
concurrency 16 and reports failures and TTFT percentiles.

    python scripts/bench_serve.py [--model PATH] [--reps 3] [--tokens 128] [--load 1000]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))

from localrun.cli import loadtest  # noqa: E402

DEFAULT_MODEL = Path.home() / ".cache" / "localrun-test-models" / "SmolLM2-135M-Instruct.Q4_1.gguf"


def start_server(model: Path, parallel: int, threads: int, ctx: int, gpu_layers: str) -> tuple[subprocess.Popen, str]:
    exe = shutil.which("localrun") or str(Path(sys.executable).with_name("localrun"))
    proc = subprocess.Popen(
        [exe, "serve", str(model), "--port", "0", "--parallel", str(parallel), "--threads", str(threads), "--ctx", str(ctx),
         "--gpu-layers", gpu_layers],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    for line in proc.stderr:
        m = re.search(r"(http://127\.0\.0\.1:\d+/v1)", line)
        if m:
            return proc, m.group(1)
    raise SystemExit(f"the server did not start (exit {proc.wait()})")


def batched_bench(model: Path, threads: int, tokens: int, prompt: int, gpu_layers: str) -> dict[int, float]:
    exe = Path(os.environ.get("LLAMA_BATCHED_BENCH", Path.home() / ".cache/localrun/llama-bench-0.3.36/bin/llama-batched-bench"))
    if not exe.exists():
        return {}
    out = subprocess.run(
        [str(exe), "-m", str(model), "-c", "4096", "-b", "512", "-ub", "512", "-npp", str(prompt), "-ntg", str(tokens),
         "-npl", "1,8", "-t", str(threads), "-ngl", "99" if gpu_layers == "auto" else gpu_layers], capture_output=True, text=True, check=True,
    ).stdout
    speeds = {}
    for line in out.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 10 and cells[2].isdigit():
            speeds[int(cells[2])] = float(cells[7])  # S_TG t/s
    return speeds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--load", type=int, default=0, help="then N requests at concurrency 16")
    ap.add_argument("--gpu-layers", default="auto", help="N, auto (all, on a GPU build) or 0")
    args = ap.parse_args()

    proc, url = start_server(args.model, 8, args.threads, 1024, args.gpu_layers)
    prompt = loadtest.filler_prompt(24)
    ours: dict[int, list[float]] = {1: [], 8: []}
    ref: dict[int, list[float]] = {1: [], 8: []}
    try:
        model = loadtest.check_endpoint(url, None)
        loadtest.run_level(url, 8, 8, prompt=prompt, max_tokens=16, api_key=None, model=model)  # warm-up
        for rep in range(args.reps):
            for c in (1, 8):
                level = loadtest.run_level(url, c, c * 2, prompt=prompt, max_tokens=args.tokens, api_key=None, model=model)
                assert not [o for o in level.outcomes if not o.ok], [o.error for o in level.outcomes]
                ours[c].append(level.throughput)
            for c, speed in batched_bench(args.model, args.threads, args.tokens, 32, args.gpu_layers).items():
                ref[c].append(speed)
            print(f"rep {rep + 1}: ours 1={ours[1][-1]:.1f} 8={ours[8][-1]:.1f} t/s; "
                  f"llama-batched-bench 1={ref[1][-1] if ref[1] else float('nan'):.1f} 8={ref[8][-1] if ref[8] else float('nan'):.1f} t/s",
                  file=sys.stderr)
        med = {k: statistics.median(v) for k, v in ours.items()}
        print(f"localrun serve (HTTP, SSE, openai-style streams): 1 stream {med[1]:.1f} t/s, 8 streams {med[8]:.1f} t/s "
              f"-> {med[8] / med[1]:.2f}x")
        if ref[1]:
            rmed = {k: statistics.median(v) for k, v in ref.items()}
            print(f"llama-batched-bench (no HTTP, S_TG):               1 seq    {rmed[1]:.1f} t/s, 8 seqs    {rmed[8]:.1f} t/s "
                  f"-> {rmed[8] / rmed[1]:.2f}x")
            print(f"ours / llama.cpp: 1 stream {med[1] / rmed[1]:.2f}, 8 streams {med[8] / rmed[8]:.2f}")
        if args.load:
            t0 = time.perf_counter()
            level = loadtest.run_level(url, 16, args.load, prompt=prompt, max_tokens=32, api_key=None, model=model)
            row = level.row(None)
            print(f"{args.load} requests at concurrency 16 (32 tokens each): {row['failed']} failed, "
                  f"{row['requests_per_s']} req/s, {row['tokens_per_s']} t/s, TTFT p50 {row['ttft_p50_s']} s, "
                  f"p95 {row['ttft_p95_s']} s, TPOT p50 {row['tpot_p50_s']} s, in {time.perf_counter() - t0:.0f} s")
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)


if __name__ == "__main__":
    main()
