"""evoattn.torch and evoattn.jax give the same answers where the contract leaves no choice:
empty dimensions (no rows, or no keys), the LSE, and errors that name the user's call."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
jax = pytest.importorskip("jax")
pytest.importorskip("evoattn", reason="evoattn is not installed (pip install .)")
et = pytest.importorskip("evoattn.torch")
ej = pytest.importorskip("evoattn.jax")

import jax.numpy as jnp  # noqa: E402

import evo_reference as ref  # noqa: E402

CPU = jax.devices("cpu")[0]

# (B, N, Lq, Lk, H, D), each with one size of 0
EMPTY = [(0, 2, 5, 5, 2, 8), (1, 0, 5, 5, 2, 8), (1, 2, 0, 5, 2, 8), (1, 2, 5, 0, 2, 8),
         (1, 2, 5, 5, 0, 8), (0, 0, 0, 0, 0, 8)]


def shapes(B, N, Lq, Lk, H, D):
    return [(B, N, Lq, H, D), (B, N, Lk, H, D), (B, N, Lk, H, D), (B, N, 1, 1, Lk),
            (B, 1, H, Lq, Lk)]


@pytest.mark.parametrize("shape", EMPTY, ids=lambda s: "B{}N{}Lq{}Lk{}H{}D{}".format(*s))
def test_empty_dimensions_agree(shape):
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(s).astype(np.float32) for s in shapes(*shape)]

    tensors = [torch.tensor(a, requires_grad=True) for a in arrays]
    o_t, lse_t = et.evoformer_attention(*tensors, return_lse=True)
    grads_t = torch.autograd.grad(o_t.sum(), tensors, allow_unused=True)

    xs = [jax.device_put(jnp.asarray(a), CPU) for a in arrays]
    o_j, lse_j = ej.evoformer_attention(*xs, return_lse=True)
    grads_j = jax.grad(lambda *a: ej.evoformer_attention(*a).sum(), argnums=(0, 1, 2, 3, 4))(*xs)

    Lk = shape[3]
    np.testing.assert_array_equal(o_t.detach().numpy(), np.asarray(o_j))
    np.testing.assert_array_equal(lse_t.numpy(), np.asarray(lse_j))
    assert o_t.shape == arrays[0].shape and not np.any(o_t.detach().numpy())
    if Lk == 0:  # every row has no keys: fully masked
        assert np.all(np.isneginf(lse_t.numpy()))
    for g_t, g_j, a in zip(grads_t, grads_j, arrays):
        assert g_t is not None and g_t.shape == a.shape and g_j.shape == a.shape
        assert not np.any(g_t.numpy()) and not np.any(np.asarray(g_j))


def test_empty_problems_are_still_validated():
    q = np.zeros((1, 2, 0, 2, 8), np.float32)
    k = np.zeros((1, 2, 5, 3, 8), np.float32)  # H = 3 against q's 2
    with pytest.raises(ValueError, match="^evoattn.torch.evoformer_attention: argument 'k'"):
        et.evoformer_attention(torch.tensor(q), torch.tensor(k), torch.tensor(k))
    with pytest.raises(ValueError, match="^evoattn.jax.evoformer_attention: argument 'k'"):
        ej.evoformer_attention(jnp.asarray(q), jnp.asarray(k), jnp.asarray(k))


def test_return_lse_agrees_with_the_reference():
    rng = np.random.default_rng(1)
    arrays = [rng.standard_normal(s).astype(np.float32) for s in shapes(1, 2, 17, 9, 2, 8)]
    _, lse_ref = ref.forward(*(a.astype(np.float64) for a in arrays))
    _, lse_t = et.evoformer_attention(*map(torch.tensor, arrays), return_lse=True)
    _, lse_j = ej.evoformer_attention(*(jax.device_put(jnp.asarray(a), CPU) for a in arrays),
                                      return_lse=True)
    assert lse_t.shape == lse_j.shape == lse_ref.shape == (1, 2, 2, 17)
    assert ref.rel_err(lse_t.numpy(), lse_ref) <= 1e-5
    assert ref.rel_err(np.asarray(lse_j), lse_ref) <= 1e-5


@pytest.mark.parametrize("case", ["dtype of k", "shape of k", "pair_bias", "head dim", "scale"])
def test_errors_name_the_users_call(case):
    q = np.ones((1, 2, 17, 2, 8), np.float32)
    args = {"q": q, "k": q, "v": q, "pair_bias": None, "scale": None}
    want = {"dtype of k": (TypeError, "argument 'k': expected dtype float32"),
            "shape of k": (ValueError, "argument 'k': expected sizes"),
            "pair_bias": (ValueError, "argument 'pair_bias'"),
            "head dim": (ValueError, "head dim"),
            "scale": (ValueError, "argument 'options.scale'")}[case]
    if case == "dtype of k":
        args["k"] = q.astype(np.float16)
    elif case == "shape of k":
        args["k"] = np.ones((1, 2, 17, 3, 8), np.float32)
    elif case == "pair_bias":
        args["pair_bias"] = np.ones((1, 1, 2, 17, 5), np.float32)
    elif case == "head dim":
        args["q"] = args["k"] = args["v"] = np.ones((1, 1, 4, 1, 130), np.float32)
    else:
        args["scale"] = float("inf")
    for front, to in (("torch", torch.tensor), ("jax", jnp.asarray)):
        fn = et.evoformer_attention if front == "torch" else ej.evoformer_attention
        converted = {n: (to(a) if isinstance(a, np.ndarray) else a) for n, a in args.items()}
        with pytest.raises(want[0]) as info:
            fn(**converted)
        message = str(info.value)
        assert message.startswith(f"evoattn.{front}.evoformer_attention: "), message
        assert want[1] in message and "evoattn_" not in message, message
