"""The tensor-parallel MLP example (examples/tp_mlp.py) without a GPU: its two layers plan as
AllGather+GEMM and GEMM+ReduceScatter on the pieces it hands over, and the demo's launch step."""

from __future__ import annotations

import importlib.util
import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from mpbind.matmul._planner import plan

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "tp_mlp.py"


def example() -> Any:
    spec = importlib.util.spec_from_file_location("tp_mlp", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("p", [2, 4, 8])
def test_layers_plan_the_tensor_parallel_algorithms(p: int) -> None:
    tp = example()
    T, H, F = 64 * p, 48, 32 * p
    layouts = tp.distributions(p, T, H, F)
    one = plan(**{k[0]: v for k, v in layouts["layer1"].items()}, a_dtype="bfloat16", transa=True,
               epilogue="gelu_bias")
    two = plan(**{k[0]: v for k, v in layouts["layer2"].items()}, a_dtype="bfloat16", transa=True)
    assert (one.algorithm, two.algorithm) == (tp.EXPECTED["layer1"], tp.EXPECTED["layer2"])
    t, f = T // p, F // p
    for r in range(p):
        # What the example hands over at rank r: w1_mine.T, x_mine.T, h_mine.T; w2_mine.T, h_mine.T, y_mine.T.
        assert one.local_shapes(r) == {"a": (H, f), "b": (H, t), "d": (f, T)}
        assert two.local_shapes(r) == {"a": (f, H), "b": (f, T), "d": (H, t)}
        assert one.bias_length(r) == f  # b1's features of this rank
    assert one.epilogue_member.name == "GELU_BIAS"


def test_one_rank_runs_local_products() -> None:
    tp = example()
    layouts = tp.distributions(1, 32, 16, 64)
    assert plan(**{k[0]: v for k, v in layouts["layer1"].items()}, a_dtype="bfloat16", transa=True).algorithm == "local"


def test_the_demo_step(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    tp = example()
    assert tp.on_every_gpu(1)
    said = capsys.readouterr().out
    assert "skipped: tensor-parallel MLP (examples/tp_mlp.py) needs more than one GPU; 1 visible" in said
    ran: list[tuple[list[str], dict[str, str]]] = []

    def run(cmd: list[str], env: dict[str, str], timeout: float) -> int:
        assert timeout == tp.LAUNCH_TIMEOUT
        ran.append((cmd, env))
        return 0

    monkeypatch.setattr(tp, "run_bounded", run)
    monkeypatch.setitem(sys.modules, "torch", object())  # present, as far as the step can tell
    from mpbind._infra import loader as _loader
    from mpbind.errors import LibraryNotFoundError

    def missing(name: str) -> Any:
        raise LibraryNotFoundError(f"no {name} here")

    monkeypatch.setattr(_loader, "load", missing)
    assert tp.on_every_gpu(2) and not ran
    assert "skipped: tensor-parallel MLP (examples/tp_mlp.py) needs cuBLASMp: no cublasmp here" in (
        capsys.readouterr().out)
    monkeypatch.setattr(_loader, "load", lambda name: None)
    assert tp.on_every_gpu(2)
    ((cmd, env),) = ran
    assert cmd[:5] == [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    assert cmd[5] == str(EXAMPLE)
    assert env["NCCL_NVLS_ENABLE"] == "0" and env["TORCH_SYMM_MEM_DISABLE_MULTICAST"] == "1"


def test_the_launch_is_bounded_and_leaves_nothing_behind(tmp_path: Path) -> None:
    tp = example()
    assert tp.run_bounded([sys.executable, "-c", "raise SystemExit(3)"], {}, 30) == 3
    # A launcher whose child ignores SIGTERM, both past the deadline: ended, the child too.
    marker = tmp_path / "child.pid"
    code = ("import os, signal, subprocess, sys, time\n"
            "child = subprocess.Popen([sys.executable, '-c', "
            "'import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(300)'])\n"
            f"open({str(marker)!r}, 'w').write(str(child.pid))\n"
            "time.sleep(300)\n")
    start = time.monotonic()
    assert tp.run_bounded([sys.executable, "-c", code], dict(os.environ), 2.0) == 124
    assert time.monotonic() - start < 30
    child = Path(f"/proc/{int(marker.read_text())}/stat")
    end = time.monotonic() + 10
    while child.exists() and time.monotonic() < end:  # gone, or dead awaiting its reaper (state Z)
        if child.read_text().rsplit(")", 1)[-1].split()[0] in ("Z", "X"):
            break
        time.sleep(0.1)
    assert not child.exists() or child.read_text().rsplit(")", 1)[-1].split()[0] in ("Z", "X")
