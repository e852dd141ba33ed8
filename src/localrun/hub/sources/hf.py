"""The Hugging Face Hub as a source: list a repository at a revision, pick the files a reference means (a quant,
its shards, a vision model's projector), download them into the huggingface_hub cache and verify them.

Files land where every Hub tool looks (HF_HOME, HF_HUB_CACHE, HF_ENDPOINT, HF_TOKEN and HF_HUB_OFFLINE apply as
for every other Hub tool), pinned to the commit the revision resolved to. A file is checked against the sha256
the Hub publishes (or its git blob hash) before anything in the cache looks complete; a plain HTTP download
resumes from a partial file that outlives the process, a Xet-stored one goes through huggingface_hub's Xet client.
huggingface_hub is imported only inside the functions that call it: `localrun --help` does not pay for it.
"""

from __future__ import annotations

import fnmatch
import os
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional

from ... import __version__
from ...errors import DownloadError, IntegrityError, ModelNotFound, QuantNotFound, UsageError
from ...store import registry
from ...store.files import MODEL_CHUNK as CHUNK, fsync_dir, fsync_file, hash_file, prune_empty_dirs
from ...store.registry import LocalModel
from ..progress import Bars, Progress
from ..refs import SHARD_RE, ModelRef, names_quant, quant_of
from . import RemoteFile, Resolved, Unavailable

if TYPE_CHECKING:
    from huggingface_hub import HfFileMetadata


# Quant pulled from a repository that offers several, when the reference names none.
PREFERRED_QUANT = "Q4_K_M"


class HubSource:
    """The Hugging Face Hub, or the Hub-compatible server HF_ENDPOINT names."""

    name = "hub"

    def offers(self, mref: ModelRef) -> Optional[str]:
        return f"the Hub ({mref.repo})" if mref.repo else None

    def resolve(self, mref: ModelRef) -> Resolved:
        repo = mref.repo
        assert repo is not None
        revision = mref.revision or (mref.entry.revision if mref.entry else "main")
        repo_id, commit, listing = _list_repo(repo, revision)
        quant, chosen = _select(mref, repo_id, listing)
        name = mref.name if mref.kind == "alias" else repo_id
        projector = _projector(mref, listing)  # a vision model's: fetched with it, beside it, as llama-server -hf does
        return Resolved(ref=replace(mref, name=name, quant=quant), files=tuple(chosen + ([projector] if projector else [])),
                        repo=repo_id, revision=revision, commit=commit)

    def fetch(self, found: Resolved, progress: Progress, *, verbose: bool = False) -> LocalModel:
        name, quant, repo_id, commit, revision = found.ref.name, found.ref.quant or "", found.repo, found.commit, found.revision
        assert repo_id is not None and commit is not None and revision is not None
        files: list[Path] = []
        digests: list[str] = []
        downloaded = False
        with Bars(progress) as bars:
            for remote in found.files:
                path, digest, fetched = _fetch_verified(repo_id, commit, remote, bars, f"{name}:{quant}")
                files.append(path)
                digests.append(digest)
                downloaded |= fetched
        _remember_revision(files[0], revision, commit)
        sizes = tuple(p.stat().st_size for p in files)
        model = LocalModel(
            name=name,
            quant=quant,
            repo=repo_id,
            revision=revision,
            commit=commit,
            files=tuple(files),
            sizes=sizes,
            sha256=tuple(digests),
            source="hub",
            origin=f"{_endpoint()}/{repo_id}",
            pulled_at=registry.now(),
            already_present=not downloaded,
        )
        return registry.record(model)

    def delete(self, model: LocalModel, keep: set[Path]) -> list[Path]:
        keep_blobs = {Path(os.path.realpath(p)) for p in keep}
        deleted: list[Path] = []
        for path in model.files:
            if path not in keep:
                deleted += _remove_cached_file(path, keep_blobs)
        return deleted


def _unreachable(detail: str, failing: bool = False) -> Unavailable:
    return Unavailable(detail, failing=failing, title="the Hub", where=f"the Hub at {_endpoint()}",
                       advice="try again later, check the network, unset HF_HUB_OFFLINE, "
                              "or set HF_ENDPOINT to a reachable Hub mirror")


