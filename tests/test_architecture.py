"""The import contract: which package of src/localrun may import which, and who may touch llama.cpp.

Every import is read from the source (at module level and inside functions, relative ones resolved), so a
lazy import counts as much as a top-level one. A violation names the importing module, the line and the rule.
"""

from __future__ import annotations

import ast
import re
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
    "serve": {"runtime", "store", "hub", "errors"},  # store: the Responses API's stored answers; hub: /api/pull
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


# -- the HTTP layer (serve/): dialects as pure translators, models seen through their facts, no circles ---------------

SERVE = SRC / "serve"


def _serve_modules(root: Path = SERVE) -> dict[str, Path]:
    """Dotted name -> file of every module under serve/ (a package by its own name)."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = ("localrun", *path.relative_to(root.parent).with_suffix("").parts)
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def _within(target: str, modules: dict[str, Path]) -> str | None:
    """The serve module an import names (`from .x import name` names x.name: its module is x)."""
    while target and target not in modules:
        target = target.rpartition(".")[0]
    return target or None


def _dialect(module: str) -> str | None:
    """The dialect a module of serve/dialects or serve/routes is (ollama_models is Ollama's), or None."""
    parts = module.split(".")
    if len(parts) == 4 and parts[2] in ("dialects", "routes"):
        return parts[3].split("_")[0]
    return None


def dialect_violations(root: Path = SERVE) -> list[str]:
    """A dialect's translator imports no other dialect, nor Starlette or uvicorn (it is pure: wire body in, request
    out; events in, wire text out); a dialect's routes mount only their own dialect."""
    modules, out = _serve_modules(root), []
    for module, path in modules.items():
        mine = _dialect(module)
        if mine is None or module.endswith(".ops"):
            continue
        for line, target in imports_of(path, module):
            other = _within(target, modules)
            theirs = _dialect(other) if other and ".dialects." in other else None
            if theirs is not None and theirs != mine:
                out.append(f"{module}:{line} imports {target}: dialect {mine!r} may not import dialect {theirs!r}")
            if ".dialects." in module and target.split(".")[0] in ("starlette", "uvicorn"):
                out.append(f"{module}:{line} imports {target}: a dialect's translator imports no HTTP server")
    return out


def engine_violations(root: Path = SERVE) -> list[str]:
    """serve sees a model through runtime.facts.ModelFacts only: no `.engine` attribute, no import of the engine."""
    out = []
    for module, path in _serve_modules(root).items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        out += [f"{module}:{node.lineno} touches .engine" for node in ast.walk(tree)
                if isinstance(node, ast.Attribute) and node.attr == "engine"]
        out += [f"{module}:{line} imports {target}" for line, target in imports_of(path, module)
                if target == "localrun.engine" or target.startswith("localrun.engine.")]
    return out


def serve_cycles(root: Path = SERVE) -> list[list[str]]:
    """The import circles among serve's modules (imports inside functions count: the import contract's reading)."""
    modules = _serve_modules(root)
    graph = {m: sorted({t for _, target in imports_of(p, m) if (t := _within(target, modules)) and t != m and not m.startswith(t + ".")})
             for m, p in modules.items()}
    cycles, done, stack = [], set(), []

    def visit(node: str) -> None:
        if node in stack:
            cycles.append(stack[stack.index(node):] + [node])
            return
        if node in done:
            return
        stack.append(node)
        for nxt in graph[node]:
            visit(nxt)
        stack.pop()
        done.add(node)

    for node in graph:
        visit(node)
    return cycles


def long_functions(root: Path = SERVE, limit: int = 60) -> list[str]:
    out = []
    for module, path in _serve_modules(root).items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno + 1 > limit:
                out.append(f"{module}:{node.lineno} {node.name} is {node.end_lineno - node.lineno + 1} lines")
    return out


def flags_below_the_dialects(root: Path = SERVE) -> list[str]:
    """Strings (not docstrings) that name a command-line flag, in serve's modules below the dialects: only a dialect
    words its clients' remedies, and serve.app (the `serve` command's own process) its own flags."""
    out = []
    for module, path in _serve_modules(root).items():
        if ".dialects" in module or module.endswith(".serve.app"):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        docstrings = {id(n.body[0].value) for n in ast.walk(tree) if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                      and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
                if re.search(r"(^|[\s`'(])--[a-z]", node.value):
                    out.append(f"{module}:{node.lineno} names a flag: {node.value[:60]!r}")
    return out


def test_no_dialect_imports_another_and_translators_import_no_http_server():
    assert dialect_violations() == []


def test_serve_never_touches_an_engine():
    assert engine_violations() == []


def test_no_import_circle_inside_serve():
    assert serve_cycles() == []


@pytest.mark.parametrize("package", sorted(p.parent.name for p in SRC.glob("*/__init__.py")))
def test_no_import_circle_inside_any_package(package):
    """Inside each package of localrun (hub, store, runtime, engine ... had five circles), imports inside
    functions included: each module can be read after the ones it imports."""
    assert serve_cycles(SRC / package) == []


def test_no_function_in_serve_is_over_60_lines():
    assert long_functions() == []


def test_nothing_below_the_dialects_names_a_flag_and_no_body_hides_private_fields():
    assert flags_below_the_dialects() == []
    hidden = [f"{m}: PrivateAttr" for m, p in _serve_modules().items() if "PrivateAttr" in p.read_text(encoding="utf-8")]
    assert hidden == []


def test_the_serve_rules_catch_what_they_forbid(tmp_path):
    """The checkers themselves, on a made-up serve/: a dialect importing another and Starlette, an engine reached
    into, a circle, a long function, a flag named below the dialects."""
    root = tmp_path / "localrun" / "serve"
    (root / "dialects").mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / "dialects" / "__init__.py").write_text("")
    (root / "dialects" / "anthropic.py").write_text("from . import openai\nfrom starlette.responses import JSONResponse\n")
    (root / "dialects" / "openai.py").write_text("")
    (root / "dialects" / "ollama_models.py").write_text("from .ollama import x\n")  # Ollama's own: allowed
    (root / "dialects" / "ollama.py").write_text("x = 1\n")
    (root / "a.py").write_text("from .b import f\ndef g(resident):\n    return resident.engine.n_vocab\n")
    (root / "b.py").write_text("def f():\n    from .a import g\n" + "    x = 1\n" * 60 + "    return 'try a larger --ctx'\n")
    dialects = dialect_violations(root)
    assert any("dialect 'anthropic' may not import dialect 'openai'" in v for v in dialects), dialects
    assert any("imports no HTTP server" in v for v in dialects) and not any("ollama_models" in v for v in dialects), dialects
    assert engine_violations(root) == ["localrun.serve.a:3 touches .engine"]
    assert serve_cycles(root) == [["localrun.serve.a", "localrun.serve.b", "localrun.serve.a"]]
    assert long_functions(root) == ["localrun.serve.b:1 f is 63 lines"]
    assert flags_below_the_dialects(root) == ["localrun.serve.b:63 names a flag: 'try a larger --ctx'"]


# -- errors name settings, not flags: the edge words them (errors.Phrase; cli.failures, serve.errors) ------------------

COMMAND = re.compile(r"`localrun [^`]*`")  # a whole command to type (`localrun stop --server`) is a command, not a setting
FLAG = re.compile(r"(^|[^\w-])--[a-z][a-z-]+")


def flags_in_raises(root: Path = SRC) -> list[str]:
    """`raise` statements outside cli/ whose message names a command-line flag (its text, f-strings' too): an error
    names the settings it is about (errors.Phrase, errors.SettingError), and each edge words them."""
    out = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root.parent).with_suffix("")
        if rel.parts[1:2] == ("cli",):
            continue
        module = ".".join(rel.parts[:-1] if rel.parts[-1] == "__init__" else rel.parts)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Raise) or node.exc is None:
                continue
            text = " ".join(n.value for n in ast.walk(node.exc) if isinstance(n, ast.Constant) and isinstance(n.value, str))
            for found in FLAG.finditer(COMMAND.sub("", text)):
                flag = found.group(0).lstrip(" (\"'")
                out.append(f"{module}:{node.lineno} names {flag}")
    return out


