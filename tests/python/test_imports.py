"""The package as a new user meets it: every import order in a fresh interpreter (with torch or
jax imported before evoattn, after it, or not at all), a first call after each, and binaries
that export only their entry points, so that no import order can make one library's C++ or
CUDA runtime stand in for another's.

Each case runs `python -c` in a subprocess: a crash there (exit -11) fails the test here."""

import importlib.util
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

evoattn = pytest.importorskip("evoattn", reason="evoattn is not installed (pip install .)")

HAS = {name: importlib.util.find_spec(name) is not None for name in ("torch", "jax")}

# A first call through each front end after its import: CPU tensors, so it runs everywhere.
TORCH_CALL = ("import evoattn.torch as et, torch; x = torch.ones(1, 1, 3, 1, 8); "
              "assert et.evoformer_attention(x, x, x).shape == x.shape")
JAX_CALL = ("import evoattn.jax as ej, jax, jax.numpy as jnp; "
            "x = jax.device_put(jnp.ones((1, 1, 3, 1, 8)), jax.devices('cpu')[0]); "
            "assert ej.evoformer_attention(x, x, x).shape == x.shape")

ORDERS = [
    ("import evoattn", ()),
    ("import evoattn.torch", ("torch",)),
    ("import evoattn, torch", ("torch",)),
    ("import torch, evoattn.torch", ("torch",)),
    ("import evoattn.jax", ("jax",)),
    ("import evoattn, jax", ("jax",)),
    ("import jax, evoattn.jax", ("jax",)),
    ("import evoattn.torch, evoattn.jax", ("torch", "jax")),
    ("import evoattn.jax, evoattn.torch", ("torch", "jax")),
    ("import jax, torch, evoattn", ("torch", "jax")),
    ("import torch, jax, evoattn.jax, evoattn.torch", ("torch", "jax")),
]


def fresh_python(code, cwd):
    env = dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          timeout=600, cwd=cwd)


@pytest.mark.parametrize("order,needs", ORDERS, ids=[o for o, _ in ORDERS])
def test_import_order_in_a_fresh_interpreter(order, needs, tmp_path):
    missing = [n for n in needs if not HAS[n]]
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed")
    calls = [c for n, c in (("torch", TORCH_CALL), ("jax", JAX_CALL)) if n in needs]
    result = fresh_python("; ".join([order] + calls), tmp_path)
    assert result.returncode == 0, (
        f"`{order}` then a call exited with {result.returncode}\n{result.stderr[-3000:]}")


def exported_symbols(path):
    out = subprocess.run(["nm", "-D", "--defined-only", str(path)], capture_output=True,
                         text=True, check=True).stdout
    return sorted(line.split()[-1] for line in out.splitlines() if line.strip())


@pytest.mark.skipif(shutil.which("nm") is None, reason="nm (binutils) is not installed")
def test_binaries_export_only_their_entry_points():
    package = pathlib.Path(evoattn.__file__).parent
    (c_module,) = package.glob("_C.*so")
    assert exported_symbols(c_module) == ["PyInit__C"]
    library = exported_symbols(package / "libevoattn.so")
    assert library and all(s.startswith("evoattn_") for s in library), library
    torch_ops = package / "_torch_ops.so"
    if torch_ops.exists():
        assert exported_symbols(torch_ops) == []
