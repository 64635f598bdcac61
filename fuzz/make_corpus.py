#!/usr/bin/env python3
"""Writes the fuzzers' seed corpora, fuzz/corpus/<target>/: a few small valid inputs of each
kind and a few near misses. The files are committed; rerun this only to change them
(`python3 fuzz/make_corpus.py`, NumPy needed for the .npy seeds)."""
import io
import pathlib
import struct

import numpy as np

CORPUS = pathlib.Path(__file__).resolve().parent / "corpus"


def write(target, name, data):
    path = CORPUS / target / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


# --- fuzz_npy: files as NumPy writes them, then a few it must reject ----------------------------
def npy_bytes(array, version=None):
    buffer = io.BytesIO()
    if version is None:
        np.save(buffer, array)
    else:
        np.lib.format.write_array(buffer, array, version=version)
    return buffer.getvalue()


def npy_seeds():
    rng = np.random.default_rng(0)
    write("fuzz_npy", "f32_2x3.npy", npy_bytes(rng.standard_normal((2, 3)).astype("<f4")))
    write("fuzz_npy", "f16_5.npy", npy_bytes(np.array([0, 1, -2, np.inf, np.nan], "<f2")))
    write("fuzz_npy", "f64_fortran_2x3x2.npy",
          npy_bytes(np.asfortranarray(np.arange(12, dtype="<f8").reshape(2, 3, 2))))
    write("fuzz_npy", "bool_v2_4x1.npy", npy_bytes(np.array([[1], [0], [1], [1]], "?"), (2, 0)))
    write("fuzz_npy", "f32_v3_empty_0x4.npy", npy_bytes(np.zeros((0, 4), "<f4"), (3, 0)))
    valid = npy_bytes(np.ones(3, "<f4"))
    write("fuzz_npy", "bad_truncated_data.npy", valid[:-2])
    write("fuzz_npy", "bad_big_endian.npy", npy_bytes(np.ones(3, ">f4")))
    write("fuzz_npy", "bad_int32.npy", npy_bytes(np.ones(3, "<i4")))


# --- fuzz_validation: the encoding of fuzz/fuzz_validation.cpp ----------------------------------
EDGES = [-2**63, 2**63 - 1, -2**31, 2**31 - 1, 2**40, 2**40 + 1, -2**40, -2**40 - 1, 2**60,
         2**60 + 1, 2**62, -2**62, 2**31, 2**32, 128, 129, 257, 2**20, 0xFFFFFFFF]
F16, BF16, F32, BOOL = 0, 1, 2, 3
SLOTS = ["q", "k", "v", "mask_bias", "pair_bias", "mask", "o", "lse", "d_o", "dq", "dk", "dv",
         "d_mask_bias", "d_pair_bias"]


def integer(v):
    if -64 <= v <= 127:
        return bytes([v + 64])
    if v in EDGES:
        return bytes([0xC0 + EDGES.index(v)])
    return b"\xff" + struct.pack("<q", v)


def contiguous(sizes):
    strides, step = [], 1
    for s in reversed(sizes):
        strides.insert(0, step)
        step *= s
    return strides


def tensor(dtype, sizes, strides=None, device=0, flags=1, fill=0x3C):
    sizes = list(sizes)
    strides = list(strides if strides is not None else contiguous(sizes))
    padded = lambda v: v + [0] * (5 - len(v))  # unused dimensions
    out = bytes([flags]) + integer(dtype) + integer(device) + integer(0) + integer(len(sizes))
    for v in padded(sizes) + padded(strides):
        out += integer(v)
    return out + bytes([fill])


def options(scale=None, num_threads=1):
    return (bytes([1]) + integer(1 if scale is not None else 0) +
            struct.pack("<d", scale or 0.0) + integer(1) + integer(0) + integer(num_threads))


NO_OPTIONS = bytes([0]) + integer(0) + struct.pack("<d", 0.0) + integer(0) * 3
ABSENT = tensor(0, [], flags=0)


def problem(opts, tensors, call=1):
    return opts + b"".join(tensors.get(name, ABSENT) for name in SLOTS) + bytes([call])


def seq(dtype, B, N, L, H, D, strides=None, device=0):
    return tensor(dtype, [B, N, L, H, D], strides, device)


def qkv_and_grads(dtype, B, N, Lq, Lk, H, D, device=0):
    q, kv = (B, N, Lq, H, D), (B, N, Lk, H, D)
    return {"q": seq(dtype, *q, device=device), "k": seq(dtype, *kv, device=device),
            "v": seq(dtype, *kv, device=device), "o": seq(dtype, *q, device=device),
            "lse": tensor(F32, [B, N, H, Lq], device=device),
            "d_o": seq(dtype, *q, device=device), "dq": seq(dtype, *q, device=device),
            "dk": seq(dtype, *kv, device=device), "dv": seq(dtype, *kv, device=device)}


def validation_seeds():
    # float32 with both Evoformer biases and their gradients.
    t = qkv_and_grads(F32, 1, 2, 3, 5, 2, 4)
    t.update(mask_bias=tensor(F32, [1, 2, 1, 1, 5]), pair_bias=tensor(F32, [1, 1, 2, 3, 5]),
             d_mask_bias=tensor(F32, [1, 2, 1, 1, 5]), d_pair_bias=tensor(F32, [1, 1, 2, 3, 5]))
    write("fuzz_validation", "f32_biases_grads", problem(options(scale=0.3), t))
    # float16 with a 3-D boolean mask, default options.
    t = qkv_and_grads(F16, 2, 1, 4, 3, 1, 8)
    t["mask"] = tensor(BOOL, [2, 1, 3], fill=1)
    write("fuzz_validation", "f16_mask3d", problem(NO_OPTIONS, t))
    # bfloat16: head-major q, k walked backwards along Lk, v broadcast over heads, a bfloat16
    # pair bias broadcast over heads, a 5-D mask.
    t = qkv_and_grads(BF16, 1, 1, 4, 3, 2, 4)
    t.update(q=seq(BF16, 1, 1, 4, 2, 4, [32, 32, 4, 16, 1]),
             k=seq(BF16, 1, 1, 3, 2, 4, [24, 24, -8, 4, 1]),
             v=seq(BF16, 1, 1, 3, 2, 4, [12, 12, 4, 0, 1]),
             pair_bias=tensor(BF16, [1, 1, 1, 4, 3]), mask=tensor(BOOL, [1, 1, 1, 1, 3], fill=1))
    write("fuzz_validation", "bf16_strided_broadcast", problem(options(), t, call=3))
    # Near misses: head dim 129, a stride past 2^40, an unknown dtype code; CUDA tensors (no
    # backend here, or a CUDA build without a GPU).
    t = qkv_and_grads(F32, 1, 1, 2, 2, 1, 129)
    write("fuzz_validation", "bad_head_dim_129", problem(options(), t))
    t = qkv_and_grads(F32, 1, 1, 2, 2, 1, 4)
    t["k"] = seq(F32, 1, 1, 2, 1, 4, [8, 8, 2**40 + 1, 4, 1])
    write("fuzz_validation", "bad_stride_2_40_plus_1", problem(options(), t))
    t = qkv_and_grads(F32, 1, 1, 2, 2, 1, 4, device=1)
    write("fuzz_validation", "cuda_tensors", problem(options(), t))
    t["q"] = tensor(7, [1, 1, 2, 1, 4])
    write("fuzz_validation", "bad_dtype_code", problem(options(), t, call=2))


if __name__ == "__main__":
    npy_seeds()
    validation_seeds()