def test_no_raise_below_the_command_line_names_a_flag():
    assert flags_in_raises() == []


def test_the_flag_rule_catches_what_it_forbids(tmp_path):
    root = tmp_path / "localrun"
    for pkg in ("cli", "engine"):
        (root / pkg).mkdir(parents=True)
    (root / "engine" / "model.py").write_text(
        "def f(n):\n    raise ValueError(f'the context of {n}: try a smaller --ctx')\n"
        "def g():\n    raise ValueError('stop it with `localrun stop --server`')\n"
        "def h(Phrase):\n    raise ValueError(Phrase('try a smaller {ctx}'))\n")
    (root / "cli" / "main.py").write_text("def f():\n    raise ValueError('invalid --ctx')\n")
    assert flags_in_raises(root) == ["localrun.engine.model:2 names --ctx"]


# runtime/ in parts by audience: the request path every front end takes (runtime's own modules), what a server
# keeps and runs (serving), the command line's client of a server (client), what is made of models (models) and
# what is reported of them (reports). A part may import the parts named here, imports inside functions included.
RUNTIME = SRC / "runtime"
PARTS: dict[str, set[str]] = {
    "request path": set(),
    "client": {"request path"},
    "models": {"request path"},
    "serving": {"request path", "models"},
    "reports": {"request path", "serving", "models"},
}


