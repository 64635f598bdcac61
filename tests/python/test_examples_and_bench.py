"""examples/triangle_attention.py and bench/peers.py, the parts that run without a GPU: the
triangle-attention module against its naive twin (forward and parameter gradients), and the
benchmark's floor against the peers' floor columns of docs/PEERS.md."""

import importlib.util
import pathlib

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("evoattn", reason="evoattn is not installed (pip install .)")

ROOT = pathlib.Path(__file__).resolve().parents[2]


def load(relpath, name):
    spec = importlib.util.spec_from_file_location(name, ROOT / relpath)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_triangle_attention_module_matches_naive():
    ex = load("examples/triangle_attention.py", "triangle_attention_example")
    torch.manual_seed(0)
    model = ex.TriangleAttentionStartingNode(c_z=16, c_hidden=8, num_heads=2)
    z = torch.randn(2, 9, 9, 16)
    mask = torch.ones(2, 9, 9)
    mask[:, :, -2:] = 0
    fused = model(z, mask)
    grads_fused = torch.autograd.grad(fused.square().sum(), list(model.parameters()))
    naive = model(z, mask, attention=ex.naive_attention)
    grads_naive = torch.autograd.grad(naive.square().sum(), list(model.parameters()))
    assert float((fused - naive).norm() / naive.norm()) < 1e-5
    for a, b in zip(grads_fused, grads_naive):
        assert float((a - b).norm() / b.norm().clamp_min(1e-30)) < 1e-4


def test_bench_floor_matches_anchors():
    peers = load("bench/peers.py", "peers_bench")
    rates = dict(tflops=729.0, tbps=3.02, clock_mhz=1980.0, sms=132)
    anchors = {"tri256": (0.023, 0.068), "tri768": (0.435, 1.114), "msarow": (0.091, 0.272),
               "extramsa": (1.448, 2.897), "template": (0.064, 0.140), "apb768": (0.007, 0.021)}
    for name, (fwd, fb) in anchors.items():
        assert peers.floor_ms(peers.SUITE[name], "fwd", rates) == pytest.approx(fwd, rel=0.06)
        assert peers.floor_ms(peers.SUITE[name], "fb", rates) == pytest.approx(fb, rel=0.06)
