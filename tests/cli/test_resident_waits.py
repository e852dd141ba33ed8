"""The client of the background server waits for work, not for a clock, and asks nothing of the server that a
bad flag would spoil: a server that says nothing for longer than any fixed timeout (a long prompt evaluated
before the first token, simulated by stopping the process with SIGSTOP) is waited for with one line on stderr
saying what for; a bad --ctx is refused before the server is asked (it used to unload the model the server
held); `rm` of a model the server holds unloads it there, as Ollama's does."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor

import pytest

from conftest import BACKGROUND_CLIENTS, LOCALRUN, _alive, assert_exited, run_cli, wait_until
from hubstub import StubFile, hub_stub  # noqa: F401 - hub_stub is a fixture

pytestmark = pytest.mark.slow

# The socket client used to give every read of the answer 30 s: a silence past that was taken for a dead server.
PAST_THE_OLD_TIMEOUT_S = 32


def _client(args: list[str]) -> subprocess.Popen:
    proc = subprocess.Popen([LOCALRUN, *args], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    BACKGROUND_CLIENTS.append(proc)
    return proc


def _busy_slots() -> int:
    from localrun.runtime.client import resident

    return sum(m["slots_busy"] for m in resident().get("/api/ps")["models"])


def _loaded() -> list[str]:
    return [m["name"] for m in json.loads(run_cli("ps", "--json").stdout)]


# The silence test's server is stopped for 32 s, in which its core would idle: its story runs on a thread from the
# module's start, against a server of its own (a LOCALRUN_HOME of its own, every process given it explicitly, as
# the other tests change the environment's), while the other tests of the module run; the test waits for it.
SILENCE_TEST = "test_a_server_silent_past_any_timeout_is_waited_for"


@pytest.fixture(scope="module", autouse=True)
def silence(request, tmp_path_factory, smollm2):
    """The silence test's story under way (a Future), or None where that test is not to run here."""
    if not any(item.name == SILENCE_TEST and item.module is request.module for item in request.session.items):
        yield None
        return
    from localrun.runtime.client import Client, NoServer
    from localrun.store.paths import server_socket

    home = tmp_path_factory.mktemp("silence")
    env = {**os.environ, "LOCALRUN_HOME": str(home / "localrun-home"), "HF_HOME": str(home / "hf-home"), "LOCALRUN_KEEP_ALIVE": "5m"}
    for name in ("LOCALRUN_MODELS", "LOCALRUN_DEBUG"):
        env.pop(name, None)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("LOCALRUN_HOME", env["LOCALRUN_HOME"])
        server = Client(socket_path=server_socket())
    clients: list[subprocess.Popen] = []
    pids: list[int] = []
    pool = ThreadPoolExecutor(1)
    story = pool.submit(_silent_server_story, smollm2, env, server, clients, pids)
    try:
        yield story
    finally:
        try:
            story.result(timeout=600)
        except BaseException:  # the test reported it (or was not reached): what is left is stopped below
            pass
        pool.shutdown()
        for pid in pids:  # (where the story failed while its server was stopped)
            if _alive(pid):
                os.kill(pid, signal.SIGCONT)
        try:
            pids.append(server.get("/api/version")["pid"])
        except NoServer:
            pass
        for proc in clients:
            if proc.poll() is None:
                proc.kill()
            proc.communicate()
        subprocess.run([LOCALRUN, "stop", "--server"], env=env, stdin=subprocess.DEVNULL, capture_output=True, timeout=120)
        assert_exited(pids)


def _silent_server_story(smollm2, env: dict, server, clients: list[subprocess.Popen], pids: list[int]) -> None:
    """Two clients of one server stopped for longer than the old 30 s: one in the middle of its answer, one
    still waiting for its first token (a long prompt on a slow CPU), which says in one line what it awaits."""
    def client(*args: str) -> subprocess.Popen:
        proc = subprocess.Popen([LOCALRUN, *args], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, env=env)
        clients.append(proc)
        return proc

    def ps() -> list[dict]:
        return json.loads(subprocess.run([LOCALRUN, "ps", "--json"], env=env, stdin=subprocess.DEVNULL, capture_output=True,
                                         text=True, timeout=300).stdout)

    started = subprocess.run([LOCALRUN, "run", str(smollm2), "--threads", "1", "-n", "1", "hi"], env=env,
                             stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300)
    assert started.returncode == 0, started.stderr  # started and loaded
    pid = server.get("/api/version")["pid"]
    pids.append(pid)

    streaming = client("run", str(smollm2), "--raw", "--threads", "1", "-t", "0", "-n", "400", "--min-tokens", "400",
                       "--no-cache", "Once upon a time")
    streaming.stdout.read(20)  # it is streaming
    long_prompt = "Summarise this text. " + "The quick brown fox jumps over the lazy dog. " * 30  # seconds of evaluation
    waiting = client("run", str(smollm2), "--threads", "1", "-t", "0", "-n", "8", "--no-cache", long_prompt)
    wait_until(lambda: sum(m["slots_busy"] for m in server.get("/api/ps")["models"]) == 2,
               what="the second request to reach the server")
    os.kill(pid, signal.SIGSTOP)
    stopped = time.monotonic()
    try:
        said: list[str] = []
        reader = threading.Thread(target=lambda: said.append(waiting.stderr.readline()), daemon=True)
        reader.start()
        reader.join(timeout=60)
        time.sleep(max(0.0, PAST_THE_OLD_TIMEOUT_S - (time.monotonic() - stopped)))
    finally:
        os.kill(pid, signal.SIGCONT)
    assert said and "waiting for " in said[0] and "Ctrl-C stops" in said[0], said
    out, err = waiting.communicate(timeout=300)
    assert waiting.returncode == 0 and out.strip(), err
    # Silent in the middle of the answer: still the whole answer, exit 0.
    out, err = streaming.communicate(timeout=300)
    assert streaming.returncode == 0 and len(out) > 400, err
    assert "stopped in the middle" not in err and "Traceback" not in err
    assert ps()[0]["slots_busy"] == 0
    assert server.get("/api/version")["pid"] == pid  # one server throughout


