#!/usr/bin/env python3
"""An agent replay against `localrun serve` and llama.cpp's `llama-server`, side by side: the shape of a
coding agent's conversation, a long system prompt with tool definitions (--system tokens, about 5k), then
--turns turns that each add the model's short answer and a tool result of a few hundred tokens, greedy,
streamed through /v1/chat/completions with the openai client. Both servers run at once with one slot of
--ctx tokens and the same threads; each replay runs on one then the other, alternating which goes first.

Prints, per turn, the median TTFT of each server and their ratio, the total time of a replay, and then
localrun's first turn after a restart of its server against its cold first turn (what a prefix cache on disk
would serve; the same figure for llama-server, which keeps nothing across a restart).

    python scripts/bench_agent.py [--model PATH] [--reps 2] [--turns 8] [--system 5000] [--json F] [--localrun-args "--draft lookup"]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench_serve  # noqa: E402

WORDS = ("module function return value parameter error handler request response buffer cache index token "
         "server client thread lock queue file path config option default check test build deploy log trace "
         "memory stream batch slot prompt answer model layer tensor weight scale offset range limit").split()


def text_of(n_words: int, seed: int) -> str:
    rng = random.Random(seed)
    lines, line = [], []
    for i in range(n_words):
        line.append(rng.choice(WORDS))
        if len(line) == 12:
            lines.append(" ".join(line) + ".")
            line = []
    return "\n".join(lines + [" ".join(line)])


def tools() -> list[dict]:
    out = []
    for i, name in enumerate(["read_file", "write_file", "list_dir", "grep", "run_tests", "run_shell", "git_diff", "git_commit"]):
        out.append({"type": "function", "function": {
            "name": name, "description": f"{name.replace('_', ' ')}: " + text_of(60, 100 + i),
            "parameters": {"type": "object", "properties": {"path": {"type": "string", "description": text_of(15, 200 + i)},
                                                            "pattern": {"type": "string"}}, "required": ["path"]}}})
    return out


def conversation(system_tokens: int, turns: int) -> tuple[list[dict], list[str]]:
    system = "You are a coding agent working in a repository. Follow the project guide.\n\n" + text_of(int(system_tokens * 0.75), 1)
    results = [f"Tool output {t + 1}:\n" + text_of(220, 1000 + t) for t in range(turns)]
    return [{"role": "system", "content": system}, {"role": "user", "content": "Find where the cache index is built and fix its bounds check."}], results


def replay(url: str, model: str, messages: list[dict], results: list[str], max_tokens: int) -> list[dict]:
    """Each turn: (ttft_s, total_s, prompt tokens); the answer and the next tool result join the history."""
    from openai import OpenAI

    client = OpenAI(base_url=url, api_key="none", timeout=3600, max_retries=0)
    history, rows = list(messages), []
    for result in [None, *results]:
        if result is not None:
            history.append({"role": "user", "content": result})
        t0 = time.perf_counter()
        ttft, text, usage = None, [], None
        for chunk in client.chat.completions.create(model=model, messages=history, tools=tools(), tool_choice="none",
                                                    temperature=0, max_tokens=max_tokens, stream=True,
                                                    stream_options={"include_usage": True}):
            if chunk.choices and chunk.choices[0].delta.content:
                if ttft is None:
                    ttft = time.perf_counter() - t0
                text.append(chunk.choices[0].delta.content)
            if chunk.usage:
                usage = chunk.usage
        total = time.perf_counter() - t0
        history.append({"role": "assistant", "content": "".join(text)})
        rows.append({"ttft_s": ttft if ttft is not None else total, "total_s": total,
                     "prompt_tokens": usage.prompt_tokens if usage else None})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--turns", type=int, default=8)
    ap.add_argument("--system", type=int, default=5000, help="system prompt tokens, about")
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--ctx", type=int, default=16384)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--gpu-layers", default="0")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--localrun-args", default="", help="more `localrun serve` flags, e.g. \"--draft lookup\" (what a "
                    "code model's catalogue entry loads with)")
    args = ap.parse_args()
    if args.model is None:
        sys.path.insert(0, str(HERE.parent / "tests"))
        from conftest import fetch_real_model

        args.model = fetch_real_model("qwen2.5-coder-1.5b-instruct-q4_k_m.gguf")
    bench_serve.SLOTS = 1
    messages, results = conversation(args.system, args.turns)
    ours, ours_url = bench_serve.start_localrun(args.model, args, tuple(args.localrun_args.split()))
    theirs, theirs_url = bench_serve.start_llama_server(args.model, args)
    runs: dict[str, list[list[dict]]] = {"localrun": [], "llama-server": []}
    try:
        for rep in range(args.reps):
            order = [("localrun", ours_url), ("llama-server", theirs_url)]
            for name, url in (order if rep % 2 == 0 else order[::-1]):
                # a new first message per replay: no server starts it from a cached prefix of the last one
                fresh = [messages[0], {"role": "user", "content": messages[1]["content"] + f" (run {rep})"}]
                fresh[0] = {"role": "system", "content": f"Session {rep}.\n" + messages[0]["content"]}
                runs[name].append(replay(url, args.model.name, fresh, results, args.max_tokens))
                print(f"rep {rep + 1} {name}: {sum(r['total_s'] for r in runs[name][-1]):.1f} s", file=sys.stderr, flush=True)
        # The first turn again after a restart of each server, against its cold first turn above.
        first = [{"role": "system", "content": "Session 0.\n" + messages[0]["content"]},
                 {"role": "user", "content": messages[1]["content"] + " (run 0)"}]
        bench_serve.stop(ours)
        ours, ours_url = bench_serve.start_localrun(args.model, args, tuple(args.localrun_args.split()))
        restart_ours = replay(ours_url, args.model.name, first, [], args.max_tokens)[0]
        bench_serve.stop(theirs)
        theirs, theirs_url = bench_serve.start_llama_server(args.model, args)
        restart_theirs = replay(theirs_url, args.model.name, first, [], args.max_tokens)[0]
    finally:
        bench_serve.stop(ours)
        bench_serve.stop(theirs)

    def med(name: str, turn: int, key: str) -> float:
        return statistics.median(run[turn][key] for run in runs[name])

    print(f"\nagent replay: {args.model.name}, system ~{args.system} tokens + {args.turns} tool results, "
          f"{args.reps} reps (medians), 1 slot, {args.threads} threads")
    print(f"{'turn':>4} {'prompt':>7} {'TTFT ours':>10} {'TTFT theirs':>12} {'ratio':>6}")
    for t in range(args.turns + 1):
        a, b = med("localrun", t, "ttft_s"), med("llama-server", t, "ttft_s")
        print(f"{t + 1:>4} {runs['localrun'][0][t]['prompt_tokens'] or 0:>7} {a:>9.2f}s {b:>11.2f}s {a / b:>6.2f}")
    total = {n: statistics.median(sum(r["total_s"] for r in run) for run in runs[n]) for n in runs}
    print(f"total: ours {total['localrun']:.1f} s, theirs {total['llama-server']:.1f} s, "
          f"speed ratio {total['llama-server'] / total['localrun']:.2f}x")
    cold = runs["localrun"][0][0]["ttft_s"]
    print(f"first turn after a restart: ours {restart_ours['ttft_s']:.2f} s ({restart_ours['ttft_s'] / cold:.2f}x its cold "
          f"{cold:.2f} s); llama-server {restart_theirs['ttft_s']:.2f} s ({restart_theirs['ttft_s'] / runs['llama-server'][0][0]['ttft_s']:.2f}x)")
    if args.json:
        args.json.write_text(json.dumps({"runs": runs, "restart": {"localrun": restart_ours, "llama-server": restart_theirs},
                                         "total_s": total}, indent=1))


if __name__ == "__main__":
    main()
