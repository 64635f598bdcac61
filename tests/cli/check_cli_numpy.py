#!/usr/bin/env python3
"""Independent check of `evoattn run`.

Writes random .npy inputs, runs the built CLI binary (the path is the only argument) and
compares o, lse, dq, dk, dv, dmask_bias and dpair_bias with a float64 NumPy computation
written here, sharing no code with the C++ reference. Exit 0 on success, 1 on a mismatch,
77 (ctest's SKIP_RETURN_CODE) when NumPy is missing.
"""
import os
import subprocess
import sys
import tempfile

try:
    import numpy as np
except ImportError:
    print("SKIPPED: numpy not installed")
    sys.exit(77)

# docs/CONTRACT.md's bounds on ||out - ref|| / ||ref||.
BOUNDS = {"fp32": 1e-5, "fp16": 1e-3, "bf16": 8e-3}


def round_to_bf16(x):
    """Rounds to the nearest bfloat16 (ties to even), returned as float32."""
    bits = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
    return bits.astype(np.uint32).view(np.float32)


def sum_to_shape(x, shape):
    """Sums x over the dimensions that `shape` broadcasts (size 1)."""
    axes = tuple(d for d, size in enumerate(shape) if size == 1 and x.shape[d] != 1)
    return x.sum(axis=axes, keepdims=True)


def attention(q, k, v, mask_bias, pair_bias, mask, d_o, scale):
    """Forward and backward in float64; q is [B, N, Lq, H, D], scores [B, N, H, Lq, Lk]."""
    s = scale * np.einsum("bnihd,bnjhd->bnhij", q, k)
    for bias in (mask_bias, pair_bias):
        if bias is not None:
            s = s + bias
    if mask is not None:
        s = np.where(mask[:, :, None, None, :], s, -np.inf)
    row_max = s.max(axis=-1, keepdims=True)
    row_max = np.where(np.isfinite(row_max), row_max, 0.0)
    e = np.exp(s - row_max)
    total = e.sum(axis=-1, keepdims=True)
    with np.errstate(divide="ignore"):
        lse = (np.log(total) + row_max)[..., 0]  # -inf for a fully masked row
    p = e / np.where(total > 0, total, 1.0)
    out = {"o": np.einsum("bnhij,bnjhd->bnihd", p, v), "lse": lse}
    if d_o is None:
        return out
    dp = np.einsum("bnihd,bnjhd->bnhij", d_o, v)
    ds = p * (dp - (p * dp).sum(axis=-1, keepdims=True))
    out["dq"] = scale * np.einsum("bnhij,bnjhd->bnihd", ds, k)
    out["dk"] = scale * np.einsum("bnhij,bnihd->bnjhd", ds, q)
    out["dv"] = np.einsum("bnhij,bnihd->bnjhd", p, d_o)
    if mask_bias is not None:
        out["dmask_bias"] = sum_to_shape(ds, mask_bias.shape)
    if pair_bias is not None:
        out["dpair_bias"] = sum_to_shape(ds, pair_bias.shape)
    return out


def relative_error(out, ref):
    """||out - ref|| / ||ref|| over finite entries; non-finite entries must match exactly."""
    if out.shape != ref.shape:
        return float("inf")
    finite = np.isfinite(ref)
    if np.any(out[~finite] != ref[~finite]) or not np.all(np.isfinite(out[finite])):
        return float("inf")
    den = np.linalg.norm(ref[finite])
    num = np.linalg.norm(out[finite] - ref[finite])
    return 0.0 if num == 0 else num / den if den > 0 else float("inf")


def make_case(rng, B, N, Lq, Lk, H, D, file_dtype, mask_bias=None, pair_bias=None,
              mask=False, d_o=False, masked_row=False):
    """Random inputs as they are written to disk (already in the file dtype)."""
    def uniform(shape, lo=-1.0, hi=1.0):
        return rng.uniform(lo, hi, size=shape).astype(file_dtype)
    files = {"q": uniform((B, N, Lq, H, D)), "k": uniform((B, N, Lk, H, D)),
             "v": uniform((B, N, Lk, H, D))}
    if mask_bias is not None:
        files["mask_bias"] = uniform(mask_bias, -3.0, 0.0)
    if pair_bias is not None:
        files["pair_bias"] = np.asfortranarray(uniform(pair_bias, -2.0, 2.0))
    if mask:
        keep = rng.uniform(size=(B, N, Lk)) < 0.8
        if masked_row:
            keep[0, 0, :] = False  # docs/CONTRACT.md: LSE -inf, O 0, no NaN anywhere
        files["mask"] = keep
    if d_o:
        files["do"] = uniform((B, N, Lq, H, D))
    return files


