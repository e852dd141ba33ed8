#!/usr/bin/env python3
"""Decode and prefill speed of localrun's generation path against llama.cpp's own llama-bench, in one run.

    python scripts/bench_decode.py [--models smollm2 gemma] [--reps 5] [--threads N] [--llama-bench PATH]
                                   [--output md|table|json|csv]

A fixed recipe over `localrun bench` (src/localrun/runtime/reports/bench.py, cli/bench.py) on the test suite's cached real models:
  - pp512: prefill of 512 tokens (llama-bench `-p 512 -n 0`; ours: the engine's batched step into a fresh context)
  - tg128@d512: 128 decode steps after a 512-token context (llama-bench `-p 0 -n 128 -d 512`; ours:
    engine.generate with the default sampler chain, end-of-text suppressed, timed from the first token)
llama-bench runs with the same settings, interleaved with ours test by test, and each row carries the
ratio ours/llama.cpp. llama-bench comes from scripts/build_llama_bench.sh (built from the llama.cpp source
that llama-cpp-python vendors, with the same CPU flags), which this script runs if none is found.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

from conftest import fetch_real_model  # noqa: E402  (the same cached real models the tests use)

MODELS = {"smollm2": "SmolLM2-135M-Instruct.Q4_1.gguf", "gemma": "gemma-3-270m-q4_k_m.gguf",
          "qwen": "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"}  # qwen: the real-size model (not run unless named)


def find_llama_bench(explicit: str | None) -> str:
    from localrun.runtime.reports.bench import find_llama_bench as find
    from localrun.errors import LocalrunError

    try:
        return str(find(Path(explicit) if explicit else None))
    except LocalrunError:
        if explicit or shutil.which("bash") is None:
            raise
    out = subprocess.run(["bash", str(HERE / "build_llama_bench.sh")], capture_output=True, text=True, check=True)
    return out.stdout.strip().splitlines()[-1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["smollm2", "gemma"], choices=list(MODELS))
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", default=None, help="default: all available (comma-separated to sweep)")
    ap.add_argument("--llama-bench", default=None)
    ap.add_argument("--output", default="md", choices=["md", "table", "json", "csv"])
    args = ap.parse_args()

    from localrun.cli import bench
    from localrun.cli.render import render_error
    from localrun.errors import LocalrunError

    try:
        exe = find_llama_bench(args.llama_bench)
        paths = [str(fetch_real_model(MODELS[name])) for name in args.models]
        return bench.run_from_cli(paths, pp="512", tg="128", depth="512", reps=args.reps, threads=args.threads,
                                  compare="llama-bench", llama_bench=Path(exe), output=args.output)
    except LocalrunError as exc:
        return render_error(exc)


if __name__ == "__main__":
    sys.exit(main())
