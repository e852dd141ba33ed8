"""Throughput of `hub.pull` on loopback, against a plain HTTP download of the same file from the same server.

    .venv/bin/python scripts/bench_pull.py [--mb 200] [--repeat 3] [--progress]

Serves a synthetic file from the test Hub stand-in (tests/hubstub.py) on 127.0.0.1, then times, each on a fresh
cache: (a) a bare streamed GET written to disk (the reference: server + loopback + disk), (b) sha256 of the file
alone, (c) `hub.pull` end to end (listing, HEAD, GET into a partial file in the Hub cache, sha256 verification,
fsync, rename to the blob, registry).
Prints medians in MB/s (10^6 bytes) and pull's ratio to the reference. Not a test: numbers depend on the machine.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT / "tests"))

from hubstub import HubStub, random_bytes  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=200, help="file size in MB (default 200)")
    parser.add_argument("--repeat", type=int, default=5, help="runs per measurement (default 5)")
    parser.add_argument("--progress", action="store_true", help="draw the progress bar during pull (on stderr)")
    args = parser.parse_args()

    size = args.mb * 1_000_000
    data = random_bytes(size, seed=42)
    work = Path(tempfile.mkdtemp(prefix="bench-pull-"))
    try:
        with HubStub() as stub:
            repo = stub.add_repo("bench/Bench-GGUF", {"bench.Q4_0.gguf": data})
            repo.files["bench.Q4_0.gguf"].sha256  # noqa: B018 - the stub hashes once, outside the timings
            # huggingface_hub reads these at import: set them before localrun.hub imports it.
            os.environ.update(
                HF_ENDPOINT=stub.url,
                HF_HOME=str(work / "hf"),
                LOCALRUN_HOME=str(work / "home"),
                HF_HUB_DISABLE_TELEMETRY="1",
            )
            for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HUB_OFFLINE", "HF_TOKEN"):
                os.environ.pop(name, None)
            from localrun import hub

            # Interleaved, so that whatever else the machine is doing weighs on all three alike.
            reference, hashing, pulls = [], [], []
            for _ in range(args.repeat):
                reference.append(_plain_get(f"{stub.url}/bench/Bench-GGUF/resolve/main/bench.Q4_0.gguf", work / "plain.bin"))
                hashing.append(_timed(lambda: hub._hash_file(work / "plain.bin")))
                shutil.rmtree(work / "hf", ignore_errors=True)
                shutil.rmtree(work / "home", ignore_errors=True)
                pulls.append(_timed(lambda: hub.pull("bench/Bench-GGUF:Q4_0", progress=args.progress)))
            model = hub.resolve_local("bench/Bench-GGUF:Q4_0")
            assert model.size == size, "pulled file has the wrong size"
    finally:
        shutil.rmtree(work, ignore_errors=True)

    def rate(seconds: list[float]) -> str:
        med = statistics.median(seconds)
        return f"{size / med / 1e6:8.0f} MB/s  (median {med:.3f} s of {len(seconds)}; min {min(seconds):.3f} s)"

    print(f"file: {args.mb} MB, loopback, {args.repeat} runs each")
    print(f"plain GET to disk (reference): {rate(reference)}")
    print(f"sha256 of the file alone:      {rate(hashing)}")
    print(f"hub.pull end to end:           {rate(pulls)}")
    print(f"pull / reference:              {statistics.median(reference) / statistics.median(pulls):8.2f}x")


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _plain_get(url: str, dest: Path) -> float:
    import httpx2

    dest.unlink(missing_ok=True)  # a new file each time, as a pull writes
    start = time.perf_counter()
    with httpx2.stream("GET", url, timeout=60) as response, open(dest, "wb") as out:
        response.raise_for_status()
        for chunk in response.iter_bytes(chunk_size=10 * 1024 * 1024):
            out.write(chunk)
    return time.perf_counter() - start


if __name__ == "__main__":
    main()
