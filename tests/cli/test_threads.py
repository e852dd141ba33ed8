"""llama.cpp's threads: a thread per physical core by default (as llama.cpp and Ollama count them), said by doctor,
ps and --verbose; and when other processes keep the cores busy (llama.cpp's threads spin at each barrier, and one
sharing a core with a busy process holds up the rest: SmolLM2 decoded at 0.48 tokens/s with 2 threads beside one
busy process, 64.8 with 1), a person at a terminal is told once, with the fix. The installed command, in a
pseudo-terminal where the terminal matters, beside a real busy process on the same cores."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pexpect
import pytest

from conftest import LOCALRUN, run_cli

pytestmark = pytest.mark.slow

BUSY = "this machine is busy: other processes use"
_ESCAPES = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[()][0-9A-Za-z]|\x1b[=>]")


def in_terminal(*args: str) -> str:
    """`localrun ARGS` in a pseudo-terminal: what it printed (stdout and stderr), its exit status checked."""
    child = pexpect.spawn(LOCALRUN, list(args), env={**os.environ, "TERM": "xterm", "COLUMNS": "200"}, encoding="utf-8",
                          timeout=300, dimensions=(40, 200))
    child.expect(pexpect.EOF)
    child.close()
    shown = _ESCAPES.sub("", child.before).replace("\r", "")
    assert child.exitstatus == 0, shown
    return shown


@pytest.fixture
def busy_core():
    """Two processes per core of this test's (they inherit its affinity) spinning while the test runs, each in a
    session of its own: Linux shares a core between sessions (autogroups) before threads, so on a pytest-xdist
    worker pinned to one core the command in its terminal (a session) beside one session of spinners got half of
    it, and the spinners took 0.5 cores, the advice's threshold; beside two sessions they take two thirds."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
             for _ in range(2 * len(os.sched_getaffinity(0)))]
    try:
        yield procs
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def test_doctor_says_the_threads_and_how_busy_the_cores_are(cli):
    from localrun.engine.llama import cpu_counts

    report = json.loads(cli("doctor", "--json").stdout)
    cores, logical = cpu_counts()
    assert report["threads"] == {"default": cores, "physical_cores": cores, "logical_cpus": logical}
    assert logical == len(os.sched_getaffinity(0)) and cores <= logical
    assert isinstance(report["cpu_busy_elsewhere"], float)
    text = cli("doctor").stdout
    assert "threads:" in text and f"{cores} by default, a thread per physical core" in text


def test_a_busy_machine_is_said_once_at_a_terminal(smollm2, busy_core):
    args = ["run", str(smollm2), "-t", "0", "-n", "4", "--threads", "2", "--keep-alive", "0", "Hi"]
    # The run through a pipe beside the one in the terminal, both among the spinners (each is busier for the other):
    # the spinners' core is shared for one run's time instead of two.
    with ThreadPoolExecutor(1) as pool:
        piped = pool.submit(run_cli, *args)  # a pipe: no advice (for a person), the answer the same
        shown = in_terminal(*args)
        piped = piped.result(timeout=300)
    assert shown.count(BUSY) == 1 and "--threads 1" in shown, shown
    assert piped.returncode == 0 and BUSY not in piped.stderr


def test_the_background_server_says_it_once_and_ps_and_verbose_name_the_threads(resident, smollm2, busy_core):
    args = ["run", str(smollm2), "-t", "0", "-n", "4", "--threads", "2", "--keep-alive", "5m"]
    first = in_terminal(*args, "Hi")
    assert first.count(BUSY) == 1, first
    again = in_terminal(*args, "--verbose", "Hello")
    assert BUSY not in again and re.search(r"threads:\s+2 \(--threads\)", again), again  # said once; the threads said
    for proc in busy_core:  # what ps says of the threads does not depend on the load: the cores are left to it
        proc.kill()
        proc.wait()
    (model,) = json.loads(run_cli("ps", "--json").stdout)
    assert model["threads"] == 2
    header, row = run_cli("ps").stdout.splitlines()[:2]
    assert row[header.index("THREADS"):].split()[0] == "2", (header, row)
