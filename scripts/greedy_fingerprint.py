#!/usr/bin/env python3
"""Greedy output of every generation path, as one JSON object: run it before and after a change to the core
and compare the two files (`--compare A.json B.json`); any difference is a change in behaviour.

    python scripts/greedy_fingerprint.py [--localrun PATH] [--paths run,chat,serve,beams,lookup] > before.json
    python scripts/greedy_fingerprint.py --compare before.json after.json

Paths (both test models unless said):
  run      `run --raw -t 0 --json` token ids; SmolLM2 also through its chat template
  chat     piped `chat -t 0`, three messages, one answer line each
  serve    `serve --parallel 8`: a completion alone, then the same among 7 others at once (the others'
           text is recorded, not compared: on gemma it varies between runs of one build)
  beams    `run --beams 3 --json` token ids
  lookup   `run --draft lookup --json` token ids next to plain decoding's with flash attention off, as --draft
           sets it (equal on a cpu-exact build)
The command is the installed `localrun` next to this Python, or --localrun PATH (another checkout's venv).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

from conftest import fetch_real_model  # noqa: E402  (the test suite's cached real models)

MODELS = {"smollm2": "SmolLM2-135M-Instruct.Q4_1.gguf", "gemma": "gemma-3-270m-q4_k_m.gguf"}
PROMPT = "The history of the printing press begins"
COPY = ("Copy this list exactly: apples, pears, plums, cherries, apricots, peaches, grapes, lemons. "
        "Copy this list exactly: apples, pears, plums,")
OTHERS = ["Rivers flow into", "The best way to learn a language is", "Seven wonders of the ancient world:",
          "def fibonacci(n):", "Once upon a time, in a small village,", "The chemical symbol for gold is",
          "A recipe for bread needs"]
CHAT = ["Name a colour.", "Why is the sky blue? One sentence.", "Thanks! Now name an animal."]


def cli(exe: str, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    r = subprocess.run([exe, *args], input=stdin, capture_output=True, text=True, timeout=600,
                       stdin=None if stdin is not None else subprocess.DEVNULL, env={**os.environ, "LOCALRUN_CACHE_MAX": "0"})
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(args)}: exit {r.returncode}: {r.stderr[-2000:]}")
    return r


def done(stdout: str) -> dict:
    return [json.loads(line) for line in stdout.splitlines() if line.strip()][-1]


def run_path(exe: str, model: Path, name: str) -> dict:
    out = {"raw": done(cli(exe, "run", str(model), "--raw", "-t", "0", "-n", "48", "--ctx", "1024", "--json", PROMPT).stdout)["tokens"]}
    if name == "smollm2":
        out["template"] = done(cli(exe, "run", str(model), "-t", "0", "-n", "48", "--ctx", "1024", "--json",
                                   "What is the capital of France?").stdout)["tokens"]
    return out


def chat_path(exe: str, model: Path) -> list[str]:
    return cli(exe, "chat", str(model), "-t", "0", "-n", "32", "--ctx", "1024", stdin="\n".join(CHAT) + "\n").stdout.splitlines()


def serve_path(exe: str, model: Path) -> dict:
    import httpx

    proc = subprocess.Popen([exe, "serve", str(model), "--port", "0", "--parallel", "8", "--ctx", "512", "--threads", "2"],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        url = None
        for line in proc.stderr:
            m = re.search(r"(http://127\.0\.0\.1:\d+)/v1", line)
            if m:
                url = m.group(1)
                break
        if url is None:
            raise SystemExit(f"serve did not start (exit {proc.wait()})")

        def complete(prompt: str) -> str:
            r = httpx.post(f"{url}/v1/completions", json={"prompt": prompt, "max_tokens": 40, "temperature": 0}, timeout=600)
            r.raise_for_status()
            return r.json()["choices"][0]["text"]

        def chat(content: str) -> str:
            r = httpx.post(f"{url}/v1/chat/completions", timeout=600,
                           json={"messages": [{"role": "user", "content": content}], "max_tokens": 40, "temperature": 0})
            r.raise_for_status()
            return r.json()["choices"][0]["message"]["content"]

        alone = complete(PROMPT)
        with ThreadPoolExecutor(8) as pool:
            together = list(pool.map(complete, [PROMPT, *OTHERS]))
        chat_alone = chat(CHAT[1])
        return {"alone": alone, "among_7": together[0], "others": together[1:], "chat": chat_alone}
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)


def beams_path(exe: str, model: Path) -> list[int]:
    return done(cli(exe, "run", str(model), "--raw", "--beams", "3", "-n", "24", "--ctx", "512", "--json", PROMPT).stdout)["tokens"]


def lookup_path(exe: str, model: Path) -> dict:
    args = ("run", str(model), "--raw", "-t", "0", "-n", "48", "--ctx", "512", "--json")
    plain = done(cli(exe, *args, "--no-flash-attn", COPY).stdout)["tokens"]  # --draft turns flash attention off
    draft = done(cli(exe, *args, "--draft", "lookup", COPY).stdout)
    return {"plain": plain, "lookup": draft["tokens"], "accepted": draft["stats"].get("draft_accepted")}


def compare(a: Path, b: Path) -> int:
    left, right = json.loads(a.read_text()), json.loads(b.read_text())
    diffs = []

    def walk(x, y, where):
        if isinstance(x, dict) and isinstance(y, dict):
            for k in sorted(set(x) | set(y)):
                if k in ("accepted", "others"):
                    # how many drafts were kept may change, the output may not; the 7 others' text varies from run
                    # to run on gemma with the same build (which prompt chunks share a batch depends on arrival)
                    continue
                walk(x.get(k), y.get(k), f"{where}.{k}")
        elif x != y:
            diffs.append(f"{where}: {json.dumps(x)[:200]} != {json.dumps(y)[:200]}")

    walk(left, right, "")
    for d in diffs:
        print(d)
    print(f"{len(diffs)} difference(s)")
    return 1 if diffs else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--localrun", default=str(Path(sys.executable).with_name("localrun")))
    ap.add_argument("--paths", default="run,chat,serve,beams,lookup")
    ap.add_argument("--compare", nargs=2, type=Path)
    args = ap.parse_args()
    if args.compare:
        return compare(*args.compare)
    paths = args.paths.split(",")
    result: dict = {}
    for name, file in MODELS.items():
        model = fetch_real_model(file)
        r = result[name] = {}
        if "run" in paths:
            r["run"] = run_path(args.localrun, model, name)
        if "chat" in paths:
            r["chat"] = chat_path(args.localrun, model)
        if "serve" in paths:
            r["serve"] = serve_path(args.localrun, model)
        if "beams" in paths:
            r["beams"] = beams_path(args.localrun, model)
        if "lookup" in paths:
            r["lookup"] = lookup_path(args.localrun, model)
        print(f"{name}: done", file=sys.stderr)
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
