"""4-, 8- and 16-bit end to end: `localrun quantize` makes Q8_0, F16 and BF16 files from the 4-bit test models
with llama.cpp's own quantizer, the Hub stand-in serves them as one repository with several quants, and each
pulled quant loads, answers, and is shown with the right quant and a memory estimate that matches what
llama.cpp allocates. Real llama.cpp, the real huggingface_hub client, the installed command."""

from __future__ import annotations

import filecmp
import json
import os
import subprocess
from pathlib import Path

import pytest
from conftest import CORES, LOCALRUN, last_json
from hubstub import StubFile, hub_stub  # noqa: F401 - hub_stub is a fixture

pytestmark = pytest.mark.slow

PROMPT = "The capital of France is"
QUANTS = {"smollm2": ["Q8_0", "F16", "BF16"], "gemma": ["Q8_0", "F16"]}
SOURCE_QUANT = {"smollm2": "Q4_1", "gemma": "Q4_K_M"}


def localrun(*args: str, home: Path, **kw) -> subprocess.CompletedProcess:
    env = {**os.environ, "LOCALRUN_HOME": str(home), "HF_HOME": str(home / "hf")}
    return subprocess.run([LOCALRUN, *args], capture_output=True, text=True, env=env, stdin=subprocess.DEVNULL,
                          timeout=900, **kw)


@pytest.fixture(scope="module")
def made(smollm2, gemma, tmp_path_factory) -> dict[str, dict[str, Path]]:
    """model -> quant -> the file `localrun quantize --allow-requantize` writes (made once for the module, by
    the function the command calls, in this process: the command itself is test_quantize_writes_each_quant's)."""
    from localrun.runtime.models.quantize import quantize_model

    home = tmp_path_factory.mktemp("quantize-home")
    out: dict[str, dict[str, Path]] = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LOCALRUN_HOME", str(home))
        mp.setenv("HF_HOME", str(home / "hf"))
        for name, source in (("smollm2", smollm2), ("gemma", gemma)):
            out[name] = {}
            for quant in QUANTS[name]:
                dest = home / "out" / f"{name}.{quant}.gguf"
                written = quantize_model(str(source), quant, out=dest, allow_requantize=True)
                assert written.path == dest.resolve() and written.quant == quant and dest.is_file()
                out[name][quant] = dest
    return out


def greedy(path: Path, home: Path, n: int = 12) -> list[int]:
    r = localrun("run", str(path), "--raw", "-t", "0", "-n", str(n), "--ctx", "256", "--threads", str(min(2, CORES)), "--json", PROMPT, home=home)
    assert r.returncode == 0, r.stderr
    return last_json(r.stdout)["tokens"]


def test_quantize_writes_each_quant_and_registers_it(smollm2, tmp_path):
    home = tmp_path / "home"
    r = localrun("quantize", str(smollm2), "q8_0", "--allow-requantize", home=home)
    assert r.returncode == 0, r.stderr
    name = "SmolLM2-135M-Instruct"
    dest = home / "quantized" / name / f"{name}.Q8_0.gguf"
    assert dest.is_file() and not list(dest.parent.glob("*.partial"))
    assert f"{name}:Q8_0" in r.stderr and str(dest) in r.stderr
    listed = json.loads(localrun("list", "--json", home=home).stdout)
    (record,) = listed
    assert (record["name"], record["quant"], record["source"]) == (name, "Q8_0", "local")
    assert record["files"][0]["path"] == str(dest) and record["files"][0]["size"] == dest.stat().st_size
    import hashlib

    assert record["files"][0]["sha256"] == hashlib.sha256(dest.read_bytes()).hexdigest()
    shown = json.loads(localrun("show", f"{name}:Q8_0", "--json", "--no-measure", home=home).stdout)
    assert shown["quant"] == "Q8_0" and shown["path"] == str(dest)
    # The registered name runs like a pulled model, and rm forgets it and deletes the file.
    ran = localrun("run", f"{name}:Q8_0", "--raw", "-t", "0", "-n", "4", "--json", PROMPT, home=home)
    assert ran.returncode == 0, ran.stderr
    assert last_json(ran.stdout)["tokens"] == greedy(dest, home, 4)
    gone = localrun("rm", f"{name}:Q8_0", home=home)
    assert gone.returncode == 0, gone.stderr
    assert not dest.exists() and json.loads(localrun("list", "--json", home=home).stdout) == []


@pytest.mark.parametrize("args,code,needle", [
    (["Q8_0"], 2, "--allow-requantize"),  # the source is 4-bit: said why, not done
    (["Q9_9", "--allow-requantize"], 2, "unknown quant 'Q9_9'"),
    (["Q4_1"], 2, "already Q4_1"),
])
def test_refusals_are_one_line_and_write_nothing(smollm2, tmp_path, args, code, needle):
    home = tmp_path / "home"
    r = localrun("quantize", str(smollm2), *args, home=home)
    assert r.returncode == code, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in r.stderr
    assert not (home / "quantized").exists() or not any((home / "quantized").rglob("*.gguf*"))
    if needle == "--allow-requantize":  # says why: a second rounding on top of the first
        assert "already quantized (Q4_1)" in lines[0] and "worse" in lines[0]


