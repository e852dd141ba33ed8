"""A vision model pulled from the Hub (its stand-in) comes with its projector, as `llama-server -hf` fetches
one: `show` says it sees images, and `run --image` uses the projector beside it without --mmproj. Real
SmolLM2 with a random-weight projector (tests/projector.py): the answers mean nothing."""

from __future__ import annotations

import json
import re

import pytest

from hubstub import StubFile, hub_stub  # noqa: F401 - hub_stub is a fixture
from projector import red_square, write_projector

pytestmark = pytest.mark.slow

REF = "test/SmolVision-GGUF:Q4_1"


def test_a_pulled_vision_model_shows_and_runs_with_its_projector(hub_stub, smollm2, cli, tmp_path):
    write_projector(tmp_path / "mmproj-SmolVision-f16.gguf")
    hub_stub.stub.add_repo("test/SmolVision-GGUF", [StubFile(smollm2.name, smollm2.read_bytes()),
                                                     StubFile("mmproj-SmolVision-f16.gguf", (tmp_path / "mmproj-SmolVision-f16.gguf").read_bytes())])
    assert cli("pull", REF).returncode == 0
    shown = json.loads(cli("show", REF, "--json", "--no-measure").stdout)
    assert shown["projector"].endswith("mmproj-SmolVision-f16.gguf") and shown["files"][-1] == shown["projector"]
    assert re.search(r"^vision: +yes: projector .*mmproj-SmolVision-f16.gguf$", cli("show", REF, "--no-measure").stdout, re.M)

    from localrun.runtime.reports.report import model_card

    assert "vision" in model_card(REF)["capabilities"]  # Ollama's /api/show: what Open WebUI enables image upload by
    (tmp_path / "red.png").write_bytes(red_square())
    ran = cli("run", REF, "--image", str(tmp_path / "red.png"), "-t", "0", "-n", "4", "--ctx", "512", "Describe it.")
    assert ran.returncode == 0 and ran.stdout.strip(), ran.stderr
    plain = cli("show", str(smollm2), "--json", "--no-measure")  # the same file alone: no projector beside it
    assert json.loads(plain.stdout)["projector"] is None
