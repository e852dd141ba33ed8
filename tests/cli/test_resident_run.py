"""`localrun run` through the resident server: started in the background on first use (one line says so),
reached over a 0600 Unix socket, answering exactly as a run in-process does (stdout, --json, --verbose,
exit codes, sessions), and robust to what happens to servers: Ctrl-C, a closed pipe, kill -9, a stale
socket, two clients racing to start one, a server of another build, an idle server exiting by itself."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import threading

import pytest

from conftest import BACKGROUND_CLIENTS, CORES, LOCALRUN, _alive, _servers, last_json, run_cli, wait_until
from one_process import run_all

pytestmark = pytest.mark.slow

PROMPT = "What is the capital of France?"


def run(*args: str, keep_alive: str | None = None, **kw):
    env = {"LOCALRUN_KEEP_ALIVE": keep_alive} if keep_alive is not None else None
    return run_cli("run", *args, env=env, **kw)


def test_run_through_the_server_answers_as_in_process(resident, smollm2, gemma, isolated_home):
    args = [str(smollm2), "-t", "0", "-n", "24", "--threads", "1", "--no-cache", PROMPT]
    prompts = ["Name a fruit.", "Name a colour.", "Name a planet.", "Name an ocean."]
    gargs = [str(gemma), "-t", "0", "-n", "16", "--threads", "1", "--no-cache", "The capital of France is"]
    # In-process, all in one process: this prompt plain and as --json, each of the four prompts below, and gemma's.
    done = run_all(*[["run", *a] for a in (args, [*args, "--json"], *[
        [str(smollm2), "-t", "0", "-n", "12", "--threads", "1", "--no-cache", p] for p in prompts], gargs)],
        home=isolated_home, env={"LOCALRUN_KEEP_ALIVE": "0"})
    assert [r.returncode for r in done] == [0] * len(done), [r.stderr for r in done]
    here, in_proc, *expected, g_here = [r.stdout for r in done]
    g_here_err = done[-1].stderr
    first = run(*args)
    assert first.returncode == 0, first.stderr
    assert first.stdout == here
    assert first.stderr.count("started a localrun server in the background") == 1
    assert "localrun stop --server" in first.stderr
    server = resident()
    # The socket is the user's only: 0600 in a 0700 folder, and no TCP port.
    from localrun.store.paths import server_socket

    sock = server_socket()
    assert stat.S_IMODE(sock.stat().st_mode) == 0o600 and stat.S_IMODE(sock.parent.stat().st_mode) == 0o700
    import psutil

    assert not [c for c in psutil.Process(server).net_connections(kind="inet") if c.status == psutil.CONN_LISTEN]

    # The second run: the same server (no notice), the model already loaded (load duration 0), same events.
    again = run(*args, "--json", "--verbose")
    assert again.returncode == 0 and "started a localrun server" not in again.stderr
    events, reference = [json.loads(line) for line in again.stdout.splitlines()], [json.loads(line) for line in in_proc.splitlines()]
    assert [e["type"] for e in events] == [e["type"] for e in reference]
    assert events[-1]["text"] == reference[-1]["text"] and events[-1]["tokens"] == reference[-1]["tokens"]
    assert events[-1]["stats"]["load_s"] == 0 and reference[-1]["stats"]["load_s"] > 0
    assert "load duration:          0.0 ms" in again.stderr
    assert resident() == server
    # --threads as many as it takes by default, then no --threads: the same load, not reloaded for it (it was:
    # "reloading ...: threads N -> None", found by a helper).
    assert run(*args[:-1], "--threads", str(CORES), "-n", "1", PROMPT).returncode == 0
    same = run(str(smollm2), "-t", "0", "-n", "1", "--no-cache", "--json", PROMPT)
    assert same.returncode == 0 and last_json(same.stdout)["stats"]["load_s"] == 0, same.stderr
    # The client of a run through the server loads neither llama.cpp nor the engine, pydantic or the catalogue:
    # half of its start (0.33 s of CPU), and all of it before the request goes out.
    light = subprocess.run([sys.executable, "-X", "importtime", "-m", "localrun.cli.main", "run", *args], capture_output=True,
                           text=True, stdin=subprocess.DEVNULL, timeout=300)
    assert light.returncode == 0 and light.stdout == first.stdout, light.stderr[-2000:]
    imported = {line.rsplit("|", 1)[-1].strip() for line in light.stderr.splitlines() if line.startswith("import time:")}
    heavy = {"llama_cpp", "llama_cpp.llama_cpp", "localrun.engine.model", "localrun.engine.sampling", "pydantic", "yaml",
             "localrun.hub.catalogue", "numpy"}
    assert "localrun.runtime.client" in imported and not heavy & imported, heavy & imported

    # A base model with no chat template: the same notice and answer as in-process.
    g_there = run(*gargs)
    assert g_there.returncode == 0 and g_there.stdout == g_here
    assert "no chat template" in g_there.stderr and "no chat template" in g_here_err
    listed = json.loads(run_cli("ps", "--json").stdout)
    assert {m["name"] for m in listed} == {smollm2.name, gemma.name}
    assert all(m["slots"] == 4 and m["processor"] == "100% CPU" for m in listed)  # the server's --parallel

    # Four clients at once, each with its own prompt, decoded side by side in the slots' shared KV pool (where a
    # near-tie may turn, as in llama-server's); each prompt alone afterwards answers as in-process, whatever the
    # other slots kept.
    got: list = [None] * 4
    threads = [threading.Thread(target=lambda i=i: got.__setitem__(i, run(
        str(smollm2), "-t", "0", "-n", "12", "--threads", "1", "--no-cache", "--json", prompts[i]))) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert [g.returncode for g in got] == [0] * 4, [g.stderr for g in got]
    done = [last_json(g.stdout) for g in got]
    assert all(d["tokens"] and d["stats"]["finish_reason"] in ("length", "stop", "eos") for d in done), done
    alone = [run(str(smollm2), "-t", "0", "-n", "12", "--threads", "1", "--no-cache", p).stdout for p in prompts]
    assert alone == expected


def test_errors_read_the_same_as_in_process(resident, smollm2, tmp_path):
    long_prompt = "word " * 3000
    cases = [
        [str(smollm2), "--ctx", "512", "--threads", "1", long_prompt],  # does not fit: exit 1
        [str(smollm2), "--threads", "1", "--grammar", str(tmp_path / "missing.gbnf"), "hi"],  # exit 2, before any request
        [str(smollm2), "--threads", "1", "--logit-bias", "999999=1", "hi"],  # a token out of range: exit 2
        ["no-such-model-alias", "hi"],
        [str(tmp_path / "missing.gguf"), "hi"],
        [str(tmp_path / "corrupt.gguf"), "hi"],  # fails to load: that request only
        [str(smollm2), "--threads", "100000", "hi"],  # refused before llama.cpp starts that many threads
    ]
    (tmp_path / "corrupt.gguf").write_bytes(b"GGUF" + b"\x03\x00\x00\x00" + b"\xff" * 64)
    for args in cases:
        there, here = run(*args), run(*args, keep_alive="0")
        assert (there.returncode, there.stdout) == (here.returncode, here.stdout), (args, there.stderr, here.stderr)
        assert there.returncode != 0
        assert there.stderr.strip().splitlines()[-1] == here.stderr.strip().splitlines()[-1], args
        assert "Traceback" not in there.stderr
    assert run(str(smollm2), "--threads", "1", "-n", "2", "hi").returncode == 0  # the server went on
    # A load the server's memory cannot hold (a batch's compute buffers; a context past the model's trained length
    # is capped to it): one line, exit 1, and the loaded model is kept (no second try here).
    big = run(str(smollm2), "--threads", "1", "--batch", "100000000", "hi")
    assert big.returncode == 1 and len(big.stderr.strip().splitlines()) == 1 and "needs about" in big.stderr
    assert [m["name"] for m in json.loads(run_cli("ps", "--json").stdout)] == [smollm2.name]


def test_sessions_are_kept_by_the_server_and_read_the_same_in_process(resident, smollm2):
    args = [str(smollm2), "-t", "0", "-n", "16", "--threads", "1", "--session", "trip", "--json"]
    first = run(*args, "My name is Ada. Remember it.")
    assert first.returncode == 0, first.stderr
    second = run(*args, "What is my name?")
    done = last_json(second.stdout)
    assert done["stats"]["cached_tokens"] > 20  # the first turn's state was reused, not prefilled again
    # The store on disk has both turns: an in-process run resumes it as it would its own.
    third_here = run(*args, "And my name again?", keep_alive="0")
    assert third_here.returncode == 0, third_here.stderr
    assert last_json(third_here.stdout)["stats"]["cached_tokens"] > 40
    shown = json.loads(run_cli("sessions", "show", "trip", "--json").stdout)
    assert len([m for m in shown["messages"] if m["role"] == "user"]) == 3


# The load of a long run (a context for its 3,000 tokens): the run that starts the server loads the model so, so
# that the long run does not load it again for another context.
LONG_LOAD = ("--ctx", "4096", "--threads", "1")


def _long_run(model, *extra) -> subprocess.Popen:
    return _client(
        [LOCALRUN, "run", str(model), "--raw", "-t", "0", "-n", "3000", "--min-tokens", "3000", *LONG_LOAD,
         "--no-cache", *extra, "Once upon a time"],
    )


def _client(args: list[str], env: dict | None = None) -> subprocess.Popen:
    proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **(env or {})})
    BACKGROUND_CLIENTS.append(proc)
    return proc


def _busy_slots() -> int:
    from localrun.runtime.client import resident

    return sum(m["slots_busy"] for m in resident().get("/api/ps")["models"])


def test_ctrl_c_and_a_closed_pipe_free_the_server_at_once(resident, smollm2):
    assert run(str(smollm2), *LONG_LOAD, "-n", "1", "hi").returncode == 0  # started and loaded as the long run loads it
    proc = _long_run(smollm2)
    proc.stdout.read(20)  # it is streaming
    assert _busy_slots() == 1
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "Traceback" not in stderr
    wait_until(lambda: _busy_slots() == 0, what="the cancelled request to leave its slot")
    piped = subprocess.run(f"'{LOCALRUN}' run '{smollm2}' --raw -t 0 -n 3000 --min-tokens 3000 --threads 1 --no-cache 'Once upon a time' | head -c 10",
                           shell=True, capture_output=True, text=True, timeout=120, executable="/bin/bash")
    assert len(piped.stdout) == 10 and "Traceback" not in piped.stderr
    wait_until(lambda: _busy_slots() == 0, what="the closed pipe's request to leave its slot")


def test_runs_of_one_model_share_its_slots(resident, smollm2, gemma):
    """Two runs of the same model at once decode side by side, each in its own slot (not in turn); a
    session saved from a slot resumes in-process and back, for a sliding-window model too."""
    assert run(str(smollm2), *LONG_LOAD, "-n", "1", "hi").returncode == 0
    procs = [_long_run(smollm2), _long_run(smollm2)]
    try:
        for proc in procs:
            proc.stdout.read(20)  # both are streaming, neither waits for the other
        assert _busy_slots() == 2
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGINT)
        for proc in procs:
            proc.communicate(timeout=60)
    assert [p.returncode for p in procs] == [130, 130]
    wait_until(lambda: _busy_slots() == 0, what="both requests to leave their slots")

    # gemma-3 (sliding-window layers) saved from a slot keeps its whole history, so a resumed session reuses
    # it even where its last answer is cut back a little: from disk into another slot, in-process, and back.
    args = [str(gemma), "-t", "0", "-n", "12", "--threads", "1", "--session", "story", "--json"]
    first = run(*args, "Once upon a time " * 200)  # past the 512-token window
    assert first.returncode == 0, first.stderr
    for other in ("Red.", "Blue.", "Green.", "Gold."):  # every slot now holds something else
        assert run(str(gemma), "-n", "1", "--threads", "1", "--no-cache", other).returncode == 0
    for keep_alive in (None, "0", None):  # from disk into a slot, in-process, and back on the server
        again = run(*args, "and then", keep_alive=keep_alive)
        assert again.returncode == 0, again.stderr
        assert last_json(again.stdout)["stats"]["cached_tokens"] > 700


def test_a_run_waits_for_a_free_slot_and_says_so(resident, smollm2):
    assert run(str(smollm2), *LONG_LOAD, "-n", "1", "hi").returncode == 0
    busy = [_long_run(smollm2) for _ in range(4)]  # the server's 4 slots
    try:
        for proc in busy:
            proc.stdout.read(20)
        assert _busy_slots() == 4
        fifth = _client([LOCALRUN, "run", str(smollm2), "--threads", "1", "--ctx", "4096", "-n", "4", "--no-cache", "Name a fruit."])
        first_line: list = []
        reader = threading.Thread(target=lambda: first_line.append(fifth.stderr.readline()), daemon=True)
        reader.start()
        reader.join(timeout=60)
        assert first_line and "every slot of " + smollm2.name + " on the server is busy: waiting for one" in first_line[0]
        busy[0].send_signal(signal.SIGINT)  # a slot comes free: the waiting run takes it
        out, err = fifth.communicate(timeout=120)
        assert fifth.returncode == 0 and out.strip(), err
    finally:
        for proc in busy:
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
        for proc in busy:
            proc.communicate(timeout=60)
    wait_until(lambda: _busy_slots() == 0, what="every request to leave its slot")


def test_server_stopped_mid_answer_is_an_error_not_a_short_answer(resident, smollm2):
    assert run(str(smollm2), *LONG_LOAD, "-n", "1", "hi").returncode == 0
    proc = _long_run(smollm2)
    try:
        proc.stdout.read(20)
        assert run_cli("stop", "--server").returncode == 0
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1 and "the localrun server was stopped during the answer" in stderr, stderr
    assert run(str(smollm2), "--threads", "1", "-n", "1", "hi").returncode == 0  # a new one starts


def test_server_killed_mid_answer_then_a_new_one(resident, smollm2):
    assert run(str(smollm2), *LONG_LOAD, "-n", "1", "--session", "kept", "hi").returncode == 0
    victim = resident()
    proc = _long_run(smollm2)
    proc.stdout.read(20)
    os.kill(victim, signal.SIGKILL)
    out, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 1, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and "the localrun server stopped in the middle of the answer" in lines[0]
    wait_until(lambda: not _alive(victim), what="the killed server to be gone")
    # The socket it left is stale: the next run replaces it with a new server; the store is intact.
    after = run(str(smollm2), "--threads", "1", "-n", "4", "--session", "kept", "and again")
    assert after.returncode == 0, after.stderr
    assert resident() != victim
    assert json.loads(run_cli("sessions", "show", "kept", "--json").stdout)["messages"][-1]["role"] == "assistant"


def test_two_clients_racing_start_one_server(resident, smollm2):
    results: list = [None, None]
    threads = [threading.Thread(target=lambda i=i: results.__setitem__(i, run(str(smollm2), "-t", "0", "-n", "8", "--threads", "1", "--no-cache", PROMPT)))
               for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert [r.returncode for r in results] == [0, 0] and results[0].stdout == results[1].stdout
    servers = _servers()
    assert len(servers) == 1 and servers[0].pid == resident()


def test_a_server_of_another_build_is_not_used(resident, smollm2):
    other = {"LOCALRUN_BUILD_TAG": "other"}
    assert run_cli("run", str(smollm2), "--threads", "1", "-n", "1", "hi", env=other).returncode == 0
    old = resident()
    # Busy: left alone, and this run answers in-process with a notice.
    proc = _client([LOCALRUN, "run", str(smollm2), "--raw", "-t", "0", "-n", "3000", "--min-tokens", "3000", "--threads", "1",
                    "--no-cache", "Once"], env=other)
    try:
        proc.stdout.read(10)
        here = run(str(smollm2), "--threads", "1", "-n", "4", "-t", "0", "--no-cache", PROMPT)
        assert here.returncode == 0 and "another localrun build" in here.stderr and "answering in this process" in here.stderr
        assert resident() == old
    finally:
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=60)
    # Idle (the same server, its answer cancelled): it is replaced by a server of this build, which answers as
    # this process did.
    wait_until(lambda: _busy_slots() == 0, what="the cancelled request to leave its slot")
    mine = run(str(smollm2), "--threads", "1", "-n", "4", "-t", "0", "--no-cache", PROMPT)
    assert mine.returncode == 0, mine.stderr
    assert "another localrun build" not in mine.stderr
    wait_until(lambda: not _alive(old), what="the other build's server to exit")
    assert resident() != old
    assert here.stdout == mine.stdout


def test_an_idle_server_exits_on_its_own(resident, smollm2, monkeypatch):
    monkeypatch.setenv("LOCALRUN_SERVER_IDLE_S", "0.5")
    assert run(str(smollm2), "--threads", "1", "-n", "1", "hi", keep_alive="2s").returncode == 0
    server = resident()
    from localrun.runtime.client import resident as client

    assert len(client().get("/api/ps")["models"]) == 1  # loaded (asked at once: no command's start in the 2 s)
    wait_until(lambda: not _alive(server), what="the idle server to exit (keep-alive 2s, then 0.5s idle)", timeout=30)
    from localrun.store.paths import server_socket

    assert not server_socket().exists()  # it removed its socket
    listed = run_cli("ps", "--json")
    assert listed.returncode == 0 and json.loads(listed.stdout) == []
