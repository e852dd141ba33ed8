"""What `show` and `doctor` report: model metadata, memory estimates next to llama.cpp's real allocation,
and the build/environment facts."""

from __future__ import annotations

import os
import platform
import re
import shutil
import sys
from typing import Any

from ... import __version__
from ..models.details import model_details


def describe(local, spec, measure: bool, verified: bool = False) -> dict[str, Any]:
    """What `show` prints for a load by `spec` (runtime.options.LoadSpec: show's --ctx, --kv-type and placement
    flags). `verified`: the files were hashed just now (show --verify), not only checked by size and mtime
    against the pull's record. The memory estimate is for the load `run --keep-alive 0` makes (one sequence,
    the repacked copy where llama.cpp makes one here; none beside `spec.rpc`'s workers), `memory_served` for the
    background server's (its slots, each that context). The check, `memory_served` and the measurement are of
    the model placed here as llama.cpp places it by default: --gpu-layers and --tensor-split are read for RPC
    workers only (runtime.workers.plan)."""
    from dataclasses import replace

    from ...hub import defaults_for
    from ...store.files import sha256_file

    from ...engine.footprint import footprint, repacks_here
    from ...engine.gguf_info import read_info

    from ..memory import capped_context, context_for
    from ..options import LoadSpec

    info = read_info(local.path)
    brought = defaults_for(local.ref)
    kv_type, rpc = spec.kv_type, bool(spec.rpc)
    n_ctx = context_for(spec.ctx, brought, local.path, 1, kv_type)
    capped = capped_context(spec.ctx, brought, info, local.path.name if local.source == "path" else local.ref)

    here = replace(spec, gpu_layers=LoadSpec.gpu_layers, rpc=None, tensor_split=None)
    here.engine_options(n_ctx)  # run's checks and messages: --ctx 0 was taken as the default
    estimate = footprint(info, n_ctx, kv_type, repack=repacks_here(rpc))
    out: dict[str, Any] = {
        "name": str(local.path) if local.source == "path" else local.ref,  # a file by its path, not PATH:QUANT
        "path": str(local.path),
        "files": [str(f) for f in local.files],
        "projector": str(projector) if (projector := projector_of(local)) else None,
        "source": local.source,
        "architecture": info.architecture,
        "model_name": info.name,
        "parameters": info.n_params,
        "quant": info.quant,
        "context_length": info.context_length,
        "n_layer": info.n_layer,
        "n_head": info.n_head,
        "n_kv_head": info.n_kv_head,
        "head_dim": info.head_dim_k,
        "sliding_window": info.sliding_window,
        "vocab_size": info.vocab_size,
        "chat_template": info.chat_template is not None,
        "draft": brought.draft,  # a catalogue entry's speculative decoding by default (lookup), or None
        "adapters": adapters_of(brought),  # a created model's LoRA adapters (its Modelfile's ADAPTER lines)
        "file_size": info.file_size,
        "sha256": local.sha256[0] if local.sha256 else sha256_file(local.path),
        # where the sha256 comes from: hashed now, or the pull's record (the file's size and mtime still match it)
        "sha256_checked": "now" if verified or not local.sha256 else "at pull",
        "memory_estimate": {"n_ctx": n_ctx, "kv_type": kv_type, **estimate},
        **({"context_capped": capped} if capped else {}),  # the context asked for is past the trained length
    }
    if not rpc:  # run and chat load it in the background server, with its slots (each this context): what `ps` shows
        from ..options import SERVER_SLOTS
        from ..memory import estimate_breakdown

        served = replace(here, ctx=n_ctx, parallel=SERVER_SLOTS, kind="run")
        out["memory_served"] = {"slots": SERVER_SLOTS, "n_ctx": n_ctx, **estimate_breakdown(local.path, served, local.ref)}
    if measure:
        out["memory_allocated"] = measured_allocation(local.path, n_ctx, kv_type)
    return out


_SIZE = re.compile(r"(\w+)\s+(model|KV|compute|output) buffer size\s*=\s*([\d.]+) MiB")


def adapters_of(brought) -> list[dict[str, Any]]:
    """A model's own LoRA adapters (a created model's ADAPTER lines: hub.ModelDefaults.adapters), as `show` and
    /api/show list them: path, scale, and whether the file is still there."""
    from pathlib import Path

    return [{"path": path, "scale": scale, "present": Path(path).is_file()} for path, scale in brought.adapters]


