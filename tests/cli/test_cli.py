"""The CLI's contract for bad input, `show`, `doctor` and start-up: one line, the right exit code, never a traceback."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import LOCALRUN, last_json


def one_line_error(r, code=1):
    assert r.returncode == code, (r.returncode, r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("error:")
    assert "Traceback" not in r.stderr
    return lines[0]


def test_help_and_version(cli):
    r = cli("--help")
    assert r.returncode == 0 and "pull" in r.stdout and "run" in r.stdout and "chat" in r.stdout
    v = cli("--version")
    assert v.returncode == 0 and v.stdout.startswith("localrun ")


USAGE_ERRORS = [
    (["run", "--bogus"], "No such option: --bogus"),
    (["run", "some-model", "hi", "--top-k", "abc"], "Invalid value for '--top-k'"),
    (["run"], "Missing argument 'model'"),
    (["bogus"], "No such command 'bogus'"),
    (["run", "some-model", "hi", "--beams"], "requires an argument"),
]


@pytest.mark.parametrize("args,needle", USAGE_ERRORS, ids=[" ".join(a) for a, _ in USAGE_ERRORS])
def test_click_usage_errors_exit_2_with_clicks_message(cli, args, needle):
    """Errors that the argument parser itself finds. Typer bundles its own click, whose exceptions
    the standalone click's classes do not match: these exited 1 as 'error: NoSuchOption: ...'."""
    r = cli(*args)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert needle in r.stderr and "Traceback" not in r.stderr and "error: NoSuchOption" not in r.stderr
    assert not r.stdout


@pytest.mark.parametrize("args", [[], ["sessions"]], ids=["localrun", "localrun sessions"])
def test_a_command_group_alone_prints_its_help_and_exits_0(cli, args):
    r = cli(*args)
    assert r.returncode == 0, r.stderr
    assert "Usage: localrun" in r.stdout + r.stderr and "Error" not in r.stderr


@pytest.mark.parametrize("args", [["list", "--available", "--json"], ["--help"], ["doctor"]])
def test_a_closed_stdout_ends_quietly_with_0(args):
    """As `run ... | head` does: Typer turned a broken pipe into a silent exit 1 for the other commands."""
    import os

    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the first write
    try:
        r = subprocess.run([LOCALRUN, *args], stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=60)
    finally:
        os.close(write_end)
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr and "error" not in r.stderr


