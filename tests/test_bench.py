"""`localrun bench`: the plan's checks, the output formats and their schema, the measurements' structure
(never their speed: the machine is shared and noisy), the comparison with llama-bench, and perplexity
agreeing with llama.cpp's own llama-perplexity."""

from __future__ import annotations

import csv
import io
import json
import signal
import subprocess
import sys

import jsonschema
import pytest

from conftest import LOCALRUN
from localrun.cli import bench as front
from localrun.runtime import bench
from localrun.errors import LocalrunError, UsageError


def _llama_bench():
    try:
        return bench.find_llama_bench()
    except LocalrunError:
        return None


LLAMA_BENCH = _llama_bench()
needs_llama_bench = pytest.mark.skipif(LLAMA_BENCH is None, reason=f"no llama-bench: build it with {bench.BUILD_SCRIPT}")


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
        ({"gpu_layers": "some"}, "invalid --gpu-layers value 'some'"),
        ({"flash_attn": "yes"}, "invalid --flash-attn value 'yes'"),
        ({"kv_type": "q8_0", "flash_attn": "off"}, "needs flash attention"),
        ({"pp": "0", "tg": "0"}, "nothing to measure"),
        ({"compare": "ollama"}, "invalid --compare 'ollama'"),
    ],
)
def test_bad_options_are_usage_errors_naming_the_value(options, message):
    with pytest.raises(UsageError) as info:
        bench.make_plan(["m"], **options)
    assert message in info.value.message
    assert "\n" not in info.value.message


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
    assert info.value.message == "--plot needs matplotlib: pip install -e '.[plot]' (or pip install matplotlib)"


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
        assert r["model"] == smollm2.name and r["reps"] == 2 and len(r["samples_ts"]) == 2
        assert r["mean_ts"] > 0 and r["median_ts"] > 0 and r["std_ts"] >= 0
        assert min(r["samples_ts"]) <= r["mean_ts"] <= max(r["samples_ts"])
        assert r["ttft_ms"] > 0 and r["load_ms"] > 0 and r["peak_rss_bytes"] > 50e6 and r["kv_bytes"] > 0
        assert r["device_bytes"] is None  # the CPU build: no GPU memory to report
        assert r["settings"] == {"threads": 1, "ctx": 32 + 1, "batch": 512,
                                 "kv_type": "f16", "gpu_layers": "auto", "flash_attn": "auto", "decode": "plain"}
        assert "ratio" not in r and "ref_mean_ts" not in r
        assert (r["tpot_ms"] is None) == (r["kind"] == "pp")
        if r["kind"] == "tg":
            assert r["tpot_ms"] > 0 and r["n_tokens"] == 4
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
    r = cli("bench", str(smollm2), "--pp", "32", "--tg", "8", "--reps", "1", "--threads", "1",
            "--compare", "llama-bench", "--output", "json")
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    jsonschema.validate(rows, bench.RESULT_SCHEMA)
    assert [row["test"] for row in rows] == ["pp32", "tg8@d0"]
    for row in rows:
        assert row["ref_mean_ts"] > 0 and row["ref_std_ts"] == 0  # one repetition: no spread
        assert row["ratio"] == pytest.approx(row["mean_ts"] / row["ref_mean_ts"], rel=1e-3)


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


# -- perplexity against llama-perplexity ------------------------------------------------------------


def _llama_perplexity():
    return bench.find_llama_perplexity(LLAMA_BENCH)


@pytest.mark.slow
@pytest.mark.skipif(_llama_perplexity() is None, reason=f"no llama-perplexity: build it with {bench.BUILD_SCRIPT}")
@pytest.mark.parametrize("which", ["smollm2", "gemma"])
def test_perplexity_agrees_with_llama_perplexity(which, request):
    """`llama-perplexity -m MODEL -f TEXT -c 512`: the same chunks scored the same way, within 1% (in practice
    to the 4th digit). Two chunks keep it quick; `bench --quality --compare llama-bench` scores the whole text."""
    from localrun.engine import Engine

    n_ctx, chunks = 512, 2
    path = request.getfixturevalue(which)
    settings = bench.make_plan(["m"], pp="0", tg="0", threads="1", quality=True).settings[0]
    with Engine(path, settings.load_options(n_ctx)) as engine:
        ours = bench.perplexity(engine, bench.text_path().read_text(encoding="utf-8"), n_ctx, max_chunks=chunks)
    theirs, theirs_error = bench.run_llama_perplexity(_llama_perplexity(), path, bench.text_path(), n_ctx, settings,
                                                      max_chunks=chunks)
    assert ours.n_chunks == chunks and ours.n_scored == chunks * (n_ctx - n_ctx // 2 - 1)
    assert ours.ppl == pytest.approx(theirs, rel=0.01)
    assert ours.error == pytest.approx(theirs_error, rel=0.05)


@pytest.mark.slow
def test_quality_adds_a_ppl_row(smollm2, tmp_path, monkeypatch):
    short = tmp_path / "short.txt"  # a fifth of the bundled text keeps this quick; the method is the same
    short.write_text(bench.text_path().read_text(encoding="utf-8")[:4500], encoding="utf-8")
    monkeypatch.setattr(bench, "text_path", lambda: short)
    plan = bench.make_plan([str(smollm2)], pp="0", tg="0", ctx="128", threads="1", quality=True)
    rows = bench.rows_of(list(bench.run(plan)))
    jsonschema.validate(rows, bench.RESULT_SCHEMA)
    (row,) = rows
    assert row["test"] == "ppl@c128" and row["kind"] == "ppl" and row["settings"]["ctx"] == 128
    assert 1 < row["ppl"] < 1000 and row["ppl_error"] > 0 and row["n_tokens"] % (128 - 64 - 1) == 0
    assert row["ttft_ms"] is None and row["tpot_ms"] is None and "ratio" not in row
    assert "| PPL |" in front.to_markdown(rows) and f"{row['ppl']:.4f}" in front.to_markdown(rows)


def test_perplexity_refuses_a_text_shorter_than_two_chunks(smollm2):
    from localrun.engine import Engine, LoadOptions

    with Engine(smollm2, LoadOptions(n_ctx=512)) as engine, pytest.raises(UsageError, match="needs at least 1024"):
        bench.perplexity(engine, "Too short to score.", 512)
