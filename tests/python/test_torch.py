"""evoattn.torch against the float64 reference: every output and gradient, layouts, strides,
broadcasts, masks, DeepSpeed's entry point, errors, opcheck, torch.compile, gradcheck, and
(on a GPU) CUDA graphs. Skips cleanly when torch or evoattn is not installed."""

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
evoattn = pytest.importorskip("evoattn", reason="evoattn is not installed (pip install .)")
et = pytest.importorskip("evoattn.torch")

import evo_reference as ref  # noqa: E402

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}

_CUDA_REASON = "no CUDA device (or evoattn built without its CUDA backend)"
HAS_CUDA = torch.cuda.is_available() and evoattn.cuda_available()
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not HAS_CUDA, reason=_CUDA_REASON))]


def np64(t):
    return None if t is None else t.detach().to(torch.float64).cpu().numpy()


def randn(shape, dtype, device, requires_grad=False, scale=1.0):
    t = (torch.randn(shape, dtype=torch.float32) * scale).to(device=device, dtype=dtype)
    return t.requires_grad_(requires_grad)


def check_forward_backward(q, k, v, mask_bias=None, pair_bias=None, mask=None, scale=None,
                           tol=None):
    """Runs forward + backward through evoattn.torch and compares everything with float64."""
    tol = tol or ref.TOLERANCE[str(q.dtype).replace("torch.", "")]
    o, lse = et.evoformer_attention(q, k, v, mask_bias, pair_bias, mask, scale, return_lse=True)
    assert o.dtype == q.dtype and o.shape == q.shape and lse.dtype == torch.float32
    o_ref, lse_ref = ref.forward(np64(q), np64(k), np64(v), np64(mask_bias), np64(pair_bias),
                                 np64(mask), scale)
    assert ref.rel_err(np64(o), o_ref) <= tol
    assert ref.rel_err(np64(lse), lse_ref) <= tol
    d_o = torch.randn_like(o)
    leaves = [t for t in (q, k, v, mask_bias, pair_bias) if t is not None and t.requires_grad]
    grads = torch.autograd.grad(o, leaves, d_o)
    want = ref.backward(np64(d_o), np64(q), np64(k), np64(v), np64(mask_bias), np64(pair_bias),
                        np64(mask), scale)
    names = ("dq", "dk", "dv", "d_mask_bias", "d_pair_bias")
    expected = {id(t): (n, w) for t, n, w in zip((q, k, v, mask_bias, pair_bias), names, want)
                if t is not None}
    for leaf, g in zip(leaves, grads):
        name, w = expected[id(leaf)]
        assert g.dtype == leaf.dtype and g.shape == leaf.shape, name
        err = ref.rel_err(np64(g), w)
        assert err <= tol, f"{name}: relative error {err:.3g} > {tol}"
    return o


# (B, N, Lq, Lk, H, D): odd lengths and head dims on purpose.
SHAPES = [(1, 2, 1, 1, 2, 8), (2, 3, 17, 17, 2, 24), (1, 2, 33, 33, 3, 8), (1, 2, 17, 33, 2, 16)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "B{}N{}Lq{}Lk{}H{}D{}".format(*s))
def test_numerics_both_biases(shape, dtype, device):
    B, N, Lq, Lk, H, D = shape
    dt = DTYPES[dtype]
    q = randn((B, N, Lq, H, D), dt, device, True)
    k = randn((B, N, Lk, H, D), dt, device, True)
    v = randn((B, N, Lk, H, D), dt, device, True)
    mb = randn((B, N, 1, 1, Lk), dt, device, True)
    pb = randn((B, 1, H, Lq, Lk), dt, device, True)
    check_forward_backward(q, k, v, mb, pb)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_no_bias_and_float32_bias_with_low_precision_inputs(dtype, device):
    dt = DTYPES[dtype]
    q, k, v = (randn((1, 3, 17, 2, 24), dt, device, True) for _ in range(3))
    check_forward_backward(q, k, v)
    pb = randn((1, 1, 2, 17, 17), torch.float32, device, True)  # float32 bias, grad in float32
    check_forward_backward(q, k, v, pair_bias=pb)


@pytest.mark.parametrize("device", DEVICES)
def test_layout_bnhld_is_a_view_of_the_same_call(device):
    B, N, L, H, D = 1, 2, 17, 3, 8
    qh, kh, vh = (randn((B, N, H, L, D), torch.float32, device, True) for _ in range(3))
    pb = randn((B, 1, H, L, L), torch.float32, device, True)
    o = et.evoformer_attention(qh, kh, vh, pair_bias=pb, layout="BNHLD")
    assert o.shape == (B, N, H, L, D) and o.is_contiguous()
    q, k, v = (t.detach().transpose(2, 3).contiguous().requires_grad_() for t in (qh, kh, vh))
    o2 = et.evoformer_attention(q, k, v, pair_bias=pb)
    torch.testing.assert_close(o, o2.transpose(2, 3), rtol=1e-6, atol=1e-6)
    check_forward_backward(qh.transpose(2, 3), kh.transpose(2, 3), vh.transpose(2, 3), pair_bias=pb)


