"""llama-server (built from the llama.cpp llama-cpp-python vendors, by scripts/build_llama_bench.sh) started on a free
loopback port for a test to ask the same thing of it as of localrun (`run`, `rerank`, `serve`), and stopped after:
the one place that starts it, waits for its /health and stops it, even when the test fails."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Optional

import httpx


def find_llama_server() -> Optional[Path]:
    from localrun.errors import LocalrunError
    from localrun.runtime.reports import bench

    try:
        server = bench.find_llama_bench().parent / "llama-server"  # scripts/build_llama_bench.sh builds both
    except LocalrunError:
        return None
    return server if server.is_file() else None


LLAMA_SERVER = find_llama_server()
NO_LLAMA_SERVER = "no llama-server: build it with scripts/build_llama_bench.sh"


@contextlib.contextmanager
def llama_server(model: Path, *args: str) -> Iterator[httpx.Client]:
    """llama-server on `model` with `args` (one thread, no warm-up), as an httpx client of it; stopped on leaving."""
    assert LLAMA_SERVER is not None
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([str(LLAMA_SERVER), "-m", str(model), "--port", str(port), "-t", "1", "--no-warmup", *args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=300) as http:
            deadline = time.monotonic() + 120
            while True:
                try:
                    if http.get("/health").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert time.monotonic() < deadline and proc.poll() is None, f"llama-server did not start: {' '.join(args)}"
                time.sleep(0.05)
            yield http
    finally:
        proc.terminate()
        proc.wait()
