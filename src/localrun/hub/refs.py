"""Model references: what a name on the command line (or in an API request) means.

A reference is one of
    ALIAS[@REVISION][:QUANT]        an entry of models.yaml (Ollama's NAME:TAG for an alias NAME-TAG too)
    OWNER/REPO[@REVISION][:QUANT]   any Hugging Face repository with .gguf files (hf.co/OWNER/REPO too)
    NAME[:latest]                   a model made here (`quantize`, `create`, `cp`), known to the registry only
    PATH                            an existing local file

Parsing needs no network: aliases come from the catalogue, made models from the registry.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Optional

from ..errors import ModelNotFound, UnknownModel, UsageError
from ..store import registry

if TYPE_CHECKING:
    from .catalogue import ModelEntry

# A quant as GGUF file names spell it (Q4_K_M, IQ3_XXS, Q8_0, F16, ...), between non-alphanumerics.
_QUANT_RE = re.compile(
    r"(?<![a-z0-9])("
    r"iq\d+_(?:xxs|xs|s|m|nl|l)"
    r"|q\d+_k(?:_(?:xl|s|m|l))?"
    r"|q\d+_\d+(?:_\d+_\d+)?"
    r"|tq\d+_\d+"
    r"|q\d+"
    r"|bf16|fp16|f16|f32|mxfp4"
    r")(?![a-z0-9])",
    re.IGNORECASE,
)
SHARD_RE = re.compile(  # a shard of a split model: NAME-00001-of-00003.gguf
    r"^(?P<stem>.+)-(?P<index>\d{5})-of-(?P<count>\d{5})\.gguf$", re.IGNORECASE)
_REPO_RE = re.compile(r"^[\w.-]+/[\w.-]+$")
_QUANT_ARG_RE = re.compile(r"^[\w.-]+$")


@dataclass(frozen=True)
class ModelRef:
    """A parsed model reference. `quant` is upper-case, or None when the reference names none."""

    kind: Literal["alias", "repo", "path", "local"]  # local: a name only the registry knows (made here: quantize, create, cp)
    name: str  # alias, owner/repo, or the path as given
    quant: Optional[str] = None
    revision: Optional[str] = None
    path: Optional[Path] = None
    entry: Optional[ModelEntry] = field(default=None, compare=False, repr=False)

    @property
    def repo(self) -> Optional[str]:
        if self.kind == "alias":
            return self.entry.repo if self.entry else None
        return self.name if self.kind == "repo" else None

    def with_quant(self, quant: Optional[str]) -> ModelRef:
        return replace(self, quant=quant)

    def __str__(self) -> str:
        if self.kind == "path":
            return self.name
        text = self.name + (f"@{self.revision}" if self.revision else "")
        return text + (f":{self.quant}" if self.quant else "")


_HUB_HOSTS = ("hf.co/", "huggingface.co/", "www.huggingface.co/")


def _without_hub_host(text: str) -> str:
    """Ollama's form of a Hub model, `hf.co/OWNER/REPO[:QUANT]` (also huggingface.co and a URL), as
    OWNER/REPO[:QUANT]; its default tag `:latest` means no quant named."""
    bare = text.removeprefix("https://").removeprefix("http://")
    host = next((h for h in _HUB_HOSTS if bare.lower().startswith(h)), None)
    if host is None or Path(text).expanduser().is_file():
        return text
    bare = bare[len(host):]
    return bare[: -len(":latest")] if bare.lower().endswith(":latest") else bare


def parse_ref(ref: str) -> ModelRef:
    """Parse a model reference (see the module docstring). Raises ModelNotFound for unknown aliases or missing files."""
    text = _without_hub_host(ref.strip())
    if not text:
        raise UsageError("empty model reference: give an alias (see `localrun list --available`), owner/repo[:QUANT] or a .gguf path")
    path = Path(text).expanduser()
    # A bare word is an alias even if a file of that name happens to be in the current folder.
    looks_like_path = text.lower().endswith(".gguf") or "/" in text or os.sep in text
    if looks_like_path and path.is_file():
        return ModelRef(kind="path", name=text, path=path.resolve())
    # A folder: named as a file (x.gguf) or as no repository could be (./models, /data/models/): said so, with
    # what it holds. owner/name stays a repository even where a folder of that name is here.
    if looks_like_path and path.is_dir() and (text.lower().endswith(".gguf") or text.startswith((".", "/", "~"))
                                              or not _REPO_RE.match(text)):
        inside = sorted(p.name for p in path.glob("*.gguf"))
        raise UsageError(f"{text} is a folder, not a .gguf file: "
                         + (f"name a file in it, e.g. {os.path.join(text, inside[0])}" if inside
                            else "give the path of the model's .gguf file (it holds none)"))
    if text.lower().endswith(".gguf"):
        raise ModelNotFound(f"no such file: {text}: check the path, or use an alias or owner/repo[:QUANT]")

    name, _, quant = text.partition(":")
    tagged = _tagged_alias(name, quant)
    if tagged is not None:  # Ollama's NAME:TAG for an alias NAME-TAG (qwen2.5-coder:1.5b)
        name, quant = tagged, ""
    name, _, revision = name.partition("@")
    if not name or (":" in text and not quant and tagged is None) or ("@" in text and not revision):
        raise UsageError(f"malformed model reference '{ref}': expected ALIAS[:QUANT], owner/repo[@REVISION][:QUANT] or a .gguf path")
    if quant and not _QUANT_ARG_RE.match(quant):
        raise UsageError(f"malformed quant '{quant}' in '{ref}': expected a name like Q4_K_M")
    norm_quant = quant.upper() if quant else None

    if "/" in name:
        if not _REPO_RE.match(name):
            raise UsageError(f"malformed repository '{name}': expected owner/name (letters, digits, '-', '_', '.')")
        return ModelRef(kind="repo", name=name, quant=norm_quant, revision=revision or None)

    from .catalogue import catalogue  # (here: a path, a repository never read it; yaml and its models, 20 ms)

    models = catalogue().models
    alias = name if name in models else next((a for a in models if a.casefold() == name.casefold()), None)
    if alias is None:
        named = [r for r in registry.read().values() if r["source"] in registry.MADE_HERE and r["name"].casefold() == name.casefold()]
        made = next((r for r in named if r["source"] == "created"), named[0] if named else None)  # NAME beside NAME:Q8_0
        if made is not None:
            if made["source"] == "created" and norm_quant == "LATEST":  # Ollama's default tag: the model itself
                norm_quant = None
            return ModelRef(kind="local", name=made["name"], quant=norm_quant, revision=revision or None)
        # Ollama's family names (llama3.2, qwen2.5:0.5b) for the catalogue's sized aliases (llama3.2-1b, ...)
        raise UnknownModel(name, sorted(a for a in models if a.casefold().startswith(name.casefold() + "-")))
    if norm_quant == "LATEST":  # Ollama's default tag: the alias's default quant
        norm_quant = None
    return ModelRef(kind="alias", name=alias, quant=norm_quant, revision=revision or None, entry=models[alias])


def _tagged_alias(name: str, tag: str) -> Optional[str]:
    """The catalogue alias NAME-TAG that Ollama's NAME:TAG names (its tags are sizes: qwen2.5-coder:1.5b,
    llama3.2:1b), where TAG is no quant; None otherwise."""
    if not tag or "/" in name or "@" in name or _QUANT_ARG_RE.match(tag) and quant_of(f"x-{tag}.gguf") is not None:
        return None
    from .catalogue import catalogue

    wanted = f"{name}-{tag}".casefold()
    return next((a for a in catalogue().models if a.casefold() == wanted), None)


def quant_of(filename: str) -> Optional[str]:
    """The quant named in a GGUF file name (upper-case), e.g. 'model-Q4_K_M-00001-of-00002.gguf' -> 'Q4_K_M'."""
    base = filename.rsplit("/", 1)[-1]
    shard = SHARD_RE.match(base)
    stem = shard.group("stem") if shard else re.sub(r"\.gguf$", "", base, flags=re.IGNORECASE)
    found = _QUANT_RE.findall(stem)
    return found[-1].upper() if found else None


def names_quant(filename: str, quant: str) -> bool:
    """Whether a file name carries `quant` as a token: its parsed quant, or the literal text between delimiters."""
    if quant_of(filename) == quant:
        return True
    base = filename.rsplit("/", 1)[-1]
    # The right delimiter excludes '_' so that Q4_K does not match Q4_K_M.
    return re.search(rf"(?:^|[._-]){re.escape(quant)}(?:[.-]|$)", base, re.IGNORECASE) is not None
