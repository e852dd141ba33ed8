#!/usr/bin/env python3
"""What verifying a draft costs: the time of one decode step of n tokens, each with its logits (as speculative
decoding checks a draft of n-1 tokens), against a step of one token, at a given context depth. Speculation
gains only while the tokens it keeps outnumber that cost: with acceptance a and draft length k, a step yields
about 1 + a*k tokens for cost(k+1) single steps, so its ceiling is (k+1)/cost(k+1) even at a = 1.

    python scripts/bench_verify_cost.py [--model PATH] [--threads N] [--depth 500] [--reps 5] [--sizes 1,2,4,8,12,17,25,33]
                                        [--flash-attn auto|on|off]

Prints per n the median milliseconds and the cost in single steps (medians of --reps, the sizes taking turns).
The default model is Qwen2.5-Coder-1.5B-Instruct Q4_K_M (tests/conftest.fetch_real_model).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--depth", type=int, default=500, help="tokens already in the context")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--sizes", default="1,2,4,8,12,17,25,33")
    ap.add_argument("--flash-attn", choices=("auto", "on", "off"), default="off",
                    help="off (default): as lookup drafting runs on a CPU (engine.strategies.context_options)")
    args = ap.parse_args()
    if args.model is None:
        sys.path.insert(0, str(HERE.parent / "tests"))
        from conftest import fetch_real_model

        args.model = fetch_real_model("qwen2.5-coder-1.5b-instruct-q4_k_m.gguf")
    from localrun.engine import Engine, LoadOptions
    from localrun.engine.loop import evaluate

    sizes = [int(s) for s in args.sizes.split(",")]
    engine = Engine(args.model, LoadOptions(
        n_ctx=args.depth + max(sizes) + 64, n_threads=args.threads, n_outputs=max(sizes),
        flash_attn={"auto": None, "on": True, "off": False}[args.flash_attn]))
    text = "def scale(values, factor):\n    return [v * factor for v in values]\n" * (args.depth // 8 + 1)
    context = engine.tokenize(text)[: args.depth]
    evaluate(engine, context)
    base = len(engine.kv.tokens[0])
    seconds: dict[int, list[float]] = {n: [] for n in sizes}
    batch = engine.batch
    for rep in range(args.reps + 1):  # the first round warms up
        for n in sizes[rep % len(sizes):] + sizes[: rep % len(sizes)]:
            batch.clear()
            for i in range(n):
                batch.add(context[i % len(context)], base + i, 0, True)
            t0 = time.perf_counter()
            engine.decode(batch)
            engine.synchronize()
            engine.logits(n - 1)
            if rep:
                seconds[n].append(time.perf_counter() - t0)
            engine.kv.truncate(0, base)
    one = statistics.median(seconds[1]) if 1 in seconds else None
    print(f"{args.model.name}, {args.threads} threads, depth {args.depth}, flash attention {args.flash_attn}: one step of n tokens, each with logits")
    for n in sizes:
        ms = statistics.median(seconds[n]) * 1000
        cost = f"  {ms / 1000 / one:5.2f} single steps" if one else ""
        print(f"  n={n:3d}  {ms:8.1f} ms{cost}")
    engine.close()


if __name__ == "__main__":
    main()
