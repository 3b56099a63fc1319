"""The tensor-parallel layers (``tp_layers_suite.py``) and the MLP example (``examples/tp_mlp.py``)
on 2 and 4 ranks, one per GPU: under mpirun, and the example also as the demo starts it (torchrun).

NCCL allows one rank per GPU, so a case runs only where at least N GPUs are visible.
"""

from __future__ import annotations

import re

import pytest
from runner import EXAMPLES, find_mpirun, launch, load_example, need_gpus

pytestmark = [pytest.mark.gpu, pytest.mark.multigpu]

FORWARDED = ("MPBIND_CUBLASMP_PATH", "MPBIND_NCCL_PATH", "LD_PRELOAD")
REQUIRED = ("tp.settings.allgather_gemm", "tp.settings.gemm_reducescatter", "tp.bias_once.gemm_reducescatter",
            "tp.gelu_bias.allgather_gemm", "tp.uneven_workspaces")
SMALL = ("--tokens", "2048", "--hidden", "1024", "--ffn", "4096", "--iters", "3", "--warmup", "1")
ONE_RANK_PER_GPU = " (NCCL allows one rank per GPU)"


@pytest.fixture(scope="module")
def mpirun() -> str:
    return find_mpirun("tensor-parallel layers", (
        ("mpi4py", "mpi4py is not installed (pip install 'mpbind[mpi]')"),
        ("torch", "torch is not installed (the layers use torch tensors)")), library="cublasmp")


def every_rank_ok(out: str, nprocs: int) -> None:
    ok = {int(r) for r in re.findall(r"^tp_mlp rank=(\d+) ok", out, re.MULTILINE)}
    assert ok == set(range(nprocs)), f"ranks that matched one GPU: {sorted(ok)}\n{out[-8000:]}"
    assert "| block |" in out, out[-4000:]


@pytest.mark.parametrize("nprocs", [2, 4], ids=lambda n: f"np{n}")
def test_tp_layers_multirank(mpirun: str, nprocs: int) -> None:
    need_gpus(nprocs, ONE_RANK_PER_GPU)
    launch("tp_layers_suite.py", nprocs, timeout=600, mpirun=mpirun, forward=FORWARDED,
           share_gpu=False).expect_clean(require=REQUIRED)


@pytest.mark.parametrize("nprocs", [2, 4], ids=lambda n: f"np{n}")
def test_tp_mlp_example_under_mpirun(mpirun: str, nprocs: int) -> None:
    need_gpus(nprocs, ONE_RANK_PER_GPU)
    result = launch(EXAMPLES / "tp_mlp.py", nprocs, *SMALL, timeout=300, mpirun=mpirun, forward=FORWARDED,
                    share_gpu=False)
    assert result.rc == 0, result.out[-8000:]
    every_rank_ok(result.out, nprocs)


def test_tp_mlp_example_as_the_demo_starts_it(mpirun: str, capfd: pytest.CaptureFixture[str]) -> None:
    need_gpus(2, ONE_RANK_PER_GPU)
    rc = load_example("tp_mlp").launch(2, *SMALL)
    out = capfd.readouterr().out
    assert rc == 0, out[-8000:]
    every_rank_ok(out, 2)


@pytest.mark.parametrize("nprocs", [1, 2, 4], ids=lambda n: f"np{n}")
def test_tp_mlp_example_compiled(mpirun: str, nprocs: int) -> None:
    # The block as mpbind.torch operators: eager, torch.compile(fullgraph=True), mode="reduce-overhead";
    # each against one GPU, the compiled gradients against eager's, no graph break.
    need_gpus(nprocs, ONE_RANK_PER_GPU)
    result = launch(EXAMPLES / "tp_mlp.py", nprocs, *SMALL, "--compile", timeout=400, mpirun=mpirun,
                    forward=FORWARDED, share_gpu=False)
    assert result.rc == 0, result.out[-8000:]
    every_rank_ok(result.out, nprocs)
    for mode in ("eager", r"compiled \(default\)", r"compiled \(reduce-overhead\)"):
        ok = {int(r) for r in re.findall(rf"^tp_mlp rank=(\d+) ops {mode}: ok .* graph breaks 0$", result.out,
                                         re.MULTILINE)}
        assert ok == set(range(nprocs)), f"{mode}: ranks ok {sorted(ok)}\n{result.out[-8000:]}"
    assert "| compiled (reduce-overhead) |" in result.out, result.out[-4000:]
