"""The import contract: which package of src/localrun may import which, and who may touch llama.cpp.

Every import is read from the source (at module level and inside functions, relative ones resolved), so a
lazy import counts as much as a top-level one. A violation names the importing module, the line and the rule.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src" / "localrun"

# package -> the packages it may import (besides itself). `errors`, `console` and `lazy` are shared leaves.
CONTRACT: dict[str, set[str]] = {
    "errors": set(),
    "console": set(),
    "lazy": set(),
    "engine": {"errors", "lazy"},
    "store": {"errors"},
    "hub": {"store", "errors", "console", "lazy"},
    "runtime": {"engine", "store", "hub", "errors", "lazy"},
    "serve": {"runtime", "errors"},
    "cli": {"runtime", "serve", "hub", "store", "errors", "console"},
    "__init__": set(),
}
# third-party modules only these packages may import
THIRD_PARTY: dict[str, set[str]] = {
    "llama_cpp": {"engine"},
    "gguf": {"engine"},
    "numpy": {"engine"},
    "starlette": {"serve"},
    "uvicorn": {"serve"},
    "prometheus_client": {"serve"},
    "huggingface_hub": {"hub"},
    "typer": {"cli"},
    "prompt_toolkit": {"cli"},
}


def imports_of(path: Path, module: str) -> list[tuple[int, str]]:
    """(line, absolute module) for every import in a file; `module` is its dotted name (for relative ones)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            names = [f"{target}.{a.name}" for a in node.names] if not node.module or node.level else []
            found += [(node.lineno, target)] + [(node.lineno, n) for n in names]
        elif isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "import_module":
            if node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
                name = node.args[0].value
                if name.startswith("."):
                    dots = len(name) - len(name.lstrip("."))
                    base = package.split(".")[: len(package.split(".")) - dots + 1]
                    name = ".".join(base + [name.lstrip(".")])
                found.append((node.lineno, name))
    return found


def _owner(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1:
        return "__init__"
    top = parts[1]
    return top[:-3] if top.endswith(".py") else top


def violations(root: Path = SRC) -> list[str]:
    out = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root.parent).with_suffix("")
        module = ".".join(rel.parts)
        if module.endswith(".__init__"):
            module = module[: -len(".__init__")]
        owner = _owner(module)
        allowed = CONTRACT.get(owner)
        if allowed is None:
            out.append(f"{module}: package {owner!r} is not in the contract")
            continue
        for line, target in imports_of(path, module):
            top = target.split(".")[0]
            if top == root.name:
                other = _owner(target)
                if other not in CONTRACT:  # localrun.__version__ and the like: the package's own __init__
                    other = "__init__"
                if other != owner and other not in allowed and not (other == "__init__" and target.count(".") <= 1):
                    out.append(f"{module}:{line} imports {target}: {owner} may import {sorted(allowed) or 'nothing'}")
            elif top in THIRD_PARTY and owner not in THIRD_PARTY[top]:
                out.append(f"{module}:{line} imports {top}: only {sorted(THIRD_PARTY[top])} may")
    return out


def test_the_import_contract_holds():
    assert violations() == []


def test_the_contract_catches_a_violation(tmp_path):
    """The checker itself: a CLI module that reaches into the engine, and a store module that loads llama.cpp."""
    root = tmp_path / "localrun"
    for pkg in ("cli", "engine", "store"):
        (root / pkg).mkdir(parents=True)
        (root / pkg / "__init__.py").write_text("")
    (root / "__init__.py").write_text("")
    (root / "engine" / "model.py").write_text("import llama_cpp\n")
    (root / "cli" / "main.py").write_text("def run():\n    from ..engine.model import Engine\n")
    (root / "store" / "bad.py").write_text("from importlib import import_module\nimport_module('llama_cpp')\n")
    found = violations(root)
    assert any(v.startswith("localrun.cli.main:2 imports localrun.engine.model") for v in found), found
    assert any(v.startswith("localrun.store.bad:2 imports llama_cpp") for v in found), found
    assert not any(v.startswith("localrun.engine") for v in found), found


@pytest.mark.parametrize("args,heavy", [
    (["--help"], ("pydantic", "localrun.engine.sampling")),
    (["run", "--help"], ("localrun.engine.sampling",)),  # Typer's own option parsing imports pydantic here
])
def test_the_command_line_starts_without_heavy_imports(args, heavy):
    """`localrun --help` builds every command's options (the sampling flags from the option list) without
    pydantic, llama.cpp, numpy, the server stack or the Hub client."""
    heavy = ("llama_cpp", "numpy", "gguf", "starlette", "uvicorn", "huggingface_hub", "localrun.engine.model", *heavy)
    code = (
        f"import sys; sys.argv=['localrun', *{args!r}]\n"
        "import localrun.cli as c\n"
        "try:\n    c.main()\nexcept SystemExit:\n    pass\n"
        f"print(sorted(m for m in {heavy!r} if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "[]"


@pytest.mark.parametrize("module", ["localrun.engine.sampling", "localrun.engine.loop", "localrun.engine.strategies"])
def test_engine_modules_do_not_load_llama_cpp_on_import(module):
    """llama.cpp is a shared library: loaded on first use (llama.llama_cpp_module), not by an import."""
    code = f"import sys, {module}; print('llama_cpp' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
