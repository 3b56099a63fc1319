"""benchmarks/scaling.py without a GPU: its commands, and its tables from the CSVs the benchmarks write
(the two-GPU results kept in benchmarks/results/h200x2, so the headers are the real ones)."""

from __future__ import annotations

import importlib.util
import math
import shutil
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
KEPT = ROOT / "benchmarks" / "results" / "h200x2"


def _scaling() -> ModuleType:
    spec = importlib.util.spec_from_file_location("scaling_under_test", ROOT / "benchmarks" / "scaling.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


scaling = _scaling()


def test_a_run_is_mpirun_with_multicast_off_and_the_workloads_own_variables(tmp_path: Path) -> None:
    env = {"NCCL_NVLS_ENABLE": "0", "NVSHMEM_DISABLE_NVLS": "1", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
           "LD_PRELOAD": "/x/libnccl.so.2", "NVSHMEM_SYMMETRIC_SIZE": "1"}
    fft = scaling.BY_NAME["fft_distributed"]
    cmd = scaling.command(fft, scaling.Placement(4), tmp_path, env)
    assert cmd[0] == "mpirun" and cmd[cmd.index("-np") + 1] == "4"
    forwarded = [cmd[i + 1] for i, a in enumerate(cmd) if a == "-x"]
    want = {"NCCL_NVLS_ENABLE", "NVSHMEM_DISABLE_NVLS", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "LD_PRELOAD"}
    assert want <= set(forwarded)
    assert f"NVSHMEM_SYMMETRIC_SIZE={32 << 30}" in forwarded and "NVSHMEM_SYMMETRIC_SIZE" not in forwarded
    assert cmd[-5:] == ["benchmarks/fft_distributed.py", "--mode", "mpbind", "--out", str(tmp_path)]
    assert str(tmp_path / "tp_mlp.csv") in scaling.command(scaling.BY_NAME["tp_mlp"], scaling.Placement(2), tmp_path,
                                                           env)
    assert "--oversubscribe" not in cmd and not any(a.startswith("CUDA_MPS") for a in forwarded)


def test_pes_sharing_a_gpu_get_an_equal_share_of_its_sms_and_memory(tmp_path: Path) -> None:
    env = {"CUDA_MPS_PIPE_DIRECTORY": "/x/mps", "NVSHMEM_SYMMETRIC_SIZE": "1"}
    fft = scaling.BY_NAME["fft_distributed"]
    cmd = scaling.command(fft, scaling.Placement(1, 8), tmp_path, env)
    forwarded = [cmd[i + 1] for i, a in enumerate(cmd) if a == "-x"]
    assert cmd[cmd.index("-np") + 1] == "8" and "--oversubscribe" in cmd
    assert {"CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=12",
            f"NVSHMEM_SYMMETRIC_SIZE={scaling.SHARED_HEAP_BYTES // 8}"} <= set(forwarded)
    four = scaling.command(fft, scaling.Placement(2, 4), tmp_path, env)  # 32 GiB is over 120 GiB / 4
    assert four[four.index("-np") + 1] == "8" and f"NVSHMEM_SYMMETRIC_SIZE={30 << 30}" in four
    assert f"NVSHMEM_SYMMETRIC_SIZE={32 << 30}" in scaling.command(fft, scaling.Placement(2, 2), tmp_path, env)
    # only the NVSHMEM/cuFFTMp workloads share a GPU: NCCL refuses two ranks on one
    sharing = {w.name for w in scaling.WORKLOADS if any(p.per_gpu > 1 for p in scaling.placements(w, [1, 2], [1, 4]))}
    assert sharing == {"fft_distributed", "poisson3d"}
    assert scaling.placements(fft, [1, 2], [1, 4]) == [scaling.Placement(1), scaling.Placement(1, 4),
                                                         scaling.Placement(2), scaling.Placement(2, 4)]


def test_placements_name_their_folders_and_columns() -> None:
    for where, folder, label in ((scaling.Placement(1), "np1", "1 GPU"), (scaling.Placement(8), "np8", "8 GPUs"),
                                 (scaling.Placement(2, 4), "np2x4", "2 GPUs x 4 PEs")):
        assert (where.folder, where.label, where.nprocs) == (folder, label, where.gpus * where.per_gpu)
        assert scaling.Placement.of_folder(folder) == where
    assert scaling.Placement.of_folder("npx") is None and scaling.Placement.of_folder("logs") is None


def test_dry_run_lists_every_workload_and_count(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert scaling.main(["run", "--dry-run", "--gpus", "1,8", "--out", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 * len(scaling.WORKLOADS)
    assert sum(" -np 8 " in line for line in lines) == len(scaling.WORKLOADS)
    assert scaling.main(["run", "--dry-run", "--gpus", "1", "--pes-per-gpu", "1,4", "--out", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(scaling.WORKLOADS) + 2  # the two that may share a GPU, once more each
    shared = sorted(line.split()[-1] for line in lines if " -np 4 " in line)
    assert shared == [str(tmp_path / "fft_distributed" / "np1x4"),
                      str(tmp_path / "poisson3d" / "np1x4" / "poisson3d.csv")]


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(SystemExit):
        scaling.main(["run", "--only", "nope"])
    with pytest.raises(SystemExit):
        scaling.main(["run", "--gpus", "0"])
    with pytest.raises(SystemExit):
        scaling.main(["run", "--gpus", "two"])
    with pytest.raises(SystemExit):
        scaling.main(["run", "--pes-per-gpu", "0"])


def _runs(tmp_path: Path) -> Path:
    """Two GPUs from the kept results, one GPU for NCCL only (a copy with other numbers), and the examples'
    own CSVs as they write them."""
    for w in scaling.WORKLOADS:
        kept = KEPT / w.csv
        if kept.exists():
            (tmp_path / w.name / "np2").mkdir(parents=True)
            shutil.copy(kept, tmp_path / w.name / "np2" / w.csv)
    one = tmp_path / "nccl_allreduce" / "np1"
    one.mkdir(parents=True)
    text = (KEPT / "nccl_allreduce.csv").read_text().splitlines()
    header = text[0].split(",")
    rows = [line.split(",") for line in text[1:]]
    for r in rows:
        r[header.index("layer_host_us")] = "1.5"
        r[header.index("layer_busbw_GBps")] = r[header.index("torch_busbw_GBps")] = "0.0"  # as on one rank
    (one / "nccl_allreduce.csv").write_text("\n".join([text[0], *(",".join(r) for r in rows)]) + "\n")
    mlp = tmp_path / "tp_mlp" / "np2"
    mlp.mkdir(parents=True)
    (mlp / "tp_mlp.csv").write_text("layer,ranks,ms,1 GPU ms,TFLOP/s\nblock,2,1.25,2.5,900\n")
    pois = tmp_path / "poisson3d" / "np2"
    pois.mkdir(parents=True)
    (pois / "poisson3d.csv").write_text("n,dtype,pes,one_gpu,ms_per_solve\n256,float64,2,0,3.5\n")
    (tmp_path / "poisson3d" / "np1").mkdir()
    (tmp_path / "poisson3d" / "np1" / "poisson3d.csv").write_text("n,dtype,pes,one_gpu,ms_per_solve\n"
                                                                  "128,float64,1,0,0.5\n")
    (tmp_path / "poisson3d" / "np1x4").mkdir()  # four PEs sharing one GPU
    (tmp_path / "poisson3d" / "np1x4" / "poisson3d.csv").write_text("n,dtype,pes,one_gpu,ms_per_solve\n"
                                                                    "256,float64,4,0,7.25\n")
    return tmp_path


def test_the_tables_read_what_the_benchmarks_write(tmp_path: Path) -> None:
    found = scaling.collect(_runs(tmp_path), scaling.WORKLOADS)
    one, two, shared = scaling.Placement(1), scaling.Placement(2), scaling.Placement(1, 4)
    assert set(found) == {w.name for w in scaling.WORKLOADS}  # every workload's CSV read
    nccl = found["nccl_allreduce"]
    assert nccl["host µs per call at 8 B, layer"] == {one: 1.5, two: pytest.approx(8.087)}
    assert set(nccl["bus GB/s at 512 MiB, torch"]) == {one, two}
    assert math.isnan(nccl["bus GB/s at 512 MiB, torch"][one])
    assert any(k.startswith("16384^3 AllGather+GEMM") for k in found["tp_square_matmul"])
    tp = found["tp_collective_matmul"]
    assert tp["all-gather+GEMM bf16 M=1024, plan µs"][two] == pytest.approx(377.536, rel=1e-4)
    assert "GEMM+reduce-scatter bf16 M=1024, NCCL + torch µs" in tp
    assert any(k.startswith("all-gather+GEMM (Pallas guide) fp16 M=") for k in tp)
    assert not any(k.startswith("GEMM+reduce-scatter fp16") for k in tp)
    assert any("C2C forward" in k for k in found["fft_distributed"])
    assert found["collective_matmul"]["1024x4096x4096 mpbind host, µs"][two] == pytest.approx(218.336, rel=1e-4)
    assert found["tp_mlp"] == {"block, ms": {two: 1.25}}
    assert found["poisson3d"] == {"256^3 float64 solve, ms": {two: 3.5, shared: 7.25},
                                  "128^3 float64 solve, ms": {one: 0.5}}
    text = scaling.tables(found)
    nccl_table = text.split("### nccl_allreduce")[1].split("###")[0]
    assert "| figure | 1 GPU | 2 GPUs |" in nccl_table and "not run" not in nccl_table
    assert "| bus GB/s at 512 MiB, layer | n/a |" in nccl_table
    assert "| figure | 2 GPUs |" in text.split("### tp_square_matmul")[1].split("###")[0]
    poisson = text.split("### poisson3d")[1].split("###")[0]
    assert "| figure | 1 GPU | 1 GPU x 4 PEs | 2 GPUs |" in poisson
    assert "| 256^3 float64 solve, ms | not run | 7.25 | 3.5 |" in poisson
    assert "| 128^3 float64 solve, ms | 0.5 | not run | not run |" in poisson


def test_report_writes_the_csv_and_says_when_nothing_ran(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert scaling.main(["report", str(tmp_path / "empty")]) == 1
    out = _runs(tmp_path / "runs")
    assert scaling.main(["report", str(out)]) == 0
    header, rows = scaling._results.read_csv(out / "scaling.csv")
    assert header == ["workload", "figure", "gpus", "pes_per_gpu", "value"]
    assert {r[0] for r in rows} == {w.name for w in scaling.WORKLOADS}
    assert ["poisson3d", "256^3 float64 solve, ms", "1", "4", "7.25"] in rows
    assert "### poisson3d" in capsys.readouterr().out