def _part(module: str) -> str:
    inner = module.split(".")[2:3]  # localrun.runtime.PART...
    return inner[0] if inner and inner[0] in PARTS else "request path"


def runtime_part_violations(root: Path = RUNTIME) -> list[str]:
    out = []
    for module, path in _serve_modules(root).items():  # (any package's modules, by their dotted names)
        part = _part(module)
        seen = set()
        for line, target in imports_of(path, module):
            if target.startswith("localrun.runtime.") and target.count(".") >= 2:
                other = _part(target)
                if other != part and other not in PARTS[part] and (line, other) not in seen:
                    seen.add((line, other))  # (`from .serving.pool import X` is one import, not two)
                    out.append(f"{module}:{line} imports {target}: the {part} part may import {sorted(PARTS[part]) or 'no other part'}")
    return out


def test_runtime_parts_import_only_the_parts_below_them():
    assert runtime_part_violations() == []


def test_the_part_rule_catches_what_it_forbids(tmp_path):
    root = tmp_path / "runtime"
    (root / "serving").mkdir(parents=True)
    (root / "generate.py").write_text("def f():\n    from .serving.pool import ModelPool\n")
    (root / "serving" / "pool.py").write_text("from ..generate import f\n")
    assert runtime_part_violations(root) == [
        "localrun.runtime.generate:2 imports localrun.runtime.serving.pool: the request path part may import no other part"]


@pytest.mark.parametrize("module", sorted(f"localrun.runtime.client.{p.stem}".removesuffix(".__init__")
                                          for p in (RUNTIME / "client").glob("*.py")))
def test_the_client_imports_only_the_standard_library(module):
    """A `run` against a warm server starts as fast as Python: importing any client module loads nothing outside
    the standard library but localrun's own light modules (no llama_cpp, numpy, starlette, pydantic, typer...)."""
    code = (f"import sys; before = set(sys.modules); import {module}; "
            "print(sorted({m.split('.')[0] for m in set(sys.modules) - before} - set(sys.stdlib_module_names) - {'localrun'}))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert loaded == "[]"