def measured_allocation(path, n_ctx: int, kv_type: str) -> dict[str, int]:
    """Load the model with this context and read the buffer sizes llama.cpp reports allocating: the weights
    (CPU_Mapped, or a device's, less the pages of the repacked weights the engine gives back), the repacked
    copy (CPU_REPACK), KV, compute (with the output buffer)."""
    from ...engine import Engine
    from ...engine.llama import captured_llama_log
    from ..options import LoadSpec

    with captured_llama_log() as lines:  # as `run` loads it
        engine = Engine(path, LoadSpec(kv_type=kv_type, kind="run").engine_options(n_ctx))
        released = engine.released_bytes
        engine.close()
    sizes = {"model": 0.0, "repacked": 0.0, "KV": 0.0, "compute": 0.0, "output": 0.0}
    for line in "".join(lines).splitlines():
        if line.startswith("~"):
            continue  # the destructor repeats the compute buffer size
        m = _SIZE.search(line)
        if m:
            kind = "repacked" if m.group(2) == "model" and m.group(1).endswith("REPACK") else m.group(2)
            sizes[kind] += float(m.group(3))
    mib = 1024 * 1024
    result = {
        "weights_bytes": int(sizes["model"] * mib) - released,
        "repacked_bytes": int(sizes["repacked"] * mib),
        "kv_bytes": int(sizes["KV"] * mib),
        "compute_bytes": int((sizes["compute"] + sizes["output"]) * mib),
    }
    result["total_bytes"] = sum(result.values())
    return result


def doctor_report() -> dict[str, Any]:
    from ...hub.catalogue import catalogue_paths
    from ...store.paths import home, mirror_dir

    report: dict[str, Any] = {
        "localrun": __version__,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "home": str(home()),
        "mirror_dir": str(mirror_dir()),
        "models_files": [str(p) for p in catalogue_paths()],
        "hf_home": os.environ.get("HF_HOME") or os.path.expanduser("~/.cache/huggingface"),
        "hf_endpoint": os.environ.get("HF_ENDPOINT") or "https://huggingface.co",
        "hf_offline": os.environ.get("HF_HUB_OFFLINE", "0"),
    }
    target = home()
    while not target.exists() and target.parent != target:
        target = target.parent
    report["free_disk_bytes"] = shutil.disk_usage(target).free
    try:
        from ...engine import system_info

        report.update(system_info())
    except ImportError as exc:
        report["llama_cpp_python"] = f"not importable ({exc}): run `make install`"
    report.update(cpu_report())
    from importlib.metadata import PackageNotFoundError, version

    for package in ("huggingface_hub", "gguf"):
        try:
            report[package] = version(package)
        except PackageNotFoundError:
            report[package] = "missing"
    return report


def cpu_report(window_s: float = 0.5) -> dict[str, Any]:
    """The CPU threads llama.cpp takes by default (a thread per physical core this process may run on) and how
    much of those cores other processes use now (over `window_s`), with the advice busy_advice gives."""
    import time

    from ...engine.llama import CpuLoad, busy_advice, cpu_counts, default_threads

    cores, logical = cpu_counts()
    machine = CpuLoad()
    time.sleep(window_s)
    others = machine.busy()
    threads = default_threads()
    return {"threads": {"default": threads, "physical_cores": cores, "logical_cpus": logical},
            "cpu_busy_elsewhere": None if others is None else round(others, 2),
            "cpu_advice": busy_advice(others, threads)}


# -- what the Ollama dialect lists and shows ---------------------------------------------------------------


def tags_listing() -> list[dict[str, Any]]:
    """The pulled models whose files are all here, as Ollama's /api/tags lists them."""
    from ...engine.gguf_info import read_info
    from ...errors import InvalidModelFile
    from ..serving.pool import listed_local

    out = []
    for m in listed_local():
        if m.missing_files():
            continue
        try:
            details = model_details(read_info(m.path))
        except InvalidModelFile:
            continue
        out.append({"name": m.ref, "model": m.ref, "modified_at": m.pulled_at or _mtime(m.path), "size": m.size,
                    "digest": m.sha256[0] if m.sha256 else "", "details": details})
    return out


def file_entry(name: str, path, info=None) -> dict[str, Any]:
    """/api/tags' entry for a model file served under `name` (loaded from a path, not pulled); `info`: its
    GGUF metadata when already read (a loaded model's). Raises OSError when the file is gone."""
    from pathlib import Path

    from ...engine.gguf_info import read_info
    from ...store.digests import file_digest

    path = Path(path)
    size = path.stat().st_size
    return {"name": name, "model": name, "modified_at": _mtime(path), "size": size,
            "digest": file_digest(path) or "", "details": model_details(info or read_info(path))}


