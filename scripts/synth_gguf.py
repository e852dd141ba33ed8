#!/usr/bin/env python3
"""Synthetic GGUF models for speed measurements: a real file's exact header, random weights.

For measuring speed on a machine that the real model cannot be sent to (the device machine gets at most
64 MiB, see scripts/gpu_pack.sh): the synthetic file has the real file's exact header -- all metadata, the
tokenizer, the tensor infos and layout -- followed by random, finite weights of the same quant types, at the
same offsets, so it has the real file's size and llama.cpp does the same work on it. Never use it for
anything that reads the answers: the text it makes is garbage.

    synth_gguf.py skeleton REAL.gguf OUT_PREFIX     -> OUT_PREFIX.head + OUT_PREFIX.json
    synth_gguf.py fill OUT_PREFIX OUT.gguf [--seed N]

`skeleton` copies the real file's bytes [0, data_offset) (GGUF header, all metadata incl. the
tokenizer, tensor infos, alignment padding) and records every tensor's name, ggml type, shape,
offset (relative to the data section) and byte size.  `fill` writes that head followed by random
but numerically sane tensor data of the same type and size at the same offsets.

Checked on CPU with llama-bench (tg16, t/s): SmolLM2-135M Q4_1 118.8 and 113.5 real, 123.1 and 114.8
synthetic; Qwen2.5-Coder-1.5B Q4_K_M 23.9 and 25.1 real, 27.5 and 24.7 synthetic; pp64 agreed likewise.
Real and synthetic are as far apart as two runs of one file: the same speeds.

`fill` needs only the standard library and numpy (Python 3.10+: it runs on the device machine); `skeleton`
reads the header with localrun's own reader (engine.gguf_info), run where localrun is installed.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

# ggml type id -> (name, block size in elements, bytes per block)   (ggml.c type_traits /
# sizeof(block_*) in ggml-common.h of llama.cpp as vendored by llama-cpp-python 0.3.36;
# note gguf-py's table says 40 for Q8_1, ggml says 36)
GGML_TYPES = {
    0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22), 7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 9: ("Q8_1", 32, 36),
    10: ("Q2_K", 256, 84), 11: ("Q3_K", 256, 110), 12: ("Q4_K", 256, 144), 13: ("Q5_K", 256, 176),
    14: ("Q6_K", 256, 210), 15: ("Q8_K", 256, 292), 16: ("IQ2_XXS", 256, 66), 17: ("IQ2_XS", 256, 74),
    18: ("IQ3_XXS", 256, 98), 19: ("IQ1_S", 256, 50), 20: ("IQ4_NL", 32, 18), 21: ("IQ3_S", 256, 110),
    22: ("IQ2_S", 256, 82), 23: ("IQ4_XS", 256, 136), 24: ("I8", 1, 1), 25: ("I16", 1, 2),
    26: ("I32", 1, 4), 27: ("I64", 1, 8), 28: ("F64", 1, 8), 29: ("IQ1_M", 256, 56),
    30: ("BF16", 1, 2), 34: ("TQ1_0", 256, 54), 35: ("TQ2_0", 256, 66), 39: ("MXFP4", 32, 17),
    40: ("NVFP4", 64, 36), 41: ("Q1_0", 128, 18), 42: ("Q2_0", 64, 18),
}

# Scale fields per quantized block (ggml-common.h), all ggml_half unless noted.
# (byte offset in block, base value, kind); each block gets base * U(0.5, 1.5).
#   kind "d":        the block's delta
#   kind ("m", k):   a min/offset = -k * (this block's d), so weights are roughly centred on 0
# Bases are chosen so that dequantized |w| is ~0.01-0.1 (typical ~0.02-0.05), like real weights.
#   Q4_0  w = d*(q-8),   q 0..15                      d 0.01
#   Q4_1  w = d*q + m,   q 0..15                      d 0.01,  m = -7.5 d
#   Q5_0  w = d*(q-16),  q 0..31                      d 0.005
#   Q5_1  w = d*q + m,   q 0..31                      d 0.005, m = -15.5 d
#   Q8_0  w = d*q,       q int8                       d 0.0005
#   Q2_K  w = d*sc*q - dmin*mn, sc,mn 0..15, q 0..3   d 0.002, dmin = 1.5 d   (d,dmin at end)
#   Q3_K  w = d*(sc-32)*q, sc 0..63, q -4..3          d 0.0007                (d at end)
#   Q4_K  w = d*sc*q - dmin*mn, sc,mn 0..63, q 0..15  d 0.00012, dmin = 7.5 d
#   Q5_K  same, q 0..31                               d 0.00006, dmin = 15.5 d
#   Q6_K  w = d*sc*(q-32), sc int8, q 0..63           d 0.00002               (d at end)
# ("m", k) for the K types is stored as a positive dmin: w = ... - dmin*mn.
QUANT_SCALES = {
    "Q4_0": [(0, 0.01, "d")],
    "Q4_1": [(0, 0.01, "d"), (2, None, ("m", -7.5))],
    "Q5_0": [(0, 0.005, "d")],
    "Q5_1": [(0, 0.005, "d"), (2, None, ("m", -15.5))],
    "Q8_0": [(0, 0.0005, "d")],
    "Q2_K": [(80, 0.002, "d"), (82, None, ("m", 1.5))],
    "Q3_K": [(108, 0.0007, "d")],
    "Q4_K": [(0, 0.00012, "d"), (2, None, ("m", 7.5))],
    "Q5_K": [(0, 0.00006, "d"), (2, None, ("m", 15.5))],
    "Q6_K": [(208, 0.00002, "d")],
    # Q8_0-like types with an extra field, handled specially below:
    "Q8_1": [(0, 0.0005, "d")],  # + s = d*sum(qs) at offset 2
    "Q8_K": [],                  # float32 d at 0, int8 qs[256], int16 bsums[16]
}

# --------------------------------------------------------------------------- GGUF header parsing

def parse_gguf(path):
    """The header's layout, read by localrun's own GGUF reader (engine.gguf_info: it checks and sizes the file
    and skips the vocabulary's arrays). Only `skeleton` needs it, where localrun is installed; `fill` reads
    the JSON it wrote."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))
    from pathlib import Path

    from localrun.engine.gguf_info import _read_header

    header = _read_header(Path(path))
    tensors = []
    for t in header.tensors:
        ttype = int(t.ggml_type)
        if ttype not in GGML_TYPES:
            raise ValueError(f"{t.name}: ggml type {ttype} is not one synth_gguf.py can fill")
        tensors.append({"name": t.name, "type": ttype, "type_name": GGML_TYPES[ttype][0], "shape": list(t.shape),
                        "offset": t.offset, "nbytes": t.n_bytes})
    meta = header.metadata
    return {"version": header.version, "architecture": meta.get("general.architecture"),
            "alignment": int(meta.get("general.alignment", 32)), "data_offset": header.data_start,
            "file_size": header.file_size, "tensors": tensors}


# --------------------------------------------------------------------------- sub-commands

def cmd_skeleton(real, prefix):
    info = parse_gguf(real)
    info["source"] = os.path.basename(real)
    end = max((t["offset"] + t["nbytes"] for t in info["tensors"]), default=0)
    if info["data_offset"] + end > info["file_size"]:
        raise ValueError("tensor data runs past the end of the file")
    with open(real, "rb") as f:
        head = f.read(info["data_offset"])
    d = os.path.dirname(prefix)
    if d:
        os.makedirs(d, exist_ok=True)
    with open(prefix + ".head", "wb") as f:
        f.write(head)
    with open(prefix + ".json", "w") as f:
        json.dump(info, f, indent=1)
    types = {}
    for t in info["tensors"]:
        types[t["type_name"]] = types.get(t["type_name"], 0) + 1
    print(f"{prefix}: head {len(head)} B, {len(info['tensors'])} tensors {types}, "
          f"data_offset {info['data_offset']}, file_size {info['file_size']}")


CHUNK = 32 << 20  # bytes of tensor data generated per step


def _f16_bytes(x):
    return np.asarray(x, dtype=np.float16).view(np.uint8).reshape(-1, 2)


def _gen_float(rng, t, n_el, out):
    """Write a float tensor: norms = 1, others normal * 0.02."""
    tname = t["type_name"]
    is_norm = "norm" in t["name"]
    done = 0
    step = CHUNK // 4
    while done < n_el:
        n = min(step, n_el - done)
        if is_norm:
            x = np.ones(n, dtype=np.float32)
        else:
            x = (rng.standard_normal(n, dtype=np.float32) * np.float32(0.02))
        if tname == "F32":
            b = x
        elif tname == "F16":
            b = x.astype(np.float16)
        elif tname == "BF16":
            b = (x.view(np.uint32) >> 16).astype(np.uint16)  # truncation is fine for random data
        elif tname == "F64":
            b = x.astype(np.float64)
        out.write(memoryview(np.ascontiguousarray(b)).cast("B"))
        done += n


def _gen_quant(rng, t, out):
    tname, blck, tsize = GGML_TYPES[t["type"]]
    if tname not in QUANT_SCALES:
        raise NotImplementedError(f"{t['name']}: type {tname} not supported "
                                  f"(supported: {', '.join(QUANT_SCALES)})")
    n_blocks = t["nbytes"] // tsize
    per = max(1, CHUNK // tsize)
    done = 0
    while done < n_blocks:
        nb = min(per, n_blocks - done)
        blk = np.frombuffer(rng.bytes(nb * tsize), dtype=np.uint8).reshape(nb, tsize).copy()
        if tname == "Q8_K":
            d = (0.0005 * rng.uniform(0.5, 1.5, nb)).astype(np.float32)
            blk[:, 0:4] = d.view(np.uint8).reshape(nb, 4)
            qs = blk[:, 4:260].view(np.int8).astype(np.int16)
            bsums = qs.reshape(nb, 16, 16).sum(axis=2).astype("<i2")
            blk[:, 260:292] = bsums.view(np.uint8).reshape(nb, 32)
        else:
            dval = None
            for off, base, kind in QUANT_SCALES[tname]:
                if kind == "d":
                    dval = base * rng.uniform(0.5, 1.5, nb)
                    blk[:, off:off + 2] = _f16_bytes(dval)
                else:
                    blk[:, off:off + 2] = _f16_bytes(kind[1] * dval)
            if tname == "Q8_1":  # s = d * sum(qs)
                s = dval * blk[:, 4:36].view(np.int8).astype(np.int32).sum(axis=1)
                blk[:, 2:4] = _f16_bytes(s)
        out.write(memoryview(blk).cast("B"))
        done += nb


def cmd_fill(prefix, out_path, seed):
    t0 = time.time()
    with open(prefix + ".json") as f:
        info = json.load(f)
    with open(prefix + ".head", "rb") as f:
        head = f.read()
    if len(head) != info["data_offset"]:
        raise ValueError(f"head is {len(head)} B, expected {info['data_offset']}")
    rng = np.random.default_rng(seed)
    tensors = sorted(info["tensors"], key=lambda t: t["offset"])
    d = os.path.dirname(out_path)
    if d:
        os.makedirs(d, exist_ok=True)
    tmp = out_path + ".part"
    with open(tmp, "wb", buffering=0) as out:
        out.write(head)
        pos = 0  # relative to the data section
        for t in tensors:
            if t["offset"] < pos:
                raise ValueError(f"{t['name']}: overlapping tensors")
            if t["offset"] > pos:
                out.write(bytes(t["offset"] - pos))
            tname, blck, tsize = GGML_TYPES[t["type"]]
            n_el = 1
            for dim in t["shape"]:
                n_el *= dim
            if n_el // blck * tsize != t["nbytes"]:
                raise ValueError(f"{t['name']}: size mismatch")
            start = out.tell()
            if blck == 1 and tname in ("F32", "F16", "BF16", "F64"):
                _gen_float(rng, t, n_el, out)
            elif blck == 1:  # integer tensors (rare): zeros
                out.write(bytes(t["nbytes"]))
            else:
                _gen_quant(rng, t, out)
            if out.tell() - start != t["nbytes"]:
                raise AssertionError(f"{t['name']}: wrote {out.tell() - start} B, expected {t['nbytes']}")
            pos = t["offset"] + t["nbytes"]
        total = info["data_offset"] + pos
        if total < info["file_size"]:
            out.write(bytes(info["file_size"] - total))
    os.replace(tmp, out_path)
    size = os.path.getsize(out_path)
    if size != info["file_size"]:
        raise AssertionError(f"wrote {size} B, expected {info['file_size']}")
    print(f"{out_path}: {size} B, {len(tensors)} tensors, seed {seed}, {time.time() - t0:.1f} s")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("skeleton", help="REAL.gguf OUT_PREFIX -> OUT_PREFIX.head/.json")
    s.add_argument("real")
    s.add_argument("prefix")
    f = sub.add_parser("fill", help="OUT_PREFIX OUT.gguf -> synthetic model")
    f.add_argument("prefix")
    f.add_argument("out")
    f.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    if a.cmd == "skeleton":
        cmd_skeleton(a.real, a.prefix)
    else:
        cmd_fill(a.prefix, a.out, a.seed)


if __name__ == "__main__":
    sys.exit(main())
