"""doctor reads as a report: sizes in words under a label without "bytes" (it printed "free disk bytes: 76.4 GB"),
lists as lists (it printed a Python list for the models files), yes or no; --json keeps the raw values. The
installed command."""

from __future__ import annotations

import json

from conftest import run_cli


def test_doctor_prints_words_not_python(tmp_path, monkeypatch):
    extra = tmp_path / "models.yaml"
    extra.write_text("models: {}\n")
    monkeypatch.setenv("LOCALRUN_MODELS", str(extra))
    r = run_cli("doctor")
    assert r.returncode == 0, r.stderr
    rows = dict(line.split(":", 1) for line in r.stdout.splitlines())
    rows = {k.strip(): v.strip() for k, v in rows.items()}
    assert "free disk bytes" not in rows and rows["free disk"].endswith(("GB", "MB", "TB", "KB"))
    files = rows["models files"]
    assert "[" not in files and "'" not in files and str(extra) in files.split(", ")
    assert rows["gpu offload"] in ("yes", "no") and rows["mmap"] in ("yes", "no")
    raw = json.loads(run_cli("doctor", "--json").stdout)
    assert isinstance(raw["free_disk_bytes"], int) and str(extra) in raw["models_files"] and isinstance(raw["mmap"], bool)
