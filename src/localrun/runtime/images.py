"""Images for a request: image files read into engine.vision.Image, images sent in a request body (base64, data
URLs), and the projector (mmproj GGUF) that lets a loaded model read them: the one named (run --mmproj, or
serve MODEL --mmproj for that model), else the one beside the model's file."""

from __future__ import annotations

import base64
import binascii
import hashlib
import sys
import threading
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Optional

from ..engine.vision import BadImage, Image  # noqa: F401 - (BadImage: the request's own fault, which the edges word)
from ..errors import LocalrunError, Phrase, SessionError, SettingError, UsageError


class NoProjector(UsageError):
    """Images for a model loaded without a vision projector, none named for it and none beside its file:
    `model` its file's name, `image` the first image's name. Each HTTP dialect words its own remedy (serve.errors)."""

    def __init__(self, model: str, image: str):
        super().__init__(Phrase("{image}: {model} was loaded without an image projector: pass {mmproj} FILE"
                                " (the mmproj-*.gguf made for this model)", image=image, model=model))
        self.model, self.image = model, image


class ImageNotFound(LocalrunError):
    """An image file that is not there (or not readable): `path` as given."""

    def __init__(self, path: str, reason: "str | Phrase"):
        super().__init__(Phrase("{path}: {reason}", path=path, reason=reason))
        self.path = path


def read_images(paths: Sequence[Path | str]) -> list:
    """The files' bytes as engine.vision.Image, named as given. Whether they are images llama.cpp can read is
    known once the projector decodes them (engine.vision.BadImage)."""
    from ..engine.vision import Image

    images = []
    for path in paths:
        name = str(path)
        if name == "-":  # piped: `cat photo.png | localrun run MODEL --image - "What is this?"`
            if sys.stdin is None or sys.stdin.isatty():
                raise UsageError(Phrase("{image} - reads the image from stdin, and nothing is piped: pipe it, or give its path"))
            images.append(Image(sys.stdin.buffer.read(), "stdin"))
            continue
        try:
            data = Path(path).read_bytes()
        except FileNotFoundError:
            raise ImageNotFound(name, Phrase("no such file: check the {image} path")) from None
        except IsADirectoryError:
            raise UsageError(f"{name}: a directory, not an image file") from None
        except OSError as exc:
            raise ImageNotFound(name, f"cannot read it ({exc.strerror or exc})") from None
        images.append(Image(data, name))
    return images


def image_from_base64(text: str, name: str):
    """An image sent as base64 (Ollama's `images`, Anthropic's base64 source) as engine.vision.Image named
    `name` (the request field it came in); engine.vision.BadImage when it is not base64."""
    from ..engine.vision import Image

    if not isinstance(text, str):
        raise BadImage(name, "not a base64 string")
    try:
        data = base64.b64decode("".join(text.split()), validate=True)
    except (binascii.Error, ValueError):
        raise BadImage(name, "not valid base64 (send the image file's bytes base64-encoded)") from None
    return Image(data, name)


def image_from_url(url: str, name: str):
    """An image sent as a URL (OpenAI's image_url, the Responses API's input_image): a data: URL with base64
    content. A remote URL is refused (engine.vision.BadImage): the server fetches nothing on a client's
    behalf (it may run where nothing outside can be reached, and a fetch would reach what the client cannot)."""
    if not isinstance(url, str):
        raise BadImage(name, "not a URL string")
    head, comma, payload = url.partition(",")
    if url[:5].lower() == "data:" and comma:
        if not head.lower().endswith(";base64"):
            raise BadImage(name, "a data: URL without ;base64 (send data:image/png;base64,...)")
        return image_from_base64(payload, name)
    if url[:7].lower() == "http://" or url[:8].lower() == "https://":
        raise BadImage(name, "a remote URL, which localrun does not fetch: send the image itself as a data: URL"
                             " (data:image/png;base64,...)")
    raise BadImage(name, f"not a data: URL ({url[:20]!r}...): send data:image/png;base64,...")


_named: dict[str, Path] = {}  # serve MODEL --mmproj FILE: the model as named -> its projector
_attaching = threading.Lock()


def name_projector(model: str, mmproj: Path | str) -> None:
    """The projector for `model`'s images in this process (serve MODEL --mmproj FILE): loaded with the first
    request that brings an image (a server loads models as requests name them)."""
    check_projector(mmproj)
    _named[model] = Path(mmproj)


def use_projector(engine, mmproj: Optional[Path | str], name: str, ref: str) -> None:
    """A request's --mmproj for `engine`'s model (run, chat; in this process or on a resident server): named
    for it while none is loaded (loaded with the first image), refused when another one is loaded."""
    if mmproj is None:
        return
    if engine.vision is None:
        name_projector(str(engine.path), mmproj)
    elif engine.vision.path.resolve() != Path(mmproj).resolve():
        raise UsageError(Phrase("{name} is loaded with the projector {loaded}, not {mmproj} {given}: stop it first"
                                " (localrun stop {ref}), or leave {mmproj} out", name=name, loaded=engine.vision.path,
                                given=mmproj, ref=ref))