def test_a_gone_server_is_still_reported_at_once(resident, smollm2):
    """No timeout on the answer: a server killed while the client waits for the first token ends the wait."""
    assert run_cli("run", str(smollm2), "--threads", "1", "-n", "1", "hi").returncode == 0
    server = resident()
    long_prompt = "Summarise this text. " + "The quick brown fox jumps over the lazy dog. " * 30  # seconds of evaluation
    proc = _client(["run", str(smollm2), "--threads", "1", "-t", "0", "-n", "8", "--no-cache", long_prompt])
    wait_until(lambda: _busy_slots() == 1, what="the request to reach the server")
    os.kill(server, signal.SIGSTOP)  # before its first token, whatever the machine's speed
    os.kill(server, signal.SIGKILL)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1 and "the localrun server stopped in the middle of the answer" in err, err
    assert len(err.strip().splitlines()) == 1


def test_a_bad_ctx_is_refused_before_the_server_is_asked(resident, smollm2):
    """--ctx 0 reloaded the model the server held (then failed); --ctx 10 passed there (4 slots: 40 tokens).
    Both against the one server, which holds the model loaded throughout."""
    assert run_cli("run", str(smollm2), "--threads", "1", "-n", "1", "hi").returncode == 0
    assert _loaded() == [smollm2.name]
    server = resident()
    for ctx in ("0", "10"):
        r = run_cli("run", str(smollm2), "--threads", "1", "-n", "1", "--ctx", ctx, "hi")
        assert r.returncode == 2 and r.stdout == ""
        assert r.stderr.strip() == f"error: invalid --ctx {ctx}: the context must hold at least 16 tokens", r.stderr
        assert _loaded() == [smollm2.name]  # still there, never reloaded
        chat = run_cli("chat", str(smollm2), "--ctx", ctx, input="hi\n")
        assert chat.returncode == 2 and f"invalid --ctx {ctx}" in chat.stderr
        assert _loaded() == [smollm2.name]
    assert resident() == server


def test_rm_unloads_the_model_from_the_server(resident, hub_stub, smollm2):  # noqa: F811
    hub_stub.stub.add_repo("test/SmolLM2-GGUF", [StubFile(smollm2.name, smollm2.read_bytes())])
    ref = "test/SmolLM2-GGUF:Q4_1"
    assert run_cli("pull", ref).returncode == 0
    ran = run_cli("run", ref, "--threads", "1", "-n", "1", "hi")
    assert ran.returncode == 0, ran.stderr
    [source] = _loaded()
    # A copy of the loaded model: rm of the copy leaves the source loaded (when the source's loaded model
    # answered the copy too, rm unloaded it: found by a helper); several names in one rm, as ollama's.
    assert run_cli("cp", ref, "mine").returncode == 0 and run_cli("cp", ref, "other").returncode == 0
    assert run_cli("run", "mine", "--threads", "1", "-n", "1", "hi").returncode == 0
    copies = run_cli("rm", "mine", "other")
    assert copies.returncode == 0 and "removed mine" in copies.stderr and "removed other" in copies.stderr, copies.stderr
    assert f"unloaded {source}" not in copies.stderr
    wait_until(lambda: _loaded() == [source], what="the copy to leave the server, its source to stay")
    assert run_cli("rm", "mine").returncode == 1
    removed = run_cli("rm", ref.split(":")[0])  # OWNER/REPO: the one quant pulled (by the name it is loaded as, then)
    assert removed.returncode == 0, removed.stderr
    assert "removed " in removed.stderr and "unloaded " in removed.stderr
    wait_until(lambda: _loaded() == [], what="the removed model to leave the server")
    # No server running: rm says nothing about one.
    assert run_cli("pull", ref).returncode == 0 and run_cli("stop", "--server").returncode == 0
    again = run_cli("rm", ref)
    assert again.returncode == 0 and "unloaded" not in again.stderr and "server" not in again.stderr


def test_a_server_silent_past_any_timeout_is_waited_for(silence: Future):
    """Two clients of one server stopped for longer than the old 30 s (_silent_server_story, under way since the
    module started): the whole answer for both, and one line from the one that waited for its first token."""
    silence.result(timeout=600)