def test_help_does_not_import_llama_cpp_or_huggingface_hub():
    code = (
        "import sys; sys.argv=['localrun','--help']\n"
        "import localrun.cli as c\n"
        "try:\n    c.main()\nexcept SystemExit:\n    pass\n"
        "print(sorted(m for m in ('llama_cpp','huggingface_hub','numpy','rich.markdown') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "[]"


def test_unknown_alias(cli):
    line = one_line_error(cli("run", "no-such-model", "hi"))
    assert "no-such-model" in line and "list --available" in line


def test_malformed_models_yaml(cli, isolated_home):
    isolated_home.mkdir(parents=True, exist_ok=True)
    (isolated_home / "models.yaml").write_text("models:\n  broken: [unclosed\n")
    line = one_line_error(cli("list", "--available"))
    assert "models.yaml" in line and "YAML" in line


def test_invalid_models_yaml_entry_names_the_field(cli, isolated_home):
    isolated_home.mkdir(parents=True, exist_ok=True)
    (isolated_home / "models.yaml").write_text("models:\n  mine:\n    repo: a/b\n    quants: {Q4_0: x.gguf}\n    default_quant: Q9\n")
    line = one_line_error(cli("list", "--available"))
    assert "mine" in line and "default_quant" in line


def test_a_path_is_printed_as_it_is(cli, tmp_path):
    """Rich turned ':x:' in a path into an emoji (and '[tag]' into markup) in error messages."""
    line = one_line_error(cli("show", str(tmp_path / "my:x:[bold]model.gguf")))
    assert "my:x:[bold]model.gguf" in line


@pytest.mark.parametrize("args,needle", [(["--ctx", "0"], "--ctx 0"), (["--kv-type", "q5_1", "--no-measure"], "--kv-type")])
def test_show_checks_options_as_run_does(cli, smollm2, args, needle):
    """show took --ctx 0 for the default and estimated an unknown --kv-type without --measure."""
    line = one_line_error(cli("show", str(smollm2), *args), code=2)
    assert needle in line


def test_pull_of_a_local_file_says_there_is_nothing_to_pull(cli, smollm2):
    """It said 'pulled ... (path)' though nothing was fetched or registered (`list` did not show it)."""
    r = cli("pull", str(smollm2))
    assert r.returncode == 0 and "nothing to pull" in r.stderr and "pulled" not in r.stderr


def test_non_gguf_file(cli, tmp_path):
    f = tmp_path / "notes.gguf"
    f.write_text("just some text, not a model\n" * 10)
    line = one_line_error(cli("run", str(f), "hi"))
    assert str(f) in line


def test_truncated_gguf_is_refused_before_llama_cpp(cli, tmp_path, smollm2):
    f = tmp_path / "cut.gguf"
    with open(smollm2, "rb") as src:
        f.write_bytes(src.read(30_000_000))
    line = one_line_error(cli("run", str(f), "hi"))
    assert "truncated" in line and str(f) in line
    line = one_line_error(cli("show", str(f)))
    assert "truncated" in line


@pytest.mark.slow
def test_show_reports_metadata_and_memory(cli, smollm2):
    r = cli("show", str(smollm2), "--ctx", "2048", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["architecture"] == "llama" and d["quant"] == "Q4_1" and d["chat_template"] is True
    assert d["sha256"] == "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
    # 2 x n_layer x n_kv_head x head_dim x 2 bytes x n_ctx
    assert d["memory_estimate"]["kv_bytes"] == 2 * 30 * 3 * 64 * 2 * 2048
    assert d["memory_allocated"]["kv_bytes"] == d["memory_estimate"]["kv_bytes"]
    assert d["memory_allocated"]["weights_bytes"] > 0.9 * d["file_size"]


@pytest.mark.slow
def test_show_for_a_sliding_window_model(cli, gemma):
    r = cli("show", str(gemma), "--ctx", "2048", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["architecture"] == "gemma3" and d["chat_template"] is False and d["sliding_window"] == 512
    assert d["memory_allocated"]["kv_bytes"] == d["memory_estimate"]["kv_bytes"]


def _free_disk(path) -> int:
    """Free bytes on the file system that holds `path` (or its nearest existing parent)."""
    import shutil
    from pathlib import Path

    target = Path(path)
    while not target.exists() and target.parent != target:
        target = target.parent
    return shutil.disk_usage(target).free


def test_doctor_reports_the_build(cli, isolated_home):
    """Every fact compared with its own source: llama.cpp's answers, the environment, the disk, the metadata."""
    import os
    import platform
    from importlib.metadata import version
    from pathlib import Path

    import llama_cpp

    import localrun

    env = {"HF_ENDPOINT": "http://127.0.0.1:9/hub", "HF_HUB_OFFLINE": "1"}
    free_before = _free_disk(isolated_home)
    r = cli("doctor", "--json", env=env)
    free_after = _free_disk(isolated_home)
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert "AMX" not in d["system_info"] or "AMX_INT8 = 1" not in d["system_info"]
    assert d["system_info"] == llama_cpp.llama_print_system_info().decode("utf-8", "replace").strip()
    # A GPU to offload to (llama.cpp's own llama_supports_gpu_offload() also says yes for any RPC build)
    from localrun.engine.llama import gpu_memory

    assert d["gpu_offload"] is bool(gpu_memory())
    assert d["mmap"] is bool(llama_cpp.llama_supports_mmap())
    # Paths: the ones the fixture (and this test) put in the environment.
    assert d["home"] == os.environ["LOCALRUN_HOME"] == str(isolated_home)
    assert d["mirror_dir"] == str(isolated_home / "mirror")
    assert d["hf_home"] == os.environ["HF_HOME"]
    assert (d["hf_endpoint"], d["hf_offline"]) == ("http://127.0.0.1:9/hub", "1")
    assert d["models_files"] == [str(Path(localrun.__file__).parent / "models.yaml")]  # no user models.yaml yet
    # Free disk where LOCALRUN_HOME will be, as the disk was around the command (other processes write too).
    slack = 16 << 20
    assert min(free_before, free_after) - slack <= d["free_disk_bytes"] <= max(free_before, free_after) + slack
    # Versions: the installed distributions' metadata.
    assert d["llama_cpp_python"] == version("llama_cpp_python") == llama_cpp.__version__ == "0.3.36"
    assert d["localrun"] == version("localrun") == localrun.__version__
    assert d["huggingface_hub"] == version("huggingface_hub") and d["gguf"] == version("gguf")
    assert d["python"] == platform.python_version()


def test_doctor_shows_the_cpu_features_of_the_default_build(cli):
    """The default build (BACKEND=cpu, and the CUDA one) enables AVX2 explicitly; that only applies on an x86
    CPU that has it."""
    import platform

    if platform.machine().lower() not in ("x86_64", "amd64"):
        pytest.skip(f"AVX2 is an x86 feature; this is {platform.machine()}")
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        pytest.skip("no /proc/cpuinfo to read the CPU's features from")
    if "avx2" not in flags:
        pytest.skip("this CPU has no AVX2, so the build cannot use it")
    r = cli("doctor", "--json")
    assert r.returncode == 0, r.stderr
    assert "AVX2 = 1" in json.loads(r.stdout)["system_info"]


@pytest.mark.parametrize("debug", ["1", "0", None], ids=["LOCALRUN_DEBUG=1", "LOCALRUN_DEBUG=0", "unset"])
def test_localrun_debug_shows_the_traceback(cli, tmp_path, debug):
    """The README: every known failure is one line; LOCALRUN_DEBUG=1 shows the traceback as well."""
    f = tmp_path / "notes.gguf"
    f.write_text("just some text, not a model\n")
    r = cli("run", str(f), "hi", env={} if debug is None else {"LOCALRUN_DEBUG": debug})
    line = f"error: {f}: not a GGUF file (starts with b'just som'): pass a .gguf model file, or delete it and pull again"
    assert r.returncode == 1 and r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert lines[-1] == line
    if debug == "1":
        assert "Traceback (most recent call last)" in r.stderr
        # the frames down to where the error was raised
        assert "read_info" in r.stderr and "InvalidModelFile: " in r.stderr
        assert len(lines) > 10
    else:
        assert lines == [line]


def test_ctrl_c_during_generation_exits_130(smollm2):
    import signal
    import time

    proc = subprocess.Popen(
        [LOCALRUN, "run", str(smollm2), "--raw", "-n", "-1", "--min-tokens", "5000", "--ctx", "8192", "Count:"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
        # A shell without job control starts background commands with SIGINT ignored; a terminal does not.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    first = proc.stdout.read(5)  # wait until tokens stream
    assert first
    time.sleep(0.3)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130
    assert "Traceback" not in err


def test_ctrl_c_during_json_generation_ends_with_a_done_event(smollm2):
    import signal
    import time

    proc = subprocess.Popen(
        [LOCALRUN, "run", str(smollm2), "--raw", "--json", "-n", "-1", "--min-tokens", "5000", "--ctx", "8192", "Count:"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    assert proc.stdout.readline()  # tokens stream
    time.sleep(0.3)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "Traceback" not in err
    last = last_json(out)
    assert last["type"] == "done" and last["stats"]["finish_reason"] == "interrupted" and last["text"]
