"""Float64 NumPy reference of Evoformer attention, forward and backward, for the pytest suite.

Everything is in DeepSpeed's layout: q [B, N, Lq, H, D], k and v [B, N, Lk, H, D]; biases are
arrays broadcastable to [B, N, H, Lq, Lk]; mask is bool [B, N, Lk] or 5-D broadcastable.
A row whose keys are all masked (-inf) has O = 0, LSE = -inf and contributes no gradient.
"""

import numpy as np

# docs/CONTRACT.md: relative error bound ||out - ref|| / ||ref|| by input dtype name.
TOLERANCE = {"float32": 1e-5, "float16": 1e-3, "bfloat16": 8e-3}


def rel_err(out, ref):
    out = np.asarray(out, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    finite = np.isfinite(ref)
    assert np.array_equal(finite, np.isfinite(out)), "non-finite entries differ"
    denom = np.linalg.norm(ref[finite])
    return float(np.linalg.norm(out[finite] - ref[finite]) / (denom if denom > 0 else 1.0))


def _mask_5d(mask):
    if mask is None:
        return None
    mask = np.asarray(mask, dtype=bool)
    if mask.ndim == 3:  # [B, N, Lk] -> [B, N, 1, 1, Lk]
        mask = mask[:, :, None, None, :]
    return mask


def _scores(q, k, mask_bias, pair_bias, mask, scale):
    D = q.shape[-1]
    scale = 1.0 / np.sqrt(D) if scale is None else scale
    s = scale * np.einsum("bnihd,bnjhd->bnhij", q, k)
    for bias in (mask_bias, pair_bias):
        if bias is not None:
            s = s + np.asarray(bias, dtype=np.float64)
    m = _mask_5d(mask)
    if m is not None:
        s = np.where(m, s, -np.inf)
    return s, scale


def forward(q, k, v, mask_bias=None, pair_bias=None, mask=None, scale=None):
    """O [B, N, Lq, H, D] and LSE [B, N, H, Lq] in float64."""
    q, k, v = (np.asarray(t, dtype=np.float64) for t in (q, k, v))
    s, _ = _scores(q, k, mask_bias, pair_bias, mask, scale)
    smax = s.max(axis=-1, keepdims=True)
    dead = ~np.isfinite(smax)  # every key masked out
    smax = np.where(dead, 0.0, smax)
    e = np.exp(s - smax)
    denom = e.sum(axis=-1, keepdims=True)
    p = np.where(dead, 0.0, e / np.where(dead, 1.0, denom))
    lse = np.where(dead, -np.inf, np.log(np.where(dead, 1.0, denom)) + smax)[..., 0]
    o = np.einsum("bnhij,bnjhd->bnihd", p, v)
    return o, lse


def _sum_to(x, shape):
    """Sums x over the dimensions where `shape` broadcasts (size 1 or missing)."""
    shape = tuple(shape)
    lead = x.ndim - len(shape)
    x = x.sum(axis=tuple(range(lead))) if lead else x
    axes = tuple(i for i, s in enumerate(shape) if s == 1 and x.shape[i] != 1)
    return x.sum(axis=axes, keepdims=True) if axes else x


def backward(d_o, q, k, v, mask_bias=None, pair_bias=None, mask=None, scale=None):
    """dQ, dK, dV, d(mask_bias), d(pair_bias) (None for an absent bias), float64."""
    q, k, v, d_o = (np.asarray(t, dtype=np.float64) for t in (q, k, v, d_o))
    s, scale = _scores(q, k, mask_bias, pair_bias, mask, scale)
    o, lse = forward(q, k, v, mask_bias, pair_bias, mask, scale)
    lse_safe = np.where(np.isfinite(lse), lse, 0.0)[..., None]
    p = np.where(np.isfinite(lse)[..., None], np.exp(s - lse_safe), 0.0)
    dp = np.einsum("bnihd,bnjhd->bnhij", d_o, v)
    delta = np.einsum("bnihd,bnihd->bnhi", d_o, o)[..., None]
    ds = p * (dp - delta)
    dq = scale * np.einsum("bnhij,bnjhd->bnihd", ds, k)
    dk = scale * np.einsum("bnhij,bnihd->bnjhd", ds, q)
    dv = np.einsum("bnhij,bnihd->bnjhd", p, d_o)
    grads = [None if b is None else _sum_to(ds, np.shape(b)) for b in (mask_bias, pair_bias)]
    return dq, dk, dv, grads[0], grads[1]
