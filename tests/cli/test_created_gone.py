"""A model made here whose file is gone names the fix for where it came from: a created model whose FROM file moved
is put back or made again (`show relmodel` said "run localrun pull relmodel again", and that pull then failed with
"make it again"); show, run and pull say the same. The installed command."""

from __future__ import annotations

import shutil

import pytest

from conftest import run_cli

pytestmark = pytest.mark.slow


def test_a_created_model_whose_file_moved_says_to_put_it_back_or_create_it_again(smollm2, tmp_path, monkeypatch):
    folder = tmp_path / "models"
    folder.mkdir()
    shutil.copy(smollm2, folder / "mine.gguf")
    (folder / "Modelfile").write_text("FROM ./mine.gguf\nSYSTEM You answer in one word.\n")
    monkeypatch.chdir(folder)
    made = run_cli("create", "relmodel")
    assert made.returncode == 0, made.stderr
    (folder / "mine.gguf").rename(folder / "moved.gguf")
    for command in (["show", "relmodel", "--no-measure"], ["run", "relmodel", "-n", "1", "--threads", "1", "Hi"], ["pull", "relmodel"]):
        r = run_cli(*command)
        assert r.returncode == 1, (command, r.stderr)
        (line,) = r.stderr.strip().splitlines()
        assert f"model 'relmodel' was made from {folder / 'mine.gguf'}, which is gone or changed: put it back, or make the " \
               "model again (`localrun create relmodel -f Modelfile`)" in line, (command, line)
        assert "pull" not in line.split(":", 1)[1], (command, line)  # no pull to suggest: nothing to pull


def test_a_copy_of_a_pulled_model_whose_file_is_gone_says_to_pull_it(smollm2, tmp_path, monkeypatch):
    from localrun.store import registry

    folder = tmp_path / "m"
    folder.mkdir()
    shutil.copy(smollm2, folder / "base.gguf")
    (folder / "Modelfile").write_text("FROM ./base.gguf\n")
    monkeypatch.chdir(folder)
    assert run_cli("create", "base").returncode == 0
    assert run_cli("cp", "base", "copy").returncode == 0
    (folder / "base.gguf").unlink()
    r = run_cli("show", "copy", "--no-measure")
    assert r.returncode == 1 and "model 'copy' was made from base, whose file" in r.stderr and "`localrun cp base copy`" in r.stderr, r.stderr
    with registry.edit() as models:  # the copy of a model pulled from the Hub
        models["copy:"]["origin"] = "copy of smollm2:Q4_1"
    r = run_cli("show", "copy", "--no-measure")
    assert "`localrun pull smollm2:Q4_1` fetches it again" in r.stderr, r.stderr