def model_card(ref: str, local=None) -> dict[str, Any]:
    """What Ollama's /api/show answers for a pulled model (or a .gguf path): details, the GGUF metadata as
    model_info (arrays the size of a vocabulary left out, as Ollama does), the chat template, the catalogue's
    sampling defaults as parameters. `local`: `ref` already resolved (hub.resolve_local). Raises ModelNotFound."""
    from ...engine.gguf_info import read_info
    from ...hub import defaults_for, resolve_local

    local = local or resolve_local(ref)
    info = read_info(local.path)
    model_info: dict[str, Any] = {}
    for key, value in info.metadata.items():
        if isinstance(value, (list, tuple)):
            value = list(value) if len(value) <= 64 else None
        elif not isinstance(value, (str, int, float, bool)) and value is not None:
            value = None  # a summarised array (tokens, scores): too big to list
        model_info[key] = value
    brought = defaults_for(local.ref if local.source != "path" else ref)
    parameters = "\n".join(f"{name:<30} {_go_value(value)}" for name, value in ollama_parameters(brought))
    from ...engine.thinking import markers_for
    from ...engine.tools import supports_tools

    capabilities = ["completion"] + (["vision"] if projector_of(local) else []) + (["tools"] if supports_tools(info.chat_template) else []) + (
        ["thinking"] if markers_for(info.chat_template) else []) + (["embedding"] if brought.embedding else [])
    return {
        "modelfile": modelfile_text(local, brought), "parameters": parameters,
        **({"system": brought.system} if brought.system else {}),
        **({"messages": list(brought.messages)} if brought.messages else {}),
        **({"adapters": adapters_of(brought)} if brought.adapters else {}),
        "template": brought.template or info.chat_template or "{{ .Prompt }}", "license": brought.license or "",
        "details": model_details(info), "model_info": model_info, "capabilities": capabilities,
        "modified_at": local.pulled_at or _mtime(local.path), "digest": _digest(local),
    }


def projector_of(local):
    """The vision projector a model is run with (the mmproj file beside it, as pulled with it), or None."""
    from ...errors import UsageError
    from ..images import projector_beside

    try:
        return projector_beside([local.path, local.path.resolve()])
    except UsageError:  # several beside it: none is chosen until --mmproj names one
        return None


def modelfile_text(local, brought) -> str:
    """A model as a Modelfile (Ollama's `show --modelfile`): `create` makes the same model again from it."""
    import json

    def quoted(text: str) -> str:
        return f'"""{text}"""'

    lines = [f"# Modelfile of {local.ref} (localrun)", f"FROM {local.path}"]
    for name, one in ollama_parameters(brought):
        plain = not isinstance(one, str) or (one and not any(c.isspace() or c == '"' for c in one))
        lines.append(f"PARAMETER {name} {one if plain else json.dumps(one)}")
    if brought.template:
        lines.append(f"TEMPLATE {quoted(brought.template)}")
    if brought.system:
        lines.append(f"SYSTEM {quoted(brought.system)}")
    for path, scale in brought.adapters:
        lines.append(f"ADAPTER {path}" + (f":{scale!r}" if scale != 1.0 else ""))
    for m in brought.messages:
        lines.append(f"MESSAGE {m['role']} {quoted(m['content'])}")
    if brought.license:
        lines.append(f"LICENSE {quoted(brought.license)}")
    return "\n".join(lines) + "\n"


def ollama_parameters(brought) -> list[tuple[str, Any]]:
    """A model's defaults as Ollama names its parameters (num_predict, not max_tokens; num_ctx), one pair per
    value (a stop each), as a Modelfile's PARAMETER lines and /api/show's parameters list them."""
    from ..options import ollama_name

    out = []
    for name, value in sorted(brought.sampling.items()):
        for one in value if isinstance(value, list) else [value]:
            if isinstance(one, dict):  # logit_bias: TOKEN=BIAS pairs
                one = " ".join(f"{k}={v}" for k, v in one.items())
            out.append((ollama_name(name), one))
    if brought.context:
        out.append(("num_ctx", brought.context))
    return out


def _go_value(value: Any) -> str:
    """A parameter's value as Ollama's /api/show writes it (Go's %#v): strings quoted, booleans lower case."""
    import json

    if isinstance(value, float) and value.is_integer():
        return str(int(value))  # 0, as Go writes a float64 0
    return json.dumps(value) if isinstance(value, (str, bool)) else str(value)


def _digest(local) -> str:
    """A model's sha256: recorded at pull, or computed once for a file served by path (store.digests)."""
    from ...store.digests import file_digest

    return (local.sha256[0] if getattr(local, "sha256", None) else None) or file_digest(local.path) or ""


def _mtime(path) -> str:
    from datetime import datetime, timezone

    return datetime.fromtimestamp(path.stat().st_mtime, timezone.utc).isoformat()
