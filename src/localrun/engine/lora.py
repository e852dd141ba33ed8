"""LoRA adapters: their GGUF files read and checked against a model before llama.cpp sees either, the
`FILE[:SCALE]` form the command line and a Modelfile give them in, and the key a KV state made under adapters
is known by.

llama.cpp applies adapters per context (llama_set_adapters_lora: one set of adapters and scales for a whole
batch), so that what a sequence holds in its KV depends on the scales it was evaluated under: `lora_key` names
them, engine.kv keeps it per sequence, and a prefix, a slot or a saved state made under other scales is never
reused (a scale of 0 is no adapter at all: llama.cpp leaves it out of the graph, and so does the key).

What llama.cpp checks as it loads an adapter (src/llama-adapter.cpp), checked here first so that a wrong file
is one line naming it, before any model loads: general.type "adapter", the model's general.architecture,
adapter.type "lora", every tensor a `.lora_a`/`.lora_b` pair (norms aside) of a weight the model has, of
shapes that fit it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from ..errors import SettingError, UsageError


class AdapterError(UsageError):
    """A LoRA adapter that cannot be used: no such file, not a LoRA GGUF, or made for another model. `path` names
    the file, `reason` what is wrong (worded for any front end: the command line says it as is, HTTP as a 400)."""

    def __init__(self, path: "Path | str", reason: str):
        self.path, self.reason = Path(path), reason
        super().__init__(f"LoRA adapter {path}: {reason}")


@dataclass(frozen=True)
class AdapterFile:
    """What an adapter's GGUF header says: the architecture it was made for, its alpha, its name, and for each
    weight it adapts the shapes (ggml order: ne0, ne1) of its A and B matrices."""

    path: Path
    architecture: str
    alpha: float
    name: Optional[str]
    pairs: dict  # weight name -> (A's shape, B's shape)
    base_model: Optional[str] = None  # general.base_model.0.name, where the converter wrote it
    task_name: str = ""  # adapter.lora.task_name and adapter.lora.prompt_prefix, as llama-server lists them
    prompt_prefix: str = ""


def parse_adapter(text: str, base_dir: Optional[Path] = None) -> tuple[str, float]:
    """`FILE[:SCALE]` (llama-server's --lora-scaled form) as (absolute path, scale); the scale is 1.0 when not
    given. A colon that is not followed by a number is part of the path. Relative paths are read from
    `base_dir` (a Modelfile's folder), else the working folder: the background server has another one."""
    path, scale = text, 1.0
    head, sep, tail = text.rpartition(":")
    if sep and head:
        try:
            scale = float(tail)
            path = head
        except ValueError:
            if Path(head).expanduser().is_file() and not Path(text).expanduser().exists():
                raise SettingError("lora", text, f"the scale {tail!r} is not a number (FILE:SCALE, e.g. adapter.gguf:0.5)") from None
    if not math.isfinite(scale):
        raise SettingError("lora", text, "the scale must be a finite number (FILE:SCALE, e.g. adapter.gguf:0.5)")
    if not path:
        raise SettingError("lora", text, "give the adapter's file, FILE or FILE:SCALE")
    where = Path(path).expanduser()
    if not where.is_absolute():
        where = (base_dir or Path.cwd()) / where
    return str(where.resolve()), scale


def read_adapter(path: "Path | str") -> AdapterFile:
    """Read and check an adapter's GGUF header (no tensor data). AdapterError for anything llama.cpp would refuse
    without needing the model: no such file, not a GGUF, not an adapter, not a LoRA, a tensor of another kind or
    half a pair."""
    from ..errors import InvalidModelFile
    from .gguf_info import _read_header

    path = Path(path)
    if path.is_dir():
        raise AdapterError(path, "is a folder: llama.cpp loads a LoRA adapter as one GGUF file (llama.cpp's "
                                 "convert_lora_to_gguf.py makes one of a safetensors adapter)")
    if not path.is_file():
        raise AdapterError(path, "no such file")
    try:
        header = _read_header(path)
    except InvalidModelFile as exc:
        reason = exc.message.split(": ", 1)[1] if ": " in exc.message else exc.message
        raise AdapterError(path, reason.split(": delete it")[0].split(": pass a")[0]) from None
    meta = header.metadata
    kind = meta.get("general.type")
    if kind != "adapter":
        what = "a model" if kind in (None, "model") else f"a GGUF {kind!r} file"
        raise AdapterError(path, f"is {what}, not a LoRA adapter (general.type {kind or 'model'!r}): give a LoRA GGUF"
                                 " (llama.cpp's convert_lora_to_gguf.py makes one)")
    if meta.get("adapter.type") != "lora":
        raise AdapterError(path, f"is a {meta.get('adapter.type')!r} adapter, not a LoRA (adapter.type 'lora')")
    arch = meta.get("general.architecture")
    if not isinstance(arch, str) or not arch:
        raise AdapterError(path, "names no general.architecture")
    pairs: dict[str, list] = {}
    for tensor in header.tensors:
        name = tensor.name
        if name.endswith(".lora_a") or name.endswith(".lora_b"):
            pairs.setdefault(name[:-7], [None, None])[name.endswith(".lora_b")] = tuple(tensor.shape)
        elif not name.endswith("_norm.weight"):  # (llama.cpp skips a norm's; it refuses anything else)
            raise AdapterError(path, f"tensor {name!r} is not a LoRA tensor (.lora_a or .lora_b)")
    for weight, (a, b) in pairs.items():
        if a is None or b is None:
            raise AdapterError(path, f"the LoRA pair of {weight!r} lacks its {'A' if a is None else 'B'} matrix")
    if not pairs:
        raise AdapterError(path, "holds no LoRA tensors")
    alpha = meta.get("adapter.lora.alpha", 0.0)

    def text(key: str) -> Optional[str]:
        value = meta.get(key)
        return value if isinstance(value, str) else None

    return AdapterFile(path, arch, float(alpha) if isinstance(alpha, (int, float)) else 0.0, text("general.name"),
                       {k: (tuple(v[0]), tuple(v[1])) for k, v in pairs.items()}, text("general.base_model.0.name"),
                       text("adapter.lora.task_name") or "", text("adapter.lora.prompt_prefix") or "")


def check_adapter(adapter: AdapterFile, model_path: "Path | str") -> None:
    """Refuse an adapter made for another model than the one at `model_path`, as llama.cpp would as it loads it
    (its architecture, every adapted weight present in the model with shapes that fit), naming both files."""
    from .gguf_info import _read_header, read_info

    model_path = Path(model_path)
    info = read_info(model_path)
    model = model_path.name
    if adapter.architecture != info.architecture:
        raise AdapterError(adapter.path, f"is for the {adapter.architecture} architecture, not {info.architecture} "
                                         f"({model}): give an adapter made for this model")
    shapes = {t.name: tuple(t.shape) for shard in info.shards for t in _read_header(Path(shard)).tensors}
    for weight, (a, b) in sorted(adapter.pairs.items()):
        have = shapes.get(weight)
        if have is None:
            raise AdapterError(adapter.path, f"adapts {weight!r}, which {model} does not have: it was made for another base model")
        if len(have) < 2 or len(a) < 2 or len(b) < 2:
            raise AdapterError(adapter.path, f"the LoRA pair of {weight!r} is not two matrices")
        if weight.endswith("token_embd.weight"):  # (B is not transposed there: llm_build_inp_embd)
            fits = have[0] == b[1] and have[1] == a[1]
        else:
            fits = have[0] == a[0] and have[1] == b[1] and a[1] == b[0]
        if not fits:
            raise AdapterError(adapter.path, f"its {weight!r} is {a[0]}x{b[1]}, {model}'s is {have[0]}x{have[1]}: it was made "
                                             "for another base model")


def lora_key(scales: Sequence[float]) -> tuple:
    """What a KV state made under these scales (one per adapter of the load, in order) is known by: the adapters
    that take part, with their scales; () for none (every scale 0 is the model alone)."""
    return tuple((i, float(s)) for i, s in enumerate(scales) if s != 0)
