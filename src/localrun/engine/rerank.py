"""Rerankers: which GGUF is one, and a query and a document put together as llama.cpp's server puts them for its
/rerank (tools/server/server-common.cpp, format_prompt_rerank), so that a score here is the score llama-server
gives: the model's rerank template where its GGUF has one (`tokenizer.chat_template.rerank`, as llama.cpp's
converter writes Qwen3-Reranker's: {query} and {document} replaced), else the BERT form rerankers such as
bge-reranker and jina-reranker take (BOS, the query, EOS, SEP, the document, EOS, as the vocabulary's add_*
flags say). The score itself is llama.cpp's rank pooling's first output (engine.model.Engine.rank)."""

from __future__ import annotations

from pathlib import Path

from ..errors import UsageError

RANK_POOLING = 4  # LLAMA_POOLING_TYPE_RANK
# A classification head over the pooled state (llama.cpp's LLM_TENSOR_CLS, LLM_TENSOR_CLS_OUT): what a cross-encoder
# reranker converted to GGUF has (bge-reranker-v2-m3: cls and cls.output; Qwen3-Reranker: cls.output, yes and no).
HEAD_TENSORS = ("cls.weight", "cls.output.weight")


def is_reranker(path: "Path | str") -> bool:
    """Whether the GGUF at `path` is a reranker: its metadata asks for rank pooling, or it has a classification head
    (a converted cross-encoder whose converter wrote no pooling type)."""
    from .gguf_info import _read_header, read_info

    info = read_info(path)
    if info.metadata.get(f"{info.architecture}.pooling_type") == RANK_POOLING:
        return True
    first = _read_header(Path(info.shards[0]) if info.shards else Path(path))
    names = {t.name for t in first.tensors}
    for shard in info.shards[1:]:
        names |= {t.name for t in _read_header(Path(shard)).tensors}
    return any(name in names for name in HEAD_TENSORS)


def rerank_template(engine) -> "str | None":
    """The model's rerank prompt (its GGUF's tokenizer.chat_template.rerank), as llama.cpp reads it; None: none."""
    from .llama import llama_cpp_module

    raw = llama_cpp_module().llama_model_chat_template(engine.model, b"rerank")
    return raw.decode("utf-8", "replace") if raw else None


def rerank_tokens(engine, query: str, document: str, template: "str | None" = None) -> list[int]:
    """The tokens llama-server evaluates to score `document` against `query`. `template`: the model's rerank prompt
    (rerank_template, read once by the caller), or None for the BOS / EOS / SEP form."""
    from .llama import llama_cpp_module

    if template is not None:  # (replaced in this order, as llama.cpp does: a query holding "{document}" gets it too)
        text = template.replace("{query}", query).replace("{document}", document)
        return engine.tokenize(text, add_special=False, parse_special=True)
    ll = llama_cpp_module()
    vocab = engine.vocab
    eos = ll.llama_vocab_eos(vocab)
    if eos < 0:
        eos = ll.llama_vocab_sep(vocab)
    add_eos, add_sep = ll.llama_vocab_get_add_eos(vocab), ll.llama_vocab_get_add_sep(vocab)
    tokens = [ll.llama_vocab_bos(vocab)] if ll.llama_vocab_get_add_bos(vocab) else []
    tokens += engine.tokenize(query, add_special=False, parse_special=False)
    tokens += [eos] if add_eos else []
    tokens += [ll.llama_vocab_sep(vocab)] if add_sep else []
    tokens += engine.tokenize(document, add_special=False, parse_special=False)
    tokens += [eos] if add_eos else []
    return tokens


class NotAReranker(UsageError):
    """`model` is no reranker: its GGUF asks for no rank pooling and has no classification head."""

    def __init__(self, model: str):
        self.model = model
        super().__init__(f"{model} is not a reranker (its GGUF has no rank pooling and no classification head): "
                         "rerank with a reranker such as bge-reranker-v2-m3 or qwen3-reranker-0.6b (`localrun list --available`)")


def check_reranker_file(path, name: str, listed: bool = False) -> None:
    """The check itself, on a model's file (`listed`: the catalogue says it is a reranker)."""
    if not listed and not is_reranker(path):
        raise NotAReranker(name)
