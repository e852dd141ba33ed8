"""Several `localrun run` commands in one process, one after the other: the installed entry point
(localrun.cli.main.main) with each command's own arguments, stdin, stdout and stderr (file descriptors 0, 1 and 2
pointed at files of its own), exit code and home, for one interpreter's start and imports (about 0.4 s of CPU a
command) instead of one each. For tests whose subject is what a command answers or refuses, not the process
around it: those that pipe, close a pipe early, or count a notice printed once a process keep a process each."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass

from conftest import Result

# Each command as the `localrun` script runs it: main() with sys.argv set. main() ends a command that loaded a
# model with os._exit (no interpreter teardown): here that exit is turned into SystemExit with the same code, and
# the model freed before the next command. An exception that escapes main() is what the interpreter would print
# for it (a traceback, exit 1).
_SCRIPT = r"""
import json, os, sys, tempfile, traceback
import localrun.cli.main

cli = sys.modules["localrun.cli.main"]  # (localrun.cli.main is also the name of its entry point)
commands = cli.app.registered_commands, cli.app.registered_groups


class _Exited(SystemExit):
    pass


def _exit(code):
    raise _Exited(code)


os._exit = _exit
results = []
saved = {fd: os.dup(fd) for fd in (0, 1, 2)}
for args, stdin, home in json.load(open(sys.argv[1])):
    files = {fd: tempfile.TemporaryFile() for fd in (0, 1, 2)}
    files[0].write((stdin or "").encode("latin-1"))
    files[0].seek(0)
    os.environ["LOCALRUN_HOME"] = home
    cli.app.registered_commands, cli.app.registered_groups = commands  # main() keeps only the command named
    sys.argv = ["localrun", *args]
    sys.stdout.flush(), sys.stderr.flush()
    for fd, f in files.items():  # (no stdin given: an empty one, as subprocess.DEVNULL gives)
        os.dup2(f.fileno(), fd)
    sys.stdin = open(os.dup(0), encoding=sys.__stdin__.encoding, errors=sys.__stdin__.errors)
    try:
        cli.main()
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else (print(exc.code, file=sys.stderr), 1)[1])
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        sys.stdout.flush(), sys.stderr.flush()
        for fd in (0, 1, 2):
            os.dup2(saved[fd], fd)
    sys.stdin.close()
    while cli._UNTIL_EXIT:  # what run loaded, freed as the process's end would free it
        cli._UNTIL_EXIT.pop().engine.close()
    out = {}
    for fd in (1, 2):
        files[fd].seek(0)
        out[fd] = files[fd].read().decode("utf-8", "replace")
    results.append([code, out[1], out[2]])
sys.stdout.write(json.dumps(results))
"""


@dataclass
class Piped:
    """A command of run_all's with `input` on its stdin."""

    args: list
    input: str


def run_all(*commands, home, env: dict | None = None, timeout: float = 600) -> list[Result]:
    """Run each of `commands` (a sequence of `localrun` arguments, or a Piped) in one process with LOCALRUN_HOME
    `home` (and `env` over this one's environment), in turn; their Results, as run_cli would give each (stdin
    empty unless Piped)."""
    import tempfile

    specs = [[list(map(str, c.args)), c.input, str(home)] if isinstance(c, Piped) else [list(map(str, c)), None, str(home)]
             for c in commands]
    with tempfile.NamedTemporaryFile("w", suffix=".json") as f:
        json.dump([[a, s.encode().decode("latin-1") if s is not None else None, h] for a, s, h in specs], f)
        f.flush()
        done = subprocess.run([sys.executable, "-c", _SCRIPT, f.name], capture_output=True, text=True,
                              stdin=subprocess.DEVNULL, env={**os.environ, **(env or {})}, timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    return [Result(code, out, err) for code, out, err in json.loads(done.stdout)]
