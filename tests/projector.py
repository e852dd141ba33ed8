"""A vision projector for the tests: no vision GGUF is reachable here, so this writes one with random weights
that llama.cpp's clip loads (tools/mtmd/clip.cpp: PROJECTOR_TYPE_MLP, LLaVA-1.5's shape) with a tiny
vision tower, its output as wide as SmolLM2-135M's embeddings. Its answers mean nothing; what the tests
can show is that the whole path runs: images decoded, encoded, evaluated into the KV, and the answer
depending on them. And PNG bytes made with zlib (no imaging library needed)."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

SMOLLM2_N_EMBD = 576
IMAGE_SIZE, PATCH_SIZE = 32, 8  # (32 / 8)^2 = 16 image tokens for any image (LLaVA-1.5 resizes to a square)


def write_projector(path: Path, *, n_embd_text: int = SMOLLM2_N_EMBD, n_embd: int = 32, n_head: int = 2, n_ff: int = 64,
                    n_layer: int = 2, image_size: int = IMAGE_SIZE, patch_size: int = PATCH_SIZE, hidden: int = 64,
                    seed: int = 0) -> Path:
    """An mmproj GGUF: a CLIP-style ViT (class embedding, pre-norm, n_layer blocks; LLaVA uses all but the
    last) and a two-layer MLP projector (mm.0, GELU, mm.2) to n_embd_text."""
    import gguf
    import numpy as np

    rng = np.random.default_rng(seed)

    def rand(*shape: int, scale: float = 0.2):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    writer = gguf.GGUFWriter(str(path), "clip")
    writer.add_bool("clip.has_vision_encoder", True)
    writer.add_string("clip.projector_type", "mlp")
    writer.add_uint32("clip.vision.embedding_length", n_embd)
    writer.add_uint32("clip.vision.attention.head_count", n_head)
    writer.add_uint32("clip.vision.feed_forward_length", n_ff)
    writer.add_uint32("clip.vision.block_count", n_layer)
    writer.add_uint32("clip.vision.projection_dim", n_embd_text)
    writer.add_float32("clip.vision.attention.layer_norm_epsilon", 1e-5)
    writer.add_uint32("clip.vision.image_size", image_size)
    writer.add_uint32("clip.vision.patch_size", patch_size)
    writer.add_array("clip.vision.image_mean", [0.5, 0.5, 0.5])
    writer.add_array("clip.vision.image_std", [0.5, 0.5, 0.5])
    writer.add_bool("clip.use_gelu", True)
    # numpy shapes are ggml's reversed: a weight of n_out rows of n_in is (n_out, n_in)
    writer.add_tensor("v.patch_embd.weight", rand(n_embd, 3, patch_size, patch_size).astype(np.float16))
    writer.add_tensor("v.class_embd", rand(n_embd))
    writer.add_tensor("v.position_embd.weight", rand((image_size // patch_size) ** 2 + 1, n_embd))
    writer.add_tensor("v.pre_ln.weight", np.ones(n_embd, np.float32))
    writer.add_tensor("v.pre_ln.bias", np.zeros(n_embd, np.float32))
    for i in range(n_layer):
        for name in ("attn_q", "attn_k", "attn_v", "attn_out"):
            writer.add_tensor(f"v.blk.{i}.{name}.weight", rand(n_embd, n_embd))
            writer.add_tensor(f"v.blk.{i}.{name}.bias", rand(n_embd))
        for name in ("ln1", "ln2"):
            writer.add_tensor(f"v.blk.{i}.{name}.weight", np.ones(n_embd, np.float32))
            writer.add_tensor(f"v.blk.{i}.{name}.bias", np.zeros(n_embd, np.float32))
        writer.add_tensor(f"v.blk.{i}.ffn_up.weight", rand(n_ff, n_embd))
        writer.add_tensor(f"v.blk.{i}.ffn_up.bias", rand(n_ff))
        writer.add_tensor(f"v.blk.{i}.ffn_down.weight", rand(n_embd, n_ff))
        writer.add_tensor(f"v.blk.{i}.ffn_down.bias", rand(n_embd))
    writer.add_tensor("mm.0.weight", rand(hidden, n_embd))
    writer.add_tensor("mm.0.bias", rand(hidden))
    writer.add_tensor("mm.2.weight", rand(n_embd_text, hidden))
    writer.add_tensor("mm.2.bias", rand(n_embd_text))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def write_gemma3_projector(path: Path, *, n_embd_text: int, n_embd: int = 32, n_head: int = 2, n_ff: int = 64, n_layer: int = 2,
                           image_size: int = 32, patch_size: int = 4, merge: int = 2, projection_scale: float = 5.0,
                           seed: int = 0) -> Path:
    """An mmproj GGUF of Gemma 3's kind (PROJECTOR_TYPE_GEMMA3: a SigLIP tower, its patches average-pooled
    merge x merge, RMS-normed and projected): ((image_size / patch_size) / merge)^2 image tokens, wrapped in
    <start_of_image> ... <end_of_image> text, and decoded with non-causal attention. Its projection is large
    (projection_scale): with small image embeddings gemma-3-270m answers newlines whatever the image."""
    import gguf
    import numpy as np

    rng = np.random.default_rng(seed)

    def rand(*shape: int, scale: float = 0.2):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    writer = gguf.GGUFWriter(str(path), "clip")
    writer.add_bool("clip.has_vision_encoder", True)
    writer.add_string("clip.projector_type", "gemma3")
    writer.add_uint32("clip.vision.embedding_length", n_embd)
    writer.add_uint32("clip.vision.attention.head_count", n_head)
    writer.add_uint32("clip.vision.feed_forward_length", n_ff)
    writer.add_uint32("clip.vision.block_count", n_layer)
    writer.add_uint32("clip.vision.projection_dim", n_embd_text)
    writer.add_float32("clip.vision.attention.layer_norm_epsilon", 1e-6)
    writer.add_uint32("clip.vision.image_size", image_size)
    writer.add_uint32("clip.vision.patch_size", patch_size)
    writer.add_uint32("clip.vision.projector.scale_factor", merge)
    writer.add_array("clip.vision.image_mean", [0.5, 0.5, 0.5])
    writer.add_array("clip.vision.image_std", [0.5, 0.5, 0.5])
    writer.add_bool("clip.use_gelu", True)
    writer.add_tensor("v.patch_embd.weight", rand(n_embd, 3, patch_size, patch_size).astype(np.float16))
    writer.add_tensor("v.patch_embd.bias", rand(n_embd))
    writer.add_tensor("v.position_embd.weight", rand((image_size // patch_size) ** 2, n_embd))
    for i in range(n_layer):
        for name in ("attn_q", "attn_k", "attn_v", "attn_out"):
            writer.add_tensor(f"v.blk.{i}.{name}.weight", rand(n_embd, n_embd))
            writer.add_tensor(f"v.blk.{i}.{name}.bias", rand(n_embd))
        for name in ("ln1", "ln2"):
            writer.add_tensor(f"v.blk.{i}.{name}.weight", np.ones(n_embd, np.float32))
            writer.add_tensor(f"v.blk.{i}.{name}.bias", np.zeros(n_embd, np.float32))
        writer.add_tensor(f"v.blk.{i}.ffn_up.weight", rand(n_ff, n_embd))
        writer.add_tensor(f"v.blk.{i}.ffn_up.bias", rand(n_ff))
        writer.add_tensor(f"v.blk.{i}.ffn_down.weight", rand(n_embd, n_ff))
        writer.add_tensor(f"v.blk.{i}.ffn_down.bias", rand(n_embd))
    writer.add_tensor("v.post_ln.weight", np.ones(n_embd, np.float32))
    writer.add_tensor("v.post_ln.bias", np.zeros(n_embd, np.float32))
    writer.add_tensor("mm.soft_emb_norm.weight", np.ones(n_embd, np.float32))
    writer.add_tensor("mm.input_projection.weight", rand(n_embd, n_embd_text, scale=projection_scale))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def png_bytes(width: int, height: int, pixel) -> bytes:
    """An RGB PNG whose pixel (x, y) is pixel(x, y) -> (r, g, b)."""
    rows = b"".join(b"\x00" + bytes(c for x in range(width) for c in pixel(x, y)) for y in range(height))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")


def red_square() -> bytes:
    return png_bytes(40, 30, lambda x, y: (255, 0, 0))


def stripes() -> bytes:
    return png_bytes(64, 64, lambda x, y: (0, 0, 255) if (x // 8) % 2 else (255, 255, 0))
