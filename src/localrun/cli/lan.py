"""`serve`'s flags for clients beyond this process's user: API keys (--api-key, --api-key-file), the browser origins
allowed (--allowed-origins, LOCALRUN_ORIGINS) and TLS (--ssl-certfile, --ssl-keyfile), each checked before any model
loads, with the flag named in one line."""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Optional

from ..errors import UsageError


def api_keys(key: Optional[str], key_file: Optional[Path]) -> tuple[str, ...]:
    """--api-key and the keys of --api-key-file (one a line; blank lines and # comments left out)."""
    from ..serve.guards import read_key_file

    keys = [key] if key else []
    if key_file is not None:
        try:
            found = read_key_file(key_file)
        except OSError as exc:
            raise UsageError(f"cannot read --api-key-file {key_file}: {exc.strerror or exc}") from None
        except UnicodeDecodeError:
            raise UsageError(f"--api-key-file {key_file} is not text: write one key a line") from None
        if not found:
            raise UsageError(f"--api-key-file {key_file} has no key: write one key a line (# starts a comment)")
        bad = next((k for k in found if any(c.isspace() for c in k) or not k.isprintable()), None)
        if bad is not None:
            raise UsageError(f"--api-key-file {key_file}: a key has a space or a control character in it: one key a line")
        keys += found
    return tuple(dict.fromkeys(keys))


def allowed_origins(given: Optional[list[str]]) -> tuple[str, ...]:
    """LOCALRUN_ORIGINS and --allowed-origins (each comma-separated, repeatable), checked."""
    from ..serve.cors import bad_origin, env_origins, split_origins

    origins = [*env_origins(), *(o for value in given or () for o in split_origins(value))]
    for origin in origins:
        wrong = bad_origin(origin)
        if wrong:
            raise UsageError(f"invalid allowed origin {origin!r} (--allowed-origins or LOCALRUN_ORIGINS): {wrong}")
    return tuple(dict.fromkeys(origins))


def tls_files(certfile: Optional[Path], keyfile: Optional[Path]) -> tuple[Optional[str], Optional[str]]:
    """--ssl-certfile and --ssl-keyfile, loaded once here so that a wrong file is said now, not by uvicorn as it
    starts (a PEM key may also sit in the certificate's file)."""
    if certfile is None:
        if keyfile is not None:
            raise UsageError("--ssl-keyfile needs --ssl-certfile (the certificate it is the key of)")
        return None, None
    for flag, path in (("--ssl-certfile", certfile), ("--ssl-keyfile", keyfile)):
        if path is not None and not path.is_file():
            raise UsageError(f"{flag} {path}: no such file")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(str(certfile), str(keyfile) if keyfile else None, password=_no_password)
    except (ssl.SSLError, ValueError) as exc:
        what = f"--ssl-certfile {certfile}" + (f" and --ssl-keyfile {keyfile}" if keyfile else "")
        raise UsageError(f"{what}: not a PEM certificate with its unencrypted private key ({exc})") from None
    return str(certfile.resolve()), str(keyfile.resolve()) if keyfile else None


def _no_password() -> bytes:
    raise ValueError("the private key is encrypted: give it without a password (openssl pkey -in KEY -out PLAIN)")
