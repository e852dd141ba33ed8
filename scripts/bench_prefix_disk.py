#!/usr/bin/env python3
"""The prefix cache's bytes on disk after a recorded Claude Code session, replayed against `localrun serve`.

Replays tests/data/clients' Claude Code 2.1.197 requests (/work/shared/clients/claude-code-2.1.197 by default:
the main agent's first request of ~18.9k prompt tokens, its retry, a subagent's two turns, the main agent's
second turn) in order through /v1/messages, greedy, each answer cut to --max-tokens, against a server of one
slot in a fresh LOCALRUN_HOME under the default cache cap ($LOCALRUN_CACHE_MAX unset: 2 GB). Then stops the
server (which writes what it still holds) and prints, per request, its prompt and cached tokens, and the files
of the session store: the prefix cache's bytes on disk, and how many prompts' worth of KV that is.

--src runs another checkout's localrun (its src/ folder) with this virtual environment: the figure before a
change, from a `git worktree` of the commit before it.

    python scripts/bench_prefix_disk.py [--model PATH] [--ctx 24576] [--max-tokens 16] [--src OTHER/src] [--json F]

(The tests' models are fetched first: `make install-test`'s virtual environment, tests/conftest.py.)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent
RECORDED = Path("/work/shared/clients/claude-code-2.1.197/requests.jsonl")


def default_model(folder: Path) -> Path:
    """SmolLM2-135M with Qwen 2.5's Hermes-style tool template (as the tests' tools_model): a model whose
    template renders Claude Code's 24 tools as Qwen2.5-Coder's does (SmolLM2's own leaves them out, and the
    prompt is 3k tokens instead of ~19k), and evaluates them ten times faster than Qwen2.5-Coder-1.5B."""
    sys.path.insert(0, str(HERE.parent / "tests"))
    from conftest import TOOLS_TEMPLATE, fetch_real_model

    out = folder / "smollm2-tools.gguf"
    subprocess.run([sys.executable, "-m", "gguf.scripts.gguf_new_metadata", str(fetch_real_model("SmolLM2-135M-Instruct.Q4_1.gguf")),
                    str(out), "--chat-template-file", str(TOOLS_TEMPLATE), "--force"], check=True, capture_output=True)
    # Trained on 8,192 tokens, so a context of more is capped to that: the prompt's ~20k tokens would not fit.
    # Its answers past 8k are no good, and need not be: the figure is the bytes its KV takes.
    subprocess.run([sys.executable, "-m", "gguf.scripts.gguf_set_metadata", str(out), "llama.context_length", "32768", "--force"],
                   check=True, capture_output=True)
    return out


def start(model: Path, args, home: Path) -> tuple[subprocess.Popen, str]:
    env = {**os.environ, "LOCALRUN_HOME": str(home)}
    env.pop("LOCALRUN_CACHE_MAX", None)
    if args.src:
        env["PYTHONPATH"] = str(Path(args.src).resolve()) + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.Popen(
        [sys.executable, "-m", "localrun.cli.main", "serve", str(model), "--port", "0", "--parallel", "1",
         "--ctx", str(args.ctx), "--threads", str(args.threads)],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env,
    )
    for line in proc.stderr:
        m = re.search(r"(http://127\.0\.0\.1:\d+)/v1", line)
        if m:
            return proc, m.group(1)
    raise SystemExit(f"localrun serve did not start (exit {proc.wait()})")


def replay(url: str, model: Path, max_tokens: int) -> list[dict]:
    out = []
    with httpx.Client(timeout=3600) as client:
        for line in RECORDED.read_text().splitlines():
            item = json.loads(line)
            if not item["path"].startswith("/v1/messages"):
                continue
            body = {**item["body"], "model": model.name, "max_tokens": max_tokens, "temperature": 0, "stream": False}
            started = time.perf_counter()
            r = client.post(url + "/v1/messages", json=body, headers={"anthropic-version": "2023-06-01"})
            r.raise_for_status()
            usage = r.json()["usage"]
            out.append({"n": item["n"], "seconds": round(time.perf_counter() - started, 1), **usage})
            print(f"request {item['n']}: {json.dumps(usage)} in {out[-1]['seconds']} s", file=sys.stderr, flush=True)
    return out


def files(home: Path) -> dict:
    found = {}
    for folder in ("states", "prefix"):
        paths = [p for p in (home / "sessions" / folder).glob("*.kv")] if (home / "sessions" / folder).exists() else []
        found[folder] = {"files": len(paths), "bytes": sum(p.stat().st_size for p in paths)}
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=None,
                        help="default: the tests' SmolLM2-135M Q4_1 with Qwen 2.5's tool template")
    parser.add_argument("--ctx", type=int, default=24576)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--src", default=None, help="another checkout's src/ folder to run")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="prefix-disk-") as tmp:
        home = Path(tmp)
        model = args.model or default_model(home)
        proc, url = start(model, args, home)
        try:
            requests = replay(url, model, args.max_tokens)
        finally:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        on_disk = files(home)
    longest = max(r["input_tokens"] + r.get("cache_read_input_tokens", 0) for r in requests)
    cache = on_disk["prefix"]["bytes"] + on_disk["states"]["bytes"]  # (no named session here: all prefix cache)
    result = {"model": model.name, "src": args.src or str(HERE.parent / "src"), "requests": requests, "files": on_disk,
              "cache_bytes": cache, "longest_prompt": longest}
    print(json.dumps(result, indent=1))
    print(f"prefix cache on disk: {cache / 1e6:.0f} MB in {on_disk['prefix']['files'] + on_disk['states']['files']} files "
          f"after {len(requests)} requests (longest prompt {longest} tokens)", file=sys.stderr)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
