"""The registry of the models on this machine: <home>/models.json, one record per NAME:QUANT, read offline by
run, show and list.

A record says which files a model is (in load order), what each hashed to and its size and mtime when the hash
was checked, and where they came from (the Hub, a PyPI mirror, `quantize`, `create`). Every change is a
read-modify-write under the registry's lock (an flock on models.json.lock), written whole and renamed into
place, so concurrent pulls keep each other's records and a reader never sees half a file. Standard library only:
what a reference means and whether a file is damaged is the hub's business.
"""

from __future__ import annotations

import fcntl
import json
import os
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator, Literal, Optional

from ..errors import ConfigError
from . import paths
from .files import atomic_write_bytes

REGISTRY_VERSION = 1
MADE_HERE = ("local", "created")  # sources of models made on this machine, known by a plain name


@dataclass(frozen=True)
class LocalModel:
    """A pulled (or local) model: its files in load order, what they hash to, and where they came from."""

    name: str  # alias, owner/repo, or the path as given
    quant: str
    repo: Optional[str]
    revision: Optional[str]  # as asked (branch, tag or commit)
    commit: Optional[str]  # what the revision resolved to on the Hub
    files: tuple[Path, ...]  # absolute; first shard first
    sizes: tuple[int, ...]  # bytes, one per file
    sha256: tuple[str, ...]  # one per file; empty for a plain local path (not hashed)
    source: Literal["hub", "mirror", "path", "local", "created"]  # local: `localrun quantize`; created: `create`/`cp`
    origin: str = ""  # Hub URL, or the pinned PyPI packages
    pulled_at: Optional[str] = None  # ISO 8601, UTC
    already_present: bool = False  # pull downloaded nothing: every file was already on disk, verified
    mtimes: tuple[Optional[int], ...] = ()  # st_mtime_ns of each file when its hash was last checked (None: unknown)
    settings: dict[str, Any] = field(default_factory=dict, compare=False)  # a created model's: hub.ModelDefaults

    @property
    def path(self) -> Path:
        return self.files[0]

    @property
    def size(self) -> int:
        return sum(self.sizes)

    @property
    def ref(self) -> str:
        return f"{self.name}:{self.quant}" if self.quant else self.name

    def missing_files(self) -> list[Path]:
        """Files that are gone, or whose size changed since the pull."""
        missing = []
        for path, size in zip(self.files, self.sizes, strict=True):
            try:
                if path.stat().st_size != size:
                    missing.append(path)
            except OSError:
                missing.append(path)
        return missing

    def to_record(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "quant": self.quant,
            "repo": self.repo,
            "revision": self.revision,
            "commit": self.commit,
            "source": self.source,
            "origin": self.origin,
            "files": [
                {"path": str(p), "size": n, "sha256": h, **({"mtime_ns": t} if t is not None else {})}
                for p, n, h, t in zip(self.files, self.sizes, self.sha256 or (None,) * len(self.files),
                                      self.mtimes or (None,) * len(self.files), strict=True)
            ],
            "size": self.size,
            "pulled_at": self.pulled_at,
            **({"settings": self.settings} if self.settings else {}),
        }

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> LocalModel:
        files = record["files"]
        return cls(
            name=record["name"],
            quant=record["quant"],
            repo=record.get("repo"),
            revision=record.get("revision"),
            commit=record.get("commit"),
            files=tuple(Path(f["path"]) for f in files),
            sizes=tuple(int(f["size"]) for f in files),
            sha256=tuple(f["sha256"] for f in files),
            source=record["source"],
            origin=record.get("origin", ""),
            pulled_at=record.get("pulled_at"),
            mtimes=tuple(f.get("mtime_ns") for f in files),
            settings=dict(record.get("settings") or {}),
        )


def registry_path() -> Path:
    return paths.home() / "models.json"


def key(name: str, quant: str) -> str:
    return f"{name}:{quant}"


def read() -> dict[str, dict[str, Any]]:
    """The records by NAME:QUANT; {} before the first pull. ConfigError if the file is not a registry."""
    path = registry_path()
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    try:
        data = json.loads(text)
        if data.get("version") != REGISTRY_VERSION or not isinstance(data.get("models"), dict):
            raise ValueError(f"expected version {REGISTRY_VERSION} with a 'models' mapping")
        for record in data["models"].values():
            LocalModel.from_record(record)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ConfigError(f"{path} is damaged ({exc}): delete it and pull your models again") from None
    return data["models"]


def _write(models: dict[str, dict[str, Any]]) -> None:
    text = json.dumps({"version": REGISTRY_VERSION, "models": dict(sorted(models.items()))}, indent=2) + "\n"
    atomic_write_bytes(registry_path(), text.encode("utf-8"))


@contextmanager
def edit() -> Iterator[dict[str, dict[str, Any]]]:
    """Read-modify-write the registry under its lock, so concurrent pulls do not lose each other's records: the
    records are written back when the block ends without an exception."""
    path = registry_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(str(path) + ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # the kernel lets go when the descriptor closes, however the process ends
        models = read()
        yield models
        _write(models)
    finally:
        os.close(fd)


def record(model: LocalModel) -> LocalModel:
    """Record a model whose files were just verified, with their mtimes now (the cheap check on use compares them)."""
    model = replace(model, mtimes=tuple(mtime(p) for p in model.files))
    with edit() as models:
        models[key(model.name, model.quant)] = model.to_record()
    return model


def mtime(path: Path) -> Optional[int]:
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return None


def now() -> str:
    """A record's time stamp: ISO 8601, UTC, to the second."""
    return datetime.now(timezone.utc).replace(microsecond=0).isoformat()
