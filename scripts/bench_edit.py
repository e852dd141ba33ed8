#!/usr/bin/env python3
"""A code edit, timed: "rewrite this 60-line function with type hints, renaming `data` to `records`", greedy,
through `localrun serve` with and without prompt-lookup speculation (`--draft lookup`), beside llama.cpp's
own `llama-server` plain and with its n-gram drafting (`--spec-type ngram-simple`), all four running at once
with one slot each, the same threads and context, the four taking turns. Each round starts all four anew, in
an order that rotates (of two processes of one server started one after the other, the first decoded 4-7%
slower here for as long as it ran), and asks them in that order.

An edit copies most of its input back: a drafter that proposes what followed the last few tokens in the
prompt is right for long runs, and the target model checks a whole draft in one batched step. Prints per
server the median decode tokens/s (completion tokens after the first, over the time after the first), the
median TTFT, and the ratios that matter: localrun lookup / localrun plain (the speed-up, same output), and
localrun lookup / llama-server's best; then whether each server's greedy answer equals localrun plain's.

    python scripts/bench_edit.py [--model PATH] [--reps 4] [--max-tokens 900] [--threads N] [--json F] [--task edit]

`--task prose` times what lookup must not slow down: a story written from a one-line request, where nothing
the answer says was in the prompt (lookup_over_plain is then its cost; catalogue entries that default to
`draft: lookup` are held to within 3% of plain there).

The default model is Qwen2.5-Coder-1.5B-Instruct Q4_K_M (tests/conftest.fetch_real_model assembles it from
its PyPI packages).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_serve import start_llama_server, start_localrun, stop  # noqa: E402

FUNCTION = '''def summarize(data, key, threshold=None, include_empty=False, precision=2):
    """Group the records in data by key and summarise a numeric field of each group."""
    groups = {}
    for item in data:
        if key not in item:
            if include_empty:
                groups.setdefault(None, []).append(item)
            continue
        groups.setdefault(item[key], []).append(item)
    result = []
    for name, items in groups.items():
        values = [i.get("value") for i in items if i.get("value") is not None]
        if not values and not include_empty:
            continue
        total = sum(values)
        count = len(values)
        mean = total / count if count else 0
        ordered = sorted(values)
        if count == 0:
            median = 0
        elif count % 2 == 1:
            median = ordered[count // 2]
        else:
            median = (ordered[count // 2 - 1] + ordered[count // 2]) / 2
        spread = (max(values) - min(values)) if values else 0
        variance = sum((v - mean) ** 2 for v in values) / count if count else 0
        deviation = variance ** 0.5
        flagged = []
        if threshold is not None:
            for i in items:
                v = i.get("value")
                if v is not None and v > threshold:
                    flagged.append(i.get("id"))
        entry = {
            "name": name,
            "count": count,
            "total": round(total, precision),
            "mean": round(mean, precision),
            "median": round(median, precision),
            "spread": round(spread, precision),
            "deviation": round(deviation, precision),
            "flagged": flagged,
        }
        if include_empty and not values:
            entry["empty"] = True
        result.append(entry)
    result.sort(key=lambda e: (-e["count"], str(e["name"])))
    if threshold is not None:
        over = sum(len(e["flagged"]) for e in result)
        print(f"{over} records over {threshold}")
    return result
'''

TASK = ("Rewrite this Python function with full type hints (use typing where needed) and rename the parameter "
        "`data` to `records` everywhere. Keep everything else exactly as it is. Answer with the whole function "
        "in one code block and nothing else.\n\n```python\n" + FUNCTION + "```")


PROSE = ("Write an original short story of about 500 words about a lighthouse keeper on a northern island who "
         "finds an old map in a bottle. Vary your sentences; do not repeat phrases.")
TASKS = {"edit": TASK, "prose": PROSE}


def timed(url: str, model: str, max_tokens: int, task: str = TASK) -> dict:
    """One greedy streamed chat completion: TTFT, decode tokens/s after the first token, the text."""
    import httpx

    body = {"model": model, "messages": [{"role": "user", "content": task}], "temperature": 0, "max_tokens": max_tokens,
            "stream": True, "stream_options": {"include_usage": True}}
    started, first, text, usage = time.perf_counter(), None, [], None
    with httpx.stream("POST", url + "/chat/completions", json=body, timeout=1800) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                usage = chunk["usage"]
            for choice in chunk.get("choices") or []:
                piece = (choice.get("delta") or {}).get("content") or ""
                if piece and first is None:
                    first = time.perf_counter()
                text.append(piece)
    ended = time.perf_counter()
    tokens = usage["completion_tokens"] if usage else None
    decode_s = ended - (first or ended)
    return {"ttft_s": (first or ended) - started, "total_s": ended - started, "tokens": tokens,
            "tps": (tokens - 1) / decode_s if tokens and decode_s > 0 else None, "text": "".join(text)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, default=None)
    ap.add_argument("--reps", type=int, default=4, help="rounds (4: each server starts and is asked in every place once)")
    ap.add_argument("--max-tokens", type=int, default=900)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--task", choices=sorted(TASKS), default="edit", help="edit (copies its input) or prose (nothing repeats)")
    ap.add_argument("--draft-max", type=int, default=None, help="localrun lookup's --draft-max (default: serve's own)")
    args = ap.parse_args()
    if args.model is None:
        sys.path.insert(0, str(HERE.parent / "tests"))
        from conftest import fetch_real_model

        args.model = fetch_real_model("qwen2.5-coder-1.5b-instruct-q4_k_m.gguf")
    args.gpu_layers = "auto"

    import bench_serve

    bench_serve.SLOTS = 1
    starters = {
        "localrun plain": lambda: start_localrun(args.model, args),
        "localrun lookup": lambda: start_localrun(args.model, args, ("--draft", "lookup", *(
            ("--draft-max", str(args.draft_max)) if args.draft_max else ()))),
        "llama-server plain": lambda: start_llama_server(args.model, args),
        "llama-server ngram": lambda: start_llama_server(args.model, args, ("--spec-type", "ngram-simple")),
    }
    names = list(starters)
    runs: dict[str, list[dict]] = {n: [] for n in names}
    for rep in range(args.reps):
        # Every server anew each round, started and asked in an order that rotates: of two processes of one
        # server started one after the other, the first decoded 4-7% slower here for as long as it ran.
        order = names[rep % len(names):] + names[:rep % len(names)]
        servers = {}
        try:
            for name in order:
                servers[name] = starters[name]()
            for name in order:  # warm each once (a short request): the rounds time the edit, not a first load
                _warm(servers[name][1], str(args.model))
            for name in order:
                result = timed(servers[name][1], str(args.model), args.max_tokens, TASKS[args.task])
                runs[name].append(result)
                print(f"round {rep + 1} {name:<20} {result['tokens']} tokens, TTFT {result['ttft_s']:.2f} s, "
                      f"{result['tps']:.2f} t/s", file=sys.stderr, flush=True)
        finally:
            for proc, _ in servers.values():
                stop(proc)

    summary = {}
    reference = runs["localrun plain"][0]["text"]
    for name, results in runs.items():
        summary[name] = {"tps": statistics.median(r["tps"] for r in results),
                         "ttft_s": statistics.median(r["ttft_s"] for r in results),
                         "tokens": results[0]["tokens"],
                         "same_output_as_localrun_plain": all(r["text"] == reference for r in results)}
    print(f"\ntask {args.task}, model {args.model.name}, {args.reps} rounds, {args.threads} threads, greedy, max_tokens {args.max_tokens}")
    print(f"{'server':<20} {'decode t/s':>10} {'TTFT s':>8} {'tokens':>7}  same output as localrun plain")
    for name, s in summary.items():
        print(f"{name:<20} {s['tps']:>10.2f} {s['ttft_s']:>8.2f} {s['tokens']:>7}  {s['same_output_as_localrun_plain']}")
    ratios = {
        "lookup_over_plain": _median_ratio(runs["localrun lookup"], runs["localrun plain"]),
        "lookup_over_llama_server_best": _median_ratio(runs["localrun lookup"], max(
            (runs["llama-server plain"], runs["llama-server ngram"]), key=lambda rs: statistics.median(r["tps"] for r in rs))),
        "plain_over_llama_server_plain": _median_ratio(runs["localrun plain"], runs["llama-server plain"]),
    }
    for key, value in ratios.items():
        print(f"{key:<32} {value:.2f}x (median of the rounds' ratios)")
    if args.json:
        args.json.write_text(json.dumps({"summary": summary, "ratios": ratios,
                                         "runs": {n: [{k: v for k, v in r.items() if k != "text"} for r in rs] for n, rs in runs.items()}},
                                        indent=2))


def _median_ratio(ours: list[dict], theirs: list[dict]) -> float:
    return statistics.median(a["tps"] / b["tps"] for a, b in zip(ours, theirs))


def _warm(url: str, model: str) -> None:
    import httpx

    httpx.post(url + "/chat/completions", json={"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4},
               timeout=600).raise_for_status()


if __name__ == "__main__":
    main()
