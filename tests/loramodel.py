"""A LoRA adapter GGUF for tests, written as llama.cpp's convert_lora_to_gguf.py writes one (general.type adapter,
adapter.type lora, adapter.lora.alpha, a `.lora_a`/`.lora_b` pair per adapted weight): small random A and B
matrices over a model's attention projections. Its answers mean nothing; they differ from the base model's,
which is what a test of adapters needs."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from localrun.engine.gguf_info import _read_header  # (the header alone: the gguf package's reader builds a view of each token)


def write_lora(base: Path, out: Path, *, rank: int = 8, alpha: float = 16.0, seed: int = 0, magnitude: float = 0.05,
               targets: tuple[str, ...] = ("attn_q", "attn_v"), architecture: Optional[str] = None,
               layers: Optional[int] = None) -> Path:
    """Write to `out` an adapter for the model at `base` (a GGUF): for each layer's `targets`, A (rank x in) and B
    (out x rank) of random values of about `magnitude`. `architecture`: what the adapter says it is for (default:
    the base's), to write one for another architecture; `layers`: adapt only the first that many layers."""
    import gguf
    import numpy as np

    header = _read_header(Path(base))
    arch = str(header.metadata["general.architecture"])
    shapes = {t.name: [int(d) for d in t.shape] for t in header.tensors}  # ggml order: (in, out)
    writer = gguf.GGUFWriter(out, architecture or arch)
    writer.add_type("adapter")
    writer.add_string("adapter.type", "lora")
    writer.add_float32("adapter.lora.alpha", alpha)
    writer.add_name("test lora")
    rng = np.random.default_rng(seed)
    n_layer = int(header.metadata[f"{arch}.block_count"])
    for i in range(n_layer if layers is None else min(layers, n_layer)):
        for target in targets:
            name = f"blk.{i}.{target}.weight"
            n_in, n_out = shapes[name][0], shapes[name][1]
            writer.add_tensor(f"{name}.lora_a", (rng.standard_normal((rank, n_in)) * magnitude).astype(np.float32))
            writer.add_tensor(f"{name}.lora_b", (rng.standard_normal((n_out, rank)) * magnitude).astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out
