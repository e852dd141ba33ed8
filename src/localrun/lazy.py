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
