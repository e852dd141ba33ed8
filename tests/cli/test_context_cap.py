"""A context asked for past the length the model was trained on is capped to it, and the user is told, as
Ollama does: `run smollm2 --ctx 99999` answered silently with a 9.2 GB KV cache in `ps`, while SmolLM2 was
trained on 8,192 tokens (localrun's own overflow message said "up to the model's 8192"). The installed command."""

from __future__ import annotations

import json

import pytest

from conftest import last_json, run_cli

pytestmark = pytest.mark.slow

CAPPED = "--ctx 99999 is more than {name} was trained on (8192 tokens): using 8192"


def test_run_and_show_cap_the_context_and_say_so(smollm2):
    r = run_cli("run", str(smollm2), "--ctx", "99999", "-t", "0", "-n", "4", "--threads", "1", "--json", "Hi")
    assert r.returncode == 0, r.stderr
    assert CAPPED.format(name=smollm2.name) in r.stderr and len(last_json(r.stdout)["tokens"]) == 4
    shown = run_cli("show", str(smollm2), "--ctx", "99999", "--no-measure", "--json")
    assert shown.returncode == 0, shown.stderr
    details = json.loads(shown.stdout)
    assert details["memory_estimate"]["n_ctx"] == details["memory_served"]["n_ctx"] == 8192
    assert CAPPED.format(name=smollm2.name) in shown.stderr
    within = run_cli("run", str(smollm2), "--ctx", "8192", "-t", "0", "-n", "1", "--threads", "1", "Hi")
    assert within.returncode == 0 and "trained on" not in within.stderr


def test_the_background_server_caps_it_too(resident, smollm2):
    from localrun.engine.gguf_info import kv_cache_bytes, read_info

    r = run_cli("run", str(smollm2), "--ctx", "99999", "-t", "0", "-n", "4", "--threads", "1", "Hi")
    assert r.returncode == 0, r.stderr
    assert CAPPED.format(name=smollm2.name) in r.stderr
    (model,) = json.loads(run_cli("ps", "--json").stdout)
    assert model["context_length"] == 8192 and model["memory"]["kv_bytes"] == kv_cache_bytes(read_info(smollm2), 8192)
    again = run_cli("run", str(smollm2), "--ctx", "99999", "-t", "0", "-n", "1", "--threads", "1", "Hi")
    assert again.returncode == 0 and CAPPED.format(name=smollm2.name) in again.stderr  # each run that asks hears it


def test_a_modelfile_num_ctx_past_it_is_capped(smollm2, tmp_path):
    (tmp_path / "Modelfile").write_text(f"FROM {smollm2}\nPARAMETER num_ctx 65536\n")
    made = run_cli("create", "wide", "-f", str(tmp_path / "Modelfile"))
    assert made.returncode == 0, made.stderr
    r = run_cli("run", "wide", "-t", "0", "-n", "1", "--threads", "1", "Hi")
    assert r.returncode == 0, r.stderr
    assert "wide's num_ctx 65536 is more than wide was trained on (8192 tokens): using 8192" in r.stderr
