"""What made a running server: localrun's version and the llama.cpp libraries it loaded. A client of the
resident server compares it with its own before sending a request, without importing llama_cpp (which
would cost the client the load time the server exists to save)."""

from __future__ import annotations

import hashlib
import os
from functools import lru_cache
from pathlib import Path

from ... import __version__


@lru_cache(maxsize=1)
def build_identity() -> str:
    """'localrun VERSION, llama.cpp LIBS' where LIBS fingerprints the bundled libraries (engine.llama): another
    build of the same version (cpu, cpu-exact, cuda) gives another identity."""
    from ...engine.llama import library_fingerprint

    tag = os.environ.get("LOCALRUN_BUILD_TAG", "")  # marks a build apart (a packager's patch; the tests' "other build")
    return f"localrun {__version__}{'+' + tag if tag else ''}, llama.cpp {library_fingerprint()}, settings {_settings()}"


# The environment a server answers by: it took these from the client that started it, so a client with
# other values (or an edited models.yaml) needs another server.
_SETTINGS = ("LOCALRUN_MODELS", "LOCALRUN_CACHE_MAX", "LOCALRUN_BACKEND_SAMPLING", "LOCALRUN_LLAMA_LOG", "HF_ENDPOINT",
             "HF_HOME", "HF_HUB_OFFLINE", "LOCALRUN_MIRROR_FIND_LINKS", "PIP_INDEX_URL")


def _settings() -> str:
    from ...store.paths import home

    digest = hashlib.sha256()
    for name in _SETTINGS:
        digest.update(f"{name}={os.environ.get(name)}\n".encode())
    user_catalogue = Path(os.environ.get("LOCALRUN_MODELS") or home() / "models.yaml")
    try:
        st = user_catalogue.stat()
        digest.update(f"{user_catalogue}:{st.st_size}:{st.st_mtime_ns}".encode())
    except OSError:
        pass
    return digest.hexdigest()[:12]
