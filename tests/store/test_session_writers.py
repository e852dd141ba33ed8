"""One writer per session, files the index names and nothing else, full and read-only disks: real processes.

`python tests/store/session_writer_child.py COMMAND ...` is the child these tests start and kill; it drives the
store alone (no model: the store keeps bytes). The runs and chats answer with the tiny model of tests/tinymodel.py
(SmolLM2's tokenizer and chat template on random weights): what they answer is not the subject, who may write a
session is.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from localrun.store.sessions import INDEX, SessionStore
from localrun.store.writers import CHAT, RUN, SessionInUse, hold_writer, holder_of

CHILD = Path(__file__).resolve().with_name("session_writer_child.py")


def child(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(CHILD), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, stdin=subprocess.PIPE)


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    for stream in (proc.stdin, proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()


def messages_of(cli, name: str) -> list[dict]:
    r = cli("sessions", "show", name, "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)["messages"]


def user_turns(cli, name: str) -> list[str]:
    return [m["content"] for m in messages_of(cli, name) if m["role"] == "user"]


def one_line_error(r) -> str:
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 1 and lines and lines[-1].startswith("error:"), (r.returncode, r.stderr)
    assert "Traceback" not in r.stderr, r.stderr
    return lines[-1]


# -- the writer lock itself ------------------------------------------------------------------------


def test_a_chat_holding_a_session_refuses_other_writers_naming_its_pid(tmp_path):
    locks = tmp_path / "locks"
    holder = child("hold", str(locks), "s", CHAT)
    try:
        assert holder.stdout.readline().strip() == "held", holder.stderr.read()
        assert holder_of("s", locks=locks) == (holder.pid, CHAT)
        for kind in (RUN, CHAT):
            with pytest.raises(SessionInUse) as caught:
                hold_writer("s", kind, locks=locks)
            assert caught.value.pid == holder.pid and f"pid {holder.pid}" in caught.value.message
        holder.kill()  # however it ends, the kernel lets the lock go
        holder.wait()
        assert holder_of("s", locks=locks) is None
        with hold_writer("s", CHAT, locks=locks):
            pass
    finally:
        stop(holder)


def test_a_run_holding_a_session_is_waited_for(tmp_path):
    locks = tmp_path / "locks"
    holder = child("hold", str(locks), "s", RUN)
    try:
        assert holder.stdout.readline().strip() == "held", holder.stderr.read()
        heard: list[str] = []

        def cancelled() -> bool:
            if heard and holder.poll() is None:
                holder.stdin.close()  # the holder lets go once this waiter has said it waits
            return False

        with hold_writer("s", RUN, locks=locks, on_wait=heard.append, cancelled=cancelled) as writer:
            assert writer.held and holder.wait(timeout=60) == 0
        assert len(heard) == 1 and f"pid {holder.pid}" in heard[0]
    finally:
        stop(holder)


def test_a_holder_in_this_process_is_named_as_the_server_not_by_its_own_pid(tmp_path):
    """Through the background server, every session's lock is held by the server's process: a second request
    for a held session heard "another run (pid <the server's own pid>)", a process the user never started."""
    locks = tmp_path / "locks"
    for kind in (RUN, CHAT):
        with hold_writer("s", kind, locks=locks):
            heard: list[str] = []
            with pytest.raises(SessionInUse) as caught:
                hold_writer("s", RUN, locks=locks, on_wait=heard.append, cancelled=lambda: bool(heard))
            assert str(os.getpid()) not in caught.value.message and "through the server" in caught.value.message
            if kind == RUN:
                assert heard == ["session s is being answered by another run through the server: waiting for it"]
            else:
                assert caught.value.message.startswith("session 's' is open in another chat through the server")


# -- what a crashed save leaves ------------------------------------------------------------------------


def files_and_rows(root: Path) -> tuple[list[str], list[str]]:
    with SessionStore.open(root) as store:
        rows = sorted(row[0] for row in store.db.execute("SELECT state_file FROM entries"))
        return sorted(p.name for p in store.states.iterdir()), rows


def unnamed_files(root: Path) -> set[str]:
    """The state files no index row names, read without opening the store (which deletes them)."""
    db = sqlite3.connect(f"file:{root / INDEX}?mode=ro", uri=True)
    try:
        named = {row[0] for row in db.execute("SELECT state_file FROM entries")}
    finally:
        db.close()
    return {p.name for p in (root / "states").iterdir()} - named


def test_kill9_during_saves_leaves_no_file_the_index_does_not_name(tmp_path):
    """Saves killed at random moments left .kv.tmp files and .kv files no row named; the next opening of the
    store deletes them (the saves' files are flocked until committed), and total_bytes counts the disk.
    Each kill comes a random while after the child's first save began writing: on a loaded machine a save
    outlasted the whole random wait, and counted from "ready" twelve kills could all land before any file."""
    root = tmp_path / "store"
    rng = random.Random(7)
    left_behind = 0
    for _ in range(12):
        proc = child("save-forever", str(root))
        try:
            assert proc.stdout.readline().strip() == "ready", proc.stderr.read()
            from conftest import wait_until

            wait_until(lambda: any(p.name.endswith(".kv.tmp") for p in (root / "states").iterdir()),
                       what="the child's first save to start writing")
            time.sleep(rng.uniform(0.0, 0.3))
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        left_behind += bool(unnamed_files(root))
        files, rows = files_and_rows(root)
        assert files == rows
    assert left_behind, "no kill left a stray file: the test proved nothing"
    with SessionStore.open(root) as store:
        assert store.total_bytes() == sum(p.stat().st_size for p in store.states.iterdir())
        assert store.show("k").messages


def test_a_save_in_progress_is_left_alone_and_counted(tmp_path):
    root = tmp_path / "store"
    SessionStore.open(root).close()
    states = root / "states"
    (states / "dead.kv.tmp").write_bytes(b"x" * 1000)
    (states / "dead.kv").write_bytes(b"y" * 2000)
    writer = child("write-locked", str(states / "busy.kv.tmp"))
    try:
        assert writer.stdout.readline().strip() == "held", writer.stderr.read()
        with SessionStore.open(root) as store:
            assert sorted(p.name for p in states.iterdir()) == ["busy.kv.tmp"]
            assert store.total_bytes() == 3000  # on disk, though no entry names it yet
    finally:
        stop(writer)
    with SessionStore.open(root) as store:
        assert list(states.iterdir()) == [] and store.total_bytes() == 0


# -- end to end: concurrent runs and chats of one session ------------------------------------------------


def run_args(model, name: str, text: str) -> list[str]:
    from conftest import LOCALRUN

    return [LOCALRUN, "run", str(model), "-t", "0", "-n", "6", "--ctx", "1024", "--session", name, text]


@pytest.mark.slow
def test_concurrent_runs_of_one_session_all_land(tiny_smollm2, cli):
    asked = []
    for round_ in range(3):
        texts = [f"Round {round_}, writer {w}: name a colour." for w in "AB"]
        procs = [subprocess.Popen(run_args(tiny_smollm2, "dup", t), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True) for t in texts]
        for proc in procs:
            out, err = proc.communicate(timeout=300)
            assert proc.returncode == 0, err
        asked += texts
    turns = user_turns(cli, "dup")
    assert sorted(turns) == sorted(asked)  # every turn landed, once
    for one, two in zip(asked[::2], asked[1::2]):  # a round's two turns, after the rounds before
        assert {turns.index(one), turns.index(two)} == {asked.index(one), asked.index(two)}


def start_chat(model, name: str, *extra: str) -> subprocess.Popen:
    from conftest import LOCALRUN

    return subprocess.Popen([LOCALRUN, "chat", str(model), "-t", "0", "-n", "6", "--ctx", "1024", "--session", name, *extra],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def say(chat: subprocess.Popen, cli, name: str, text: str) -> None:
    from conftest import wait_until

    chat.stdin.write(text + "\n")
    chat.stdin.flush()
    wait_until(lambda: cli("sessions", "show", name, "--json").returncode == 0 and text in user_turns(cli, name),
               timeout=120, what="the chat's answer to be saved")


def check_second_writers_refused(tiny_smollm2, cli, chat: subprocess.Popen, pid: int) -> None:
    say(chat, cli, "cdup", "First chat: hello.")
    second = cli("chat", str(tiny_smollm2), "--ctx", "1024", "--session", "cdup", input="Second chat: hello.\n")
    assert f"pid {pid}" in one_line_error(second) and "chat" in second.stderr
    run = cli(*run_args(tiny_smollm2, "cdup", "A run: hello.")[1:])
    assert f"pid {pid}" in one_line_error(run)
    say(chat, cli, "cdup", "First chat: again.")
    chat.stdin.close()
    assert chat.wait(timeout=120) == 0, chat.stderr.read()
    assert user_turns(cli, "cdup") == ["First chat: hello.", "First chat: again."]
    # Once it has ended, the session is anyone's.
    assert cli(*run_args(tiny_smollm2, "cdup", "A run: now.")[1:]).returncode == 0
    assert user_turns(cli, "cdup")[-1] == "A run: now."


@pytest.mark.slow
def test_a_second_chat_or_a_run_of_a_chats_session_is_refused_naming_the_chat(tiny_smollm2, cli):
    chat = start_chat(tiny_smollm2, "cdup")
    try:
        check_second_writers_refused(tiny_smollm2, cli, chat, chat.pid)
    finally:
        stop(chat)


@pytest.mark.slow
def test_through_the_background_server_the_same_holds(tiny_smollm2, cli, resident):
    """The server saves a chat's session from its slots, and answers runs there: the chat's own process
    holds the session, the server's runs take the lock as in-process runs do."""
    assert cli(*run_args(tiny_smollm2, "warm", "Warm up.")[1:]).returncode == 0
    server = resident()
    chat = start_chat(tiny_smollm2, "cdup")
    procs: list[subprocess.Popen] = []
    try:
        check_second_writers_refused(tiny_smollm2, cli, chat, chat.pid)
        procs = [subprocess.Popen(run_args(tiny_smollm2, "rdup", f"Writer {w}: name a fruit."), stdin=subprocess.DEVNULL,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for w in "ABC"]
        for proc in procs:
            _, err = proc.communicate(timeout=300)
            assert proc.returncode == 0, err
    finally:
        for proc in [chat, *procs]:
            stop(proc)
    assert sorted(user_turns(cli, "rdup")) == [f"Writer {w}: name a fruit." for w in "ABC"]
    assert resident() == server  # all of it on the one server


# -- full and read-only disks -----------------------------------------------------------------------------


@pytest.fixture
def tmpfs_home(tmp_path, monkeypatch):
    mnt = tmp_path / "home"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mnt)], capture_output=True)
    if r.returncode != 0:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    monkeypatch.setenv("LOCALRUN_HOME", str(mnt))
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def fill(folder: Path) -> Path:
    filler = folder / "filler"
    with open(filler, "wb") as f:
        try:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        except OSError:
            pass
    return filler


