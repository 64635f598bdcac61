"""evoattn.distributed over 2 processes started by torchrun, as users run it: gloo on the CPU
(every machine, CI included), NCCL on 2 GPUs when there are 2 (NVLink multicast off). Each rank
checks its rows against the single-device call on the whole problem (the contract's bound for
the dtype), two runs for identical bytes, and the pair bias's gradient for identical bytes on
every rank (distributed_worker.py)."""

import json
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "distributed_worker.py")
CAP = {"float32": 1e-5, "bfloat16": 8e-3}


def run_ranks(tmp_path, device, dtype, nproc=2):
    env = dict(os.environ, NCCL_NVLS_ENABLE="0", OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           WORKER, "--device", device, "--dtype", dtype, "--out", str(tmp_path)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return [json.load(open(tmp_path / f"rank{r}.json")) for r in range(nproc)]


def check(reports, dtype):
    for rep in reports:
        for mode, errors in rep["errors"].items():
            for name, err in errors.items():
                assert err <= CAP[dtype], (rep["rank"], mode, name, err)
        assert rep["bitwise_runs"], rep
        assert rep["same_across_ranks"], rep
        assert rep["row_to_col"], rep


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_two_cpu_ranks_over_gloo_match_one_call(tmp_path, dtype):
    check(run_ranks(tmp_path, "cpu", dtype), dtype)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_two_gpus_over_nccl_match_one_call(tmp_path, dtype):
    if torch.cuda.device_count() < 2:
        pytest.skip("fewer than 2 CUDA devices: the NCCL test needs 2 GPUs of one host")
    check(run_ranks(tmp_path, "cuda", dtype), dtype)


def test_example_trains_under_torchrun_on_two_cpu_ranks():
    example = os.path.join(os.path.dirname(WORKER), "..", "..", "examples",
                           "distributed_triangle_attention.py")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           example, "--cpu", "--length", "16", "--steps", "3"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    losses = [float(line.split()[-1]) for line in proc.stdout.splitlines() if line.startswith("step ")]
    assert len(losses) == 3 and losses[-1] < losses[0], proc.stdout