def projector_for(engine):
    """The engine's vision projector, loaded now when it has none: the one named for its model
    (name_projector), else the one beside its file. NoProjector when there is none (the caller knows
    which image asked); UsageError when several lie beside it."""
    if engine.vision is not None:
        return engine.vision
    with _attaching:  # two first requests with images: one load
        if engine.vision is None:
            path = _named_for(engine.path) or projector_beside([engine.path])
            if path is not None:
                engine.load_projector(path)
    return engine.vision


def _named_for(model_path: Path) -> Optional[Path]:
    for model, mmproj in _named.items():
        given = Path(model).expanduser()
        if not given.is_file():
            try:
                from .. import hub

                given = hub.resolve_local(model).path
            except LocalrunError:
                continue
        if given.resolve() == Path(model_path).resolve():
            return mmproj
    return None


def check_projector(mmproj: Optional[Path | str]) -> None:
    """--mmproj checked before any model loads."""
    if mmproj is not None and not Path(mmproj).is_file():
        raise UsageError(Phrase("invalid {mmproj} {path}: no such file", path=mmproj))


def projector_beside(model_paths: Sequence[Path]) -> Optional[Path]:
    """The projector next to a model's file (llama.cpp's and the Hub's naming: mmproj*.gguf), where there is
    exactly one; several are ambiguous (--mmproj names one). `model_paths`: the file as named and as it
    resolves (a link's folder first: the Hub's cache links a snapshot's files to blobs without names)."""
    for model_path in model_paths:
        found = sorted(p for p in model_path.parent.glob("mmproj*.gguf") if p.is_file() and p.resolve() != model_path.resolve())
        if len(found) > 1:
            raise UsageError(Phrase("{n} projectors beside {model} ({found}): pick one with {mmproj}", n=len(found),
                                    model=model_path.name, found=", ".join(p.name for p in found)))
        if found:
            return found[0]
    return None


def attach_projector(loaded, mmproj: Optional[Path | str], model: Optional[str] = None) -> None:
    """Load the projector for `loaded`'s model (a runtime.loader.Loaded): `mmproj`, else the one beside its file (`model`: the model as
    the user named it, where that is a path). UsageError when there is none."""
    paths = [loaded.engine.path]
    if model is not None and Path(model).expanduser().is_file():
        paths.insert(0, Path(model).expanduser())
    path = Path(mmproj) if mmproj is not None else projector_beside(paths)
    if path is None:
        raise UsageError(Phrase("{name} has no image projector beside it (mmproj-*.gguf): pass {mmproj} FILE",
                                name=loaded.name))
    loaded.engine.load_projector(path)


# -- images in a conversation's messages, as JSON keeps them (a session's, the resident server's wire) ------------


def stored(messages: Sequence[dict], *, leave_out: Collection[str] = ()) -> list[dict]:
    """The messages as JSON keeps them (a session's, the resident server's wire): each image as stored_images
    gives it."""
    return [{**m, "images": stored_images(m["images"], leave_out=leave_out)} if m.get("images") else m for m in messages]


def stored_images(images: Sequence[Image], *, leave_out: Collection[str] = ()) -> list[dict]:
    """Each image as {"sha256", "name", "data": base64 of its bytes}, without "data" for the digests in
    `leave_out` (the other side has them)."""
    out = []
    for image in images:
        digest = image.digest.hex()
        out.append({"sha256": digest, "name": image.name} | ({} if digest in leave_out else {"data": base64.b64encode(image.data).decode()}))
    return out


def live(messages: Sequence[dict], known: Mapping[str, Image] = {}) -> list[dict]:
    """`stored` messages with engine.vision.Image again (live_images)."""
    return [{**m, "images": live_images(m["images"], known)} if m.get("images") else dict(m) for m in messages]


def live_images(items: Sequence, known: Mapping[str, Image] = {}) -> list[Image]:
    """`stored_images` as engine.vision.Image: `known`'s of its sha256, else from its data. SessionError
    when neither gives bytes of that sha256 (a damaged session, or a client that left out data the server no
    longer has)."""
    images = []
    for item in items:
        if isinstance(item, Image):
            images.append(item)
            continue
        if not isinstance(item, dict):
            raise UsageError("an image of the conversation is not an object with sha256, name and data")
        digest, name = str(item.get("sha256")), str(item.get("name") or "image")
        if digest in known and known[digest].name == name:  # by its hash, as llama-server keys its images: not decoded again
            images.append(known[digest])
            continue
        if "data" not in item:
            if digest not in known:
                raise SessionError(f"{name}: an image of the conversation (sha256 {digest[:12]}) whose bytes were not given")
            images.append(Image(known[digest].data, name))
            continue
        try:
            data = base64.b64decode(item["data"], validate=True)
        except (binascii.Error, ValueError, TypeError):
            raise SessionError(f"{name}: an image of the conversation whose bytes are not base64") from None
        if hashlib.sha256(data).hexdigest() != digest:
            raise SessionError(f"{name}: an image of the conversation whose bytes do not match its sha256 {digest[:12]}")
        images.append(Image(data, name))
    return images


def images_in(messages: Sequence[dict]) -> dict[str, Image]:
    """The messages' images by the hex sha256 of their bytes (what `live` knows without their data)."""
    return {image.digest.hex(): image for m in messages for image in m.get("images") or () if isinstance(image, Image)}
