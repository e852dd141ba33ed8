"""LoRA adapters end to end: `run --lora FILE[:SCALE]` (in this process and through the background server), a
Modelfile's ADAPTER, what `show` lists, llama-server's answer with the same adapter token for token, and the KV a
session or the prefix cache keeps never reused under other adapters. Each adapter is a GGUF written here
(tests/loramodel.py): small random A and B matrices over SmolLM2's attention, or over the tiny model's
(tests/tinymodel.py) where the subject is which KV a session or the prefix cache keeps and what a load lists, not
the words."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import last_json, run_cli

from llamaserver import LLAMA_SERVER, NO_LLAMA_SERVER, llama_server
from loramodel import write_lora
from tinymodel import write_tiny_model

PROMPT = "The capital of France is"
# A document of some 380 tokens (more on the tiny model's 256 merges): past MIN_PREFIX_TOKENS, so the prefix cache
# stores it (tests/cli/test_run_sessions.py).
DOC = (Path(__file__).resolve().parents[2] / "src" / "localrun" / "data" / "wonderland.txt").read_text()[:1500]


@pytest.fixture(scope="module")
def adapters(smollm2, tmp_path_factory) -> dict[str, Path]:
    where = tmp_path_factory.mktemp("lora")
    return {
        "lora": write_lora(smollm2, where / "lora.gguf"),
        "other": write_lora(smollm2, where / "other.gguf", seed=7, magnitude=0.1, targets=("attn_k", "attn_output")),
        "qwen2": write_lora(smollm2, where / "qwen2.gguf", architecture="qwen2"),
    }


@pytest.fixture(scope="module")
def answers(smollm2, adapters) -> dict[str, dict]:
    """SmolLM2's greedy answer in this process (24 tokens: `run --json`'s done event) alone, under the adapter and
    under it at scale 0.5: what several tests compare with. The same command answers the same: each is asked once."""
    lora = adapters["lora"]
    asked = {"base": [], "lora": ["--lora", str(lora)], "half": ["--lora", f"{lora}:0.5"]}
    return {name: answer(run_cli, smollm2, *flags, "--keep-alive", "0", n=24) for name, flags in asked.items()}


@pytest.fixture(scope="module")
def tiny(smollm2, tmp_path_factory) -> dict[str, Path]:
    """The tiny model (SmolLM2's special tokens, bytes and first 256 merges on two layers of random weights) and an
    adapter of its own: for the tests of which KV a session or the prefix cache may reuse under which adapters and
    what a load keeps, whose subject is not the words. A prompt of hundreds of tokens costs it a blink where
    SmolLM2 takes seconds on one thread."""
    where = tmp_path_factory.mktemp("tiny-lora")
    model = write_tiny_model(smollm2, where / "tiny.gguf", merges=256)
    return {"model": model, "lora": write_lora(model, where / "tiny-lora.gguf")}


def answer(cli, model, *args, prompt=PROMPT, n=12, input=None) -> dict:
    r = cli("run", str(model), "--raw", "-t", "0", "-n", str(n), "--threads", "1", "--json", *args, prompt, input=input)
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr
    return last_json(r.stdout)


def test_an_adapter_changes_the_greedy_answer_and_scale_0_is_the_model_alone(smollm2, adapters, answers, cli):
    base, adapted, half = (answers[name]["tokens"] for name in ("base", "lora", "half"))
    assert adapted != base
    assert answer(cli, smollm2, "--lora", f"{adapters['lora']}:0", n=24)["tokens"] == base
    # the scale counts (llama.cpp's scale x alpha / rank): half of it is neither
    assert half not in (base, adapted)
    # two adapters together, repeated --lora, are another answer still
    both = answer(cli, smollm2, "--lora", str(adapters["lora"]), "--lora", str(adapters["other"]), n=24)["tokens"]
    assert both not in (base, adapted)


@pytest.mark.skipif(LLAMA_SERVER is None, reason=NO_LLAMA_SERVER)
def test_the_answer_under_an_adapter_is_llama_servers_token_for_token(smollm2, adapters, answers, cli, resident):
    """llama-server (built from the llama.cpp llama-cpp-python vendors) with --lora, asked for the same prompt
    tokens greedily with the adapter's scale per request (its `lora` field: [{"id": 0, "scale": S}]; at scale 0
    llama.cpp leaves the adapter out of the graph, the model alone): localrun's answer in this process and through
    the background server (a slot of its shared scheduler) is the same, token for token, at scale 1 and at 0.5,
    and differs from the model's alone, which is localrun's without the adapter."""
    ours = {1.0: answers["lora"], 0.5: answers["half"]}  # in this process (--keep-alive 0)
    served = answer(cli, smollm2, "--lora", f"{adapters['lora']}:0.5", "--keep-alive", "5m", n=24)
    assert served["tokens"] == ours[0.5]["tokens"]
    prompt = _tokens(smollm2)
    with llama_server(smollm2, "--lora", str(adapters["lora"]), "-c", "512", "-np", "1") as http:
        for scale, mine in ours.items():
            theirs = _llama_server_tokens(http, prompt, 24, scale)
            assert mine["tokens"] == theirs, (scale, mine["text"])
        alone = _llama_server_tokens(http, prompt, 24, 0.0)
    assert alone != ours[1.0]["tokens"] and alone == answers["base"]["tokens"]


def _tokens(model: Path) -> list[int]:
    from localrun.engine import Engine, LoadOptions

    with Engine(model, LoadOptions(n_ctx=64, n_threads=1)) as engine:
        return engine.tokenize(PROMPT)  # (as run --raw tokenizes it: BOS first where the model adds one)


def _llama_server_tokens(http, prompt: list[int], n: int, scale: float) -> list[int]:
    reply = http.post("/completion", json={"prompt": prompt, "n_predict": n, "temperature": 0, "return_tokens": True,
                                           "cache_prompt": False, "lora": [{"id": 0, "scale": scale}]})
    assert reply.status_code == 200, reply.text
    return reply.json()["tokens"]


def test_a_session_made_without_the_adapter_is_not_resumed_with_it(tiny, cli):
    first = cli("run", str(tiny["model"]), "-t", "0", "-n", "4", "--threads", "1", "--session", "plain", "Hello")
    assert first.returncode == 0, first.stderr
    refused = cli("run", str(tiny["model"]), "-t", "0", "-n", "4", "--threads", "1", "--session", "plain",
                  "--lora", str(tiny["lora"]), "And then?")
    assert refused.returncode == 1 and "Traceback" not in refused.stderr
    line = refused.stderr.strip()
    assert "\n" not in line and "session 'plain'" in line and "without LoRA adapters" in line, line
    # and the other way round: made under an adapter, resumed under it alone (not at another scale, not without it)
    made = cli("run", str(tiny["model"]), "-t", "0", "-n", "4", "--threads", "1", "--session", "tuned", "--lora", str(tiny["lora"]), "Hello")
    assert made.returncode == 0, made.stderr
    for flags in ([], ["--lora", f"{tiny['lora']}:0.5"]):
        other = cli("run", str(tiny["model"]), "-t", "0", "-n", "4", "--threads", "1", "--session", "tuned", *flags, "And then?")
        assert other.returncode == 1 and "session 'tuned' was saved with LoRA adapter" in other.stderr, other.stderr
    again = cli("run", str(tiny["model"]), "-t", "0", "-n", "4", "--threads", "1", "--session", "tuned", "--lora", str(tiny["lora"]),
                "--json", "And then?")
    assert again.returncode == 0, again.stderr
    assert last_json(again.stdout)["stats"]["cached_tokens"] > 0  # its KV, restored
    shown = cli("sessions", "show", "tuned").stdout
    assert "LoRA adapters" in shown and "at scale 1.0" in shown and "LoRA" not in cli("sessions", "show", "plain").stdout


def test_the_prefix_cache_is_not_shared_across_adapters_or_scales(tiny, cli):
    flags = ["--ctx", "2048", "--no-flash-attn"]
    plain = answer(cli, tiny["model"], *flags, prompt="Who is the story about?", input=DOC, n=8)
    assert plain["stats"]["cached_tokens"] == 0
    tuned = answer(cli, tiny["model"], *flags, "--lora", str(tiny["lora"]), prompt="Where did Alice fall?", input=DOC, n=8)
    assert tuned["stats"]["cached_tokens"] == 0  # the document's chunks made without the adapter: not for it
    half = answer(cli, tiny["model"], *flags, "--lora", f"{tiny['lora']}:0.5", prompt="Where did Alice fall?", input=DOC, n=8)
    assert half["stats"]["cached_tokens"] == 0  # nor at another scale
    again = answer(cli, tiny["model"], *flags, "--lora", str(tiny["lora"]), prompt="Where did Alice fall?", input=DOC, n=8)
    assert again["stats"]["cached_tokens"] > 0.9 * tuned["stats"]["prompt_tokens"]  # its own, restored from disk
    cold = answer(cli, tiny["model"], *flags, "--lora", str(tiny["lora"]), "--no-cache", prompt="Where did Alice fall?", input=DOC, n=8)
    assert cold["tokens"] == again["tokens"]  # and restored, the same answer as evaluated afresh
    zero = answer(cli, tiny["model"], *flags, "--lora", f"{tiny['lora']}:0", prompt="Where did Alice fall?", input=DOC, n=8)
    assert zero["stats"]["cached_tokens"] > 0  # scale 0 is the model alone: its chunks are the same


def test_a_modelfile_adapter_is_kept_by_the_model_and_shown(smollm2, adapters, answers, cli, tmp_path):
    modelfile = tmp_path / "Modelfile"
    modelfile.write_text(f"FROM {smollm2}\nADAPTER {adapters['lora'].name}\n")
    (tmp_path / adapters["lora"].name).write_bytes(adapters["lora"].read_bytes())  # relative to the Modelfile's folder
    made = cli("create", "tuned", "-f", str(modelfile))
    assert made.returncode == 0, made.stderr
    assert answer(cli, "tuned", n=24)["tokens"] == answers["lora"]["tokens"]  # as run --lora answers
    shown = cli("show", "tuned", "--no-measure")
    assert "LoRA adapter 0:" in shown.stdout and str(tmp_path / adapters["lora"].name) in shown.stdout
    assert f"ADAPTER {tmp_path / adapters['lora'].name}" in cli("show", "tuned", "--modelfile").stdout


def test_each_bad_adapter_is_one_line_before_anything_loads(smollm2, adapters, cli, tmp_path):
    half = tmp_path / "half.gguf"
    write_lora(smollm2, half, layers=1)
    text = half.read_bytes()
    (tmp_path / "cut.gguf").write_bytes(text[: len(text) // 3])
    gemma_shaped = tmp_path / "wide.gguf"
    cases = {
        (str(tmp_path / "none.gguf"),): "no such file",
        (str(smollm2),): "is a model, not a LoRA adapter",
        (str(tmp_path),): "is a folder",
        (str(adapters["qwen2"]),): "is for the qwen2 architecture, not llama",
        (str(tmp_path / "cut.gguf"),): "truncated",
        (f"{adapters['lora']}:fast",): "the scale 'fast' is not a number",
        (f"{adapters['lora']}:inf",): "must be a finite number",
    }
    _write_wide(smollm2, gemma_shaped)
    cases[(str(gemma_shaped),)] = "it was made for another base model"
    for given, said in cases.items():
        r = cli("run", str(smollm2), "-n", "2", "--lora", *given, "x")
        assert r.returncode == 2, (given, r.stderr)
        assert said in r.stderr and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, (given, r.stderr)
    modelfile = tmp_path / "Modelfile"
    modelfile.write_text(f"FROM {smollm2}\nADAPTER {adapters['qwen2']}\n")
    r = cli("create", "wrong", "-f", str(modelfile))
    assert r.returncode == 2 and "qwen2 architecture" in r.stderr and r.stderr.count("\n") == 1, r.stderr
    assert cli("show", "wrong", "--no-measure").returncode != 0  # nothing was made


def _write_wide(base: Path, out: Path) -> None:
    """An adapter of the llama architecture whose attn_q is wider than SmolLM2's: one for another base."""
    import gguf
    import numpy as np

    writer = gguf.GGUFWriter(out, "llama")
    writer.add_type("adapter")
    writer.add_string("adapter.type", "lora")
    writer.add_float32("adapter.lora.alpha", 16.0)
    writer.add_tensor("blk.0.attn_q.weight.lora_a", np.zeros((8, 640), dtype=np.float32))
    writer.add_tensor("blk.0.attn_q.weight.lora_b", np.zeros((640, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.mark.skipif(LLAMA_SERVER is None, reason="no llama-perplexity: build it with scripts/build_llama_bench.sh")
def test_bench_measures_under_the_adapter_and_its_perplexity_is_llama_perplexitys(smollm2, adapters, tiny, cli, tmp_path,
                                                                                  monkeypatch):
    """bench --lora: the adapter applies to every row, and --quality's reference, llama-perplexity run with
    --lora-scaled, computes the same perplexity, other than the model's alone (also the same by both). The
    perplexities are measured in this process on the bundled text's first 640 characters (some 165 tokens: two
    chunks of 64, the fewest perplexity scores), as tests/runtime/test_bench.py measures them in chunks of 128 (the
    method is the same; the whole text by both, at 1 thread, took three minutes on a busy core); the command
    line's --lora is read into the rows' settings (on the tiny model and its adapter: what is read, not what is
    measured)."""
    import json

    from localrun.runtime.reports import bench

    short = tmp_path / "short.txt"
    short.write_text(bench.text_path().read_text(encoding="utf-8")[:640], encoding="utf-8")
    monkeypatch.setattr(bench, "text_path", lambda: short)  # (llama-perplexity is given the same file)

    def ppl_row(*lora: str) -> dict:
        plan = bench.make_plan([str(smollm2)], pp="0", tg="0", ctx="64", threads="1", quality=True, lora=list(lora),
                               llama_bench=bench.find_llama_bench())
        (row,) = bench.rows_of(list(bench.run(plan)))
        assert row["test"] == "ppl@c64" and row["ref_ppl"] is not None and row["n_tokens"] == 2 * (64 - 32 - 1)
        return row

    tuned, alone = ppl_row(f"{adapters['lora']}:0.5"), ppl_row()
    assert tuned["ppl"] == tuned["ref_ppl"] and tuned["settings"]["lora"] == [f"{adapters['lora']}:0.5"]
    assert alone["ppl"] == alone["ref_ppl"] and tuned["ppl"] != alone["ppl"]
    r = cli("bench", str(tiny["model"]), "--pp", "0", "--tg", "2", "-r", "1", "--threads", "1", "-o", "json",
            "--lora", f"{tiny['lora']}:0.5")
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    assert rows and all(row["settings"]["lora"] == [f"{tiny['lora']}:0.5"] for row in rows)
    refused = cli("bench", str(smollm2), "--compare", "llama-bench", "--lora", str(adapters["lora"]))
    assert refused.returncode == 2 and "llama-bench loads no LoRA adapters" in refused.stderr


def test_on_the_background_server_a_session_and_a_load_keep_their_adapters(tiny, cli, resident, tmp_path):
    """Through the background server's slots: a session made there without the adapter is refused with it, as in
    this process, before the server is asked (it would have loaded the model again with the adapter, a load option,
    only to refuse the session); a run with the adapter then loads it so (ps: its load's lora)."""
    made = cli("run", str(tiny["model"]), "-t", "0", "-n", "4", "--threads", "1", "--session", "served", "Hello")
    assert made.returncode == 0, made.stderr
    refused = cli("run", str(tiny["model"]), "-t", "0", "-n", "4", "--threads", "1", "--session", "served", "--lora", str(tiny["lora"]), "Go on")
    assert refused.returncode == 1 and "session 'served' was saved without LoRA adapters" in refused.stderr, refused.stderr
    assert refused.stderr.count("\n") == 1 and "Traceback" not in refused.stderr
    import json

    def loads() -> list:
        return [c["load"]["lora"] for c in json.loads(cli("ps", "--json").stdout)[0]["contexts"]]

    assert loads() == [[]]
    tuned = cli("run", str(tiny["model"]), "-t", "0", "-n", "4", "--threads", "1", "--lora", str(tiny["lora"]), "Hello")
    assert tuned.returncode == 0, tuned.stderr
    assert loads() == [[[str(tiny["lora"]), 1.0]]]
    # a created model's own adapter (its Modelfile's ADAPTER) is listed with its load as well
    (tmp_path / "Modelfile").write_text(f"FROM {tiny['model']}\nADAPTER {tiny['lora']}\n")
    assert cli("create", "tuned", "-f", str(tmp_path / "Modelfile")).returncode == 0
    assert cli("run", "tuned", "-t", "0", "-n", "2", "--threads", "1", "Hello").returncode == 0
    listed = {m["name"]: m["contexts"][0]["load"]["lora"] for m in json.loads(cli("ps", "--json").stdout)}
    assert listed["tuned:latest"] == [[str(tiny["lora"]), 1.0]], listed
