"""A model split across machines with llama.cpp's RPC backend, on loopback: two `localrun worker` processes
started here, a client with --rpc. The split answers token for token as the model alone does; `show --rpc`
accounts for every layer; `doctor --rpc` reads each worker; a worker killed mid-answer is one line and exit 1
(in-process), or fails only that model on the background server; a closed port is an error, not a hang."""

from __future__ import annotations

import json
import signal
import socket
import subprocess

import pytest

from conftest import BACKGROUND_CLIENTS, LOCALRUN, last_json, run_cli, wait_until

pytestmark = pytest.mark.slow

PROMPT = "What is the capital of France?"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _reachable(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


class Workers:
    def __init__(self):
        self.procs: dict[str, subprocess.Popen] = {}

    def start(self) -> str:
        port = _free_port()
        proc = subprocess.Popen([LOCALRUN, "worker", "--port", str(port), "--threads", "1"], stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        endpoint = f"127.0.0.1:{port}"
        self.procs[endpoint] = proc
        wait_until(lambda: _reachable(port) or proc.poll() is not None, what=f"worker {endpoint} to listen", timeout=60)
        assert proc.poll() is None, proc.communicate()[1]
        return endpoint

    def kill(self, endpoint: str) -> None:
        self.procs[endpoint].kill()
        self.procs[endpoint].communicate()

    def stop_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
            proc.communicate()


@pytest.fixture
def workers():
    """Workers of this test's own, for a test that kills one."""
    pool = Workers()
    try:
        yield pool
    finally:
        pool.stop_all()


@pytest.fixture(scope="module")
def pair():
    """Two workers that the tests which only load a model on them, or only ask them what they are, share: a worker
    keeps nothing of a client after it disconnects (llama.cpp's rpc-server frees its buffers), and each start is a
    `localrun` process."""
    pool = Workers()
    try:
        yield pool.start(), pool.start()
    finally:
        pool.stop_all()


def answer(model, *extra: str, prompt: str = PROMPT, n: str = "24", env: dict | None = None):
    return run_cli("run", str(model), "-t", "0", "-n", n, "--threads", "1", "--no-cache", *extra, prompt, env=env)


@pytest.fixture(scope="module")
def alone():
    """alone(model, prompt): the model's answer in this process (`run --json`'s done event, 24 tokens) with the
    kernels the workers run, asked once for the module. A worker's CPU keeps plain buffers, and llama.cpp's
    repacked ones (AVX-512 here) round differently enough to turn a near-tie (gemma: "the French" / "the country"):
    LOCALRUN_REPACK=0 here too."""
    asked: dict[tuple, dict] = {}

    def of(model, prompt: str = PROMPT) -> dict:
        if (model, prompt) not in asked:
            r = answer(model, "--json", "--keep-alive", "0", prompt=prompt, env={"LOCALRUN_REPACK": "0"})
            assert r.returncode == 0, r.stderr
            asked[model, prompt] = last_json(r.stdout)
        return asked[model, prompt]

    return of


@pytest.mark.parametrize("which,layers,prompt", [("smollm2", "20", PROMPT), ("gemma", "10", "The capital of France is")])
def test_a_split_model_answers_token_for_token_as_alone(which, layers, prompt, request, pair, alone):
    model = request.getfixturevalue(which)
    one, two = pair
    # The first layers here, the rest over both workers (and, with all layers offloaded, none here).
    for extra in (["--gpu-layers", layers], []):
        split = answer(model, "--json", "--rpc", f"{one},{two}", *extra, prompt=prompt)
        assert split.returncode == 0, split.stderr
        assert last_json(split.stdout)["tokens"] == alone(model, prompt)["tokens"]
        assert last_json(split.stdout)["text"] == alone(model, prompt)["text"]

    # Where the layers go, before loading anything: every layer once, every byte of weights and KV.
    shown = run_cli("show", str(model), "--rpc", f"{one},{two}", "--gpu-layers", layers, "--json")
    assert shown.returncode == 0, shown.stderr
    details = json.loads(shown.stdout)
    rows = details["placement"]
    assert [r["device"] for r in rows] == ["CPU", f"RPC0[{one}]", f"RPC0[{two}]"]
    assert sum(r["n_layers"] for r in rows) == details["n_layer"] + 1  # the repeating layers and the output layer
    assert rows[0]["n_layers"] == details["n_layer"] + 1 - int(layers)
    assert rows[1]["n_layers"] > 0 and rows[2]["n_layers"] > 0
    assert sum(r["kv_bytes"] for r in rows) == details["memory_estimate"]["kv_bytes"]
    assert sum(r["weights_bytes"] for r in rows) >= details["memory_estimate"]["weights_bytes"]  # tied output weights count twice
    text = run_cli("show", str(model), "--rpc", f"{one},{two}", "--gpu-layers", layers)
    assert f"on RPC0[{two}]:" in text.stdout and "output" in text.stdout


def test_doctor_lists_workers_and_unreachable_ones_fail_fast(smollm2, pair):
    one = pair[0]
    closed = f"127.0.0.1:{_free_port()}"
    report = run_cli("doctor", "--json", "--rpc", f"{one},{closed}")
    assert report.returncode == 1
    listed = json.loads(report.stdout)["rpc_workers"]
    assert listed[0]["protocol"] == "7.0.0" and listed[0]["devices"][0]["total"] > 0
    assert "cannot reach the RPC worker at " + closed in listed[1]["error"]
    # A run naming a closed port: one line, exit 1, at once (the worker's address in it).
    r = answer(smollm2, "--rpc", closed)
    assert r.returncode == 1 and r.stderr.strip().splitlines() == [f"error: cannot reach the RPC worker at {closed}: "
                                                                     "connection refused (start `localrun worker` there, or check the address)"]
    for bad in ("nonsense", "host:99999", f"{one},{one}"):
        r = answer(smollm2, "--rpc", bad)
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "--rpc" in r.stderr, r.stderr
    r = answer(smollm2, "--rpc", one, "--tensor-split", "1,1")
    assert r.returncode == 2 and "--tensor-split has 2 proportions for 1 devices" in r.stderr


def _long_split(model, endpoint: str) -> subprocess.Popen:
    proc = subprocess.Popen([LOCALRUN, "run", str(model), "--raw", "-t", "0", "-n", "3000", "--min-tokens", "3000", "--ctx", "4096",
                             "--threads", "1", "--no-cache", "--rpc", endpoint, "Once upon a time"],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    BACKGROUND_CLIENTS.append(proc)
    return proc


def test_a_worker_lost_mid_answer_is_one_line(smollm2, workers):
    endpoint = workers.start()
    proc = _long_split(smollm2, endpoint)
    try:
        assert proc.stdout.read(20)  # streaming
        workers.kill(endpoint)
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1
    assert stderr.strip().splitlines() == [f"error: lost the RPC worker at {endpoint} during the answer (it stopped answering): "
                                           "restart it (`localrun worker`) and run again"]


def test_the_background_server_drops_only_the_model_whose_worker_was_lost(resident, smollm2, gemma, workers, alone):
    endpoint = workers.start()
    assert answer(gemma, n="2").returncode == 0  # another model, loaded without a worker
    there = answer(smollm2, "--json", "--rpc", endpoint)  # through the background server, split
    assert there.returncode == 0, there.stderr
    assert last_json(there.stdout)["tokens"] == alone(smollm2)["tokens"]  # as the model alone in a process
    assert last_json(there.stdout)["text"] == alone(smollm2)["text"]
    assert {m["name"] for m in json.loads(run_cli("ps", "--json").stdout)} == {smollm2.name, gemma.name}
    proc = _long_split(smollm2, endpoint)
    assert proc.stdout.read(20)
    workers.kill(endpoint)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 1 and len(stderr.strip().splitlines()) == 1
    assert f"lost the RPC worker at {endpoint}" in stderr and "Traceback" not in stderr
    # The server goes on with its other model; the dropped one is gone from ps.
    assert [m["name"] for m in json.loads(run_cli("ps", "--json").stdout)] == [gemma.name]
    assert answer(gemma, n="2").returncode == 0
    again = answer(smollm2, "--rpc", endpoint)
    assert again.returncode == 1 and "was lost while this process used it" in again.stderr


def test_worker_stops_on_ctrl_c_and_warns_off_loopback(tmp_path):
    port = _free_port()
    proc = subprocess.Popen([LOCALRUN, "worker", "--host", "0.0.0.0", "--port", str(port), "--threads", "1", "--cache", str(tmp_path / "c")],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: _reachable(port) or proc.poll() is not None, what="the worker to listen")
        busy = run_cli("worker", "--port", str(port))  # the port is taken: one line, exit 1
        assert busy.returncode == 1 and busy.stderr.strip().splitlines() == [
            f"error: cannot listen on 127.0.0.1:{port}: address already in use (another worker there? pick --port)"]
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130
    assert out == ""  # llama.cpp's banner goes to stderr
    assert "no authentication or encryption" in err and (tmp_path / "c").is_dir()
