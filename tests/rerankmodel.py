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

from tinymodel import N_EMBD, N_HEAD, N_HEAD_KV, TOKENIZER_KEYS, add_blocks, copy_tokenizer, finish, new_writer

# Qwen3-Reranker's own, as the converter writes it ({query} and {document} replaced by llama.cpp).
QWEN3_RERANK = ("<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the Instruct "
                "provided. Note that the answer can only be \"yes\" or \"no\".<|im_end|>\n<|im_start|>user\n<Instruct>: Given a "
                "web search query, retrieve relevant passages that answer the query\n<Query>: {query}\n<Document>: {document}"
                "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n")
HEAD_DIM = N_EMBD // N_HEAD
# The BOS / EOS / SEP flags are this reranker's own (set below), not the donor's.
_TOKENIZER_KEYS = tuple(k for k in TOKENIZER_KEYS if k not in ("tokenizer.ggml.add_bos_token", "tokenizer.ggml.add_space_prefix"))


def write_reranker(donor: Path, out: Path, template: Optional[str] = QWEN3_RERANK, seed: int = 0) -> Path:
    """Write the tiny reranker to `out`, the tokenizer taken from `donor` (SmolLM2's GGUF)."""
    import gguf
    import numpy as np

    writer = new_writer(out, "qwen3", "tiny test reranker", 4096, eps=1e-6)
    writer.add_key_length(HEAD_DIM)
    writer.add_value_length(HEAD_DIM)
    writer.add_rope_freq_base(1_000_000.0)
    writer.add_pooling_type(gguf.PoolingType.RANK)
    writer.add_classifier_output_labels(["yes", "no"])
    n_vocab = copy_tokenizer(donor, writer, _TOKENIZER_KEYS)
    if template is not None:
        writer.add_chat_template([{"name": "rerank", "template": template}])
    else:  # the BOS / EOS / SEP form
        writer.add_add_bos_token(True)
        writer.add_add_eos_token(True)
        writer.add_bool(gguf.Keys.Tokenizer.ADD_SEP, True)
        writer.add_uint32(gguf.Keys.Tokenizer.SEP_ID, 0)
    rng = np.random.default_rng(seed)

    def weights(*shape: int, scale: float = 0.05) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float16)

    writer.add_tensor("token_embd.weight", weights(n_vocab, N_EMBD, scale=0.5))
    writer.add_tensor("output_norm.weight", np.ones(N_EMBD, dtype=np.float32))
    writer.add_tensor("cls.output.weight", (rng.standard_normal((2, N_EMBD)) * 0.05).astype(np.float32))
    add_blocks(writer, weights, N_HEAD * HEAD_DIM, N_HEAD_KV * HEAD_DIM,
               norms={"attn_norm": N_EMBD, "ffn_norm": N_EMBD, "attn_q_norm": HEAD_DIM, "attn_k_norm": HEAD_DIM})
    return finish(writer, out)
