"""llama.cpp reserves the output layer's compute buffer for as many rows of logits as one batch may ask for
(n_outputs_max, n_batch unless told): for gemma-3's 262k vocabulary at a batch of 512, 512 MiB that
sampling never uses, since a step asks for one row per sequence. Contexts for sampling are loaded for that
many rows, as llama-server's are; a batch asking for more is refused in one line (llama.cpp would abort
the process on an assertion)."""

from __future__ import annotations

import re

import pytest
from conftest import CORES

pytestmark = pytest.mark.slow


def _compute_mib(lines: list[str]) -> float:
    sizes = [float(m.group(1)) for line in "".join(lines).splitlines() if not line.startswith("~")
             for m in [re.search(r"compute buffer size\s*=\s*([\d.]+) MiB", line)] if m]
    assert sizes, "llama.cpp reported no compute buffer"
    return sum(sizes)


def test_sampling_contexts_reserve_logits_for_their_sequences_not_the_batch(gemma):
    from localrun.engine import Engine, LoadOptions
    from localrun.engine.llama import captured_llama_log
    from localrun.engine.model import Batch, DecodeError
    from localrun.runtime.loader import load
    from localrun.runtime.options import LoadSpec

    vocab_mib = 262144 * 4 / 2**20  # one row of gemma's logits: 1 MiB
    with captured_llama_log() as lines:
        whole = Engine(gemma, LoadOptions(n_ctx=1024, n_seq_max=2, n_threads=min(2, CORES)))  # llama.cpp's default: n_batch rows
        whole.close()
    assert _compute_mib(lines) > 512 * vocab_mib

    with captured_llama_log() as lines:
        loaded = load(str(gemma), LoadSpec(ctx=512, parallel=2, threads=min(2, CORES), gpu_layers="0"))  # as the server loads 2 slots
    engine = loaded.engine
    try:
        assert engine.max_outputs == 2 and _compute_mib(lines) < 32  # llama-server's is 19.8 MiB for 8 slots
        batch = Batch(8)
        tokens = engine.tokenize("The tallest mountain in Europe is")
        for seq in (0, 1):
            batch.add(tokens[0], 0, seq, True)
        engine.decode(batch)  # two rows of logits: what the context holds
        assert [len(t) for t in engine.kv.tokens[:2]] == [1, 1]
        batch.clear()
        for pos, tok in enumerate(tokens[1:4], start=1):
            batch.add(tok, pos, 0, True)
        with pytest.raises(DecodeError, match="3 rows of logits; this context was loaded for 2"):
            engine.decode(batch)
        assert [len(t) for t in engine.kv.tokens[:2]] == [1, 1]  # nothing changed
        batch.close()
    finally:
        loaded.close()


def test_strategies_load_the_rows_they_ask_for():
    from localrun.engine import LoadOptions
    from localrun.engine.strategies import DecodeOptions, context_options

    plain = LoadOptions(n_ctx=512, n_seq_max=1, n_outputs=1)
    assert context_options(DecodeOptions(), plain, 64).n_outputs == 1
    assert context_options(DecodeOptions(draft="lookup", draft_max=6), plain, 64).n_outputs == 7  # the draft and one more
    beams = context_options(DecodeOptions(beams=3), plain, 64)
    assert beams.n_outputs == beams.n_seq_max == 7
