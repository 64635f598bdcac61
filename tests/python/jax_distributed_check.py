"""evoattn.jax_distributed on every device JAX sees (2 CPU devices in CI through
XLA_FLAGS=--xla_force_host_platform_device_count=2; 2 GPUs where there are): jit(grad) of the
row-sharded attention against the single-device call, twice for identical bytes, and the
all-to-alls' round trip. Prints one JSON line (test_jax_distributed.py asserts on it)."""

import json
import sys

import jax
import jax.numpy as jnp
import numpy as np

from evoattn.jax import evoformer_attention
from evoattn.jax_distributed import col_to_row, row_sharded_attention, row_to_col

jax.config.update("jax_enable_x64", False)
dtype = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}[sys.argv[1]]
ndev = jax.device_count()
mesh = jax.make_mesh((ndev,), ("rows",))
B, N, L, H, D = 1, 2 * ndev, 8 * ndev, 2, 16
keys = jax.random.split(jax.random.PRNGKey(0), 6)
u = lambda k, shape: jax.random.uniform(k, shape, jnp.float32, -2, 2).astype(dtype)  # noqa: E731
q, k, v, d_o = (u(keys[i], (B, N, L, H, D)) for i in range(4))
mask_bias, pair_bias = u(keys[4], (B, N, 1, 1, L)), u(keys[5], (B, 1, H, L, L))


def loss(fn):
    return lambda q, k, v, mb, pb: jnp.sum(fn(q, k, v, mb, pb).astype(jnp.float32) * d_o.astype(jnp.float32))


single = jax.jit(jax.value_and_grad(loss(evoformer_attention), argnums=(0, 1, 2, 3, 4)))
want = single(q, k, v, mask_bias, pair_bias)
out = {"devices": ndev, "platform": jax.devices()[0].platform, "errors": {}}
for mode in ("replicated", "sharded"):
    fn = lambda q, k, v, mb, pb: row_sharded_attention(  # noqa: E731
        q, k, v, mb, pb, mesh=mesh, axis="rows", pair_bias_sharded=(mode == "sharded"))
    sharded = jax.jit(jax.value_and_grad(loss(fn), argnums=(0, 1, 2, 3, 4)))
    got, again = sharded(q, k, v, mask_bias, pair_bias), sharded(q, k, v, mask_bias, pair_bias)
    names = ["d_q", "d_k", "d_v", "d_mask_bias", "d_pair_bias"]
    rel = lambda a, b: float(np.linalg.norm(np.float64(a) - np.float64(b)) / np.linalg.norm(np.float64(b)))  # noqa: E731
    o_got, o_want = jax.jit(fn)(q, k, v, mask_bias, pair_bias), evoformer_attention(q, k, v, mask_bias, pair_bias)
    out["errors"][mode] = {"o": rel(o_got, o_want),
                           **{n: rel(g, w) for n, g, w in zip(names, got[1], want[1])}}
    out.setdefault("bitwise_runs", True)
    out["bitwise_runs"] &= all(np.array_equal(np.asarray(a), np.asarray(b))
                               for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(again)))
with jax.set_mesh(mesh):  # the global values stay; only the sharded axis moves
    x = jax.device_put(q.astype(jnp.float32), jax.NamedSharding(mesh, jax.sharding.PartitionSpec(None, "rows")))
    cols = row_to_col(x, mesh=mesh, axis="rows")
    back = col_to_row(cols, mesh=mesh, axis="rows")
    w = jnp.arange(x.size, dtype=jnp.float32).reshape(x.shape)
    g = jax.grad(lambda x: jnp.sum(row_to_col(x, mesh=mesh, axis="rows") * w))(x)
out["row_to_col"] = bool(np.array_equal(np.asarray(cols), np.asarray(x)) and np.array_equal(np.asarray(back), np.asarray(x))
                         and np.array_equal(np.asarray(g), np.asarray(w)))
print(json.dumps(out))