# --------------------------------------------------------------------------------------------------------------------
# Asking the Hub


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
    """Run a huggingface_hub call, turning its errors into localrun's (or Unavailable)."""
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
            raise _unreachable(f"HTTP {status} while {what}", failing=True) from exc
        raise DownloadError(f"{what}: the Hub answered HTTP {status}: check HF_TOKEN and HF_ENDPOINT") from exc
    except _network_errors() as exc:
        raise _unreachable(_describe(exc)) from exc
    except OSError as exc:
        if exc.errno is not None:
            raise  # disk full, permissions: reported as such
        # huggingface_hub's "Consistency check failed: file should be of size ..." (a short transfer).
        raise DownloadError(f"{what}: {str(exc).splitlines()[0]}: run the pull again") from exc


def _list_repo(repo: str, revision: str) -> tuple[str, str, list[RemoteFile]]:
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
        RemoteFile(
            name=s.rfilename,
            size=(s.lfs.size if s.lfs else s.size),
            sha256=(s.lfs.sha256 if s.lfs else None),
            git_sha1=(None if s.lfs else s.blob_id),
        )
        for s in (info.siblings or [])
    ]
    return info.id or repo, info.sha, files


# --------------------------------------------------------------------------------------------------------------------
# Choosing the files


def _gguf_files(files: list[RemoteFile]) -> list[RemoteFile]:
    # Multimodal projectors are companions of a model, never the model itself.
    return [f for f in files if f.name.lower().endswith(".gguf") and "mmproj" not in f.name.rsplit("/", 1)[-1].lower()]


def _available_quants(files: list[RemoteFile]) -> list[str]:
    quants = {quant_of(f.name) or SHARD_RE.sub(r"\g<stem>", f.name.rsplit("/", 1)[-1]) for f in _gguf_files(files)}
    return sorted(quants)


_PROJECTOR_PREFERENCE = ("f16", "bf16", "q8_0", "f32")  # the projector's precision, best first (llama.cpp's repos ship F16)


def _projector(mref: ModelRef, files: list[RemoteFile]) -> Optional[RemoteFile]:
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

    def rank(f: RemoteFile) -> tuple[int, str]:
        base = f.name.rsplit("/", 1)[-1].lower()
        return next((i for i, p in enumerate(_PROJECTOR_PREFERENCE) if re.search(rf"(?:^|[._-]){p}(?:[._-]|$)", base)),
                    len(_PROJECTOR_PREFERENCE)), f.name

    return min(found, key=rank)


def _one_model(files: list[RemoteFile], what: str) -> list[RemoteFile]:
    """Order the files of a single (possibly sharded) model; refuse several models or missing shards."""
    groups: dict[str, list[tuple[int, int, RemoteFile]]] = {}
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


def _select(mref: ModelRef, repo: str, files: list[RemoteFile]) -> tuple[str, list[RemoteFile]]:
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


# --------------------------------------------------------------------------------------------------------------------
# Downloading into the cache


def _fetch_verified(repo: str, commit: str, remote: RemoteFile, bars: Bars, ref: str) -> tuple[Path, str, bool]:
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


def _download_with_xet(repo: str, commit: str, remote: RemoteFile, bars: Bars, task: Optional[int]) -> Path:
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
    cache: _CachePaths, url: str, meta: HfFileMetadata, remote: RemoteFile, bars: Bars, task: Optional[int], ref: str
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


def _verify(path: Path, remote: RemoteFile, bars: Bars, task: Optional[int], ref: str) -> str:
    """The sha256 of `path` if it matches what the Hub publishes for `remote` (the LFS sha256, or the git blob hash of
    a file stored in git itself); IntegrityError if it does not."""
    bars.verifying(task, remote.size)
    digest, git_sha1 = hash_file(path, git=remote.sha256 is None, on_chunk=lambda n: bars.advance(task, n), chunk=CHUNK)
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
        prune_empty_dirs(pointer.parent, snapshots)


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
        prune_empty_dirs(pointer.parent, snapshots)
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
