#!/usr/bin/env python3
"""What the resident server saves a user at the terminal, measured whole-process with the real `localrun`.

    python scripts/bench_resident.py [--reps 5] [--tokens 2000] [--threads N] [--model PATH ...]

For each model, in a fresh LOCALRUN_HOME, timed from process start to the first answer byte on stdout:

  cold       `run --keep-alive 0 --no-cache` of a ~2,000-token message and a question: load + full prefill
  session    `run --session big QUESTION` on a warm server whose session `big` holds that message, run
             again and again (the server still holds the session)
  session from disk   the same after another request replaced what the server holds (read back from disk)
  prefix     the same ~2,000-token message and question again on a warm server (the automatic prefix cache)

and the ratios cold/session and cold/prefix (goal: at least 20x). Then:

  overhead   first byte minus the server's own time to first token for that request (stats.ttft_s): what
             the client path costs (Python start, imports, the socket), median of --reps x 2 short runs
  short      whole-process wall time of `run -n 16` on a warm server vs `--keep-alive 0`
  four       wall time of four `run -n 48` at once on the warm server (they share its slots) vs one after another

Cold and session runs alternate, short runs warm and in-process alternate; medians are reported. The
server is stopped at the end. Models: by default the two the tests use, fetched as the tests do.

`localrun` runs with Python's bytecode cache allowed (PYTHONDONTWRITEBYTECODE unset), as an installed
package has it (pip compiles at install): with the cache off, every start compiles localrun's modules
again, ~30 ms that no user pays.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

LOCALRUN = str(Path(sys.executable).with_name("localrun"))
QUESTION = "\n\nIn one word: who is the story about?"
OTHERS = ["Name a colour.", "Why is the sky blue?", "Count to five.", "Spell cat."]  # one per slot (the server's 4)


def first_byte(args: list[str], env: dict) -> tuple[float, float, str]:
    """(seconds to the first stdout byte, seconds to exit, stdout) of one whole `localrun` process."""
    t0 = time.perf_counter()
    # Unbuffered: communicate() reads the pipe itself, so nothing may sit in a buffer after the first byte.
    proc = subprocess.Popen([LOCALRUN, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, env=env, bufsize=0)
    head = proc.stdout.read(1)
    t1 = time.perf_counter()
    rest, err = proc.communicate()
    t2 = time.perf_counter()
    if proc.returncode != 0 or not head:
        raise SystemExit(f"localrun {' '.join(args[:3])} ... failed ({proc.returncode}):\n{err.decode()}")
    return t1 - t0, t2 - t0, (head + rest).decode()


def last_event(out: str) -> dict:
    """The `done` event of `run --json` (JSON Lines split on newlines only: text may hold U+2028)."""
    return json.loads([line for line in out.split("\n") if line][-1])


def history(target_tokens: int) -> str:
    """About `target_tokens` tokens of the bundled text (~4 characters a token for these tokenizers)."""
    import localrun

    text = (Path(localrun.__file__).parent / "data" / "wonderland.txt").read_text()
    return text[: target_tokens * 4]


def bench_model(model: Path, reps: int, target: int, threads: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench-resident-") as home:
        env = {**os.environ, "LOCALRUN_HOME": home, "LOCALRUN_KEEP_ALIVE": "10m"}
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        base = [str(model), "-t", "0", "--threads", str(threads), "--ctx", "4096"]
        doc = history(target)
        try:
            # The session holds the document; the server holds the model. Warm-ups are not timed.
            first_byte(["run", *base, "-n", "1", "--session", "big", doc], env)
            _, _, out = first_byte(["run", *base, "-n", "1", "--json", "--no-cache", doc + QUESTION], {**env, "LOCALRUN_KEEP_ALIVE": "0"})
            prompt_tokens = last_event(out)["stats"]["prompt_tokens"]
            first_byte(["run", *base, "-n", "4", doc + QUESTION], env)
            rows: dict[str, list[float]] = {k: [] for k in (
                "cold", "session", "session_disk", "prefix", "short_warm", "short_cold", "overhead", "four_in_turn", "four_together")}
            cold_env = {**env, "LOCALRUN_KEEP_ALIVE": "0"}
            session = ["run", *base, "-n", "4", "--session", "big", QUESTION.strip()]
            for _ in range(reps):  # a session resumed again and again: the server still holds it
                rows["cold"].append(first_byte(["run", *base, "-n", "4", "--no-cache", doc + QUESTION], cold_env)[0])
                rows["session"].append(first_byte(session, env)[0])
            for _ in range(reps):  # the same document asked about again: the prefix cache (the server holds it)
                rows["prefix"].append(first_byte(["run", *base, "-n", "4", doc + QUESTION], env)[0])
            for _ in range(reps):  # the session after other work replaced what every slot holds: read from disk
                for other in OTHERS:  # each to the least recently used slot, so all four are displaced
                    first_byte(["run", *base, "-n", "1", "--no-cache", other], env)
                rows["session_disk"].append(first_byte(session, env)[0])
            for _ in range(reps):
                rows["short_warm"].append(first_byte(["run", *base, "-n", "16", "--no-cache", "Name three colours."], env)[1])
                rows["short_cold"].append(first_byte(["run", *base, "-n", "16", "--no-cache", "Name three colours."], cold_env)[1])
                for _ in range(2):
                    ttfb, _, out = first_byte(["run", *base, "-n", "1", "--no-cache", "--json", "Hi."], env)
                    rows["overhead"].append(ttfb - last_event(out)["stats"]["ttft_s"])
            for _ in range(reps):  # four runs at once share the model's slots, against the same four one after another
                one_by_one = time.perf_counter()
                for other in OTHERS:
                    first_byte(["run", *base, "-n", "48", "--min-tokens", "48", "--no-cache", other], env)
                rows["four_in_turn"].append(time.perf_counter() - one_by_one)
                together = time.perf_counter()
                procs = [subprocess.Popen([LOCALRUN, "run", *base, "-n", "48", "--min-tokens", "48", "--no-cache", other], env=env,
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL) for other in OTHERS]
                if any(p.wait() for p in procs):
                    raise SystemExit("a concurrent run failed")
                rows["four_together"].append(time.perf_counter() - together)
        finally:
            subprocess.run([LOCALRUN, "stop", "--server"], env=env, capture_output=True)
    med = {k: statistics.median(v) for k, v in rows.items()}
    return {
        "model": model.name, "prompt_tokens": prompt_tokens, **{f"{k}_s": round(v, 4) for k, v in med.items()},
        "cold_over_session": med["cold"] / med["session"], "cold_over_prefix": med["cold"] / med["prefix"],
        "cold_over_session_disk": med["cold"] / med["session_disk"],
        "short_speedup": med["short_cold"] / med["short_warm"],
        "four_speedup": med["four_in_turn"] / med["four_together"],
        "runs": {k: [round(x, 4) for x in v] for k, v in rows.items()},
    }


def default_models() -> list[Path]:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from conftest import fetch_real_model

    return [fetch_real_model("SmolLM2-135M-Instruct.Q4_1.gguf"), fetch_real_model("gemma-3-270m-q4_k_m.gguf")]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=2000)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--model", type=Path, action="append")
    ap.add_argument("--json", type=Path, help="write the results here too")
    args = ap.parse_args()
    results = [bench_model(m, args.reps, args.tokens, args.threads) for m in (args.model or default_models())]
    for r in results:
        print(f"{r['model']}: {r['prompt_tokens']} prompt tokens")
        print(f"  first byte  cold {r['cold_s']:.3f} s | session {r['session_s']:.3f} s ({r['cold_over_session']:.1f}x) | "
              f"session from disk {r['session_disk_s']:.3f} s ({r['cold_over_session_disk']:.1f}x) | "
              f"prefix cache {r['prefix_s']:.3f} s ({r['cold_over_prefix']:.1f}x)")
        print(f"  client overhead (first byte - server TTFT): {r['overhead_s'] * 1000:.0f} ms")
        print(f"  run -n 16 whole process: warm server {r['short_warm_s']:.3f} s | --keep-alive 0 {r['short_cold_s']:.3f} s "
              f"({r['short_speedup']:.2f}x)")
        print(f"  4 runs of 48 tokens: one after another {r['four_in_turn_s']:.3f} s | at once {r['four_together_s']:.3f} s "
              f"({r['four_speedup']:.2f}x: they share the model's slots)")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