def run_case(binary, name, files, compute, flags=(), scale=None):
    """Writes `files`, runs the CLI, compares each output; returns the failures."""
    with tempfile.TemporaryDirectory() as tmp:
        in_dir, out_dir = os.path.join(tmp, "in"), os.path.join(tmp, "out")
        os.mkdir(in_dir)
        for stem, array in files.items():
            np.save(os.path.join(in_dir, stem + ".npy"), array)
        cmd = [binary, "run", in_dir, "--out", out_dir, *flags]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            return [f"{name}: exit code {proc.returncode}: {proc.stderr.strip()}"]
        # The CLI computes on the inputs rounded to the compute dtype; so does the reference.
        as64 = {stem: (a.astype(np.float64) if a.dtype != bool else a) for stem, a in files.items()}
        if compute == "fp32":
            as64 = {s: (a.astype(np.float32).astype(np.float64) if a.dtype != bool else a)
                    for s, a in as64.items()}
        D = files["q"].shape[-1]
        ref = attention(as64["q"], as64["k"], as64["v"], as64.get("mask_bias"),
                        as64.get("pair_bias"), as64.get("mask"), as64.get("do"),
                        scale if scale is not None else 1.0 / np.sqrt(D))
        expected_files = sorted(stem + ".npy" for stem in ref)
        failures = []
        if sorted(os.listdir(out_dir)) != expected_files:
            failures.append(f"{name}: wrote {sorted(os.listdir(out_dir))}, expected {expected_files}")
        report = []
        for stem, want in ref.items():
            path = os.path.join(out_dir, stem + ".npy")
            if not os.path.exists(path):
                continue
            got = np.load(path)
            if got.dtype != np.float32:
                failures.append(f"{name}: {stem}.npy is {got.dtype}, expected float32")
            error = relative_error(got.astype(np.float64), want)
            report.append(f"{stem} {error:.2e}")
            if not error <= BOUNDS[compute]:
                failures.append(f"{name}: {stem} relative error {error:.3e} > {BOUNDS[compute]:.0e}")
        print(f"{name} ({compute}): {', '.join(report)}")
        return failures


def check_bad_input(binary):
    """A missing q.npy: exit code 2, a message, nothing written."""
    with tempfile.TemporaryDirectory() as tmp:
        out_dir = os.path.join(tmp, "out")
        proc = subprocess.run([binary, "run", tmp, "--out", out_dir], capture_output=True, text=True)
        if proc.returncode != 2 or "q.npy" not in proc.stderr or os.path.exists(out_dir):
            return [f"missing q.npy: exit {proc.returncode}, stderr {proc.stderr!r}"]
    return []


def main():
    if len(sys.argv) != 2:
        print("usage: check_cli_numpy.py PATH_TO_EVOATTN", file=sys.stderr)
        return 2
    binary = sys.argv[1]
    rng = np.random.default_rng(20261122)
    failures = check_bad_input(binary)

    files = make_case(rng, 1, 2, 17, 33, 2, 24, np.float32, mask_bias=(1, 2, 1, 1, 33),
                      pair_bias=(1, 1, 2, 17, 33), mask=True, d_o=True, masked_row=True)
    failures += run_case(binary, "fp32 both biases, mask, fully masked row", files, "fp32")

    files = make_case(rng, 2, 3, 33, 17, 1, 8, np.float16, mask=True, d_o=True)
    failures += run_case(binary, "fp16 files, boolean mask", files, "fp16")

    files = make_case(rng, 1, 2, 17, 17, 3, 24, np.float32, mask_bias=(1, 2, 1, 1, 17),
                      pair_bias=(1, 1, 3, 17, 17), d_o=True)
    files = {stem: round_to_bf16(a) for stem, a in files.items()}  # exact in bfloat16
    failures += run_case(binary, "bf16 both biases", files, "bf16", flags=("--dtype", "bf16"))

    files = make_case(rng, 2, 1, 1, 5, 2, 8, np.float64, pair_bias=(2, 1, 2, 1, 5))
    failures += run_case(binary, "float64 files, Lq 1, scale 0.5, forward only", files, "fp32",
                         flags=("--scale", "0.5"), scale=0.5)

    for failure in failures:
        print("FAIL:", failure)
    print(f"{'FAILED' if failures else 'PASSED'}: check_cli_numpy")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
