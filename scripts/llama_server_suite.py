"""llama.cpp's own server tests (tools/server/tests of the llama.cpp llama-cpp-python vendors) run against
`localrun serve`, so that what tools written for llama-server expect of its endpoints is checked by the tests its
authors wrote: a small program stands in for the llama-server binary (its utils.py starts LLAMA_SERVER_BIN_PATH
with llama-server's flags) and starts `localrun serve` with the same settings, mapped flag by flag.

    .venv/bin/python scripts/llama_server_suite.py [--llama-cpp DIR] [--out DIR] [-k EXPR] [FILE ...]

FILE: test files of tools/server/tests/unit (default: those of the endpoints localrun speaks as llama-server does,
DEFAULT_FILES). Prints each file's pass, fail and skip counts and each failure's first line; the junit XML and
pytest's output are left in --out.

The tests fetch their models from the Hugging Face Hub, which this machine cannot reach: each is given a stand-in
that plays its part (MODELS): SmolLM2 for the small story models (their tests that read the exact story text then
fail: it is another model's), Qwen2.5-Coder for the fill-in-the-middle ones (it has FIM tokens), a tiny reranker
(tests/rerankmodel.py, the BOS / EOS / SEP form jina-reranker-v1 takes) for jina-reranker, a LoRA adapter for
SmolLM2 (tests/loramodel.py) for the Shakespeare adapter of stories15M_MOE; a chat template file is put on a tiny
model (tests/tinymodel.py) with SmolLM2's tokenizer. The rest of the Hub is refused, naming the file. What
localrun serve has no flag for (--kv-unified, --slots...) is passed over and said on stderr.

DIR: a llama.cpp source tree (the llama-cpp-python 0.3.36 sdist's vendor/llama.cpp: `pip download --no-binary
:all: --no-deps llama-cpp-python==0.3.36` and unpack it), or $LLAMA_CPP_DIR. Not part of `make test`: it takes
several minutes and most of its failures are the stand-in models' text."""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import shutil
import socket
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"
DEFAULT_FILES = ("test_tokenize.py", "test_infill.py", "test_completion.py", "test_lora.py", "test_rerank.py",
                 "test_template.py", "test_basic.py")
KNOWN_TREES = (Path("/work/ref/llama_cpp_python-0.3.36/vendor/llama.cpp"),)

# The Hub's files the tests ask for (--hf-repo [--hf-file]) -> the stand-in that plays each one's part
MODELS = {
    "ggml-org/test-model-stories260K": "smollm2",
    "ggml-org/models/tinyllamas/stories260K.gguf": "smollm2",
    "ggml-org/stories15M_MOE/stories15M_MOE-F16.gguf": "smollm2",
    "ggml-org/models/bert-bge-small/ggml-model-f16.gguf": "smollm2",
    "ggml-org/models/jina-reranker-v1-tiny-en/ggml-model-f16.gguf": "reranker",
    "ggml-org/test-model-stories260K-infill": "coder",
    "ggml-org/Qwen2.5-Coder-1.5B-IQ3_XXS-GGUF/qwen2.5-coder-1.5b-iq3_xxs-imat.gguf": "coder",
}
# Files the tests download by URL (utils.download_file) -> the stand-in
DOWNLOADS = {"moe_shakespeare15M.gguf": "lora"}


# -- the stand-in for llama-server ------------------------------------------------------------------------------


def _llama_server_flags() -> argparse.ArgumentParser:
    """The llama-server flags utils.py passes that mean something here (the rest are passed over)."""
    p = argparse.ArgumentParser(prog="llama-server (localrun serve)", add_help=False, allow_abbrev=False)
    for flag in ("--port", "--host", "--temp", "--seed", "--model", "--hf-repo", "--hf-file", "--batch-size", "--threads",
                 "--ctx-size", "--parallel", "--n-predict", "--api-key", "--chat-template-file", "--alias", "--reasoning",
                 "--reasoning-effort", "--chat-template-kwargs"):
        p.add_argument(flag)
    p.add_argument("--lora", action="append", default=[])
    p.add_argument("--kv-unified", action="store_true")
    return p


