"""The pure parts of the RPC backend: --rpc and --tensor-split parsing, the placement llama.cpp's
load_tensors would make (checked against its rules on the real GGUF headers), and the one-line error of a
build without libggml-rpc."""

from __future__ import annotations

import pytest

from localrun.cli.failures import message_for
from localrun.engine import rpc
from localrun.engine.gguf_info import kv_cache_bytes, read_info
from localrun.errors import UsageError
from localrun.runtime.workers import parse_tensor_split


def test_endpoints_and_split_parse_or_name_the_bad_value():
    assert rpc.parse_endpoints(None) == ()
    assert rpc.parse_endpoints("10.0.0.2:50052, 10.0.0.3:50053") == ("10.0.0.2:50052", "10.0.0.3:50053")
    assert rpc.parse_endpoints("[::1]:50052") == ("[::1]:50052",)
    for bad in ("host", ":50052", "host:0", "host:65536", "host:port", "a:1,a:1"):
        with pytest.raises(UsageError) as caught:
            rpc.parse_endpoints(bad)
        assert "--rpc" in message_for(caught.value)[0]  # the setting the error names, as the command line words it
    assert parse_tensor_split("3,1") == (3.0, 1.0)
    assert parse_tensor_split(None) is None
    for bad in ("", "0,0", "-1,2", "a,b", "nan"):
        if bad:
            with pytest.raises(UsageError) as caught:
                parse_tensor_split(bad)
            assert message_for(caught.value)[0].startswith("invalid --tensor-split")


@pytest.mark.parametrize("which", ["smollm2", "gemma"])
def test_placement_follows_llama_cpps_rules(which, request):
    info = read_info(request.getfixturevalue(which))
    n = info.n_layer
    devices = [("RPC0[a:1]", 3 << 30), ("RPC0[b:1]", 1 << 30)]
    # All layers offloaded, split by free memory 3:1: the first three quarters on the first worker.
    rows = rpc.placement(info, devices, gpu_layers=-1, tensor_split=None, n_ctx=4096)
    assert [r.device for r in rows] == ["CPU", "RPC0[a:1]", "RPC0[b:1]"]
    assert rows[0].layers == [] and rows[0].weights == info.input_bytes  # the input layer stays on the CPU
    cut = next(i for i in range(n + 1) if i / (n + 1) >= 0.75)
    assert rows[1].layers == list(range(cut)) and rows[2].layers == list(range(cut, n + 1))
    assert sum(r.kv for r in rows) == kv_cache_bytes(info, 4096)
    # Some layers here: the first ones; --tensor-split overrides free memory.
    rows = rpc.placement(info, devices, gpu_layers=4, tensor_split=(1.0, 1.0), n_ctx=4096)
    assert rows[0].layers == list(range(n + 1 - 4))
    assert rows[1].layers == [n - 3, n - 2] and rows[2].layers == [n - 1, n]  # the output layer goes last
    assert sum(len(r.layers) for r in rows) == n + 1
    assert sum(r.weights for r in rows) >= info.tensor_bytes
    # No device besides the CPU: everything here.
    assert [len(r.layers) for r in rpc.placement(info, [], gpu_layers=-1, tensor_split=None, n_ctx=512)] == [n + 1]


def test_a_build_without_rpc_is_one_line_naming_the_fix(monkeypatch):
    from localrun.engine import llama

    monkeypatch.setattr(rpc, "_lib", None)
    monkeypatch.setattr(llama, "wheel_library", lambda stem: None)
    with pytest.raises(rpc.RpcError) as caught:
        rpc.library()
    assert caught.value.message == rpc.NO_RPC_BUILD and "\n" not in caught.value.message
    assert "make" in caught.value.message and "GGML_RPC=ON" in caught.value.message


def _fake_worker(reply):
    """A loopback listener that answers each connection with `reply(conn)` (a stand-in for a worker of
    another version, or one busy with another client)."""
    import socket
    import threading

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()

    def serve():
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                reply(conn)

    threading.Thread(target=serve, daemon=True).start()
    return server, f"127.0.0.1:{server.getsockname()[1]}"


def test_a_worker_of_another_version_or_busy_is_one_line():
    import struct

    def old_version(conn):
        conn.recv(1 + 8 + rpc._CAPS)  # the hello
        conn.sendall(struct.pack("<Q", 4 + rpc._CAPS) + bytes([6, 1, 0, 0]) + bytes(rpc._CAPS))

    server, endpoint = _fake_worker(old_version)
    try:
        with pytest.raises(rpc.RpcError) as caught:
            rpc.probe(endpoint)
        assert caught.value.message == (f"the RPC worker at {endpoint} speaks protocol 6.1.0, this localrun 7.0.0: run the"
                                        " same localrun (llama.cpp) version on both machines")
    finally:
        server.close()

    import threading

    gate = threading.Event()
    server, endpoint = _fake_worker(lambda conn: gate.wait(10))  # accepts, never answers: another client has it
    try:
        with pytest.raises(rpc.RpcError, match="serves one client at a time, and another is connected"):
            rpc.probe(endpoint, timeout=0.5)
    finally:
        gate.set()
        server.close()
