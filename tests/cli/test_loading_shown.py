"""A model the background server is loading is listed by `ps`, with how far llama.cpp has read it (ps said "no
model is loaded" for the seconds Qwen2.5-Coder-1.5B took, while the server grew to 3.7 GB), and a run that waited
for that load reports the wait as its load duration (it reported 0.0 ms). The installed command, the real server,
the real-size model (its load lasts long enough to be seen)."""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from conftest import BACKGROUND_CLIENTS, LOCALRUN, last_json, run_cli

pytestmark = pytest.mark.slow


def _models() -> list[dict]:
    """What the background server lists, loads under way included; nothing while none answers yet (the run that
    starts it, then asks it for its model, is starting it)."""
    from localrun.runtime.client import NoServer, resident as server

    try:
        return server().get("/api/ps")["models"]
    except NoServer:
        return []


def test_a_load_is_listed_and_a_run_waiting_for_it_says_so(resident, qwen):
    first = subprocess.Popen([LOCALRUN, "run", str(qwen), "-t", "0", "-n", "2", "--threads", "1", "--ctx", "1024", "Hi"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
    BACKGROUND_CLIENTS.append(first)
    loading = None
    deadline = time.monotonic() + 120
    while loading is None and time.monotonic() < deadline and first.poll() is None:
        loading = next((m for m in _models() if m.get("loading")), None)
        time.sleep(0.02)
    assert loading is not None, "the load was never listed"
    assert loading["name"] == qwen.name and 0 <= loading["loading"]["progress"] <= 1 and loading["size"] > 1 << 30
    waited = run_cli("run", str(qwen), "-t", "0", "-n", "2", "--threads", "1", "--ctx", "1024", "--json", "Hello")
    assert waited.returncode == 0, waited.stderr
    assert last_json(waited.stdout)["stats"]["load_s"] > 0  # it waited for the load another run started
    assert first.wait(timeout=300) == 0
    (model,) = json.loads(run_cli("ps", "--json").stdout)
    assert "loading" not in model and model["name"] == qwen.name


def test_ps_shows_a_loading_row():
    """The table's row for a load under way (its fields as /api/ps gives them)."""
    import io
    import sys

    from localrun.cli import render

    row = {"name": "big.gguf", "size": 3 << 30, "processor": "100% CPU", "threads": 2, "context_length": None, "slots": 4,
           "slots_busy": 0, "requests": 1, "expires_at": None, "keep_alive": None, "memory": {"total_bytes": 3 << 30},
           "loading": {"progress": 0.42, "seconds": 1.3}}
    out, sys.stdout = sys.stdout, io.StringIO()
    try:
        render.loaded_models([row], as_json=False)
        table = sys.stdout.getvalue()
    finally:
        sys.stdout = out
    assert "loading 42% (1 s)" in table and "big.gguf" in table


def test_a_load_left_by_ctrl_c_stays_for_its_keep_alive(resident, qwen):
    """A run stopped by Ctrl-C while its model loads: the load finishes and the model stays for its keep-alive (as
    Ollama keeps it), instead of being thrown away and loaded again by the next run."""
    import signal

    from localrun.runtime.client import resident as server

    left = subprocess.Popen([LOCALRUN, "run", str(qwen), "-t", "0", "-n", "2", "--threads", "1", "--ctx", "1024", "Hi"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
    BACKGROUND_CLIENTS.append(left)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not any(m.get("loading") for m in _models()):
        time.sleep(0.02)
    left.send_signal(signal.SIGINT)
    assert left.wait(timeout=60) == 130
    deadline = time.monotonic() + 120
    models: list = []
    while time.monotonic() < deadline:
        models = server().get("/api/ps")["models"]
        if models and not models[0].get("loading"):
            break
        time.sleep(0.1)
    assert [m["name"] for m in models] == [qwen.name] and not models[0].get("loading"), models
    time.sleep(1.0)  # (a load given up at once would be gone by now: its release came right after the load)
    assert [m["name"] for m in server().get("/api/ps")["models"]] == [qwen.name]