def as_llama_server(argv: list[str]) -> None:
    """Start `localrun serve` (this process becomes it) with llama-server's `argv` mapped to its flags."""
    given, ignored = _llama_server_flags().parse_known_args(argv)
    ignored = [a for a in ignored if a.startswith("-") and a not in ("--no-jinja", "--jinja", "--no-slots", "--offline")]
    if ignored or given.kv_unified:
        print(f"llama-server stand-in: passed over {' '.join(ignored + ['--kv-unified'] * given.kv_unified)}", file=sys.stderr)
    models = json.loads(os.environ["LLAMA_SUITE_MODELS"])
    model = given.model or _stand_in(given.hf_repo, given.hf_file, models)
    if given.chat_template_file:
        model = _with_template(Path(given.chat_template_file), models)
    parallel = int(given.parallel or 4)  # llama-server's default: 4 slots sharing the context
    args = [str(model), "--port", given.port or "8080", "--host", (given.host or "127.0.0.1").split(",")[0].strip(),
            "-np", str(parallel), "-n", given.n_predict or "-1"]
    if given.ctx_size:  # llama-server's context is every slot's together (unless unified: each may fill it)
        args += ["--ctx", str(max(16, int(given.ctx_size) // (1 if given.kv_unified or not given.parallel else parallel)))]
    for flag, value in (("--temp", given.temp), ("--seed", given.seed), ("--batch", given.batch_size),
                        ("--threads", given.threads), ("--api-key", given.api_key), ("--reasoning", given.reasoning),
                        ("--reasoning-effort", given.reasoning_effort), ("--chat-template-kwargs", given.chat_template_kwargs),
                        ("--alias", given.alias)):
        if value is not None:
            args += [flag, value]
    for adapter in given.lora:
        args += ["--lora", adapter]
    localrun = str(Path(sys.executable).with_name("localrun"))
    print(f"llama-server stand-in: localrun serve {' '.join(args)}", file=sys.stderr, flush=True)
    os.execv(localrun, [localrun, "serve", *args])


def _stand_in(repo: str | None, file: str | None, models: dict) -> str:
    for key in (f"{repo}/{file}", repo):
        if key in MODELS:
            return models[MODELS[key]]
    sys.exit(f"llama-server stand-in: no stand-in for {repo}/{file or ''}: the Hugging Face Hub cannot be reached from here")


def _with_template(template: Path, models: dict) -> str:
    """A tiny model with SmolLM2's tokenizer and `template` as its chat template (made once per template)."""
    text = template.read_text()
    out = Path(models["dir"]) / f"template-{hashlib.sha256(text.encode()).hexdigest()[:12]}.gguf"
    if not out.exists():
        sys.path.insert(0, str(TESTS))
        from tinymodel import write_tiny_model

        write_tiny_model(Path(models["smollm2"]), out.with_suffix(".part"), text)
        out.with_suffix(".part").rename(out)
    return str(out)


# -- the run ------------------------------------------------------------------------------------------------------


def _llama_cpp(given: str | None) -> Path:
    for tree in ([Path(given)] if given else []) + ([Path(os.environ["LLAMA_CPP_DIR"])] if "LLAMA_CPP_DIR" in os.environ else []) \
            + list(KNOWN_TREES):
        if (tree / "tools" / "server" / "tests" / "utils.py").is_file():
            return tree
    sys.exit("no llama.cpp source tree with tools/server/tests: give --llama-cpp DIR (the llama-cpp-python sdist's "
             "vendor/llama.cpp) or set LLAMA_CPP_DIR")


def _stand_in_models(where: Path) -> dict:
    """The models and files that play the Hub's: written or fetched once into `where`."""
    sys.path.insert(0, str(TESTS))
    spec = importlib.util.spec_from_file_location("localrun_tests_conftest", TESTS / "conftest.py")
    conftest = sys.modules[spec.name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(conftest)
    from loramodel import write_lora
    from rerankmodel import write_reranker

    where.mkdir(parents=True, exist_ok=True)
    smollm2 = conftest.fetch_real_model("SmolLM2-135M-Instruct.Q4_1.gguf")
    reranker, lora = where / "jina-reranker-stand-in.gguf", where / "moe_shakespeare15M.gguf"
    if not reranker.exists():
        write_reranker(smollm2, reranker, template=None)
    if not lora.exists():
        write_lora(smollm2, lora)
    return {"dir": str(where), "smollm2": str(smollm2), "coder": str(conftest.fetch_real_model("qwen2.5-coder-1.5b-instruct-q4_k_m.gguf")),
            "reranker": str(reranker), "lora": str(lora)}


WGET = '''"""utils.py's downloads: the stand-ins of scripts/llama_server_suite.py, or a refusal (no Hub here)."""
import json, os, shutil

def download(url, out=None, bar=None):
    files = json.loads(os.environ["LLAMA_SUITE_DOWNLOADS"])
    name = url.rsplit("/", 1)[-1]
    if name not in files:
        raise OSError(f"{url}: the Hugging Face Hub cannot be reached from here")
    shutil.copyfile(files[name], out or name)
    return out or name
'''

PLUGIN = '''"""The models are local: utils.ServerPreset.load_all (which starts each preset once to download its model) is
not needed."""

def pytest_configure(config):
    import utils
    utils.ServerPreset.load_all = staticmethod(lambda: None)
'''


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def prepare(tree: Path, out: Path) -> tuple[Path, dict]:
    """The test suite copied into `out` (its chat templates at the same place relative to it), the stand-in binary,
    the wget stub and the plugin; the environment to run it in."""
    suite = out / "llama.cpp" / "tools" / "server" / "tests"
    shutil.rmtree(out / "llama.cpp", ignore_errors=True)
    shutil.copytree(tree / "tools" / "server" / "tests", suite)
    shutil.copytree(tree / "models" / "templates", out / "llama.cpp" / "models" / "templates")
    (suite / "tmp").mkdir()  # where utils.download_file puts what it fetches
    stubs = out / "stubs"
    stubs.mkdir(parents=True, exist_ok=True)
    (stubs / "wget.py").write_text(WGET)
    (stubs / "llama_suite_plugin.py").write_text(PLUGIN)
    shim = out / "bin" / "llama-server"
    shim.parent.mkdir(parents=True, exist_ok=True)
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{Path(__file__).resolve()}" --as-llama-server "$@"\n')
    shim.chmod(0o755)
    models = _stand_in_models(out / "models")
    env = {**os.environ, "LLAMA_SERVER_BIN_PATH": str(shim), "PORT": str(_free_port()), "LOCALRUN_HOME": str(out / "home"),
           "PYTHONPATH": os.pathsep.join([str(stubs), str(suite)]), "LLAMA_SUITE_MODELS": json.dumps(models),
           "LLAMA_SUITE_DOWNLOADS": json.dumps({name: models[what] for name, what in DOWNLOADS.items()})}
    return suite, env


def counts(junit: Path) -> dict[str, dict]:
    """Per test file: passed, failed (errors too), skipped, and each failure's test and first line."""
    out: dict[str, dict] = {}
    for case in ET.parse(junit).iter("testcase"):
        file = case.get("classname", "").split(".")[-1] + ".py"
        row = out.setdefault(file, {"passed": 0, "failed": 0, "skipped": 0, "failures": []})
        bad = case.find("failure") if case.find("failure") is not None else case.find("error")
        if bad is not None:
            row["failed"] += 1
            first = (bad.get("message") or bad.text or "").strip().splitlines()
            row["failures"].append((case.get("name"), first[0][:200] if first else ""))
        elif case.find("skipped") is not None:
            row["skipped"] += 1
        else:
            row["passed"] += 1
    return out


def main() -> int:
    if sys.argv[1:2] == ["--as-llama-server"]:
        as_llama_server(sys.argv[2:])
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="*", default=list(DEFAULT_FILES))
    parser.add_argument("--llama-cpp", help="a llama.cpp source tree (default: $LLAMA_CPP_DIR, or the reference copy)")
    parser.add_argument("--out", default="/tmp/llama-server-suite", help="where the run's files go")
    parser.add_argument("-k", dest="keyword", help="pytest's -k")
    args = parser.parse_args()
    out = Path(args.out).resolve()
    suite, env = prepare(_llama_cpp(args.llama_cpp), out)
    junit = out / "junit.xml"
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "llama_suite_plugin", "-o", "addopts=",
               "-q", "-rN", f"--junitxml={junit}", *(["-k", args.keyword] if args.keyword else []),
               *[f"unit/{Path(f).name}" for f in args.files]]
    with open(out / "pytest.log", "w") as log:
        subprocess.run(command, cwd=suite, env=env, stdout=log, stderr=subprocess.STDOUT)
    total = {"passed": 0, "failed": 0, "skipped": 0}
    for file, row in sorted(counts(junit).items()):
        print(f"{file:24} {row['passed']:3} passed {row['failed']:3} failed {row['skipped']:3} skipped")
        for name, why in row["failures"]:
            print(f"    {name}: {why}")
        for key in total:
            total[key] += row[key]
    print(f"{'all':24} {total['passed']:3} passed {total['failed']:3} failed {total['skipped']:3} skipped  (pytest's output: {out / 'pytest.log'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
