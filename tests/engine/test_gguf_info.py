"""gguf_info: metadata of the two real test models, the KV-cache arithmetic, and refusal of bad files."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
from pathlib import Path

import gguf
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from localrun.errors import InvalidModelFile, UsageError
from localrun.engine.gguf_info import GGUFInfo, kv_cache_bytes, memory_estimate, read_info
from localrun.store.files import sha256_file

from tinymodel import gguf_reader  # (one GGUFReader of SmolLM2 a process: seconds each)

MiB = 1 << 20


# The real models come from conftest's fixtures (fetched once, never skipped).
@pytest.fixture(scope="module")
def smollm(smollm2: Path) -> GGUFInfo:
    return read_info(smollm2)


@pytest.fixture(scope="module")
def gemma_info(gemma: Path) -> GGUFInfo:
    return read_info(gemma)


def make_gguf(path: Path, arch: str = "llama", *, n_layer: int = 2, configure=None, n_tensors: int = 2) -> Path:
    """A tiny valid GGUF model: f32 tensors whose sizes are multiples of the alignment (no trailing padding)."""
    writer = gguf.GGUFWriter(path, arch)
    writer.add_name("tiny")
    writer.add_block_count(n_layer)
    writer.add_context_length(256)
    writer.add_embedding_length(64)
    writer.add_head_count(4)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    if configure:
        configure(writer)
    for i in range(n_tensors):
        writer.add_tensor(f"blk.{i}.attn_q.weight", np.full((2, 8 * (i + 1)), i, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def assert_refused(path: Path, *fragments: str) -> str:
    with pytest.raises(InvalidModelFile) as caught:
        read_info(path)
    message = caught.value.message
    assert "\n" not in message, message
    assert str(path) in message, message
    for fragment in fragments:
        assert fragment in message, message
    return message


# --- the real models -------------------------------------------------------------------------


def test_smollm_metadata(smollm: GGUFInfo, smollm2: Path) -> None:
    assert smollm.architecture == "llama"
    assert smollm.quant == "Q4_1"
    assert smollm.gguf_version == 3
    assert (smollm.n_layer, smollm.n_embd, smollm.n_head, smollm.n_kv_head) == (30, 576, 9, 3)
    assert smollm.kv_heads == (3,) * 30
    assert smollm.head_dim == smollm.head_dim_k == smollm.head_dim_v == 576 // 9 == 64
    assert smollm.context_length == 8192
    assert smollm.sliding_window is None and smollm.swa_layers == ()
    assert smollm.vocab_size == 49152
    assert smollm.chat_template is not None and "<|im_start|>" in smollm.chat_template
    assert (smollm.bos_token_id, smollm.eos_token_id) == (1, 2)
    assert smollm.n_tensors == 272 and smollm.n_split == 1 and smollm.shards == (smollm2,)
    assert smollm.file_size == smollm2.stat().st_size
    assert smollm.metadata["general.architecture"] == "llama"


def test_gemma_metadata(gemma_info: GGUFInfo) -> None:
    gemma = gemma_info
    assert gemma.architecture == "gemma3"
    assert gemma.quant == "Q4_K_M"
    assert (gemma.n_layer, gemma.n_embd, gemma.n_head, gemma.n_kv_head) == (18, 640, 4, 1)
    # key_length is given and differs from n_embd / n_head = 160.
    assert gemma.head_dim_k == gemma.head_dim_v == 256
    assert gemma.context_length == 32768
    assert gemma.chat_template is None
    assert gemma.vocab_size == 262144
    assert (gemma.bos_token_id, gemma.eos_token_id) == (2, 1)
    # The window is in the file; the pattern (every 6th layer global) is llama.cpp's default for gemma3.
    assert gemma.sliding_window == 512
    assert gemma.swa_pattern == 6
    assert [il for il, swa in enumerate(gemma.swa_layers) if not swa] == [5, 11, 17]


@pytest.mark.parametrize("which", ["smollm2", "gemma"])
def test_layer_count_matches_tensor_names(which: str, request: pytest.FixtureRequest) -> None:
    """Cross-check by other means: grep the raw header for blk.N. tensor names."""
    model: Path = request.getfixturevalue(which)
    info = read_info(model)
    header = model.read_bytes()[: info.file_size - info.tensor_bytes]
    blocks = {int(n) for n in re.findall(rb"blk\.(\d+)\.", header)}
    assert blocks == set(range(info.n_layer))


def test_smollm_agrees_with_gguf_reader(smollm: GGUFInfo, smollm2: Path) -> None:
    reader = gguf_reader(smollm2)
    assert smollm.n_tensors == len(reader.tensors)
    assert smollm.n_params == sum(int(t.n_elements) for t in reader.tensors)
    assert smollm.tensor_bytes == sum(int(t.n_bytes) for t in reader.tensors)
    assert smollm.file_size == max(int(t.data_offset) + int(t.n_bytes) for t in reader.tensors)
    assert smollm.chat_template == reader.fields["tokenizer.chat_template"].contents()


def test_kv_cache_by_hand(smollm: GGUFInfo, gemma_info: GGUFInfo) -> None:
    gemma = gemma_info
    # 2 (K and V) x layers x kv heads x head dim x 2 bytes (f16) x n_ctx
    assert kv_cache_bytes(smollm, 2048) == 2 * 30 * 3 * 64 * 2 * 2048 == 45 * MiB
    assert kv_cache_bytes(gemma, 2048) == 2 * 18 * 1 * 256 * 2 * 2048 == 36 * MiB
    # q8_0: 34 bytes per block of 32 elements.
    assert kv_cache_bytes(smollm, 2048, "q8_0") == 2 * 30 * (3 * 64 // 32 * 34) * 2048
    assert kv_cache_bytes(smollm, 2048, "Q4_0") == 2 * 30 * (3 * 64 // 32 * 18) * 2048
    assert kv_cache_bytes(smollm, 2048, "f32") == 2 * kv_cache_bytes(smollm, 2048)
    # Without a full-size SWA cache the 15 sliding layers hold window + micro-batch = 512 + 512 cells,
    # the 3 global layers the whole context. These match llama.cpp's own log for n_ctx=2048
    # (6.00 MiB non-SWA + 15.00 MiB SWA).
    per_cell_layer = 2 * 1 * 256 * 2
    assert kv_cache_bytes(gemma, 2048, swa_full=False) == 3 * 2048 * per_cell_layer + 15 * 1024 * per_cell_layer
    assert kv_cache_bytes(gemma, 2048, swa_full=False) == 21 * MiB
    assert kv_cache_bytes(smollm, 2048, swa_full=False) == kv_cache_bytes(smollm, 2048)
    # A short context never exceeds the full cache.
    assert kv_cache_bytes(gemma, 256, swa_full=False) == kv_cache_bytes(gemma, 256)


def test_kv_cache_context_rounding(smollm: GGUFInfo) -> None:
    assert kv_cache_bytes(smollm, 2000) == kv_cache_bytes(smollm, 2048)  # llama.cpp pads n_ctx to 256
    assert kv_cache_bytes(smollm, 0) == kv_cache_bytes(smollm, smollm.context_length)


@pytest.mark.parametrize("bad", [{"n_ctx": -1}, {"n_ctx": 1.5}, {"kv_type": "q3_k"}, {"kv_type": "f8"}])
def test_kv_cache_bad_arguments(smollm: GGUFInfo, bad: dict) -> None:
    args = {"n_ctx": 2048, "kv_type": "f16", **bad}
    with pytest.raises(UsageError, match=re.escape(repr(next(iter(bad.values()))))):
        kv_cache_bytes(smollm, args["n_ctx"], args["kv_type"])


def test_memory_estimate(smollm: GGUFInfo, smollm2: Path) -> None:
    # The weights are the tensors' bytes as the gguf package's own reader sizes them (the file without its
    # header and alignment padding); the KV cache is test_kv_cache_by_hand's 2 x 30 x 3 x 64 x 2 bytes x 2048.
    weights = sum(int(t.n_bytes) for t in gguf_reader(smollm2).tensors)
    assert 0.9 * smollm2.stat().st_size < weights < smollm2.stat().st_size
    estimate = memory_estimate(smollm, 2048, "f16")
    assert estimate == {"weights_bytes": weights, "kv_bytes": 45 * MiB, "total_bytes": weights + 45 * MiB}


# --- synthetic files ---------------------------------------------------------------------------


def test_tiny_file(tmp_path: Path) -> None:
    info = read_info(make_gguf(tmp_path / "tiny.gguf"))
    assert (info.architecture, info.name, info.quant, info.n_layer) == ("llama", "tiny", "F32", 2)
    assert info.n_params == 2 * 8 + 2 * 16 and info.tensor_bytes == 4 * info.n_params
    assert info.head_dim == 64 // 4 and info.n_kv_head == 4  # head_count_kv defaults to head_count
    assert info.chat_template is None and info.vocab_size is None


def test_quant_falls_back_to_dominant_tensor_type(tmp_path: Path) -> None:
    path = tmp_path / "noftype.gguf"
    writer = gguf.GGUFWriter(path, "llama")
    for key, value in (("llama.block_count", 1), ("llama.context_length", 64), ("llama.embedding_length", 8)):
        writer.add_uint32(key, value)
    writer.add_tensor("norm", np.zeros(64, dtype=np.float32))
    writer.add_tensor("big", np.zeros((4, 64), dtype=np.float16))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    assert read_info(path).quant == "F16"


def test_per_layer_kv_heads(tmp_path: Path) -> None:
    """Hybrid models give head_count_kv per layer, 0 for layers without attention."""

    def configure(w: gguf.GGUFWriter) -> None:
        w.add_head_count_kv([2, 0, 1])
        w.add_key_length(32)
        w.add_value_length(16)

    info = read_info(make_gguf(tmp_path / "hybrid.gguf", n_layer=3, configure=configure))
    assert info.kv_heads == (2, 0, 1) and info.n_kv_head == 2
    assert (info.head_dim_k, info.head_dim_v) == (32, 16)
    assert kv_cache_bytes(info, 256) == (2 + 0 + 1) * (32 + 16) * 2 * 256


def test_explicit_sliding_window_pattern(tmp_path: Path) -> None:
    def configure(w: gguf.GGUFWriter) -> None:
        w.add_sliding_window(128)
        w.add_sliding_window_pattern([True, False, True])

    info = read_info(make_gguf(tmp_path / "swa.gguf", "gemma3", n_layer=3, configure=configure))
    assert info.sliding_window == 128 and info.swa_layers == (True, False, True) and info.swa_pattern is None
    per_cell = 2 * 4 * 16 * 2
    # SWA layers: min(4096, 128 + 512) rounded up to 256 = 768 cells.
    assert kv_cache_bytes(info, 4096, swa_full=False) == 4096 * per_cell + 2 * 768 * per_cell


def test_sharded_model(tmp_path: Path) -> None:
    writer = gguf.GGUFWriter(tmp_path / "big.gguf", "llama", split_max_tensors=1)
    writer.add_block_count(3)
    writer.add_context_length(64)
    writer.add_embedding_length(8)
    for i in range(3):
        writer.add_tensor(f"blk.{i}.w", np.zeros(8 * (i + 1), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    shards = [tmp_path / f"big-0000{i}-of-00003.gguf" for i in (1, 2, 3)]

    info = read_info(shards[0])
    assert info.n_split == 3 and info.shards == tuple(shards)
    assert info.n_tensors == 3 and info.n_params == 8 + 16 + 24
    assert info.file_size == sum(s.stat().st_size for s in shards)

    assert_refused(shards[1], "shard 2 of 3", shards[0].name)
    shards[2].write_bytes(shards[2].read_bytes()[:-4])
    with pytest.raises(InvalidModelFile, match="truncated") as caught:
        read_info(shards[0])
    assert str(shards[2]) in caught.value.message
    shards[1].unlink()
    assert_refused(shards[0], shards[1].name, "missing")
    renamed = shards[0].rename(tmp_path / "renamed.gguf")
    assert_refused(renamed, "-00001-of-00003.gguf")


# --- bad input -----------------------------------------------------------------------------


def test_empty_file(tmp_path: Path) -> None:
    path = tmp_path / "empty.gguf"
    path.touch()
    assert_refused(path, "empty")


def test_text_file(tmp_path: Path) -> None:
    path = tmp_path / "readme.gguf"
    path.write_text("# Model card\n\nThis is not a model.\n")
    assert_refused(path, "not a GGUF file")


def test_html_error_page(tmp_path: Path) -> None:
    path = tmp_path / "model.gguf"
    path.write_text("<!DOCTYPE html><html><body>Access denied</body></html>")
    assert_refused(path, "not a GGUF file")


def test_random_bytes(tmp_path: Path) -> None:
    path = tmp_path / "noise.gguf"
    path.write_bytes(np.random.default_rng(0).bytes(4096))
    assert_refused(path)


def test_directory(tmp_path: Path) -> None:
    assert_refused(tmp_path, "directory")


def test_missing(tmp_path: Path) -> None:
    assert_refused(tmp_path / "nowhere.gguf", "no such file")


def test_truncated_real_model(tmp_path: Path, smollm2: Path) -> None:
    data = smollm2.read_bytes()
    path = tmp_path / "partial.gguf"
    path.write_bytes(data[: len(data) * 4 // 10])
    assert_refused(path, "truncated", f"expected {len(data)} bytes", f"found {len(data) * 4 // 10}")


def test_truncated_in_header(tmp_path: Path, smollm2: Path) -> None:
    path = tmp_path / "head.gguf"
    with open(smollm2, "rb") as f:
        path.write_bytes(f.read(100))
    assert_refused(path, "truncated")


def test_truncated_inside_the_vocabulary(tmp_path: Path, smollm2: Path) -> None:
    """A cut inside the 49,152-token list, which is stepped over string by string, not kept."""
    with open(smollm2, "rb") as f:
        head = f.read(600_000)
    assert b"<|im_start|>" in head[:300_000]  # the vocabulary runs on past the cut
    path = tmp_path / "vocab.gguf"
    path.write_bytes(head)
    assert_refused(path, "truncated")


def test_a_file_read_before_is_not_parsed_again_until_it_changes(tmp_path: Path, smollm2: Path) -> None:
    path = tmp_path / "model.gguf"
    shutil.copyfile(smollm2, path)
    assert read_info(path) is not read_info(path)  # just written: its time could stay the same through a change
    old = path.stat().st_mtime - 60
    os.utime(path, (old, old))
    first = read_info(path)
    assert read_info(path) is first and read_info(str(path)) is first
    with open(path, "r+b") as f:  # the same file, cut, and given its old time back
        f.truncate(path.stat().st_size - 1)
    os.utime(path, (old, old))
    assert_refused(path, "truncated")
    shutil.copyfile(smollm2, path)
    os.utime(path, (old, old))
    assert read_info(path) == first


def test_unknown_architecture(tmp_path: Path) -> None:
    path = make_gguf(tmp_path / "odd.gguf", "notanarch")
    assert_refused(path, "'notanarch'")


def test_unsupported_version(tmp_path: Path) -> None:
    path = make_gguf(tmp_path / "v1.gguf")
    data = bytearray(path.read_bytes())
    data[4:8] = (1).to_bytes(4, "little")
    path.write_bytes(bytes(data))
    assert_refused(path, "version 1")


def test_adapter_is_not_a_model(tmp_path: Path) -> None:
    path = make_gguf(tmp_path / "lora.gguf", configure=lambda w: w.add_type("adapter"))
    assert_refused(path, "'adapter'")


def test_missing_required_key(tmp_path: Path) -> None:
    path = tmp_path / "nolayers.gguf"
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_tensor("w", np.zeros(8, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    assert_refused(path, "llama.block_count")


@pytest.fixture(scope="module")
def tiny_bytes(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """A small file that still has every kind of metadata value: strings, per-layer arrays, a vocabulary."""

    def configure(w: gguf.GGUFWriter) -> None:
        w.add_head_count_kv([2, 1, 0])
        w.add_sliding_window(64)
        w.add_sliding_window_pattern([True, False, True])
        w.add_token_list(["<s>", "a", "b"])
        w.add_chat_template("{{ messages }}")
        w.add_bos_token_id(0)

    return make_gguf(tmp_path_factory.mktemp("tiny") / "tiny.gguf", "gemma3", n_layer=3, configure=configure).read_bytes()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_every_truncation_is_refused(tmp_path: Path, tiny_bytes: bytes, data: st.DataObject) -> None:
    cut = data.draw(st.integers(0, len(tiny_bytes) - 1))
    path = tmp_path / "cut.gguf"
    path.write_bytes(tiny_bytes[:cut])
    assert_refused(path)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_corruption_never_escapes_as_another_exception(tmp_path: Path, tiny_bytes: bytes, data: st.DataObject) -> None:
    """Overwrite a few header bytes: either the file still reads, or it is refused in one line."""
    corrupt = bytearray(tiny_bytes)
    header_end = len(tiny_bytes) - 4 * (2 * 8 + 2 * 16)
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(4, header_end - 1))
        corrupt[at] = data.draw(st.integers(0, 255))
    path = tmp_path / "corrupt.gguf"
    path.write_bytes(bytes(corrupt))
    try:
        read_info(path)
    except InvalidModelFile as exc:
        assert "\n" not in exc.message and str(path) in exc.message


# --- sha256 ----------------------------------------------------------------------------------


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(content=st.binary(max_size=5000), chunk=st.integers(1, 4096))
def test_sha256_file(tmp_path: Path, content: bytes, chunk: int) -> None:
    path = tmp_path / "blob"
    path.write_bytes(content)
    assert sha256_file(path, chunk=chunk) == hashlib.sha256(content).hexdigest()


def test_sha256_of_a_copy_matches(tmp_path: Path) -> None:
    source = make_gguf(tmp_path / "a.gguf")
    shutil.copy(source, tmp_path / "b.gguf")
    assert sha256_file(source) == sha256_file(tmp_path / "b.gguf")
