"""`localrun run` in-process for several argument lists in turn, in one interpreter: the answers a run through a
server must match, for one start and one set of imports (a second of CPU) instead of one per run."""

from __future__ import annotations

import json
import os
import subprocess
import sys

# Each argument list in turn (LOCALRUN_KEEP_ALIVE=0: each answered in this process, its model loaded for it and
# freed after it), each one's stdout in a file of its own as a run's stdout is a pipe, and a marker line on stderr
# before each, so that each run's notices can be told apart.
_SCRIPT = """
import json, os, sys, tempfile
import localrun.cli.main

cli = sys.modules["localrun.cli.main"]  # (localrun.cli.main is also the name of its entry point)

outs = []
for args in json.loads(sys.argv[1]):
    sys.stderr.write(sys.argv[2] + "\\n")
    sys.stderr.flush()
    with tempfile.TemporaryFile("w+", encoding="utf-8") as out:
        sys.stdout = out
        try:
            code = cli.app(["run", *args], prog_name="localrun", standalone_mode=False)  # a typer.Exit's code, or None
        finally:
            out.flush()
            sys.stdout = sys.__stdout__
            sys.stderr.flush()
        if code:
            sys.exit(f"localrun run {args} ended with exit code {code}")
        out.seek(0)
        outs.append(out.read())
    while cli._UNTIL_EXIT:
        cli._UNTIL_EXIT.pop().engine.close()
sys.stdout.write(json.dumps(outs))
sys.stdout.flush()
"""

_MARKER = "--- the next run of runs_in_one_process ---"


def runs_in_one_process(*runs: list[str]) -> list[tuple[str, str]]:
    """(stdout, stderr) of `localrun run --keep-alive 0 ARGS` for each of `runs`, each run asserted to succeed."""
    done = subprocess.run([sys.executable, "-c", _SCRIPT, json.dumps(runs), _MARKER], capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, env={**os.environ, "LOCALRUN_KEEP_ALIVE": "0"}, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    errs = done.stderr.split(_MARKER + "\n")[1:]
    outs = json.loads(done.stdout)
    assert len(outs) == len(errs) == len(runs), done.stderr[-3000:]
    return list(zip(outs, errs))
