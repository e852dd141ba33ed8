"""A full disk during a pull: one line naming the problem and the fix, exit 1, nothing that looks complete."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from hubstub import hub_stub, random_bytes  # noqa: F401 - hub_stub is a fixture

REPO = "stub-org/Big-GGUF"


@pytest.fixture
def tiny_tmpfs(tmp_path):
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], capture_output=True)
    if r.returncode != 0:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_pull_onto_a_full_disk(hub_stub, tiny_tmpfs, cli):  # noqa: F811
    hub_stub.stub.add_repo(REPO, {"big-Q4_0.gguf": random_bytes(3_000_000, seed=5)})
    hf_home = tiny_tmpfs / "hf"
    r = cli("pull", f"{REPO}:Q4_0", "--source", "hub", env={"HF_HOME": str(hf_home), "HF_HUB_CACHE": str(hf_home / "hub")})
    assert r.returncode == 1, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert "space" in lines[-1].lower() and "Traceback" not in r.stderr
    assert lines[-1].startswith("error:")
    finished = [p for p in Path(hf_home).rglob("*") if p.is_file() and not p.name.endswith(".incomplete") and p.suffix == ".gguf"]
    assert finished == []
    blobs = [p for p in Path(hf_home).rglob("blobs/*") if not p.name.endswith("incomplete") and not p.name.endswith(".lock")]
    assert blobs == []
