"""evoattn.jax against the float64 reference: forward, jit, grad (q, k, v and both biases),
vmap (folded and looped), layouts, masks and errors. Runs on JAX's CPU backend here; on a GPU
machine with jax[cuda] the same tests also run on the GPU. Skips cleanly when jax or evoattn
(or its XLA FFI handlers) is missing."""

import os

import numpy as np
import pytest

# On a GPU machine JAX would otherwise take 75% of the GPU at its first use, starving the
# PyTorch tests that run in the same pytest process.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
jax = pytest.importorskip("jax")
pytest.importorskip("evoattn", reason="evoattn is not installed (pip install .)")
try:
    import evoattn.jax as ej
except ImportError as e:  # built without jaxlib's FFI headers
    pytest.skip(f"evoattn.jax unavailable: {e}", allow_module_level=True)

import jax.numpy as jnp  # noqa: E402

import evo_reference as ref  # noqa: E402

DTYPES = {"float32": jnp.float32, "float16": jnp.float16, "bfloat16": jnp.bfloat16}

_PLATFORMS = ["cpu"]
try:
    if jax.devices("gpu"):
        _PLATFORMS.append("gpu")
except RuntimeError:
    pass
PLATFORMS = ["cpu", pytest.param("gpu", marks=pytest.mark.skipif(
    "gpu" not in _PLATFORMS, reason="JAX sees no GPU"))]


def np64(x):
    return None if x is None else np.asarray(jnp.asarray(x, jnp.float32), dtype=np.float64)


def arrays(rng, shapes, dtype, platform="cpu"):
    device = jax.devices(platform)[0]
    return [jax.device_put(jnp.asarray(rng.standard_normal(s), dtype), device) for s in shapes]


def evo_shapes(B, N, Lq, Lk, H, D):
    return [(B, N, Lq, H, D), (B, N, Lk, H, D), (B, N, Lk, H, D), (B, N, 1, 1, Lk),
            (B, 1, H, Lq, Lk)]


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("shape", [(1, 2, 1, 1, 2, 8), (2, 3, 17, 17, 2, 24),
                                   (1, 2, 33, 17, 3, 8)],
                         ids=lambda s: "B{}N{}Lq{}Lk{}H{}D{}".format(*s))
def test_forward_and_grads(shape, dtype, platform):
    rng = np.random.default_rng(0)
    q, k, v, mb, pb = arrays(rng, evo_shapes(*shape), DTYPES[dtype], platform)
    d_o = arrays(rng, [q.shape], DTYPES[dtype], platform)[0]
    tol = ref.TOLERANCE[dtype]

    o = jax.jit(ej.evoformer_attention)(q, k, v, mb, pb)
    assert o.dtype == q.dtype and o.shape == q.shape
    o_ref, _ = ref.forward(*map(np64, (q, k, v, mb, pb)))
    assert ref.rel_err(np64(o), o_ref) <= tol

    def loss(q, k, v, mb, pb):
        return jnp.sum(ej.evoformer_attention(q, k, v, mb, pb).astype(jnp.float32)
                       * d_o.astype(jnp.float32))

    grads = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3, 4)))(q, k, v, mb, pb)
    want = ref.backward(*map(np64, (d_o, q, k, v, mb, pb)))
    for name, g, w, x in zip(("dq", "dk", "dv", "d_mask_bias", "d_pair_bias"), grads, want,
                             (q, k, v, mb, pb)):
        assert g.dtype == x.dtype and g.shape == x.shape, name
        err = ref.rel_err(np64(g), w)
        assert err <= tol, f"{name}: relative error {err:.3g} > {tol}"


def test_layout_bnhld_mask_scale_and_partial_grads():
    rng = np.random.default_rng(1)
    B, N, L, H, D = 1, 3, 17, 2, 8
    qh, kh, vh = arrays(rng, [(B, N, H, L, D)] * 3, jnp.float32)
    pb = arrays(rng, [(L, L)], jnp.float32)[0]  # 2-D, padded to [1, 1, 1, L, L]
    mask = jnp.asarray(rng.random((B, N, L)) > 0.3).at[0, 1].set(False)  # row n=1 all masked
    o = ej.evoformer_attention(qh, kh, vh, pair_bias=pb, mask=mask, scale=0.4, layout="BNHLD")
    to_bnlhd = lambda x: np.swapaxes(np64(x), 2, 3)  # noqa: E731
    o_ref, _ = ref.forward(to_bnlhd(qh), to_bnlhd(kh), to_bnlhd(vh), pair_bias=np64(pb),
                           mask=np.asarray(mask), scale=0.4)
    assert ref.rel_err(to_bnlhd(o), o_ref) <= 1e-5
    assert np.all(np.asarray(o)[0, 1] == 0)

    def loss(q, pb):  # only q and the pair bias are differentiated
        out = ej.evoformer_attention(q, kh, vh, pair_bias=pb, mask=mask, scale=0.4,
                                     layout="BNHLD")
        return jnp.sum(out ** 2)

    dq, dpb = jax.jit(jax.grad(loss, argnums=(0, 1)))(qh, pb)
    want = ref.backward(2 * o_ref, to_bnlhd(qh), to_bnlhd(kh), to_bnlhd(vh),
                        pair_bias=np64(pb), mask=np.asarray(mask), scale=0.4)
    assert ref.rel_err(to_bnlhd(dq), want[0]) <= 1e-5
    assert dpb.shape == pb.shape and ref.rel_err(np64(dpb), want[4]) <= 1e-5


