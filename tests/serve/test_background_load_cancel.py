"""The background server (run/chat's): a client that asked it to load a model and went away (Ctrl-C) while
the model loaded leaves nothing behind: the model it loaded is released at once, not held for the
keep-alive (5m here) as if someone were about to use it."""

from __future__ import annotations

import os
import signal
import subprocess

import pytest

from conftest import BACKGROUND_CLIENTS, LOCALRUN, run_cli, wait_until

pytestmark = pytest.mark.slow


def _maps(pid: int, path) -> bool:
    """Whether process `pid` has the file mapped (llama.cpp maps a model's file at the start of its load)."""
    try:
        with open(f"/proc/{pid}/maps") as f:
            return str(path) in f.read()
    except OSError:
        return False


def _loaded() -> list[str]:
    from localrun.runtime.client import resident

    return [m["name"] for m in resident().get("/api/ps")["models"]]


def test_ctrl_c_during_a_load_releases_the_model_at_once(resident, smollm2, qwen):
    first = run_cli("run", str(smollm2), "--threads", "1", "-n", "1", "hi")  # starts the background server
    assert first.returncode == 0, first.stderr
    server = resident()
    # Qwen2.5-Coder 1.5B takes seconds to load (and repack): the client is interrupted in the middle of it
    proc = subprocess.Popen([LOCALRUN, "run", str(qwen), "--threads", "1", "-n", "1", "hi"], stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ))
    BACKGROUND_CLIENTS.append(proc)
    wait_until(lambda: _maps(server, qwen) or proc.poll() is not None, what="the server to start loading qwen")
    assert proc.poll() is None, proc.communicate()
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "Traceback" not in stderr
    # A load of another kind waits for qwen's to end (one load at a time); by then qwen was released with
    # no keep-alive, so the reaper unloads it within a second or so (held, it would stay for 5 minutes).
    again = run_cli("run", str(smollm2), "--threads", "1", "--ctx", "512", "-n", "1", "hi")
    assert again.returncode == 0, again.stderr
    wait_until(lambda: qwen.name not in _loaded(), timeout=30, what="qwen to be unloaded")
    assert smollm2.name in _loaded()
