#!/usr/bin/env python3
"""Measure `localrun serve` against llama.cpp's own `llama-server`, side by side, with the same load generator.

Both servers run at once with equal settings: the same GGUF, 8 slots of --ctx tokens each (llama-server:
`-np 8 -c 8*ctx --no-kv-unified`, one KV stream per slot as ours), the same threads, batch and ubatch of
512, and all layers offloaded on a GPU build (--gpu-layers). llama-server is built from the same vendored
llama.cpp and flags by scripts/build_llama_bench.sh. Each round starts both servers anew, the one started
first alternating (of two processes of one server started one after the other, the first decoded 4-7%
slower here for as long as it ran). Then, per model and round:
  - the first request after start (TTFT of a 16-token request, before anything else ran), against the
    median TTFT of 3 such requests once warm (each prompt new to every slot, so evaluated whole);
  - levels of 1, 8 and 16 concurrent streams (`localrun bench --serve`'s load generator: streaming
    /v1/completions, `ignore_eos`, --tokens each, 2 requests per stream), the two servers alternating
    which goes first.
Each round also times one request alone, not streamed, as each server times its own decode loop (ms per
token). Prints per model and stream count the median aggregate t/s of each, the median of the per-round ratios
(ours / theirs, measured back to back), and TTFT p50/p95 of every request of that level (all rounds
pooled); then each server's peak resident memory and, where nvidia-smi runs, its GPU memory; --json
writes them.

    python scripts/bench_serve.py [--model PATH ...] [--reps 3] [--streams 1,8,16] [--tokens 128] [--json F] [--pause-idle]
    python scripts/bench_serve.py --compare llama-batched-bench   # llama.cpp's batched decode, no HTTP
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))

from localrun.cli import loadtest  # noqa: E402

TOOLS = Path(os.environ.get("LOCALRUN_LLAMA_BENCH_DIR", Path.home() / ".cache/localrun/llama-bench-0.3.36")) / "bin"
SLOTS = 8


def default_models() -> list[Path]:
    sys.path.insert(0, str(HERE.parent / "tests"))
    from conftest import fetch_real_model

    return [fetch_real_model("SmolLM2-135M-Instruct.Q4_1.gguf"), fetch_real_model("gemma-3-270m-q4_k_m.gguf")]


def tool(name: str) -> Path:
    exe = TOOLS / name
    if not exe.exists():
        subprocess.run(["bash", str(HERE / "build_llama_bench.sh")], check=True, stdout=subprocess.DEVNULL)
    return exe


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_localrun(model: Path, args, extra: tuple[str, ...] = ()) -> tuple[subprocess.Popen, str]:
    exe = shutil.which("localrun") or str(Path(sys.executable).with_name("localrun"))
    proc = subprocess.Popen(
        [exe, "serve", str(model), "--port", "0", "--parallel", str(SLOTS), "--threads", str(args.threads),
         "--ctx", str(args.ctx), "--gpu-layers", args.gpu_layers, *extra],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    for line in proc.stderr:
        m = re.search(r"(http://127\.0\.0\.1:\d+/v1)", line)
        if m:
            return proc, m.group(1)
    raise SystemExit(f"localrun serve did not start (exit {proc.wait()})")


def start_llama_server(model: Path, args, extra: tuple[str, ...] = ()) -> tuple[subprocess.Popen, str]:
    import httpx

    port = free_port()
    ngl = "99" if args.gpu_layers == "auto" else args.gpu_layers
    proc = subprocess.Popen(
        [str(tool("llama-server")), "-m", str(model), "--host", "127.0.0.1", "--port", str(port), "-np", str(SLOTS),
         "-c", str(args.ctx * SLOTS), "--no-kv-unified", "-t", str(args.threads), "-tb", str(args.threads),
         "-b", "512", "-ub", "512", "-ngl", ngl, "--no-webui", *extra],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"llama-server did not start (exit {proc.returncode})")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return proc, url + "/v1"
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    proc.kill()
    raise SystemExit("llama-server did not answer /health within 120 s")


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class Level:
    """One level of load on one of the running servers: `level(name, streams, requests, tokens)`."""

    def __init__(self, procs: dict, urls: dict, ids: dict, prompt: str, pause_idle: bool):
        self.procs, self.urls, self.ids, self.prompt, self.pause_idle = procs, urls, ids, prompt, pause_idle

    def __call__(self, name: str, c: int, requests: int, tokens: int) -> loadtest.Level:
        idle = [proc for n, proc in self.procs.items() if n != name] if self.pause_idle else []
        for proc in idle:  # --pause-idle: the other server stopped (SIGSTOP) while this one is measured
            proc.send_signal(signal.SIGSTOP)
        try:
            got = loadtest.run_level(self.urls[name], c, requests, prompt=self.prompt, max_tokens=tokens, api_key=None,
                                     model=self.ids[name])
        finally:
            for proc in idle:
                proc.send_signal(signal.SIGCONT)
        failed = [o.error for o in got.outcomes if not o.ok]
        if failed:
            raise SystemExit(f"{name}: {len(failed)} requests failed: {failed[0]}")
        return got


def compare_servers(model: Path, args, streams: list[int]) -> dict:
    prompt = loadtest.filler_prompt(24)
    names = ("localrun", "llama-server")
    starters = {"localrun": start_localrun, "llama-server": start_llama_server}
    speed: dict[str, dict[int, list[float]]] = {n: {c: [] for c in streams} for n in names}
    ttft: dict[str, dict[int, list[float]]] = {n: {c: [] for c in streams} for n in names}
    tpot: dict[str, list[float]] = {n: [] for n in names}
    first: dict[str, list[float]] = {n: [] for n in names}
    cold: dict[str, list[float]] = {n: [] for n in names}
    memory: dict[str, dict] = {}
    for rep in range(args.reps):
        # Both servers anew each round, the one started first alternating: of two processes of the same
        # server started one after the other, the first decoded 4-7% slower for as long as it ran (this
        # 2-core VM, Qwen2.5-1.5B, three such pairs), which a single start would count against one side.
        procs: dict[str, subprocess.Popen] = {}
        try:
            urls = {}
            for n in (names if rep % 2 == 0 else names[::-1]):
                procs[n], urls[n] = starters[n](model, args)
            ids = {n: loadtest.check_endpoint(u, None) for n, u in urls.items()}

            level = Level(procs, urls, ids, prompt, args.pause_idle)
            # TTFT of the very first request after start, then of fresh prompts (no prefix held by any slot)
            # once warm: the same prompt evaluated whole each time, so that the ratio shows only what warming
            # up costs.
            for n in names:
                first[n].append(fresh_ttft(urls[n], ids[n], f"first {rep}"))
            for n in names:
                level(n, SLOTS, SLOTS, 16)  # warm-up: every slot once
            for n in names:
                cold[n].append(statistics.median(fresh_ttft(urls[n], ids[n], f"again {rep} {i}") for i in range(3)))
            for c in streams:
                for n in (names if (rep + c) % 2 == 0 else names[::-1]):
                    got = level(n, c, 2 * c, args.tokens)
                    speed[n][c].append(got.throughput)
                    ttft[n][c] += [o.ttft_s for o in got.outcomes]
            for n in (names if rep % 2 == 0 else names[::-1]):
                tpot[n].append(server_tpot_ms(n, urls[n], ids[n], prompt, args.tokens))
            print(f"  {model.name} round {rep + 1} ({'localrun' if rep % 2 == 0 else 'llama-server'} started first): " + "; ".join(
                f"{c}: {speed['localrun'][c][-1]:.1f} vs {speed['llama-server'][c][-1]:.1f} t/s" for c in streams), file=sys.stderr)
            for n in names:  # the highest of the rounds
                now = memory_of(procs[n].pid)
                memory[n] = {k: max(filter(None, (v, memory.get(n, {}).get(k))), default=None) for k, v in now.items()}
        finally:
            for proc in procs.values():
                stop(proc)
    first_ttft = {n: statistics.median(v) for n, v in first.items()}
    fresh = {n: statistics.median(v) for n, v in cold.items()}
    rows = []
    for c in streams:
        ours, ref = statistics.median(speed["localrun"][c]), statistics.median(speed["llama-server"][c])
        # The ratio within each round (the two ran back to back), then its median: the machine's drift
        # between rounds cancels out, which a ratio of the two medians would not do.
        paired = statistics.median(a / b for a, b in zip(speed["localrun"][c], speed["llama-server"][c]))
        rows.append({
            "streams": c, "localrun_tps": round(ours, 1), "llama_server_tps": round(ref, 1), "ratio": round(paired, 3),
            "localrun_tps_all": [round(x, 1) for x in speed["localrun"][c]],
            "llama_server_tps_all": [round(x, 1) for x in speed["llama-server"][c]],
            **{f"{key}_ttft_p{p}_s": loadtest._pct(sorted(ttft[n][c]), p)
               for n, key in (("localrun", "localrun"), ("llama-server", "llama_server")) for p in (50, 95)},
        })
    return {"model": model.name, "rows": rows,
            "server_ms_per_token": {n: round(statistics.median(tpot[n]), 3) for n in names},
            "server_ms_per_token_ratio": round(statistics.median(a / b for a, b in zip(tpot["localrun"], tpot["llama-server"])), 3),
            "first_ttft_s": {n: round(first_ttft[n], 4) for n in names},
            "memory_mib": memory,
            "fresh_ttft_s": {n: round(fresh[n], 4) for n in names}}


def server_tpot_ms(name: str, url: str, model: str, prompt: str, tokens: int) -> float:
    """Milliseconds per generated token of one request not streamed, as the server itself times it
    (localrun: timings.tpot_s; llama-server: timings.predicted_per_token_ms): the decode loop alone,
    without the streaming, the client, or the network."""
    import httpx

    body = {"model": model, "prompt": prompt, "max_tokens": tokens, "temperature": 0, "ignore_eos": True}
    timings = httpx.post(url.rstrip("/") + "/completions", json=body, timeout=600).json()["timings"]
    return timings["tpot_s"] * 1000 if name == "localrun" else timings["predicted_per_token_ms"]


def memory_of(pid: int) -> dict[str, Optional[float]]:
    """A server's peak resident memory (VmHWM) and, on a GPU machine, its GPU memory as nvidia-smi reports
    it per process, in MiB, after a round ran (the highest of the rounds is reported)."""
    rss = None
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            rss = round(int(line.split()[1]) / 1024, 1)
    gpu = None
    if shutil.which("nvidia-smi"):
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True).stdout
        used = [float(m) for p, m in (line.split(",") for line in out.splitlines() if "," in line) if int(p) == pid]
        gpu = sum(used) if used else None
    return {"rss_peak": rss, "gpu": gpu}


def fresh_ttft(url: str, model: str, tag: str) -> float:
    """TTFT of one 16-token request whose prompt no slot holds (it starts with `tag`)."""
    import httpx

    body = {"model": model, "prompt": f"{tag}: " + loadtest.filler_prompt(24), "max_tokens": 16, "temperature": 0,
            "stream": True, "ignore_eos": True, "stream_options": {"include_usage": True}}
    with httpx.Client(timeout=httpx.Timeout(600, connect=10)) as client:
        outcome = loadtest.stream_once(client, url.rstrip("/") + "/completions", body, {})
    if not outcome.ok:
        raise SystemExit(f"{url}: {outcome.error}")
    return outcome.ttft_s


def print_comparison(result: dict) -> None:
    print(f"\n{result['model']}: localrun serve vs llama-server, {SLOTS} slots each (medians; ratio: median of the "
          "rounds' ratios; TTFT over every request)")
    print("| streams | localrun t/s | llama-server t/s | ratio | TTFT p50 ours / theirs | TTFT p95 ours / theirs |")
    print("|---:|---:|---:|---:|---:|---:|")
    for r in result["rows"]:
        print(f"| {r['streams']} | {r['localrun_tps']} | {r['llama_server_tps']} | **{r['ratio']:.2f}x** | "
              f"{r['localrun_ttft_p50_s'] * 1000:.0f} / {r['llama_server_ttft_p50_s'] * 1000:.0f} ms | "
              f"{r['localrun_ttft_p95_s'] * 1000:.0f} / {r['llama_server_ttft_p95_s'] * 1000:.0f} ms |")
    t = result["server_ms_per_token"]
    print(f"time per token inside each server (one request of --tokens at a time, not streamed; median of a request per "
          f"round): localrun {t['localrun']:.2f} ms, llama-server {t['llama-server']:.2f} ms "
          f"(ours / theirs {result['server_ms_per_token_ratio']:.3f})")
    mem = result["memory_mib"]
    for key, what in (("rss_peak", "peak resident memory"), ("gpu", "GPU memory (nvidia-smi)")):
        ours, theirs = mem["localrun"][key], mem["llama-server"][key]
        if ours is not None and theirs is not None:
            print(f"{what}: localrun {ours:.0f} MiB, llama-server {theirs:.0f} MiB (ours / theirs {ours / theirs:.2f})")
    f, s = result["first_ttft_s"], result["fresh_ttft_s"]
    print("first request after start vs a fresh prompt once warm (TTFT, whole prompt evaluated both times): " + ", ".join(
        f"{n} {f[n] * 1000:.0f} vs {s[n] * 1000:.0f} ms ({f[n] / s[n]:.2f}x)" for n in ("localrun", "llama-server")))


def batched_bench(model: Path, threads: int, tokens: int, prompt: int, gpu_layers: str) -> dict[int, float]:
    out = subprocess.run(
        [str(tool("llama-batched-bench")), "-m", str(model), "-c", "4096", "-b", "512", "-ub", "512", "-npp", str(prompt),
         "-ntg", str(tokens), "-npl", "1,8", "-t", str(threads), "-ngl", "99" if gpu_layers == "auto" else gpu_layers],
        capture_output=True, text=True, check=True,
    ).stdout
    speeds = {}
    for line in out.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 10 and cells[2].isdigit():
            speeds[int(cells[2])] = float(cells[7])  # S_TG t/s
    return speeds


def compare_batched(model: Path, args) -> None:
    """Ours over HTTP at 1 and 8 streams against llama-batched-bench's 1 and 8 sequences in one process."""
    proc, url = start_localrun(model, args)
    prompt = loadtest.filler_prompt(24)
    ours: dict[int, list[float]] = {1: [], 8: []}
    ref: dict[int, list[float]] = {1: [], 8: []}
    try:
        name = loadtest.check_endpoint(url, None)
        loadtest.run_level(url, 8, 8, prompt=prompt, max_tokens=16, api_key=None, model=name)  # warm-up
        for _ in range(args.reps):
            for c in (1, 8):
                ours[c].append(loadtest.run_level(url, c, c * 2, prompt=prompt, max_tokens=args.tokens, api_key=None, model=name).throughput)
            for c, s in batched_bench(model, args.threads, args.tokens, 32, args.gpu_layers).items():
                ref[c].append(s)
    finally:
        stop(proc)
    med = {k: statistics.median(v) for k, v in ours.items()}
    rmed = {k: statistics.median(v) for k, v in ref.items()}
    print(f"{model.name}: localrun serve 1 stream {med[1]:.1f} t/s, 8 streams {med[8]:.1f} t/s ({med[8] / med[1]:.2f}x); "
          f"llama-batched-bench 1 seq {rmed[1]:.1f}, 8 seqs {rmed[8]:.1f} ({rmed[8] / rmed[1]:.2f}x); "
          f"ours / llama.cpp: {med[1] / rmed[1]:.2f} and {med[8] / rmed[8]:.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--compare", choices=("llama-server", "llama-batched-bench"), default="llama-server")
    ap.add_argument("--model", type=Path, action="append")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--streams", default="1,8,16")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ctx", type=int, default=1024, help="tokens per slot")
    ap.add_argument("--gpu-layers", default="auto", help="N, auto (all, on a GPU build) or 0")
    ap.add_argument("--json", type=Path, help="write the results here too")
    ap.add_argument("--pause-idle", action="store_true",
                    help="stop the server not being measured (SIGSTOP) during each level: nothing of it can run beside")
    args = ap.parse_args()
    models = args.model or default_models()
    if args.compare == "llama-batched-bench":
        for m in models:
            compare_batched(m, args)
        return
    streams = sorted({int(s) for s in args.streams.split(",")})
    results = []
    for m in models:
        results.append(compare_servers(m, args, streams))
        print_comparison(results[-1])
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
