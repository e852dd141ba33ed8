"""The child process tests/store/test_session_writers.py starts and kills: `python session_writer_child.py COMMAND
...`. A module of its own so that each of the many children imports only the store (the test module imports
pytest, a fifth of a second of CPU per child)."""

from __future__ import annotations

import fcntl
import os
import random
import sys
from pathlib import Path

from localrun.store.sessions import Identity, SessionStore
from localrun.store.writers import hold_writer

IDENT = Identity(model_file="m.gguf", model_sha256="0" * 64, quant="Q8_0", kv_type="f16", swa_full=False,
                 flash_attn="auto", build="test", system_info="")


def child_main(argv: list[str]) -> None:
    command = argv[0]
    if command == "hold":  # hold a session's writer lock until stdin closes
        with hold_writer(argv[2], argv[3], locks=Path(argv[1])):
            print("held", flush=True)
            sys.stdin.read()
    elif command == "write-locked":  # a save in progress: its file flocked
        fd = os.open(argv[1], os.O_WRONLY | os.O_CREAT, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, b"z" * 3000)
        print("held", flush=True)
        sys.stdin.read()
    elif command == "save-forever":  # until killed
        store = SessionStore.open(Path(argv[1]))
        rng = random.Random(os.getpid())
        print("ready", flush=True)
        while True:
            data = bytearray(rng.randbytes(rng.randrange(1, 4) << 20))
            store.save("k", IDENT, [1, 2, 3], [{"role": "user", "content": "hi"}], lambda: data, model_ref="m", n_ctx=64)
    else:
        raise SystemExit(f"unknown command {command}")


if __name__ == "__main__":
    child_main(sys.argv[1:])
