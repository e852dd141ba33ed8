"""A tiny reranker GGUF for tests, laid out as llama.cpp's converter writes Qwen3-Reranker (conversion/qwen.py):
the qwen3 architecture with rank pooling (`qwen3.pooling_type` 4), a classifier head of two rows (`cls.output`,
labels yes and no: llama.cpp's rank pooling reads the last token's state through it and a softmax, the score
being the first) and the rerank prompt as the GGUF's `tokenizer.chat_template.rerank`. Two layers of random
weights over SmolLM2's tokenizer (tests/tinymodel.py's donor): llama.cpp loads and runs it as a reranker, its
scores mean nothing and differ from document to document.

Without the template (`template=None`), llama.cpp puts a query and a document together as BERT-style
rerankers take them: BOS, the query, EOS, SEP, the document, EOS, as the tokenizer's add_* flags say (set here)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

# Qwen3-Reranker's own, as the converter writes it ({query} and {document} replaced by llama.cpp).
QWEN3_RERANK = ("<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the Instruct "
                "provided. Note that the answer can only be \"yes\" or \"no\".<|im_end|>\n<|im_start|>user\n<Instruct>: Given a "
                "web search query, retrieve relevant passages that answer the query\n<Query>: {query}\n<Document>: {document}"
                "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n")
N_EMBD, N_FF, N_LAYER, N_HEAD, N_HEAD_KV, HEAD_DIM = 64, 128, 2, 4, 2, 16
_TOKENIZER_KEYS = ("tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.tokens", "tokenizer.ggml.token_type",
                   "tokenizer.ggml.merges", "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
                   "tokenizer.ggml.unknown_token_id", "tokenizer.ggml.padding_token_id")


def write_reranker(donor: Path, out: Path, template: Optional[str] = QWEN3_RERANK, seed: int = 0) -> Path:
    """Write the tiny reranker to `out`, the tokenizer taken from `donor` (SmolLM2's GGUF)."""
    import gguf
    import numpy as np

    reader = gguf.GGUFReader(donor)
    writer = gguf.GGUFWriter(out, "qwen3")
    writer.add_name("tiny test reranker")
    writer.add_context_length(4096)
    writer.add_embedding_length(N_EMBD)
    writer.add_block_count(N_LAYER)
    writer.add_feed_forward_length(N_FF)
    writer.add_head_count(N_HEAD)
    writer.add_head_count_kv(N_HEAD_KV)
    writer.add_key_length(HEAD_DIM)
    writer.add_value_length(HEAD_DIM)
    writer.add_rope_freq_base(1_000_000.0)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_pooling_type(gguf.PoolingType.RANK)
    writer.add_classifier_output_labels(["yes", "no"])
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
    if template is not None:
        writer.add_chat_template([{"name": "rerank", "template": template}])
    else:  # the BOS / EOS / SEP form
        writer.add_add_bos_token(True)
        writer.add_add_eos_token(True)
        writer.add_bool(gguf.Keys.Tokenizer.ADD_SEP, True)
        writer.add_uint32(gguf.Keys.Tokenizer.SEP_ID, 0)
    n_vocab = len(reader.fields["tokenizer.ggml.tokens"].data)
    rng = np.random.default_rng(seed)

    def weights(*shape: int, scale: float = 0.05) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float16)

    q, kv = N_HEAD * HEAD_DIM, N_HEAD_KV * HEAD_DIM
    writer.add_tensor("token_embd.weight", weights(n_vocab, N_EMBD, scale=0.5))
    writer.add_tensor("output_norm.weight", np.ones(N_EMBD, dtype=np.float32))
    writer.add_tensor("cls.output.weight", (rng.standard_normal((2, N_EMBD)) * 0.05).astype(np.float32))
    for i in range(N_LAYER):
        for name, shape in (("attn_q", (q, N_EMBD)), ("attn_k", (kv, N_EMBD)), ("attn_v", (kv, N_EMBD)),
                            ("attn_output", (N_EMBD, q)), ("ffn_gate", (N_FF, N_EMBD)), ("ffn_up", (N_FF, N_EMBD)),
                            ("ffn_down", (N_EMBD, N_FF))):
            writer.add_tensor(f"blk.{i}.{name}.weight", weights(*shape))
        writer.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
        writer.add_tensor(f"blk.{i}.attn_q_norm.weight", np.ones(HEAD_DIM, dtype=np.float32))
        writer.add_tensor(f"blk.{i}.attn_k_norm.weight", np.ones(HEAD_DIM, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out
