"""A float64 numpy model of the Hopper forward's exponentials-first softmax at four consumers (v58,
RowSoftmax::try_exponentiate): one warp's 16 rows over 12 key tiles, the fast path (exponentials
against the reference max as it stands, kept where every thread's 16 P of a row sum to at most
2^10 and no row is masked so far) and the slow path
(update() with no slack, then the exponentials again), against the exact softmax.
Checks the algorithm, not the CUDA code.  usage: python3 docs/perf/exponentials-first-model.py"""
import numpy as np
NEG=-np.inf
def quad_partials(p):  # p: rows x 64 keys -> rows x 4 thread partials (keys 8j+2t, +1)
    return np.stack([p[:, [8*j+2*t+e for j in range(8) for e in (0,1)]].sum(-1) for t in range(4)], -1)
def run(x, v, slack=8.0, limit=1024.0, fp16=False):
    rows, L = x.shape; T = L // 64
    rmax = np.full(rows, NEG); rsum = np.zeros(rows); o = np.zeros((rows, v.shape[1])); slow = 0
    def update(tile, slk, first):
        nonlocal rmax, rsum, o
        tmax = tile.max(-1)
        if first:
            rmax = tmax.copy(); return
        with np.errstate(invalid='ignore'):
            rise = tmax - rmax
        if np.any(rise > slk):
            m_new = np.where(rise > slk, tmax, rmax)
            m_ref = np.where(m_new == NEG, 0.0, m_new)
            with np.errstate(invalid='ignore', over='ignore'):
                alpha = np.exp2(rmax - m_ref)
            rmax = m_new; rsum = rsum * alpha; o = o * alpha[:, None]
    def expo(tile):
        m_use = np.where(rmax == NEG, 0.0, rmax)
        with np.errstate(over='ignore', invalid='ignore'):
            return np.exp2(tile - m_use[:, None])
    for t in range(T):
        tile = x[:, 64*t:64*t+64]; vt = v[64*t:64*t+64]
        if t == 0:
            update(tile, slack, True); p = expo(tile)
        else:
            p = expo(tile)
            with np.errstate(invalid='ignore'):
                fits = np.all(quad_partials(p) <= limit) and np.all(rmax != NEG)
            if not fits:
                slow += 1; update(tile, 0.0, False); p = expo(tile)
        if fp16: assert np.all((p < 65504) | np.isnan(p)), "fp16 overflow"
        rsum = rsum + p.sum(-1); o = o + p @ vt
    with np.errstate(invalid='ignore', divide='ignore'):
        out = np.where(rsum[:, None] == 0, 0.0, o / rsum[:, None])
        lse = np.where(rsum == 0, NEG, np.where(rmax == NEG, 0.0, rmax) + np.log2(rsum))
    return out, lse, slow
def exact(x, v):
    m = x.max(-1, keepdims=True); m = np.where(np.isfinite(m), m, 0)
    p = np.exp2(x - m); s = p.sum(-1, keepdims=True)
    with np.errstate(invalid='ignore', divide='ignore'):
        return np.where(s == 0, 0, (p @ v) / s), np.where(s[:, 0] == 0, NEG, m[:, 0] + np.log2(s[:, 0]))
rng = np.random.default_rng(1)
cases = {}
L = 768
base = lambda s: rng.normal(0, s, (16, L))
cases['sigma2'] = base(2); cases['sigma8'] = base(8); cases['sigma30'] = base(30)
x = base(2); x[:, :64] = NEG; cases['first tile masked'] = x
x = base(2); x[3] = NEG; cases['one row fully masked'] = x
x = base(2); x[:, :64] -= 1e6; cases['first tile -1e6'] = x
x = base(2); x[:, 700:] += 200; cases['late rise 200'] = x
x = base(2); x[5, 300] = 9.5; cases['single rise 9.5'] = x
x = base(2) - 150; cases['all near -150'] = x
x = base(1); x[:, ::2] = NEG; cases['half keys masked'] = x
for name, x in cases.items():
    v = rng.uniform(-1, 1, (L, 8))
    o, lse, slow = run(x, v, fp16=True); oe, lsee = exact(x, v)
    err = np.nanmax(np.abs(o - oe)); lerr = np.nanmax(np.abs(np.where(np.isfinite(lsee), lse - lsee, 0)))
    same_inf = np.array_equal(np.isinf(lse), np.isinf(lsee))
    print(f"{name:24s} max|dO| {err:.2e} max|dLSE| {lerr:.2e} inf pattern same {same_inf} slow tiles {slow}/11")