@pytest.mark.parametrize("device", DEVICES)
def test_any_strides_without_copies(device):
    B, N, L, H, D = 2, 2, 17, 2, 8
    qkv = randn((B, N, L, H, 3, D), torch.float32, device, True)  # packed projections
    q, k, v = qkv[..., 0, :], qkv[..., 1, :], qkv[..., 2, :]
    assert not q.is_contiguous()
    big = randn((B, N, 2, 1, L + 5), torch.float32, device)
    mb = big[:, :, :1, :, 3:3 + L].detach().requires_grad_()  # sliced view as the mask bias
    mb_view = big[:, :, :1, :, 3:3 + L]
    assert not mb_view.is_contiguous()
    check_forward_backward(q, k, v, mb_view)
    check_forward_backward(q, k, v, mb)


@pytest.mark.parametrize("device", DEVICES)
def test_general_broadcasts(device):
    B, N, L, H, D = 2, 3, 17, 2, 8
    q, k, v = (randn((B, N, L, H, D), torch.float32, device, True) for _ in range(3))
    pair_2d = randn((L, L), torch.float32, device, True)  # padded to [1, 1, 1, L, L]
    per_head = randn((1, 1, H, 1, L), torch.float32, device, True)
    check_forward_backward(q, k, v, per_head, pair_2d)
    base = randn((1, 1, 1, 1, L), torch.float32, device, True)
    expanded = base.expand(B, N, H, L, L)  # stride-0 view: gradient reaches `base`
    o = et.evoformer_attention(q, k, v, mask_bias=expanded)
    o.sum().backward()
    want = ref.backward(np.ones(o.shape), np64(q), np64(k), np64(v), np64(expanded))[3]
    assert ref.rel_err(np64(base.grad), want.sum(axis=(0, 1, 2, 3), keepdims=True)) <= 1e-5


@pytest.mark.parametrize("device", DEVICES)
def test_boolean_mask_and_fully_masked_rows(device):
    B, N, L, H, D = 1, 3, 17, 2, 8
    q, k, v = (randn((B, N, L, H, D), torch.float32, device, True) for _ in range(3))
    mask = torch.rand((B, N, L), device=device) > 0.3
    mask[0, 1, :] = False  # every key of row n = 1 masked out
    pb = randn((B, 1, H, L, L), torch.float32, device, True)
    o = check_forward_backward(q, k, v, pair_bias=pb, mask=mask)
    assert torch.all(o[0, 1] == 0)
    _, lse = et.evoformer_attention(q, k, v, pair_bias=pb, mask=mask, return_lse=True)
    assert torch.all(torch.isneginf(lse[0, 1]))
    mask5 = mask[:, :, None, None, :]
    check_forward_backward(q, k, v, mask=mask5.expand(B, N, H, L, L))


@pytest.mark.parametrize("device", DEVICES)
def test_scale(device):
    q, k, v = (randn((1, 2, 17, 2, 24), torch.float32, device, True) for _ in range(3))
    check_forward_backward(q, k, v, scale=0.37)
    check_forward_backward(q, k, v, scale=-1.5)


def test_only_requested_bias_gradients():
    q, k, v = (randn((1, 2, 17, 2, 8), torch.float32, "cpu", True) for _ in range(3))
    mb = randn((1, 2, 1, 1, 17), torch.float32, "cpu", False)
    pb = randn((1, 1, 2, 17, 17), torch.float32, "cpu", True)
    et.evoformer_attention(q, k, v, mb, pb).sum().backward()
    assert mb.grad is None and pb.grad is not None and q.grad is not None


def test_deterministic_bitwise():
    q, k, v = (randn((1, 4, 33, 2, 24), torch.float32, "cpu", True) for _ in range(3))
    pb = randn((1, 1, 2, 33, 33), torch.float32, "cpu", True)
    runs = []
    for _ in range(2):
        o = et.evoformer_attention(q, k, v, pair_bias=pb)
        runs.append([o] + list(torch.autograd.grad(o.square().sum(), (q, k, v, pb))))
    for a, b in zip(*runs):
        assert torch.equal(a, b)


