#!/usr/bin/env python3
"""What llama.cpp's RPC backend costs per token: a model on this machine alone vs split over two workers.

    python scripts/bench_rpc.py [--reps 3] [--threads 2] [--pp 512] [--tg 64] [--model PATH ...]

Two `localrun worker` processes on 127.0.0.1 (each with --threads), then for each model one `localrun
bench --rpc W1,W2 --gpu-layers 0,-1` run: --gpu-layers 0 keeps every layer here (the reference, measured in
the same run), -1 puts all of them on the workers (half on each, by their free memory). The layers run one
device after the other, so the workers never compete for the cores: the difference is the protocol's
cost (the activations cross loopback TCP between devices, the logits come back). Medians of --reps.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

LOCALRUN = str(Path(sys.executable).with_name("localrun"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_worker(threads: int, env: dict) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen([LOCALRUN, "worker", "--port", str(port), "--threads", str(threads)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc, f"127.0.0.1:{port}"
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise SystemExit("a worker did not start")


def default_models() -> list[Path]:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from conftest import fetch_real_model

    return [fetch_real_model("SmolLM2-135M-Instruct.Q4_1.gguf"), fetch_real_model("gemma-3-270m-q4_k_m.gguf")]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--pp", type=int, default=512)
    ap.add_argument("--tg", type=int, default=64)
    ap.add_argument("--model", type=Path, action="append")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-rpc-") as home:
        env = {**os.environ, "LOCALRUN_HOME": home}
        workers = [start_worker(args.threads, env) for _ in range(2)]
        try:
            rpc = ",".join(endpoint for _, endpoint in workers)
            for model in args.model or default_models():
                out = subprocess.run([LOCALRUN, "bench", str(model), "--rpc", rpc, "--gpu-layers", "0,-1", "--pp", str(args.pp),
                                      "--tg", str(args.tg), "--reps", str(args.reps), "--threads", str(args.threads), "-o", "json"],
                                     env=env, capture_output=True, text=True)
                if out.returncode != 0:
                    raise SystemExit(out.stderr)
                rows = json.loads(out.stdout)
                speed = {(r["test"], r["settings"]["gpu_layers"]): r["median_ts"] for r in rows}
                print(f"{model.name} (threads {args.threads}, workers on loopback, {args.reps} reps):")
                for test in sorted({t for t, _ in speed}):
                    here, split = speed[(test, 0)], speed[(test, -1)]
                    print(f"  {test:>8}: here {here:8.1f} t/s | over 2 workers {split:8.1f} t/s | {split / here:.2f}x "
                          f"({1000 / split - 1000 / here:+.2f} ms per token)")
        finally:
            for proc, _ in workers:
                proc.kill()
                proc.wait()


if __name__ == "__main__":
    main()
