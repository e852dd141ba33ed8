"""A tiny llama-architecture GGUF for tests whose subject is what surrounds the model, not its answers: SmolLM2's
tokenizer and a chat template on two layers of 64 random weights. llama.cpp loads and runs it as it runs any
model, and tokenizes as SmolLM2 does, so a prompt counts the same tokens; it evaluates a prompt of thousands
of tokens in a second or two where SmolLM2's 30 layers take a minute and a half on one core. What it answers
is noise: a test that checks words uses a real model."""

from __future__ import annotations

from pathlib import Path

N_EMBD, N_FF, N_LAYER, N_HEAD, N_HEAD_KV = 64, 128, 2, 4, 2

# Copied from the donor as they are: what makes the tokenizer SmolLM2's.
_TOKENIZER_KEYS = ("tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.tokens", "tokenizer.ggml.token_type",
                   "tokenizer.ggml.merges", "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
                   "tokenizer.ggml.unknown_token_id", "tokenizer.ggml.padding_token_id", "tokenizer.ggml.add_bos_token",
                   "tokenizer.ggml.add_space_prefix")


def write_tiny_model(donor: Path, out: Path, template: str, context_length: int = 8192, seed: int = 0) -> Path:
    """Write the tiny model to `out`: the donor's tokenizer (a llama-architecture GGUF such as SmolLM2's),
    `template` as its chat template, a trained context of `context_length`."""
    import gguf
    import numpy as np

    reader = gguf.GGUFReader(donor)
    writer = gguf.GGUFWriter(out, "llama")
    writer.add_name("tiny test model")
    writer.add_context_length(context_length)
    writer.add_embedding_length(N_EMBD)
    writer.add_block_count(N_LAYER)
    writer.add_feed_forward_length(N_FF)
    writer.add_head_count(N_HEAD)
    writer.add_head_count_kv(N_HEAD_KV)
    writer.add_rope_dimension_count(N_EMBD // N_HEAD)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    for key in _TOKENIZER_KEYS:
        field = reader.fields.get(key)
        if field is None:
            continue
        kind = field.types[0]
        if kind == gguf.GGUFValueType.ARRAY:
            writer.add_array(key, field.contents())
        else:
            writer.add_key_value(key, field.contents(), kind)
    writer.add_chat_template(template)
    n_vocab = len(reader.fields["tokenizer.ggml.tokens"].data)

    rng = np.random.default_rng(seed)

    def weights(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.02).astype(np.float16)

    kv = N_EMBD // N_HEAD * N_HEAD_KV
    writer.add_tensor("token_embd.weight", weights(n_vocab, N_EMBD))
    writer.add_tensor("output_norm.weight", np.ones(N_EMBD, dtype=np.float32))
    for i in range(N_LAYER):
        for name, shape in (("attn_q", (N_EMBD, N_EMBD)), ("attn_k", (kv, N_EMBD)), ("attn_v", (kv, N_EMBD)),
                            ("attn_output", (N_EMBD, N_EMBD)), ("ffn_gate", (N_FF, N_EMBD)), ("ffn_up", (N_FF, N_EMBD)),
                            ("ffn_down", (N_EMBD, N_FF))):
            writer.add_tensor(f"blk.{i}.{name}.weight", weights(*shape))
        writer.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out