def test_empty_batch():
    q, k, v = (torch.randn(0, 2, 5, 2, 8, requires_grad=True) for _ in range(3))
    o = et.evoformer_attention(q, k, v)
    assert o.shape == q.shape
    o.sum().backward()
    assert q.grad.shape == q.shape


# --- DeepSpeed's entry point ------------------------------------------------------------------


def test_ds4sci_matches_general_form_and_grads():
    B, N, L, H, D = 1, 3, 17, 2, 16
    Q, K, V = (randn((B, N, L, H, D), torch.bfloat16, "cpu", True) for _ in range(3))
    mb = randn((B, N, 1, 1, L), torch.bfloat16, "cpu", True)
    pb = randn((B, 1, H, L, L), torch.bfloat16, "cpu", True)
    biases = [mb, pb]
    o = et.DS4Sci_EvoformerAttention(Q, K, V, biases)
    assert len(biases) == 2
    torch.testing.assert_close(o, et.evoformer_attention(Q, K, V, mb, pb), rtol=0, atol=0)
    o.float().sum().backward()
    assert mb.grad.dtype == torch.bfloat16 and pb.grad.shape == pb.shape
    for bs in ([], [mb], [None, pb]):
        given = list(bs)
        out = et.DS4Sci_EvoformerAttention(Q, K, V, given)
        full = (list(bs) + [None, None])[:2]
        torch.testing.assert_close(out, et.evoformer_attention(Q, K, V, *full), rtol=0, atol=0)
        assert given == list(bs)  # the caller's list is not appended to


def test_ds4sci_leading_dims_and_shape_errors():
    Q, K, V = (torch.randn(3, 17, 2, 8) for _ in range(3))  # [N, L, H, D]
    o = et.DS4Sci_EvoformerAttention(Q, K, V, [])
    want, _ = ref.forward(np64(Q)[None], np64(K)[None], np64(V)[None])
    assert o.shape == Q.shape and ref.rel_err(np64(o), want[0]) <= 1e-5
    Q6 = torch.randn(2, 2, 3, 17, 2, 8)
    assert et.DS4Sci_EvoformerAttention(Q6, Q6, Q6, []).shape == Q6.shape
    Q5 = torch.randn(1, 3, 17, 2, 8)
    with pytest.raises(ValueError, match="bias1 shape"):
        et.DS4Sci_EvoformerAttention(Q5, Q5, Q5, [torch.randn(1, 3, 1, 1, 16)])
    with pytest.raises(ValueError, match="bias2 shape"):
        et.DS4Sci_EvoformerAttention(Q5, Q5, Q5, [None, torch.randn(1, 3, 2, 17, 17)])
    with pytest.raises(ValueError, match="at most 2"):
        et.DS4Sci_EvoformerAttention(Q5, Q5, Q5, [None, None, None])


# --- errors -------------------------------------------------------------------------------------


def test_errors_are_python_exceptions_with_the_c_message():
    q = torch.randn(1, 2, 17, 2, 8)
    with pytest.raises(TypeError, match="float64"):
        et.evoformer_attention(q.double(), q.double(), q.double())
    with pytest.raises(ValueError, match="argument 'k'"):
        et.evoformer_attention(q, torch.randn(1, 2, 17, 3, 8), q)
    with pytest.raises(ValueError, match="pair_bias"):
        et.evoformer_attention(q, q, q, pair_bias=torch.randn(1, 1, 2, 17, 5))
    with pytest.raises(ValueError, match="head dim"):
        big = torch.randn(1, 1, 4, 1, 256)
        et.evoformer_attention(big, big, big)
    with pytest.raises(ValueError, match="layout"):
        et.evoformer_attention(q, q, q, layout="BLNHD")
    with pytest.raises(TypeError, match="mask"):
        et.evoformer_attention(q, q, q, mask=torch.ones(1, 2, 17))
    with pytest.raises(ValueError, match="5 dimensions"):
        et.evoformer_attention(q[0], q[0], q[0])


# --- torch.library: opcheck, compile, gradcheck --------------------------------------------------


def _op_args(requires_grad=True, dtype=torch.float32):
    q, k, v = (randn((1, 2, 17, 2, 8), dtype, "cpu", requires_grad) for _ in range(3))
    mb = randn((1, 2, 1, 1, 17), dtype, "cpu", requires_grad)
    pb = randn((1, 1, 2, 17, 17), dtype, "cpu", requires_grad)
    return q, k, v, mb, pb