def test_a_file_that_is_not_gguf_is_refused(tmp_path):
    bogus = tmp_path / "notes.gguf"
    bogus.write_bytes(b"this is not a model" * 100)
    r = localrun("quantize", str(bogus), "Q8_0", home=tmp_path / "home")
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "GGUF" in lines[0] and "Traceback" not in r.stderr


def test_too_little_disk_space_is_said_before_writing(smollm2, tmp_path, monkeypatch):
    """The check against the free space of the output's disk (the disk itself is real; its free space is what
    shutil reports, made small here)."""
    import shutil
    from collections import namedtuple

    from localrun.errors import LocalrunError
    from localrun.runtime.models.quantize import quantize_model

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10**9, 10**9 - 10**6, 10**6))
    with pytest.raises(LocalrunError, match=r"not enough disk space .* needs about \d+ MB .* 1 MB free"):
        quantize_model(str(smollm2), "F16", out=tmp_path / "x.F16.gguf", allow_requantize=True)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("model", ["smollm2", "gemma"])
def test_pull_each_quant_from_one_repo_and_run_it(model, made, request, hub_stub, tmp_path):
    """One Hub repository holding the 4-bit original and the quants made from it: `pull repo:QUANT` fetches
    that one (byte for byte the file made), it loads and answers greedily, close to the 4-bit model it was made from
    (requantized from it, these differ from it only by rounding); `show` names its quant and estimates the
    memory llama.cpp then allocates for weights and KV cache within 10%."""
    source: Path = request.getfixturevalue(model)
    repo = f"stub-org/{model}-quants"
    files = [StubFile(f"{model}.{SOURCE_QUANT[model]}.gguf", source.read_bytes())]
    files += [StubFile(f"{model}.{q}.gguf", p.read_bytes()) for q, p in made[model].items()]
    hub_stub.stub.add_repo(repo, files)
    home = hub_stub.home
    env = {**os.environ}
    base = greedy(source, home)
    for quant in QUANTS[model]:
        r = subprocess.run([LOCALRUN, "pull", f"{repo}:{quant.lower()}", "-q"], capture_output=True, text=True, env=env)
        assert r.returncode == 0, r.stderr
        ref = f"{repo}:{quant}"
        run = subprocess.run([LOCALRUN, "run", ref, "--raw", "-t", "0", "-n", "12", "--ctx", "256", "--threads", str(min(2, CORES)),
                              "--json", PROMPT], capture_output=True, text=True, env=env)
        assert run.returncode == 0, run.stderr
        tokens = last_json(run.stdout)["tokens"]
        assert tokens[:4] == base[:4], (quant, tokens, base)  # sane: it starts as the 4-bit model does
        shown = subprocess.run([LOCALRUN, "show", ref, "--ctx", "1024", "--json"], capture_output=True, text=True, env=env)
        assert shown.returncode == 0, shown.stderr
        d = json.loads(shown.stdout)
        assert d["quant"] == quant
        # the file pulled for the tag is the one made for it, byte for byte (not only one that answers alike)
        assert filecmp.cmp(d["path"], made[model][quant], shallow=False), (quant, d["path"])
        est, got = d["memory_estimate"], d["memory_allocated"]
        allocated = got["total_bytes"]  # weights, repacked copy, KV and compute, as the estimate counts them
        assert abs(est["total_bytes"] - allocated) <= 0.10 * allocated, (quant, est, got)
    listed = {(m["quant"], m["source"]) for m in json.loads(subprocess.run([LOCALRUN, "list", "--json"], capture_output=True,
                                                                            text=True, env=env).stdout)}
    assert listed == {(q, "hub") for q in QUANTS[model]}


def test_bench_compares_quants_in_one_table(made, smollm2, tmp_path, monkeypatch, capsys):
    """`bench A,B,C --quality`: one row per quant with size, memory, speed and perplexity, and the ratio of each
    perplexity to the best one (1.0 for the best)."""
    from localrun.cli import bench as front
    from localrun.runtime.reports import bench

    short = tmp_path / "short.txt"  # a part of the bundled text keeps this quick; the method is the same
    short.write_text(bench.text_path().read_text(encoding="utf-8")[:1400], encoding="utf-8")  # 2 chunks of 128
    monkeypatch.setattr(bench, "text_path", lambda: short)
    models = ",".join([str(smollm2), str(made["smollm2"]["Q8_0"]), str(made["smollm2"]["F16"])])
    assert front.run_from_cli([models], pp="16", tg="4", depth="0", reps=1, threads=str(min(2, CORES)), ctx="128",
                              quality=True, output="json") == 0  # (no more threads than this worker's cores)
    rows = json.loads(capsys.readouterr().out)
    ppl = {r["model"]: r for r in rows if r["kind"] == "ppl"}
    assert set(ppl) == {smollm2.name, "smollm2.Q8_0.gguf", "smollm2.F16.gguf"}
    best = min(r["ppl"] for r in ppl.values())
    for r in ppl.values():
        assert r["quant"] in ("Q4_1", "Q8_0", "F16") and r["file_bytes"] == Path(r["model_path"]).stat().st_size
        assert r["ppl_ratio"] == pytest.approx(r["ppl"] / best, abs=1e-3)
    table = front.quality_table(rows)
    assert [row[0] for row in table[1]] == [smollm2.name, "smollm2.Q8_0.gguf", "smollm2.F16.gguf"]
