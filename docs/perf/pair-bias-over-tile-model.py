"""Float model of perf log v80 (bwd_pair_bias_kernel.cuh's TileSums): a warp's 16 rows x 64 keys of one
tile summed over n in units of 2^(T - ref), against the kernel's form before it and a float64
reference. Float32 where the kernel rounds (every product, sum and exponent); 2^x below 2^-126
flushed to zero as ex2.approx.ftz does. Row statistics as backend.h defines them (log2 units):
row_max = LSE, row_log_sum = 0; or, where |LSE| >= 64 (natural units), the row's max score and
the log-sum. Prints the largest error of each form relative to the largest |d(pair bias)| (where float32
scores near -1e9 are what rounds, both forms share the error), the largest gap between the two
forms on the same scale, and which forms the warp took (tile: over 2^(T - ref) or not; units:
F factored, G general)."""
import numpy as np

f32 = np.float32
LOG2E = f32(1.4426950408889634)


def ex2(x):
    x = np.asarray(x, dtype=np.float32)
    with np.errstate(over='ignore', invalid='ignore'):
        y = np.exp2(x.astype(np.float64)).astype(np.float32)
    return np.where(x < -126, f32(0), y)


def case(rng, N, rows=16, keys=64, lk=64, D=32, pair=lambda r, k: r.normal(0, 2, (16, 64)), key_mask=None,
         q_logit=1.0):
    scale = 1 / np.sqrt(D)
    q = rng.uniform(-q_logit, q_logit, (N, rows, D))
    k = rng.uniform(-1, 1, (N, keys, D))
    v = rng.uniform(-1, 1, (N, keys, D))
    do = rng.uniform(-1, 1, (N, rows, D))
    T = pair(rng, None).astype(np.float32).astype(np.float64)  # the 16-bit pair bias, exact in float32
    kb = np.zeros((N, keys))
    if key_mask is not None:
        key_mask(kb)
    kb[:, lk:] = -np.inf
    # float64 reference
    s = np.einsum('nqd,nkd->nqk', q, k)
    x = s * scale + kb[:, None, :] + T[None]
    xmax = x.max(-1, keepdims=True)
    pr = np.exp(x - xmax)
    lse = (np.log(pr.sum(-1, keepdims=True)) + xmax)[..., 0]
    P = np.exp(x - lse[..., None])
    o = np.einsum('nqk,nkd->nqd', P, v)
    dp = np.einsum('nqd,nkd->nqk', do, v)
    delta = (do * o).sum(-1)
    ref_grad = (P * (dp - delta[..., None])).sum(0)
    # the kernel's inputs, float32 (S and dP as the wgmma leaves them, the statistics as stored)
    s32 = s.astype(f32)
    dp32 = dp.astype(f32)
    sl2 = f32(scale * np.log2(np.e))
    kb2 = (kb * LOG2E).astype(f32)
    T32 = T.astype(f32)
    recomputed = np.abs(lse) >= 64
    xk = (s32 * sl2 + kb2[:, None, :]).astype(f32)               # x' = fma(S, scale log2 e, key)
    xf = (T32[None] * LOG2E + xk.astype(np.float64)).astype(f32)  # x = fma(T, log2 e, x')
    xf_valid = np.where(np.arange(keys)[None, None, :] < lk, xf, -np.inf)
    rmax = np.where(recomputed, xf_valid.max(-1), (lse * np.log2(np.e))).astype(f32)
    with np.errstate(divide='ignore'):
        lsum = np.where(recomputed, np.log2(ex2(xf_valid - rmax[..., None]).astype(np.float64).sum(-1)), 0).astype(f32)
    delta32 = delta.astype(f32)

    def run(over_tile_allowed):
        ref = np.zeros(rows, dtype=f32)
        over = False
        if over_tile_allowed:
            tv = T32[:, :lk]
            hi, lo = tv.max(-1), tv.min(-1)
            spread = ((hi - lo) * LOG2E).astype(f32)
            if lk > 0 and np.all((spread >= 0) & (spread <= 32)):
                over = True
                ref = (hi * LOG2E).astype(f32)
        acc = np.zeros((rows, keys), dtype=f32)
        forms = []
        for n in range(N):
            m, ls, dl = rmax[n], lsum[n], delta32[n]
            e = (ref - m).astype(f32)
            general = np.any((ls != 0) | ~((e >= -64) & (e <= 32)))
            forms.append('G' if general else 'F')
            with np.errstate(over='ignore', invalid='ignore'):
                if not general:
                    c = ex2(e)
                    d = (-dl * c).astype(f32)
                    cdp = (dp32[n] * c[:, None] + d[:, None]).astype(f32)
                    term = (ex2(xk[n] if over else xf[n]) * cdp).astype(f32)
                else:
                    p = ex2(((xf[n] - m[:, None]).astype(f32) - ls[:, None]).astype(f32))
                    if over:
                        p = (p * ex2((ref[:, None] - T32 * LOG2E).astype(f32))).astype(f32)
                    term = (p * (dp32[n] - dl[:, None]).astype(f32)).astype(f32)
                acc = (acc + term).astype(f32)
        if over:
            with np.errstate(over='ignore', invalid='ignore'):
                acc = (acc * ex2((T32 * LOG2E - ref[:, None]).astype(f32))).astype(f32)
        return acc, over, ''.join(forms)

    out = {}
    r = ref_grad[:, :lk]
    for allowed in (False, True):
        acc, over, forms = run(allowed)
        a = acc[:, :lk].astype(np.float64)
        err = np.max(np.abs(a - r)) / np.abs(r).max() if np.all(np.isfinite(a)) else np.inf
        out['over-tile' if allowed else 'before'] = (err, over, forms, a)
    gap = np.max(np.abs(out['over-tile'][3] - out['before'][3])) / np.abs(r).max()
    return out, gap


def main():
    rng = np.random.default_rng(7)
    cases = {
        'random pair bias N(0, 2), 64 n': dict(N=64),
        'pair bias N(0, 6) (spread near 32 log2)': dict(N=32, pair=lambda r, _: r.normal(0, 6, (16, 64)).clip(-11, 11)),
        'wide pair bias (spread > 32: before-form)': dict(N=16, pair=lambda r, _: r.normal(0, 10, (16, 64))),
        'rows +120 (extreme rows)': dict(N=16, pair=lambda r, _: r.normal(0, 1, (16, 64)) + 120 * (np.arange(16) < 8)[:, None]),
        'rows +50 (m > 64: F only over the tile)': dict(N=16, pair=lambda r, _: r.normal(0, 1, (16, 64)) + 50),
        'n = 1 masked by -1e9': dict(N=8, key_mask=lambda kb: kb.__setitem__(1, -1e9)),
        'half the keys masked -1e9 in n 0': dict(N=8, key_mask=lambda kb: kb.__setitem__((0, slice(0, 32)), -1e9)),
        'keys past Lk (lk = 40)': dict(N=16, lk=40, pair=lambda r, _: r.normal(0, 1, (16, 64)) + 80),
        'large logits (one-hot P)': dict(N=16, q_logit=40.0),
        'pair bias -1e9 in one row': dict(N=8, pair=lambda r, _: np.where(np.arange(16)[:, None] == 3, -1e9, r.normal(0, 1, (16, 64)))),
    }
    for name, kw in cases.items():
        res, gap = case(rng, **kw)
        b, o = res['before'], res['over-tile']
        print(f'{name:44s} before {b[0]:.1e}  over-tile {o[0]:.1e}  gap {gap:.1e}  (over tile: {o[1]!s:5}, units {o[2][:16]})')


if __name__ == '__main__':
    main()
