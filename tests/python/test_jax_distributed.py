"""evoattn.jax_distributed (shard_map) on 2 devices in a fresh interpreter: 2 CPU devices
everywhere (XLA_FLAGS), 2 GPUs where there are. The sharded jit(grad) matches the single-device
call within the contract's bound for the dtype and repeats bitwise (jax_distributed_check.py)."""

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("jax")
import evoattn  # noqa: E402

if not evoattn.has_jax_ffi():
    pytest.skip("evoattn was built without the XLA FFI handlers", allow_module_level=True)

CHECK = os.path.join(os.path.dirname(os.path.abspath(__file__)), "jax_distributed_check.py")
CAP = {"float32": 1e-5, "bfloat16": 8e-3}


def run_check(dtype, env_extra):
    env = dict(os.environ, **env_extra)
    proc = subprocess.run([sys.executable, CHECK, dtype], env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def check(report, dtype):
    assert report["devices"] == 2, report
    for mode, errors in report["errors"].items():
        for name, err in errors.items():
            assert err <= CAP[dtype], (mode, name, err)
    assert report["bitwise_runs"], report
    assert report["row_to_col"], report


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_two_cpu_devices_match_one_device(dtype):
    env = {"JAX_PLATFORMS": "cpu", "XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
    check(run_check(dtype, env), dtype)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_two_gpus_match_one_gpu(dtype):
    count = subprocess.run(  # in a child, so this process never holds GPU memory
        [sys.executable, "-c", "import jax\ntry: print(len(jax.devices('gpu')))\nexcept RuntimeError: print(0)"],
        capture_output=True, text=True, timeout=300).stdout.strip().splitlines()
    if not count or count[-1] != "2":
        pytest.skip("needs exactly 2 CUDA devices for JAX: the multi-GPU test is skipped")
    check(run_check(dtype, {"NCCL_NVLS_ENABLE": "0", "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}), dtype)
