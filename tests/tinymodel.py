"""A tiny llama-architecture GGUF for tests whose subject is what surrounds the model, not its answers: SmolLM2's
tokenizer and a chat template on two layers of 64 random weights. llama.cpp loads and runs it as it runs any
model, and tokenizes as SmolLM2 does, so a prompt counts the same tokens; it evaluates a prompt of thousands
of tokens in a second or two where SmolLM2's 30 layers take a minute and a half on one core. What it answers
is noise: a test that checks words uses a real model."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Optional

N_EMBD, N_FF, N_LAYER, N_HEAD, N_HEAD_KV = 64, 128, 2, 4, 2

# Copied from the donor as they are: what makes the tokenizer SmolLM2's.
TOKENIZER_KEYS = ("tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.tokens", "tokenizer.ggml.token_type",
                  "tokenizer.ggml.merges", "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
                  "tokenizer.ggml.unknown_token_id", "tokenizer.ggml.padding_token_id", "tokenizer.ggml.add_bos_token",
                  "tokenizer.ggml.add_space_prefix")


def write_tiny_model(donor: Path, out: Path, template: Optional[str] = None, context_length: int = 8192, seed: int = 0,
                     merges: Optional[int] = None) -> Path:
    """Write the tiny model to `out`: the donor's tokenizer (a llama-architecture GGUF such as SmolLM2's),
    `template` as its chat template (None: the donor's own), a trained context of `context_length`.

    `merges`: keep only the donor's first `merges` BPE merges, and the tokens they make: its special tokens and
    byte alphabet stay, so any text still tokenizes (in more, shorter tokens). A grammar checks every token of the
    vocabulary each time a random model's pick is refused: on 500 tokens instead of 49,152, a test that makes the
    model write an exact text runs many times faster."""
    import numpy as np

    writer = new_writer(out, "llama", "tiny test model", context_length, eps=1e-5)
    writer.add_rope_dimension_count(N_EMBD // N_HEAD)
    n_vocab = copy_tokenizer(donor, writer, TOKENIZER_KEYS, merges)
    writer.add_chat_template(template if template is not None else str(gguf_reader(donor).fields["tokenizer.chat_template"].contents()))

    rng = np.random.default_rng(seed)

    def weights(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.02).astype(np.float16)

    writer.add_tensor("token_embd.weight", weights(n_vocab, N_EMBD))
    writer.add_tensor("output_norm.weight", np.ones(N_EMBD, dtype=np.float32))
    add_blocks(writer, weights, N_EMBD, N_EMBD // N_HEAD * N_HEAD_KV, norms={"attn_norm": N_EMBD, "ffn_norm": N_EMBD})
    return finish(writer, out)


def new_writer(out: Path, architecture: str, name: str, context_length: int, eps: float):
    """A GGUF writer of `architecture` with the tiny models' dimensions (N_EMBD, N_FF, N_LAYER, the heads) and
    F16 weights, for tests/tinymodel.py and tests/rerankmodel.py alike."""
    import gguf

    writer = gguf.GGUFWriter(out, architecture)
    writer.add_name(name)
    writer.add_context_length(context_length)
    writer.add_embedding_length(N_EMBD)
    writer.add_block_count(N_LAYER)
    writer.add_feed_forward_length(N_FF)
    writer.add_head_count(N_HEAD)
    writer.add_head_count_kv(N_HEAD_KV)
    writer.add_layer_norm_rms_eps(eps)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    return writer


@functools.lru_cache(maxsize=None)
def gguf_reader(path: Path):
    """One GGUFReader a file in this process: it builds a numpy view for each of SmolLM2's 49,152 tokens and
    48,900 merges (seconds, more on a busy core), and every tiny model, reranker and LoRA adapter the tests write
    reads SmolLM2's."""
    import gguf

    return gguf.GGUFReader(path)


@functools.lru_cache(maxsize=None)
def _tokenizer(donor: Path) -> dict:
    """The donor's TOKENIZER_KEYS it has: key -> (value type, contents), read once in this process."""
    fields = gguf_reader(donor).fields
    return {key: (fields[key].types[0], fields[key].contents()) for key in TOKENIZER_KEYS if key in fields}


def copy_tokenizer(donor: Path, writer, keys: tuple[str, ...], merges: Optional[int] = None) -> int:
    """Copy the `keys` the donor's tokenizer has (of TOKENIZER_KEYS), as they are, or with only its first `merges`
    merges and the tokens before the rest (a BPE vocabulary lists the tokens its merges make in their order); the
    size of its vocabulary."""
    import gguf

    tokenizer = dict(_tokenizer(donor))
    if merges is not None:
        tokens, rules = tokenizer["tokenizer.ggml.tokens"][1], tokenizer["tokenizer.ggml.merges"][1]
        first = tokens.index(rules[0].replace(" ", ""))  # the special tokens and the byte alphabet come before
        assert all(tokens[first + i] == rule.replace(" ", "") for i, rule in enumerate(rules[:merges])), "not in merge order"
        for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type"):
            tokenizer[key] = (tokenizer[key][0], tokenizer[key][1][: first + merges])
        tokenizer["tokenizer.ggml.merges"] = (tokenizer["tokenizer.ggml.merges"][0], rules[:merges])
    for key in keys:
        if key not in tokenizer:
            continue
        kind, value = tokenizer[key]
        if kind == gguf.GGUFValueType.ARRAY:
            writer.add_array(key, value)
        else:
            writer.add_key_value(key, value, kind)
    return len(tokenizer["tokenizer.ggml.tokens"][1])


def add_blocks(writer, weights, q: int, kv: int, norms: dict[str, int]) -> None:
    """The N_LAYER blocks: attention (queries of width `q`, keys and values of `kv`) and a gated feed-forward of
    `weights(*shape)`, then the `norms` (name: width) as ones."""
    import numpy as np

    for i in range(N_LAYER):
        for name, shape in (("attn_q", (q, N_EMBD)), ("attn_k", (kv, N_EMBD)), ("attn_v", (kv, N_EMBD)),
                            ("attn_output", (N_EMBD, q)), ("ffn_gate", (N_FF, N_EMBD)), ("ffn_up", (N_FF, N_EMBD)),
                            ("ffn_down", (N_EMBD, N_FF))):
            writer.add_tensor(f"blk.{i}.{name}.weight", weights(*shape))
        for name, width in norms.items():
            writer.add_tensor(f"blk.{i}.{name}.weight", np.ones(width, dtype=np.float32))


def finish(writer, out: Path) -> Path:
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out
