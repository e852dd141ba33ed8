#!/usr/bin/env python3
"""How long `localrun run` takes to exit after writing its last byte, when nothing is saved.

    python scripts/bench_exit.py [--reps 10] [--model PATH ...]

`run -n 16 --no-cache --keep-alive 0` (in-process, no prefix cache to save): the time from the last byte
on stdout to the process's exit, median of --reps. A run used to free the model and llama.cpp's threads
and then tear the interpreter down after its answer (0.2-0.3 s here); it now leaves at once (cli.main._leave).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

LOCALRUN = str(Path(sys.executable).with_name("localrun"))


def lag_ms(model: Path) -> float:
    env = {**os.environ, "LOCALRUN_KEEP_ALIVE": "0"}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    proc = subprocess.Popen([LOCALRUN, "run", str(model), "-t", "0", "-n", "16", "--no-cache", "Name three colours."],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, bufsize=0, env=env)
    last = time.perf_counter()
    while proc.stdout.read(1):
        last = time.perf_counter()
    proc.wait()
    return (time.perf_counter() - last) * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--model", type=Path, action="append")
    args = ap.parse_args()
    models = args.model
    if not models:
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
        from conftest import fetch_real_model

        models = [fetch_real_model("SmolLM2-135M-Instruct.Q4_1.gguf"), fetch_real_model("gemma-3-270m-q4_k_m.gguf")]
    for model in models:
        lags = [lag_ms(model) for _ in range(args.reps)]
        print(f"{model.name}: exit {statistics.median(lags):.0f} ms after the last byte (median of {args.reps}; "
              f"min {min(lags):.0f}, max {max(lags):.0f})")


if __name__ == "__main__":
    main()
