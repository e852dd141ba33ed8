"""LoRA adapter files checked before llama.cpp sees them (engine.lora), as llama.cpp checks them as it loads one
(src/llama-adapter.cpp): the FILE[:SCALE] form, what makes a GGUF a LoRA adapter, and what makes one fit a model.
Adapters written here with the gguf package (tests/loramodel.py); no model is loaded."""

from __future__ import annotations

from pathlib import Path

import pytest

from loramodel import write_lora

from localrun.engine.gguf_info import read_info
from localrun.engine.lora import AdapterError, check_adapter, lora_key, parse_adapter, read_adapter
from localrun.errors import UsageError


def test_file_and_scale_as_given_on_the_command_line(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a.gguf").write_bytes(b"")
    assert parse_adapter("a.gguf") == (str(tmp_path / "a.gguf"), 1.0)  # absolute: the background server has another cwd
    assert parse_adapter("a.gguf:0.25") == (str(tmp_path / "a.gguf"), 0.25)
    assert parse_adapter("a.gguf:-1") == (str(tmp_path / "a.gguf"), -1.0)
    assert parse_adapter("sub/b.gguf:2", base_dir=tmp_path / "x") == (str(tmp_path / "x" / "sub" / "b.gguf"), 2.0)
    colon = tmp_path / "c:d.gguf"
    colon.write_bytes(b"")
    assert parse_adapter(str(colon)) == (str(colon), 1.0)  # a colon not followed by a number is the path's
    for bad, words in (("a.gguf:nan", "finite"), ("a.gguf:inf", "finite"), ("", "give the adapter's file"),
                       ("a.gguf:fast", "the scale 'fast' is not a number")):
        with pytest.raises(UsageError) as caught:
            parse_adapter(bad)
        assert words in caught.value.message, caught.value.message


def test_what_llama_cpp_would_refuse_without_the_model_is_refused_naming_the_file(smollm2, tmp_path):
    good = read_adapter(write_lora(smollm2, tmp_path / "good.gguf", layers=2))
    assert good.architecture == "llama" and good.alpha == 16.0 and len(good.pairs) == 4
    assert good.pairs["blk.0.attn_q.weight"] == ((576, 8), (8, 576))  # (ggml order: A is in x rank, B rank x out)

    import gguf
    import numpy as np

    def written(name: str, configure) -> Path:
        writer = gguf.GGUFWriter(tmp_path / name, "llama")
        configure(writer)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        return tmp_path / name

    def lora(writer, kind="lora", tensors=(("blk.0.attn_q.weight.lora_a", (8, 576)), ("blk.0.attn_q.weight.lora_b", (576, 8)))):
        writer.add_type("adapter")
        writer.add_string("adapter.type", kind)
        for name, shape in tensors:
            writer.add_tensor(name, np.zeros(shape, dtype=np.float32))

    cases = {
        tmp_path / "none.gguf": "no such file",
        tmp_path: "is a folder",
        smollm2: "is a model, not a LoRA adapter",
        written("cvec.gguf", lambda w: lora(w, kind="control_vector")): "is a 'control_vector' adapter, not a LoRA",
        written("odd.gguf", lambda w: lora(w, tensors=[("blk.0.attn_q.weight", (8, 576))])): "is not a LoRA tensor",
        written("half.gguf", lambda w: lora(w, tensors=[("blk.0.attn_q.weight.lora_a", (8, 576))])): "lacks its B matrix",
        written("empty.gguf", lambda w: lora(w, tensors=[])): "holds no LoRA tensors",
    }
    text = (tmp_path / "good.gguf").read_bytes()
    (tmp_path / "cut.gguf").write_bytes(text[: len(text) // 2])
    cases[tmp_path / "cut.gguf"] = "truncated"
    (tmp_path / "text.gguf").write_text("not a gguf")
    cases[tmp_path / "text.gguf"] = "not a GGUF file"
    for path, words in cases.items():
        with pytest.raises(AdapterError) as caught:
            read_adapter(path)
        assert caught.value.path == Path(path) and words in caught.value.reason and "\n" not in caught.value.message, caught.value.message
    norms = written("norms.gguf", lambda w: lora(w, tensors=[("blk.0.attn_q.weight.lora_a", (8, 576)),
                                                              ("blk.0.attn_q.weight.lora_b", (576, 8)), ("blk.0.attn_norm.weight", (576,))]))
    assert list(read_adapter(norms).pairs) == ["blk.0.attn_q.weight"]  # a norm's tensor is skipped, as llama.cpp skips it
    named = written("named.gguf", lambda w: (lora(w), w.add_string("adapter.lora.task_name", "summarize"),
                                             w.add_string("adapter.lora.prompt_prefix", "Summarize: ")))
    assert (read_adapter(named).task_name, read_adapter(named).prompt_prefix) == ("summarize", "Summarize: ")  # as llama-server lists


def test_an_adapter_for_another_model_is_refused_naming_both(smollm2, gemma, tmp_path):
    check_adapter(read_adapter(write_lora(smollm2, tmp_path / "mine.gguf", layers=1)), smollm2)  # (fits)
    check_adapter(read_adapter(_gemma_lora(gemma, tmp_path / "gemma3.gguf")), gemma)  # (gemma's own: fits gemma)
    for adapter, words in (
        (write_lora(smollm2, tmp_path / "qwen2.gguf", layers=1, architecture="qwen2"), "is for the qwen2 architecture, not llama"),
        (_gemma_lora(gemma, tmp_path / "gemma.gguf", architecture="llama"), "640x1024, SmolLM2-135M-Instruct.Q4_1.gguf's is 576x576"),
        (_gemma_lora(gemma, tmp_path / "gemma3.gguf"), "not llama"),
    ):
        with pytest.raises(AdapterError) as caught:
            check_adapter(read_adapter(adapter), smollm2)
        assert words in caught.value.message and str(adapter) in caught.value.message, caught.value.message
    missing = write_lora(smollm2, tmp_path / "extra.gguf", layers=1, targets=("attn_q",))
    adapter = read_adapter(missing)
    adapter.pairs["blk.99.attn_q.weight"] = adapter.pairs.pop("blk.0.attn_q.weight")  # a weight SmolLM2 lacks
    with pytest.raises(AdapterError) as caught:
        check_adapter(adapter, smollm2)
    assert "adapts 'blk.99.attn_q.weight', which SmolLM2-135M-Instruct.Q4_1.gguf does not have" in caught.value.message


def _gemma_lora(gemma: Path, out: Path, architecture: str = "") -> Path:
    """What write_lora(gemma, out, layers=1) writes (attn_q's and attn_v's A and B of rank 8 for the first layer, said
    to be for `architecture`, by default gemma's), its shapes from gemma's header as engine.gguf_info reads it (the
    embedding in; heads x head size out) in a blink, where the gguf package's reader first makes a view of each of
    gemma's 262,144 tokens (20 s and more on a busy core)."""
    import gguf
    import numpy as np

    info, rank = read_info(gemma), 8
    writer = gguf.GGUFWriter(out, architecture or info.architecture)
    writer.add_type("adapter")
    writer.add_string("adapter.type", "lora")
    writer.add_float32("adapter.lora.alpha", 16.0)
    rng = np.random.default_rng(0)
    for target, n_out in (("attn_q", info.n_head * info.head_dim_k), ("attn_v", info.kv_heads[0] * info.head_dim_v)):
        name = f"blk.0.{target}.weight"
        writer.add_tensor(f"{name}.lora_a", (rng.standard_normal((rank, info.n_embd)) * 0.05).astype(np.float32))
        writer.add_tensor(f"{name}.lora_b", (rng.standard_normal((n_out, rank)) * 0.05).astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def test_the_key_of_kv_made_under_adapters():
    assert lora_key(()) == () and lora_key((0.0, 0.0)) == ()  # none taking part: the model alone
    assert lora_key((1.0, 0.0)) == ((0, 1.0),) and lora_key((0.0, 0.5)) == ((1, 0.5),)
    assert lora_key((1.0, 0.5)) != lora_key((0.5, 1.0))
