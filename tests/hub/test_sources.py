"""pull's sources through their one interface (hub.sources.Source), and the registry file they record into.

Fake sources stand in for the Hub and the mirror here: what is pinned is the order PULL_ORDER gives, when the next
source is tried (only after an Unavailable one, and only if it offers the model), and the words of the notice and
of the error, which the real Hub and mirror reach through the same code (tests/hub/test_pull.py runs those)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from localrun import hub
from localrun.errors import DownloadError, ModelNotFound
from localrun.hub import pulling
from localrun.hub.sources import RemoteFile, Resolved, Unavailable
from localrun.store import registry


class FakeSource:
    """Has every repository reference (unless `missing`), unreachable when `down`; remembers what it was asked."""

    def __init__(self, name: str, down: bool = False):
        self.name, self.down, self.missing, self.asked = name, down, False, []

    def offers(self, mref):
        return f"the {self.name} store" if mref.repo else None

    def resolve(self, mref):
        self.asked.append(str(mref))
        if self.down:
            raise Unavailable("ConnectError: refused", title=f"the {self.name}", where=f"the {self.name} at here",
                              advice="try again later")
        if self.missing:
            raise ModelNotFound(f"{self.name} has no {mref}")
        return Resolved(ref=mref.with_quant(mref.quant or "Q4_0"), files=(RemoteFile("m.gguf", 3, "0" * 64),))

    def fetch(self, found, progress, *, verbose=False):
        path = Path(registry.registry_path().parent / f"{self.name}.gguf")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"abc")
        return registry.record(registry.LocalModel(
            name=found.ref.name, quant=found.ref.quant, repo=found.ref.repo, revision=None, commit=None, files=(path,),
            sizes=(3,), sha256=("ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad",), source=self.name,
            origin=self.name, pulled_at=registry.now()))

    def delete(self, model, keep):
        return []


@pytest.fixture
def three_sources(monkeypatch):
    first, second, third = FakeSource("first", down=True), FakeSource("second"), FakeSource("third")
    monkeypatch.setattr(pulling, "SOURCE_BY_NAME", {s.name: s for s in (first, second, third)})
    monkeypatch.setattr(pulling, "PULL_ORDER", {"auto": ("first", "second"), "first": ("first",), "third": ("third",)})
    return first, second, third


def test_auto_goes_on_to_the_next_source_only_when_one_is_unavailable(three_sources, capfd):
    first, second, third = three_sources
    model = hub.pull("owner/model:Q4_0", source="auto", progress=False)
    assert model.source == "second" and first.asked == second.asked == ["owner/model:Q4_0"] and third.asked == []
    assert capfd.readouterr().err.strip().endswith(
        "the first is unreachable (ConnectError: refused); pulling owner/model:Q4_0 from the second store")
    again = hub.pull("owner/model:Q4_0", source="auto", progress=False)  # in the registry now: no source asked
    assert again.already_present and len(first.asked) == 1


def test_an_unavailable_source_alone_names_the_others_that_have_the_model(three_sources):
    with pytest.raises(DownloadError) as exc:
        hub.pull("owner/model:Q4_0", source="first", progress=False)
    assert exc.value.message == ("the first at here is unreachable (ConnectError: refused): try again later, "
                                 "or use `--source second`, or use `--source third`")


def test_a_source_without_the_model_is_the_answer_not_a_reason_to_try_the_next(three_sources):
    first, second, _ = three_sources
    first.down, first.missing = False, True
    with pytest.raises(ModelNotFound, match="first has no owner/model:Q4_0"):
        hub.pull("owner/model:Q4_0", source="auto", progress=False)
    assert second.asked == []


def test_the_sources_are_hub_then_mirror():
    assert hub.SOURCES == ("auto", "hub", "mirror")
    assert pulling.PULL_ORDER["auto"] == ("hub", "mirror")
    assert sorted(pulling.SOURCE_BY_NAME) == ["hub", "mirror"]


def test_a_registry_written_before_the_split_still_reads_and_keeps_its_format(tmp_path):
    """models.json as localrun wrote it when the registry lived in hub/models.py: version 1, records by NAME:QUANT."""
    blob = tmp_path / "tiny.Q4_0.gguf"
    blob.write_bytes(b"abc")
    old = {"version": 1, "models": {"stub-org/Tiny-GGUF:Q4_0": {
        "name": "stub-org/Tiny-GGUF", "quant": "Q4_0", "repo": "stub-org/Tiny-GGUF", "revision": "main",
        "commit": "c" * 40, "source": "hub", "origin": "https://huggingface.co/stub-org/Tiny-GGUF",
        "files": [{"path": str(blob), "size": 3,
                   "sha256": "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad",
                   "mtime_ns": blob.stat().st_mtime_ns}],
        "size": 3, "pulled_at": "2026-01-01T00:00:00+00:00"}}}
    path = registry.registry_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(old, indent=2) + "\n")

    model = hub.resolve_local("stub-org/Tiny-GGUF:Q4_0")
    assert model.files == (blob,) and model.commit == "c" * 40 and model.pulled_at == "2026-01-01T00:00:00+00:00"
    with registry.edit():  # read, then written back whole
        pass
    assert json.loads(path.read_text()) == old
    assert sorted(p.name for p in path.parent.iterdir()) == ["models.json", "models.json.lock"]
