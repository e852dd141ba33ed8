"""`localrun bench`: the plan's checks, the output formats and their schema, the measurements' structure
(never their speed: the machine is shared and noisy), the comparison with llama-bench, and perplexity
agreeing with llama.cpp's own llama-perplexity."""

from __future__ import annotations

import csv
import io
import json
import math
import signal
import statistics
import subprocess
import sys

import jsonschema
import pytest

from localrun.cli.failures import message_for

from conftest import LOCALRUN
from localrun.cli import bench as front
from localrun.runtime.reports import bench
from localrun.errors import LocalrunError, UsageError


def _llama_bench():
    try:
        return bench.find_llama_bench()
    except LocalrunError:
        return None


LLAMA_BENCH = _llama_bench()
needs_llama_bench = pytest.mark.skipif(LLAMA_BENCH is None, reason=f"no llama-bench: build it with {bench.BUILD_SCRIPT}")

# Rows round tokens/s to 3 decimals (samples and statistics alike): a statistic recomputed from the rounded
# samples is within a few thousandths of the reported one.
ROUNDING = 2e-3


def tpot_slack(ts: float) -> float:
    """How far 1000 / ts (ms per token) may move with the rounding of ts (t/s) to 3 decimals and of the TPOT
    itself: 0.5e-3 x 1000 / ts², negligible at hundreds of t/s, a millisecond at 0.6 t/s (gemma's tg4 at 2
    threads on a busy core)."""
    return 0.5 / ts**2 + 0.5e-3


def assert_statistics_of_samples(row: dict) -> None:
    """mean, sample std and median are those of samples_ts (and TPOT the median time per token of them)."""
    samples = row["samples_ts"]
    assert len(samples) == row["reps"] and all(s > 0 for s in samples)
    assert row["mean_ts"] == pytest.approx(statistics.fmean(samples), abs=ROUNDING)
    assert row["std_ts"] == pytest.approx(statistics.stdev(samples) if len(samples) > 1 else 0.0, abs=ROUNDING)
    assert row["median_ts"] == pytest.approx(statistics.median(samples), abs=ROUNDING)
    if row["kind"] == "tg":  # n tokens in n/ts seconds each repetition: the median of 1000/ts ms per token
        assert row["tpot_ms"] == pytest.approx(statistics.median(1000 / s for s in samples), rel=1e-4,
                                               abs=tpot_slack(min(samples)))


# -- the plan ---------------------------------------------------------------------------------------


def test_plan_orders_tests_and_sweeps_every_combination():
    plan = bench.make_plan(["m"], pp="128,512", tg="32,64", depth="0,256", threads="1,2", kv_type="f16,q8_0", reps=3)
    assert [t.name for t in plan.tests] == ["pp128", "pp512", "tg32@d0", "tg32@d256", "tg64@d0", "tg64@d256"]
    assert [(s.threads, s.kv_type) for s in plan.settings] == [(1, "f16"), (1, "q8_0"), (2, "f16"), (2, "q8_0")]
    assert plan.ttft_tokens == 128 and plan.reps == 3 and plan.llama_bench is None
    # The context is sized to the largest test unless --ctx is given.
    assert plan.settings[0].n_ctx(plan.tests) == 512 + 1
    assert plan.settings[0].n_ctx(plan.tests[2:]) == 256 + 64 + 1  # tg64@d256: 64 decodes after 256 tokens


def test_zero_skips_a_kind_of_test_as_in_llama_bench():
    assert [t.name for t in bench.make_plan(["m"], pp="0", tg="16").tests] == ["tg16@d0"]
    assert [t.name for t in bench.make_plan(["m"], pp="8", tg="0").tests] == ["pp8"]
    assert bench.make_plan(["m"], pp="0", tg="0", quality=True).tests == []


def test_settings_map_to_llama_bench_flags_as_the_engine_resolves_them():
    s = bench.make_plan(["m"], threads="3", kv_type="q8_0", gpu_layers="0").settings[0]
    assert s.llama_args() == ["-t", "3", "-ngl", "0", "-fa", "on", "-ctk", "q8_0", "-ctv", "q8_0"]
    opts = s.load_options(300)
    assert (opts.n_ctx, opts.n_threads, opts.kv_type, opts.flash_attn, opts.n_batch) == (300, 3, "q8_0", None, 512)