@pytest.mark.parametrize("B", [1, 2], ids=["B1-folded", "B2"])
def test_vmap_forward_and_grad(B):
    """vmap over a leading dim: with B = 1 or every operand batched the handler folds the vmapped
    dim into B; with B = 2 and unbatched k, v it loops. Both must equal per-example calls."""
    rng = np.random.default_rng(2)
    V, N, L, H, D = 3, 2, 17, 2, 8
    qs, = arrays(rng, [(V, B, N, L, H, D)], jnp.float32)
    k, v, mb, pb = arrays(rng, evo_shapes(B, N, L, L, H, D)[1:], jnp.float32)
    pbs, = arrays(rng, [(V,) + pb.shape], jnp.float32)

    per_example = jnp.stack([ej.evoformer_attention(qs[i], k, v, mb, pbs[i]) for i in range(V)])
    batched = jax.jit(jax.vmap(ej.evoformer_attention, in_axes=(0, None, None, None, 0)))(
        qs, k, v, mb, pbs)
    np.testing.assert_allclose(batched, per_example, rtol=1e-6, atol=1e-6)

    def loss(q, k, v, mb, pb):
        return jnp.sum(ej.evoformer_attention(q, k, v, mb, pb) ** 2)

    grad = jax.grad(loss, argnums=(0, 1, 2, 3, 4))
    vg = jax.jit(jax.vmap(grad, in_axes=(0, None, None, None, 0)))(qs, k, v, mb, pbs)
    for i in range(V):
        gi = grad(qs[i], k, v, mb, pbs[i])
        for a, b in zip(vg, gi):
            np.testing.assert_allclose(a[i], b, rtol=1e-5, atol=1e-6)

    # grad of vmap, and everything batched (all operands carry the vmapped dim)
    allb = [jnp.stack([x] * V) * (1 + 0.1 * jnp.arange(V).reshape((V,) + (1,) * x.ndim))
            for x in (k, v, mb)]
    total = lambda *a: jnp.sum(jax.vmap(loss)(*a))  # noqa: E731
    g_all = jax.jit(jax.grad(total, argnums=(0, 1, 2, 3, 4)))(qs, *allb, pbs)
    for i in range(V):
        gi = grad(qs[i], allb[0][i], allb[1][i], allb[2][i], pbs[i])
        for a, b in zip(g_all, gi):
            np.testing.assert_allclose(a[i], b, rtol=1e-5, atol=1e-6)


def test_nested_vmap():
    rng = np.random.default_rng(3)
    q, = arrays(rng, [(2, 3, 1, 2, 17, 2, 8)], jnp.float32)
    k, v, mb, pb = arrays(rng, evo_shapes(1, 2, 17, 17, 2, 8)[1:], jnp.float32)
    f = lambda q: ej.evoformer_attention(q, k, v, mb, pb)  # noqa: E731
    out = jax.vmap(jax.vmap(f))(q)
    for i in range(2):
        for j in range(3):
            np.testing.assert_allclose(out[i, j], f(q[i, j]), rtol=1e-6, atol=1e-6)


def test_errors_at_trace_time():
    q = jnp.ones((1, 2, 17, 2, 8), jnp.float32)
    with pytest.raises(ValueError, match="argument 'k'"):
        ej.evoformer_attention(q, jnp.ones((1, 2, 17, 3, 8)), q)
    with pytest.raises(ValueError, match="pair_bias"):
        jax.jit(ej.evoformer_attention)(q, q, q, None, jnp.ones((1, 1, 2, 17, 5)))
    with pytest.raises(TypeError, match="int32"):
        ej.evoformer_attention(q.astype(jnp.int32), q, q)
    with pytest.raises(TypeError, match="mask"):
        ej.evoformer_attention(q, q, q, mask=jnp.ones((1, 2, 17)))
    with pytest.raises(ValueError, match="layout"):
        ej.evoformer_attention(q, q, q, layout="LHD")