def test_opcheck_forward_and_backward():
    q, k, v, mb, pb = _op_args()
    mask = torch.rand(1, 2, 17) > 0.2
    for args in ((q, k, v, mb, pb, None, None, True, False),
                 (q, k, v, None, pb, mask, 0.5, True, False),
                 (q.transpose(2, 3).contiguous().transpose(2, 3), k, v, None, None, None, None,
                  True, False)):
        torch.library.opcheck(torch.ops.evoattn.forward.default, args)
    with torch.no_grad():
        o, lse = torch.ops.evoattn.forward(q, k, v, mb, pb, None, None, True, False)
    d_o = torch.randn_like(o)
    torch.library.opcheck(torch.ops.evoattn.backward.default,
                          (d_o, q.detach(), k.detach(), v.detach(), o, lse, mb.detach(),
                           pb.detach(), None, None, True, False, True, True))


@pytest.mark.parametrize("device", DEVICES)
def test_torch_compile_fullgraph(device):
    q, k, v, mb, pb = (t.detach().to(device).requires_grad_() for t in _op_args())

    def f(q, k, v, mb, pb):
        o = et.evoformer_attention(q, k, v, mask_bias=mb, pair_bias=pb)
        return (o.float() * 1.5).square().sum()

    compiled = torch.compile(f, fullgraph=True)
    got = torch.autograd.grad(compiled(q, k, v, mb, pb), (q, k, v, mb, pb))
    want = torch.autograd.grad(f(q, k, v, mb, pb), (q, k, v, mb, pb))
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_gradcheck_through_float32():
    """gradcheck in float64 on a wrapper that casts to float32 inside: the library takes float16,
    bfloat16 and float32 only (docs/CONTRACT.md), so the finite differences see float32 rounding
    (~1e-7 relative) amplified by 1/eps; eps = 1e-3 and atol = rtol = 2e-3 cover that while
    still catching any wrong or missing gradient term (those are O(1))."""
    B, N, L, H, D = 1, 2, 5, 2, 4
    gen = torch.Generator().manual_seed(0)
    args = [torch.randn(s, dtype=torch.float64, generator=gen, requires_grad=True)
            for s in ((B, N, L, H, D),) * 3 + ((B, N, 1, 1, L), (B, 1, H, L, L))]

    def f(q, k, v, mb, pb):
        return et.evoformer_attention(*(t.float() for t in (q, k, v, mb, pb))).double()

    assert torch.autograd.gradcheck(f, args, eps=1e-3, atol=2e-3, rtol=2e-3)


# --- CUDA only ----------------------------------------------------------------------------------


@pytest.mark.skipif(not HAS_CUDA, reason=_CUDA_REASON)
def test_cuda_graph_capture_forward_and_backward():
    q, k, v = (randn((1, 4, 64, 4, 32), torch.bfloat16, "cuda", True) for _ in range(3))
    mb = randn((1, 4, 1, 1, 64), torch.bfloat16, "cuda", True)
    pb = randn((1, 1, 4, 64, 64), torch.bfloat16, "cuda", True)

    def step():
        for t in (q, k, v, mb, pb):
            t.grad = None
        o = et.evoformer_attention(q, k, v, mb, pb)
        o.float().square().sum().backward()
        return o

    # Warm-up and the eager reference run on the side stream, as torch.cuda.graph's docs ask,
    # and keep no autograd graph alive (detach): a live AccumulateGrad node from a run on the
    # legacy stream would make the captured backward wait on that stream, which capture forbids.
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            step()  # warm up outside the capture
        eager = [step().detach().clone()] + [t.grad.clone() for t in (q, k, v, mb, pb)]
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        o_static = step()
    with torch.no_grad():
        for t in (q, k, v, mb, pb):
            t.mul_(1.0)  # same values; replay recomputes into the captured buffers
    graph.replay()
    torch.cuda.synchronize()
    replayed = [o_static] + [t.grad for t in (q, k, v, mb, pb)]
    for a, b in zip(eager, replayed):
        assert torch.equal(a, b)  # deterministic: bitwise equal


@pytest.mark.skipif(not HAS_CUDA, reason=_CUDA_REASON)
def test_cuda_runs_on_the_current_stream_and_matches_cpu():
    q, k, v = (randn((1, 3, 33, 2, 32), torch.float16, "cpu") for _ in range(3))
    pb = randn((1, 1, 2, 33, 33), torch.float16, "cpu")
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        o = et.evoformer_attention(*(t.cuda() for t in (q, k, v)), pair_bias=pb.cuda())
    s.synchronize()
    want, _ = ref.forward(np64(q), np64(k), np64(v), pair_bias=np64(pb))
    assert ref.rel_err(np64(o), want) <= ref.TOLERANCE["float16"]
    with pytest.raises(ValueError, match="cuda"):
        et.evoformer_attention(q.cuda(), k, v)