@pytest.mark.parametrize(
    "options, message",
    [
        ({"output": "xml"}, "invalid --output 'xml'"),
        ({"reps": 0}, "invalid --reps 0"),
        ({"pp": "128,,512"}, "invalid --pp '128,,512'"),
        ({"pp": "big"}, "invalid --pp value 'big'"),
        ({"tg": "-1"}, "invalid --tg value -1"),
        ({"depth": "0,x"}, "invalid --depth value 'x'"),
        ({"threads": "0"}, "invalid --threads value 0"),
        ({"ctx": "8"}, "invalid --ctx value 8"),
        ({"ctx": "64", "pp": "128"}, "--ctx 64 is too small for pp128"),
        ({"batch": "0"}, "invalid --batch value 0"),
        ({"kv_type": "f16,q5"}, "invalid --kv-type value 'q5'"),
        ({"gpu_layers": "some"}, "invalid --gpu-layers 'some'"),
        ({"flash_attn": "yes"}, "invalid --flash-attn value 'yes'"),
        ({"kv_type": "q8_0", "flash_attn": "off"}, "needs flash attention"),
        ({"pp": "0", "tg": "0"}, "nothing to measure"),
        ({"compare": "ollama"}, "invalid --compare 'ollama'"),
    ],
)
def test_bad_options_are_usage_errors_naming_the_value(options, message):
    with pytest.raises(UsageError) as info:
        bench.make_plan(["m"], **options)
    shown = message_for(info.value)[0]  # as the command line words it (errors.SettingError: flags at the edge)
    assert message in shown
    assert "\n" not in shown


