"""A quant made here never takes the name of a file the model's source publishes: `quantize smollm2 Q4_0` is
smollm2:Q4_0-local, and `pull smollm2:Q4_0` fetches the Hub's Q4_0 (it answered "already pulled smollm2:Q4_0 (91.7
MB, local)" with the requantized file, and the real one could not be pulled without `rm` first). Real
huggingface_hub against the loopback Hub stand-in, real llama.cpp quantizer, the installed command."""

from __future__ import annotations

import json

import pytest
from hubstub import StubFile, hub_stub, random_bytes  # noqa: F401 - hub_stub is a fixture

from localrun.hub.catalogue import catalogue

pytestmark = pytest.mark.slow

PUBLISHED_Q4_0 = random_bytes(150_000, seed=40)  # the Hub's Q4_0 file (its bytes are not a model: only pulled)


def listed(cli) -> list[tuple[str, str, str]]:
    return sorted((m["name"], m["quant"], m["source"]) for m in json.loads(cli("list", "--json").stdout))


@pytest.fixture
def smollm2_on_the_hub(hub_stub, smollm2):
    entry = catalogue().models["smollm2"]
    hub_stub.stub.add_repo(entry.repo, [StubFile(entry.quants["Q4_1"], smollm2.read_bytes()),
                                        StubFile(entry.quants["Q4_0"], PUBLISHED_Q4_0),
                                        StubFile("README.md", b"x", lfs=False)])
    return hub_stub


def test_a_quant_made_here_is_tagged_local_and_the_published_one_pulls(smollm2_on_the_hub, cli):
    assert cli("pull", "smollm2", "--source", "hub").returncode == 0
    made = cli("quantize", "smollm2", "Q4_0", "--allow-requantize")
    assert made.returncode == 0, made.stderr
    assert "quantized smollm2:Q4_0-local" in made.stderr and "run it with `localrun run smollm2:Q4_0-local`" in made.stderr
    pulled = cli("pull", "smollm2:Q4_0", "--source", "hub")
    assert pulled.returncode == 0, pulled.stderr
    assert "\npulled smollm2:Q4_0 (" in pulled.stderr and ", hub)" in pulled.stderr and "already" not in pulled.stderr, pulled.stderr
    assert listed(cli) == [("smollm2", "Q4_0", "hub"), ("smollm2", "Q4_0-local", "local"), ("smollm2", "Q4_1", "hub")]
    again = cli("pull", "smollm2:q4_0-local")  # Ollama-style lower case, as any quant is taken
    assert again.returncode == 0 and "was made here by `localrun quantize`, nothing to pull" in again.stderr, again.stderr
    ran = cli("run", "smollm2:Q4_0-local", "-t", "0", "-n", "2", "--threads", "1", "Hi")
    assert ran.returncode == 0, ran.stderr


def test_a_quant_made_before_the_tag_is_set_aside_by_pull(smollm2_on_the_hub, cli):
    """A registry written before quants made here were tagged: smollm2:Q4_0 made by quantize. `pull smollm2:Q4_0`
    gives it its tag and fetches the published file (nothing is lost: the made file keeps its record)."""
    from localrun.store import registry

    assert cli("pull", "smollm2", "--source", "hub").returncode == 0
    assert cli("quantize", "smollm2", "Q4_0", "--allow-requantize").returncode == 0
    with registry.edit() as models:  # as the older localrun recorded it
        record = models.pop("smollm2:Q4_0-local")
        models["smollm2:Q4_0"] = {**record, "quant": "Q4_0"}
    pulled = cli("pull", "smollm2:Q4_0", "--source", "hub")
    assert pulled.returncode == 0 and "smollm2:Q4_0 made here by `localrun quantize` is smollm2:Q4_0-local now" in pulled.stderr
    assert listed(cli) == [("smollm2", "Q4_0", "hub"), ("smollm2", "Q4_0-local", "local"), ("smollm2", "Q4_1", "hub")]
