"""The models on this machine: pulled ones found offline and checked for damage, models made here (`quantize`,
`create`, `cp`), the defaults a model brings, and `rm`.

Integrity on use is checked cheaply: the registry (store.registry) keeps each file's size and mtime as they were
after the hash, and only a file whose size or mtime differs is hashed again (once: the new mtime is recorded if the
hash still matches). A damaged file is refused with a one-line error; `pull` repairs it; `pull --verify` /
`show --verify` hash every file whatever its mtime says.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Optional, Union

from ..console import notice
from ..errors import ConfigError, IntegrityError, LocalrunError, ModelNotFound, UsageError
from ..store import paths, registry
from ..store.files import MODEL_CHUNK as CHUNK, delete_files, hash_file
from ..store.registry import LocalModel
from .refs import ModelRef, parse_ref, quant_of

# The tag of a quant made here (`quantize`) of a model `pull` fetches: smollm2:Q4_0-local, beside the Hub's smollm2:Q4_0.
MADE_HERE_TAG = "-local"


def list_local() -> list[LocalModel]:
    """Every pulled model, by name then quant. Use LocalModel.missing_files() to spot deleted files."""
    return sorted((LocalModel.from_record(r) for r in registry.read().values()), key=lambda m: (m.name.casefold(), m.quant))


def resolve_local(ref: Union[str, ModelRef], verify: bool = False) -> LocalModel:
    """The files for `ref` without touching the network: a pulled model, or a local .gguf path.

    A pulled file that changed since the pull is hashed again and refused if damaged (IntegrityError); `verify`
    hashes every file."""
    mref = parse_ref(ref) if isinstance(ref, str) else ref
    if mref.kind == "path":
        return path_model(mref)
    records = registry.read()
    model = _pick(mref, _candidates(mref, records))
    wanted = mref if mref.quant or mref.entry is None else mref.with_quant(mref.entry.default_quant)
    if model is None:
        if mref.kind == "local" and mref.quant:
            raise no_such_quant(mref, records)
        raise ModelNotFound(f"model '{wanted}' is not pulled: run `localrun pull {wanted}`")
    missing = model.missing_files()
    if missing:
        raise gone_error(model, missing[0])
    damaged = _damaged_files(model, verify)
    if damaged:
        raise _damaged_error(model, damaged)
    return model


def gone_error(model: LocalModel, missing: Path) -> ModelNotFound:
    """A model whose file is gone or changed (size), with the fix for where it came from: pull a pulled one again;
    a created one's FROM file put back (or what it was made from pulled again), or the model made again; a
    quantized one made again."""
    if model.source == "created":
        base = model.origin.removeprefix("FROM ").removeprefix("copy of ")
        again = f"`localrun create {model.name} -f Modelfile`" if model.origin.startswith("FROM ") else f"`localrun cp {base} {model.name}`"
        if Path(base).is_absolute():  # FROM a file
            return ModelNotFound(f"model '{model.ref}' was made from {base}, which is gone or changed: put it back, or make the model "
                                 f"again ({again})")
        return ModelNotFound(f"model '{model.ref}' was made from {base}, whose file {missing} is gone or changed: "
                             f"`localrun pull {base}` fetches it again (or make the model again: {again})")
    if model.source == "local":
        return ModelNotFound(f"model '{model.ref}' was made here ({model.origin}) and {missing} is gone or changed: make it "
                             f"again with `localrun quantize`")
    return ModelNotFound(f"model '{model.ref}' was pulled but {missing} is gone or changed: run `localrun pull {model.ref}` again")


def no_such_quant(mref: ModelRef, records: dict) -> ModelNotFound:
    """A model made here (quantize, create) named with a quant it was not made in: the ones it has."""
    others = _candidates(mref.with_quant(None), records)
    return ModelNotFound(f"'{mref.name}' has no quant {mref.quant} here (it has {', '.join(sorted(m.quant or 'latest' for m in others))}): "
                         f"name one of those, or make it with `localrun quantize {mref.name} {mref.quant}`")


def already_present(mref: ModelRef, verify: bool = False, *, made: bool = True) -> Optional[LocalModel]:
    """The registry's record for `mref` if its files are all on disk and undamaged: no network needed (`made`
    False: a pulled one, not one made here by `quantize`, which never stands in for the file a source publishes).
    A damaged file is said on stderr; the caller fetches it again (the Hub cache and the mirror re-verify theirs)."""
    model = _pick(mref, [m for m in _candidates(mref, registry.read()) if made or m.source not in registry.MADE_HERE])
    if model is None or model.missing_files():
        return None
    damaged = _damaged_files(model, verify)
    if damaged:
        if damaged[0] not in _said_damaged:  # pull() asks before and after a source resolves the reference
            _said_damaged.add(damaged[0])
            notice(f"{damaged[0]} is damaged (sha256 differs from the pull): fetching it again")
        return None
    return replace(model, already_present=True)


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
        return next((m for m in found if m.quant.upper() == mref.quant), None)  # (Q4_0-local: as it was written)
    if mref.entry is not None:
        default = next((m for m in found if m.quant == mref.entry.default_quant), None)
        if default is not None:
            return default
    made = [m for m in found if not m.quant]  # a created model is its name itself (NAME:latest), beside NAME:Q8_0
    if len(made) == 1:                        # that `quantize NAME Q8_0` made of it
        return made[0]
    if len(found) > 1:
        quants = ", ".join(sorted(m.quant for m in found))
        raise UsageError(f"'{mref}' is pulled in several quants ({quants}): name one, e.g. `{mref.with_quant(found[0].quant)}`")
    return found[0] if found else None


def path_model(mref: ModelRef) -> LocalModel:
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


# --------------------------------------------------------------------------------------------------------------------
# Damage


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
            _hashed[key] = hash_file(path, chunk=CHUNK)[0]
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


# --------------------------------------------------------------------------------------------------------------------
# Made here


def register_local(name: str, quant: str, path: Path, sha256: str, *, origin: str) -> LocalModel:
    """Record a model made here (`localrun quantize`) like a pulled one: `list` shows it, NAME:QUANT finds it."""
    model = LocalModel(name=name, quant=quant, repo=None, revision=None, commit=None, files=(path,),
                       sizes=(path.stat().st_size,), sha256=(sha256,), source="local", origin=origin, pulled_at=registry.now())
    return registry.record(model)


_NAME_RE = re.compile(r"^[A-Za-z0-9][\w.-]*$")


def register_created(name: str, base: LocalModel, defaults: ModelDefaults, *, origin: str) -> LocalModel:
    """Record a model made from `base`'s files with its own defaults (`create`, `cp`): `list` and /api/tags show
    it and NAME (or Ollama's NAME:latest) runs it. Its files stay `base`'s: nothing is copied, and `rm` of
    either leaves the files the other uses. A created model of the same name is replaced, as Ollama's create
    replaces it."""
    name = created_name(name)
    sha256 = base.sha256 or tuple(hash_file(p, chunk=CHUNK)[0] for p in base.files)  # a path: hashed once, now
    model = LocalModel(name=name, quant="", repo=base.repo, revision=base.revision, commit=base.commit, files=base.files,
                       sizes=base.sizes, sha256=sha256, source="created", origin=origin, pulled_at=registry.now(),
                       settings=defaults.to_settings())
    model = replace(model, mtimes=tuple(registry.mtime(p) for p in model.files))
    with registry.edit() as models:
        for key, record in list(models.items()):
            # NAME is replaced; NAME:QUANT made of it by `quantize` stays (NAME picks the created one)
            if record["name"].casefold() == name.casefold():
                if record["source"] != "created" and record.get("quant"):
                    continue
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
    from .catalogue import catalogue

    if any(alias.casefold() == name.casefold() for alias in catalogue().models):
        raise UsageError(f"'{name}' is a catalogue alias (`localrun list --available`): choose another name")
    return name


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
    adapters: tuple[tuple[str, float], ...] = ()  # LoRA adapters (a Modelfile's ADAPTER lines): absolute path, scale
    rerank: bool = False  # a reranker (catalogue): loaded for rank pooling (runtime.rerank)

    def to_settings(self) -> dict[str, Any]:
        out = {"sampling": dict(self.sampling), "system": self.system, "context": self.context, "template": self.template,
               "messages": [dict(m) for m in self.messages], "license": self.license, "embedding": self.embedding,
               "draft": self.draft, "adapters": [[path, scale] for path, scale in self.adapters]}
        return {k: v for k, v in out.items() if v not in (None, {}, [], False)}

    @classmethod
    def from_settings(cls, settings: dict[str, Any]) -> ModelDefaults:
        return cls(sampling=dict(settings.get("sampling") or {}), system=settings.get("system"), context=settings.get("context"),
                   template=settings.get("template"), messages=tuple(settings.get("messages") or ()),
                   license=settings.get("license"), embedding=bool(settings.get("embedding")), made=True,
                   draft=settings.get("draft"),
                   adapters=tuple((str(path), float(scale)) for path, scale in settings.get("adapters") or ()))


def defaults_for(ref: str) -> ModelDefaults:
    """The defaults the model `ref` names brings (none for a repo, a path, or a name nothing knows)."""
    name = ref.split(":", 1)[0]
    alias = name.split("@", 1)[0]
    entry = None
    if not ("/" in alias or alias.lower().endswith(".gguf")):  # a path or a repository names no alias (entry_for's
        from .catalogue import entry_for  # own test), and its run need not import the catalogue, yaml and its models

        entry = entry_for(ref)
    if entry is not None:
        return ModelDefaults(sampling=dict(entry.sampling), system=entry.system, context=entry.context,
                             license=entry.license, embedding=entry.embedding, draft=entry.draft, rerank=entry.rerank)
    if "/" in name or name.lower().endswith(".gguf") or not name:
        return ModelDefaults()
    try:
        record = next((r for r in registry.read().values() if r["source"] == "created" and r["name"].casefold() == name.casefold()), None)
    except ConfigError:
        return ModelDefaults()
    return ModelDefaults.from_settings(record.get("settings") or {}) if record else ModelDefaults()


# --------------------------------------------------------------------------------------------------------------------
# Removal


def record_ref(ref: Union[str, ModelRef]) -> Optional[str]:
    """The name a pulled or made model is registered under (OWNER/REPO:QUANT, an alias's, NAME for NAME:latest),
    without checking its files; None when no such model is registered (or `ref` is a path)."""
    try:
        mref = parse_ref(ref) if isinstance(ref, str) else ref
    except LocalrunError:
        return None
    if mref.kind == "path":
        return None
    try:
        model = _pick(mref, _candidates(mref, registry.read()))
    except LocalrunError:  # several quants pulled: remove names one
        return None
    return model.ref if model is not None else None


def remove(ref: Union[str, ModelRef]) -> list[Path]:
    """Delete a pulled model's files (Hub cache snapshot links and blobs, or mirror files) and forget it.

    Files another registry record still uses are kept; a created model's files are its base's, never deleted.
    Returns the paths deleted.
    """
    from .sources import PULL_ORDER, source_by_name

    mref = parse_ref(ref) if isinstance(ref, str) else ref
    if mref.kind == "path":
        raise UsageError(f"localrun only removes models it pulled; delete {mref.path} yourself if you mean to")
    with registry.edit() as models:
        model = _pick(mref, _candidates(mref, models))
        if model is None:
            raise ModelNotFound(f"model '{mref}' is not pulled: `localrun list` shows what is")
        del models[registry.key(model.name, model.quant)]
        still_used = {Path(f["path"]) for r in models.values() for f in r["files"]}
        if model.source in PULL_ORDER:
            return source_by_name(model.source).delete(model, still_used)
        if model.source == "local":
            return delete_files(model.files, still_used, paths.home() / "quantized")
    return []