def test_missing_llama_bench_names_the_build_script(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(LocalrunError) as info:
        bench.make_plan(["m"], compare="llama-bench")
    assert "scripts/build_llama_bench.sh" in info.value.message
    with pytest.raises(UsageError, match="not an executable"):
        bench.make_plan(["m"], llama_bench=tmp_path / "nope")


def test_plot_without_matplotlib_says_how_to_get_it(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes `import matplotlib` fail
    with pytest.raises(LocalrunError) as info:
        bench.make_plan(["m"], plot=tmp_path / "p.png")
    assert message_for(info.value)[0] == "--plot needs matplotlib: pip install -e '.[plot]' (or pip install matplotlib)"


def test_cli_bad_input_is_one_line_and_exit_2(cli):
    for args in (["--output", "xml"], ["--reps", "0"], ["--threads", "1,two"]):
        r = cli("bench", "no-such-model", *args)
        assert r.returncode == 2, (args, r.stderr)
        assert r.stdout == ""
        assert len(r.stderr.strip().splitlines()) == 1 and r.stderr.startswith("error:"), r.stderr


def test_buffer_sizes_are_read_from_llama_cpp_log():
    log = [
        "load_tensors:   CPU_Mapped model buffer size =   235.16 MiB\n",
        "load_tensors:        CUDA0 model buffer size =  1024.00 MiB\n",
        "llama_kv_cache:      CUDA0 KV buffer size =    64.00 MiB\n",
        "llama_kv_cache:        CPU KV buffer size =     2.00 MiB\n",
        "llama_context:  CUDA_Host  output buffer size =     1.00 MiB\n",
        "sched_reserve:      CUDA0 compute buffer size =   100.00 MiB\n",
    ]
    kv, device = bench.allocated_buffers(log)
    assert kv == 66 * 2**20
    assert device == (1024 + 64 + 100) * 2**20
    assert bench.allocated_buffers(log[:1] + log[3:4]) == (2 * 2**20, None)  # CPU only: device memory n/a


def test_bundled_text_ships_with_its_source():
    text = bench.text_path().read_text(encoding="utf-8")
    assert len(text.split()) > 3000 and text.lstrip().startswith("CHAPTER I")
    assert "public domain" in (bench.text_path().parent / "README.md").read_text()


# -- real runs --------------------------------------------------------------------------------------

# One thread: on a busy two-core machine, two spinning threads waiting on each other make runs crawl.
SMALL = ["--pp", "16,32", "--tg", "4", "--depth", "0,16", "--reps", "2", "--threads", "1"]


@pytest.fixture(scope="module")
def json_run(smollm2):
    proc = subprocess.run([LOCALRUN, "bench", str(smollm2), *SMALL, "--output", "json"], capture_output=True,
                          text=True, stdin=subprocess.DEVNULL, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return proc


@pytest.mark.slow
def test_json_rows_validate_and_are_sane(json_run, smollm2):
    rows = json.loads(json_run.stdout)
    jsonschema.Draft202012Validator.check_schema(bench.RESULT_SCHEMA)
    jsonschema.validate(rows, bench.RESULT_SCHEMA)
    assert [r["test"] for r in rows] == ["pp16", "pp32", "tg4@d0", "tg4@d16"]
    for r in rows:
        assert r["model"] == smollm2.name and r["model_path"] == str(smollm2) and r["reps"] == 2
        assert_statistics_of_samples(r)
        assert r["ttft_ms"] > 0 and r["load_ms"] > 0 and r["peak_rss_bytes"] > 50e6 and r["kv_bytes"] > 0
        assert r["device_bytes"] is None  # the CPU build: no GPU memory to report
        assert r["settings"] == {"threads": 1, "ctx": 32 + 1, "batch": 512,
                                 "kv_type": "f16", "gpu_layers": "auto", "flash_attn": "auto", "decode": "plain"}
        assert "ratio" not in r and "ref_mean_ts" not in r
        assert (r["tpot_ms"] is None) == (r["kind"] == "pp")
        assert (r["kind"], r["n_tokens"], r["depth"]) == {"pp16": ("pp", 16, 0), "pp32": ("pp", 32, 0),
                                                          "tg4@d0": ("tg", 4, 0), "tg4@d16": ("tg", 4, 16)}[r["test"]]
    assert len({(r["ttft_ms"], r["load_ms"], r["peak_rss_bytes"]) for r in rows}) == 1  # per model+settings
    # Progress and per-test lines went to stderr, never into the JSON.
    assert "pp16" in json_run.stderr


@pytest.mark.slow
def test_csv_md_and_table_render_the_same_rows(json_run, capsys):
    rows = json.loads(json_run.stdout)
    table = list(csv.DictReader(io.StringIO(front.to_csv(rows))))
    assert list(table[0]) == bench.CSV_FIELDS
    assert [t["test"] for t in table] == ["pp16", "pp32", "tg4@d0", "tg4@d16"]
    assert float(table[0]["mean_ts"]) == rows[0]["mean_ts"] and table[0]["threads"] == str(rows[0]["settings"]["threads"])
    md = front.to_markdown(rows).splitlines()
    assert md[2].startswith("| model | test | t/s | median t/s | TPOT ms |") and md[3].startswith("| --- | --- | ---:")
    assert sum(1 for line in md if line.startswith("| ") and rows[0]["model"] in line) == 4 + 1
    front.render(rows, "table")
    out = capsys.readouterr().out
    assert "tg4@d16" in out and "TTFT ms (pp16)" in out and "n/a" in out


@pytest.mark.slow
def test_kv_bytes_agree_with_what_llama_cpp_allocates(smollm2, gemma):
    from localrun.engine import Engine, LoadOptions
    from localrun.engine.gguf_info import kv_cache_bytes
    from localrun.engine.llama import captured_llama_log

    for path in (smollm2, gemma):
        with captured_llama_log() as lines:
            engine = Engine(path, LoadOptions(n_ctx=600))
        engine.close()
        logged, _ = bench.allocated_buffers(lines)
        assert abs(logged - kv_cache_bytes(engine.info, 600)) <= 0.01 * 2**20 * 2  # the log rounds to 0.01 MiB


@pytest.mark.slow
def test_plot_draws_a_png(json_run, tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "bench.png"
    front.plot(json.loads(json_run.stdout), out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_md_output_on_stdout(cli, smollm2):
    r = cli("bench", str(smollm2), "--pp", "8", "--tg", "0", "--reps", "1", "--threads", "1", "--output", "md")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert any(line.startswith(f"| {smollm2.name} | pp8 |") for line in lines)
    assert any(line.startswith("| model | load ms | TTFT ms (pp8) |") for line in lines)


@pytest.mark.slow
@needs_llama_bench
def test_compare_runs_llama_bench_with_the_same_settings(cli, smollm2):
    """Three repetitions on each side, each after its own warm-up (llama-bench run once per test with -r 3):
    the ratio is of the medians (README), not of the means, both sides' statistics are of three samples,
    and the reference's spread is reported."""
    r = cli("bench", str(smollm2), "--pp", "32", "--tg", "8", "--reps", "3", "--threads", "1",
            "--compare", "llama-bench", "--output", "json")
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    jsonschema.validate(rows, bench.RESULT_SCHEMA)
    assert [row["test"] for row in rows] == ["pp32", "tg8@d0"]
    for row in rows:
        assert row["reps"] == 3
        assert_statistics_of_samples(row)
        # llama-bench's three runs: a sample std of three timings (never exactly equal), and a median
        # within one sample std of the mean, as for any three numbers.
        assert row["ref_mean_ts"] > 0 and row["ref_median_ts"] > 0 and row["ref_std_ts"] > 0
        assert abs(row["ref_mean_ts"] - row["ref_median_ts"]) <= row["ref_std_ts"] + ROUNDING
        assert abs(row["ref_spread"] - row["ref_std_ts"] / row["ref_mean_ts"]) <= 1e-3
        # median / reference median, to the rounding of the three numbers in the row.
        median, ref_median = row["median_ts"], row["ref_median_ts"]
        exact = median / ref_median
        slack = 0.5e-4 + exact * (0.5e-3 / median + 0.5e-3 / ref_median) + 1e-12
        assert abs(row["ratio"] - exact) <= slack, (row["ratio"], exact, row["mean_ts"] / row["ref_mean_ts"])


@pytest.mark.slow
def test_a_ratio_against_a_noisy_reference_is_flagged(json_run):
    """Over 20% spread (std / mean) in llama-bench's own repetitions, the ratio is marked and the caption
    says why; under it, nothing is marked."""
    rows = [r for r in json.loads(json_run.stdout) if r["kind"] != "ppl"][:2]
    for row, spread in zip(rows, (0.25, 0.05)):
        row.update(ref_mean_ts=100.0, ref_std_ts=100.0 * spread, ref_median_ts=100.0, ref_spread=spread, ratio=1.0)
    _, speed, _, _ = front.tables(rows)
    assert speed[0][-2] == "1.000 !" and speed[1][-2] == "1.000"
    assert "spread over 20%" in front._caption(rows) and "no verdict" in front._caption(rows)
    assert "spread over" not in front._caption(rows[1:])
    assert "1.000 !" in front.to_markdown(rows)


@pytest.mark.slow
def test_no_thread_runs_beside_the_measurement(smollm2, monkeypatch, capsys):
    """A spinner's redraw thread preempts llama.cpp's compute threads on a small machine (it cost about 3% of
    decode speed on 2 cores), so bench shows progress without one, on a terminal too."""
    import threading

    from localrun import console

    started = []
    real_start = threading.Thread.start
    monkeypatch.setattr(threading.Thread, "start", lambda self: (started.append(type(self).__name__), real_start(self)))
    monkeypatch.setattr(type(console.err.real()), "is_terminal", property(lambda self: True))
    assert front.run_from_cli([str(smollm2)], pp="8", tg="4", depth="0", reps=1, threads="1", output="json") == 0
    assert started == []
    rows = json.loads(capsys.readouterr().out)
    assert [r["test"] for r in rows] == ["pp8", "tg4@d0"]


@pytest.mark.slow
def test_ctrl_c_prints_what_was_measured_and_exits_130(smollm2):
    proc = subprocess.Popen([LOCALRUN, "bench", str(smollm2), "--pp", "16", "--tg", "64", "--depth", "0,64,128",
                             "--reps", "3", "--threads", "1", "--output", "json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, text=True)
    try:
        for line in proc.stderr:  # the per-test lines: wait for the first result, then interrupt
            if "pp16:" in line:
                proc.send_signal(signal.SIGINT)
                break
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    rows = json.loads(out)
    assert 1 <= len(rows) < 4 and rows[0]["test"] == "pp16"
    jsonschema.validate(rows, bench.RESULT_SCHEMA)
    assert "interrupted" in err


@pytest.mark.slow
def test_several_models_and_a_threads_sweep_in_one_csv(cli, smollm2, gemma):
    """Both models in argument order, each with --threads 1 then 2, each with its tests: one CSV row apiece, the
    columns of CSV_FIELDS with the settings flattened. One repetition: std 0, median = mean and TPOT = 1000/(t/s)."""
    r = cli("bench", str(smollm2), str(gemma), "--pp", "8", "--tg", "4", "--reps", "1", "--threads", "1,2",
            "--output", "csv")
    assert r.returncode == 0, r.stderr
    reader = csv.DictReader(io.StringIO(r.stdout))
    table = list(reader)
    assert reader.fieldnames == bench.CSV_FIELDS
    expected = [(m.name, t, test) for m in (smollm2, gemma) for t in ("1", "2") for test in ("pp8", "tg4@d0")]
    assert [(row["model"], row["threads"], row["test"]) for row in table] == expected
    for row in table:
        assert row["model_path"] == str(smollm2 if row["model"] == smollm2.name else gemma)
        kind = ("pp", "8", "0") if row["test"] == "pp8" else ("tg", "4", "0")
        assert (row["kind"], row["n_tokens"], row["depth"]) == kind
        assert (row["ctx"], row["batch"], row["kv_type"], row["gpu_layers"], row["flash_attn"], row["decode"]) == \
            ("16", "512", "f16", "auto", "auto", "plain")  # ctx: the largest test's need (pp8: 9), at least 16
        assert row["reps"] == "1" and float(row["std_ts"]) == 0.0 and row["median_ts"] == row["mean_ts"]
        assert float(row["mean_ts"]) > 0 and float(row["ttft_ms"]) > 0 and float(row["load_ms"]) > 0
        if row["kind"] == "tg":
            assert float(row["tpot_ms"]) == pytest.approx(1000 / float(row["mean_ts"]), rel=1e-4,
                                                          abs=tpot_slack(float(row["mean_ts"])))
        else:
            assert row["tpot_ms"] == ""
        for empty in ("ref_mean_ts", "ref_std_ts", "ref_median_ts", "ratio", "ppl", "ppl_error", "ref_ppl",
                      "device_bytes"):
            assert row[empty] == "", empty
    # load time, TTFT, peak RSS and KV size belong to a model+settings: equal on its rows, and the KV cache
    # is the model's (the same for both thread counts, another for the other model).
    groups: dict[tuple, set] = {}
    for row in table:
        groups.setdefault((row["model"], row["threads"]), set()).add(
            (row["load_ms"], row["ttft_ms"], row["peak_rss_bytes"], row["kv_bytes"]))
    assert len(groups) == 4 and all(len(g) == 1 for g in groups.values())
    kv = {model: {next(iter(g))[3] for (m, _), g in groups.items() if m == model} for model in (smollm2.name, gemma.name)}
    assert all(len(v) == 1 for v in kv.values()) and kv[smollm2.name] != kv[gemma.name]
    assert all(int(next(iter(v))) > 0 for v in kv.values())


# -- perplexity against llama-perplexity ------------------------------------------------------------


def _llama_perplexity():
    return bench.find_llama_perplexity(LLAMA_BENCH)


@pytest.mark.slow
@pytest.mark.skipif(_llama_perplexity() is None, reason=f"no llama-perplexity: build it with {bench.BUILD_SCRIPT}")
@pytest.mark.parametrize("which", ["smollm2", "gemma"])
def test_perplexity_agrees_with_llama_perplexity(which, request):
    """`llama-perplexity -m MODEL -f TEXT -c 128`: the same chunks scored the same way, within 1% (in practice
    to the 4th digit). Two chunks of 128 keep it quick (the method is the same at bench's default of 512);
    `bench --quality --compare llama-bench` scores the whole text."""
    from localrun.engine import Engine

    n_ctx, chunks = 128, 2
    path = request.getfixturevalue(which)
    settings = bench.make_plan(["m"], pp="0", tg="0", threads="1", quality=True).settings[0]
    with Engine(path, settings.load_options(n_ctx)) as engine:
        ours = bench.perplexity(engine, bench.text_path().read_text(encoding="utf-8"), n_ctx, max_chunks=chunks)
    theirs, theirs_error = bench.run_llama_perplexity(_llama_perplexity(), path, bench.text_path(), n_ctx, settings,
                                                      max_chunks=chunks)
    assert ours.n_chunks == chunks and ours.n_scored == chunks * (n_ctx - n_ctx // 2 - 1)
    assert ours.ppl == pytest.approx(theirs, rel=0.01)
    assert ours.error == pytest.approx(theirs_error, rel=0.05)


def reference_token_nlls(path, text: str, n_ctx: int) -> list[float]:
    """llama-perplexity's method written directly against llama.cpp's low-level API, the oracle for bench's
    perplexity: the text's tokens in chunks of n_ctx (the first replaced by BOS where the model adds one), each
    in a fresh context with logits for its second half; per scored position, the negative log-likelihood of
    the next token under a float64 log-softmax."""
    import llama_cpp as ll
    import numpy as np

    ll.llama_backend_init()
    model = ll.llama_model_load_from_file(str(path).encode(), ll.llama_model_default_params())
    vocab = ll.llama_model_get_vocab(model)
    n_vocab = ll.llama_vocab_n_tokens(vocab)
    data = text.encode()
    buf = (ll.llama_token * (len(data) + 16))()
    n = ll.llama_tokenize(vocab, data, len(data), buf, len(buf), True, False)  # add special, parse none
    assert n > 0
    tokens = list(buf[:n])
    first = n_ctx // 2
    nlls: list[float] = []
    batch = ll.llama_batch_init(n_ctx, 0, 1)
    try:
        for c in range(len(tokens) // n_ctx):
            chunk = tokens[c * n_ctx : (c + 1) * n_ctx]
            if ll.llama_vocab_get_add_bos(vocab):
                chunk[0] = ll.llama_vocab_bos(vocab)
            cparams = ll.llama_context_default_params()
            cparams.n_ctx = cparams.n_batch = cparams.n_ubatch = n_ctx
            cparams.n_threads = cparams.n_threads_batch = 1
            ctx = ll.llama_init_from_model(model, cparams)
            try:
                batch.n_tokens = n_ctx
                for i, tok in enumerate(chunk):
                    batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = tok, i, 1, i >= first
                    batch.seq_id[i][0] = 0
                assert ll.llama_decode(ctx, batch) == 0
                for i in range(first, n_ctx - 1):
                    x = np.ctypeslib.as_array(ll.llama_get_logits_ith(ctx, i), shape=(n_vocab,)).astype(np.float64)
                    log_z = x.max() + math.log(np.exp(x - x.max()).sum())
                    nlls.append(float(log_z - x[chunk[i + 1]]))
            finally:
                ll.llama_free(ctx)
    finally:
        ll.llama_batch_free(batch)
        ll.llama_model_free(model)
    return nlls


@pytest.mark.slow
def test_quality_adds_a_ppl_row(smollm2, tmp_path, monkeypatch):
    short = tmp_path / "short.txt"  # a part of the bundled text (two chunks of 128) keeps this quick; the method is the same
    text = bench.text_path().read_text(encoding="utf-8")[:1200]
    short.write_text(text, encoding="utf-8")
    monkeypatch.setattr(bench, "text_path", lambda: short)
    plan = bench.make_plan([str(smollm2)], pp="0", tg="0", ctx="128", threads="1", quality=True)
    rows = bench.rows_of(list(bench.run(plan)))
    jsonschema.validate(rows, bench.RESULT_SCHEMA)
    (row,) = rows
    assert row["test"] == "ppl@c128" and row["kind"] == "ppl" and row["settings"]["ctx"] == 128
    assert row["ttft_ms"] is None and row["tpot_ms"] is None and "ratio" not in row
    assert "| PPL |" in front.to_markdown(rows) and f"{row['ppl']:.4f}" in front.to_markdown(rows)
    # The same chunks scored independently: every chunk's 63 next tokens, one NLL each (SmolLM2 makes some 300
    # tokens of the 1,200 characters: both chunks).
    nlls = reference_token_nlls(smollm2, text, 128)
    assert len(nlls) == 2 * (128 - 64 - 1) and row["n_tokens"] == len(nlls)
    mean = statistics.fmean(nlls)
    # The two agree to about 1e-6 (the same llama.cpp, the same chunks); 1e-3 is well inside the 1% that
    # llama-perplexity is held to, and catches a change that moves every token's NLL a little.
    assert row["ppl"] == pytest.approx(math.exp(mean), rel=1e-3)
    var = statistics.fmean(x * x for x in nlls) - mean * mean  # llama-perplexity's +/-
    assert row["ppl_error"] == pytest.approx(math.exp(mean) * math.sqrt(var / (len(nlls) - 1)), rel=0.01)


def test_perplexity_refuses_a_text_shorter_than_two_chunks(smollm2):
    from localrun.engine import Engine, LoadOptions

    with Engine(smollm2, LoadOptions(n_ctx=512)) as engine, pytest.raises(UsageError, match="needs at least 1024"):
        bench.perplexity(engine, "Too short to score.", 512)