@pytest.mark.slow
def test_a_full_disk_says_so_and_loses_no_session(tiny_smollm2, cli, tmpfs_home):
    assert cli(*run_args(tiny_smollm2, "kept", "Remember the word teapot.")[1:]).returncode == 0
    filler = fill(tmpfs_home)
    r = cli(*run_args(tiny_smollm2, "kept", "What was the word?")[1:])
    line = one_line_error(r)
    assert "full" in line and "nothing saved before was lost" in line and "move it aside" not in r.stderr, line
    listed = cli("sessions", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    filler.unlink()
    assert user_turns(cli, "kept") == ["Remember the word teapot."]
    assert cli(*run_args(tiny_smollm2, "kept", "What was the word?")[1:]).returncode == 0
    assert len(user_turns(cli, "kept")) == 2


@pytest.mark.slow
def test_a_read_only_home_reads_and_refuses_writes_in_one_line(tiny_smollm2, cli, tmpfs_home):
    assert cli(*run_args(tiny_smollm2, "kept", "Remember the word teapot.")[1:]).returncode == 0
    subprocess.run(["mount", "-o", "remount,ro", str(tmpfs_home)], check=True)
    ps = cli("ps")
    assert ps.returncode == 0 and "Traceback" not in ps.stderr and "Errno" not in ps.stderr, ps.stderr
    listed = cli("sessions", "list", "--json")
    assert listed.returncode == 0 and [s["name"] for s in json.loads(listed.stdout)] == ["kept"], listed.stderr
    assert user_turns(cli, "kept") == ["Remember the word teapot."]
    for writes in (run_args(tiny_smollm2, "kept", "What was the word?")[1:], ["sessions", "rm", "kept"],
                   ["chat", str(tiny_smollm2), "--session", "kept"]):
        line = one_line_error(cli(*writes, input=""))
        assert "read-only" in line and "LOCALRUN_HOME" in line, (writes, line)
    plain = cli("run", str(tiny_smollm2), "-t", "0", "-n", "4", "--ctx", "1024", "Say hi.")
    assert plain.returncode == 0 and "Errno" not in plain.stderr, plain.stderr  # the prefix cache only saves time
