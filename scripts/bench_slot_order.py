#!/usr/bin/env python3
"""Why concurrent requests take slots side by side: the decode step of 4 slots costs about twice as much
when the slots' sequence ids are not consecutive. With one KV stream per slot (localrun's layout,
llama-server's --no-kv-unified), llama.cpp puts only consecutive sequences in one micro-batch, so slots
0, 2, 5, 7 decode as four micro-batches of one token (four passes over the weights), slots 0-3 as one.
localrun's slot choice (runtime.serving.scheduler.Scheduler._closest) takes the free slot beside the busy ones
first, and copies a prefix held elsewhere into it; when the longest useful prefix came first, requests
were scattered over the slots once all had been used (bench_serve.py's 4 streams on slots 0, 1, 3, 4).

Runs the server's scheduler in this process: 4 greedy requests of --tokens on 8 slots, placed on slots 0-3,
then on 0, 2, 5, 7 (the others leased meanwhile), --reps times, and prints the median time of a 4-token step.

    python scripts/bench_slot_order.py [--model PATH] [--reps 2] [--tokens 32] [--threads 2]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    from localrun.engine.sampling import merge_options
    from localrun.runtime.loader import load
    from localrun.runtime.options import LoadSpec
    from localrun.runtime.serving.scheduler import Scheduler

    if args.model is None:
        sys.path.insert(0, str(HERE.parent / "tests"))
        from conftest import fetch_real_model

        args.model = fetch_real_model("qwen2.5-coder-1.5b-instruct-q4_k_m.gguf")
    loaded = load(str(args.model), LoadSpec(ctx=1024 * 8, parallel=8, threads=args.threads))
    steps: list[tuple[float, int, int]] = []

    def deliver(responses) -> None:
        for job, response in responses:
            job.sink.put_nowait(response)

    scheduler = Scheduler(loaded.engine, parallel=8, slot_ctx=1024, max_waiting=8, prefill_chunk=256, deliver=deliver,
                          on_step=lambda n, decoding: steps.append((time.perf_counter(), n, decoding)))
    scheduler.start()
    scheduler.call(loaded.engine.warm_up)
    sampling = merge_options({"temperature": 0, "max_tokens": args.tokens})

    def step_ms(slots: set[int]) -> float:
        for slot in scheduler.slots:
            slot.leased = slot.seq_id not in slots  # the requests can take only `slots`
        steps.clear()

        def one(i: int) -> None:
            prompt = loaded.engine.tokenize(f"Write a story number {i} about a cat.")
            with scheduler.hold(prompt) as seat:
                seat.reset()
                list(seat.generate(prompt, sampling))

        threads = [threading.Thread(target=one, args=(i,)) for i in range(len(slots))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        full = [b - a for (a, _, _), (b, n, d) in zip(steps, steps[1:]) if n == d == len(slots)]
        return statistics.median(full) * 1000

    times: dict[str, list[float]] = {"0-3": [], "0,2,5,7": []}
    try:
        for _ in range(args.reps):
            times["0-3"].append(step_ms({0, 1, 2, 3}))
            times["0,2,5,7"].append(step_ms({0, 2, 5, 7}))
    finally:
        for slot in scheduler.slots:
            slot.leased = False
        scheduler.stop()
        loaded.close()
    for name, values in times.items():
        print(f"slots {name}: a 4-token step takes {statistics.median(values):.0f} ms (median of {len(values)}: "
              + ", ".join(f"{v:.0f}" for v in values) + ")")


if __name__ == "__main__":
    main()
