#!/usr/bin/env python3
"""Time `localrun --help` (the CLI's start-up cost), next to a bare `python -c pass` measured in the same run.

    python scripts/bench_startup.py [--runs 30]

Prints median and p90 wall time of each, and the difference. Goal: `localrun --help` under 0.15 s.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path


def timed(cmd: list[str], runs: int) -> list[float]:
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
        out.append(time.perf_counter() - t0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=30)
    args = ap.parse_args()
    exe = shutil.which("localrun") or str(Path(sys.executable).with_name("localrun"))
    timed([exe, "--help"], 3)  # warm the page cache
    ours = timed([exe, "--help"], args.runs)
    bare = timed([sys.executable, "-c", "pass"], args.runs)
    for name, xs in (("localrun --help", ours), ("python -c pass", bare)):
        xs = sorted(xs)
        print(f"{name:<18} median {statistics.median(xs) * 1000:6.1f} ms   p90 {xs[int(len(xs) * 0.9) - 1] * 1000:6.1f} ms")
    print(f"{'overhead':<18} median {(statistics.median(ours) - statistics.median(bare)) * 1000:6.1f} ms")


if __name__ == "__main__":
    main()
