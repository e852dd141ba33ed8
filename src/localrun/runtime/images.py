"""Images for a request: image files read into engine.vision.Image, and the projector (mmproj GGUF) that lets a
loaded model read them: the one named, else the one beside the model's file."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Optional

from ..errors import LocalrunError, UsageError
from .loader import Loaded


class ImageNotFound(LocalrunError):
    """An image file that is not there (or not readable): `path` as given."""

    def __init__(self, path: str, reason: str):
        super().__init__(f"{path}: {reason}")
        self.path = path


def read_images(paths: Sequence[Path | str]) -> list:
    """The files' bytes as engine.vision.Image, named as given. Whether they are images llama.cpp can read is
    known once the projector decodes them (engine.vision.BadImage)."""
    from ..engine.vision import Image

    images = []
    for path in paths:
        name = str(path)
        try:
            data = Path(path).read_bytes()
        except FileNotFoundError:
            raise ImageNotFound(name, "no such file: check the --image path") from None
        except IsADirectoryError:
            raise UsageError(f"{name}: a directory, not an image file") from None
        except OSError as exc:
            raise ImageNotFound(name, f"cannot read it ({exc.strerror or exc})") from None
        images.append(Image(data, name))
    return images


def check_projector(mmproj: Optional[Path | str]) -> None:
    """--mmproj checked before any model loads."""
    if mmproj is not None and not Path(mmproj).is_file():
        raise UsageError(f"invalid --mmproj {mmproj}: no such file")


def projector_beside(model_paths: Sequence[Path]) -> Optional[Path]:
    """The projector next to a model's file (llama.cpp's and the Hub's naming: mmproj*.gguf), where there is
    exactly one; several are ambiguous (--mmproj names one). `model_paths`: the file as named and as it
    resolves (a link's folder first: the Hub's cache links a snapshot's files to blobs without names)."""
    for model_path in model_paths:
        found = sorted(p for p in model_path.parent.glob("mmproj*.gguf") if p.is_file() and p.resolve() != model_path.resolve())
        if len(found) > 1:
            raise UsageError(f"{len(found)} projectors beside {model_path.name} ({', '.join(p.name for p in found)}):"
                             " pick one with --mmproj")
        if found:
            return found[0]
    return None


def attach_projector(loaded: Loaded, mmproj: Optional[Path | str], model: Optional[str] = None) -> None:
    """Load the projector for `loaded`'s model: `mmproj`, else the one beside its file (`model`: the model as
    the user named it, where that is a path). UsageError when there is none."""
    paths = [loaded.engine.path]
    if model is not None and Path(model).expanduser().is_file():
        paths.insert(0, Path(model).expanduser())
    path = Path(mmproj) if mmproj is not None else projector_beside(paths)
    if path is None:
        raise UsageError(f"{loaded.name} has no image projector beside it (mmproj-*.gguf): pass --mmproj FILE")
    loaded.engine.load_projector(path)
