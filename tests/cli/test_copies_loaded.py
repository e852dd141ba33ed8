"""A copy of a created model that shares its source's load is listed and stopped by its own name, as Ollama
lists each name loaded (`cp pirate pirate-2`, then a run of each: `ps` listed only pirate:latest, and
`stop pirate-2` printed "unloaded pirate"). The installed command and the real background server."""

from __future__ import annotations

import json

import pytest

from conftest import last_json, run_cli

pytestmark = pytest.mark.slow


def names() -> list[str]:
    return sorted(m["name"] for m in json.loads(run_cli("ps", "--json").stdout))


def test_a_copy_is_listed_and_stopped_by_its_own_name(resident, smollm2, tmp_path):
    (tmp_path / "Modelfile").write_text(f"FROM {smollm2}\nSYSTEM You are a pirate. Answer in one sentence.\n")
    assert run_cli("create", "pirate", "-f", str(tmp_path / "Modelfile")).returncode == 0
    assert run_cli("cp", "pirate", "pirate-2").returncode == 0
    for name in ("pirate", "pirate-2"):
        r = run_cli("run", name, "-t", "0", "-n", "4", "--threads", "1", "--json", "Hi")
        assert r.returncode == 0, r.stderr
    assert last_json(r.stdout)["stats"]["load_s"] == 0  # the copy answered from the load its source made: one load
    assert names() == ["pirate-2:latest", "pirate:latest"]
    table = run_cli("ps").stdout
    assert "pirate:latest" in table and "pirate-2:latest" in table

    stopped = run_cli("stop", "pirate-2")
    assert stopped.returncode == 0 and stopped.stderr.strip() == "unloaded pirate-2", stopped.stderr
    assert names() == ["pirate:latest"]
    again = run_cli("run", "pirate-2", "-t", "0", "-n", "1", "--threads", "1", "--json", "Hi")  # named again: listed again
    assert again.returncode == 0 and last_json(again.stdout)["stats"]["load_s"] == 0
    assert names() == ["pirate-2:latest", "pirate:latest"]
    assert run_cli("stop", "pirate").stderr.strip() == "unloaded pirate"
    assert names() == ["pirate-2:latest"]  # still loaded for the copy
    assert run_cli("stop", "pirate-2:latest").stderr.strip() == "unloaded pirate-2"
    assert names() == []
