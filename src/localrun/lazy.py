"""Package names imported from their modules on first use (PEP 562), so that importing one light module of a
package (the option list the CLI builds its flags from) does not import the rest (pydantic, the engine)."""

from __future__ import annotations

from importlib import import_module


def exports(namespace: dict, where: dict[str, str]):
    """A module `__getattr__` giving each name in `where` from its module (relative to the package)."""
    package = namespace["__package__"]

    def __getattr__(name: str):
        if name in where:
            value = getattr(import_module(where[name], package), name)
            namespace[name] = value
            return value
        raise AttributeError(f"module {namespace['__name__']!r} has no attribute {name!r}")

    return __getattr__


def submodule_first(package: str, submodule: str, after_init=None):
    """`package`, its `submodule` imported and its public names on the package, without running the package's
    __init__ first: for a third-party package whose __init__ imports far more than we use (llama_cpp's pulls in
    its Llama class with numpy, jinja2 and diskcache; gguf's its reader and writer with numpy). The rest of the
    package is there on first use of a name it lacks: its own __init__ runs then (once, whichever thread asks
    first; the others wait for it), and then `after_init(package)` (to undo what the __init__ changed, say).
    A package already imported (whole, by a program that embeds localrun) is returned as it is."""
    import importlib.util
    import sys
    import threading

    if package in sys.modules:
        return sys.modules[package]
    spec = importlib.util.find_spec(package)
    if spec is None or spec.loader is None or not spec.submodule_search_locations:
        return import_module(package)  # not a regular package: let the import system say what is wrong
    module = importlib.util.module_from_spec(spec)
    sys.modules[package] = module
    try:
        inner = import_module(f"{package}.{submodule}")
    except BaseException:
        del sys.modules[package]
        raise
    module.__dict__.update((name, value) for name, value in vars(inner).items() if not name.startswith("_"))
    lock, started = threading.RLock(), False

    def the_rest(name: str):
        nonlocal started
        with lock:
            if not started:  # (a name asked for while the __init__ runs in this thread: not there yet)
                started = True
                spec.loader.exec_module(module)  # the package's own __init__
                if after_init is not None:
                    after_init(module)
                module.__dict__.pop("__getattr__", None)
        try:
            return module.__dict__[name]
        except KeyError:
            raise AttributeError(f"module {package!r} has no attribute {name!r}") from None

    module.__getattr__ = the_rest
    return module
